// The runtime's entry point: one GPU (or none), where kernels come from, and the factory of FFN plans.
//
//   twell::Context ctx;                                   // device 0, cache in $TWELL_CACHE_DIR
//   twell::FfnPlan plan = ctx.plan(spec, /*max_tokens=*/131072);
//   plan.run(stream, {x, w_gate, w_up, w_down, y}, tokens);
//
// Kernels come from ahead-of-time bundles (ContextOptions::bundles, load_bundle: made by `twellc
// compile`), else from the JIT when twell::jit is linked (it registers itself: twell/jit_registry.h)
// through the kernel cache. A program that links twell::runtime alone runs bundles only.
//
// Modules: a plan holds its FFN kernels' modules (unloaded when the plan goes: cuModuleUnload waits for
// their kernels). The auxiliary kernels (the transpose, the training kernels, the dense path's helpers,
// one per kind and the spec fields it depends on) are loaded once and held until the Context goes.
//
// Thread safety: a Context may be shared by threads (plan(), load_bundle() and the cache are synchronized).
#pragma once
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "twell/kernels/kernel.h"
#include "twell/plan.h"
#include "twell/spec.h"
#include "twell/tuning.h"

namespace twell {

struct ContextOptions {
  // The CUDA device; kNoDevice: none, even where a GPU is present (compile-only use: twellc compile and
  // emit make kernels for targets the local GPU cannot run).
  static constexpr int kNoDevice = -1;
  int device = 0;
  // Kernel cache directory; unset: $TWELL_CACHE_DIR, else $XDG_CACHE_HOME/twell, else ~/.cache/twell.
  std::optional<std::filesystem::path> cache_dir;
  bool disk_cache = true;
  // Feature set to generate for; unset: the device's (sm_90a on an H100/H200), or sm_90a without a GPU.
  // A bundle must be made for this target (an sm_80 bundle on an H200: target = Target{80, false}).
  std::optional<Target> target;
  // Ahead-of-time bundles to load at construction (as load_bundle, in this order).
  std::vector<std::filesystem::path> bundles;
  // Whether kernels missing from the bundles are compiled by the JIT when twell::jit is linked
  // (IfLinked), or never (Never: a deployment's behaviour, also where the JIT happens to be linked).
  enum class Jit { IfLinked, Never };
  Jit jit = Jit::IfLinked;
};

// What load_bundle found.
struct BundleInfo {
  std::filesystem::path dir;
  Target target;
  std::string twell_version;  // of the twellc that wrote it
  size_t kernel_sets = 0;     // FFN kernel sets and auxiliary kernels
  size_t kernels = 0;
  double load_ms = 0;         // reading and verifying every file
  size_t tuning_entries = 0;  // tuned choices it embeds (twellc compile --tuning-dir; PlanOptions::tuning)
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

  // Autotunes plans of request.spec on this GPU and stores the result in the tuning database
  // (twell/tuning.h: tune()); later plans of that spec use it (PlanOptions::tuning).
  TuneResult tune(const TuneRequest& request);

  // Generates, compiles (or loads from the cache) and, with a GPU, loads the kernels of `spec` and
  // allocates the workspace for up to `max_tokens` rows. Without a GPU the plan can report and emit
  // but not run. Gated (spec.gated) or not. The plan holds kernels::canonical_spec(spec) (threshold
  // -0.0 as 0.0). Throws Error(InvalidArgument) naming the spec field for an illegal spec
  // (kernels::validate_spec: a threshold above max_finite(spec.dtype) included), Error(Compile) if
  // NVRTC rejects generated code.
  FfnPlan plan(const FfnSpec& spec, int64_t max_tokens, const PlanOptions& options = {});

  // Compiles generated kernels (generated.kernels, then generated.decode) through the JIT and the cache
  // for this context's target; needs no GPU. Throws Error(Compile) with the NVRTC log,
  // Error(Unsupported) when no JIT is linked (or ContextOptions::jit is Never).
  std::vector<CompiledKernel> compile(const kernels::GeneratedFfn& generated);

  // Makes `generated` (for example compiler::generateFromMlir's kernels of a hand-written .mlir) the
  // kernels that plans of `spec` take, as if the JIT had made them for it: each is checked against its
  // contract (twell/kernels/validate.h) and compiled through the cache, and save_bundle writes them.
  // `spec` must be the one such a plan's consumer reads (down_layout in_out: plans transpose an out_in
  // Wd first); `decode_down_layout` the user's Wd layout the decode kernels read (nullopt: no decode
  // kernels are taken; plans with decode_max_tokens 0, such as training plans, also take a set that has them). Throws
  // Error(InvalidArgument) naming what differs between `spec` and the kernels, Error(Unsupported)
  // without a JIT, Error(Compile) for a kernel its contract refuses.
  void add_kernels(const FfnSpec& spec, const kernels::GeneratedFfn& generated, std::optional<WeightLayout> decode_down_layout);

  // Whether this context compiles kernels its bundles lack (twell::jit linked, ContextOptions::jit).
  bool has_jit() const;

  // Loads the bundle in `dir` (twellc compile's output for one target): reads manifest.json and every
  // kernel file, verifying sizes and checksums; later plan() calls take their kernels from it (bundles
  // loaded earlier first). Modules are loaded by the plans that use them. Throws Error(NotFound) for a
  // missing directory, manifest or file; Error(Parse) for a damaged or edited manifest or file, another
  // schema or parameter-block version; Error(InvalidArgument) for a bundle made for another target
  // than this context's (naming both). On error nothing is loaded and the context is unchanged.
  BundleInfo load_bundle(const std::filesystem::path& dir);

  // Writes every kernel set this context has obtained so far (its plans', their dense paths', from the
  // JIT or from bundles), and the neuron reordering kernel, as a bundle for this context's target into
  // `dir`: what `twellc compile` does after making plans. `tuning`: tuning database entries to embed
  // (the manifest's "tuning"; twellc compile --tuning-dir's), each for this context's target arch and
  // one spec; plans made from the bundle take them where the deployment machine's database has no entry
  // (PlanOptions::tuning; the plans of their layouts must be made before, so that their kernels are in
  // the bundle). Throws Error(Io) naming the file when a write fails (read-only directory, full disk),
  // Error(InvalidArgument) for a tuning entry of another arch.
  void save_bundle(const std::filesystem::path& dir, const std::vector<TuningFile>& tuning = {});

  struct Impl;

 private:
  friend std::shared_ptr<Impl> context_impl(Context&);
  friend class FfnTrainingPlan;  // makes its forward plan with PlanUse::TrainingForward
  // TrainingForward: the plan of a training plan, which computes a split's dense neurons itself, so the
  // plan makes no DenseFfn (kernels, [max_tokens, dense_neurons] buffers) for them.
  enum class PlanUse { Inference, TrainingForward };
  FfnPlan plan(const FfnSpec& spec, int64_t max_tokens, const PlanOptions& options, PlanUse use);
  // plan()'s work for a checked, canonical spec whose layout source is decided.
  FfnPlan make_plan(const FfnSpec& spec, int64_t max_tokens, const PlanOptions& options, std::string config_source,
                    PlanUse use);
  std::shared_ptr<Impl> impl_;
};

}  // namespace twell
