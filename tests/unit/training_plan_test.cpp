// FfnTrainingPlan (twell/training_plan.h) without a GPU: it is made (the forward's kernels and both
// training kernels generated and compiled, reported), it refuses the token-block consumer and a d_model
// the row backward cannot hold by name, its size formulas, and every run-time call says there is no
// GPU (or that the plan is empty) rather than crashing.
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <string>

#include "plan_setup.h"
#include "twell/context.h"
#include "twell/error.h"
#include "twell/training.h"
#include "twell/training_plan.h"

namespace {

using namespace twell;

Context& no_gpu() { return twell::testing::no_device_context(); }

FfnSpec small_spec() {
  FfnSpec s;
  s.d_model = 256;
  s.d_ff = 1024;
  return s;
}

template <class F>
void expect_error(F&& f, ErrorCode code, const std::string& needle) {
  try {
    f();
    ADD_FAILURE() << "expected an error naming " << needle;
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), code) << e.what();
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(TrainingPlan, MadeWithoutAGpuReportsEveryKernel) {
  const FfnTrainingPlan plan = FfnTrainingPlan::create(no_gpu(), small_spec(), 4096);
  EXPECT_FALSE(plan.runnable());
  EXPECT_EQ(plan.max_tokens(), 4096);
  EXPECT_EQ(plan.layout().tile_n, 256);
  std::vector<std::string> kinds;
  for (const KernelReport& k : plan.kernels()) kinds.push_back(k.kind);
  for (const char* kind : {"gate_twell", "gated_down", "transpose", "train_row_backward", "train_weight_grad"})
    EXPECT_NE(std::find(kinds.begin(), kinds.end(), kind), kinds.end()) << kind;
  // The consumer is the row one (its L1 term), never the token block.
  for (const KernelReport& k : plan.kernels()) {
    if (k.kind == "gated_down") {
      EXPECT_NE(k.consumer, "token_block");
    }
  }
  // Sizes: 4 bytes per TwELL word (8 with u per entry: both warp-per-row forms, as this gated relu shape
  // gets) and 2 per backup value (+ the two counters); the backward's scratch 16 bytes per word and
  // backup_grad value, the workspace, 8 bytes per word and backup_grad value.
  bool warp_forms = true;
  for (const KernelReport& k : plan.kernels())
    if (k.kind == "gated_down" || k.kind == "train_row_backward") warp_forms = warp_forms && k.consumer == "warp_row";
  EXPECT_TRUE(warp_forms);
  const int64_t words = plan.layout().words_per_row(1024);
  EXPECT_EQ(plan.state_bytes(100, 10), 100 * words * 8 + 10 * 256 * 2 + 8);
  // Non-gated: no u, 4 bytes per word.
  FfnSpec non_gated = small_spec();
  non_gated.gated = false;
  const FfnTrainingPlan plain = FfnTrainingPlan::create(no_gpu(), non_gated, 4096);
  EXPECT_EQ(plain.state_bytes(100, 10), 100 * plain.layout().words_per_row(1024) * 4 + 10 * 256 * 2 + 8);
  EXPECT_EQ(plan.backward_scratch_bytes(100, 10),
            100 * words * 16 + 10 * 256 * 16 + train_weight_grad_workspace_bytes(small_spec()) +
                train_weight_grad_list_bytes(small_spec(), 100, 10) + 4);
}

// The training kernels (and the transpose) are loaded once per context and kept: train_row_backward and
// train_weight_grad take them on every backward (loading one per call made each backward wait for its
// kernels, bench/README.md v51). A second plan of the same spec reports them as "memory" under the same
// names; another tile_n gets other kernels.
TEST(TrainingPlan, KeepsItsAuxiliaryKernelsPerContext) {
  ContextOptions o;  // a context of its own: nothing loaded before this test
  o.device = ContextOptions::kNoDevice;
  o.disk_cache = false;
  Context ctx(o);
  const auto names = [](const FfnTrainingPlan& plan) {
    std::map<std::string, KernelReport> out;
    for (const KernelReport& k : plan.kernels())
      if (k.kind == "transpose" || k.kind.rfind("train_", 0) == 0) out[k.kind] = k;
    return out;
  };
  const auto first = names(FfnTrainingPlan::create(ctx, small_spec(), 256));
  const auto second = names(FfnTrainingPlan::create(ctx, small_spec(), 512));
  ASSERT_EQ(first.size(), 3u);
  ASSERT_EQ(second.size(), 3u);
  for (const auto& [kind, k] : second) {
    EXPECT_EQ(k.name, first.at(kind).name) << kind;
    EXPECT_EQ(k.cache, "memory") << kind;
    EXPECT_EQ(k.compile_ms, 0.0) << kind;
  }
  FfnSpec narrow = small_spec();
  narrow.tile_n = 64;
  narrow.slots = 7;
  const auto other = names(FfnTrainingPlan::create(ctx, narrow, 256));
  EXPECT_NE(other.at("train_row_backward").name, first.at("train_row_backward").name);
  EXPECT_NE(other.at("train_weight_grad").name, first.at("train_weight_grad").name);
  EXPECT_NE(other.at("train_weight_grad").cache, "memory");
}

TEST(TrainingPlan, RefusesWhatItCannotTrainByName) {
  FfnSpec block = small_spec();
  block.consumer = ConsumerVariant::TokenBlock;
  expect_error([&] { FfnTrainingPlan::create(no_gpu(), block, 64); }, ErrorCode::InvalidArgument, "spec.consumer");
  FfnSpec wide = small_spec();
  wide.d_model = 16392;
  expect_error([&] { FfnTrainingPlan::create(no_gpu(), wide, 64); }, ErrorCode::InvalidArgument, "spec.d_model");
  expect_error([&] { FfnTrainingPlan::create(no_gpu(), small_spec(), 0); }, ErrorCode::InvalidArgument, "max_tokens");
  // dWd in an out_in Wd's layout goes through a 16-bit transpose: fp32 gradients are refused by name.
  FfnSpec out_in = small_spec();
  out_in.down_layout = WeightLayout::OutIn;
  TrainingPlanOptions as_weight;
  as_weight.dw_down_as_weight = true;
  expect_error([&] { FfnTrainingPlan::create(no_gpu(), out_in, 64, as_weight); }, ErrorCode::InvalidArgument,
               "options.dw_down_as_weight");
  FfnSpec in_out = small_spec();
  in_out.down_layout = WeightLayout::InOut;  // dWd^T is that layout already: no transpose, any gradient type
  EXPECT_NO_THROW(FfnTrainingPlan::create(no_gpu(), in_out, 64, as_weight));
  as_weight.gradients_in_dtype = true;
  EXPECT_NO_THROW(FfnTrainingPlan::create(no_gpu(), out_in, 64, as_weight));
}

// The dense path (TrainingDispatch::Dense and Auto) makes its two elementwise kernels at create() and
// reports them (a Sparse plan does not); its state size is g and u; a dispatch out of the enum is refused.
TEST(TrainingPlan, DenseAndAutoDispatchMakeTheDenseKernels) {
  const auto kinds = [](const FfnTrainingPlan& plan) {
    std::vector<std::string> out;
    for (const KernelReport& k : plan.kernels()) out.push_back(k.kind);
    return out;
  };
  const auto has = [](const std::vector<std::string>& v, const char* kind) { return std::find(v.begin(), v.end(), kind) != v.end(); };
  EXPECT_FALSE(has(kinds(FfnTrainingPlan::create(no_gpu(), small_spec(), 64)), "train_dense_forward"));
  for (const TrainingDispatch d : {TrainingDispatch::Dense, TrainingDispatch::Auto}) {
    TrainingPlanOptions o;
    o.dispatch = d;
    const FfnTrainingPlan plan = FfnTrainingPlan::create(no_gpu(), small_spec(), 64, o);
    EXPECT_TRUE(has(kinds(plan), "train_dense_forward"));
    EXPECT_TRUE(has(kinds(plan), "train_dense_backward"));
    EXPECT_TRUE(has(kinds(plan), "train_row_backward")) << "Auto and Dense keep the sparse kernels";
    EXPECT_EQ(plan.dense_state_bytes(100), 100 * 1024 * 2 * 2);
  }
  FfnSpec plain = small_spec();
  plain.gated = false;
  EXPECT_EQ(FfnTrainingPlan::create(no_gpu(), plain, 64).dense_state_bytes(100), 100 * 1024 * 2);
  TrainingPlanOptions bad;
  bad.dispatch = static_cast<TrainingDispatch>(7);
  expect_error([&] { FfnTrainingPlan::create(no_gpu(), small_spec(), 64, bad); }, ErrorCode::InvalidArgument, "options.dispatch");
  FfnTrainingPlan plan = FfnTrainingPlan::create(no_gpu(), small_spec(), 64);
  EXPECT_TRUE(plan.decisions().empty());
  plan.recalibrate();
}

// The split (TrainingPlanOptions::dense_neurons): a multiple of 64 below d_ff, else refused by name; a split
// plan makes the dense path's kernels with the TwELL ones, and its state holds the TwELL words of the other
// neurons plus the dense neurons' g and u.
TEST(TrainingPlan, SplitTakesMultiplesOf64BelowDff) {
  for (const int64_t bad : {int64_t{-64}, int64_t{100}, int64_t{1024}, int64_t{2048}}) {
    TrainingPlanOptions o;
    o.dense_neurons = bad;
    expect_error([&] { FfnTrainingPlan::create(no_gpu(), small_spec(), 64, o); }, ErrorCode::InvalidArgument,
                 "options.dense_neurons");
  }
  TrainingPlanOptions dense;  // a Dense plan has no TwELL part to split
  dense.dispatch = TrainingDispatch::Dense;
  dense.dense_neurons = 256;
  expect_error([&] { FfnTrainingPlan::create(no_gpu(), small_spec(), 64, dense); }, ErrorCode::InvalidArgument,
               "options.dense_neurons");
  TrainingPlanOptions o;
  o.dense_neurons = 256;
  const FfnTrainingPlan split = FfnTrainingPlan::create(no_gpu(), small_spec(), 64, o);
  bool dense_kernel = false;
  for (const KernelReport& k : split.kernels()) dense_kernel = dense_kernel || k.kind == "train_dense_backward";
  EXPECT_TRUE(dense_kernel);
  o.keep_u = false;  // (4 bytes per TwELL word: the words alone)
  const FfnTrainingPlan split_words = FfnTrainingPlan::create(no_gpu(), small_spec(), 64, o);
  const TwellLayout& l = split_words.layout();
  EXPECT_EQ(split_words.state_bytes(100, 0), 100 * l.words_per_row(1024 - 256) * 4 + 8 + 100 * 256 * 2 * 2);
  EXPECT_EQ(split_words.spec().d_ff, 1024) << "the plan's spec is the layer's";
}

// A Dense or Auto plan's kernels go into a bundle (Context::save_bundle) with the TwELL ones, and a context
// without the JIT makes the same plan from that bundle alone (the bundle reader checks each training
// kernel's name against its request).
TEST(TrainingPlan, DenseKernelsTravelInBundles) {
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / ("twell_train_dense_bundle_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  TrainingPlanOptions o;
  o.dispatch = TrainingDispatch::Auto;
  {
    ContextOptions co;
    co.device = ContextOptions::kNoDevice;
    co.disk_cache = false;
    Context maker(co);
    FfnTrainingPlan::create(maker, small_spec(), 64, o);
    maker.save_bundle(dir);
  }
  ContextOptions co;
  co.device = ContextOptions::kNoDevice;
  co.disk_cache = false;
  co.jit = ContextOptions::Jit::Never;
  co.bundles = {dir};
  Context user(co);
  const FfnTrainingPlan plan = FfnTrainingPlan::create(user, small_spec(), 64, o);
  int dense_kernels = 0;
  for (const KernelReport& k : plan.kernels())
    if (k.kind == "train_dense_forward" || k.kind == "train_dense_backward") {
      ++dense_kernels;
      EXPECT_EQ(k.cache.rfind("bundle", 0), 0u) << k.kind << " came from " << k.cache;
    }
  EXPECT_EQ(dense_kernels, 2);
  std::filesystem::remove_all(dir);
}

// A training plan compiles only what it launches: not the inference plan's decode kernels, nor the fused
// gated-up kernel of an inference split's dense neurons (the training plan computes those itself). Every
// kernel the context obtained goes into save_bundle's bundle, one file per kernel.
TEST(TrainingPlan, CompilesNoDecodeOrInferenceSplitKernels) {
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / ("twell_train_kernels_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  ContextOptions co;
  co.device = ContextOptions::kNoDevice;
  co.disk_cache = false;
  Context ctx(co);
  TrainingPlanOptions o;
  o.dense_neurons = 256;
  FfnTrainingPlan::create(ctx, small_spec(), 64, o);
  ctx.save_bundle(dir);
  int files = 0;
  for (const auto& entry : std::filesystem::recursive_directory_iterator(dir)) {
    if (entry.path().extension() != ".cubin") continue;
    ++files;
    const std::string name = entry.path().filename().string();
    EXPECT_EQ(name.find("decode"), std::string::npos) << "kernel file " << name;
    EXPECT_EQ(name.find("dense_gated_up"), std::string::npos) << name;
  }
  EXPECT_GE(files, 5) << "gate, consumer, the two training kernels and the dense elementwise kernels";
  std::filesystem::remove_all(dir);
}

TEST(TrainingPlan, RunTimeCallsWithoutAGpuOrOnAnEmptyPlanAreClearErrors) {
  FfnTrainingPlan plan = FfnTrainingPlan::create(no_gpu(), small_spec(), 64);
  expect_error([&] { plan.make_state(); }, ErrorCode::NoDevice, "make_state");
  FfnTrainingState state;
  EXPECT_EQ(state.tokens(), -1);
  EXPECT_EQ(state.device_bytes(), 0u);
  expect_error([&] { plan.forward(nullptr, FfnTensors{}, 1, state); }, ErrorCode::NoDevice, "forward");
  expect_error([&] { plan.backward(nullptr, FfnTensors{}, nullptr, 0, 1, state, FfnGradients{}, 0.0f); },
               ErrorCode::NoDevice, "backward");
  FfnTrainingPlan moved = std::move(plan);
  expect_error([&] { plan.make_state(); }, ErrorCode::InvalidArgument, "empty");
  expect_error([&] { plan.forward(nullptr, FfnTensors{}, 1, state); }, ErrorCode::InvalidArgument, "empty");
  EXPECT_FALSE(plan.runnable());
  EXPECT_EQ(moved.max_tokens(), 64);
}

}  // namespace
