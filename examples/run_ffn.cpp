// Runs one gated FFN layer through twell's runtime API, the way host code uses it:
// a Context, a plan for the layer's shape, device pointers, a stream.
//   ./build/bin/run_ffn [tokens]
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "twell/context.h"
#include "twell/device_memory.h"
#include "twell/error.h"
#include "twell/half.h"
#include "twell/reference.h"

int main(int argc, char** argv) {
  int64_t tokens = 64;
  if (argc > 1) {
    char* end = nullptr;
    tokens = std::strtoll(argv[1], &end, 10);
    if (argc > 2 || *end != '\0' || tokens < 1 || tokens > (1 << 20)) {
      std::fprintf(stderr, "usage: %s [tokens]   (tokens: 1..1048576, default 64)\n", argv[0]);
      return 2;
    }
  }
  try {
    twell::FfnSpec spec;  // bf16, ReLU gate, threshold 0, nn.Linear weight layouts
    spec.d_model = 512;
    spec.d_ff = 1408;

    twell::Context ctx;
    twell::PlanOptions options;
    options.dispatch = twell::Dispatch::Sparse;  // the TwELL kernels (Auto would pick the faster of TwELL and dense)
    twell::FfnPlan plan = ctx.plan(spec, tokens, options);
    for (const auto& k : plan.kernels())
      std::printf("%s: %s (cache %s, %.1f ms NVRTC)\n", k.kind.c_str(), k.name.c_str(), k.cache.c_str(), k.compile_ms);
    if (!ctx.has_gpu()) {
      std::printf("no GPU (%s): kernels compiled, nothing run\n", ctx.no_gpu_reason().c_str());
      return 0;
    }

    // Host data: random weights (std 0.023); x's column 0 is 1, a bias column: Wg's column 0 shifts
    // every gate pre-activation (std about 0.012) down by 0.02, so about 5% of the gate is active.
    std::mt19937 rng(1);
    std::uniform_real_distribution<float> u(-0.04f, 0.04f);
    auto random = [&](size_t n) {
      std::vector<uint16_t> v(n);
      for (auto& e : v) e = twell::float_to_bf16(u(rng));
      return v;
    };
    std::vector<uint16_t> x = random(tokens * spec.d_model), wg = random(spec.d_ff * spec.d_model),
                          wu = random(spec.d_ff * spec.d_model), wd = random(spec.d_model * spec.d_ff);
    for (int64_t r = 0; r < tokens; ++r) x[r * spec.d_model] = twell::float_to_bf16(1.0f);
    for (int64_t j = 0; j < spec.d_ff; ++j) wg[j * spec.d_model] = twell::float_to_bf16(-0.02f);

    twell::DeviceMemory dx(ctx, x.size() * 2), dwg(ctx, wg.size() * 2), dwu(ctx, wu.size() * 2), dwd(ctx, wd.size() * 2),
        dy(ctx, tokens * spec.d_model * 2);
    dx.upload(x);
    dwg.upload(wg);
    dwu.upload(wu);
    dwd.upload(wd);
    twell::StreamHandle stream(ctx);
    plan.run(stream.get(), {dx.data(), dwg.data(), dwu.data(), dwd.data(), dy.data()}, tokens);
    const twell::OverflowReport overflow = plan.last_overflow(stream.get());  // synchronizes

    const auto y = twell::to_float(twell::DType::BF16, dy.download_vector<uint16_t>(tokens * spec.d_model));
    const auto ref = twell::reference_gated_ffn(spec, x, tokens, {wg, wu, wd});
    size_t active = 0;
    for (uint16_t g : twell::reference_gate(spec, x, tokens, wg)) active += g != 0;
    std::printf("gate density %.2f%%; y[0][0..3] = %g %g %g %g; rel. error vs CPU reference %.2e; %u overflowing tile-rows\n",
                100.0 * active / (tokens * spec.d_ff), y[0], y[1], y[2], y[3], twell::relative_error(y, ref),
                overflow.overflowing_tile_rows);
    return 0;
  } catch (const std::exception& e) {  // twell::Error, and filesystem errors of the host code
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
