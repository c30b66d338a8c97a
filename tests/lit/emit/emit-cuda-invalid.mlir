// The emitter refuses kernels that are not specialized, or whose name no longer matches their constants.
// RUN: twell-opt %s -split-input-file -twell-emit-cuda -verify-diagnostics -o /dev/null

#L = #twell.layout<tile_n = 256, slots = 31, value = bf16, index = i16, activation = relu, threshold = 0.0>
func.func @unnamed(%x: tensor<?x2048xbf16>, %wg: tensor<5632x2048xbf16>) -> tensor<?x5632xbf16, #L> {
  // expected-error @+1 {{'twell.gate_matmul' op has no kernel_name: run twell-specialize before emitting CUDA}}
  %h = twell.gate_matmul %x, %wg {target = #twell.target<"sm_90a", []>, config = #twell.config<cta_m = 64, cta_k = 16, threads = 256>}
      : (tensor<?x2048xbf16>, tensor<5632x2048xbf16>) -> tensor<?x5632xbf16, #L>
  return %h : tensor<?x5632xbf16, #L>
}

// -----

// The configuration was edited after twell-specialize named the kernel (cta_k 16 -> 32).
#L = #twell.layout<tile_n = 256, slots = 31, value = bf16, index = i16, activation = relu, threshold = 0.0>
func.func @stale(%x: tensor<?x2048xbf16>, %wg: tensor<5632x2048xbf16>) -> tensor<?x5632xbf16, #L> {
  // expected-error @+1 {{'twell.gate_matmul' op kernel_name "twell_gate_k2048_n5632_t256_s31_relu_bf16_23e3f0e1" does not match its configuration, which names "twell_gate_k2048_n5632_t256_s31_relu_bf16_}}
  %h = twell.gate_matmul %x, %wg {kernel_name = "twell_gate_k2048_n5632_t256_s31_relu_bf16_23e3f0e1",
      target = #twell.target<"sm_90a", [wgmma, tma, multicast]>, config = #twell.config<cta_m = 64, cta_k = 32, threads = 256>}
      : (tensor<?x2048xbf16>, tensor<5632x2048xbf16>) -> tensor<?x5632xbf16, #L>
  return %h : tensor<?x5632xbf16, #L>
}

// -----

#L = #twell.layout<tile_n = 256, slots = 31, value = bf16, index = i16, activation = relu, threshold = 0.0>
func.func @fused(%x: tensor<?x2048xbf16>, %wg: tensor<5632x2048xbf16>, %wu: tensor<5632x2048xbf16>,
                 %wd: tensor<2048x5632xbf16>) -> tensor<?x2048xbf16> {
  // expected-error @+1 {{'twell.gated_ffn' op is not a kernel: split it into twell.gate_matmul and twell.gated_down first (twell-split-gated-ffn)}}
  %y = twell.gated_ffn %x, %wg, %wu, %wd {layout = #L}
      : (tensor<?x2048xbf16>, tensor<5632x2048xbf16>, tensor<5632x2048xbf16>, tensor<2048x5632xbf16>)
      -> tensor<?x2048xbf16>
  return %y : tensor<?x2048xbf16>
}
