// twellc's --threshold (issue 16): above the dtype's largest finite value it is an error naming the
// option, the dtype and the bound; -0 is 0 (the same kernels, not a second set for the same layer).
// RUN: not twellc emit --d-model 64 --d-ff 64 --dtype f16 --activation silu --threshold 3e38 2>&1 | FileCheck %s --check-prefix=F16
// RUN: not twellc emit --d-model 64 --d-ff 64 --dtype f16 --threshold 65505 2>&1 | FileCheck %s --check-prefix=F16RELU
// RUN: not twellc compile --d-model 64 --d-ff 64 --dtype f16 --threshold 1e5 -o %t.bundle 2>&1 | FileCheck %s --check-prefix=COMPILE
// RUN: twellc emit --d-model 64 --d-ff 64 --dtype f16 --threshold 65504 --emit mlir 2>&1 | FileCheck %s --check-prefix=BOUND
// RUN: twellc emit --d-model 64 --d-ff 64 --threshold 0 --emit cuda > %t.zero.cu 2>/dev/null
// RUN: twellc emit --d-model 64 --d-ff 64 --threshold -0 --emit cuda > %t.negative-zero.cu 2>/dev/null
// RUN: diff %t.zero.cu %t.negative-zero.cu
// RUN: twellc emit %s --emit cuda > %t.file-negative-zero.cu 2>/dev/null
// RUN: diff %t.zero.cu %t.file-negative-zero.cu

// F16: --threshold: expected at most 65504 with --dtype f16 (its largest finite value: no activation could pass a larger threshold), got 3e+38
// F16RELU: --threshold: expected at most 65504 with --dtype f16 {{.*}}, got 65505
// COMPILE: --threshold: expected at most 65504 with --dtype f16 {{.*}}, got 100000
// BOUND: activation = relu, threshold = 65504.0>

// The FFN of `--d-model 64 --d-ff 64` with threshold -0.0.
#L = #twell.layout<tile_n = 256, slots = 31, value = bf16, index = i16, activation = relu, threshold = -0.0>
func.func @ffn(%x: tensor<?x64xbf16>, %wg: tensor<64x64xbf16>, %wu: tensor<64x64xbf16>,
               %wd: tensor<64x64xbf16>) -> tensor<?x64xbf16> {
  %y = twell.gated_ffn %x, %wg, %wu, %wd {layout = #L}
      : (tensor<?x64xbf16>, tensor<64x64xbf16>, tensor<64x64xbf16>, tensor<64x64xbf16>) -> tensor<?x64xbf16>
  return %y : tensor<?x64xbf16>
}
