// The training reference (twell/training_reference.h) against calculus and against an independent
// float64 dense computation of the four gradients.
//
// Inputs are quantized so that the fp32 gate and up dot products are exact: x = n / 16 (|n| <= 16),
// weights = n / 256, so each product is a multiple of 2^-12 and every partial sum (|g| < 2^11 here)
// fits fp32's 24 bits. The float64 oracle then sees the very g the reference rounds, and the only
// differences left are the reference's fp32 roundings after g: a tolerance of 1e-5 (relative, in norm)
// covers those (each output sums at most a few hundred fp32 terms, error about sqrt(n) 2^-24 relative
// to the sum of magnitudes) and is a thousand times below what any wrong term, index or transpose gives.
#include "twell/training_reference.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "test_data.h"
#include "twell/error.h"
#include "twell/format.h"
#include "twell/half.h"
#include "twell/reference.h"

using namespace twell;
using twell::testing::make_spec;

namespace {

struct Problem {
  FfnSpec spec;
  int64_t tokens = 0;
  float lambda = 0.0f;
  std::vector<uint16_t> x, w_gate, w_up, w_down, dy;
  HostFfnWeights weights() const { return {w_gate, w_up, w_down}; }
};


std::string describe(const FfnSpec& s, int64_t tokens, float lambda) {
  return std::string(s.gated ? "gated " : "non-gated ") + to_string(s.activation) + " threshold " +
         std::to_string(s.threshold) + " " + to_string(s.dtype) + " " + to_string(s.down_layout) + " tokens " +
         std::to_string(tokens) + " d_model " + std::to_string(s.d_model) + " d_ff " + std::to_string(s.d_ff) +
         " lambda " + std::to_string(lambda);
}

// Integers in [-m, m] times 2^-shift, as dtype bits (exact in bf16 and f16 for the m used here; a
// larger bf16 value is still a multiple of 2^-shift).
std::vector<uint16_t> quantized(DType t, int64_t n, int m, int shift, std::mt19937& rng) {
  std::uniform_int_distribution<int> dist(-m, m);
  std::vector<uint16_t> v(n);
  for (auto& e : v) e = from_float(t, std::ldexp(static_cast<float>(dist(rng)), -shift));
  return v;
}

// The bias trick of the tuner (tests/common/test_data.h): column 0 of x is 1 and column 0 of Wg
// shifts neuron j's pre-activation to -sigma_j z with P(N(0, 1) > z) = density, so that about
// `density` of a ReLU gate is active. lambda = lambda_per_token * tokens, i.e. the backward's
// coefficient lambda / tokens = lambda_per_token: 0.25 makes the L1 term as large as dy Wd, so that a
// wrong sign term shows.
Problem make_problem(const FfnSpec& spec, int64_t tokens, double density, float lambda_per_token, uint32_t seed) {
  std::mt19937 rng(seed);
  Problem p;
  p.spec = spec;
  p.tokens = tokens;
  p.lambda = lambda_per_token * static_cast<float>(tokens);
  const int64_t K = spec.d_model, N = spec.d_ff;
  const int mw = std::max(1, static_cast<int>(std::lround(256.0 / std::sqrt(static_cast<double>(K)))));
  const int md = std::max(1, static_cast<int>(std::lround(256.0 / std::sqrt(static_cast<double>(N)))));
  p.x = quantized(spec.dtype, tokens * K, 16, 4, rng);
  p.w_gate = quantized(spec.dtype, N * K, mw, 8, rng);
  if (spec.gated) p.w_up = quantized(spec.dtype, N * K, mw, 8, rng);
  p.w_down = quantized(spec.dtype, N * K, md, 8, rng);
  p.dy = quantized(spec.dtype, tokens * K, 16, 4, rng);
  for (int64_t r = 0; r < tokens; ++r) p.x[r * K] = from_float(spec.dtype, 1.0f);
  double lo = -40.0, hi = 40.0;
  for (int i = 0; i < 200; ++i) {
    const double mid = 0.5 * (lo + hi);
    (0.5 * std::erfc(mid / std::sqrt(2.0)) > density ? lo : hi) = mid;
  }
  const double z = 0.5 * (lo + hi), x_square = 2.0 * 1496.0 / (33.0 * 256.0);  // E[(n/16)^2], n in [-16, 16]
  for (int64_t j = 0; j < N; ++j) {
    double var = 0.0;
    for (int64_t k = 1; k < K; ++k) var += std::pow(to_float(spec.dtype, p.w_gate[j * K + k]), 2) * x_square;
    p.w_gate[j * K] = from_float(spec.dtype, std::ldexp(std::round(-std::sqrt(var) * z * 256.0), -8));
  }
  return p;
}

// ---- The float64 world ----

struct Dense64 {
  FfnSpec spec;
  int64_t M = 0, K = 0, N = 0;
  double lambda = 0.0;
  std::vector<double> x, wg, wu, wd, dy;
  size_t down_index(int64_t i, int64_t j) const {
    return spec.down_layout == WeightLayout::OutIn ? i * N + j : j * K + i;
  }
};

Dense64 to_double(const Problem& p) {
  Dense64 d;
  d.spec = p.spec;
  d.M = p.tokens;
  d.K = p.spec.d_model;
  d.N = p.spec.d_ff;
  d.lambda = p.lambda;
  auto widen = [&](const std::vector<uint16_t>& v) {
    std::vector<double> o(v.size());
    for (size_t i = 0; i < v.size(); ++i) o[i] = to_float(p.spec.dtype, v[i]);
    return o;
  };
  d.x = widen(p.x);
  d.wg = widen(p.w_gate);
  d.wu = widen(p.w_up);
  d.wd = widen(p.w_down);
  d.dy = widen(p.dy);
  return d;
}

double silu64(double g) { return g / (1.0 + std::exp(-g)); }
double silu_slope64(double g) {
  const double s = 1.0 / (1.0 + std::exp(-g));
  return s * (1.0 + g * (1.0 - s));
}

// Per (token, neuron), [M, N]: the pre-activations, the activation, its slope and the predicate.
struct Hidden64 {
  std::vector<double> g, a, u, slope;
  std::vector<char> active;
  std::vector<uint16_t> g_bits, a_bits;  // hidden_rounded only
};

double row_dot(const std::vector<double>& x, const std::vector<double>& w, int64_t t, int64_t j, int64_t K) {
  double s = 0.0;
  for (int64_t k = 0; k < K; ++k) s += x[t * K + k] * w[j * K + k];
  return s;
}

// No rounding anywhere: the function the finite differences differentiate.
Hidden64 hidden_exact(const Dense64& p) {
  Hidden64 h;
  const size_t n = p.M * p.N;
  h.g.resize(n), h.a.resize(n), h.u.resize(n), h.slope.resize(n), h.active.resize(n);
  const double t = p.spec.threshold;
  for (int64_t r = 0; r < p.M; ++r)
    for (int64_t j = 0; j < p.N; ++j) {
      const size_t e = r * p.N + j;
      const double g = row_dot(p.x, p.wg, r, j, p.K);
      h.g[e] = g;
      h.u[e] = p.spec.gated ? row_dot(p.x, p.wu, r, j, p.K) : 1.0;
      if (p.spec.activation == Activation::ReLU) {
        h.active[e] = g > t;
        h.slope[e] = 1.0;
        h.a[e] = h.active[e] ? g : 0.0;
      } else {
        h.active[e] = std::fabs(silu64(g)) > t;
        h.slope[e] = silu_slope64(g);
        h.a[e] = h.active[e] ? silu64(g) : 0.0;
      }
    }
  return h;
}

// The spec's roundings: g to the dtype, a = activate(g) (format.h, the definition the inference
// reference uses) and its predicate. The float64 g is exact in fp32 by construction (checked).
Hidden64 hidden_rounded(const Dense64& p) {
  Hidden64 h;
  const size_t n = p.M * p.N;
  h.g.resize(n), h.a.resize(n), h.u.resize(n), h.slope.resize(n), h.active.resize(n), h.g_bits.resize(n),
      h.a_bits.resize(n);
  const TwellLayout l = layout_for(p.spec);
  for (int64_t r = 0; r < p.M; ++r)
    for (int64_t j = 0; j < p.N; ++j) {
      const size_t e = r * p.N + j;
      const double g = row_dot(p.x, p.wg, r, j, p.K);
      EXPECT_EQ(static_cast<double>(static_cast<float>(g)), g) << "the generator's g must be exact in fp32";
      h.g_bits[e] = from_float(p.spec.dtype, static_cast<float>(g));
      h.a_bits[e] = activate(l, h.g_bits[e]);
      h.active[e] = is_active(l, h.a_bits[e]);
      h.g[e] = to_float(p.spec.dtype, h.g_bits[e]);
      h.a[e] = h.active[e] ? to_float(p.spec.dtype, h.a_bits[e]) : 0.0;
      h.u[e] = p.spec.gated ? row_dot(p.x, p.wu, r, j, p.K) : 1.0;
      h.slope[e] = p.spec.activation == Activation::ReLU ? 1.0 : silu_slope64(h.g[e]);
    }
  return h;
}

struct Result64 {
  std::vector<double> y, dx, dwg, dwu, dwd;
  double l1 = 0.0;
};

double sign64(double v) { return v > 0 ? 1.0 : v < 0 ? -1.0 : 0.0; }

// The forward and the four gradients by TRAINING.md's formulas, dense over every (token, neuron).
Result64 dense64(const Dense64& p, const Hidden64& hs) {
  Result64 o;
  const int64_t M = p.M, K = p.K, N = p.N;
  o.y.assign(M * K, 0.0), o.dx.assign(M * K, 0.0), o.dwg.assign(N * K, 0.0), o.dwd.assign(N * K, 0.0);
  o.dwu.assign(p.spec.gated ? N * K : 0, 0.0);
  for (int64_t t = 0; t < M; ++t)
    for (int64_t j = 0; j < N; ++j) {
      const size_t e = t * N + j;
      if (!hs.active[e]) continue;
      const double a = hs.a[e], u = hs.u[e], h = a * u;
      o.l1 += std::fabs(h);
      double dh = 0.0;
      for (int64_t i = 0; i < K; ++i) {
        o.y[t * K + i] += h * p.wd[p.down_index(i, j)];
        dh += p.dy[t * K + i] * p.wd[p.down_index(i, j)];
        o.dwd[p.down_index(i, j)] += h * p.dy[t * K + i];
      }
      if (p.lambda != 0.0) dh += p.lambda / static_cast<double>(M) * sign64(h);
      const double du = dh * a, dg = dh * u * hs.slope[e];
      for (int64_t k = 0; k < K; ++k) {
        o.dx[t * K + k] += dg * p.wg[j * K + k] + (p.spec.gated ? du * p.wu[j * K + k] : 0.0);
        o.dwg[j * K + k] += dg * p.x[t * K + k];
        if (p.spec.gated) o.dwu[j * K + k] += du * p.x[t * K + k];
      }
    }
  o.l1 = M > 0 ? o.l1 / static_cast<double>(M) : 0.0;
  return o;
}

// L = sum(y * dy) + lambda * sum|h| / M in float64 without roundings: its own forward loop.
double loss64(const Dense64& p) {
  const Hidden64 hs = hidden_exact(p);
  double loss = 0.0, l1 = 0.0;
  for (int64_t t = 0; t < p.M; ++t)
    for (int64_t j = 0; j < p.N; ++j) {
      const size_t e = t * p.N + j;
      if (!hs.active[e]) continue;
      const double h = hs.a[e] * hs.u[e];
      l1 += std::fabs(h);
      for (int64_t i = 0; i < p.K; ++i) loss += h * p.wd[p.down_index(i, j)] * p.dy[t * p.K + i];
    }
  return loss + p.lambda * l1 / static_cast<double>(p.M);
}

// max |central difference - analytic| over one tensor, relative to max(1, max |analytic|). The loss is
// a polynomial of degree <= 2 in any one input on a region where no predicate or sign flips (ReLU),
// so the central difference is exact up to float64 roundoff (about 1e-16 |L| / eps); for SiLU the
// truncation error is eps^2 |L'''| / 6, about 1e-10.
double finite_difference_error(Dense64 p, std::vector<double> Dense64::*tensor, const std::vector<double>& analytic) {
  const double eps = 1e-5;
  std::vector<double>& v = p.*tensor;
  double scale = 1.0, worst = 0.0;
  for (double a : analytic) scale = std::max(scale, std::fabs(a));
  for (size_t i = 0; i < v.size(); ++i) {
    const double saved = v[i];
    v[i] = saved + eps;
    const double plus = loss64(p);
    v[i] = saved - eps;
    const double minus = loss64(p);
    v[i] = saved;
    worst = std::max(worst, std::fabs((plus - minus) / (2 * eps) - analytic[i]));
  }
  return worst / scale;
}

// Finite differences are valid when every predicate and sign(h) keeps its value within eps of the
// inputs (a perturbation of 1e-5 moves g or u by at most 2e-5 here), and the rounded and exact
// worlds agree on the support (so that they differ only by the roundings of g and a).
bool far_from_kinks(const Dense64& p, const Hidden64& exact, const Hidden64& rounded) {
  const double margin = 1e-3, t = p.spec.threshold;
  int64_t active = 0;
  for (size_t e = 0; e < exact.g.size(); ++e) {
    const double g = exact.g[e];
    const double edge = p.spec.activation == Activation::ReLU ? g - t : std::fabs(silu64(g)) - t;
    if (std::fabs(edge) < margin || exact.active[e] != rounded.active[e]) return false;
    if (exact.active[e] && p.spec.gated && std::fabs(exact.u[e]) < margin) return false;
    active += exact.active[e];
  }
  return active > 0;
}

double unit_roundoff(DType t) { return t == DType::BF16 ? 0x1p-8 : 0x1p-11; }

double norm(const std::vector<double>& v) {
  double s = 0.0;
  for (double e : v) s += e * e;
  return std::sqrt(s);
}

template <class T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0);
}

