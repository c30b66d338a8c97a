// twell-select-config's `decode` attribute: the consumer of a tensor-core gate gets the decode kernels
// (calls of at most 64 tokens), reading w_down in its own layout or the `decode` option's; none with
// decode=none, on a target with 99 KiB of shared memory per CTA (sm_86), beside the token block, or
// after the fma gate (d_model % 8 != 0). An explicit attribute is kept (the emitter refuses one the
// kernels cannot honour: emit/emit-decode-invalid.mlir).
// RUN: twell-opt %s -twell-split-gated-ffn -twell-select-config | FileCheck %s
// RUN: twell-opt %s -twell-split-gated-ffn -twell-select-config=decode=in_out | FileCheck %s --check-prefix=INOUT
// RUN: twell-opt %s -twell-split-gated-ffn -twell-select-config=decode=none | FileCheck %s --check-prefix=NONE
// RUN: twell-opt %s -twell-split-gated-ffn -twell-select-config=target=sm_86 | FileCheck %s --check-prefix=NONE
// RUN: twell-opt %s -twell-split-gated-ffn -twell-select-config=consumer=block | FileCheck %s --check-prefix=BLOCK
// RUN: not twell-opt %s -twell-select-config=decode=rows 2>&1 | FileCheck %s --check-prefix=BAD

#L = #twell.layout<tile_n = 256, slots = 31, value = bf16, index = i16, activation = relu, threshold = 0.0>

// CHECK-LABEL: func.func @out_in
// CHECK: twell.gated_down {{.*}}decode = #twell.down_layout<out_in>
// INOUT-LABEL: func.func @out_in
// INOUT: twell.gated_down {{.*}}decode = #twell.down_layout<in_out>
// NONE-NOT: decode =
func.func @out_in(%x: tensor<?x2048xbf16>, %wg: tensor<5632x2048xbf16>, %wu: tensor<5632x2048xbf16>,
                  %wd: tensor<2048x5632xbf16>) -> tensor<?x2048xbf16> {
  %y = twell.gated_ffn %x, %wg, %wu, %wd {layout = #L}
      : (tensor<?x2048xbf16>, tensor<5632x2048xbf16>, tensor<5632x2048xbf16>, tensor<2048x5632xbf16>)
      -> tensor<?x2048xbf16>
  return %y : tensor<?x2048xbf16>
}

// The token block (in_out, d_model 2048): no decode kernels beside it.
// CHECK-LABEL: func.func @in_out
// CHECK: twell.gated_down {{.*}}decode = #twell.down_layout<in_out>
// BLOCK-LABEL: func.func @in_out
// BLOCK: twell.gated_down {{.*}}config = #twell.config<cta_m = 16
// BLOCK-NOT: decode =
// BLOCK: return
func.func @in_out(%x: tensor<?x2048xbf16>, %wg: tensor<5632x2048xbf16>, %wu: tensor<5632x2048xbf16>,
                  %wd: tensor<5632x2048xbf16>) -> tensor<?x2048xbf16> {
  %y = twell.gated_ffn %x, %wg, %wu, %wd {layout = #L, down_layout = #twell.down_layout<in_out>}
      : (tensor<?x2048xbf16>, tensor<5632x2048xbf16>, tensor<5632x2048xbf16>, tensor<5632x2048xbf16>)
      -> tensor<?x2048xbf16>
  return %y : tensor<?x2048xbf16>
}

// The fma gate (d_model 514): no mma chain for the decode gates to repeat.
// CHECK-LABEL: func.func @fma_gate
// CHECK-NOT: decode =
// CHECK: return
func.func @fma_gate(%x: tensor<?x514xbf16>, %wg: tensor<1408x514xbf16>, %wu: tensor<1408x514xbf16>,
                    %wd: tensor<514x1408xbf16>) -> tensor<?x514xbf16> {
  %y = twell.gated_ffn %x, %wg, %wu, %wd {layout = #L}
      : (tensor<?x514xbf16>, tensor<1408x514xbf16>, tensor<1408x514xbf16>, tensor<514x1408xbf16>)
      -> tensor<?x514xbf16>
  return %y : tensor<?x514xbf16>
}

// A hand-written consumer config is kept and still gets `decode` where it allows the kernels.
// CHECK-LABEL: func.func @explicit_config
// CHECK: twell.gated_down {{.*}}config = #twell.config<cta_m = 1, threads = 256, mainloop = mma_sync, consumer = cta_row>, decode = #twell.down_layout<out_in>
func.func @explicit_config(%x: tensor<?x2048xbf16>, %wg: tensor<5632x2048xbf16>, %wu: tensor<5632x2048xbf16>,
                           %wd: tensor<2048x5632xbf16>) -> tensor<?x2048xbf16> {
  %h = twell.gate_matmul %x, %wg : (tensor<?x2048xbf16>, tensor<5632x2048xbf16>) -> tensor<?x5632xbf16, #L>
  %y = twell.gated_down %x, %h, %wu, %wd {config = #twell.config<cta_m = 1, threads = 256, mainloop = mma_sync, consumer = cta_row>}
      : (tensor<?x2048xbf16>, tensor<?x5632xbf16, #L>, tensor<5632x2048xbf16>, tensor<2048x5632xbf16>)
      -> tensor<?x2048xbf16>
  return %y : tensor<?x2048xbf16>
}

// Kept as written, also where select-config would not set it.
// CHECK-LABEL: func.func @explicit
// CHECK: twell.gated_down {{.*}}decode = #twell.down_layout<in_out>
// NONE-LABEL: func.func @explicit
// NONE: twell.gated_down {{.*}}decode = #twell.down_layout<in_out>
// BAD: for the --decode option: Cannot find option named 'rows'!
func.func @explicit(%x: tensor<?x2048xbf16>, %h: tensor<?x5632xbf16, #L>, %wu: tensor<5632x2048xbf16>,
                    %wd: tensor<2048x5632xbf16>) -> tensor<?x2048xbf16> {
  %y = twell.gated_down %x, %h, %wu, %wd {decode = #twell.down_layout<in_out>}
      : (tensor<?x2048xbf16>, tensor<?x5632xbf16, #L>, tensor<5632x2048xbf16>, tensor<2048x5632xbf16>)
      -> tensor<?x2048xbf16>
  return %y : tensor<?x2048xbf16>
}
