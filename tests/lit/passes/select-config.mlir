// RUN: twell-opt %s -twell-select-config | FileCheck %s
// RUN: twell-opt %s -twell-select-config=target=sm_80 | FileCheck %s --check-prefix=SM80
// RUN: not twell-opt %s -twell-select-config=target=volta 2>&1 | FileCheck %s --check-prefix=BAD

// BAD: error: twell-select-config: target: arch must be of the form sm_<major><minor>[a] (e.g. "sm_90a"), got "volta"

#L256 = #twell.layout<tile_n = 256, slots = 31, value = bf16, index = i16, activation = relu, threshold = 0.0>
#L128 = #twell.layout<tile_n = 128, slots = 15, value = bf16, index = i16, activation = relu, threshold = 0.0>

// Gate kernel: cta_m = 16384 / tile_n, cta_k = 16, 256 threads; consumer: one row per CTA, 256 threads.
// CHECK-LABEL: func.func @heuristic
// CHECK: twell.gate_matmul %arg0, %arg1 {config = #twell.config<cta_m = 64, cta_k = 16, threads = 256>, target = #twell.target<"sm_90a", [wgmma, tma, multicast]>}
// CHECK: twell.gated_down %arg0, %{{.*}}, %arg2, %arg3 {config = #twell.config<cta_m = 1, threads = 256>, target = #twell.target<"sm_90a", [wgmma, tma, multicast]>}
// SM80-LABEL: func.func @heuristic
// SM80: twell.gate_matmul %arg0, %arg1 {config = #twell.config<cta_m = 64, cta_k = 16, threads = 256>, target = #twell.target<"sm_80", [mma_sync, cp_async]>}
// SM80: twell.gated_down %arg0, %{{.*}}, %arg2, %arg3 {config = #twell.config<cta_m = 1, threads = 256>, target = #twell.target<"sm_80", [mma_sync, cp_async]>}
func.func @heuristic(%x: tensor<?x2048xbf16>, %wg: tensor<5632x2048xbf16>, %wu: tensor<5632x2048xbf16>,
                     %wd: tensor<2048x5632xbf16>) -> tensor<?x2048xbf16> {
  %h = twell.gate_matmul %x, %wg
      : (tensor<?x2048xbf16>, tensor<5632x2048xbf16>) -> tensor<?x5632xbf16, #L256>
  %y = twell.gated_down %x, %h, %wu, %wd
      : (tensor<?x2048xbf16>, tensor<?x5632xbf16, #L256>, tensor<5632x2048xbf16>, tensor<2048x5632xbf16>)
      -> tensor<?x2048xbf16>
  return %y : tensor<?x2048xbf16>
}

// CHECK-LABEL: func.func @tile_128
// CHECK: twell.gate_matmul %arg0, %arg1 {config = #twell.config<cta_m = 128, cta_k = 16, threads = 256>
func.func @tile_128(%x: tensor<?x2048xbf16>, %wg: tensor<5632x2048xbf16>) -> tensor<?x5632xbf16, #L128> {
  %h = twell.gate_matmul %x, %wg
      : (tensor<?x2048xbf16>, tensor<5632x2048xbf16>) -> tensor<?x5632xbf16, #L128>
  return %h : tensor<?x5632xbf16, #L128>
}

// At tile_n = 1024 the operands of a 16-deep K step would not fit 48 KiB of shared memory: cta_k = 8.
// CHECK-LABEL: func.func @tile_1024
// CHECK: twell.gate_matmul %arg0, %arg1 {config = #twell.config<cta_m = 16, cta_k = 8, threads = 256>
func.func @tile_1024(%x: tensor<?x2048xbf16>, %wg: tensor<5632x2048xbf16>)
    -> tensor<?x5632xbf16, #twell.layout<tile_n = 1024, slots = 127, value = bf16, index = i16, activation = relu, threshold = 0.0>> {
  %h = twell.gate_matmul %x, %wg
      : (tensor<?x2048xbf16>, tensor<5632x2048xbf16>)
      -> tensor<?x5632xbf16, #twell.layout<tile_n = 1024, slots = 127, value = bf16, index = i16, activation = relu, threshold = 0.0>>
  return %h : tensor<?x5632xbf16, #twell.layout<tile_n = 1024, slots = 127, value = bf16, index = i16, activation = relu, threshold = 0.0>>
}

// Attributes already present (written by hand or by a tuner) are kept.
// CHECK-LABEL: func.func @explicit
// CHECK: twell.gate_matmul %arg0, %arg1 {config = #twell.config<cta_m = 64, cta_k = 32, threads = 256>, target = #twell.target<"sm_90a", [wgmma, tma, multicast]>}
// CHECK: twell.gated_down %arg0, %{{.*}}, %arg2, %arg3 {config = #twell.config<cta_m = 1, threads = 512>, target = #twell.target<"sm_90a", [tma]>}
func.func @explicit(%x: tensor<?x2048xbf16>, %wg: tensor<5632x2048xbf16>, %wu: tensor<5632x2048xbf16>,
                    %wd: tensor<2048x5632xbf16>) -> tensor<?x2048xbf16> {
  %h = twell.gate_matmul %x, %wg {config = #twell.config<cta_m = 64, cta_k = 32, threads = 256>}
      : (tensor<?x2048xbf16>, tensor<5632x2048xbf16>) -> tensor<?x5632xbf16, #L256>
  %y = twell.gated_down %x, %h, %wu, %wd {target = #twell.target<"sm_90a", [tma]>,
      config = #twell.config<cta_m = 1, threads = 512>}
      : (tensor<?x2048xbf16>, tensor<?x5632xbf16, #L256>, tensor<5632x2048xbf16>, tensor<2048x5632xbf16>)
      -> tensor<?x2048xbf16>
  return %y : tensor<?x2048xbf16>
}

// The fused op is not a kernel: it gets nothing.
// CHECK-LABEL: func.func @fused
// CHECK: twell.gated_ffn %arg0, %arg1, %arg2, %arg3 {layout =
func.func @fused(%x: tensor<?x2048xbf16>, %wg: tensor<5632x2048xbf16>, %wu: tensor<5632x2048xbf16>,
                 %wd: tensor<2048x5632xbf16>) -> tensor<?x2048xbf16> {
  %y = twell.gated_ffn %x, %wg, %wu, %wd {layout = #L256}
      : (tensor<?x2048xbf16>, tensor<5632x2048xbf16>, tensor<5632x2048xbf16>, tensor<2048x5632xbf16>)
      -> tensor<?x2048xbf16>
  return %y : tensor<?x2048xbf16>
}
