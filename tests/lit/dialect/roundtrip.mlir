// Parse, print and parse again, in the custom and in the generic form: the output must be stable.
// RUN: twell-opt %s | twell-opt | FileCheck %s
// RUN: twell-opt %s --mlir-print-op-generic | twell-opt | FileCheck %s

// CHECK-LABEL: func.func private @layouts
// CHECK-SAME: #twell.layout<tile_n = 256, slots = 31, value = bf16, index = i16, activation = relu, threshold = 0.0>
// CHECK-SAME: #twell.layout<tile_n = 1024, slots = 1024, value = f16, index = i16, activation = silu, threshold = 0.25>
// CHECK-SAME: #twell.layout<tile_n = 32, slots = 1, value = bf16, index = i16, activation = silu, threshold = 1.0e-05>
// CHECK-SAME: #twell.layout<tile_n = 128, slots = 15, value = bf16, index = i16, activation = relu, threshold = 3.5>
func.func private @layouts(
  tensor<?x5632xbf16, #twell.layout<tile_n = 256, slots = 31, value = bf16, index = i16, activation = relu, threshold = 0.0>>,
  tensor<?x64xf16, #twell.layout<tile_n = 1024, slots = 1024, value = f16, index = i16, activation = silu, threshold = 0.25>>,
  tensor<8x100xbf16, #twell.layout<tile_n = 32, slots = 1, value = bf16, index = i16, activation = silu, threshold = 0.00001>>,
  // Parameters may come in any order; an integer threshold is read as a float.
  tensor<?x5632xbf16, #twell.layout<threshold = 3.5, activation = relu, index = i16, value = bf16, slots = 15, tile_n = 128>>)

// CHECK-LABEL: func.func private @targets_and_configs
// CHECK-SAME: config = #twell.config<cta_m = 64, cta_k = 16, threads = 256>
// CHECK-SAME: config = #twell.config<cta_m = 1, threads = 128>
// CHECK-SAME: config = #twell.config<cta_m = 1, threads = 32>
// CHECK-SAME: config = #twell.config<cta_m = 128, cta_k = 32, threads = 256, mainloop = mma_sync, stages = 4>
// CHECK-SAME: config = #twell.config<cta_m = 1, threads = 256, mainloop = mma_sync>
// CHECK-SAME: config = #twell.config<cta_m = 64, cta_k = 16, threads = 256>
// CHECK-SAME: activation = #twell.activation<silu>
// CHECK-SAME: down_layout = #twell.down_layout<in_out>
// CHECK-SAME: target = #twell.target<"sm_90a", [wgmma, tma, multicast]>
// CHECK-SAME: target = #twell.target<"sm_80", [mma_sync, cp_async]>
// CHECK-SAME: target = #twell.target<"sm_100a", []>
func.func private @targets_and_configs() attributes {
  t0 = {target = #twell.target<"sm_90a", [wgmma, tma, multicast]>},
  t1 = {target = #twell.target<"sm_80", [mma_sync, cp_async]>},
  t2 = {target = #twell.target<"sm_100a", []>},
  c0 = {config = #twell.config<cta_m = 64, cta_k = 16, threads = 256>},
  c1 = {config = #twell.config<cta_m = 1, threads = 128>},
  // cta_k = 0 means "no K loop" and is printed by omission.
  c2 = {config = #twell.config<threads = 32, cta_k = 0, cta_m = 1>},
  c3 = {config = #twell.config<stages = 4, mainloop = mma_sync, cta_m = 128, cta_k = 32, threads = 256>},
  c4 = {config = #twell.config<cta_m = 1, threads = 256, mainloop = mma_sync>},
  // mainloop = fma and stages = 0 are the defaults, printed by omission.
  c5 = {config = #twell.config<cta_m = 64, cta_k = 16, threads = 256, mainloop = fma, stages = 0>},
  e0 = {activation = #twell.activation<silu>},
  e1 = {down_layout = #twell.down_layout<in_out>}}

#relu = #twell.layout<tile_n = 256, slots = 31, value = bf16, index = i16, activation = relu, threshold = 0.0>

// CHECK-LABEL: func.func @fused
// CHECK: %[[Y:.*]] = twell.gated_ffn %arg0, %arg1, %arg2, %arg3 {layout = #twell.layout<tile_n = 256, slots = 31, value = bf16, index = i16, activation = relu, threshold = 0.0>} : (tensor<?x2048xbf16>, tensor<5632x2048xbf16>, tensor<5632x2048xbf16>, tensor<2048x5632xbf16>) -> tensor<?x2048xbf16>
// CHECK: return %[[Y]]
func.func @fused(%x: tensor<?x2048xbf16>, %wg: tensor<5632x2048xbf16>, %wu: tensor<5632x2048xbf16>,
                 %wd: tensor<2048x5632xbf16>) -> tensor<?x2048xbf16> {
  %y = twell.gated_ffn %x, %wg, %wu, %wd {layout = #relu}
      : (tensor<?x2048xbf16>, tensor<5632x2048xbf16>, tensor<5632x2048xbf16>, tensor<2048x5632xbf16>)
      -> tensor<?x2048xbf16>
  return %y : tensor<?x2048xbf16>
}

// CHECK-LABEL: func.func @fused_in_out
// CHECK: twell.gated_ffn %arg0, %arg1, %arg2, %arg3 {down_layout = #twell.down_layout<in_out>, layout = #twell.layout<tile_n = 128, slots = 7, value = f16, index = i16, activation = silu, threshold = 0.5>}
// CHECK-SAME: (tensor<16x512xf16>, tensor<1000x512xf16>, tensor<1000x512xf16>, tensor<1000x512xf16>) -> tensor<16x512xf16>
func.func @fused_in_out(%x: tensor<16x512xf16>, %wg: tensor<1000x512xf16>, %wu: tensor<1000x512xf16>,
                        %wd: tensor<1000x512xf16>) -> tensor<16x512xf16> {
  %y = twell.gated_ffn %x, %wg, %wu, %wd {
      layout = #twell.layout<tile_n = 128, slots = 7, value = f16, index = i16, activation = silu, threshold = 0.5>,
      down_layout = #twell.down_layout<in_out>}
      : (tensor<16x512xf16>, tensor<1000x512xf16>, tensor<1000x512xf16>, tensor<1000x512xf16>)
      -> tensor<16x512xf16>
  return %y : tensor<16x512xf16>
}

// CHECK-LABEL: func.func @kernels
// CHECK: %[[H:.*]] = twell.gate_matmul %arg0, %arg1 : (tensor<?x2048xbf16>, tensor<5632x2048xbf16>) -> tensor<?x5632xbf16, #twell.layout<tile_n = 256, slots = 31, value = bf16, index = i16, activation = relu, threshold = 0.0>>
// CHECK: %[[Y:.*]] = twell.gated_down %arg0, %[[H]], %arg2, %arg3 : (tensor<?x2048xbf16>, tensor<?x5632xbf16, #twell.layout<{{.*}}>>, tensor<5632x2048xbf16>, tensor<2048x5632xbf16>) -> tensor<?x2048xbf16>
// CHECK: return %[[Y]]
func.func @kernels(%x: tensor<?x2048xbf16>, %wg: tensor<5632x2048xbf16>, %wu: tensor<5632x2048xbf16>,
                   %wd: tensor<2048x5632xbf16>) -> tensor<?x2048xbf16> {
  %h = twell.gate_matmul %x, %wg
      : (tensor<?x2048xbf16>, tensor<5632x2048xbf16>) -> tensor<?x5632xbf16, #relu>
  %y = twell.gated_down %x, %h, %wu, %wd {down_layout = #twell.down_layout<out_in>}
      : (tensor<?x2048xbf16>, tensor<?x5632xbf16, #relu>, tensor<5632x2048xbf16>, tensor<2048x5632xbf16>)
      -> tensor<?x2048xbf16>
  return %y : tensor<?x2048xbf16>
}

// CHECK-LABEL: func.func @specialized_kernels
// CHECK: twell.gate_matmul %arg0, %arg1 {config = #twell.config<cta_m = 64, cta_k = 16, threads = 256>, kernel_name = "my_gate", target = #twell.target<"sm_90a", [wgmma, tma, multicast]>}
// CHECK-SAME: (tensor<4x2048xbf16>, tensor<5632x2048xbf16>) -> tensor<4x5632xbf16, #twell.layout<{{.*}}>>
// CHECK: twell.gated_down %arg0, %{{.*}}, %arg2, %arg3 {config = #twell.config<cta_m = 1, threads = 256, consumer = cta_row>, down_layout = #twell.down_layout<in_out>, kernel_name = "my_down", target = #twell.target<"sm_80", [mma_sync, cp_async]>}
// CHECK: twell.gate_matmul %arg0, %arg1 {config = #twell.config<cta_m = 128, cta_k = 32, threads = 512, mainloop = mma_sync, stages = 3>, kernel_name = "my_mma_gate", target = #twell.target<"sm_80", [mma_sync, cp_async]>}
// CHECK: twell.gated_down %arg0, %{{.*}}, %arg2, %arg3 {config = #twell.config<cta_m = 1, threads = 256, mainloop = mma_sync, consumer = cta_row>, down_layout = #twell.down_layout<in_out>, kernel_name = "my_mma_down", target = #twell.target<"sm_80", [mma_sync, cp_async]>}
func.func @specialized_kernels(%x: tensor<4x2048xbf16>, %wg: tensor<5632x2048xbf16>,
                               %wu: tensor<5632x2048xbf16>, %wd: tensor<5632x2048xbf16>)
    -> tensor<4x2048xbf16> {
  %h = twell.gate_matmul %x, %wg {
      target = #twell.target<"sm_90a", [wgmma, tma, multicast]>,
      config = #twell.config<cta_m = 64, cta_k = 16, threads = 256>, kernel_name = "my_gate"}
      : (tensor<4x2048xbf16>, tensor<5632x2048xbf16>) -> tensor<4x5632xbf16, #relu>
  %y = twell.gated_down %x, %h, %wu, %wd {down_layout = #twell.down_layout<in_out>,
      target = #twell.target<"sm_80", [mma_sync, cp_async]>,
      config = #twell.config<cta_m = 1, threads = 256, consumer = cta_row>, kernel_name = "my_down"}
      : (tensor<4x2048xbf16>, tensor<4x5632xbf16, #relu>, tensor<5632x2048xbf16>, tensor<5632x2048xbf16>)
      -> tensor<4x2048xbf16>
  // The tensor-core main loop with a 3-stage pipeline (fewer than the 4 that fit), and its consumer.
  %h2 = twell.gate_matmul %x, %wg {
      target = #twell.target<"sm_80", [mma_sync, cp_async]>,
      config = #twell.config<cta_m = 128, cta_k = 32, threads = 512, mainloop = mma_sync, stages = 3>,
      kernel_name = "my_mma_gate"}
      : (tensor<4x2048xbf16>, tensor<5632x2048xbf16>) -> tensor<4x5632xbf16, #relu>
  %y2 = twell.gated_down %x, %h2, %wu, %wd {down_layout = #twell.down_layout<in_out>,
      target = #twell.target<"sm_80", [mma_sync, cp_async]>,
      config = #twell.config<cta_m = 1, threads = 256, mainloop = mma_sync, consumer = cta_row>, kernel_name = "my_mma_down"}
      : (tensor<4x2048xbf16>, tensor<4x5632xbf16, #relu>, tensor<5632x2048xbf16>, tensor<5632x2048xbf16>)
      -> tensor<4x2048xbf16>
  return %y : tensor<4x2048xbf16>
}

// -0.0 reads as 0.0: both give the same predicate, and one layer must get one kernel name. The largest
// finite f16 is a legal threshold.
// CHECK-LABEL: func.func private @thresholds
// CHECK-SAME: value = bf16, index = i16, activation = relu, threshold = 0.0>
// CHECK-SAME: value = f16, index = i16, activation = silu, threshold = 65504.0>
func.func private @thresholds(
  tensor<?x64xbf16, #twell.layout<tile_n = 64, slots = 7, value = bf16, index = i16, activation = relu, threshold = -0.0>>,
  tensor<?x64xf16, #twell.layout<tile_n = 64, slots = 7, value = f16, index = i16, activation = silu, threshold = 65504.0>>)
