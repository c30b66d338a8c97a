// Helpers shared by the unit and GPU tests: random 16-bit tensors with a chosen gate density, and
// where the real data lives.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "twell/half.h"
#include "twell/reference.h"

namespace twell::testing {

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
// pre-activation so that about `density` of relu(x Wg^T) is nonzero in every column (the shift is
// the column's (1 - density) quantile over `probe_rows` rows of the same distribution), as
// PERFORMANCE.md's anchor does.
inline RandomFfn make_random_ffn(const FfnSpec& spec, int64_t tokens, double density, uint32_t seed,
                                 int64_t probe_rows = 512) {
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
  // Quantiles from auxiliary rows: any token count (even 1) gets the intended density in expectation.
  const std::vector<uint16_t> probe = random_bits(spec.dtype, probe_rows * K, -1.0f, 1.0f, seed + 4);
  std::vector<float> col(probe_rows);
  for (int64_t j = 0; j < N; ++j) {
    for (int64_t r = 0; r < probe_rows; ++r) {
      float s = 0;
      for (int64_t k = 1; k < K; ++k) s += to_float(spec.dtype, probe[r * K + k]) * to_float(spec.dtype, f.w_gate[j * K + k]);
      col[r] = s;
    }
    std::sort(col.begin(), col.end());
    const int64_t at = std::clamp<int64_t>(static_cast<int64_t>((1.0 - density) * probe_rows), 1, probe_rows - 1);
    f.w_gate[j * K] = from_float(spec.dtype, -0.5f * (col[at] + col[at - 1]));
  }
  return f;
}

}  // namespace twell::testing
