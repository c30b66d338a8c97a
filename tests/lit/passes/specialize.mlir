// RUN: twell-opt %s -twell-specialize | FileCheck %s

// The names read the shape and layout and end with a hash of every emitted constant, so they are
// stable (golden values below) and change whenever any constant does.

#L = #twell.layout<tile_n = 256, slots = 31, value = bf16, index = i16, activation = relu, threshold = 0.0>
#L05 = #twell.layout<tile_n = 256, slots = 31, value = bf16, index = i16, activation = relu, threshold = 0.5>
#H90 = #twell.target<"sm_90a", [wgmma, tma, multicast]>
#S80 = #twell.target<"sm_80", [mma_sync, cp_async]>
#G = #twell.config<cta_m = 64, cta_k = 16, threads = 256>
#D = #twell.config<cta_m = 1, threads = 256, consumer = cta_row>
#GM = #twell.config<cta_m = 128, cta_k = 32, threads = 512, mainloop = mma_sync, stages = 4>
#DM = #twell.config<cta_m = 1, threads = 256, mainloop = mma_sync, consumer = cta_row>

// CHECK-LABEL: func.func @base
// CHECK: twell.gate_matmul {{.*}}kernel_name = "twell_gate_k2048_n5632_t256_s31_relu_bf16_9eb7233e"
// CHECK: twell.gated_down {{.*}}kernel_name = "twell_gated_down_k2048_n5632_t256_s31_relu_bf16_out_in_fe198916"
func.func @base(%x: tensor<?x2048xbf16>, %wg: tensor<5632x2048xbf16>, %wu: tensor<5632x2048xbf16>,
                %wd: tensor<2048x5632xbf16>) -> tensor<?x2048xbf16> {
  %h = twell.gate_matmul %x, %wg {target = #H90, config = #G}
      : (tensor<?x2048xbf16>, tensor<5632x2048xbf16>) -> tensor<?x5632xbf16, #L>
  %y = twell.gated_down %x, %h, %wu, %wd {target = #H90, config = #D}
      : (tensor<?x2048xbf16>, tensor<?x5632xbf16, #L>, tensor<5632x2048xbf16>, tensor<2048x5632xbf16>)
      -> tensor<?x2048xbf16>
  return %y : tensor<?x2048xbf16>
}

// The token count is a run-time argument of the kernels: a static M names the same kernels.
// CHECK-LABEL: func.func @static_tokens
// CHECK: twell.gate_matmul {{.*}}kernel_name = "twell_gate_k2048_n5632_t256_s31_relu_bf16_9eb7233e"
// CHECK: twell.gated_down {{.*}}kernel_name = "twell_gated_down_k2048_n5632_t256_s31_relu_bf16_out_in_fe198916"
func.func @static_tokens(%x: tensor<32x2048xbf16>, %wg: tensor<5632x2048xbf16>, %wu: tensor<5632x2048xbf16>,
                         %wd: tensor<2048x5632xbf16>) -> tensor<32x2048xbf16> {
  %h = twell.gate_matmul %x, %wg {target = #H90, config = #G}
      : (tensor<32x2048xbf16>, tensor<5632x2048xbf16>) -> tensor<32x5632xbf16, #L>
  %y = twell.gated_down %x, %h, %wu, %wd {target = #H90, config = #D}
      : (tensor<32x2048xbf16>, tensor<32x5632xbf16, #L>, tensor<5632x2048xbf16>, tensor<2048x5632xbf16>)
      -> tensor<32x2048xbf16>
  return %y : tensor<32x2048xbf16>
}

// Another threshold: same readable part, another hash.
// CHECK-LABEL: func.func @threshold
// CHECK: twell.gate_matmul {{.*}}kernel_name = "twell_gate_k2048_n5632_t256_s31_relu_bf16_26fc1e3f"
// CHECK: twell.gated_down {{.*}}kernel_name = "twell_gated_down_k2048_n5632_t256_s31_relu_bf16_out_in_127eac02"
func.func @threshold(%x: tensor<?x2048xbf16>, %wg: tensor<5632x2048xbf16>, %wu: tensor<5632x2048xbf16>,
                     %wd: tensor<2048x5632xbf16>) -> tensor<?x2048xbf16> {
  %h = twell.gate_matmul %x, %wg {target = #H90, config = #G}
      : (tensor<?x2048xbf16>, tensor<5632x2048xbf16>) -> tensor<?x5632xbf16, #L05>
  %y = twell.gated_down %x, %h, %wu, %wd {target = #H90, config = #D}
      : (tensor<?x2048xbf16>, tensor<?x5632xbf16, #L05>, tensor<5632x2048xbf16>, tensor<2048x5632xbf16>)
      -> tensor<?x2048xbf16>
  return %y : tensor<?x2048xbf16>
}

// Another target, another configuration, another down layout: other hashes.
// CHECK-LABEL: func.func @target_config_layout
// CHECK: twell.gate_matmul {{.*}}kernel_name = "twell_gate_k2048_n5632_t256_s31_relu_bf16_2309274b"
// CHECK: twell.gate_matmul {{.*}}kernel_name = "twell_gate_k2048_n5632_t256_s31_relu_bf16_ebbe0b61"
// CHECK: twell.gated_down {{.*}}kernel_name = "twell_gated_down_k2048_n5632_t256_s31_relu_bf16_in_out_8cf8dcfe"
func.func @target_config_layout(%x: tensor<?x2048xbf16>, %wg: tensor<5632x2048xbf16>,
                                %wu: tensor<5632x2048xbf16>, %wd: tensor<5632x2048xbf16>)
    -> (tensor<?x5632xbf16, #L>, tensor<?x2048xbf16>) {
  %h0 = twell.gate_matmul %x, %wg {target = #S80, config = #G}
      : (tensor<?x2048xbf16>, tensor<5632x2048xbf16>) -> tensor<?x5632xbf16, #L>
  %h = twell.gate_matmul %x, %wg {target = #H90, config = #twell.config<cta_m = 64, cta_k = 32, threads = 256>}
      : (tensor<?x2048xbf16>, tensor<5632x2048xbf16>) -> tensor<?x5632xbf16, #L>
  %y = twell.gated_down %x, %h, %wu, %wd {target = #H90, config = #D, down_layout = #twell.down_layout<in_out>}
      : (tensor<?x2048xbf16>, tensor<?x5632xbf16, #L>, tensor<5632x2048xbf16>, tensor<5632x2048xbf16>)
      -> tensor<?x2048xbf16>
  return %h0, %y : tensor<?x5632xbf16, #L>, tensor<?x2048xbf16>
}

// The tensor-core main loop: other hashes for both kernels (the consumer's recompute follows the gate
// kernel's main loop); another pipeline depth, another gate hash.
// CHECK-LABEL: func.func @mainloop
// CHECK: twell.gate_matmul {{.*}}kernel_name = "twell_gate_k2048_n5632_t256_s31_relu_bf16_79a87b8b"
// CHECK: twell.gated_down {{.*}}kernel_name = "twell_gated_down_k2048_n5632_t256_s31_relu_bf16_out_in_dbba36fb"
// CHECK: twell.gate_matmul {{.*}}kernel_name = "twell_gate_k2048_n5632_t256_s31_relu_bf16_dd732738"
func.func @mainloop(%x: tensor<?x2048xbf16>, %wg: tensor<5632x2048xbf16>, %wu: tensor<5632x2048xbf16>,
                    %wd: tensor<2048x5632xbf16>) -> (tensor<?x2048xbf16>, tensor<?x5632xbf16, #L>) {
  %h = twell.gate_matmul %x, %wg {target = #H90, config = #GM}
      : (tensor<?x2048xbf16>, tensor<5632x2048xbf16>) -> tensor<?x5632xbf16, #L>
  %y = twell.gated_down %x, %h, %wu, %wd {target = #H90, config = #DM}
      : (tensor<?x2048xbf16>, tensor<?x5632xbf16, #L>, tensor<5632x2048xbf16>, tensor<2048x5632xbf16>)
      -> tensor<?x2048xbf16>
  %h3 = twell.gate_matmul %x, %wg {target = #H90,
      config = #twell.config<cta_m = 128, cta_k = 32, threads = 512, mainloop = mma_sync, stages = 3>}
      : (tensor<?x2048xbf16>, tensor<5632x2048xbf16>) -> tensor<?x5632xbf16, #L>
  return %y, %h3 : tensor<?x2048xbf16>, tensor<?x5632xbf16, #L>
}

// f16, SiLU, odd sizes.
// CHECK-LABEL: func.func @f16_silu
// CHECK: twell.gate_matmul {{.*}}kernel_name = "twell_gate_k1000_n3000_t128_s15_silu_f16_0447f399"
func.func @f16_silu(%x: tensor<?x1000xf16>, %wg: tensor<3000x1000xf16>)
    -> tensor<?x3000xf16, #twell.layout<tile_n = 128, slots = 15, value = f16, index = i16, activation = silu, threshold = 0.125>> {
  %h = twell.gate_matmul %x, %wg {target = #H90, config = #twell.config<cta_m = 128, cta_k = 16, threads = 256>}
      : (tensor<?x1000xf16>, tensor<3000x1000xf16>)
      -> tensor<?x3000xf16, #twell.layout<tile_n = 128, slots = 15, value = f16, index = i16, activation = silu, threshold = 0.125>>
  return %h : tensor<?x3000xf16, #twell.layout<tile_n = 128, slots = 15, value = f16, index = i16, activation = silu, threshold = 0.125>>
}
