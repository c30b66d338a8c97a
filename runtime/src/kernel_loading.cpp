// Where a context's kernels come from: a loaded bundle that holds the requested kernel set, else the
// registered JIT (through the kernel cache), else a NotFound error naming the request. With a GPU
// every kernel is then loaded as a module and its occupancy queried once.
#include <bit>
#include <chrono>
#include <future>

#include <fmt/format.h>

#include "context_impl.h"
#include "kernel_request.h"
#include "twell/error.h"
#include "twell/kernels/validate.h"

namespace twell {

LoadedKernel::~LoadedKernel() {
  if (module != nullptr) detail::Driver::get().cuModuleUnload(module);
}

namespace {
void fill_report(LoadedKernel& k, const Target& target) {
  const kernels::KernelSource& s = k.source;
  k.report.name = s.name;
  k.report.kind = kernels::report_kind(s);
  k.report.ptx_bytes = k.binary->ptx.size();
  k.report.cubin_bytes = k.binary->cubin.size();
  k.report.arch = target.arch();
  k.report.consumer = s.consumer == kernels::ConsumerKind::None ? "" : kernels::to_string(s.consumer);
  k.report.threads = s.threads;
  k.report.cta_m = s.cta_m;
  k.report.cluster_m = s.cluster_m;
  k.report.persistent = s.persistent;
  k.report.grid_y = s.persistent ? 1 : s.grid_y;
  k.report.tiles = s.kind == kernels::KernelKind::GateTwell || s.kind == kernels::KernelKind::DenseGatedUp ? s.grid_y : 0;
}
}  // namespace

std::shared_ptr<LoadedKernel> Context::Impl::compile(const kernels::KernelSource& source) {
  if (!jit)
    throw Error(ErrorCode::Unsupported,
                fmt::format("Context: compiling {} needs the JIT: {}", source.name,
                            options.jit == ContextOptions::Jit::Never ? "ContextOptions::jit is Never"
                                                                      : "twell::jit is not linked into this program"));
  // The emitter and the contracts must agree on every kernel (launch.h launches by the description).
  if (const std::string wrong = kernels::validate_kernel(source, target); !wrong.empty())
    throw Error(ErrorCode::Compile, fmt::format("Context: the JIT's kernel {} ({}) breaks its contract: {} (a twell bug)", source.name,
                                                kernels::to_string(source.kind), wrong));
  auto k = std::make_shared<LoadedKernel>();
  k->source = source;
  // The source and everything else the JIT says can change the binary (compiler, options, device
  // headers) make the key, so a change to any of them never loads a stale binary.
  const std::string key = detail::KernelCache::make_key(source.source, jit->binary_identity(target), {}, target.arch(), TWELL_VERSION);
  double compile_ms = 0;
  const auto t0 = std::chrono::steady_clock::now();
  auto result = cache.get_or_compile(key, [&] {
    kernels::CompiledBinary out = jit->compile(source, target);
    compile_ms = out.compile_ms;
    return detail::CacheEntry{std::move(out.ptx), std::move(out.cubin)};
  });
  k->binary = result.entry;
  fill_report(*k, target);
  k->report.cache = result.hit == detail::CacheHit::Memory ? "memory"
                    : result.hit == detail::CacheHit::Disk ? "disk"
                    : result.corrupt                       ? "miss (corrupt entry replaced)"
                                                           : "miss";
  k->report.compile_ms = compile_ms;
  k->report.load_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() - compile_ms;
  return k;
}

std::vector<std::shared_ptr<LoadedKernel>> Context::Impl::compile_and_load(const std::vector<kernels::KernelSource>& sources) {
  std::vector<std::future<std::shared_ptr<LoadedKernel>>> compiled;
  // (async | deferred: where no thread can be made, libstdc++ runs the compile on this thread at wait())
  for (const kernels::KernelSource& source : sources)
    compiled.push_back(std::async(std::launch::async | std::launch::deferred, [this, &source] { return compile(source); }));
  std::vector<std::shared_ptr<LoadedKernel>> out;
  for (auto& f : compiled) f.wait();  // all have ended before anything is rethrown (they read `sources`)
  for (auto& f : compiled) out.push_back(load(f.get()));
  return out;
}

std::shared_ptr<LoadedKernel> Context::Impl::load(std::shared_ptr<LoadedKernel> k) {
  if (!gpu) return k;
  const kernels::KernelSource& source = k->source;
  const auto t0 = std::chrono::steady_clock::now();
  make_current();
  const detail::Driver& d = detail::Driver::get();
  // A cubin runs only on its own arch; for another target (e.g. the portable sm_80 set on an H200)
  // the driver compiles the PTX for this device.
  const bool own_arch = target.sm == device_sm && !k->binary->cubin.empty();
  const void* image = own_arch ? static_cast<const void*>(k->binary->cubin.data()) : static_cast<const void*>(k->binary->ptx.c_str());
  detail::check(d.cuModuleLoadData(&k->module, image), fmt::format("cuModuleLoadData({})", source.name).c_str());
  detail::check(d.cuModuleGetFunction(&k->function, k->module, source.name.c_str()),
                fmt::format("cuModuleGetFunction({})", source.name).c_str());
  // A CTA whose static + dynamic shared memory passes 48 KiB must opt in to the dynamic part.
  if (source.smem_bytes > 0)
    detail::check(d.cuFuncSetAttribute(k->function, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, source.smem_bytes),
                  fmt::format("cuFuncSetAttribute({}, {} bytes of dynamic shared memory)", source.name, source.smem_bytes).c_str());
  k->occupancy.sm_count = sm_count;
  detail::check(d.cuOccupancyMaxActiveBlocksPerMultiprocessor(&k->occupancy.ctas_per_sm, k->function, source.threads,
                                                              static_cast<size_t>(source.smem_bytes)),
                fmt::format("cuOccupancyMaxActiveBlocksPerMultiprocessor({})", source.name).c_str());
  if (k->occupancy.ctas_per_sm < 1)
    throw Error(ErrorCode::Cuda, fmt::format("{}: no CTA of {} threads and {} bytes of shared memory fits on an SM", source.name,
                                             source.threads, source.smem_bytes));
  if (source.cluster_m > 1) {
    // The cluster size is compiled in (__cluster_dims__); the query takes it from the kernel.
    CUlaunchConfig config{};
    config.gridDimX = static_cast<unsigned>(source.cluster_m * sm_count);
    config.gridDimY = config.gridDimZ = 1;
    config.blockDimX = static_cast<unsigned>(source.threads);
    config.blockDimY = config.blockDimZ = 1;
    config.sharedMemBytes = static_cast<unsigned>(source.smem_bytes);
    detail::check(d.cuOccupancyMaxActiveClusters(&k->occupancy.resident_clusters, k->function, &config),
                  fmt::format("cuOccupancyMaxActiveClusters({})", source.name).c_str());
    if (k->occupancy.resident_clusters < 1)
      throw Error(ErrorCode::Cuda, fmt::format("{}: no cluster of {} CTAs of {} threads and {} bytes of shared memory fits on "
                                               "this GPU", source.name, source.cluster_m, source.threads, source.smem_bytes));
  }
  k->report.load_ms += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  return k;
}

std::shared_ptr<LoadedKernel> Context::Impl::from_binary(const detail::BundleKernel& kernel, const char* cache) {
  auto k = std::make_shared<LoadedKernel>();
  k->source = kernel.source;
  k->binary = kernel.binary;
  fill_report(*k, target);
  k->report.cache = cache;
  return load(std::move(k));
}

FfnKernels Context::Impl::ffn_from_set(const detail::BundleSet& set, const KernelLookup& kernel, const char* cache) {
  FfnKernels out;
  out.ir = set.ir;
  out.layout = set.layout.value_or(TwellLayout{});
  for (const std::string& name : set.kernels) out.kernels.push_back(from_binary(*kernel(name), cache));
  for (const std::string& name : set.decode) out.decode.push_back(from_binary(*kernel(name), cache));
  return out;
}

void Context::Impl::record(const std::string& request, detail::BundleSet set, const std::vector<const LoadedKernel*>& loaded) {
  std::lock_guard lock(bundles_mutex);
  for (const LoadedKernel* k : loaded)
    obtained_kernels.emplace(k->source.name, std::make_shared<const detail::BundleKernel>(detail::BundleKernel{k->source, k->binary}));
  set.request = request;
  obtained.insert_or_assign(request, std::move(set));
}

std::vector<std::shared_ptr<const detail::Bundle>> Context::Impl::loaded_bundles() const {
  std::lock_guard lock(bundles_mutex);
  return bundles;
}

std::string Context::Impl::bundle_list(const std::string& request) const {
  const auto bundles = loaded_bundles();
  if (bundles.empty()) return "no bundle is loaded";
  std::string list, near;
  // Sets of the same kind and shape (the first three words of the key) that differ in another field.
  std::string shape = request;
  for (int spaces = 0, i = 0; i < static_cast<int>(request.size()); ++i)
    if (request[i] == ' ' && ++spaces == 3) {
      shape = request.substr(0, i);
      break;
    }
  for (const auto& b : bundles) {
    list += (list.empty() ? "" : ", ") + b->dir().string();
    for (const auto& [held, set] : b->sets())
      if (held.rfind(shape + " ", 0) == 0 && near.size() < 600) near += "\n  held: \"" + held + "\"";
  }
  return "the loaded bundles (" + list + ") do not hold it" + (near.empty() ? "" : "; of its shape they hold:" + near);
}

namespace {
// A bundle's FFN set against the spec that asked for it (the request key names these fields; the
// manifest's set is checked against them too, so an edited one cannot hand a plan another shape).
void check_bundle_set(const detail::Bundle& bundle, const detail::BundleSet& set, const FfnSpec& spec,
                      std::optional<WeightLayout> decode) {
  auto bad = [&](const std::string& what) {
    throw Error(ErrorCode::Parse, fmt::format("bundle {}: set {}: {}", bundle.dir().string(), set.request, what));
  };
  const kernels::KernelSource& gate = bundle.kernel(set.kernels.at(0))->source;
  const kernels::KernelSource& consumer = bundle.kernel(set.kernels.at(1))->source;
  const TwellLayout& l = *set.layout;
  if (gate.d_model != spec.d_model || gate.d_ff != spec.d_ff)
    bad(fmt::format("expected d_model {} and d_ff {}, found {} and {}", spec.d_model, spec.d_ff, gate.d_model, gate.d_ff));
  if (l.value != spec.dtype || l.activation != spec.activation || std::bit_cast<uint32_t>(l.threshold) != std::bit_cast<uint32_t>(spec.threshold))
    bad(fmt::format("layout: expected value {}, activation {} and threshold {}, found {}, {} and {}", to_string(spec.dtype),
                    to_string(spec.activation), spec.threshold, to_string(l.value), to_string(l.activation), l.threshold));
  if ((spec.tile_n && *spec.tile_n != l.tile_n) || (spec.slots && *spec.slots != l.slots))
    bad(fmt::format("layout: expected the spec's tile_n and slots, found {} and {}", l.tile_n, l.slots));
  if (consumer.gated != spec.gated || consumer.down_in_out != (spec.down_layout == WeightLayout::InOut))
    bad("the consumer: expected the spec's gated flag and down layout");
  if (spec.consumer && (*spec.consumer == ConsumerVariant::TokenBlock) != (consumer.consumer == kernels::ConsumerKind::TokenBlock) &&
      *spec.consumer == ConsumerVariant::RowGather)
    bad("the consumer: expected the row gather (FfnSpec::consumer), found the token block");
  for (const std::string& name : set.decode)
    if (decode && bundle.kernel(name)->source.down_in_out != (*decode == WeightLayout::InOut))
      bad(fmt::format("decode kernel {}: expected w_down {}", name, to_string(*decode)));
}

[[noreturn]] void not_found(const char* who, const std::string& request, const std::string& bundles, const ContextOptions& o) {
  throw Error(ErrorCode::NotFound,
              fmt::format("{}: no kernels for \"{}\": {}, and {} (make a bundle for it with `twellc compile`, or link "
                          "twell::jit)", who, request, bundles,
                          o.jit == ContextOptions::Jit::Never ? "ContextOptions::jit is Never" : "twell::jit is not linked"));
}
}  // namespace

FfnKernels Context::Impl::ffn_kernels(const FfnSpec& spec, std::optional<WeightLayout> decode_down_layout, const char* who) {
  const std::string request = detail::ffn_request(spec, target, decode_down_layout);
  // A request without decode kernels is also served by a set of the same spec that has them (a bundle
  // made by `twellc compile`, whose plans decode): its gate and consumer, not its decode kernels.
  std::vector<std::string> servers{request};
  if (!decode_down_layout) {
    for (const WeightLayout l : {WeightLayout::OutIn, WeightLayout::InOut}) servers.push_back(detail::ffn_request(spec, target, l));
    // (bundles written before "decode=none" spelled this request "decode=auto")
    std::string legacy = request;
    if (const size_t at = legacy.find(" decode=none "); at != std::string::npos) servers.push_back(legacy.replace(at, 13, " decode=auto "));
  }
  for (const auto& bundle : loaded_bundles()) {
    for (const std::string& server : servers) {
      const detail::BundleSet* found = bundle->find(server);
      if (!found) continue;
      detail::BundleSet set = *found;
      if (!decode_down_layout) set.decode.clear();
      check_bundle_set(*bundle, set, spec, decode_down_layout);
      // Bundle::load checked that every set's kernels are there.
      FfnKernels out = ffn_from_set(set, [&](const std::string& name) { return bundle->kernel(name); }, "bundle");
      std::vector<const LoadedKernel*> loaded;
      for (const auto* list : {&out.kernels, &out.decode})
        for (const auto& k : *list) loaded.push_back(k.get());
      record(request, std::move(set), loaded);
      return out;
    }
  }
  // Kernels already obtained for this request (Context::add_kernels, or an earlier plan).
  {
    std::unique_lock lock(bundles_mutex);
    auto it = obtained.end();
    for (const std::string& server : servers)
      if ((it = obtained.find(server)) != obtained.end()) break;
    if (it != obtained.end()) {
      // Copied under the lock; the modules are loaded outside it.
      detail::BundleSet set = it->second;
      if (!decode_down_layout) set.decode.clear();
      std::map<std::string, std::shared_ptr<const detail::BundleKernel>> kernels;
      for (const auto* list : {&set.kernels, &set.decode})
        for (const std::string& name : *list) kernels.emplace(name, obtained_kernels.at(name));
      lock.unlock();
      return ffn_from_set(set, [&](const std::string& name) { return kernels.at(name); }, "memory");
    }
  }
  if (!jit) not_found(who, request, bundle_list(request), options);
  kernels::GeneratedFfn generated = jit->generate_ffn(spec, target, decode_down_layout);
  if (!decode_down_layout) generated.decode.clear();  // (the generator's nullopt makes them for the consumer's layout)
  FfnKernels out;
  out.ir = std::move(generated.ir);
  out.layout = generated.layout;
  detail::BundleSet set;
  set.spec = spec;
  set.layout = generated.layout;
  set.ir = out.ir;
  std::vector<kernels::KernelSource> sources = generated.kernels;
  sources.insert(sources.end(), generated.decode.begin(), generated.decode.end());
  std::vector<std::shared_ptr<LoadedKernel>> compiled = compile_and_load(sources);
  std::vector<const LoadedKernel*> loaded;
  for (size_t i = 0; i < compiled.size(); ++i) {
    const bool decode = i >= generated.kernels.size();
    loaded.push_back((decode ? out.decode : out.kernels).emplace_back(std::move(compiled[i])).get());
    (decode ? set.decode : set.kernels).push_back(sources[i].name);
  }
  record(request, std::move(set), loaded);
  return out;
}

std::shared_ptr<LoadedKernel> Context::Impl::auxiliary(kernels::KernelKind kind, const FfnSpec& spec, const char* who,
                                                      KernelReport* report) {
  const std::string request = detail::auxiliary_request(kind, spec, target);
  {
    std::lock_guard lock(auxiliary_mutex);
    if (auto it = auxiliary_loaded.find(request); it != auxiliary_loaded.end()) {
      if (report) {
        *report = it->second->report;
        report->cache = "memory";
        report->compile_ms = report->load_ms = 0;
      }
      return it->second;
    }
  }
  // Found and loaded outside the lock (a JIT compile takes seconds); where two threads race, the first
  // one kept wins and the other's module is unloaded unused.
  const auto keep = [&](std::shared_ptr<LoadedKernel> k) {
    if (report) *report = k->report;
    std::lock_guard lock(auxiliary_mutex);
    return auxiliary_loaded.try_emplace(request, std::move(k)).first->second;
  };
  for (const auto& bundle : loaded_bundles()) {
    if (const detail::BundleSet* set = bundle->find(request)) {
      auto k = from_binary(*bundle->kernel(set->kernels.front()), "bundle");
      record(request, *set, {k.get()});
      return keep(std::move(k));
    }
  }
  if (!jit) not_found(who, request, bundle_list(request), options);
  auto k = load(compile(jit->generate_auxiliary(kind, spec, target)));
  detail::BundleSet set;
  set.kernels = {k->source.name};
  record(request, std::move(set), {k.get()});
  return keep(std::move(k));
}

void Context::add_kernels(const FfnSpec& user_spec, const kernels::GeneratedFfn& generated,
                          std::optional<WeightLayout> decode_down_layout) {
  const FfnSpec spec = kernels::canonical_spec(user_spec);  // the request key Context::plan makes
  auto impl = context_impl(*this);
  auto bad = [](const std::string& what) { throw Error(ErrorCode::InvalidArgument, "Context::add_kernels: " + what); };
  if (generated.kernels.size() != 2 || generated.kernels[0].kind != kernels::KernelKind::GateTwell ||
      generated.kernels[1].kind != kernels::KernelKind::GatedDown)
    bad(fmt::format("generated: expected a gate kernel and a consumer, got {} kernels", generated.kernels.size()));
  const kernels::KernelSource& gate = generated.kernels[0];
  const kernels::KernelSource& consumer = generated.kernels[1];
  if (generated.target.arch() != impl->target.arch())
    bad(fmt::format("generated.target: expected this context's {}, got {}", impl->target.arch(), generated.target.arch()));
  if (gate.d_model != spec.d_model || gate.d_ff != spec.d_ff || consumer.gated != spec.gated ||
      !consumer.down_in_out || spec.down_layout != WeightLayout::InOut)
    bad(fmt::format("spec: expected d_model {}, d_ff {}, gated {} and down_layout in_out (the consumer's), got {}, {}, {} and {}",
                    gate.d_model, gate.d_ff, consumer.gated, spec.d_model, spec.d_ff, spec.gated, to_string(spec.down_layout)));
  const TwellLayout& l = generated.layout;
  if (l.value != spec.dtype || l.activation != spec.activation ||
      std::bit_cast<uint32_t>(l.threshold) != std::bit_cast<uint32_t>(spec.threshold) || spec.tile_n != l.tile_n ||
      spec.slots != l.slots)
    bad("spec: expected the layout's dtype, activation, threshold, tile_n and slots");
  const std::string request = detail::ffn_request(spec, impl->target, decode_down_layout);
  detail::BundleSet set;
  set.spec = spec;
  set.layout = l;
  set.ir = generated.ir;
  std::vector<std::shared_ptr<LoadedKernel>> compiled;
  for (const auto& k : generated.kernels) {
    compiled.push_back(impl->compile(k));
    set.kernels.push_back(k.name);
  }
  for (const auto& k : generated.decode) {
    if (!decode_down_layout) break;  // a request without decode kernels (its key says decode=none)
    if (k.down_in_out != (*decode_down_layout == WeightLayout::InOut))
      bad(fmt::format("decode_down_layout: the decode kernel {} reads w_down {}", k.name, k.down_in_out ? "in_out" : "out_in"));
    compiled.push_back(impl->compile(k));
    set.decode.push_back(k.name);
  }
  std::vector<const LoadedKernel*> pointers;
  for (const auto& k : compiled) pointers.push_back(k.get());
  impl->record(request, std::move(set), pointers);
}

}  // namespace twell
