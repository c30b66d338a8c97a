// Tuned choices embedded in bundles (twellc compile --tuning-dir): the manifest's "tuning" round trip,
// which entry a plan takes (the machine's database before a bundle's), without a GPU or kernels.
#include <unistd.h>

#include <filesystem>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "bundle.h"
#include "tuned_layout.h"
#include "twell/error.h"

namespace fs = std::filesystem;
using namespace twell;
using detail::TuningCandidate;

namespace {

fs::path fresh_dir(const std::string& name) {
  const fs::path d = fs::temp_directory_path() / fmt::format("twell-bundle-tuning-{}-{}", name, ::getpid());
  fs::remove_all(d);
  return d;
}

FfnSpec paper() {
  FfnSpec s;
  s.d_model = 2048;
  s.d_ff = 5632;
  return s;
}

TunedBucket bucket(int64_t tokens, int tile_n, int slots, ConsumerVariant consumer) {
  TunedBucket b;
  b.tokens = tokens;
  b.winner = TunedConfig{TunedConfig::Path::TwELL, tile_n, slots, 1, consumer, 0, 1.0};
  return b;
}

TuningFile entry(const std::string& arch, const FfnSpec& spec) {
  TuningFile f;
  f.hardware = TuningHardware{arch, 132, 13000, "0.1.0", "NVIDIA H200"};
  f.spec = spec;
  f.workloads.push_back(TuningWorkload{
      "density:0.5%",
      "2026-12-01T18:00:00Z",
      200,
      {bucket(16, 256, 31, ConsumerVariant::RowGather), bucket(131072, 128, 15, ConsumerVariant::TokenBlock)}});
  f.workloads.push_back(
      TuningWorkload{"density:5%", "2026-11-01T18:00:00Z", 100, {bucket(131072, 64, 7, ConsumerVariant::RowGather)}});
  return f;
}

std::shared_ptr<const detail::Bundle> bundle_with(const std::string& name, const std::vector<TuningFile>& tuning) {
  const fs::path dir = fresh_dir(name);
  detail::write_bundle(dir, Target{90, true}, {}, {}, tuning);
  return detail::Bundle::load(dir);
}

}  // namespace

TEST(BundleTuning, ManifestRoundTrip) {
  FfnSpec other = paper();
  other.d_model = 512;
  other.d_ff = 1408;
  const auto b = bundle_with("roundtrip", {entry("sm_90a", paper()), entry("sm_90a", other)});
  ASSERT_EQ(b->tuning().size(), 2u);
  EXPECT_EQ(tuning_file_json(b->tuning()[0]), tuning_file_json(entry("sm_90a", paper())));
  EXPECT_EQ(tuning_file_json(b->tuning()[1]), tuning_file_json(entry("sm_90a", other)));
  // A bundle written without tuned choices has none.
  EXPECT_TRUE(bundle_with("none", {})->tuning().empty());
}

TEST(BundleTuning, AnEntryOfAnotherArchIsRefusedBeforeAnythingIsWritten) {
  const fs::path dir = fresh_dir("arch");
  try {
    detail::write_bundle(dir, Target{90, true}, {}, {}, {entry("sm_80", paper())});
    FAIL() << "expected Error(InvalidArgument)";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::InvalidArgument);
    EXPECT_NE(std::string(e.what()).find("hardware.arch: expected the bundle's target sm_90a, got sm_80"),
              std::string::npos)
        << e.what();
  }
  EXPECT_FALSE(fs::exists(dir));
}

TEST(BundleTuning, EmbeddedEntryForTheSpecArchAndWorkload) {
  FfnSpec other = paper();
  other.down_layout = WeightLayout::InOut;
  const std::vector<std::shared_ptr<const detail::Bundle>> bundles{bundle_with("first", {entry("sm_90a", other)}),
                                                                   bundle_with("second", {entry("sm_90a", paper())})};
  const auto found = detail::embedded_tuning(bundles, paper(), "sm_90a", "");
  ASSERT_TRUE(found.has_value());
  EXPECT_EQ(found->origin, "bundle " + bundles[1]->dir().string());
  EXPECT_EQ(found->workload, "density:0.5%");  // the most recent
  EXPECT_EQ(detail::embedded_tuning(bundles, paper(), "sm_90a", "density:5%")->buckets.at(0).winner.tile_n, 64);
  EXPECT_FALSE(detail::embedded_tuning(bundles, paper(), "sm_90a", "pattern:0").has_value());
  EXPECT_FALSE(detail::embedded_tuning(bundles, paper(), "sm_80", "").has_value());
  FfnSpec tuned_fields_set = paper();
  tuned_fields_set.tile_n = 128;  // the key ignores layout fields; tuned_layout answers "option" for them
  EXPECT_TRUE(detail::embedded_tuning(bundles, tuned_fields_set, "sm_90a", "").has_value());
}

