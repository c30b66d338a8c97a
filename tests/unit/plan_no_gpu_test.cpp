// FfnPlan limits, and FfnPlan on a machine without a GPU: plans are generated and compiled, and every call that would
// launch or copy says why it cannot (Error(NoDevice)) or what is missing (Error(InvalidArgument)).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include <fmt/format.h>

#include "driver.h"
#include "plan_setup.h"
#include "twell/context.h"
#include "twell/device_memory.h"
#include "twell/error.h"
#include "twell/format.h"

namespace {

using namespace twell;

TEST(PlanWithoutGpu, ConsumerAloneAndUploadSayWhy) {
  if (detail::Driver::available()) GTEST_SKIP() << "a CUDA device is present: the no-GPU path cannot be tested";
  Context ctx = twell::testing::context_without_disk_cache();
  const FfnSpec s = twell::testing::spec_512x1408();
  FfnPlan plan = ctx.plan(s, 64);
  EXPECT_FALSE(plan.runnable());
  FfnTensors t{};
  try {
    plan.run_consumer(nullptr, t, 64);
    FAIL() << "run_consumer without a TwELL matrix";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::InvalidArgument) << e.what();
    EXPECT_NE(std::string(e.what()).find("holds no TwELL matrix"), std::string::npos) << e.what();
  }
  TwellMatrix m;
  m.layout = plan.layout();
  m.d_ff = s.d_ff;
  try {
    plan.upload_twell(nullptr, m);
    FAIL() << "upload_twell without a GPU";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::NoDevice) << e.what();
  }
  try {
    plan.run_gate(nullptr, t, 64);
    FAIL() << "run_gate without a GPU";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::NoDevice) << e.what();
  }
}

}  // namespace

namespace {

// Limits checked when the plan is made, before any allocation (with or without a GPU).
TEST(PlanLimits, GridAndOverflowCounterLimitsAreNamed) {
  Context ctx = twell::testing::context_without_disk_cache();
  FfnSpec s;
  s.d_model = 512;
  s.d_ff = 5632;
  try {
    ctx.plan(s, (int64_t{1} << 31) - 1);  // 22 tiles per row: 2^31 * 22 overflow counts would not fit 32 bits
    FAIL() << "accepted max_tokens * tiles >= 2^32";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::InvalidArgument) << e.what();
    EXPECT_NE(std::string(e.what()).find("max_tokens: expected max_tokens * d_ff tiles < 2^32"), std::string::npos) << e.what();
  }
  s.d_ff = 65536 * 32 + 1;
  s.tile_n = 32;
  try {
    ctx.plan(s, 16);
    FAIL() << "accepted more than 65535 tiles";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::InvalidArgument) << e.what();
    EXPECT_NE(std::string(e.what()).find("FfnSpec::d_ff: expected at most 65535 tiles"), std::string::npos) << e.what();
  }
}

}  // namespace

