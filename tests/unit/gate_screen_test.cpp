// The gate screen's host builder (runtime/src/gate_screen.h): its bound holds and is tight, its
// encoding, its errors.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "gate_screen.h"
#include "test_data.h"
#include "twell/error.h"
#include "twell/half.h"

using namespace twell;
using namespace twell::testing;

namespace {
int q_of(uint8_t b) { return b & 0x80 ? -(b & 0x7F) : b; }  // the sign-magnitude byte's value
// The screen's dot (sum over groups of scale * x . q) and its bound (sum over groups of ||x_g|| coef_g)
// in double, and the exact gate in double.
struct Gate {
  double exact = 0, screen = 0, bound = 0;
};
Gate gate_of(const detail::GateScreen& s, DType t, const std::vector<uint16_t>& w, const std::vector<float>& x, int64_t row) {
  const int64_t K = s.d_model, G = K / 64;
  Gate g;
  for (int64_t grp = 0; grp < G; ++grp) {
    double dot = 0, xx = 0;
    for (int64_t k = grp * 64; k < grp * 64 + 64; ++k) {
      g.exact += double(x[k]) * to_float(t, w[row * K + k]);
      dot += double(x[k]) * q_of(s.q[row * K + k]);
      xx += double(x[k]) * x[k];
    }
    g.screen += dot * s.scale[row * G + grp];
    g.bound += std::sqrt(xx) * s.coef[row * G + grp];
  }
  return g;
}
}  // namespace

// On the benchmarks' uniform weights (with the large shift of column 0) and random x: every row's
// exact gate lies within the bound of the screen's dot, the bound is within a few percent of the gate's
// spread, and at 0.5% density the candidates (upper bound > 0) are a few times the active rows.
TEST(GateScreen, BoundHoldsAndIsTight) {
  FfnSpec s;
  s.d_model = 512;
  s.d_ff = 2048;
  const RandomFfn f = make_random_ffn(s, 16, 0.005, 7);
  const auto screen = detail::build_gate_screen(s.dtype, f.w_gate.data(), s.d_ff, s.d_model, s.d_model);
  ASSERT_EQ(screen.q.size(), size_t(s.d_ff * s.d_model));
  int64_t active = 0, candidates = 0;
  for (int64_t t = 0; t < f.tokens; ++t) {
    std::vector<float> x(s.d_model);
    for (int64_t k = 0; k < s.d_model; ++k) x[k] = to_float(s.dtype, f.x[t * s.d_model + k]);
    for (int64_t j = 0; j < s.d_ff; ++j) {
      const Gate g = gate_of(screen, s.dtype, f.w_gate, x, j);
      ASSERT_LE(std::fabs(g.exact - g.screen), g.bound) << "token " << t << " row " << j;
      active += g.exact > 0;
      candidates += g.screen + g.bound > 0;
    }
  }
  EXPECT_GT(active, 0);
  EXPECT_GE(candidates, active);
  EXPECT_LT(candidates, 6 * active + 16 * 4) << "the bound is too loose to help";
}

// q is stored sign-magnitude (|q| <= 127, never -0); scale * q is within half a scale of w; a group with a non-finite weight
// has coefficient +inf (its rows always candidates); an all-zero group has scale 0 and coefficient 0.
TEST(GateScreen, EncodingAndSpecialGroups) {
  const int64_t K = 128;
  std::vector<uint16_t> w = random_bits(DType::BF16, 2 * K, -0.5f, 0.5f, 3);
  for (int64_t k = 64; k < 128; ++k) w[k] = from_float(DType::BF16, 0.0f);  // row 0, group 1: zeros
  w[K + 70] = from_float(DType::BF16, std::numeric_limits<float>::infinity());  // row 1, group 1
  const auto s = detail::build_gate_screen(DType::BF16, w.data(), 2, K, K);
  for (int64_t k = 0; k < 64; ++k) {
    EXPECT_NE(s.q[k], 0x80);  // -0 is never stored
    EXPECT_LE(std::fabs(q_of(s.q[k]) * double(s.scale[0]) - to_float(DType::BF16, w[k])), s.scale[0] * 0.5000001);
  }
  EXPECT_EQ(s.scale[1], 0.0f);
  EXPECT_EQ(s.coef[1], 0.0f);
  EXPECT_TRUE(std::isinf(s.coef[3]));
  EXPECT_GT(s.coef[2], 0.0f);
  EXPECT_GE(s.device_bytes(), size_t(2 * K + 2 * 2 * 2 * 4));
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
