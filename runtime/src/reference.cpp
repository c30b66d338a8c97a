// CPU reference of the gated TwELL FFN (twell/reference.h).
#include "twell/reference.h"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "reference_numerics.h"
#include "twell/error.h"
#include "twell/half.h"
#include "twell/kernels/kernel.h"  // kDefaultTileN, kDefaultSlots

namespace twell {
using reference_detail::check_size;
using reference_detail::check_weights;
using reference_detail::dot;
using reference_detail::parallel_rows;
using reference_detail::widen;

TwellLayout layout_for(const FfnSpec& s) {
  TwellLayout l;
  l.tile_n = s.tile_n.value_or(kernels::kDefaultTileN);
  l.slots = s.slots.value_or(kernels::kDefaultSlots);
  l.value = s.dtype;
  l.activation = s.activation;
  l.threshold = s.threshold;
  return l;
}

std::vector<uint16_t> reference_gate(const FfnSpec& s, std::span<const uint16_t> x, int64_t tokens,
                                     std::span<const uint16_t> w_gate) {
  if (s.d_model <= 0 || s.d_ff <= 0 || tokens < 0 || tokens > (int64_t{1} << 40))
    throw Error(ErrorCode::InvalidArgument, fmt::format("reference_gate: expected d_model, d_ff >= 1 and 0 <= tokens <= 2^40, got "
                                                        "d_model {}, d_ff {}, tokens {}", s.d_model, s.d_ff, tokens));
  check_size("x", x.size(), tokens * s.d_model, fmt::format("[{}, {}] = [tokens, d_model]", tokens, s.d_model));
  check_size("w_gate", w_gate.size(), s.d_ff * s.d_model, fmt::format("[{}, {}] = [d_ff, d_model]", s.d_ff, s.d_model));
  const TwellLayout l = layout_for(s);
  const std::vector<float> xf = widen(s.dtype, x), wf = widen(s.dtype, w_gate);
  std::vector<uint16_t> a(tokens * s.d_ff);
  parallel_rows(tokens, [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r)
      for (int64_t j = 0; j < s.d_ff; ++j) {
        const uint16_t g = from_float(s.dtype, dot(&xf[r * s.d_model], &wf[j * s.d_model], s.d_model));
        const uint16_t v = activate(l, g);
        a[r * s.d_ff + j] = is_active(l, v) ? v : from_float(s.dtype, 0.0f);
      }
  });
  return a;
}

std::vector<float> reference_gated_down(const FfnSpec& s, std::span<const uint16_t> x, const TwellMatrix& h,
                                        const HostFfnWeights& w) {
  check_weights(s, w);
  if (h.d_ff != s.d_ff || h.layout.value != s.dtype)
    throw Error(ErrorCode::InvalidArgument, fmt::format("reference_gated_down: h: expected d_ff {} and values {}, got d_ff {} and {}",
                                                        s.d_ff, to_string(s.dtype), h.d_ff, to_string(h.layout.value)));
  validate_twell(h);
  check_size("x", x.size(), h.rows * s.d_model, fmt::format("[{}, {}] = [tokens, d_model]", h.rows, s.d_model));
  const TwellLayout& l = h.layout;
  const int64_t K = s.d_model, N = s.d_ff, tiles = l.tiles(N), wpr = l.words_per_row(N);
  const std::vector<float> xf = widen(s.dtype, x), gf = widen(s.dtype, w.w_gate), uf = widen(s.dtype, w.w_up),
                           df = widen(s.dtype, w.w_down);
  std::vector<float> y(h.rows * K, 0.0f);
  parallel_rows(h.rows, [&](int64_t b, int64_t e) {
    std::vector<std::pair<int64_t, float>> active;  // (column, a_j) of one tile, ascending
    for (int64_t r = b; r < e; ++r) {
      const float* xr = &xf[r * K];
      float* yr = &y[r * K];
      for (int64_t t = 0; t < tiles; ++t) {
        const uint32_t* hw = &h.words[r * wpr + t * (l.slots + 1)];
        const int64_t n0 = t * l.tile_n, valid = std::min<int64_t>(l.tile_n, N - n0);
        active.clear();
        if (hw[0] <= static_cast<uint32_t>(l.slots)) {
          for (uint32_t i = 0; i < hw[0]; ++i)
            active.emplace_back(n0 + (hw[1 + i] & 0xFFFFu), to_float(s.dtype, static_cast<uint16_t>(hw[1 + i] >> 16)));
        } else {
          for (int64_t c = 0; c < valid; ++c) {
            uint16_t v;
            if (hw[1] != kBackupMissing) {
              v = h.backup[static_cast<size_t>(hw[1]) * l.tile_n + c];
            } else {
              v = activate(l, from_float(s.dtype, dot(xr, &gf[(n0 + c) * K], K)));
            }
            if (is_active(l, v)) active.emplace_back(n0 + c, to_float(s.dtype, v));
          }
        }
        if (s.gated)
          for (auto& [j, a] : active) a *= dot(xr, &uf[j * K], K);
        for (const auto& [j, hj] : active)
          for (int64_t i = 0; i < K; ++i)
            yr[i] = std::fma(hj, s.down_layout == WeightLayout::OutIn ? df[i * N + j] : df[j * K + i], yr[i]);
      }
    }
  });
  return y;
}

