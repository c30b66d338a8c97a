// twell::Context: device discovery (lazy driver), bundles, the kernel cache, and the Context API.
// Where kernels come from and how they are loaded: kernel_loading.cpp.
#include <chrono>

#include <fmt/format.h>

#include "context_impl.h"
#include "l2_eviction.h"  // Impl::l2_eviction's destructor
#include "twell/error.h"
#include "twell/jit_registry.h"
#include "twell/kernels/constraints.h"

namespace twell {

Context::Impl::Impl(ContextOptions o)
    : options(std::move(o)),
      cache(options.disk_cache ? options.cache_dir.value_or(detail::KernelCache::default_dir()) : std::filesystem::path()) {
  if (options.target && !kernels::SupportedArchs::isSupported(options.target->sm, options.target->arch_specific))
    throw Error(ErrorCode::InvalidArgument, fmt::format("ContextOptions::target: expected one of {}, got {}",
                                                        kernels::SupportedArchs::list(), options.target->arch()));
  if (options.jit != ContextOptions::Jit::IfLinked && options.jit != ContextOptions::Jit::Never)
    throw Error(ErrorCode::InvalidArgument, fmt::format("ContextOptions::jit: expected IfLinked or Never, got {}",
                                                        static_cast<int>(options.jit)));
  if (options.jit == ContextOptions::Jit::IfLinked) jit = registered_kernel_compiler();
  if (options.device == ContextOptions::kNoDevice) {
    no_gpu_reason = "ContextOptions::device is kNoDevice (compile only)";
    target = options.target.value_or(Target{});
  } else if (detail::Driver::available()) {
    const detail::Driver& d = detail::Driver::get();
    int count = 0;
    detail::check(d.cuDeviceGetCount(&count), "cuDeviceGetCount");
    if (options.device < 0 || options.device >= count)
      throw Error(ErrorCode::InvalidArgument,
                  fmt::format("ContextOptions::device: expected 0..{}, got {}", count - 1, options.device));
    detail::check(d.cuDeviceGet(&device, options.device), "cuDeviceGet");
    char name[256] = {};
    detail::check(d.cuDeviceGetName(name, sizeof(name), device), "cuDeviceGetName");
    device_name = name;
    int major = 0, minor = 0;
    detail::check(d.cuDeviceGetAttribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, device), "cuDeviceGetAttribute");
    detail::check(d.cuDeviceGetAttribute(&minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, device), "cuDeviceGetAttribute");
    detail::check(d.cuDeviceGetAttribute(&sm_count, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, device), "cuDeviceGetAttribute");
    detail::check(d.cuDeviceGetAttribute(&l2_bytes, CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE, device), "cuDeviceGetAttribute");
    detail::check(d.cuDevicePrimaryCtxRetain(&context, device), "cuDevicePrimaryCtxRetain");
    gpu = true;
    device_sm = major * 10 + minor;
    // Hopper (9.0) gets its arch-specific feature set; everything else the portable one.
    target = options.target.value_or(Target{major * 10 + minor, major == 9 && minor == 0});
    if (target.sm > major * 10 + minor || (target.arch_specific && target.sm != major * 10 + minor))
      throw Error(ErrorCode::InvalidArgument,
                  fmt::format("ContextOptions::target: {} cannot run on {} (sm_{}{})", target.arch(), device_name, major, minor));
  } else {
    no_gpu_reason = detail::Driver::unavailable_reason();
    target = options.target.value_or(Target{});
  }
}

Context::Impl::~Impl() {
  if (context == nullptr) return;
  // The kept auxiliary modules go while the primary context is still held (members go after this body);
  // the thread's current context is the caller's again afterwards.
  const detail::Driver& d = detail::Driver::get();
  CUcontext previous = nullptr;
  d.cuCtxGetCurrent(&previous);
  d.cuCtxSetCurrent(context);
  auxiliary_loaded.clear();
  l2_eviction.reset();
  d.cuCtxSetCurrent(previous == context ? nullptr : previous);
  d.cuDevicePrimaryCtxRelease(device);
}

void Context::Impl::make_current() const {
  if (gpu) detail::check(detail::Driver::get().cuCtxSetCurrent(context), "cuCtxSetCurrent");
}

std::shared_ptr<Context::Impl> context_impl(Context& c) {
  if (!c.impl_) throw Error(ErrorCode::InvalidArgument, "Context: this context was moved from; use the one it was moved to");
  return c.impl_;
}

