// twell::Context: device discovery (lazy driver), the kernel cache, and loading generated kernels.
#include <chrono>

#include <fmt/format.h>

#include "context_impl.h"
#include "nvrtc_compiler.h"
#include "twell/error.h"

namespace twell {

namespace {
// Every embedded device header, name and text, in one string (computed once).
const std::string& embedded_headers_text() {
  static const std::string text = [] {
    std::string t;
    for (const auto& [name, contents] : detail::embeddedHeaders()) {
      t.append(name);
      t.push_back('\0');
      t.append(contents);
      t.push_back('\0');
    }
    return t;
  }();
  return text;
}
}  // namespace

LoadedKernel::~LoadedKernel() {
  if (module != nullptr) detail::Driver::get().cuModuleUnload(module);
}

Context::Impl::Impl(ContextOptions o)
    : options(std::move(o)),
      cache(options.disk_cache ? options.cache_dir.value_or(detail::KernelCache::defaultDir()) : std::filesystem::path()) {
  if (options.target && !compiler::isSupportedTarget(*options.target))
    throw Error(ErrorCode::InvalidArgument, fmt::format("ContextOptions::target: expected one of {}, got {}",
                                                        compiler::supportedTargets(), options.target->arch()));
  if (detail::Driver::available()) {
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
    detail::check(d.cuDevicePrimaryCtxRetain(&context, device), "cuDevicePrimaryCtxRetain");
    gpu = true;
    device_sm = major * 10 + minor;
    // Hopper (9.0) gets its arch-specific feature set; everything else the portable one.
    target = options.target.value_or(Target{major * 10 + minor, major == 9 && minor == 0});
    if (target.sm > major * 10 + minor)
      throw Error(ErrorCode::InvalidArgument,
                  fmt::format("ContextOptions::target: {} cannot run on {} (sm_{}{})", target.arch(), device_name, major, minor));
  } else {
    no_gpu_reason = detail::Driver::unavailableReason();
    target = options.target.value_or(Target{});
  }
}

Context::Impl::~Impl() {
  if (context != nullptr) detail::Driver::get().cuDevicePrimaryCtxRelease(device);
}

void Context::Impl::make_current() const {
  if (gpu) detail::check(detail::Driver::get().cuCtxSetCurrent(context), "cuCtxSetCurrent");
}

std::shared_ptr<LoadedKernel> Context::Impl::load(const compiler::KernelSource& source) {
  auto k = compile(source);
  if (gpu) {
    const auto t0 = std::chrono::steady_clock::now();
    make_current();
    const detail::Driver& d = detail::Driver::get();
    // A cubin runs only on its own arch; for another target (e.g. the portable sm_80 set on an H200)
    // the driver compiles the PTX for this device.
    const void* image = target.sm == device_sm ? static_cast<const void*>(k->binary->cubin.data())
                                               : static_cast<const void*>(k->binary->ptx.c_str());
    detail::check(d.cuModuleLoadData(&k->module, image), fmt::format("cuModuleLoadData({})", source.name).c_str());
    detail::check(d.cuModuleGetFunction(&k->function, k->module, source.name.c_str()),
                  fmt::format("cuModuleGetFunction({})", source.name).c_str());
    // A CTA whose static + dynamic shared memory passes 48 KiB must opt in to the dynamic part.
    if (source.smem_bytes > 0) {
      detail::check(d.cuFuncSetAttribute(k->function, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, source.smem_bytes),
                    fmt::format("cuFuncSetAttribute({}, {} bytes of dynamic shared memory)", source.name, source.smem_bytes).c_str());
    }
    detail::check(d.cuOccupancyMaxActiveBlocksPerMultiprocessor(&k->ctas_per_sm, k->function, source.threads,
                                                                static_cast<size_t>(source.smem_bytes)),
                  fmt::format("cuOccupancyMaxActiveBlocksPerMultiprocessor({})", source.name).c_str());
    if (k->ctas_per_sm < 1)
      throw Error(ErrorCode::Cuda, fmt::format("{}: no CTA of {} threads and {} bytes of shared memory fits on an SM",
                                                        source.name, source.threads, source.smem_bytes));
    if (source.cluster_m > 1) {
      // The cluster size is compiled in (__cluster_dims__); the query takes it from the kernel.
      CUlaunchConfig config{};
      config.gridDimX = static_cast<unsigned>(source.cluster_m * sm_count);
      config.gridDimY = config.gridDimZ = 1;
      config.blockDimX = static_cast<unsigned>(source.threads);
      config.blockDimY = config.blockDimZ = 1;
      config.sharedMemBytes = static_cast<unsigned>(source.smem_bytes);
      detail::check(d.cuOccupancyMaxActiveClusters(&k->resident_clusters, k->function, &config),
                    fmt::format("cuOccupancyMaxActiveClusters({})", source.name).c_str());
      if (k->resident_clusters < 1)
        throw Error(ErrorCode::Cuda, fmt::format("{}: no cluster of {} CTAs of {} threads and {} bytes of shared memory "
                                                 "fits on this GPU",
                                                 source.name, source.cluster_m, source.threads, source.smem_bytes));
    }
    k->report.load_ms += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  }
  return k;
}

std::shared_ptr<LoadedKernel> Context::Impl::compile(const compiler::KernelSource& source) {
  auto k = std::make_shared<LoadedKernel>();
  k->source = source;
  const std::string arch = target.arch();
  const auto options_list = detail::nvrtcCompileOptions(arch, /*want_cubin=*/true);
  // The generated source includes the embedded device headers: their text is part of the key, so a
  // change to runtime/device never loads a stale binary.
  const std::string key =
      detail::KernelCache::makeKey(source.source + embedded_headers_text(), detail::nvrtcVersion(), options_list, arch, TWELL_VERSION);
  double compile_ms = 0;
  const auto t0 = std::chrono::steady_clock::now();
  auto result = cache.getOrCompile(key, [&] {
    detail::NvrtcOutput out = detail::compileCuda(source.source, source.name + ".cu", arch, /*want_cubin=*/true);
    compile_ms = out.compile_ms;
    return detail::CacheEntry{std::move(out.ptx), std::move(out.cubin)};
  });
  k->binary = result.entry;
  k->report.name = source.name;
  k->report.kind = source.kind == compiler::KernelKind::GateTwell   ? "gate_twell"
                   : source.kind == compiler::KernelKind::GatedDown ? (source.gated ? "gated_down" : "down")
                   : source.kind == compiler::KernelKind::WeightTranspose ? "transpose"
                   : source.kind == compiler::KernelKind::DenseGatedUp    ? "dense_gated_up"
                   : source.kind == compiler::KernelKind::NeuronPermute   ? "permute"
                   : source.kind == compiler::KernelKind::DecodeGate      ? "decode_gate"
                   : source.kind == compiler::KernelKind::DecodeGateSmall ? "decode_gate_small"
                   : source.kind == compiler::KernelKind::DecodeUp        ? "decode_up"
                   : source.kind == compiler::KernelKind::DecodeDown      ? "decode_down"
                                                                          : "dense_gated_mul";
  k->report.cache = result.hit == detail::CacheHit::Memory ? "memory" : result.hit == detail::CacheHit::Disk ? "disk" : "miss";
  k->report.compile_ms = compile_ms;
  k->report.ptx_bytes = result.entry->ptx.size();
  k->report.cubin_bytes = result.entry->cubin.size();
  k->report.arch = arch;
  k->report.threads = source.threads;
  k->report.cta_m = source.cta_m;
  k->report.cluster_m = source.cluster_m;
  k->report.grid_y = source.grid_y;
  k->report.load_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() - compile_ms;
  return k;
}

std::shared_ptr<Context::Impl> context_impl(Context& c) {
  if (!c.impl_) throw Error(ErrorCode::InvalidArgument, "Context: this context was moved from; use the one it was moved to");
  return c.impl_;
}

std::vector<CompiledKernel> Context::compile(const compiler::GeneratedFfn& generated) {
  std::vector<CompiledKernel> out;
  auto impl = context_impl(*this);
  std::vector<const compiler::KernelSource*> sources;
  for (const auto& source : generated.kernels) sources.push_back(&source);
  for (const auto& source : generated.decode) sources.push_back(&source);
  for (const compiler::KernelSource* source_ptr : sources) {
    const compiler::KernelSource& source = *source_ptr;
    auto k = impl->compile(source);
    out.push_back(CompiledKernel{k->report, source.source, k->binary->ptx, k->binary->cubin.size()});
  }
  return out;
}

Context::Context(ContextOptions options) : impl_(std::make_shared<Impl>(std::move(options))) {}
Context::~Context() = default;
Context::Context(Context&&) noexcept = default;
Context& Context::operator=(Context&&) noexcept = default;
bool Context::has_gpu() const { return context_impl(const_cast<Context&>(*this))->gpu; }
std::string Context::no_gpu_reason() const { return context_impl(const_cast<Context&>(*this))->no_gpu_reason; }
std::string Context::device_name() const { return context_impl(const_cast<Context&>(*this))->device_name; }
int Context::sm_count() const { return context_impl(const_cast<Context&>(*this))->sm_count; }
const Target& Context::target() const { return context_impl(const_cast<Context&>(*this))->target; }
CacheCounters Context::cache_counters() const {
  const auto s = context_impl(const_cast<Context&>(*this))->cache.stats();
  return CacheCounters{s.memory_hits, s.disk_hits, s.misses, s.corrupt_entries};
}

}  // namespace twell
