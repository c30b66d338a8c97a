// twell-select-config with tuning-file: a tuning database file (Inputs/tuning-paper.json: sm_90a, the
// paper's shape with an nn.Linear w_down) gives cluster_m, the consumer variant and the decode choice
// where its entry matches the FFN; elsewhere the heuristic, and twell.config_source says why.
// RUN: twell-opt %s -twell-split-gated-ffn -twell-select-config="tuning-file=%S/Inputs/tuning-paper.json decode=out_in" | FileCheck %s
// RUN: twell-opt %s -twell-split-gated-ffn -twell-select-config="tuning-file=%S/Inputs/tuning-paper.json decode=out_in tokens=256" | FileCheck %s --check-prefix=TOK256
// RUN: twell-opt %s -twell-split-gated-ffn -twell-select-config="tuning-file=%S/Inputs/tuning-paper.json decode=out_in tuning-workload=pattern:00000000000000aa" | FileCheck %s --check-prefix=PATTERN
// RUN: twell-opt %s -twell-split-gated-ffn -twell-select-config="tuning-file=%S/Inputs/tuning-paper.json decode=out_in tuning-workload=pattern:00000000000000aa consumer=block cluster-m=1" | FileCheck %s --check-prefix=OPTIONS
// RUN: twell-opt %s -twell-split-gated-ffn -twell-select-config="tuning-file=%S/Inputs/tuning-paper.json decode=out_in tuning-workload=density:5%" | FileCheck %s --check-prefix=LAYOUT
// RUN: twell-opt %s -twell-split-gated-ffn -twell-select-config="tuning-file=%S/Inputs/tuning-paper.json decode=out_in tuning-workload=pattern:00000000000000bb" | FileCheck %s --check-prefix=UNTUNED
// RUN: twell-opt %s -twell-split-gated-ffn -twell-select-config="tuning-file=%S/Inputs/tuning-paper.json decode=out_in tuning-workload=none" | FileCheck %s --check-prefix=WORKLOAD
// RUN: twell-opt %s -twell-split-gated-ffn -twell-select-config="tuning-file=%S/Inputs/tuning-paper.json decode=out_in target=sm_80" | FileCheck %s --check-prefix=ARCH
// RUN: twell-opt %s -twell-split-gated-ffn -twell-select-config="tuning-file=%S/Inputs/tuning-paper.json" | FileCheck %s --check-prefix=KEY
// Damaged, mistyped and absent files read as no entry: a warning, the heuristic, no failure.
// RUN: twell-opt %s -twell-split-gated-ffn -twell-select-config="tuning-file=%S/Inputs/tuning-truncated.json decode=out_in" 2>&1 | FileCheck %s --check-prefix=DAMAGED
// RUN: twell-opt %s -twell-split-gated-ffn -twell-select-config="tuning-file=%S/Inputs/tuning-bad-field.json decode=out_in" 2>&1 | FileCheck %s --check-prefix=FIELD
// RUN: twell-opt %s -twell-split-gated-ffn -twell-select-config="tuning-file=%S/Inputs/no-such-file.json decode=out_in" 2>&1 | FileCheck %s --check-prefix=ABSENT
// RUN: not twell-opt %s -twell-split-gated-ffn -twell-select-config="tokens=-1" 2>&1 | FileCheck %s --check-prefix=TOKENS
// The kernel pipeline takes the same options, and the kernels are specialized and emitted as usual.
// RUN: twell-opt %s -twell-kernel-pipeline="tuning-file=%S/Inputs/tuning-paper.json decode=out_in tokens=256" -twell-emit-cuda -o /dev/null | FileCheck %s --check-prefix=PIPELINE

// TOKENS: error: twell-select-config: tokens: expected 0 (the largest tuned bucket) or a token count, got -1

#L = #twell.layout<tile_n = 256, slots = 31, value = bf16, index = i16, activation = relu, threshold = 0.0>

