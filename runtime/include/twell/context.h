// The runtime's entry point: one GPU (or none), the kernel cache, and the factory of FFN plans.
//
//   twell::Context ctx;                                   // device 0, cache in $TWELL_CACHE_DIR
//   twell::FfnPlan plan = ctx.plan(spec, /*max_tokens=*/131072);
//   plan.run(stream, {x, w_gate, w_up, w_down, y}, tokens);
//
// Thread safety: a Context may be shared by threads (plan() and the cache are synchronized).
#pragma once
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>

#include "twell/compiler/Generate.h"
#include "twell/plan.h"
#include "twell/spec.h"

namespace twell {

struct ContextOptions {
  int device = 0;
  // Kernel cache directory; unset: $TWELL_CACHE_DIR, else $XDG_CACHE_HOME/twell, else ~/.cache/twell.
  std::optional<std::filesystem::path> cache_dir;
  bool disk_cache = true;
  // Feature set to generate for; unset: the device's (sm_90a on an H100/H200), or sm_90a without a GPU.
  std::optional<Target> target;
};

// A generated kernel compiled by NVRTC (ahead of time or just in time), with its report.
struct CompiledKernel {
  KernelReport report;
  std::string cuda_source;
  std::string ptx;
  size_t cubin_bytes = 0;
};

struct CacheCounters {
  uint64_t memory_hits = 0, disk_hits = 0, misses = 0, corrupt_entries = 0;
};

class Context {
 public:
  // Never throws for a missing driver or GPU: compile-only use (AOT, tests, CI) works without one;
  // has_gpu() tells. Throws Error(InvalidArgument) for a device index out of range when a GPU exists.
  explicit Context(ContextOptions options = {});
  ~Context();
  Context(Context&&) noexcept;
  Context& operator=(Context&&) noexcept;

  bool has_gpu() const;
  std::string no_gpu_reason() const;  // why has_gpu() is false ("" when it is true)
  std::string device_name() const;    // e.g. "NVIDIA H200", or "none"
  int sm_count() const;               // 0 without a GPU
  const Target& target() const;
  CacheCounters cache_counters() const;

  // Generates, compiles (or loads from the cache) and, with a GPU, loads the kernels of `spec` and
  // allocates the workspace for up to `max_tokens` rows. Without a GPU the plan can report and emit
  // but not run. Gated (spec.gated) or not. Throws Error(InvalidArgument) naming the spec field for an
  // illegal spec, Error(Compile) if NVRTC rejects generated code.
  FfnPlan plan(const FfnSpec& spec, int64_t max_tokens, const PlanOptions& options = {});

  // Compiles generated kernels (generated.kernels, then generated.decode) through NVRTC and the cache
  // for this context's target; needs no GPU.
  // Throws Error(Compile) with the NVRTC log.
  std::vector<CompiledKernel> compile(const compiler::GeneratedFfn& generated);

  struct Impl;

 private:
  friend std::shared_ptr<Impl> context_impl(Context&);
  std::shared_ptr<Impl> impl_;
};

}  // namespace twell
