// The training ops through the kernel pipeline: twell-select-config gives them the target, and
// twell-specialize the names of the kernels generateAuxiliary emits for them (EmitTraining.h):
// gated (w_up and du given) and not gated, on sm_90a and sm_80.
// RUN: twell-opt %s -twell-kernel-pipeline | FileCheck %s
// RUN: twell-opt %s -twell-kernel-pipeline="target=sm_80" | FileCheck %s --check-prefix=SM80
// twell-emit-cuda prints their kernels; twellc, which takes files of one FFN, refuses them by name.
// RUN: twell-opt %s -twell-kernel-pipeline -twell-emit-cuda | FileCheck %s --check-prefix=CUDA
// RUN: not twellc emit %s 2>&1 | FileCheck %s --check-prefix=TWELLC
// CUDA: // ----- training kernel twell_train_row_backward_k512_n1408_t256_s31_relu_bf16_gated1_th00000000 train_row_backward threads=128
// CUDA: twell::device::train_row_backward<twell_train_row_backward_k512_n1408_t256_s31_relu_bf16_gated1_th00000000_config>(p);
// CUDA: // ----- training kernel twell_train_weight_grad_k512_n1408_t256_s31_bf16_gated1 train_weight_grad threads=512
// CUDA: // ----- training kernel twell_train_row_backward_k520_n1000_t128_s15_silu_f16_gated0_th3f000000 train_row_backward threads=256
// TWELLC: twell.train_row_backward: expected a file of one FFN {{.*}} got a training op

#l = #twell.layout<tile_n = 256, slots = 31, value = bf16, index = i16, activation = relu, threshold = 0.0>
#s = #twell.layout<tile_n = 128, slots = 15, value = f16, index = i16, activation = silu, threshold = 0.5>

// CHECK-LABEL: func.func @gated
// CHECK: twell.train_row_backward {{.*}}kernel_name = "twell_train_row_backward_k512_n1408_t256_s31_relu_bf16_gated1_th00000000", target = #twell.target<"sm_90a", [wgmma, tma, multicast]>
// CHECK: twell.train_weight_grad {{.*}}kernel_name = "twell_train_weight_grad_k512_n1408_t256_s31_bf16_gated1", target = #twell.target<"sm_90a"
// SM80-LABEL: func.func @gated
// SM80: twell.train_row_backward {{.*}}target = #twell.target<"sm_80"
func.func @gated(%x: tensor<?x512xbf16>, %dy: tensor<?x512xbf16>, %h: tensor<?x1408xbf16, #l>,
                 %wg: tensor<1408x512xbf16>, %wd: tensor<1408x512xbf16>, %wu: tensor<1408x512xbf16>)
    -> (tensor<?x512xbf16>, tensor<1408x512xf32>, tensor<1408x512xf32>, tensor<1408x512xf32>) {
  %dx, %dg, %du = twell.train_row_backward %x, %dy, %h, %wg, %wd, %wu
      : (tensor<?x512xbf16>, tensor<?x512xbf16>, tensor<?x1408xbf16, #l>, tensor<1408x512xbf16>, tensor<1408x512xbf16>,
         tensor<1408x512xbf16>) -> (tensor<?x512xbf16>, tensor<?x1408xf32>, tensor<?x1408xf32>)
  %dwg, %dwd, %dwu = twell.train_weight_grad %x, %dy, %h, %dg, %du
      : (tensor<?x512xbf16>, tensor<?x512xbf16>, tensor<?x1408xbf16, #l>, tensor<?x1408xf32>, tensor<?x1408xf32>)
      -> (tensor<1408x512xf32>, tensor<1408x512xf32>, tensor<1408x512xf32>)
  return %dx, %dwg, %dwd, %dwu : tensor<?x512xbf16>, tensor<1408x512xf32>, tensor<1408x512xf32>, tensor<1408x512xf32>
}

// CHECK-LABEL: func.func @not_gated
// CHECK: twell.train_row_backward {{.*}}kernel_name = "twell_train_row_backward_k520_n1000_t128_s15_silu_f16_gated0_th3f000000"
// CHECK: twell.train_weight_grad {{.*}}kernel_name = "twell_train_weight_grad_k520_n1000_t128_s15_f16_gated0"
func.func @not_gated(%x: tensor<7x520xf16>, %dy: tensor<7x520xf16>, %h: tensor<7x1000xf16, #s>,
                     %wg: tensor<1000x520xf16>, %wd: tensor<1000x520xf16>)
    -> (tensor<7x520xf16>, tensor<1000x520xf32>, tensor<1000x520xf32>) {
  %dx, %dg = twell.train_row_backward %x, %dy, %h, %wg, %wd
      : (tensor<7x520xf16>, tensor<7x520xf16>, tensor<7x1000xf16, #s>, tensor<1000x520xf16>, tensor<1000x520xf16>)
      -> (tensor<7x520xf16>, tensor<7x1000xf32>)
  %dwg, %dwd = twell.train_weight_grad %x, %dy, %h, %dg
      : (tensor<7x520xf16>, tensor<7x520xf16>, tensor<7x1000xf16, #s>, tensor<7x1000xf32>)
      -> (tensor<1000x520xf32>, tensor<1000x520xf32>)
  return %dx, %dwg, %dwd : tensor<7x520xf16>, tensor<1000x520xf32>, tensor<1000x520xf32>
}