// The default workload is the most recently tuned one (density:0.5%); tokens 0 takes its largest
// bucket, 131072, where the dense path won: its TwELL runner-up applies (cluster 1, row consumer).
// The bucket of 16 tokens chose the decode kernels: they stay.
// CHECK-LABEL: func.func @paper
// CHECK: twell.gate_matmul {{.*}}config = #twell.config<cta_m = 128, cta_k = 64, threads = 384, mainloop = wgmma, stages = 3>, target = {{.*}}, twell.config_source = "tuning-file {{.*}}/Inputs/tuning-paper.json workload density:0.5% bucket 131072: tile_n 256 slots 31 cluster_m 1 consumer row_gather decode on"
// CHECK: twell.gated_down {{.*}}config = #twell.config<cta_m = 8, threads = 256, mainloop = wgmma, consumer = warp_row>, decode = #twell.down_layout<out_in>, {{.*}}twell.config_source = "tuning-file {{.*}} bucket 131072: {{.*}}"
// The bucket of 256 tokens: the token block.
// TOK256-LABEL: func.func @paper
// TOK256: twell.gate_matmul {{.*}}stages = 3>, {{.*}}bucket 256: tile_n 256 slots 31 cluster_m 1 consumer token_block decode on"
// TOK256: twell.gated_down {{.*}}config = #twell.config<cta_m = 16, threads = 256, mainloop = wgmma, stages = 6, consumer = token_block>,
// A workload whose small buckets chose no decode kernels: none are emitted; clusters of 2.
// PATTERN-LABEL: func.func @paper
// PATTERN: twell.gate_matmul {{.*}}stages = 3, cluster_m = 2>, {{.*}}workload pattern:00000000000000aa bucket 16384: tile_n 256 slots 31 cluster_m 2 consumer row_gather decode off"
// PATTERN: twell.gated_down {{.*}}config = #twell.config<cta_m = 8, threads = 256, mainloop = wgmma, consumer = warp_row>, down_layout
// PATTERN-NOT: decode = #twell.down_layout
// PATTERN-LABEL: func.func @small
// Options other than their defaults win over the file.
// OPTIONS-LABEL: func.func @paper
// OPTIONS: twell.gate_matmul {{.*}}stages = 3>, target
// OPTIONS: twell.gated_down {{.*}}consumer = token_block>,
// A tuned layout other than the tensor type's, a bucket where the untuned plan won, a workload the file
// lacks, another arch, another w_down layout: the heuristic (cluster_m = 2, decode kernels).
// LAYOUT-LABEL: func.func @paper
// LAYOUT: twell.gate_matmul {{.*}}cluster_m = 2>, {{.*}}twell.config_source = "heuristic (tuning-file {{.*}}: workload density:5% bucket 131072: tuned layout tile_n 128 slots 15, this FFN's tensor type has tile_n 256 slots 31 (the layout is the type's: write the tuned one there))"
// UNTUNED: twell.config_source = "heuristic (tuning-file {{.*}}: workload pattern:00000000000000bb bucket 16384: the untuned configuration was fastest)"
// WORKLOAD: twell.config_source = "heuristic (tuning-file {{.*}}: no workload 'none' (it holds: density:0.5%, density:5%, pattern:00000000000000aa, pattern:00000000000000bb))"
// ARCH: twell.gate_matmul {{.*}}mainloop = mma_sync{{.*}}twell.config_source = "heuristic (tuning-file {{.*}}: tuned on sm_90a, the kernels' target is sm_80)"
// KEY: twell.gate_matmul {{.*}}cluster_m = 2>, {{.*}}twell.config_source = "heuristic (tuning-file {{.*}}: tuned for d_model 2048 d_ff 5632 gated relu threshold 0 bf16 out_in, this FFN is d_model 2048 d_ff 5632 gated relu threshold 0 bf16 in_out)"
// KEY: twell.gated_down {{.*}}decode = #twell.down_layout<in_out>
// DAMAGED: warning: twell-select-config: tuning-file {{.*}}/Inputs/tuning-truncated.json ignored (not valid JSON: {{.*}}): the heuristic configures its kernels
// DAMAGED: twell.gate_matmul {{.*}}cluster_m = 2>, {{.*}}twell.config_source = "heuristic (tuning-file {{.*}}tuning-truncated.json: not valid JSON
// FIELD: warning: twell-select-config: tuning-file {{.*}} ignored (workloads.density:0.5%.buckets[1].winner.consumer: expected row_gather or token_block, found "tiles")
// FIELD: twell.gated_down {{.*}}consumer = warp_row>, decode = #twell.down_layout<out_in>, {{.*}}twell.config_source = "heuristic
// ABSENT: warning: twell-select-config: tuning-file {{.*}}no-such-file.json ignored (absent)
// ABSENT: twell.gate_matmul {{.*}}cluster_m = 2>
// PIPELINE: kernel twell_gate_k2048_n5632_t256_s31_relu_bf16_{{.*}} gate_twell threads=384
// PIPELINE: kernel twell_gated_down_k2048_n5632_t256_s31_relu_bf16_in_out_{{.*}} gated_down threads=256 cta_m=16
func.func @paper(%x: tensor<?x2048xbf16>, %wg: tensor<5632x2048xbf16>, %wu: tensor<5632x2048xbf16>,
                 %wd: tensor<5632x2048xbf16>) -> tensor<?x2048xbf16> {
  %y = twell.gated_ffn %x, %wg, %wu, %wd {layout = #L, down_layout = #twell.down_layout<in_out>}
      : (tensor<?x2048xbf16>, tensor<5632x2048xbf16>, tensor<5632x2048xbf16>, tensor<5632x2048xbf16>) -> tensor<?x2048xbf16>
  return %y : tensor<?x2048xbf16>
}

// Another shape in the same module: the file's entry is not for it.
// CHECK-LABEL: func.func @small
// CHECK: twell.gate_matmul {{.*}}cluster_m = 2>, {{.*}}twell.config_source = "heuristic (tuning-file {{.*}}: tuned for d_model 2048 d_ff 5632 gated relu threshold 0 bf16 out_in, this FFN is d_model 512 d_ff 1408 gated relu threshold 0 bf16 out_in)"
func.func @small(%x: tensor<?x512xbf16>, %wg: tensor<1408x512xbf16>, %wu: tensor<1408x512xbf16>,
                 %wd: tensor<1408x512xbf16>) -> tensor<?x512xbf16> {
  %y = twell.gated_ffn %x, %wg, %wu, %wd {layout = #L, down_layout = #twell.down_layout<in_out>}
      : (tensor<?x512xbf16>, tensor<1408x512xbf16>, tensor<1408x512xbf16>, tensor<1408x512xbf16>) -> tensor<?x512xbf16>
  return %y : tensor<?x512xbf16>
}
