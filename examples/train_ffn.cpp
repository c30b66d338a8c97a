// One training step of a gated FFN layer through twell's runtime API (twell/training_plan.h): the
// forward keeps the TwELL matrix of act(g) in a state, the backward returns dx and the three weight
// gradients of L(y) + lambda * l1; checked against the CPU reference (twell/training_reference.h).
//   ./build/bin/train_ffn [tokens]
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "twell/context.h"
#include "twell/device_memory.h"
#include "twell/error.h"
#include "twell/half.h"
#include "twell/reference.h"
#include "twell/training_plan.h"
#include "twell/training_reference.h"

int main(int argc, char** argv) {
  int64_t tokens = 256;
  if (argc > 1) {
    char* end = nullptr;
    tokens = std::strtoll(argv[1], &end, 10);
    if (argc > 2 || *end != '\0' || tokens < 1 || tokens > (1 << 16)) {
      std::fprintf(stderr, "usage: %s [tokens]   (tokens: 1..65536, default 256)\n", argv[0]);
      return 2;
    }
  }
  try {
    twell::FfnSpec spec;  // bf16, ReLU gate, threshold 0, nn.Linear weight layouts
    spec.d_model = 512;
    spec.d_ff = 1408;
    const float lambda = 0.05f;  // the L1 term's coefficient

    twell::Context ctx;
    twell::FfnTrainingPlan plan = twell::FfnTrainingPlan::create(ctx, spec, tokens);
    for (const auto& k : plan.kernels()) std::printf("%s: %s (cache %s)\n", k.kind.c_str(), k.name.c_str(), k.cache.c_str());
    if (!ctx.has_gpu()) {
      std::printf("no GPU (%s): kernels compiled, nothing run\n", ctx.no_gpu_reason().c_str());
      return 0;
    }

    // Host data as run_ffn's: x's column 0 is 1 and Wg's column 0 shifts every gate down (~5% active).
    std::mt19937 rng(1);
    std::uniform_real_distribution<float> u(-0.04f, 0.04f);
    auto random = [&](size_t n, float scale) {
      std::vector<uint16_t> v(n);
      for (auto& e : v) e = twell::float_to_bf16(scale * u(rng));
      return v;
    };
    const size_t K = spec.d_model, N = spec.d_ff;
    std::vector<uint16_t> x = random(tokens * K, 1.0f), wg = random(N * K, 1.0f), wu = random(N * K, 1.0f),
                          wd = random(K * N, 1.0f), dy = random(tokens * K, 25.0f);
    for (int64_t r = 0; r < tokens; ++r) x[r * K] = twell::float_to_bf16(1.0f);
    for (size_t j = 0; j < N; ++j) wg[j * K] = twell::float_to_bf16(-0.02f);

    twell::DeviceMemory d_x(ctx, x.size() * 2), d_wg(ctx, wg.size() * 2), d_wu(ctx, wu.size() * 2),
        d_wd(ctx, wd.size() * 2), d_y(ctx, x.size() * 2), d_dy(ctx, dy.size() * 2), d_dx(ctx, x.size() * 2),
        d_row_l1(ctx, tokens * 4), d_dwg(ctx, N * K * 4), d_dwu(ctx, N * K * 4), d_dwd(ctx, N * K * 4);
    d_x.upload(x);
    d_wg.upload(wg);
    d_wu.upload(wu);
    d_wd.upload(wd);
    d_dy.upload(dy);
    twell::StreamHandle stream(ctx);
    twell::FfnTrainingState state = plan.make_state();  // one per layer awaiting its backward

    const twell::FfnTensors t{d_x.data(), d_wg.data(), d_wu.data(), d_wd.data(), d_y.data()};
    plan.forward(stream.get(), t, tokens, state, static_cast<float*>(d_row_l1.data()));
    twell::FfnGradients g;
    g.dx = d_dx.data();
    g.dw_gate = d_dwg.data();  // fp32 [d_ff, d_model]
    g.dw_up = d_dwu.data();
    g.dw_down = d_dwd.data();  // dWd^T, [d_ff, d_model]: the transpose of the nn.Linear Wd's gradient
    plan.backward(stream.get(), t, d_dy.data(), 0, tokens, state, g, lambda);
    stream.synchronize();

    const twell::HostFfnWeights w{wg, wu, wd};
    const twell::TrainingForward fw = twell::reference_training_forward(spec, x, tokens, w);
    const twell::TrainingGradients ref = twell::reference_training_backward(spec, x, w, fw, dy, lambda);
    double l1 = 0;
    for (float r : d_row_l1.download_vector<float>(tokens)) l1 += r;
    l1 /= double(tokens);
    const auto dx = twell::to_float(twell::DType::BF16, d_dx.download_vector<uint16_t>(x.size()));
    const auto dwd_t = d_dwd.download_vector<float>(N * K);
    std::vector<float> dwd(N * K);  // back to nn.Linear's [d_model, d_ff], as the reference has it
    for (size_t j = 0; j < N; ++j)
      for (size_t k = 0; k < K; ++k) dwd[k * N + j] = dwd_t[j * K + k];
    const double errors[5] = {
        twell::relative_error(twell::to_float(twell::DType::BF16, d_y.download_vector<uint16_t>(x.size())), fw.y),
        twell::relative_error(dx, ref.dx), twell::relative_error(d_dwg.download_vector<float>(N * K), ref.dw_gate),
        twell::relative_error(d_dwu.download_vector<float>(N * K), ref.dw_up), twell::relative_error(dwd, ref.dw_down)};
    std::printf("state %zu bytes; L1 term %.6g (reference %.6g); relative errors vs the CPU reference: y %.2e, dx %.2e, "
                "dWg %.2e, dWu %.2e, dWd %.2e\n",
                state.device_bytes(), l1, fw.l1, errors[0], errors[1], errors[2], errors[3], errors[4]);
    // The bound twell/training.h documents (1e-2 norm-wise; the L1 term to 1e-4 of the reference's).
    bool ok = std::abs(l1 - fw.l1) <= 1e-4 * std::abs(fw.l1) + 1e-30;
    for (const double e : errors) ok = ok && e < 1e-2;
    std::printf("%s\n", ok ? "PASS" : "FAIL: an error above the documented bound");
    return ok ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