namespace {

// PlanOptions::decode_max_tokens: 0..64, named when outside; the decode kernels are made (and
// compiled) with or without a GPU where the shape allows them, and not when turned off.
TEST(PlanLimits, DecodeMaxTokensIsCheckedAndMakesTheDecodeKernels) {
  Context ctx = twell::testing::context_without_disk_cache();
  const FfnSpec s = twell::testing::spec_512x1408();
  for (int64_t bad : {int64_t{-1}, int64_t{65}}) {
    PlanOptions options;
    options.decode_max_tokens = bad;
    try {
      ctx.plan(s, 16, options);
      ADD_FAILURE() << "decode_max_tokens " << bad << " accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::InvalidArgument) << e.what();
      EXPECT_NE(std::string(e.what()).find("PlanOptions::decode_max_tokens: expected 0..64"), std::string::npos) << e.what();
    }
  }
  // The decode kernels read Wd in the spec's layout (an out_in plan's consumer reads an in_out copy).
  // Counted with the fused one (decode_fused, PlanOptions::decode_fused_max_tokens) apart: a plan
  // without a GPU keeps it (for bundles); with one, this small shape fits any GPU's shared memory.
  auto decode_kernels = [&](const PlanOptions& options, WeightLayout layout = WeightLayout::OutIn, int* fused = nullptr) {
    int n = 0;
    if (fused) *fused = 0;
    FfnSpec spec = s;
    spec.down_layout = layout;
    const char* expected = layout == WeightLayout::OutIn ? "_out_in_" : "_in_out_";
    const FfnPlan plan = ctx.plan(spec, 16, options);  // held: kernels() refers into it
    for (const KernelReport& k : plan.kernels())
      if (k.kind.rfind("decode_", 0) == 0) {
        ++n;
        EXPECT_NE(k.name.find(expected), std::string::npos) << k.name;
        if (k.kind == "decode_fused" && fused) ++*fused;
      }
    // The plan's IR names the fused kernel exactly when the plan holds it.
    const bool holds_fused = std::any_of(plan.kernels().begin(), plan.kernels().end(),
                                         [](const KernelReport& k) { return k.kind == "decode_fused"; });
    EXPECT_EQ(plan.ir().find("(decode_fused.cuh)") != std::string::npos, holds_fused) << plan.ir().substr(0, 400);
    return n;
  };
  int fused = -1;
  EXPECT_EQ(decode_kernels(PlanOptions{}, WeightLayout::OutIn, &fused), 5);
  EXPECT_EQ(fused, 1);
  EXPECT_EQ(decode_kernels(PlanOptions{}, WeightLayout::InOut, &fused), 5);
  EXPECT_EQ(fused, 1);
  // decode_fused_max_tokens = 0: the four kernels alone.
  PlanOptions four;
  four.decode_fused_max_tokens = 0;
  EXPECT_EQ(decode_kernels(four, WeightLayout::OutIn, &fused), 4);
  EXPECT_EQ(fused, 0);
  PlanOptions off;
  off.decode_max_tokens = 0;
  EXPECT_EQ(decode_kernels(off), 0);
  // decode_max_tokens = 0 turns the fused kernel off too, whatever decode_fused_max_tokens says.
  off.decode_fused_max_tokens = 8;
  EXPECT_EQ(decode_kernels(off), 0);
  // None beside a token-block consumer asked for (its h is rounded; the decode kernels repeat the row
  // consumers' sums), whatever the layout.
  FfnSpec block = s;
  block.consumer = ConsumerVariant::TokenBlock;
  for (WeightLayout layout : {WeightLayout::OutIn, WeightLayout::InOut}) {
    block.down_layout = layout;
    const FfnPlan plan = ctx.plan(block, 16, PlanOptions{});
    for (const KernelReport& k : plan.kernels()) EXPECT_NE(k.kind.rfind("decode_", 0), 0u) << k.name;
  }
}

// PlanOptions::decode_fused_max_tokens: 0..32 (the fused kernel's rows), named when outside, whatever
// decode_max_tokens says; every value inside is accepted (with or without a GPU).
TEST(PlanLimits, DecodeFusedMaxTokensIsChecked) {
  Context ctx = twell::testing::context_without_disk_cache();
  const FfnSpec s = twell::testing::spec_512x1408();
  for (int64_t decode_max_tokens : {int64_t{0}, int64_t{64}})
    for (int64_t bad : {int64_t{-1}, int64_t{33}, int64_t{64}, std::numeric_limits<int64_t>::min()}) {
      PlanOptions options;
      options.decode_max_tokens = decode_max_tokens;
      options.decode_fused_max_tokens = bad;
      try {
        ctx.plan(s, 16, options);
        ADD_FAILURE() << "decode_fused_max_tokens " << bad << " accepted (decode_max_tokens " << decode_max_tokens << ")";
      } catch (const Error& e) {
        EXPECT_EQ(e.code(), ErrorCode::InvalidArgument) << e.what();
        EXPECT_NE(std::string(e.what()).find("PlanOptions::decode_fused_max_tokens: expected 0..32"), std::string::npos) << e.what();
        EXPECT_NE(std::string(e.what()).find(fmt::format("got {}", bad)), std::string::npos) << e.what();
      }
    }
  for (int64_t good : {int64_t{0}, int64_t{1}, int64_t{8}, int64_t{9}, int64_t{16}, int64_t{17}, int64_t{32}}) {
    PlanOptions options;
    options.decode_fused_max_tokens = good;
    EXPECT_NO_THROW(ctx.plan(s, 16, options)) << good;
  }
}

}  // namespace

namespace {

// time_graph_on_stream names a bad argument before touching the driver (with or without a GPU).
TEST(TimeGraphOnStream, ArgumentsAreNamed) {
  auto message = [](Stream s, int calls, int reps) {
    try {
      time_graph_on_stream(s, [] {}, calls, reps);
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::InvalidArgument) << e.what();
      return std::string(e.what());
    }
    return std::string("no error");
  };
  Stream fake = reinterpret_cast<Stream>(uintptr_t{0x1000});  // never reaches the driver: the counts are checked first
  EXPECT_NE(message(nullptr, 1, 1).find("stream: expected a created stream"), std::string::npos);
  EXPECT_NE(message(fake, 0, 1).find("calls: expected at least 1, got 0"), std::string::npos);
  EXPECT_NE(message(fake, 1, -2).find("reps: expected at least 1, got -2"), std::string::npos);
}

}  // namespace

namespace {

// Threshold -0.0 is +0.0 in the runtime too (issue 16): the second plan finds the first one's kernels
// in memory, under the same names, instead of compiling a second set; a threshold above the dtype's
// range is named. With or without a GPU.
TEST(PlanLimits, NegativeZeroThresholdSharesTheKernelsOfZero) {
  Context ctx = twell::testing::context_without_disk_cache();
  FfnSpec s = twell::testing::spec_512x1408();
  PlanOptions sparse;
  sparse.dispatch = Dispatch::Sparse;
  sparse.decode_max_tokens = 0;
  const FfnPlan zero = ctx.plan(s, 16, sparse);
  s.threshold = -0.0f;
  const FfnPlan negative_zero = ctx.plan(s, 16, sparse);
  EXPECT_FALSE(std::signbit(negative_zero.spec().threshold));
  ASSERT_EQ(zero.kernels().size(), negative_zero.kernels().size());
  for (size_t i = 0; i < zero.kernels().size(); ++i) {
    EXPECT_EQ(zero.kernels()[i].name, negative_zero.kernels()[i].name);
    EXPECT_EQ(negative_zero.kernels()[i].cache, "memory") << negative_zero.kernels()[i].name;
  }

  s.dtype = DType::FP16;
  s.activation = Activation::SiLU;
  s.threshold = 3e38f;
  try {
    ctx.plan(s, 16, sparse);
    FAIL() << "an f16 threshold of 3e38 was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::InvalidArgument) << e.what();
    EXPECT_NE(std::string(e.what()).find("FfnSpec::threshold: expected at most 65504 with dtype f16"), std::string::npos)
        << e.what();
  }
}

}  // namespace