// A problem for the finite-difference test: the first seed from `seed` whose inputs are far from kinks.
Problem problem_far_from_kinks(const FfnSpec& spec, int64_t tokens, double density, uint32_t seed) {
  for (uint32_t s = seed; s < seed + 200; ++s) {
    Problem p = make_problem(spec, tokens, density, 0.25f, s);
    const Dense64 d = to_double(p);
    if (far_from_kinks(d, hidden_exact(d), hidden_rounded(d))) return p;
  }
  ADD_FAILURE() << "no seed in 200 gives inputs far from the kinks: " << describe(spec, tokens, 0.0f);
  return {};
}

// The reference against dense64 with the spec's roundings: support, saved activations, y, l1 and the
// gradients.
void expect_matches_dense(const Problem& p) {
  SCOPED_TRACE(describe(p.spec, p.tokens, p.lambda));
  const Dense64 d = to_double(p);
  const Hidden64 hs = hidden_rounded(d);
  const Result64 want = dense64(d, hs);
  const TrainingForward f = reference_training_forward(p.spec, p.x, p.tokens, p.weights());
  ASSERT_EQ(f.tokens, p.tokens);
  ASSERT_EQ(f.row_start.size(), static_cast<size_t>(p.tokens + 1));
  int64_t e = 0;
  for (int64_t t = 0; t < p.tokens; ++t) {
    ASSERT_EQ(f.row_start[t], e);
    for (int64_t j = 0; j < p.spec.d_ff; ++j) {
      const size_t i = t * p.spec.d_ff + j;
      if (!hs.active[i]) continue;
      ASSERT_LT(e, static_cast<int64_t>(f.neuron.size()));
      ASSERT_EQ(f.neuron[e], j) << "token " << t;
      EXPECT_EQ(f.gate[e], hs.g_bits[i]);
      EXPECT_EQ(f.act[e], hs.a_bits[i]);
      if (p.spec.gated) {
        EXPECT_EQ(f.up[e], hs.u[i]) << "u is exact by construction";
      }
      ++e;
    }
  }
  ASSERT_EQ(f.row_start[p.tokens], e);
  ASSERT_GT(e, 0) << "no active entry: the comparison would be on zeros";
  EXPECT_EQ(f.up.size(), p.spec.gated ? f.neuron.size() : 0u);
  EXPECT_TRUE(same_bits(f.y, reference_gated_ffn(p.spec, p.x, p.tokens, p.weights())))
      << "y differs from the inference reference's";
  EXPECT_LT(relative_error(f.y, want.y), 1e-5);
  EXPECT_NEAR(f.l1, want.l1, 1e-6 * want.l1);

  const TrainingGradients g = reference_training_backward(p.spec, p.x, p.weights(), f, p.dy, p.lambda);
  ASSERT_GT(norm(want.dx), 0.0);
  ASSERT_GT(norm(want.dwg), 0.0);
  ASSERT_GT(norm(want.dwd), 0.0);
  EXPECT_LT(relative_error(g.dx, want.dx), 1e-5) << "dx";
  EXPECT_LT(relative_error(g.dw_gate, want.dwg), 1e-5) << "dWg";
  EXPECT_LT(relative_error(g.dw_down, want.dwd), 1e-5) << "dWd";
  if (p.spec.gated) {
    ASSERT_GT(norm(want.dwu), 0.0);
    EXPECT_LT(relative_error(g.dw_up, want.dwu), 1e-5) << "dWu";
  } else {
    EXPECT_TRUE(g.dw_up.empty());
  }
}

