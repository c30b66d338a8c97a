// The gate screen's host builder (runtime/src/gate_screen.h): its bound holds and is tight, its
// encoding, its errors.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>

#include "gate_screen.h"
#include "test_data.h"
#include "twell/error.h"
#include "twell/half.h"

using namespace twell;
using namespace twell::testing;

namespace {
// The screen's dot with an approximation xt of x (sum over groups of scale * xt . q) and its bound (sum over
// groups of ||x_g - xt_g|| norm_g + ||xt_g|| coef_g) in double, and the exact gate in double.
struct Gate {
  double exact = 0, screen = 0, bound = 0;
};
Gate gate_of(const detail::GateScreen& s, DType t, const std::vector<uint16_t>& w, const std::vector<double>& x,
             const std::vector<double>& xt, int64_t row) {
  const int64_t K = s.d_model, G = K / 64;
  Gate g;
  for (int64_t grp = 0; grp < G; ++grp) {
    double dot = 0, dd = 0, tt = 0;
    for (int64_t k = grp * 64; k < grp * 64 + 64; ++k) {
      g.exact += x[k] * to_float(t, w[row * K + k]);
      dot += xt[k] * s.q[row * K + k];
      dd += (x[k] - xt[k]) * (x[k] - xt[k]);
      tt += xt[k] * xt[k];
    }
    g.screen += dot * s.scale[row * G + grp];
    g.bound += std::sqrt(dd) * s.norm[row * G + grp] + std::sqrt(tt) * s.coef[row * G + grp];
  }
  return g;
}
// x quantized as decode_fused does, per group of 64 (two int8 planes: sl (128 p + pl), sl = max |x| / 127 / 128).
std::vector<double> quantized(const std::vector<double>& x) {
  std::vector<double> xt(x.size());
  for (size_t g = 0; g < x.size(); g += 64) {
    double amax = 0;
    for (size_t k = g; k < g + 64; ++k) amax = std::max(amax, std::fabs(x[k]));
    const double sx = amax / 127, sl = sx / 128;
    for (size_t k = g; k < g + 64; ++k) {
      const double p = sx > 0 ? std::nearbyint(x[k] / sx) : 0, pl = sx > 0 ? std::nearbyint((x[k] - sx * p) / sl) : 0;
      xt[k] = sl * (128 * p + pl);
    }
  }
  return xt;
}
}  // namespace

// On the benchmarks' uniform weights (with the large shift of column 0) and random x: every row's exact
// gate lies within the bound of the screen's dot, both for x quantized as the kernel does and for x with
// random noise (the bound holds for any approximation of x); the bound is tight enough that at 0.5%
// density the candidates (upper bound > 0) are a few times the active rows.
TEST(GateScreen, BoundHoldsAndIsTight) {
  FfnSpec s;
  s.d_model = 512;
  s.d_ff = 2048;
  const RandomFfn f = make_random_ffn(s, 16, 0.005, 7);
  const auto screen = detail::build_gate_screen(s.dtype, f.w_gate.data(), s.d_ff, s.d_model, s.d_model);
  ASSERT_EQ(screen.q.size(), size_t(s.d_ff * s.d_model));
  std::mt19937 rng(5);
  std::normal_distribution<double> noise(0.0, 0.01);
  int64_t active = 0, candidates = 0;
  for (int64_t t = 0; t < f.tokens; ++t) {
    std::vector<double> x(s.d_model), xn(s.d_model);
    for (int64_t k = 0; k < s.d_model; ++k) x[k] = to_float(s.dtype, f.x[t * s.d_model + k]), xn[k] = x[k] + noise(rng);
    const std::vector<double> xq = quantized(x);
    for (int64_t j = 0; j < s.d_ff; ++j) {
      const Gate g = gate_of(screen, s.dtype, f.w_gate, x, xq, j);
      ASSERT_LE(std::fabs(g.exact - g.screen), g.bound) << "token " << t << " row " << j;
      const Gate gn = gate_of(screen, s.dtype, f.w_gate, x, xn, j);
      ASSERT_LE(std::fabs(gn.exact - gn.screen), gn.bound) << "noisy x, token " << t << " row " << j;
      active += g.exact > 0;
      candidates += g.screen + g.bound > 0;
    }
  }
  EXPECT_GT(active, 0);
  EXPECT_GE(candidates, active);
  EXPECT_LT(candidates, 6 * active + 16 * 4) << "the bound is too loose to help";
}

// q is int8 in -127..127; scale * q is within half a scale of w; a group with a non-finite weight has
// coefficient and norm +inf (its rows always candidates); an all-zero group has scale, coefficient and norm 0;
// the norm is at least the group's ||w||.
TEST(GateScreen, EncodingAndSpecialGroups) {
  const int64_t K = 128;
  std::vector<uint16_t> w = random_bits(DType::BF16, 2 * K, -0.5f, 0.5f, 3);
  for (int64_t k = 64; k < 128; ++k) w[k] = from_float(DType::BF16, 0.0f);  // row 0, group 1: zeros
  w[K + 70] = from_float(DType::BF16, std::numeric_limits<float>::infinity());  // row 1, group 1
  const auto s = detail::build_gate_screen(DType::BF16, w.data(), 2, K, K);
  double w2 = 0;
  for (int64_t k = 0; k < 64; ++k) {
    EXPECT_GE(s.q[k], -127);
    EXPECT_LE(std::fabs(s.q[k] * double(s.scale[0]) - to_float(DType::BF16, w[k])), s.scale[0] * 0.5000001);
    w2 += double(to_float(DType::BF16, w[k])) * to_float(DType::BF16, w[k]);
  }
  EXPECT_GE(s.norm[0], std::sqrt(w2));
  EXPECT_EQ(s.scale[1], 0.0f);
  EXPECT_EQ(s.coef[1], 0.0f);
  EXPECT_EQ(s.norm[1], 0.0f);
  EXPECT_TRUE(std::isinf(s.coef[3]));
  EXPECT_TRUE(std::isinf(s.norm[3]));
  EXPECT_GT(s.coef[2], 0.0f);
  EXPECT_GE(s.device_bytes(), size_t(2 * K + 3 * 2 * 2 * 4));
}

TEST(GateScreen, BadShapesAreNamed) {
  std::vector<uint16_t> w(520 * 2);
  try {
    detail::build_gate_screen(DType::BF16, w.data(), 2, 520, 520);
    FAIL() << "d_model 520 accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("d_model"), std::string::npos) << e.what();
  }
  try {
    detail::build_gate_screen(DType::BF16, w.data(), 2, 512, 256);
    FAIL() << "ld 256 accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("ld_gate"), std::string::npos) << e.what();
  }
}
