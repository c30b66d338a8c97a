// A `decode` attribute the decode kernels cannot honour is an error on the op, not a silent omission:
// here the target has 99 KiB of shared memory per CTA (sm_86), where decode_gate's ring does not fit.
// RUN: not twellc emit %s --target sm_86 --emit cuda 2>&1 | FileCheck %s

#L = #twell.layout<tile_n = 256, slots = 31, value = bf16, index = i16, activation = relu, threshold = 0.0>

// CHECK: error: 'twell.gated_down' op decode: the decode kernels need the row consumer of a tensor-core gate, d_model % 8 == 0, d_ff <= 65536, tile_n a multiple of 32 and a target with more than 99 KiB of shared memory per CTA; got d_model 2048, d_ff 5632, tile_n 256, gate mainloop mma_sync, #twell.target<"sm_86", [mma_sync, cp_async]>
func.func @ffn(%x: tensor<?x2048xbf16>, %wg: tensor<5632x2048xbf16>, %wu: tensor<5632x2048xbf16>,
               %wd: tensor<2048x5632xbf16>) -> tensor<?x2048xbf16> {
  %h = twell.gate_matmul %x, %wg : (tensor<?x2048xbf16>, tensor<5632x2048xbf16>) -> tensor<?x5632xbf16, #L>
  %y = twell.gated_down %x, %h, %wu, %wd {decode = #twell.down_layout<out_in>}
      : (tensor<?x2048xbf16>, tensor<?x5632xbf16, #L>, tensor<5632x2048xbf16>, tensor<2048x5632xbf16>)
      -> tensor<?x2048xbf16>
  return %y : tensor<?x2048xbf16>
}
