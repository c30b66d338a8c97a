// The kernel cache's warm starts, without a GPU (issue 16: disk warm start under 1 ms per kernel,
// in-process hit under 10 us per kernel).
//   DiskWarmStart/K: what a new process pays for the K kernels of a plan already on disk: a fresh
//     KernelCache on the populated directory (limits from the environment, writability probe, stale
//     temporaries sweep), then get_or_compile of every key (read, validate, touch the mtime, keep in
//     memory). Entries of 60-200 KB (PTX + cubin), the size of the generated kernels'.
//   MemoryHit/K: get_or_compile of K keys already in this cache's memory.
// Counter per_kernel: wall-clock seconds per kernel. The files are in the page cache (a warm start, not a cold disk).
//   ./build/bin/cache_bench --benchmark_repetitions=5 --benchmark_report_aggregates_only=true
#include <benchmark/benchmark.h>
#include <stdlib.h>

#include <filesystem>
#include <stdexcept>
#include <string>
#include <vector>

#include "cache.h"

namespace {

using twell::detail::CacheEntry;
using twell::detail::KernelCache;
namespace fs = std::filesystem;

// Entry `i` of a plan: 60 KB .. 200 KB, about 45% PTX and 55% cubin, as the generated kernels.
CacheEntry entry(int i) {
  const size_t bytes = 60'000 + static_cast<size_t>(i) * 37'000 % 140'001;
  CacheEntry e;
  e.ptx.assign(bytes * 45 / 100, static_cast<char>('a' + i % 26));
  e.cubin.assign(bytes - e.ptx.size(), static_cast<char>(i));
  return e;
}

std::vector<std::string> makeKeys(int count) {
  std::vector<std::string> out;
  for (int i = 0; i < count; ++i)
    out.push_back(KernelCache::make_key("kernel " + std::to_string(i), "nvrtc 13.0", {}, "sm_90a", "bench"));
  return out;
}

// A directory holding the K entries, removed at exit.
class PopulatedDir {
 public:
  explicit PopulatedDir(int count) : keys_(makeKeys(count)) {
    std::string pattern = (fs::temp_directory_path() / "twell-cache-bench-XXXXXX").string();
    if (mkdtemp(pattern.data()) == nullptr) throw std::runtime_error("mkdtemp " + pattern);
    path_ = pattern;
    KernelCache cache(path_);
    for (int i = 0; i < count; ++i) cache.get_or_compile(keys_[i], [i] { return entry(i); });
  }
  ~PopulatedDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  const fs::path& path() const { return path_; }
  const std::vector<std::string>& keys() const { return keys_; }

 private:
  std::vector<std::string> keys_;
  fs::path path_;
};

CacheEntry mustNotCompile() { throw std::runtime_error("compiled: the entry should have been a hit"); }

void DiskWarmStart(benchmark::State& state) {
  const int count = static_cast<int>(state.range(0));
  PopulatedDir dir(count);
  for (auto _ : state) {
    KernelCache cache(dir.path());
    for (const std::string& key : dir.keys()) {
      KernelCache::Result r = cache.get_or_compile(key, mustNotCompile);
      if (r.hit != twell::detail::CacheHit::Disk) state.SkipWithError("not a disk hit");
      benchmark::DoNotOptimize(r.entry->cubin.data());
    }
  }
  state.counters["per_kernel"] =
      benchmark::Counter(count, benchmark::Counter::kIsIterationInvariantRate | benchmark::Counter::kInvert);
}
BENCHMARK(DiskWarmStart)->Arg(8)->Arg(32)->Unit(benchmark::kMicrosecond)->UseRealTime();

void MemoryHit(benchmark::State& state) {
  const int count = static_cast<int>(state.range(0));
  PopulatedDir dir(count);
  KernelCache cache(dir.path());
  for (const std::string& key : dir.keys()) cache.get_or_compile(key, mustNotCompile);
  for (auto _ : state)
    for (const std::string& key : dir.keys()) {
      KernelCache::Result r = cache.get_or_compile(key, mustNotCompile);
      benchmark::DoNotOptimize(r.entry.get());
    }
  state.counters["per_kernel"] =
      benchmark::Counter(count, benchmark::Counter::kIsIterationInvariantRate | benchmark::Counter::kInvert);
}
BENCHMARK(MemoryHit)->Arg(8)->Arg(32)->Unit(benchmark::kMicrosecond)->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
