// The hot/cold split's host side (twell/neuron_order.h): activity counts against an independent
// count of the dense activation, the hot-first order, the permutation of weights (the FFN is
// unchanged: checked with the CPU reference), the cost model's choice, and the plan's option checks.
#include <gtest/gtest.h>

#include <numeric>

#include "plan_setup.h"
#include "test_data.h"
#include "twell/context.h"
#include "twell/error.h"
#include "twell/neuron_order.h"
#include "twell/reference.h"

namespace {

using namespace twell;

template <class F>
void expect_invalid(F&& f, const std::string& needle) {
  try {
    f();
    FAIL() << "accepted; expected an error containing: " << needle;
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::InvalidArgument) << e.what();
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

FfnSpec small_spec() {
  FfnSpec s;
  s.d_model = 64;
  s.d_ff = 320;  // 2 tiles of 256, the second partial
  return s;
}

TEST(NeuronOrder, ActivityCountsEveryNonzeroIncludingTheBackup) {
  const FfnSpec s = small_spec();
  const auto f = twell::testing::make_random_ffn(s, 96, 0.2, 7);
  const std::vector<uint16_t> a = reference_gate(s, f.x, f.tokens, f.w_gate);
  TwellLayout l = layout_for(s);
  l.slots = 8;  // about 51 nonzeros per 256-wide tile-row at 20%: most tile-rows overflow to the backup
  const TwellMatrix m = pack_twell(l, a, f.tokens, s.d_ff, UINT32_MAX);
  ASSERT_GT(m.overflow_count, 0u);
  std::vector<uint64_t> expected(s.d_ff, 0);
  for (int64_t r = 0; r < f.tokens; ++r)
    for (int64_t j = 0; j < s.d_ff; ++j) expected[j] += is_active(l, a[r * s.d_ff + j]) ? 1 : 0;
  EXPECT_EQ(neuron_activity(m), expected);
  EXPECT_GT(std::accumulate(expected.begin(), expected.end(), uint64_t{0}), 0u);

  const TwellMatrix full = pack_twell(l, a, f.tokens, s.d_ff, 1);  // a full backup: counts unknown
  expect_invalid([&] { neuron_activity(full); }, "overflowed a full backup");
}

TEST(NeuronOrder, HotFirstIsDescendingAndStable) {
  const std::vector<uint64_t> act{3, 9, 3, 0, 9, 1};
  const std::vector<int64_t> order = hot_first_order(act);
  EXPECT_EQ(order, (std::vector<int64_t>{1, 4, 0, 2, 5, 3}));
  EXPECT_EQ(in_order(act, order), (std::vector<uint64_t>{9, 9, 3, 3, 1, 0}));
  expect_invalid([&] { in_order(act, std::vector<int64_t>{0, 1}); }, "in_order: order: expected 6 entries");
  expect_invalid([&] { in_order(act, std::vector<int64_t>{0, 1, 2, 3, 4, 6}); }, "in_order: order[5]: expected a neuron 0..5, got 6");
}

TEST(NeuronOrder, PermutedWeightsComputeTheSameFfn) {
  for (WeightLayout down : {WeightLayout::OutIn, WeightLayout::InOut}) {
    FfnSpec s = small_spec();
    s.down_layout = down;
    auto f = twell::testing::make_random_ffn(s, 40, 0.1, 11);
    if (down == WeightLayout::InOut) {  // make_random_ffn draws [d_model, d_ff]; any values do
      std::vector<uint16_t> t(f.w_down.size());
      for (int64_t r = 0; r < s.d_model; ++r)
        for (int64_t j = 0; j < s.d_ff; ++j) t[j * s.d_model + r] = f.w_down[r * s.d_ff + j];
      f.w_down = t;
    }
    const std::vector<float> before = reference_gated_ffn(s, f.x, f.tokens, f.weights());
    std::vector<int64_t> order(s.d_ff);
    std::iota(order.rbegin(), order.rend(), int64_t{0});  // reversed, then a few swaps
    std::swap(order[3], order[200]);
    std::swap(order[0], order[319]);
    const auto w_gate0 = f.w_gate;
    permute_neurons(s, order, f.w_gate, f.w_up, f.w_down);
    EXPECT_NE(f.w_gate, w_gate0);
    const std::vector<float> after = reference_gated_ffn(s, f.x, f.tokens, f.weights());
    EXPECT_LT(relative_error(after, before), 1e-5) << to_string(down);
    EXPECT_GT(relative_error(before, std::vector<float>(before.size(), 0.0f)), 0.5);  // not all zero
  }
}

TEST(NeuronOrder, PermuteRejectsBadArguments) {
  const FfnSpec s = small_spec();
  auto f = twell::testing::make_random_ffn(s, 4, 0.1, 3);
  std::vector<int64_t> order(s.d_ff);
  std::iota(order.begin(), order.end(), int64_t{0});
  auto dup = order;
  dup[5] = 4;
  expect_invalid([&] { permute_neurons(s, dup, f.w_gate, f.w_up, f.w_down); }, "order[5]: neuron 4 appears twice");
  auto out = order;
  out[2] = 320;
  expect_invalid([&] { permute_neurons(s, out, f.w_gate, f.w_up, f.w_down); }, "order[2]: expected a neuron 0..319, got 320");
  expect_invalid([&] { permute_neurons(s, std::span(order).first(10), f.w_gate, f.w_up, f.w_down); }, "order: expected 320");
  auto short_up = f.w_up;
  short_up.pop_back();
  expect_invalid([&] { permute_neurons(s, order, f.w_gate, short_up, f.w_down); }, "w_up: expected 20480 elements");
  const auto gate0 = f.w_gate;
  expect_invalid([&] { permute_neurons(s, dup, f.w_gate, f.w_up, f.w_down); }, "appears twice");
  EXPECT_EQ(f.w_gate, gate0);  // a rejected call changes nothing
}

// The cost model: uniform activity at 0.5% keeps every neuron on TwELL; a layer whose first neurons
// fire for most tokens moves those to the dense path (and no more); everything dense-like stays below d_ff.
TEST(NeuronOrder, CostModelMovesOnlyHotNeurons) {
  FfnSpec s;
  s.d_model = 2048;
  s.d_ff = 5632;
  const int64_t rows = 1000;
  std::vector<uint64_t> uniform(s.d_ff, 5);  // 0.5% of 1000 rows
  EXPECT_EQ(choose_dense_neurons(s, 16384, uniform, rows), 0);
  std::vector<uint64_t> skewed(s.d_ff, 2);
  std::fill_n(skewed.begin(), 1024, 600);  // 1024 neurons active in 60% of rows
  const int64_t k = choose_dense_neurons(s, 16384, skewed, rows);
  EXPECT_EQ(k, 1024);
  EXPECT_LT(predict_split_ms(s, 16384, skewed, rows, k), predict_split_ms(s, 16384, skewed, rows, 0));
  EXPECT_LT(predict_split_ms(s, 16384, skewed, rows, k), predict_split_ms(s, 16384, skewed, rows, 2048));
  std::vector<uint64_t> dense(s.d_ff, rows);
  EXPECT_EQ(choose_dense_neurons(s, 16384, dense, rows), 5376);  // the last multiple of 256 below d_ff

  expect_invalid([&] { choose_dense_neurons(s, 16384, std::span(uniform).first(10), rows); }, "sorted_activity: expected 5632");
  std::vector<uint64_t> ascending(s.d_ff, 1);
  ascending.back() = 7;
  expect_invalid([&] { choose_dense_neurons(s, 16384, ascending, rows); }, "expected descending counts");
  expect_invalid([&] { choose_dense_neurons(s, 16384, uniform, 0); }, "rows: expected");
  SplitCostModel m;
  m.granularity = 100;
  expect_invalid([&] { choose_dense_neurons(s, 16384, uniform, rows, m); }, "model.granularity: expected a positive multiple of 64");
  expect_invalid([&] { predict_split_ms(s, 16384, uniform, rows, s.d_ff); }, "dense_neurons: expected 0..5631");
}

// The training step's model (TrainingSplitCostModel) against the steps it was fitted on (bench/README.md
// v58-v59, H200, paper shape, 16384 rows): the TwELL path at uniform 0.5% (2.65 ms) and 2% (7.3), the dense
// path (4.5-4.6), within 10%; its choices: TwELL alone at 0.5%, the dense path at 5%, the hot neurons'
// split where a few hold most entries; then the argument checks.
TEST(NeuronOrder, TrainingCostModelChoosesAmongTheThreePaths) {
  FfnSpec s;
  s.d_model = 2048;
  s.d_ff = 5632;
  const int64_t rows = 1000, tokens = 16384;
  const std::vector<uint64_t> half_percent(s.d_ff, 5), two_percent(s.d_ff, 20), five_percent(s.d_ff, 50);
  EXPECT_NEAR(predict_training_step_ms(s, tokens, half_percent, rows, 0), 2.65, 0.27);
  EXPECT_NEAR(predict_training_step_ms(s, tokens, two_percent, rows, 0), 7.3, 0.73);
  EXPECT_NEAR(predict_training_step_ms(s, tokens, two_percent, rows, s.d_ff), 4.6, 0.46) << "the dense path";
  EXPECT_EQ(predict_training_step_ms(s, tokens, two_percent, rows, s.d_ff),
            predict_training_step_ms(s, tokens, half_percent, rows, s.d_ff)) << "the dense path does not depend on the density";
  EXPECT_EQ(choose_training_dense_neurons(s, tokens, half_percent, rows), 0);
  EXPECT_EQ(choose_training_dense_neurons(s, tokens, five_percent, rows), s.d_ff);
  std::vector<uint64_t> hot(s.d_ff, 2);
  std::fill_n(hot.begin(), 1024, 200);  // 1024 neurons on 20% of the rows, the rest on 0.2%
  const int64_t k = choose_training_dense_neurons(s, tokens, hot, rows);
  EXPECT_EQ(k, 1024);
  EXPECT_LT(predict_training_step_ms(s, tokens, hot, rows, k), predict_training_step_ms(s, tokens, hot, rows, 0));
  EXPECT_LT(predict_training_step_ms(s, tokens, hot, rows, k), predict_training_step_ms(s, tokens, hot, rows, s.d_ff));
  s.gated = false;  // fewer GEMMs and rows per entry: cheaper at every split
  EXPECT_LT(predict_training_step_ms(s, tokens, hot, rows, k), 2.4);
  s.gated = true;

  expect_invalid([&] { predict_training_step_ms(s, tokens, hot, rows, s.d_ff + 1); }, "dense_neurons: expected 0..5632");
  expect_invalid([&] { choose_training_dense_neurons(s, tokens, std::span(hot).first(10), rows); }, "sorted_activity: expected 5632");
  TrainingSplitCostModel m;
  m.granularity = 100;
  expect_invalid([&] { choose_training_dense_neurons(s, tokens, hot, rows, m); }, "model.granularity");
  m = {};
  m.twell_fixed_tflops = 0;
  expect_invalid([&] { predict_training_step_ms(s, tokens, hot, rows, 0, m); }, "model.twell_fixed_tflops");
  m = {};
  m.twell_overhead_ms = -1;
  expect_invalid([&] { choose_training_dense_neurons(s, tokens, hot, rows, m); }, "model.twell_overhead_ms");
}

// The device overload checks the order first (with or without a GPU), then needs a GPU.
TEST(NeuronOrder, DeviceOverloadChecksTheOrderThenNeedsAGpu) {
  Context ctx = twell::testing::context_without_disk_cache();
  const FfnSpec s = small_spec();
  std::vector<int64_t> order(s.d_ff);
  std::iota(order.begin(), order.end(), int64_t{0});
  auto bad = order;
  bad[0] = 1;
  expect_invalid([&] { permute_neurons(ctx, nullptr, s, bad, FfnTensors{}, DeviceFfnWeights{}); }, "order[1]: neuron 1 appears twice");
  if (ctx.has_gpu()) GTEST_SKIP() << "a GPU is present: the no-GPU error cannot be tested (tests/gpu covers the device path)";
  try {
    permute_neurons(ctx, nullptr, s, order, FfnTensors{}, DeviceFfnWeights{});
    FAIL() << "ran without a GPU";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::NoDevice) << e.what();
  }
}

TEST(NeuronOrder, PlanNamesABadDenseNeuronCount) {
  Context ctx = twell::testing::context_without_disk_cache();
  const FfnSpec s = twell::testing::spec_512x1408();
  for (int64_t bad : {int64_t{-64}, int64_t{100}, int64_t{1408}, int64_t{4096}}) {
    PlanOptions p;
    p.dense_neurons = bad;
    expect_invalid([&] { ctx.plan(s, 64, p); }, "PlanOptions::dense_neurons: expected a multiple of 64 in 0..1344");
  }
  PlanOptions p;
  p.dense_neurons = 640;
  p.dispatch = Dispatch::Sparse;
  FfnPlan plan = ctx.plan(s, 64, p);  // generated and compiled with or without a GPU
  EXPECT_EQ(plan.dense_neurons(), 640);
  EXPECT_NE(plan.ir().find("neurons 0..639 run dense"), std::string::npos) << plan.ir();
  EXPECT_NE(plan.ir().find("(d_ff 768)"), std::string::npos) << plan.ir();  // the kernels' shape: the other 768
}

}  // namespace
