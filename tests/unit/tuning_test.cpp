// The tuning database (twell/tuning.h) without a GPU: round trip, merging workloads, concurrent writers
// (processes), damaged / renamed / foreign-schema files read as absent, and the tuner's refusals.
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "twell/context.h"
#include "twell/error.h"
#include "twell/tuning.h"

namespace fs = std::filesystem;
using namespace twell;

namespace {

fs::path fresh_dir(const std::string& name) {
  const fs::path d = fs::temp_directory_path() / fmt::format("twell-tuning-{}-{}", name, ::getpid());
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

TuningHardware hardware() { return TuningHardware{"sm_90a", 132, 13000, "test", "NVIDIA H200"}; }

FfnSpec paper() {
  FfnSpec s;
  s.d_model = 2048;
  s.d_ff = 5632;
  return s;
}

std::vector<TunedBucket> buckets(int tile_n) {
  TunedBucket small;
  small.tokens = 1;
  small.winner = TunedConfig{TunedConfig::Path::TwELL, tile_n, 15, 1, ConsumerVariant::RowGather, 64, 0.021};
  small.heuristic_ms = 0.024;
  small.dense_ms = 0.03;
  small.candidates = 9;
  TunedBucket big;
  big.tokens = 131072;
  big.winner = TunedConfig{TunedConfig::Path::TwELL, tile_n, 31, 2, ConsumerVariant::TokenBlock, 0, 7.8};
  big.runner_up = TunedConfig{TunedConfig::Path::Heuristic, 0, 0, 1, ConsumerVariant::RowGather, 0, 8.0};
  big.heuristic_ms = 8.0;
  big.dense_ms = 11.5;
  big.candidates = 24;
  big.rejected = 1;
  return {big, small};  // stored unsorted: lookup sorts
}

}  // namespace

TEST(TuningDatabase, StoresAndLooksUpByHardwareSpecAndWorkload) {
  const TuningDatabase db(fresh_dir("roundtrip"));
  const fs::path file = db.store(hardware(), paper(), density_workload(0.005), buckets(256));
  EXPECT_TRUE(fs::exists(file));
  EXPECT_EQ(density_workload(0.005), "density:0.5%");
  EXPECT_EQ(density_workload(1e-5), "density:0.001%");
  EXPECT_NE(density_workload(1e-5), density_workload(4e-5));
  const auto e = db.lookup(hardware(), paper(), "density:0.5%");
  ASSERT_TRUE(e.has_value());
  ASSERT_EQ(e->buckets.size(), 2u);
  EXPECT_EQ(e->buckets[0].tokens, 1);
  EXPECT_EQ(e->buckets[1].tokens, 131072);
  EXPECT_EQ(e->buckets[1].winner.consumer, ConsumerVariant::TokenBlock);
  EXPECT_EQ(e->buckets[1].winner.cluster_m, 2);
  EXPECT_DOUBLE_EQ(e->buckets[1].winner.ms, 7.8);
  ASSERT_TRUE(e->buckets[1].runner_up.has_value());
  EXPECT_EQ(e->buckets[1].runner_up->path, TunedConfig::Path::Heuristic);
  EXPECT_FALSE(e->buckets[0].runner_up.has_value());
  EXPECT_EQ(e->buckets[0].winner.decode_max_tokens, 64);
  // Another SM count, driver, twell version, shape, threshold or dtype: another key.
  TuningHardware other = hardware();
  other.sm_count = 114;
  EXPECT_FALSE(db.lookup(other, paper()).has_value());
  other = hardware();
  other.driver_version = 12080;
  EXPECT_FALSE(db.lookup(other, paper()).has_value());
  FfnSpec s = paper();
  s.threshold = 0.25f;
  EXPECT_FALSE(db.lookup(hardware(), s).has_value());
  s = paper();
  s.dtype = DType::FP16;
  EXPECT_FALSE(db.lookup(hardware(), s).has_value());
  // -0.0 is the threshold 0.0 (one kernel set, one entry); the layout fields a tune chooses do not key it.
  s = paper();
  s.threshold = -0.0f;
  s.tile_n = 128;
  EXPECT_TRUE(db.lookup(hardware(), s).has_value());
  EXPECT_FALSE(db.lookup(hardware(), paper(), "density:1%").has_value());
}

TEST(TuningDatabase, MergesWorkloadsAndTheNewestIsTheDefault) {
  const TuningDatabase db(fresh_dir("merge"));
  db.store(hardware(), paper(), "density:0.50%", buckets(256));
  sleep(1);  // unix_time has a resolution of seconds
  db.store(hardware(), paper(), "pattern:00000000deadbeef", buckets(128));
  const auto newest = db.lookup(hardware(), paper());
  ASSERT_TRUE(newest.has_value());
  EXPECT_EQ(newest->workload, "pattern:00000000deadbeef");
  EXPECT_EQ(newest->buckets[0].winner.tile_n, 128);
  const auto first = db.lookup(hardware(), paper(), "density:0.50%");
  ASSERT_TRUE(first.has_value());
  EXPECT_EQ(first->buckets[0].winner.tile_n, 256);
  // Re-tuning a workload replaces it.
  db.store(hardware(), paper(), "density:0.50%", buckets(64));
  EXPECT_EQ(db.lookup(hardware(), paper(), "density:0.50%")->buckets[0].winner.tile_n, 64);
}

TEST(TuningDatabase, ConcurrentWritersOfOneFileAllSurvive) {
  const fs::path dir = fresh_dir("concurrent");
  constexpr int kWriters = 8;
  std::vector<pid_t> children;
  for (int i = 0; i < kWriters; ++i) {
    const pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      int rc = 0;
      try {
        const TuningDatabase db(dir);
        for (int round = 0; round < 5; ++round) db.store(hardware(), paper(), fmt::format("density:{}.00%", i + 1), buckets(64 << (i % 3)));
      } catch (...) {
        rc = 1;
      }
      _exit(rc);
    }
    children.push_back(pid);
  }
  for (pid_t pid : children) {
    int status = 0;
    ASSERT_EQ(waitpid(pid, &status, 0), pid);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  }
  const TuningDatabase db(dir);
  for (int i = 0; i < kWriters; ++i) {
    const auto e = db.lookup(hardware(), paper(), fmt::format("density:{}.00%", i + 1));
    ASSERT_TRUE(e.has_value()) << "writer " << i << "'s workload was lost";
    EXPECT_EQ(e->buckets[0].winner.tile_n, 64 << (i % 3));
  }
  for (const auto& f : fs::directory_iterator(dir)) EXPECT_NE(f.path().extension(), ".tmp") << f.path();
}