template <class F>
void expect_invalid(F&& call, std::initializer_list<const char*> words) {
  try {
    call();
    ADD_FAILURE() << "no error; expected one naming " << *words.begin();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::InvalidArgument) << e.what();
    for (const char* w : words)
      EXPECT_NE(std::string(e.what()).find(w), std::string::npos) << e.what() << " lacks " << w;
  }
}

}  // namespace

// silu'(g) = s (1 + g (1 - s)) against central differences of silu in float64; ReLU's slope is 1.
TEST(TrainingReference, ActivationDerivative) {
  for (double g = -8.0; g <= 8.0; g += 0.37) {
    const double h = 1e-4, fd = (silu64(g + h) - silu64(g - h)) / (2 * h);
    EXPECT_NEAR(activation_derivative(Activation::SiLU, static_cast<float>(g)), fd, 1e-6) << "g = " << g;
    EXPECT_EQ(activation_derivative(Activation::ReLU, static_cast<float>(g)), 1.0f);
  }
}

// The float64 analytic gradients (dense64 on the unrounded function) against central differences of
// the float64 loss, for every element of x, Wg, Wu and Wd; then the reference, on the same 16-bit
// inputs, against those float64 gradients. The reference rounds g (and SiLU's a) to the dtype, which
// the float64 function does not: per entry, a relative change of at most u (ReLU: a = g, rounded once)
// or at most about 4.3u for SiLU (g then a rounded: u |g silu'(g) / silu(g)| + u, and the ratio is at
// most 3.3 where |silu(g)| > 0.05, i.e. g > -4.3), and act'(g) moves by at most max|silu''| |dg| =
// 0.5 u |g|. Sums of such terms keep the bound in norm up to mild cancellation, so 8u (u = 2^-8 for
// bf16, 2^-11 for f16) bounds the gap (observed: below u); a wrong term, index or transpose gives an
// error of order 1.
TEST(TrainingReference, GradientsMatchFiniteDifferences) {
  struct Case {
    bool gated;
    Activation act;
    float threshold;
    DType dtype;
    WeightLayout down;
    int64_t tokens, d_model, d_ff;
    float lambda_per_token;
  };
  const Case cases[] = {
      {true, Activation::ReLU, 0.0f, DType::BF16, WeightLayout::OutIn, 7, 24, 48, 0.25f},
      {true, Activation::ReLU, 0.0f, DType::FP16, WeightLayout::InOut, 5, 16, 24, 0.0f},
      {true, Activation::ReLU, 0.25f, DType::BF16, WeightLayout::InOut, 5, 12, 24, 0.25f},
      {true, Activation::SiLU, 0.05f, DType::BF16, WeightLayout::OutIn, 4, 16, 20, 0.25f},
      {true, Activation::SiLU, 0.05f, DType::FP16, WeightLayout::InOut, 3, 8, 16, 0.25f},
      {false, Activation::ReLU, 0.0f, DType::BF16, WeightLayout::InOut, 5, 12, 24, 0.25f},
      {false, Activation::ReLU, 0.25f, DType::FP16, WeightLayout::OutIn, 4, 16, 20, 0.0f},
      {false, Activation::SiLU, 0.05f, DType::BF16, WeightLayout::OutIn, 5, 12, 24, 0.25f},
      {false, Activation::SiLU, 0.05f, DType::FP16, WeightLayout::InOut, 3, 8, 16, 0.25f},
  };
  uint32_t seed = 100;
  for (const Case& c : cases) {
    const FfnSpec spec = make_spec(c.d_model, c.d_ff, c.gated, c.act, c.threshold, c.dtype, c.down);
    Problem p = problem_far_from_kinks(spec, c.tokens, 0.4, seed += 1000);
    p.lambda = c.lambda_per_token * static_cast<float>(c.tokens);
    SCOPED_TRACE(describe(spec, c.tokens, p.lambda));
    const Dense64 d = to_double(p);
    const Result64 want = dense64(d, hidden_exact(d));
    EXPECT_LT(finite_difference_error(d, &Dense64::x, want.dx), 1e-7) << "dx";
    EXPECT_LT(finite_difference_error(d, &Dense64::wg, want.dwg), 1e-7) << "dWg";
    EXPECT_LT(finite_difference_error(d, &Dense64::wd, want.dwd), 1e-7) << "dWd";
    if (c.gated) {
      EXPECT_LT(finite_difference_error(d, &Dense64::wu, want.dwu), 1e-7) << "dWu";
    }

    const TrainingForward f = reference_training_forward(spec, p.x, p.tokens, p.weights());
    const TrainingGradients g = reference_training_backward(spec, p.x, p.weights(), f, p.dy, p.lambda);
    const double tol = 8 * unit_roundoff(c.dtype);
    ASSERT_GT(norm(want.dx) * norm(want.dwg) * norm(want.dwd), 0.0);
    EXPECT_LT(relative_error(f.y, want.y), tol) << "y";
    EXPECT_NEAR(f.l1, want.l1, tol * want.l1);
    EXPECT_LT(relative_error(g.dx, want.dx), tol) << "dx";
    EXPECT_LT(relative_error(g.dw_gate, want.dwg), tol) << "dWg";
    EXPECT_LT(relative_error(g.dw_down, want.dwd), tol) << "dWd";
    if (c.gated) {
      EXPECT_LT(relative_error(g.dw_up, want.dwu), tol) << "dWu";
    }
  }
}

