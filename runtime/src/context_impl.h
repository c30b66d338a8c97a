// Context internals shared by the plan, the dense path and the neuron reordering: the device, where
// kernels come from (ahead-of-time bundles, else the registered JIT through the kernel cache), and the
// one place a kernel binary becomes a loaded module.
#pragma once
#include <cuda.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "bundle.h"
#include "cache.h"
#include "driver.h"
#include "twell/context.h"
#include "twell/kernels/kernel_compiler.h"
#include "twell/kernels/launch.h"

namespace twell {
namespace detail {
class L2Eviction;
}

// A kernel ready to launch: its description, its binary and, with a GPU, its module. The module stays
// loaded as long as any plan holds it (auxiliary kernels: as long as their context).
struct LoadedKernel {
  kernels::KernelSource source;  // the description; source.source is the CUDA C++ ("" if the bundle has none)
  std::shared_ptr<const detail::CacheEntry> binary;
  CUmodule module = nullptr;
  CUfunction function = nullptr;
  kernels::Occupancy occupancy;  // with a GPU: what the device holds of it at once
  KernelReport report;
  LoadedKernel() = default;
  LoadedKernel(const LoadedKernel&) = delete;  // one owner per module: the destructor unloads it
  LoadedKernel& operator=(const LoadedKernel&) = delete;
  ~LoadedKernel();
};

// The kernels of one FFN (a kernel set of kernel_request.h), loaded.
struct FfnKernels {
  std::string ir;
  TwellLayout layout;
  std::vector<std::shared_ptr<LoadedKernel>> kernels;  // GateTwell, then GatedDown
  std::vector<std::shared_ptr<LoadedKernel>> decode;   // DecodeGate, DecodeUp, DecodeDown, DecodeGateSmall, or none
};

struct Context::Impl {
  ContextOptions options;
  Target target;
  bool gpu = false;
  std::string no_gpu_reason;
  std::string device_name = "none";
  int sm_count = 0;
  int device_sm = 0;  // compute capability of the device, major * 10 + minor
  int l2_bytes = 0;   // the device's L2 cache (CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE); 0 without a GPU
  CUdevice device = 0;
  CUcontext context = nullptr;
  detail::KernelCache cache;
  std::shared_ptr<const kernels::KernelCompiler> jit;  // null: kernels come from bundles only

  mutable std::mutex bundles_mutex;
  std::vector<std::shared_ptr<const detail::Bundle>> bundles;
  // Every kernel set this context obtained, by request key: what save_bundle writes.
  std::map<std::string, detail::BundleSet> obtained;
  std::map<std::string, std::shared_ptr<const detail::BundleKernel>> obtained_kernels;
  // The auxiliary kernels loaded so far, by request key, kept for the context's life: callers that take
  // one per call (train_row_backward, train_weight_grad) launch the same module every time. Loading one
  // per call cost a generation, a module load and, when the call's reference went, cuModuleUnload, which
  // waits for the kernel to finish: every training backward blocked the host (bench/README.md v51).
  std::mutex auxiliary_mutex;
  std::map<std::string, std::shared_ptr<LoadedKernel>> auxiliary_loaded;

  // Dispatch::Auto's L2 eviction (l2_eviction.h: context_l2_eviction), made at the first calibration
  // (the mutex guards its making).
  std::mutex l2_eviction_mutex;
  std::unique_ptr<detail::L2Eviction> l2_eviction;

  explicit Impl(ContextOptions o);
  ~Impl();
  // Makes the context current on the calling thread (a no-op without a GPU).
  void make_current() const;

  // The kernels of `spec` for this context's target, the decode kernels reading w_down in
  // `decode_down_layout` (none for nullopt): from the first bundle that holds them, else from the
  // JIT (through the cache), else Error(NotFound) naming the request and the bundles. `who` prefixes
  // errors. Thread-safe.
  FfnKernels ffn_kernels(const FfnSpec& spec, std::optional<WeightLayout> decode_down_layout, const char* who);
  // An auxiliary kernel (kernel.h: WeightTranspose, NeuronPermute, DenseGatedMul, DenseGatedUp,
  // TrainRowBackward, TrainWeightGrad, TrainDenseForward, TrainDenseBackward), the same way, loaded once per context (auxiliary_loaded; a
  // bundle loaded later replaces the kernels it holds for later calls). `report`, where given, receives
  // how this call obtained it ("memory" where an earlier call loaded it). Thread-safe.
  std::shared_ptr<LoadedKernel> auxiliary(kernels::KernelKind kind, const FfnSpec& spec, const char* who,
                                          KernelReport* report = nullptr);
  // JIT-compiles `source` through the cache (no module). Throws Error(Unsupported) without a JIT.
  std::shared_ptr<LoadedKernel> compile(const kernels::KernelSource& source);
  // compile() of each source, in parallel threads (NVRTC is thread-safe; the cache compiles a key once),
  // then each loaded on this thread, in order. A plan's kernel set costs its slowest kernel's compile, not
  // the sum. The first failure (in order) is rethrown once every compile has ended.
  std::vector<std::shared_ptr<LoadedKernel>> compile_and_load(const std::vector<kernels::KernelSource>& sources);

  // Remembers a kernel set this context obtained (save_bundle writes it; later requests reuse it).
  void record(const std::string& request, detail::BundleSet set, const std::vector<const LoadedKernel*>& kernels);
  // The bundles loaded so far, in load order. Thread-safe.
  std::vector<std::shared_ptr<const detail::Bundle>> loaded_bundles() const;

 private:
  std::shared_ptr<LoadedKernel> load(std::shared_ptr<LoadedKernel> k);
  // A kernel from its description and binary (a bundle's, or one obtained earlier), reported as `cache`.
  std::shared_ptr<LoadedKernel> from_binary(const detail::BundleKernel& kernel, const char* cache);
  using KernelLookup = std::function<std::shared_ptr<const detail::BundleKernel>(const std::string&)>;
  // The kernels of `set`, each found by `kernel`, loaded.
  FfnKernels ffn_from_set(const detail::BundleSet& set, const KernelLookup& kernel, const char* cache);
  // Which bundles were searched for `request`, and the sets of its shape they hold (for NotFound).
  std::string bundle_list(const std::string& request) const;
};

// Whether a 16-bit row-major operand's pointer and row stride are `elements`-element aligned (what a
// kernel moving `elements`-value chunks of its rows, or TMA at 8 = 16 bytes, needs).
inline bool operand_aligned(const void* ptr, int64_t ld, int elements) {
  return reinterpret_cast<uintptr_t>(ptr) % (2 * elements) == 0 && ld % elements == 0;
}

// The context behind a Context object (plans and DenseFfn keep it alive).
std::shared_ptr<Context::Impl> context_impl(Context& c);

}  // namespace twell