std::vector<float> reference_gated_ffn(const FfnSpec& s, std::span<const uint16_t> x, int64_t tokens,
                                       const HostFfnWeights& w, uint32_t backup_capacity) {
  check_weights(s, w);
  const std::vector<uint16_t> a = reference_gate(s, x, tokens, w.w_gate);
  const TwellMatrix h = pack_twell(layout_for(s), a, tokens, s.d_ff, backup_capacity);
  return reference_gated_down(s, x, h, w);
}

std::vector<double> naive_dense_ffn(const FfnSpec& s, std::span<const uint16_t> x, const HostFfnWeights& w,
                                    std::span<const int64_t> rows) {
  check_weights(s, w);
  const TwellLayout l = layout_for(s);
  const int64_t K = s.d_model, N = s.d_ff;
  std::vector<double> y(rows.size() * K, 0.0);
  for (size_t ri = 0; ri < rows.size(); ++ri) {
    const int64_t r = rows[ri];
    if (K <= 0 || r < 0 || r >= static_cast<int64_t>(x.size()) / K)
      throw Error(ErrorCode::InvalidArgument, fmt::format("naive_dense_ffn: rows[{}] = {} is outside x", ri, r));
    for (int64_t j = 0; j < N; ++j) {
      double g = 0.0, u = s.gated ? 0.0 : 1.0;
      for (int64_t k = 0; k < K; ++k) {
        const double xv = to_float(s.dtype, x[r * K + k]);
        g += xv * to_float(s.dtype, w.w_gate[j * K + k]);
        if (s.gated) u += xv * to_float(s.dtype, w.w_up[j * K + k]);
      }
      const uint16_t a = activate(l, from_float(s.dtype, static_cast<float>(g)));
      const double h = is_active(l, a) ? to_float(s.dtype, a) * u : 0.0;
      for (int64_t i = 0; i < K; ++i)
        y[ri * K + i] += h * to_float(s.dtype, s.down_layout == WeightLayout::OutIn ? w.w_down[i * N + j] : w.w_down[j * K + i]);
    }
  }
  return y;
}

namespace {
template <class Ref>
double relative_error_impl(std::span<const float> out, std::span<const Ref> ref) {
  if (out.size() != ref.size())
    throw Error(ErrorCode::InvalidArgument,
                fmt::format("relative_error: out has {} elements, ref has {}", out.size(), ref.size()));
  double num = 0.0, den = 0.0;
  for (size_t i = 0; i < out.size(); ++i) {
    const bool on = std::isnan(out[i]), rn = std::isnan(static_cast<double>(ref[i]));
    if (on && rn) continue;
    if (on != rn) return INFINITY;
    const double d = static_cast<double>(out[i]) - static_cast<double>(ref[i]);
    num += d * d;
    den += static_cast<double>(ref[i]) * static_cast<double>(ref[i]);
  }
  if (den == 0.0) return num == 0.0 ? 0.0 : INFINITY;
  return std::sqrt(num / den);
}
}  // namespace

double relative_error(std::span<const float> out, std::span<const float> ref) { return relative_error_impl(out, ref); }
double relative_error(std::span<const float> out, std::span<const double> ref) { return relative_error_impl(out, ref); }

std::vector<float> to_float(DType dtype, std::span<const uint16_t> bits) { return widen(dtype, bits); }

}  // namespace twell