// The finite-difference check has the power to fail: SiLU's slope taken as s(g) (a classic slip), or
// the L1 term's sign(h) dropped, is rejected by orders of magnitude.
TEST(TrainingReference, FiniteDifferencesRejectWrongGradients) {
  const FfnSpec spec = make_spec(12, 24, true, Activation::SiLU, 0.05f, DType::BF16, WeightLayout::OutIn);
  const Problem p = problem_far_from_kinks(spec, 4, 0.4, 7);
  const Dense64 d = to_double(p);
  ASSERT_GT(d.lambda, 0.0);
  Hidden64 wrong_slope = hidden_exact(d);
  for (size_t e = 0; e < wrong_slope.g.size(); ++e) wrong_slope.slope[e] = 1.0 / (1.0 + std::exp(-wrong_slope.g[e]));
  EXPECT_GT(finite_difference_error(d, &Dense64::wg, dense64(d, wrong_slope).dwg), 1e-3);
  Dense64 no_l1 = d;
  no_l1.lambda = 0.0;
  EXPECT_GT(finite_difference_error(d, &Dense64::wu, dense64(no_l1, hidden_exact(d)).dwu), 1e-3);
}

// Densities from 0.1% to 20% by the bias trick, on a gated ReLU layer with the L1 term.
TEST(TrainingReference, MatchesDenseFloat64AtManyDensities) {
  uint32_t seed = 1;
  for (double density : {0.001, 0.01, 0.05, 0.2})
    for (bool gated : {true, false}) {
      const FfnSpec spec = make_spec(40, 300, gated, Activation::ReLU, 0.0f, DType::BF16, WeightLayout::OutIn);
      expect_matches_dense(make_problem(spec, 48, density, 0.25f, seed++));
    }
}

