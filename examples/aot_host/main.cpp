// aot_host: run an FFN from an ahead-of-time bundle with the runtime alone.
//
//   aot_host BUNDLE_DIR [LAYER.safetensors ...] [--layer N] [--tokens M] [--out Y.bin]
//
// Loads the bundle (made by `twellc compile` for this GPU's target, or for sm_80 with --target sm_80),
// makes the plan of the layer (from the files: real weights and activations, missing up/down weights
// drawn at random with a fixed seed; else the paper's shape, d_model 2048 and d_ff 5632, with seeded
// random inputs), runs it with the TwELL kernels, and writes y's bf16 bits to --out. It prints the
// bundle's load time (reading and verifying every file, then loading the plan's modules), the run's
// time and y's checksum. Exit codes: 0 ran, 1 error, 2 bad usage, 77 no GPU (the bundle was loaded
// and the plan made; nothing ran).
//
// Built in the twell tree as aot_host_jit (TWELL_AOT_HOST_JIT): the same program linking twell::jit,
// with BUNDLE_DIR "-" for none, so its y can be compared with the bundle's.
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "twell/context.h"
#include "twell/device_memory.h"
#include "twell/error.h"
#include "twell/half.h"
#include "twell/layer_data.h"
#include "twell/safetensors.h"

namespace {

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

std::vector<uint16_t> random_bf16(size_t n, float scale, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-scale, scale);
  std::vector<uint16_t> v(n);
  for (auto& e : v) e = twell::float_to_bf16(u(rng));
  return v;
}

int usage(const char* why) {
  std::fprintf(stderr, "aot_host: %s\nusage: aot_host BUNDLE_DIR [LAYER.safetensors ...] [--layer N] [--tokens M] [--out Y.bin] "
               "[--target sm_80]\n", why);
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) return usage("expected a bundle directory, got none");
  if (std::strcmp(argv[1], "--help") == 0 || std::strcmp(argv[1], "-h") == 0) {
    std::printf("usage: aot_host BUNDLE_DIR [LAYER.safetensors ...] [--layer N] [--tokens M] [--out Y.bin] [--target sm_80]\n"
                "  runs the layer of the files (or the paper's shape on seeded random inputs) from the bundle's kernels;\n"
                "  --target: the bundle's target where it is not this GPU's (an sm_80 bundle on an H200)\n");
    return 0;
  }
  const std::string bundle = argv[1];
  std::vector<std::string> files;
  std::optional<int> layer;
  int64_t tokens = 0;
  std::string out, target;
  for (int i = 2; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) throw std::invalid_argument(a + ": expected a value after it");
      return argv[++i];
    };
    try {
      if (a == "--layer") layer = std::stoi(value());
      else if (a == "--tokens") tokens = std::stoll(value());
      else if (a == "--out") out = value();
      else if (a == "--target") target = value();
      else if (a.rfind("--", 0) == 0) return usage(("unknown option " + a).c_str());
      else files.push_back(a);
    } catch (const std::exception& e) {
      return usage(e.what());
    }
  }
  try {
    twell::ContextOptions options;
    if (!target.empty()) {
      const bool specific = target.back() == 'a';
      options.target = twell::Target{std::stoi(target.substr(3, target.size() - 3 - (specific ? 1 : 0))), specific};
    }
    twell::Context ctx(options);
    // The layer: real tensors from safetensors files, or the paper's shape at random.
    twell::LayerData d;
    if (!files.empty()) {
      std::vector<twell::SafeTensors> st;
      for (const auto& f : files) st.push_back(twell::SafeTensors::read(f));
      d = twell::load_layer(st, layer, /*random_up_down_if_missing=*/true);
    } else {
      d.d_model = 2048;
      d.d_ff = 5632;
      d.tokens = tokens > 0 ? tokens : 4096;
      d.x = random_bf16(size_t(d.tokens * d.d_model), 1.0f, 1);
      d.w_gate = random_bf16(size_t(d.d_ff * d.d_model), 0.022f, 2);
      d.w_up = random_bf16(size_t(d.d_ff * d.d_model), 0.022f, 3);
      d.w_down = random_bf16(size_t(d.d_model * d.d_ff), 0.013f, 4);
    }
    if (tokens > 0 && tokens < d.tokens) d.tokens = tokens;
    twell::FfnSpec spec;  // bf16, ReLU, nn.Linear layouts
    spec.d_model = d.d_model;
    spec.d_ff = d.d_ff;
    const auto t0 = std::chrono::steady_clock::now();
    if (bundle != "-") {
      const twell::BundleInfo info = ctx.load_bundle(bundle);
      std::printf("bundle %s: %s, %zu kernels, %zu kernel sets, read and verified in %.1f ms\n", bundle.c_str(),
                  info.target.arch().c_str(), info.kernels, info.kernel_sets, info.load_ms);
    }
    // Sparse: the TwELL kernels on every call (Auto would time them against dense on the first).
    twell::PlanOptions plan_options;
    plan_options.dispatch = twell::Dispatch::Sparse;
    twell::FfnPlan plan = ctx.plan(spec, d.tokens, plan_options);
    const double load_ms = ms_since(t0);
    std::printf("plan: d_model %lld, d_ff %lld, %lld tokens, %zu kernels (%s), bundle + plan load %.1f ms\n",
                static_cast<long long>(d.d_model), static_cast<long long>(d.d_ff), static_cast<long long>(d.tokens),
                plan.kernels().size(), plan.kernels().front().cache.c_str(), load_ms);
    if (!ctx.has_gpu()) {
      std::printf("no GPU: %s; the bundle was loaded and the plan made, nothing was run on a GPU\n", ctx.no_gpu_reason().c_str());
      return 77;
    }
    const size_t x_elems = size_t(d.tokens * d.d_model);
    twell::DeviceMemory x(ctx, x_elems * 2), wg(ctx, d.w_gate.size() * 2), wu(ctx, d.w_up.size() * 2),
        wd(ctx, d.w_down.size() * 2), y(ctx, x_elems * 2);
    x.upload(d.x.data(), x_elems * 2);
    wg.upload(d.w_gate);
    wu.upload(d.w_up);
    wd.upload(d.w_down);
    y.fill(0xFF);  // poisoned: every element must be written
    twell::StreamHandle stream(ctx);
    const twell::FfnTensors t{x.data(), wg.data(), wu.data(), wd.data(), y.data()};
    const auto r0 = std::chrono::steady_clock::now();
    plan.run(stream.get(), t, d.tokens);
    stream.synchronize();
    const double run_ms = ms_since(r0);
    const auto bits = y.download_vector<uint16_t>(x_elems);
    uint64_t hash = 1469598103934665603ull;  // FNV-1a over y's bits
    size_t poisoned = 0;
    for (uint16_t b : bits) {
      hash = (hash ^ (b & 0xFF)) * 1099511628211ull;
      hash = (hash ^ (b >> 8)) * 1099511628211ull;
      poisoned += b == 0xFFFF;
    }
    std::printf("run: %.2f ms (first call), y fnv1a %016llx, %zu elements still poisoned\n", run_ms,
                static_cast<unsigned long long>(hash), poisoned);
    if (!out.empty()) {
      std::ofstream f(out, std::ios::binary);
      f.write(reinterpret_cast<const char*>(bits.data()), static_cast<std::streamsize>(bits.size() * 2));
      f.close();
      if (!f) {
        std::fprintf(stderr, "aot_host: error: writing %s failed\n", out.c_str());
        return 1;
      }
    }
    return poisoned == 0 ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "aot_host: error: %s\n", e.what());
    return 1;
  }
}
