// Context internals shared by plan.cpp and cublas_dense.cpp: the device, the kernel cache, and the
// one place where generated CUDA becomes a loaded kernel.
#pragma once
#include <cuda.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>

#include "cache.h"
#include "driver.h"
#include "twell/compiler/Generate.h"
#include "twell/context.h"

namespace twell {

// A loaded kernel: the module stays loaded as long as any plan holds it.
struct LoadedKernel {
  compiler::KernelSource source;
  std::shared_ptr<const detail::CacheEntry> binary;
  CUmodule module = nullptr;
  CUfunction function = nullptr;
  int ctas_per_sm = 1;  // CTAs of this kernel resident on one SM at once (the persistent grid's size)
  // source.cluster_m > 1: the clusters of this kernel resident on the GPU at once (the persistent
  // grid is that many clusters; a cluster's CTAs must share a GPC, so this can be less than
  // SMs * ctas_per_sm / cluster_m).
  int resident_clusters = 0;
  KernelReport report;
  ~LoadedKernel();
};

struct Context::Impl {
  ContextOptions options;
  Target target;
  bool gpu = false;
  std::string no_gpu_reason;
  std::string device_name = "none";
  int sm_count = 0;
  int device_sm = 0;  // compute capability of the device, major * 10 + minor
  CUdevice device = 0;
  CUcontext context = nullptr;
  detail::KernelCache cache;

  explicit Impl(ContextOptions o);
  ~Impl();
  // Makes the context current on the calling thread (a no-op without a GPU).
  void make_current() const;
  // NVRTC through the cache (no module is loaded: the target may not be this device's). Thread-safe.
  std::shared_ptr<LoadedKernel> compile(const compiler::KernelSource& source);
  // compile(), then, with a GPU, cuModuleLoadData. Thread-safe.
  std::shared_ptr<LoadedKernel> load(const compiler::KernelSource& source);
};

// Whether a 16-bit row-major operand's pointer and row stride are `elements`-element aligned (what a
// kernel moving `elements`-value chunks of its rows, or TMA at 8 = 16 bytes, needs).
inline bool operand_aligned(const void* ptr, int64_t ld, int elements) {
  return reinterpret_cast<uintptr_t>(ptr) % (2 * elements) == 0 && ld % elements == 0;
}

// grid.x of a persistent kernel (KernelSource::persistent) over `tokens` rows, launched with grid.y 1:
// with clusters, cluster_m consecutive m-blocks times the grid_y tiles make a cluster's work item and
// as many clusters start as are resident at once (at most one per item, gate_twell_wgmma.cuh);
// without, min(m-blocks x grid_y tiles, SMs x resident CTAs per SM).
inline unsigned persistent_grid_x(const LoadedKernel& k, int64_t tokens, int sm_count) {
  const compiler::KernelSource& src = k.source;
  const int64_t m_blocks = (tokens + src.cta_m - 1) / src.cta_m;
  if (src.cluster_m > 1) {
    const int64_t items = (m_blocks + src.cluster_m - 1) / src.cluster_m * src.grid_y;
    return static_cast<unsigned>(src.cluster_m * std::min<int64_t>(items, k.resident_clusters));
  }
  return static_cast<unsigned>(std::min<int64_t>(m_blocks * src.grid_y, int64_t{sm_count} * k.ctas_per_sm));
}

// The context behind a Context object (plans and DenseFfn keep it alive).
std::shared_ptr<Context::Impl> context_impl(Context& c);

// Argument checks shared by FfnPlan::run and DenseFfn::run; throw Error(InvalidArgument) naming the
// argument: null or misaligned pointers, pointers that are not device memory, strides shorter than
// the row, token counts out of range.
// `needs_output` false: y, w_up and w_down are not used (the gate alone) and not checked.
void check_run_arguments(const char* who, const FfnSpec& spec, const FfnTensors& t, int64_t tokens, int64_t max_tokens,
                         bool needs_output = true);

}  // namespace twell
