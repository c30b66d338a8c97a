// CPU reference of the training forward and backward (twell/training_reference.h).
#include "twell/training_reference.h"

#include <fmt/format.h>

#include <cmath>
#include <limits>

#include "reference_numerics.h"
#include "twell/error.h"
#include "twell/format.h"
#include "twell/half.h"

namespace twell {

using reference_detail::check_size;
using reference_detail::check_weights;
using reference_detail::dot;
using reference_detail::parallel_rows;
using reference_detail::widen;

namespace {

void check_spec(const char* fn, const FfnSpec& s, int64_t tokens) {
  if (s.d_model <= 0 || s.d_ff <= 0 || s.d_ff > std::numeric_limits<int32_t>::max() || tokens < 0 ||
      tokens > (int64_t{1} << 40))
    throw Error(ErrorCode::InvalidArgument,
                fmt::format("{}: expected d_model >= 1, 1 <= d_ff <= 2^31 - 1 and 0 <= tokens <= 2^40, got d_model {}, "
                            "d_ff {}, tokens {}",
                            fn, s.d_model, s.d_ff, tokens));
  validate_layout(layout_for(s));
}

std::string rows_shape(int64_t tokens, int64_t d_model) {
  return fmt::format("[{}, {}] = [tokens, d_model]", tokens, d_model);
}

// The forward's arrays against each other and against d_ff (a neuron index out of range would make the
// backward read outside the weights).
void check_forward(const FfnSpec& s, const TrainingForward& f) {
  auto bad = [](const std::string& what) {
    throw Error(ErrorCode::InvalidArgument, "reference_training_backward: forward." + what);
  };
  if (f.row_start.size() != static_cast<size_t>(f.tokens) + 1)
    bad(fmt::format("row_start: expected {} elements (tokens + 1), got {}", f.tokens + 1, f.row_start.size()));
  check_size("forward.y", f.y.size(), f.tokens * s.d_model, rows_shape(f.tokens, s.d_model));
  const int64_t nnz = static_cast<int64_t>(f.neuron.size());
  if (f.row_start[0] != 0 || f.row_start[f.tokens] != nnz)
    bad(fmt::format(
        "row_start: expected row_start[0] = 0 and row_start[tokens] = nnz = neuron's size {}, got {} and {}", nnz,
        f.row_start[0], f.row_start[f.tokens]));
  check_size("forward.gate", f.gate.size(), nnz, "[nnz]");
  check_size("forward.act", f.act.size(), nnz, "[nnz]");
  check_size("forward.hidden", f.hidden.size(), nnz, "[nnz]");
  check_size("forward.up", f.up.size(), s.gated ? nnz : 0, s.gated ? "[nnz]" : "none: spec.gated = false");
  for (int64_t t = 0; t < f.tokens; ++t)
    if (f.row_start[t + 1] < f.row_start[t])
      bad(fmt::format("row_start: expected a nondecreasing sequence, got {} then {} at token {}", f.row_start[t],
                      f.row_start[t + 1], t));
  for (int64_t t = 0; t < f.tokens; ++t)
    for (int64_t e = f.row_start[t]; e < f.row_start[t + 1]; ++e)
      if (f.neuron[e] < 0 || f.neuron[e] >= s.d_ff || (e > f.row_start[t] && f.neuron[e] <= f.neuron[e - 1]))
        bad(fmt::format("neuron[{}] (token {}): expected a neuron in [0, {}) above the row's previous one, got {}", e,
                        t, s.d_ff, f.neuron[e]));
}

float sign_of(float h) { return h > 0.0f ? 1.0f : h < 0.0f ? -1.0f : h == 0.0f ? 0.0f : h; }

}  // namespace

float activation_derivative(Activation activation, float g) {
  if (activation == Activation::ReLU) return 1.0f;
  const float s = 1.0f / (1.0f + std::exp(-g));
  return s * (1.0f + g * (1.0f - s));
}

TrainingForward reference_training_forward(const FfnSpec& s, std::span<const uint16_t> x, int64_t tokens,
                                           const HostFfnWeights& w) {
  check_spec("reference_training_forward", s, tokens);
  check_size("x", x.size(), tokens * s.d_model, rows_shape(tokens, s.d_model));
  check_weights(s, w);
  const TwellLayout l = layout_for(s);
  const int64_t K = s.d_model, N = s.d_ff;
  const std::vector<float> xf = widen(s.dtype, x), gf = widen(s.dtype, w.w_gate), uf = widen(s.dtype, w.w_up),
                           df = widen(s.dtype, w.w_down);
  TrainingForward f;
  f.tokens = tokens;
  f.y.assign(tokens * K, 0.0f);
  // Each token's entries first (one thread per token), then concatenated in token order.
  struct RowEntries {
    std::vector<int32_t> neuron;
    std::vector<uint16_t> gate, act;
    std::vector<float> up, hidden;
    double abs_sum = 0.0;
  };
  std::vector<RowEntries> rows(tokens);
  parallel_rows(tokens, [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) {
      const float* xr = &xf[r * K];
      float* yr = &f.y[r * K];
      RowEntries& out = rows[r];
      for (int64_t j = 0; j < N; ++j) {
        const uint16_t g = from_float(s.dtype, dot(xr, &gf[j * K], K));
        const uint16_t a = activate(l, g);
        if (!is_active(l, a)) continue;
        float h = to_float(s.dtype, a);
        if (s.gated) {
          const float u = dot(xr, &uf[j * K], K);
          out.up.push_back(u);
          h *= u;
        }
        out.neuron.push_back(static_cast<int32_t>(j));
        out.gate.push_back(g);
        out.act.push_back(a);
        out.hidden.push_back(h);
        out.abs_sum += std::fabs(static_cast<double>(h));
        for (int64_t i = 0; i < K; ++i)
          yr[i] = std::fma(h, s.down_layout == WeightLayout::OutIn ? df[i * N + j] : df[j * K + i], yr[i]);
      }
    }
  });
  f.row_start.assign(tokens + 1, 0);
  double abs_sum = 0.0;
  for (int64_t r = 0; r < tokens; ++r) {
    RowEntries& row = rows[r];
    f.row_start[r + 1] = f.row_start[r] + static_cast<int64_t>(row.neuron.size());
    f.neuron.insert(f.neuron.end(), row.neuron.begin(), row.neuron.end());
    f.gate.insert(f.gate.end(), row.gate.begin(), row.gate.end());
    f.act.insert(f.act.end(), row.act.begin(), row.act.end());
    f.up.insert(f.up.end(), row.up.begin(), row.up.end());
    f.hidden.insert(f.hidden.end(), row.hidden.begin(), row.hidden.end());
    abs_sum += row.abs_sum;
    row = RowEntries{};
  }
  f.l1 = tokens > 0 ? abs_sum / static_cast<double>(tokens) : 0.0;
  return f;
}

