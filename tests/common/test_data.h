// Helpers shared by the unit and GPU tests: random 16-bit tensors with a chosen gate density, and
// where the real data lives.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "twell/half.h"
#include "twell/reference.h"

namespace twell::testing {

// A spec of every field the training tests vary (the layout fields left to the generator).
inline FfnSpec make_spec(int64_t d_model, int64_t d_ff, bool gated, Activation act, float threshold, DType dtype,
                         WeightLayout down) {
  FfnSpec s;
  s.d_model = d_model;
  s.d_ff = d_ff;
  s.gated = gated;
  s.activation = act;
  s.threshold = threshold;
  s.dtype = dtype;
  s.down_layout = down;
  return s;
}

// Whether two fp32 vectors hold the same bits (NaNs included).
inline bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * 4) == 0);
}

// ../shared/data beside the checkout, or $TWELL_DATA_DIR (the GPU machine gets the files carried).
inline std::filesystem::path shared_data_dir() {
  if (const char* d = std::getenv("TWELL_DATA_DIR")) return d;
  return std::filesystem::path(TWELL_SOURCE_DIR) / ".." / "shared" / "data";
}

inline std::filesystem::path sample_path() { return std::filesystem::path(TWELL_SOURCE_DIR) / "tests" / "data" / "tiny_l1.safetensors"; }

inline std::vector<uint16_t> random_bits(DType t, size_t n, float lo, float hi, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<uint16_t> v(n);
  for (auto& e : v) e = from_float(t, dist(rng));
  return v;
}

struct RandomFfn {
  FfnSpec spec;
  int64_t tokens = 0;
  std::vector<uint16_t> x, w_gate, w_up, w_down;
  HostFfnWeights weights() const { return {w_gate, w_up, w_down}; }
};

// x, Wg, Wu, Wd uniform random; column 0 of x is 1 and column 0 of Wg shifts each neuron's
// pre-activation so that `density` of relu(x Wg^T) is nonzero in every column in expectation, as
// PERFORMANCE.md's anchor does. Neuron j's pre-activation over such rows is shift_j + sum_{k>=1} x_k
// w_jk with x_k ~ U(-1, 1) independent: normal by the central limit theorem, with variance
// sigma_j^2 = sum_k w_jk^2 / 3; so shift_j = -sigma_j z with P(N(0, 1) > z) = density.
// (An empirical quantile over a few hundred probe rows, used until v14 of bench/README.md, was biased
// upward: a new row exceeds the k-th largest of n with probability k / (n + 1), so "0.5%" over 128
// probe rows was about 1.2%.)
inline RandomFfn make_random_ffn(const FfnSpec& spec, int64_t tokens, double density, uint32_t seed) {
  RandomFfn f;
  f.spec = spec;
  f.tokens = tokens;
  const int64_t K = spec.d_model, N = spec.d_ff;
  const float wscale = 1.0f / std::sqrt(static_cast<float>(K));
  f.x = random_bits(spec.dtype, tokens * K, -1.0f, 1.0f, seed);
  f.w_gate = random_bits(spec.dtype, N * K, -wscale, wscale, seed + 1);
  f.w_up = random_bits(spec.dtype, N * K, -wscale, wscale, seed + 2);
  f.w_down = random_bits(spec.dtype, N * K, -1.0f / std::sqrt(static_cast<float>(N)), 1.0f / std::sqrt(static_cast<float>(N)), seed + 3);
  for (int64_t r = 0; r < tokens; ++r) f.x[r * K] = from_float(spec.dtype, 1.0f);
  if (!spec.gated) f.w_up.clear();  // no up projection (the other weights keep their seeds)
  // z: the standard normal's (1 - density) quantile, by bisection on P(N(0, 1) > z) = erfc(z / sqrt 2) / 2.
  const double d = std::clamp(density, 1e-9, 1.0 - 1e-9);
  double lo = -40.0, hi = 40.0;
  for (int i = 0; i < 200; ++i) {
    const double mid = 0.5 * (lo + hi);
    (0.5 * std::erfc(mid / std::sqrt(2.0)) > d ? lo : hi) = mid;
  }
  const double z = 0.5 * (lo + hi);
  for (int64_t j = 0; j < N; ++j) {
    double var = 0;
    for (int64_t k = 1; k < K; ++k) {
      const double w = to_float(spec.dtype, f.w_gate[j * K + k]);
      var += w * w / 3.0;
    }
    f.w_gate[j * K] = from_float(spec.dtype, static_cast<float>(-std::sqrt(var) * z));
  }
  return f;
}

}  // namespace twell::testing