TEST(TuningDatabase, DamagedRenamedAndForeignFilesReadAsAbsent) {
  const fs::path dir = fresh_dir("damaged");
  const TuningDatabase db(dir);
  const fs::path file = db.store(hardware(), paper(), "density:0.50%", buckets(256));
  const std::string good = [&] {
    std::ifstream in(file);
    return std::string(std::istreambuf_iterator<char>(in), {});
  }();
  auto write = [&](const std::string& text) { std::ofstream(file, std::ios::trunc) << text; };
  write(good.substr(0, good.size() / 2));  // truncated
  EXPECT_FALSE(db.lookup(hardware(), paper()).has_value());
  write(std::string(100000, '['));  // nested far too deep: refused, not a stack overflow
  EXPECT_FALSE(db.lookup(hardware(), paper()).has_value());
  nlohmann::json j = nlohmann::json::parse(good);
  j["schema"] = 99;
  write(j.dump());
  EXPECT_FALSE(db.lookup(hardware(), paper()).has_value());
  j = nlohmann::json::parse(good);
  j["hardware"]["sm_count"] = 114;  // a file that does not hold what its name says
  write(j.dump());
  EXPECT_FALSE(db.lookup(hardware(), paper()).has_value());
  j = nlohmann::json::parse(good);
  j["workloads"]["density:0.50%"]["buckets"][0]["tokens"] = 3;  // not a power of two
  write(j.dump());
  EXPECT_FALSE(db.lookup(hardware(), paper()).has_value());
  j = nlohmann::json::parse(good);
  j["workloads"] = "not an object";  // well-formed JSON, wrong structure: store must not throw a json error
  write(j.dump());
  EXPECT_FALSE(db.lookup(hardware(), paper()).has_value());
  db.store(hardware(), paper(), "density:0.50%", buckets(64));
  EXPECT_EQ(db.lookup(hardware(), paper())->buckets[0].winner.tile_n, 64);
  // A FIFO at the file's path reads as absent at once (no blocking open).
  fs::remove(file);
  ASSERT_EQ(::mkfifo(file.c_str(), 0644), 0);
  EXPECT_FALSE(db.lookup(hardware(), paper()).has_value());
  fs::remove(file);
  // store replaces a file it cannot read.
  write("garbage");
  db.store(hardware(), paper(), "density:0.50%", buckets(128));
  ASSERT_TRUE(db.lookup(hardware(), paper()).has_value());
  EXPECT_EQ(db.lookup(hardware(), paper())->buckets[0].winner.tile_n, 128);
}

