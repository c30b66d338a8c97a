// The arithmetic the CPU references share (reference.cpp, training_reference.cpp): one fp32 dot-product
// order, one way to split work over threads, one wording of size errors. The training reference's
// forward reproduces the inference reference's y bit for bit because both go through these.
#pragma once
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "twell/error.h"
#include "twell/half.h"
#include "twell/reference.h"

namespace twell::reference_detail {

// Runs body(begin, end) over [0, n) split across hardware threads. Each index is computed by exactly
// one thread with the same arithmetic, so results do not depend on the split.
template <class Body>
void parallel_rows(int64_t n, Body body) {
  const int64_t workers = std::clamp<int64_t>(std::thread::hardware_concurrency(), 1, 64);
  const int64_t chunk = (n + workers - 1) / workers;
  std::vector<std::thread> threads;
  for (int64_t b = 0; b < n; b += chunk) threads.emplace_back(body, b, std::min(n, b + chunk));
  for (auto& t : threads) t.join();
}

inline std::vector<float> widen(DType t, std::span<const uint16_t> bits) {
  std::vector<float> f(bits.size());
  for (size_t i = 0; i < bits.size(); ++i) f[i] = to_float(t, bits[i]);
  return f;
}

// sum_k a[k] b[k] with one fma per term, k ascending from +0.
inline float dot(const float* a, const float* b, int64_t n) {
  float s = 0.0f;
  for (int64_t k = 0; k < n; ++k) s = std::fma(a[k], b[k], s);
  return s;
}

inline void check_size(const char* what, size_t got, int64_t want, const std::string& shape) {
  if (static_cast<int64_t>(got) != want)
    throw Error(ErrorCode::InvalidArgument,
                fmt::format("{}: expected {} elements ({}), got {}", what, want, shape, got));
}

inline void check_weights(const FfnSpec& s, const HostFfnWeights& w) {
  const std::string gate_shape = fmt::format("[{}, {}] = [d_ff, d_model]", s.d_ff, s.d_model);
  check_size("w_gate", w.w_gate.size(), s.d_ff * s.d_model, gate_shape);
  if (s.gated)
    check_size("w_up", w.w_up.size(), s.d_ff * s.d_model, gate_shape);
  else
    check_size("w_up", w.w_up.size(), 0, "none: spec.gated = false");
  check_size(
      "w_down", w.w_down.size(), s.d_ff * s.d_model,
      s.down_layout == WeightLayout::OutIn ? fmt::format("[{}, {}] = [d_model, d_ff]", s.d_model, s.d_ff) : gate_shape);
}

}  // namespace twell::reference_detail
