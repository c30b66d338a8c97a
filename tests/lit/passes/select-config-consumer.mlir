// RUN: twell-opt %s -twell-split-gated-ffn -twell-select-config=consumer=block | FileCheck %s
// RUN: twell-opt %s -twell-split-gated-ffn -twell-select-config="target=sm_80 consumer=block" | FileCheck %s --check-prefix=SM80
// RUN: twell-opt %s -twell-split-gated-ffn -twell-select-config | FileCheck %s --check-prefix=ROWS
// RUN: not twell-opt %s -twell-select-config=consumer=tiles 2>&1 | FileCheck %s --check-prefix=BAD
// The kernel pipeline takes twell-select-config's options (declared once, enum-typed, in Passes.td).
// RUN: twell-opt %s -twell-kernel-pipeline="target=sm_80 consumer=block" | FileCheck %s --check-prefix=SM80
// RUN: not twell-opt %s -twell-kernel-pipeline=consumer=tiles 2>&1 | FileCheck %s --check-prefix=BAD

// BAD: for the --consumer option: Cannot find option named 'tiles'!

#L = #twell.layout<tile_n = 256, slots = 31, value = bf16, index = i16, activation = relu, threshold = 0.0>

// consumer=block: 16 token rows per CTA on tensor cores, with the deepest ring that fits the target's
// shared memory (6 stages, 224416 bytes, on sm_90a; 4 on sm_80's 163 KiB). The default keeps rows.
// CHECK-LABEL: func.func @in_out
// CHECK: twell.gated_down {{.*}}config = #twell.config<cta_m = 16, threads = 256, mainloop = wgmma, stages = 6, consumer = token_block>
// SM80-LABEL: func.func @in_out
// SM80: twell.gated_down {{.*}}config = #twell.config<cta_m = 16, threads = 256, mainloop = mma_sync, stages = 4, consumer = token_block>
// ROWS-LABEL: func.func @in_out
// ROWS: twell.gated_down {{.*}}config = #twell.config<cta_m = 8, threads = 256, mainloop = wgmma, consumer = warp_row>
func.func @in_out(%x: tensor<?x2048xbf16>, %wg: tensor<5632x2048xbf16>, %wu: tensor<5632x2048xbf16>,
                  %wd: tensor<5632x2048xbf16>) -> tensor<?x2048xbf16> {
  %y = twell.gated_ffn %x, %wg, %wu, %wd {layout = #L, down_layout = #twell.down_layout<in_out>}
      : (tensor<?x2048xbf16>, tensor<5632x2048xbf16>, tensor<5632x2048xbf16>, tensor<5632x2048xbf16>) -> tensor<?x2048xbf16>
  return %y : tensor<?x2048xbf16>
}

// Where the token block does not apply (an nn.Linear Wd; d_model not a multiple of 128), rows.
// CHECK-LABEL: func.func @out_in
// CHECK: twell.gated_down {{.*}}config = #twell.config<cta_m = 1, threads = 256, mainloop = wgmma, consumer = cta_row>
func.func @out_in(%x: tensor<?x2048xbf16>, %wg: tensor<5632x2048xbf16>, %wu: tensor<5632x2048xbf16>,
                  %wd: tensor<2048x5632xbf16>) -> tensor<?x2048xbf16> {
  %y = twell.gated_ffn %x, %wg, %wu, %wd {layout = #L}
      : (tensor<?x2048xbf16>, tensor<5632x2048xbf16>, tensor<5632x2048xbf16>, tensor<2048x5632xbf16>) -> tensor<?x2048xbf16>
  return %y : tensor<?x2048xbf16>
}

// CHECK-LABEL: func.func @odd_d_model
// CHECK: twell.gated_down {{.*}}config = #twell.config<cta_m = 8, threads = 256, mainloop = mma_sync, consumer = warp_row>
func.func @odd_d_model(%x: tensor<?x520xbf16>, %wg: tensor<1408x520xbf16>, %wu: tensor<1408x520xbf16>,
                       %wd: tensor<1408x520xbf16>) -> tensor<?x520xbf16> {
  %y = twell.gated_ffn %x, %wg, %wu, %wd {layout = #L, down_layout = #twell.down_layout<in_out>}
      : (tensor<?x520xbf16>, tensor<1408x520xbf16>, tensor<1408x520xbf16>, tensor<1408x520xbf16>) -> tensor<?x520xbf16>
  return %y : tensor<?x520xbf16>
}