TEST(TuningDatabase, StoreIntoAnUnwritableDirectoryIsAnIoError) {
  const fs::path dir = fresh_dir("blocked");
  std::ofstream(dir / "file") << "x";
  const TuningDatabase db(dir / "file" / "sub");  // a directory below a regular file cannot exist
  try {
    db.store(hardware(), paper(), "density:0.50%", buckets(256));
    FAIL() << "expected Error(Io)";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::Io);
    EXPECT_NE(std::string(e.what()).find("file"), std::string::npos) << e.what();
  }
}

// The names files were given since the first database (the H200 runs of bench/README.md v32): a
// database on disk stays found whatever the code that writes its files.
TEST(TuningDatabase, FileNamesStayWhatTheyWere) {
  const TuningDatabase db("/d");
  const TuningHardware hw{"sm_90a", 132, 13000, "0.1.0", "any device name"};
  EXPECT_EQ(db.file_for(hw, paper()), fs::path("/d/sm_90a-132sm-3f413ab41404abe9.json"));
  FfnSpec s = paper();
  s.threshold = 0.25f;
  s.activation = Activation::SiLU;
  s.down_layout = WeightLayout::InOut;
  s.gated = false;
  s.dtype = DType::FP16;
  s.tile_n = 64;  // layout fields are not part of the key
  EXPECT_EQ(db.file_for(hw, s), fs::path("/d/sm_90a-132sm-d5924e319af4c4ae.json"));
}

TEST(TuningDatabase, DefaultDirFollowsTheEnvironment) {
  ::setenv("TWELL_TUNING_DIR", "/tmp/twell-tuning-env", 1);
  EXPECT_EQ(TuningDatabase::default_dir(), fs::path("/tmp/twell-tuning-env"));
  ::unsetenv("TWELL_TUNING_DIR");
  ::setenv("TWELL_CACHE_DIR", "/tmp/twell-cache-env", 1);
  EXPECT_EQ(TuningDatabase::default_dir(), fs::path("/tmp/twell-cache-env/tuning"));
  ::unsetenv("TWELL_CACHE_DIR");
}

TEST(Tune, NeedsAGpuAndNamesBadFields) {
  ContextOptions o;
  o.device = ContextOptions::kNoDevice;
  Context ctx(o);
  TuneRequest r;
  r.spec = paper();
  try {
    ctx.tune(r);
    FAIL() << "expected Error(NoDevice)";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::NoDevice) << e.what();
  }
  // Plans without a GPU never consult the database; a spec that sets the layout says "option".
  FfnSpec s = paper();
  s.d_model = 512;
  s.d_ff = 1408;
  EXPECT_EQ(ctx.plan(s, 64).config_source(), "heuristic");
  s.tile_n = 128;
  EXPECT_EQ(ctx.plan(s, 64).config_source(), "option");
}