// Every variant: gated or not, ReLU (thresholds 0 and 0.25) and SiLU (0.05), bf16 and f16, both Wd
// layouts, lambda 0 and > 0.
TEST(TrainingReference, MatchesDenseFloat64InEveryVariant) {
  uint32_t seed = 500;
  for (bool gated : {true, false})
    for (WeightLayout down : {WeightLayout::OutIn, WeightLayout::InOut})
      for (DType dtype : {DType::BF16, DType::FP16})
        for (auto [act, threshold] : {std::pair{Activation::ReLU, 0.0f}, std::pair{Activation::ReLU, 0.25f},
                                      std::pair{Activation::SiLU, 0.05f}})
          for (float lambda_per_token : {0.0f, 0.25f}) {
            const FfnSpec spec = make_spec(24, 80, gated, act, threshold, dtype, down);
            expect_matches_dense(make_problem(spec, 12, 0.1, lambda_per_token, seed++));
          }
}

// One token, seven tokens, d_model 520 (few rows: the float64 oracle is O(tokens d_model d_ff)), a
// d_ff that is no multiple of anything.
TEST(TrainingReference, MatchesDenseFloat64OnOddShapes) {
  expect_matches_dense(make_problem(make_spec(8, 16, true, Activation::ReLU, 0.0f, DType::BF16, WeightLayout::OutIn), 1,
                                    0.3, 0.25f, 11));
  expect_matches_dense(make_problem(make_spec(520, 64, true, Activation::ReLU, 0.0f, DType::BF16, WeightLayout::InOut),
                                    7, 0.1, 0.25f, 12));
  expect_matches_dense(make_problem(
      make_spec(520, 64, false, Activation::SiLU, 0.05f, DType::FP16, WeightLayout::OutIn), 7, 0.1, 0.25f, 13));
  expect_matches_dense(make_problem(make_spec(33, 257, true, Activation::SiLU, 0.05f, DType::FP16, WeightLayout::OutIn),
                                    7, 0.05, 0.0f, 14));
}

