// The CPU reference (the oracle of the GPU tests) against the independent float64 dense formula,
// on random data at several densities and layouts and on the real sample.
#include <gtest/gtest.h>

#include "test_data.h"
#include "twell/error.h"
#include "twell/layer_data.h"
#include "twell/reference.h"

using namespace twell;
using namespace twell::testing;

namespace {

void expect_matches_naive(const RandomFfn& f, uint32_t backup_capacity, const char* what) {
  const auto y = reference_gated_ffn(f.spec, f.x, f.tokens, f.weights(), backup_capacity);
  std::vector<int64_t> rows;
  for (int64_t r = 0; r < f.tokens; r += std::max<int64_t>(1, f.tokens / 8)) rows.push_back(r);
  const auto naive = naive_dense_ffn(f.spec, f.x, f.weights(), rows);
  std::vector<float> picked;
  for (int64_t r : rows) picked.insert(picked.end(), y.begin() + r * f.spec.d_model, y.begin() + (r + 1) * f.spec.d_model);
  EXPECT_LT(relative_error(picked, naive), 1e-4) << what;
}

FfnSpec small_spec() {
  FfnSpec s;
  s.d_model = 72;
  s.d_ff = 300;  // 2 tiles of 256, the second partial
  return s;
}

}  // namespace

TEST(Reference, MatchesNaiveDenseAtManyDensities) {
  for (double d : {0.005, 0.02, 0.1, 0.5}) {
    const auto f = make_random_ffn(small_spec(), 33, d, 11);
    expect_matches_naive(f, UINT32_MAX, "backup large enough");
    expect_matches_naive(f, 0, "backup empty: every overflowing tile-row recomputed");
  }
}

TEST(Reference, LayoutsActivationsAndDtypes) {
  FfnSpec s = small_spec();
  s.slots = 3;
  s.tile_n = 64;
  expect_matches_naive(make_random_ffn(s, 9, 0.1, 5), 4, "tile_n 64, slots 3, small backup");
  s.down_layout = WeightLayout::InOut;
  expect_matches_naive(make_random_ffn(s, 9, 0.1, 6), UINT32_MAX, "in_out down weight");
  s = small_spec();
  s.dtype = DType::FP16;
  expect_matches_naive(make_random_ffn(s, 9, 0.1, 7), UINT32_MAX, "fp16");
  s = small_spec();
  s.activation = Activation::SiLU;
  s.threshold = 0.05f;
  expect_matches_naive(make_random_ffn(s, 9, 0.3, 8), UINT32_MAX, "silu with |a| > 0.05");
}

// A non-gated layer (no up projection): y = act(x Wg^T) Wd^T, overflow paths included; a gated
// spec's up weight is refused, and so is one given to a non-gated spec.
TEST(Reference, NonGatedMatchesNaiveDense) {
  FfnSpec s = small_spec();
  s.gated = false;
  for (double d : {0.02, 0.5}) {
    const auto f = make_random_ffn(s, 17, d, 41);
    ASSERT_TRUE(f.w_up.empty());
    expect_matches_naive(f, UINT32_MAX, "non-gated");
    expect_matches_naive(f, 0, "non-gated, every overflowing tile-row recomputed");
  }
  s.down_layout = WeightLayout::InOut;
  s.dtype = DType::FP16;
  expect_matches_naive(make_random_ffn(s, 9, 0.1, 42), UINT32_MAX, "non-gated fp16 in_out");
  // The same weights read as a gated layer with Wu = 0 give y = 0; as non-gated they do not.
  const auto f = make_random_ffn(s, 4, 0.1, 43);
  std::vector<uint16_t> up(f.w_gate.size(), 0);
  EXPECT_THROW(reference_gated_ffn(s, f.x, f.tokens, {f.w_gate, up, f.w_down}), Error);
  FfnSpec gated = s;
  gated.gated = true;
  EXPECT_THROW(reference_gated_ffn(gated, f.x, f.tokens, f.weights()), Error);
}

TEST(Reference, ThresholdDropsSmallActivations) {
  FfnSpec s = small_spec();
  auto f = make_random_ffn(s, 16, 0.3, 3);
  const auto a0 = reference_gate(s, f.x, f.tokens, f.w_gate);
  s.threshold = 0.05f;
  f.spec = s;
  const auto a1 = reference_gate(s, f.x, f.tokens, f.w_gate);
  const auto nnz = [](const std::vector<uint16_t>& a) { return std::count_if(a.begin(), a.end(), [](uint16_t v) { return v != 0; }); };
  EXPECT_LT(nnz(a1), nnz(a0));
  EXPECT_GT(nnz(a1), 0);
  expect_matches_naive(f, 0, "threshold 0.05");
}

TEST(Reference, RealSample) {
  const SafeTensors st = SafeTensors::read(sample_path());
  const LayerData d = load_layer({st}, std::nullopt, false);
  ASSERT_EQ(d.d_model, 512);
  ASSERT_EQ(d.d_ff, 1408);
  FfnSpec s;
  s.d_model = d.d_model;
  s.d_ff = d.d_ff;
  RandomFfn f{s, 64, {d.x.begin(), d.x.begin() + 64 * 512}, d.w_gate, d.w_up, d.w_down};
  expect_matches_naive(f, UINT32_MAX, "real layer, 31 slots (overflows)");
  expect_matches_naive(f, 0, "real layer, all overflow recomputed");
}

TEST(Reference, GatedDownChecksTheTwellMatrixAgainstTheSpec) {
  const auto f = make_random_ffn(small_spec(), 4, 0.1, 9);
  TwellLayout l = layout_for(f.spec);
  l.tile_n = 32;
  const auto a = reference_gate(f.spec, f.x, f.tokens, f.w_gate);
  TwellMatrix h = pack_twell(l, a, f.tokens, f.spec.d_ff, UINT32_MAX);
  FfnSpec other = f.spec;
  other.d_ff = 128;
  EXPECT_THROW(reference_gated_down(other, f.x, h, f.weights()), Error);
  h.words.clear();
  EXPECT_THROW(reference_gated_down(f.spec, f.x, h, f.weights()), Error);
}