TrainingGradients reference_training_backward(const FfnSpec& s, std::span<const uint16_t> x, const HostFfnWeights& w,
                                              const TrainingForward& f, std::span<const uint16_t> dy, float lambda) {
  check_spec("reference_training_backward", s, f.tokens);
  const int64_t M = f.tokens, K = s.d_model, N = s.d_ff;
  check_size("x", x.size(), M * K, rows_shape(M, K) + " with forward.tokens");
  check_weights(s, w);
  check_size("dy", dy.size(), M * K, rows_shape(M, K) + " with forward.tokens");
  if (!std::isfinite(lambda) || lambda < 0.0f)
    throw Error(ErrorCode::InvalidArgument,
                fmt::format("reference_training_backward: lambda: expected a finite value >= 0, got {}", lambda));
  check_forward(s, f);
  const bool out_in = s.down_layout == WeightLayout::OutIn;
  const std::vector<float> xf = widen(s.dtype, x), gf = widen(s.dtype, w.w_gate), uf = widen(s.dtype, w.w_up),
                           df = widen(s.dtype, w.w_down), dyf = widen(s.dtype, dy);
  const int64_t nnz = static_cast<int64_t>(f.neuron.size());
  const float c = M > 0 ? static_cast<float>(static_cast<double>(lambda) / static_cast<double>(M)) : 0.0f;

  TrainingGradients grad;
  grad.dx.assign(M * K, 0.0f);
  grad.dw_gate.assign(N * K, 0.0f);
  grad.dw_up.assign(s.gated ? N * K : 0, 0.0f);
  grad.dw_down.assign(N * K, 0.0f);
  grad.du.assign(s.gated ? nnz : 0, 0.0f);
  grad.dg.assign(nnz, 0.0f);
  std::vector<float>& du = grad.du;
  std::vector<float>& dg = grad.dg;

  // By token: dh, du, dg on the row's support, then dx.
  parallel_rows(M, [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) {
      const float* dyr = &dyf[r * K];
      float* dxr = &grad.dx[r * K];
      for (int64_t i = f.row_start[r]; i < f.row_start[r + 1]; ++i) {
        const int64_t j = f.neuron[i];
        float dh = 0.0f;
        if (out_in) {
          for (int64_t k = 0; k < K; ++k) dh = std::fma(dyr[k], df[k * N + j], dh);
        } else {
          dh = dot(dyr, &df[j * K], K);
        }
        if (lambda != 0.0f) dh = dh + c * sign_of(f.hidden[i]);
        const float slope = activation_derivative(s.activation, to_float(s.dtype, f.gate[i]));
        if (s.gated) {
          du[i] = dh * to_float(s.dtype, f.act[i]);
          dg[i] = (dh * f.up[i]) * slope;
        } else {
          dg[i] = dh * slope;
        }
      }
      for (int64_t i = f.row_start[r]; i < f.row_start[r + 1]; ++i) {
        const int64_t j = f.neuron[i];
        for (int64_t k = 0; k < K; ++k) {
          if (s.gated) dxr[k] = std::fma(du[i], uf[j * K + k], dxr[k]);
          dxr[k] = std::fma(dg[i], gf[j * K + k], dxr[k]);
        }
      }
    }
  });

  // The support by neuron (tokens ascending): a counting sort of the entries, serial, so the order is fixed.
  std::vector<int64_t> col_start(N + 1, 0);
  for (int64_t i = 0; i < nnz; ++i) ++col_start[f.neuron[i] + 1];
  for (int64_t j = 0; j < N; ++j) col_start[j + 1] += col_start[j];
  std::vector<int64_t> col_entry(nnz), col_token(nnz), fill(col_start.begin(), col_start.end() - 1);
  for (int64_t r = 0; r < M; ++r)
    for (int64_t i = f.row_start[r]; i < f.row_start[r + 1]; ++i) {
      const int64_t p = fill[f.neuron[i]]++;
      col_entry[p] = i;
      col_token[p] = r;
    }

  // By neuron: dWg_j, dWu_j and dWd(:, j).
  parallel_rows(N, [&](int64_t b, int64_t e) {
    for (int64_t j = b; j < e; ++j) {
      float* wg = &grad.dw_gate[j * K];
      float* wu = s.gated ? &grad.dw_up[j * K] : nullptr;
      for (int64_t p = col_start[j]; p < col_start[j + 1]; ++p) {
        const int64_t i = col_entry[p];
        const float* xt = &xf[col_token[p] * K];
        const float* dyt = &dyf[col_token[p] * K];
        for (int64_t k = 0; k < K; ++k) {
          wg[k] = std::fma(dg[i], xt[k], wg[k]);
          if (wu) wu[k] = std::fma(du[i], xt[k], wu[k]);
          float& wd = out_in ? grad.dw_down[k * N + j] : grad.dw_down[j * K + k];
          wd = std::fma(f.hidden[i], dyt[k], wd);
        }
      }
    }
  });
  return grad;
}

}  // namespace twell