// A token with no active neuron contributes exactly nothing: dx = +0 on its row, and its dy can be
// anything without changing one bit of the other outputs. A token on which every neuron is active is
// handled like any other (the dense oracle agrees).
TEST(TrainingReference, ZeroAndFullRows) {
  for (bool gated : {true, false})
    for (auto [act, threshold] : {std::pair{Activation::ReLU, 0.0f}, std::pair{Activation::SiLU, 0.05f}}) {
      const FfnSpec spec = make_spec(24, 64, gated, act, threshold, DType::BF16, WeightLayout::OutIn);
      Problem p = make_problem(spec, 9, 0.05, 0.25f, 21);
      const int64_t K = spec.d_model;
      for (int64_t r : {0, 4}) {  // ReLU: x = e_0, so g_j = Wg's negative bias; SiLU: x = 0, so g = 0
        for (int64_t k = 0; k < K; ++k) p.x[r * K + k] = from_float(spec.dtype, 0.0f);
        if (act == Activation::ReLU) p.x[r * K] = from_float(spec.dtype, 1.0f);
      }
      for (int64_t r : {2, 8}) {  // x = -2 e_0: g_j = twice the bias's magnitude, well above the thresholds
        for (int64_t k = 0; k < K; ++k) p.x[r * K + k] = from_float(spec.dtype, 0.0f);
        p.x[r * K] = from_float(spec.dtype, -2.0f);
      }
      SCOPED_TRACE(describe(spec, p.tokens, p.lambda));
      const TrainingForward f = reference_training_forward(spec, p.x, p.tokens, p.weights());
      for (int64_t r : {0, 4}) EXPECT_EQ(f.row_start[r + 1] - f.row_start[r], 0) << "token " << r;
      for (int64_t r : {2, 8}) EXPECT_EQ(f.row_start[r + 1] - f.row_start[r], spec.d_ff) << "token " << r;
      expect_matches_dense(p);

      const TrainingGradients g = reference_training_backward(spec, p.x, p.weights(), f, p.dy, p.lambda);
      for (int64_t r : {0, 4})
        for (int64_t k = 0; k < K; ++k) EXPECT_EQ(std::bit_cast<uint32_t>(g.dx[r * K + k]), 0u) << "token " << r;
      Problem q = p;
      std::mt19937 rng(99);
      const auto other = quantized(spec.dtype, K, 16, 4, rng);
      for (int64_t r : {0, 4}) std::copy(other.begin(), other.end(), q.dy.begin() + r * K);
      ASSERT_FALSE(same_bits(q.dy, p.dy));
      const TrainingGradients h = reference_training_backward(spec, q.x, q.weights(), f, q.dy, q.lambda);
      EXPECT_TRUE(same_bits(g.dx, h.dx));
      EXPECT_TRUE(same_bits(g.dw_gate, h.dw_gate));
      EXPECT_TRUE(same_bits(g.dw_up, h.dw_up));
      EXPECT_TRUE(same_bits(g.dw_down, h.dw_down));
    }
}

