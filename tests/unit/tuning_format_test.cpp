// The tuning database's file format (twell/tuning_format.h), shared by the runtime and the compiler:
// round trip, errors that name the field, bounded reads, and the choices plans and passes take.
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "twell/tuning_format.h"

namespace fs = std::filesystem;
using namespace twell;

namespace {

TunedConfig twell_config(int tile_n, int slots, int cluster_m, ConsumerVariant consumer, int64_t decode, double ms) {
  return TunedConfig{TunedConfig::Path::TwELL, tile_n, slots, cluster_m, consumer, decode, ms};
}

TuningFile sample_file() {
  TuningFile f;
  f.hardware = TuningHardware{"sm_90a", 132, 13000, "0.1.0", "NVIDIA H200"};
  f.spec.d_model = 2048;
  f.spec.d_ff = 5632;
  f.spec.threshold = 0.25f;
  f.spec.activation = Activation::SiLU;
  TunedBucket small{16, twell_config(256, 31, 1, ConsumerVariant::RowGather, 64, 0.04), std::nullopt, 0.05, 0.06, 20,
                    0};
  TunedBucket big{131072,
                  TunedConfig{TunedConfig::Path::Dense, 0, 0, 1, ConsumerVariant::RowGather, 0, 7.5},
                  twell_config(128, 15, 2, ConsumerVariant::TokenBlock, 0, 7.8),
                  8.0,
                  7.5,
                  24,
                  1};
  f.workloads.push_back(TuningWorkload{"density:0.5%", "2026-12-01T18:00:00Z", 1796150400, {small, big}});
  f.workloads.push_back(TuningWorkload{
      "pattern:00000000000000aa",
      "2026-11-01T18:00:00Z",
      1793558400,
      {TunedBucket{256, TunedConfig{TunedConfig::Path::Heuristic, 0, 0, 1, ConsumerVariant::RowGather, 0, 1.0},
                   std::nullopt, 1.0, 1.5, 9, 0}}});
  return f;
}

void expect_same(const TunedConfig& a, const TunedConfig& b) {
  EXPECT_EQ(a.path, b.path);
  EXPECT_EQ(a.tile_n, b.tile_n);
  EXPECT_EQ(a.slots, b.slots);
  EXPECT_EQ(a.cluster_m, b.cluster_m);
  EXPECT_EQ(a.consumer, b.consumer);
  EXPECT_EQ(a.decode_max_tokens, b.decode_max_tokens);
  EXPECT_EQ(a.ms, b.ms);
  EXPECT_EQ(a.dense_neurons, b.dense_neurons);
}

// parse_tuning_file's message for `text`, "" when it parses.
std::string refusal(const std::string& text) {
  try {
    parse_tuning_file(text);
    return "";
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
}

}  // namespace

TEST(TuningFormat, RoundTripsEveryField) {
  const TuningFile f = sample_file();
  const TuningFile back = parse_tuning_file(tuning_file_json(f));
  EXPECT_EQ(back.hardware.arch, "sm_90a");
  EXPECT_EQ(back.hardware.sm_count, 132);
  EXPECT_EQ(back.hardware.driver_version, 13000);
  EXPECT_EQ(back.hardware.twell_version, "0.1.0");
  EXPECT_EQ(back.hardware.device_name, "NVIDIA H200");
  EXPECT_TRUE(same_tuning_key(back.spec, f.spec));
  EXPECT_EQ(back.spec.threshold, 0.25f);
  ASSERT_EQ(back.workloads.size(), 2u);
  for (size_t w = 0; w < 2; ++w) {
    EXPECT_EQ(back.workloads[w].name, f.workloads[w].name);
    EXPECT_EQ(back.workloads[w].tuned_at, f.workloads[w].tuned_at);
    EXPECT_EQ(back.workloads[w].unix_time, f.workloads[w].unix_time);
    ASSERT_EQ(back.workloads[w].buckets.size(), f.workloads[w].buckets.size());
    for (size_t i = 0; i < f.workloads[w].buckets.size(); ++i) {
      const TunedBucket &a = back.workloads[w].buckets[i], &b = f.workloads[w].buckets[i];
      EXPECT_EQ(a.tokens, b.tokens);
      expect_same(a.winner, b.winner);
      ASSERT_EQ(a.runner_up.has_value(), b.runner_up.has_value());
      if (a.runner_up) expect_same(*a.runner_up, *b.runner_up);
      EXPECT_EQ(a.heuristic_ms, b.heuristic_ms);
      EXPECT_EQ(a.dense_ms, b.dense_ms);
      EXPECT_EQ(a.candidates, b.candidates);
      EXPECT_EQ(a.rejected, b.rejected);
    }
  }
  EXPECT_EQ(tuning_file_json(back), tuning_file_json(f));
}

TEST(TuningFormat, KeysIgnoreTheLayoutAndNegativeZero) {
  FfnSpec a = sample_file().spec, b = a;
  b.tile_n = 64;
  b.slots = 7;
  b.gate_cluster_m = 2;
  b.consumer = ConsumerVariant::TokenBlock;
  EXPECT_TRUE(same_tuning_key(a, b));
  a.threshold = 0.0f;
  b.threshold = -0.0f;
  EXPECT_TRUE(same_tuning_key(a, b));
  b.down_layout = WeightLayout::InOut;
  EXPECT_FALSE(same_tuning_key(a, b));
  EXPECT_EQ(tuning_key_text(b), "d_model 2048 d_ff 5632 gated silu threshold 0 bf16 in_out");
  EXPECT_FALSE(tuning_key(b).tile_n.has_value());
}

TEST(TuningFormat, RefusalsNameTheFieldTheExpectedAndTheFound) {
  const std::string good = tuning_file_json(sample_file());
  auto edited = [&](const std::string& from, const std::string& to) {
    std::string t = good;
    const size_t at = t.find(from);
    EXPECT_NE(at, std::string::npos) << from;
    return t.replace(at, from.size(), to);
  };
  EXPECT_EQ(refusal(good), "");
  EXPECT_NE(refusal(good.substr(0, good.size() / 2)).find("not valid JSON"), std::string::npos);
  EXPECT_NE(refusal(std::string(100000, '[')).find("nested deeper than 16 levels"), std::string::npos);
  EXPECT_EQ(refusal(edited("\"schema\": 1", "\"schema\": 2")), "schema: expected 1, found 2");
  EXPECT_EQ(
      refusal(edited("\"consumer\": \"token_block\"", "\"consumer\": \"tiles\"")),
      "workloads.density:0.5%.buckets[1].runner_up.consumer: expected row_gather or token_block, found \"tiles\"");
  EXPECT_EQ(refusal(edited("\"tokens\": 16,", "\"tokens\": 3,")),
            "workloads.density:0.5%.buckets[0].tokens: expected a power of two, found 3");
  EXPECT_EQ(refusal(edited("\"sm_count\": 132", "\"sm_count\": \"132\"")),
            "hardware.sm_count: expected an integer in -2147483648..2147483647, found \"132\"");
  EXPECT_EQ(refusal(edited("\"path\": \"dense\"", "\"path\": \"cublas\"")),
            "workloads.density:0.5%.buckets[1].winner.path: expected twell or dense or heuristic, found \"cublas\"");
  EXPECT_EQ(refusal(edited("\"activation\": \"silu\"", "\"activation\": 1")),
            "spec.activation: expected a string, found 1");
  EXPECT_EQ(refusal(edited("\"workloads\": {", "\"workloads\": [], \"x\": {")),
            "workloads: expected an object, found []");
}

TEST(TuningFormat, ReadsRegularFilesOnlyAndSaysWhy) {
  const fs::path dir = fs::temp_directory_path() / fmt::format("twell-tuning-format-{}", ::getpid());
  fs::remove_all(dir);
  fs::create_directories(dir);
  std::string why;
  EXPECT_FALSE(read_tuning_file(dir / "none.json", &why).has_value());
  EXPECT_EQ(why, "absent");
  std::ofstream(dir / "good.json") << tuning_file_json(sample_file());
  ASSERT_TRUE(read_tuning_file(dir / "good.json", &why).has_value()) << why;
  std::ofstream(dir / "bad.json") << "{\"schema\": 1}";
  EXPECT_FALSE(read_tuning_file(dir / "bad.json", &why).has_value());
  EXPECT_EQ(why, "file: expected a field \"hardware\", found none");
  ASSERT_EQ(::mkfifo((dir / "fifo.json").c_str(), 0644), 0);  // refused at once, not waited on
  EXPECT_FALSE(read_tuning_file(dir / "fifo.json", &why).has_value());
  EXPECT_EQ(why, "not a regular file");
  fs::create_symlink(dir / "good.json", dir / "link.json");  // a link is not followed
  EXPECT_FALSE(read_tuning_file(dir / "link.json", &why).has_value());
  fs::remove_all(dir);
}

TEST(TuningFormat, WorkloadBucketAndChoice) {
  const TuningFile f = sample_file();
  EXPECT_EQ(find_workload(f, "")->name, "density:0.5%");  // the most recent
  EXPECT_EQ(find_workload(f, "pattern:00000000000000aa")->name, "pattern:00000000000000aa");
  EXPECT_EQ(find_workload(f, "density:5%"), nullptr);
  const auto& buckets = f.workloads[0].buckets;
  EXPECT_EQ(bucket_for(buckets, 1)->tokens, 16);
  EXPECT_EQ(bucket_for(buckets, 17)->tokens, 131072);
  EXPECT_EQ(bucket_for(buckets, int64_t{1} << 40)->tokens, 131072);  // beyond every bucket: the largest
  EXPECT_EQ(bucket_for({}, 1), nullptr);
  // Where the dense path won, the TwELL runner-up; where the untuned plan won, none.
  EXPECT_EQ(twell_choice(buckets[0])->tile_n, 256);
  EXPECT_EQ(twell_choice(buckets[1])->tile_n, 128);
  EXPECT_EQ(twell_choice(f.workloads[1].buckets[0]), nullptr);
  const FfnSpec s = with_tuned_layout(f.spec, *twell_choice(buckets[1]));
  EXPECT_EQ(s.tile_n, 128);
  EXPECT_EQ(s.slots, 15);
  EXPECT_EQ(s.gate_cluster_m, 2);
  EXPECT_FALSE(s.consumer.has_value());
}

// A tuned hot/cold split (a real layer's, with its weights ordered hot-first) round-trips, files
// without the field read as no split, and plans never take a split configuration: the runner-up
// without one where it ranks above the untuned plan, else none.
TEST(TuningFormat, SplitPointIsStoredButNeverApplied) {
  TuningFile f = sample_file();
  TunedBucket& b = f.workloads[0].buckets[0];
  b.winner.dense_neurons = 4864;
  b.runner_up = twell_config(128, 7, 1, ConsumerVariant::RowGather, 0, 0.045);
  const TuningFile back = parse_tuning_file(tuning_file_json(f));
  EXPECT_EQ(back.workloads[0].buckets[0].winner.dense_neurons, 4864);
  EXPECT_EQ(back.workloads[0].buckets[0].runner_up->dense_neurons, 0);
  EXPECT_EQ(twell_choice(b)->tile_n, 128);  // the runner-up, no split
  b.runner_up = TunedConfig{TunedConfig::Path::Heuristic, 0, 0, 1, ConsumerVariant::RowGather, 0, 0.05};
  EXPECT_EQ(twell_choice(b), nullptr);  // the untuned plan ranks next: it keeps its layout
  b.runner_up.reset();
  EXPECT_EQ(twell_choice(b), nullptr);
  // Older files (no field) read as 0; a negative or unaligned split is refused, naming the field.
  std::string text = tuning_file_json(sample_file(), -1);  // compact: keys sorted, no spaces
  const std::string field = "\"dense_neurons\":0,";
  ASSERT_NE(text.find(field), std::string::npos) << text;
  for (size_t at; (at = text.find(field)) != std::string::npos;) text.erase(at, field.size());
  EXPECT_EQ(text.find("dense_neurons"), std::string::npos) << text;
  EXPECT_EQ(parse_tuning_file(text).workloads[0].buckets[0].winner.dense_neurons, 0);
  TuningFile bad = sample_file();
  bad.workloads[0].buckets[0].winner.dense_neurons = 100;
  EXPECT_NE(refusal(tuning_file_json(bad)).find("dense_neurons: expected a multiple of 64, at least 0, found 100"),
            std::string::npos)
      << refusal(tuning_file_json(bad));
}

// Values no tune writes are refused while reading, naming the field, so that no reader takes them: a
// cluster other than 1 or 2 (twell-select-config put cluster_m 7 in the IR and failed verification;
// cluster_m 0 was reported as tuned while the heuristic's cluster applied), a decode cut-off outside
// PlanOptions::decode_max_tokens's 0..64 (-5 read as "decode off"), a bucket given twice (which one a
// reader took depended on the sort).
TEST(TuningFormat, ValuesNoTuneWritesAreRefused) {
  auto with = [](auto edit) {
    TuningFile f = sample_file();
    edit(f);
    return refusal(tuning_file_json(f));
  };
  for (int cluster : {0, -1, 3, 7})
    EXPECT_EQ(with([&](TuningFile& f) { f.workloads[0].buckets[0].winner.cluster_m = cluster; }),
              fmt::format("workloads.density:0.5%.buckets[0].winner.cluster_m: expected 1 or 2, found {}", cluster));
  for (int64_t decode : {int64_t{-5}, int64_t{65}, int64_t{1} << 40})
    EXPECT_EQ(with([&](TuningFile& f) { f.workloads[0].buckets[1].runner_up->decode_max_tokens = decode; }),
              fmt::format("workloads.density:0.5%.buckets[1].runner_up.decode_max_tokens: expected 0..64 (0: the "
                          "decode kernels off), found {}",
                          decode));
  EXPECT_EQ(with([](TuningFile& f) {
              f.workloads[0].buckets.push_back(f.workloads[0].buckets[0]);
              f.workloads[0].buckets.back().winner.consumer = ConsumerVariant::TokenBlock;
            }),
            "workloads.density:0.5%.buckets[2].tokens: expected each bucket once, found 16 twice");
  // What a tune writes still reads: clusters 1 and 2, decode 0 and 64.
  EXPECT_EQ(with([](TuningFile& f) { f.workloads[0].buckets[0].winner.cluster_m = 2; }), "");
}

// A symbolic link (not followed) is named as such, not as "Too many levels of symbolic links".
TEST(TuningFormat, SymbolicLinkIsNamed) {
  const fs::path dir = fs::temp_directory_path() / fmt::format("twell-tuning-format-link-{}", ::getpid());
  fs::remove_all(dir);
  fs::create_directories(dir);
  std::ofstream(dir / "good.json") << tuning_file_json(sample_file());
  fs::create_symlink(dir / "good.json", dir / "link.json");
  fs::create_symlink(dir / "none.json", dir / "dangling.json");
  std::string why;
  EXPECT_FALSE(read_tuning_file(dir / "link.json", &why).has_value());
  EXPECT_EQ(why, "a symbolic link, which is not followed (name the file it points to)");
  EXPECT_FALSE(read_tuning_file(dir / "dangling.json", &why).has_value());
  EXPECT_EQ(why, "a symbolic link, which is not followed (name the file it points to)");
  fs::remove_all(dir);
}