TEST(BundleTuning, TheMachinesDatabaseBeforeTheBundle) {
  const TuningCandidate database{
      "database /db/file.json", "density:1%", {bucket(131072, 512, 63, ConsumerVariant::RowGather)}};
  const TuningCandidate embedded{
      "bundle /b",
      "density:0.5%",
      {bucket(16, 256, 31, ConsumerVariant::RowGather), bucket(131072, 128, 15, ConsumerVariant::TokenBlock)}};
  detail::TunedLayout t = detail::tuned_layout(paper(), 131072, Dispatch::Auto, database, embedded);
  EXPECT_TRUE(t.tuned);
  EXPECT_EQ(t.spec.tile_n, 512);
  EXPECT_EQ(t.source, "database /db/file.json workload density:1% bucket 131072: tile_n 512 slots 63 cluster_m 1");
  // No database entry (or one without buckets): the bundle's; the bucket holding max_tokens.
  for (const std::optional<TuningCandidate>& none :
       {std::optional<TuningCandidate>(), std::optional<TuningCandidate>(TuningCandidate{"database x", "w", {}})}) {
    t = detail::tuned_layout(paper(), 131072, Dispatch::Auto, none, embedded);
    EXPECT_EQ(t.source, "bundle /b workload density:0.5% bucket 131072: tile_n 128 slots 15 cluster_m 1");
    EXPECT_EQ(t.spec.slots, 15);
    EXPECT_FALSE(t.spec.consumer.has_value());  // Dispatch::Auto times both consumers itself
  }
  t = detail::tuned_layout(paper(), 8, Dispatch::Sparse, std::nullopt, embedded);
  EXPECT_EQ(t.source, "bundle /b workload density:0.5% bucket 16: tile_n 256 slots 31 cluster_m 1 consumer row_gather");
  EXPECT_EQ(t.spec.consumer, ConsumerVariant::RowGather);
  // Neither: the heuristic. A spec that sets its layout: the option, whatever the entries.
  t = detail::tuned_layout(paper(), 8, Dispatch::Auto, std::nullopt, std::nullopt);
  EXPECT_FALSE(t.tuned);
  EXPECT_EQ(t.source, "heuristic");
  FfnSpec set = paper();
  set.slots = 15;
  t = detail::tuned_layout(set, 8, Dispatch::Auto, database, embedded);
  EXPECT_FALSE(t.tuned);
  EXPECT_EQ(t.source, "option");
  // Where the untuned plan won, it stays; an entry this version cannot build is not taken.
  TuningCandidate untuned = embedded;
  untuned.buckets[1].winner.path = TunedConfig::Path::Heuristic;
  t = detail::tuned_layout(paper(), 131072, Dispatch::Auto, std::nullopt, untuned);
  EXPECT_FALSE(t.tuned);
  EXPECT_EQ(t.source, "heuristic (bundle /b workload density:0.5% bucket 131072: the untuned plan was fastest)");
  untuned.buckets[1].winner.path = TunedConfig::Path::Dense;  // and no runner-up
  EXPECT_EQ(
      detail::tuned_layout(paper(), 131072, Dispatch::Auto, std::nullopt, untuned).source,
      "heuristic (bundle /b workload density:0.5% bucket 131072: the dense path was fastest, with no TwELL runner-up)");
  TuningCandidate illegal = embedded;
  illegal.buckets[1].winner.tile_n = 48;
  t = detail::tuned_layout(paper(), 131072, Dispatch::Auto, std::nullopt, illegal);
  EXPECT_FALSE(t.tuned);
  EXPECT_NE(t.source.find("heuristic (bundle /b workload density:0.5% bucket 131072: not a legal layout here: "),
            std::string::npos)
      << t.source;
}