// Two calls give the same bits (forward and backward).
TEST(TrainingReference, Deterministic) {
  for (Activation act : {Activation::ReLU, Activation::SiLU}) {
    const FfnSpec spec =
        make_spec(72, 300, true, act, act == Activation::ReLU ? 0.0f : 0.05f, DType::BF16, WeightLayout::OutIn);
    const Problem p = make_problem(spec, 64, 0.05, 0.25f, 31);
    const TrainingForward f1 = reference_training_forward(spec, p.x, p.tokens, p.weights());
    const TrainingForward f2 = reference_training_forward(spec, p.x, p.tokens, p.weights());
    ASSERT_GT(f1.neuron.size(), 0u);
    EXPECT_TRUE(same_bits(f1.y, f2.y));
    EXPECT_EQ(std::bit_cast<uint64_t>(f1.l1), std::bit_cast<uint64_t>(f2.l1));
    EXPECT_TRUE(same_bits(f1.row_start, f2.row_start) && same_bits(f1.neuron, f2.neuron) &&
                same_bits(f1.gate, f2.gate) && same_bits(f1.act, f2.act) && same_bits(f1.up, f2.up) &&
                same_bits(f1.hidden, f2.hidden));
    const TrainingGradients g1 = reference_training_backward(spec, p.x, p.weights(), f1, p.dy, p.lambda);
    const TrainingGradients g2 = reference_training_backward(spec, p.x, p.weights(), f2, p.dy, p.lambda);
    EXPECT_TRUE(same_bits(g1.dx, g2.dx));
    EXPECT_TRUE(same_bits(g1.dw_gate, g2.dw_gate));
    EXPECT_TRUE(same_bits(g1.dw_up, g2.dw_up));
    EXPECT_TRUE(same_bits(g1.dw_down, g2.dw_down));
  }
}

