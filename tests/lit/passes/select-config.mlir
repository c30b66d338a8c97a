// RUN: twell-opt %s -twell-select-config | FileCheck %s
// RUN: twell-opt %s -twell-select-config=target=sm_80 | FileCheck %s --check-prefix=SM80
// RUN: not twell-opt %s -twell-select-config=target=volta 2>&1 | FileCheck %s --check-prefix=BAD
// RUN: twell-opt %s -twell-select-config=cluster-m=1 | FileCheck %s --check-prefix=C1
// RUN: not twell-opt %s -twell-select-config=cluster-m=3 2>&1 | FileCheck %s --check-prefix=BADC
// RUN: not twell-opt %s -twell-select-config="target=sm_80 cluster-m=2" 2>&1 | FileCheck %s --check-prefix=NOCLUSTER

// BADC: error: twell-select-config: cluster-m: expected 1 or 2 (or 0: the heuristic's), got 3
// NOCLUSTER: error: twell-select-config: cluster-m=2 needs the wgmma gate on a target with feature multicast (sm_90a, d_model % 32 == 0, tile_n 64, 128 or 256); this gate gets mainloop mma_sync on #twell.target<"sm_80", [mma_sync, cp_async]>
// BAD: error: twell-select-config: target: arch must be of the form sm_<major><minor>[a] (e.g. "sm_90a"), got "volta"

#L256 = #twell.layout<tile_n = 256, slots = 31, value = bf16, index = i16, activation = relu, threshold = 0.0>
#L128 = #twell.layout<tile_n = 128, slots = 15, value = bf16, index = i16, activation = relu, threshold = 0.0>
#L32 = #twell.layout<tile_n = 32, slots = 7, value = bf16, index = i16, activation = relu, threshold = 0.0>
#L1024 = #twell.layout<tile_n = 1024, slots = 127, value = bf16, index = i16, activation = relu, threshold = 0.0>

// Gate kernel: on sm_90a (features wgmma, tma) the wgmma main loop wherever it is allowed (d_model %
// 32 == 0, tile_n 64, 128 or 256): cta_m 128, cta_k 64 (32 where d_model % 64 != 0), 384 threads, the
// deepest TMA ring (at most 6 stages) that fits 227 KiB beside the epilogue's staging area, clusters of 2
// CTAs multicasting the w_gate tile where the target has multicast. Else the mma_sync main loop wherever allowed (d_model % 8 == 0, 64 <= tile_n <=
// 1024), on every target: cta_m = min(128, 32768 / tile_n), cta_k = 32, 512 threads, the deepest cp.async
// pipeline (4, 3 or 2 stages) whose shared memory fits 200 KiB. Consumer: one row per CTA, 256 threads,
// the main loop of its gate kernel.
// cluster-m=1: the wgmma gate without clusters (cluster_m omitted: 1).
// C1-LABEL: func.func @heuristic
// C1: twell.gate_matmul %arg0, %arg1 {config = #twell.config<cta_m = 128, cta_k = 64, threads = 384, mainloop = wgmma, stages = 3>, target
// CHECK-LABEL: func.func @heuristic
// CHECK: twell.gate_matmul %arg0, %arg1 {config = #twell.config<cta_m = 128, cta_k = 64, threads = 384, mainloop = wgmma, stages = 3, cluster_m = 2>, target = #twell.target<"sm_90a", [wgmma, tma, multicast]>}
// CHECK: twell.gated_down %arg0, %{{.*}}, %arg2, %arg3 {config = #twell.config<cta_m = 1, threads = 256, mainloop = wgmma, consumer = cta_row>, decode = #twell.down_layout<out_in>, target = #twell.target<"sm_90a", [wgmma, tma, multicast]>}
// SM80-LABEL: func.func @heuristic
// SM80: twell.gate_matmul %arg0, %arg1 {config = #twell.config<cta_m = 128, cta_k = 32, threads = 512, mainloop = mma_sync, stages = 4>, target = #twell.target<"sm_80", [mma_sync, cp_async]>}
// SM80: twell.gated_down %arg0, %{{.*}}, %arg2, %arg3 {config = #twell.config<cta_m = 1, threads = 256, mainloop = mma_sync, consumer = cta_row>, decode = #twell.down_layout<out_in>, target = #twell.target<"sm_80", [mma_sync, cp_async]>}
func.func @heuristic(%x: tensor<?x2048xbf16>, %wg: tensor<5632x2048xbf16>, %wu: tensor<5632x2048xbf16>,
                     %wd: tensor<2048x5632xbf16>) -> tensor<?x2048xbf16> {
  %h = twell.gate_matmul %x, %wg
      : (tensor<?x2048xbf16>, tensor<5632x2048xbf16>) -> tensor<?x5632xbf16, #L256>
  %y = twell.gated_down %x, %h, %wu, %wd
      : (tensor<?x2048xbf16>, tensor<?x5632xbf16, #L256>, tensor<5632x2048xbf16>, tensor<2048x5632xbf16>)
      -> tensor<?x2048xbf16>
  return %y : tensor<?x2048xbf16>
}

// tile_n = 128: wgmma with 5 stages of (128 + 128) * 128 bytes (sm_90a); mma_sync with cta_m = 128, 4
// stages of (128 + 128) * 80 bytes (sm_80).
// CHECK-LABEL: func.func @tile_128
// CHECK: twell.gate_matmul %arg0, %arg1 {config = #twell.config<cta_m = 128, cta_k = 64, threads = 384, mainloop = wgmma, stages = 5, cluster_m = 2>
func.func @tile_128(%x: tensor<?x2048xbf16>, %wg: tensor<5632x2048xbf16>) -> tensor<?x5632xbf16, #L128> {
  %h = twell.gate_matmul %x, %wg
      : (tensor<?x2048xbf16>, tensor<5632x2048xbf16>) -> tensor<?x5632xbf16, #L128>
  return %h : tensor<?x5632xbf16, #L128>
}

