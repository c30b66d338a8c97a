// twell-select-config's tuning-file= given files no tune writes, or no file at all: each is a warning
// naming the file and what is wrong with it, and the heuristic; never a failed pass or a tuned value
// the IR cannot hold.
// A cluster of 7 CTAs (the gate's cluster_m was 7 and the op failed to verify):
// RUN: twell-opt %s -twell-split-gated-ffn -twell-select-config="tuning-file=%S/Inputs/tuning-cluster-7.json decode=out_in tokens=16" 2>&1 | FileCheck %s --check-prefix=CLUSTER
// A bucket given twice (which one applied depended on a sort):
// RUN: twell-opt %s -twell-split-gated-ffn -twell-select-config="tuning-file=%S/Inputs/tuning-twice.json decode=out_in tokens=256" 2>&1 | FileCheck %s --check-prefix=TWICE
// A symbolic link (not followed) says so; a directory and a FIFO are not regular files (no hang).
// RUN: rm -rf %t.dir && mkdir -p %t.dir && ln -s %S/Inputs/tuning-paper.json %t.dir/link.json && mkfifo %t.dir/fifo.json
// RUN: twell-opt %s -twell-split-gated-ffn -twell-select-config="tuning-file=%t.dir/link.json decode=out_in" 2>&1 | FileCheck %s --check-prefix=LINK
// RUN: twell-opt %s -twell-split-gated-ffn -twell-select-config="tuning-file=%t.dir decode=out_in" 2>&1 | FileCheck %s --check-prefix=DIR
// RUN: twell-opt %s -twell-split-gated-ffn -twell-select-config="tuning-file=%t.dir/fifo.json decode=out_in" 2>&1 | FileCheck %s --check-prefix=FIFO

// CLUSTER: warning: twell-select-config: tuning-file {{.*}}tuning-cluster-7.json ignored (workloads.density:0.5%.buckets[0].winner.cluster_m: expected 1 or 2, found 7): the heuristic configures its kernels
// CLUSTER: twell.gate_matmul {{.*}}cluster_m = 2>, {{.*}}twell.config_source = "heuristic (tuning-file
// TWICE: warning: twell-select-config: tuning-file {{.*}}tuning-twice.json ignored (workloads.density:0.5%.buckets[3].tokens: expected each bucket once, found 256 twice)
// LINK: warning: twell-select-config: tuning-file {{.*}}link.json ignored (a symbolic link, which is not followed (name the file it points to))
// DIR: warning: twell-select-config: tuning-file {{.*}}.dir ignored (not a regular file)
// FIFO: warning: twell-select-config: tuning-file {{.*}}fifo.json ignored (not a regular file)

#L = #twell.layout<tile_n = 256, slots = 31, value = bf16, index = i16, activation = relu, threshold = 0.0>
func.func @paper(%x: tensor<?x2048xbf16>, %wg: tensor<5632x2048xbf16>, %wu: tensor<5632x2048xbf16>,
                 %wd: tensor<5632x2048xbf16>) -> tensor<?x2048xbf16> {
  %y = twell.gated_ffn %x, %wg, %wu, %wd {layout = #L, down_layout = #twell.down_layout<in_out>}
      : (tensor<?x2048xbf16>, tensor<5632x2048xbf16>, tensor<5632x2048xbf16>, tensor<5632x2048xbf16>) -> tensor<?x2048xbf16>
  return %y : tensor<?x2048xbf16>
}