std::vector<CompiledKernel> Context::compile(const kernels::GeneratedFfn& generated) {
  std::vector<CompiledKernel> out;
  auto impl = context_impl(*this);
  std::vector<const kernels::KernelSource*> sources;
  for (const auto& source : generated.kernels) sources.push_back(&source);
  for (const auto& source : generated.decode) sources.push_back(&source);
  for (const kernels::KernelSource* source : sources) {
    auto k = impl->compile(*source);
    out.push_back(CompiledKernel{k->report, source->source, k->binary->ptx, k->binary->cubin.size()});
  }
  return out;
}

BundleInfo Context::load_bundle(const std::filesystem::path& dir) {
  auto impl = context_impl(*this);
  const auto t0 = std::chrono::steady_clock::now();
  std::shared_ptr<const detail::Bundle> bundle = detail::Bundle::load(dir);
  if (bundle->target().arch() != impl->target.arch())
    throw Error(ErrorCode::InvalidArgument,
                fmt::format("Context::load_bundle: {}: expected a bundle for this context's target {}, found one for {} "
                            "(its kernels, e.g. {}, were built for {}){}",
                            dir.string(), impl->target.arch(), bundle->target().arch(),
                            bundle->sets().empty() ? std::string("none") : bundle->sets().begin()->second.kernels.front(),
                            bundle->target().arch(),
                            impl->gpu ? fmt::format("; to run it here make the Context with ContextOptions::target = {}",
                                                    bundle->target().arch())
                                      : std::string()));
  BundleInfo info{dir, bundle->target(), bundle->twell_version(), bundle->sets().size(), bundle->kernel_count(), 0,
                  bundle->tuning().size()};
  {
    std::lock_guard lock(impl->bundles_mutex);
    // One holder per kernel set: a second bundle holding a different one would be shadowed silently.
    // The same kernels (bundles of two shapes share the transpose, permute and dense helpers) are fine.
    auto same = [](const detail::Bundle& a, const detail::BundleSet& sa, const detail::Bundle& b, const detail::BundleSet& sb) {
      if (sa.kernels != sb.kernels || sa.decode != sb.decode) return false;
      for (const auto* names : {&sa.kernels, &sa.decode})
        for (const std::string& n : *names)
          if (a.kernel(n)->binary->cubin != b.kernel(n)->binary->cubin || a.kernel(n)->binary->ptx != b.kernel(n)->binary->ptx)
            return false;
      return true;
    };
    for (const auto& loaded : impl->bundles)
      for (const auto& [request, set] : bundle->sets())
        if (const detail::BundleSet* held = loaded->find(request); held != nullptr && !same(*loaded, *held, *bundle, set))
          throw Error(ErrorCode::InvalidArgument,
                      fmt::format("Context::load_bundle: {}: expected kernel sets that no loaded bundle holds differently, found "
                                  "\"{}\", which {} holds with other kernels",
                                  dir.string(), request, loaded->dir().string()));
    {
      // Auxiliary kernels kept from before (the JIT's) give way to the bundle's from the next call on.
      std::lock_guard aux(impl->auxiliary_mutex);
      for (const auto& [request, set] : bundle->sets()) impl->auxiliary_loaded.erase(request);
    }
    impl->bundles.push_back(std::move(bundle));
  }
  info.load_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  return info;
}

void Context::save_bundle(const std::filesystem::path& dir, const std::vector<TuningFile>& tuning) {
  auto impl = context_impl(*this);
  // permute_neurons' kernel goes with every bundle: a deployment may reorder its weights hot-first.
  impl->auxiliary(kernels::KernelKind::NeuronPermute, FfnSpec{}, "Context::save_bundle");
  std::lock_guard lock(impl->bundles_mutex);
  detail::write_bundle(dir, impl->target, impl->obtained, impl->obtained_kernels, tuning);
}

Context::Context(ContextOptions options) : impl_(std::make_shared<Impl>(std::move(options))) {
  for (const auto& dir : impl_->options.bundles) load_bundle(dir);
}
Context::~Context() = default;
Context::Context(Context&&) noexcept = default;
Context& Context::operator=(Context&&) noexcept = default;
bool Context::has_gpu() const { return context_impl(const_cast<Context&>(*this))->gpu; }
bool Context::has_jit() const { return context_impl(const_cast<Context&>(*this))->jit != nullptr; }
std::string Context::no_gpu_reason() const { return context_impl(const_cast<Context&>(*this))->no_gpu_reason; }
std::string Context::device_name() const { return context_impl(const_cast<Context&>(*this))->device_name; }
int Context::sm_count() const { return context_impl(const_cast<Context&>(*this))->sm_count; }
const Target& Context::target() const { return context_impl(const_cast<Context&>(*this))->target; }
CacheCounters Context::cache_counters() const {
  const auto s = context_impl(const_cast<Context&>(*this))->cache.stats();
  return CacheCounters{s.memory_hits, s.disk_hits, s.misses, s.corrupt_entries};
}

}  // namespace twell