// tile_n = 1024: cta_m = 32; a stage is (32 + 1024) * 80 = 84480 bytes, so 3 stages (253440) would
// overflow 200 KiB: 2 stages.
// CHECK-LABEL: func.func @tile_1024
// CHECK: twell.gate_matmul %arg0, %arg1 {config = #twell.config<cta_m = 32, cta_k = 32, threads = 512, mainloop = mma_sync, stages = 2>
func.func @tile_1024(%x: tensor<?x2048xbf16>, %wg: tensor<5632x2048xbf16>) -> tensor<?x5632xbf16, #L1024> {
  %h = twell.gate_matmul %x, %wg
      : (tensor<?x2048xbf16>, tensor<5632x2048xbf16>) -> tensor<?x5632xbf16, #L1024>
  return %h : tensor<?x5632xbf16, #L1024>
}

// tile_n = 32 is too narrow for the tensor-core main loop: fma, cta_m = 16384 / tile_n, cta_k = 16.
// CHECK-LABEL: func.func @tile_32
// CHECK: twell.gate_matmul %arg0, %arg1 {config = #twell.config<cta_m = 512, cta_k = 16, threads = 256>
// CHECK: twell.gated_down %arg0, %{{.*}}, %arg2, %arg3 {config = #twell.config<cta_m = 1, threads = 256, consumer = cta_row>
func.func @tile_32(%x: tensor<?x2048xbf16>, %wg: tensor<5632x2048xbf16>, %wu: tensor<5632x2048xbf16>,
                   %wd: tensor<2048x5632xbf16>) -> tensor<?x2048xbf16> {
  %h = twell.gate_matmul %x, %wg
      : (tensor<?x2048xbf16>, tensor<5632x2048xbf16>) -> tensor<?x5632xbf16, #L32>
  %y = twell.gated_down %x, %h, %wu, %wd
      : (tensor<?x2048xbf16>, tensor<?x5632xbf16, #L32>, tensor<5632x2048xbf16>, tensor<2048x5632xbf16>)
      -> tensor<?x2048xbf16>
  return %y : tensor<?x2048xbf16>
}

// d_model = 514 cannot be read in 16-byte chunks: fma, on every target.
// CHECK-LABEL: func.func @d_model_514
// CHECK: twell.gate_matmul %arg0, %arg1 {config = #twell.config<cta_m = 64, cta_k = 16, threads = 256>
// CHECK: twell.gated_down %arg0, %{{.*}}, %arg2, %arg3 {config = #twell.config<cta_m = 1, threads = 256, consumer = cta_row>
// SM80-LABEL: func.func @d_model_514
// SM80: twell.gate_matmul %arg0, %arg1 {config = #twell.config<cta_m = 64, cta_k = 16, threads = 256>
// SM80: twell.gated_down %arg0, %{{.*}}, %arg2, %arg3 {config = #twell.config<cta_m = 1, threads = 256, consumer = cta_row>
func.func @d_model_514(%x: tensor<?x514xbf16>, %wg: tensor<1408x514xbf16>, %wu: tensor<1408x514xbf16>,
                       %wd: tensor<514x1408xbf16>) -> tensor<?x514xbf16> {
  %h = twell.gate_matmul %x, %wg
      : (tensor<?x514xbf16>, tensor<1408x514xbf16>) -> tensor<?x1408xbf16, #L256>
  %y = twell.gated_down %x, %h, %wu, %wd
      : (tensor<?x514xbf16>, tensor<?x1408xbf16, #L256>, tensor<1408x514xbf16>, tensor<514x1408xbf16>)
      -> tensor<?x514xbf16>
  return %y : tensor<?x514xbf16>
}

// fma at tile_n = 1024: the operands of a 16-deep K step would not fit 48 KiB of static shared memory,
// cta_k = 8.
// CHECK-LABEL: func.func @fma_tile_1024
// CHECK: twell.gate_matmul %arg0, %arg1 {config = #twell.config<cta_m = 16, cta_k = 8, threads = 256>
func.func @fma_tile_1024(%x: tensor<?x514xbf16>, %wg: tensor<5632x514xbf16>) -> tensor<?x5632xbf16, #L1024> {
  %h = twell.gate_matmul %x, %wg
      : (tensor<?x514xbf16>, tensor<5632x514xbf16>) -> tensor<?x5632xbf16, #L1024>
  return %h : tensor<?x5632xbf16, #L1024>
}

// Attributes already present (written by hand or by a tuner) are kept.
// CHECK-LABEL: func.func @explicit
// CHECK: twell.gate_matmul %arg0, %arg1 {config = #twell.config<cta_m = 64, cta_k = 32, threads = 256>, target = #twell.target<"sm_90a", [wgmma, tma, multicast]>}
// CHECK: twell.gated_down %arg0, %{{.*}}, %arg2, %arg3 {config = #twell.config<cta_m = 1, threads = 512, consumer = cta_row>, target = #twell.target<"sm_90a", [tma]>}
func.func @explicit(%x: tensor<?x2048xbf16>, %wg: tensor<5632x2048xbf16>, %wu: tensor<5632x2048xbf16>,
                    %wd: tensor<2048x5632xbf16>) -> tensor<?x2048xbf16> {
  %h = twell.gate_matmul %x, %wg {config = #twell.config<cta_m = 64, cta_k = 32, threads = 256>}
      : (tensor<?x2048xbf16>, tensor<5632x2048xbf16>) -> tensor<?x5632xbf16, #L256>
  %y = twell.gated_down %x, %h, %wu, %wd {target = #twell.target<"sm_90a", [tma]>,
      config = #twell.config<cta_m = 1, threads = 512, consumer = cta_row>}
      : (tensor<?x2048xbf16>, tensor<?x5632xbf16, #L256>, tensor<5632x2048xbf16>, tensor<2048x5632xbf16>)
      -> tensor<?x2048xbf16>
  return %y : tensor<?x2048xbf16>
}

// A consumer without a config takes the main loop of its gate kernel's explicit config (fma here).
// CHECK-LABEL: func.func @explicit_gate
// CHECK: twell.gate_matmul %arg0, %arg1 {config = #twell.config<cta_m = 64, cta_k = 16, threads = 256>
// CHECK: twell.gated_down %arg0, %{{.*}}, %arg2, %arg3 {config = #twell.config<cta_m = 1, threads = 256, consumer = cta_row>,
func.func @explicit_gate(%x: tensor<?x2048xbf16>, %wg: tensor<5632x2048xbf16>, %wu: tensor<5632x2048xbf16>,
                         %wd: tensor<2048x5632xbf16>) -> tensor<?x2048xbf16> {
  %h = twell.gate_matmul %x, %wg {config = #twell.config<cta_m = 64, cta_k = 16, threads = 256>}
      : (tensor<?x2048xbf16>, tensor<5632x2048xbf16>) -> tensor<?x5632xbf16, #L256>
  %y = twell.gated_down %x, %h, %wu, %wd
      : (tensor<?x2048xbf16>, tensor<?x5632xbf16, #L256>, tensor<5632x2048xbf16>, tensor<2048x5632xbf16>)
      -> tensor<?x2048xbf16>
  return %y : tensor<?x2048xbf16>
}

// A gate kernel without a config follows the main loop of its consumer's explicit config (fma here,
// though mma_sync would be allowed), so that the two agree.
// CHECK-LABEL: func.func @explicit_consumer
// CHECK: twell.gate_matmul %arg0, %arg1 {config = #twell.config<cta_m = 64, cta_k = 16, threads = 256>,
// CHECK: twell.gated_down %arg0, %{{.*}}, %arg2, %arg3 {config = #twell.config<cta_m = 1, threads = 128, consumer = cta_row>,
func.func @explicit_consumer(%x: tensor<?x2048xbf16>, %wg: tensor<5632x2048xbf16>, %wu: tensor<5632x2048xbf16>,
                             %wd: tensor<2048x5632xbf16>) -> tensor<?x2048xbf16> {
  %h = twell.gate_matmul %x, %wg
      : (tensor<?x2048xbf16>, tensor<5632x2048xbf16>) -> tensor<?x5632xbf16, #L256>
  %y = twell.gated_down %x, %h, %wu, %wd {config = #twell.config<cta_m = 1, threads = 128, consumer = cta_row>}
      : (tensor<?x2048xbf16>, tensor<?x5632xbf16, #L256>, tensor<5632x2048xbf16>, tensor<2048x5632xbf16>)
      -> tensor<?x2048xbf16>
  return %y : tensor<?x2048xbf16>
}

// A consumer whose h comes from outside gets the main loop a gate kernel of its shape would get.
// CHECK-LABEL: func.func @consumer_alone
// CHECK: twell.gated_down %arg0, %arg1, %arg2, %arg3 {config = #twell.config<cta_m = 1, threads = 256, mainloop = wgmma, consumer = cta_row>
func.func @consumer_alone(%x: tensor<?x2048xbf16>, %h: tensor<?x5632xbf16, #L256>, %wu: tensor<5632x2048xbf16>,
                          %wd: tensor<2048x5632xbf16>) -> tensor<?x2048xbf16> {
  %y = twell.gated_down %x, %h, %wu, %wd
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