// No tokens: empty activations, l1 = 0, zero weight gradients of the right sizes.
TEST(TrainingReference, NoTokens) {
  const FfnSpec spec = make_spec(16, 32, true, Activation::ReLU, 0.0f, DType::BF16, WeightLayout::InOut);
  const Problem p = make_problem(spec, 0, 0.1, 0.25f, 41);
  const TrainingForward f = reference_training_forward(spec, p.x, 0, p.weights());
  EXPECT_TRUE(f.y.empty());
  EXPECT_EQ(f.l1, 0.0);
  ASSERT_EQ(f.row_start.size(), 1u);
  const TrainingGradients g = reference_training_backward(spec, p.x, p.weights(), f, p.dy, 1.0f);
  EXPECT_TRUE(g.dx.empty());
  EXPECT_EQ(g.dw_gate.size(), 16u * 32u);
  EXPECT_EQ(g.dw_up.size(), 16u * 32u);
  EXPECT_EQ(g.dw_down.size(), 16u * 32u);
}

TEST(TrainingReference, BadArgumentsNameTheArgument) {
  const FfnSpec spec = make_spec(24, 40, true, Activation::ReLU, 0.0f, DType::BF16, WeightLayout::OutIn);
  const Problem p = make_problem(spec, 4, 0.3, 0.25f, 51);
  const std::vector<uint16_t> short_x(p.x.begin(), p.x.end() - 1);
  const std::vector<uint16_t> none;
  expect_invalid([&] { reference_training_forward(spec, short_x, 4, p.weights()); }, {"x", "96", "95", "[4, 24]"});
  expect_invalid([&] { reference_training_forward(spec, p.x, 5, p.weights()); }, {"x", "120", "96"});
  expect_invalid([&] { reference_training_forward(spec, p.x, -1, p.weights()); }, {"tokens -1"});
  FfnSpec bad = spec;
  bad.d_model = 0;
  expect_invalid([&] { reference_training_forward(bad, p.x, 4, p.weights()); }, {"d_model 0"});
  bad = spec;
  bad.activation = Activation::SiLU;  // threshold 0 is illegal for SiLU
  expect_invalid([&] { reference_training_forward(bad, p.x, 4, p.weights()); }, {"threshold"});
  expect_invalid(
      [&] {
        reference_training_forward(spec, p.x, 4, {short_x, p.w_up, p.w_down});
      },
      {"w_gate", "960", "[40, 24]"});
  expect_invalid(
      [&] {
        reference_training_forward(spec, p.x, 4, {p.w_gate, none, p.w_down});
      },
      {"w_up", "960", "got 0"});
  expect_invalid(
      [&] {
        reference_training_forward(spec, p.x, 4, {p.w_gate, p.w_up, short_x});
      },
      {"w_down", "960", "[24, 40] = [d_model, d_ff]"});
  FfnSpec non_gated = spec;
  non_gated.gated = false;
  expect_invalid([&] { reference_training_forward(non_gated, p.x, 4, p.weights()); }, {"w_up", "spec.gated = false"});

  const TrainingForward f = reference_training_forward(spec, p.x, 4, p.weights());
  expect_invalid([&] { reference_training_backward(spec, p.x, p.weights(), f, short_x, 0.1f); }, {"dy", "96", "95"});
  expect_invalid([&] { reference_training_backward(spec, short_x, p.weights(), f, p.dy, 0.1f); }, {"x", "96", "95"});
  expect_invalid([&] { reference_training_backward(spec, p.x, {p.w_gate, none, p.w_down}, f, p.dy, 0.1f); }, {"w_up"});
  expect_invalid([&] { reference_training_backward(spec, p.x, p.weights(), f, p.dy, NAN); }, {"lambda", "nan"});
  expect_invalid([&] { reference_training_backward(spec, p.x, p.weights(), f, p.dy, -1.0f); }, {"lambda", "-1"});
  ASSERT_GT(f.neuron.size(), 1u);
  TrainingForward broken = f;
  broken.row_start.pop_back();
  expect_invalid([&] { reference_training_backward(spec, p.x, p.weights(), broken, p.dy, 0.1f); },
                 {"forward.row_start", "5", "4"});
  broken = f;
  broken.neuron.back() = 40;
  expect_invalid([&] { reference_training_backward(spec, p.x, p.weights(), broken, p.dy, 0.1f); },
                 {"forward.neuron", "[0, 40)", "got 40"});
  broken = f;
  broken.up.pop_back();
  expect_invalid([&] { reference_training_backward(spec, p.x, p.weights(), broken, p.dy, 0.1f); }, {"forward.up"});
  broken = f;
  broken.tokens = 3;
  expect_invalid([&] { reference_training_backward(spec, p.x, p.weights(), broken, p.dy, 0.1f); }, {"x", "72", "96"});
}
