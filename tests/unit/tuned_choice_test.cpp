// twell-select-config's choice from a tuning file (compiler/lib/TunedChoice.h), without MLIR: when an
// entry applies to an FFN, what it gives, and why not otherwise.
#include <gtest/gtest.h>

#include "TunedChoice.h"

using namespace twell;
using compiler::TunedChoice;
using compiler::TunedFfn;

namespace {

TunedBucket bucket(int64_t tokens, TunedConfig::Path path, int tile_n, int cluster_m, ConsumerVariant consumer,
                   int64_t decode) {
  TunedBucket b;
  b.tokens = tokens;
  b.winner = TunedConfig{path, tile_n, tile_n / 8 - 1, cluster_m, consumer, decode, 1.0};
  return b;
}

TuningFile file() {
  TuningFile f;
  f.hardware = TuningHardware{"sm_90a", 132, 13000, "0.1.0", "NVIDIA H200"};
  f.spec.d_model = 2048;
  f.spec.d_ff = 5632;
  using P = TunedConfig::Path;
  f.workloads.push_back(TuningWorkload{"density:0.5%",
                                       "",
                                       2,
                                       {bucket(1, P::TwELL, 256, 1, ConsumerVariant::RowGather, 64),
                                        bucket(256, P::TwELL, 256, 1, ConsumerVariant::TokenBlock, 0),
                                        bucket(16384, P::TwELL, 256, 2, ConsumerVariant::RowGather, 0)}});
  f.workloads.push_back(TuningWorkload{"decode-off",
                                       "",
                                       1,
                                       {bucket(16, P::TwELL, 256, 2, ConsumerVariant::RowGather, 0),
                                        bucket(64, P::Dense, 0, 1, ConsumerVariant::RowGather, 0)}});
  f.workloads.push_back(TuningWorkload{"untuned-small",
                                       "",
                                       0,
                                       {bucket(16, P::Heuristic, 0, 1, ConsumerVariant::RowGather, 0),
                                        bucket(4096, P::TwELL, 128, 1, ConsumerVariant::RowGather, 0)}});
  return f;
}

TunedFfn paper() {
  TunedFfn ffn;
  ffn.arch = "sm_90a";
  ffn.spec = file().spec;
  ffn.tileN = 256;
  ffn.slots = 31;
  return ffn;
}

TunedChoice choose(const TunedFfn& ffn, int64_t tokens, const std::string& workload = "") {
  return compiler::tunedChoice(file(), "db.json", "", ffn, tokens, workload);
}

}  // namespace

TEST(TunedChoice, TheBucketHoldingTokensAndTheDecodeVoteOfTheSmallBuckets) {
  TunedChoice c = choose(paper(), 0);  // the largest bucket
  ASSERT_TRUE(c.config.has_value()) << c.source;
  EXPECT_EQ(c.config->cluster_m, 2);
  EXPECT_EQ(c.decode, true);  // bucket 1 chose the decode kernels
  EXPECT_EQ(c.source,
            "tuning-file db.json workload density:0.5% bucket 16384: tile_n 256 slots 31 cluster_m 2 consumer "
            "row_gather decode on");
  c = choose(paper(), 200);
  EXPECT_EQ(c.config->consumer, ConsumerVariant::TokenBlock);
  EXPECT_EQ(c.config->cluster_m, 1);
  c = choose(paper(), 16, "decode-off");  // the dense win of bucket 64 has no TwELL runner-up: no vote
  EXPECT_EQ(c.decode, false);
  EXPECT_EQ(c.source,
            "tuning-file db.json workload decode-off bucket 16: tile_n 256 slots 31 cluster_m 2 consumer row_gather "
            "decode off");
  TunedFfn t128 = paper();
  t128.tileN = 128;
  t128.slots = 15;
  c = choose(t128, 0, "untuned-small");  // the untuned plan, which has the decode kernels, won bucket 16
  EXPECT_EQ(c.decode, true);
}

TEST(TunedChoice, OtherwiseTheHeuristicAndWhy) {
  EXPECT_EQ(compiler::tunedChoice(std::nullopt, "db.json", "absent", paper(), 0, "").source,
            "heuristic (tuning-file db.json: absent)");
  TunedFfn ffn = paper();
  ffn.arch = "sm_80";
  EXPECT_EQ(choose(ffn, 0).source, "heuristic (tuning-file db.json: tuned on sm_90a, the kernels' target is sm_80)");
  ffn = paper();
  ffn.spec.down_layout = WeightLayout::InOut;
  EXPECT_EQ(choose(ffn, 0).source,
            "heuristic (tuning-file db.json: tuned for d_model 2048 d_ff 5632 gated relu threshold 0 bf16 out_in, this "
            "FFN is "
            "d_model 2048 d_ff 5632 gated relu threshold 0 bf16 in_out)");
  EXPECT_EQ(choose(paper(), 0, "nope").source,
            "heuristic (tuning-file db.json: no workload 'nope' (it holds: density:0.5%, decode-off, untuned-small))");
  EXPECT_EQ(choose(paper(), 0, "untuned-small").source,
            "heuristic (tuning-file db.json: workload untuned-small bucket 4096: tuned layout tile_n 128 slots 15, "
            "this FFN's "
            "tensor type has tile_n 256 slots 31 (the layout is the type's: write the tuned one there))");
  EXPECT_EQ(choose(paper(), 16, "untuned-small").source,
            "heuristic (tuning-file db.json: workload untuned-small bucket 16: the untuned configuration was fastest)");
  EXPECT_FALSE(choose(paper(), 16, "untuned-small").config.has_value());
  EXPECT_FALSE(choose(paper(), 16, "untuned-small").decode.has_value());
  EXPECT_EQ(choose(paper(), 64, "decode-off").source,
            "heuristic (tuning-file db.json: workload decode-off bucket 64: the dense path was fastest, with no TwELL "
            "runner-up)");
}
