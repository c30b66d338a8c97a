// The generator's argument checks without a GPU: targets NVRTC cannot build for and FfnSpec enum fields
// outside their enums are rejected with a message naming the argument, what is accepted and what was
// given, before any kernel is generated.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "twell/compiler/Generate.h"
#include "twell/error.h"

using namespace twell;

namespace {

FfnSpec smallSpec() {
  FfnSpec s;
  s.d_model = 512;
  s.d_ff = 1408;
  return s;
}

// The InvalidArgument message of generateFfn(spec, target), or a failure.
std::string ffnError(const FfnSpec& spec, const Target& target) {
  try {
    compiler::generateFfn(spec, target);
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::InvalidArgument) << e.what();
    return e.what();
  }
  ADD_FAILURE() << "generateFfn accepted " << target.arch();
  return {};
}

const char* kModule = R"mlir(
#L = #twell.layout<tile_n = 256, slots = 31, value = bf16, index = i16, activation = relu, threshold = 0.0>
func.func @ffn(%x: tensor<?x512xbf16>, %wg: tensor<1408x512xbf16>, %wu: tensor<1408x512xbf16>,
               %wd: tensor<512x1408xbf16>) -> tensor<?x512xbf16> {
  %y = twell.gated_ffn %x, %wg, %wu, %wd {layout = #L}
      : (tensor<?x512xbf16>, tensor<1408x512xbf16>, tensor<1408x512xbf16>, tensor<512x1408xbf16>) -> tensor<?x512xbf16>
  return %y : tensor<?x512xbf16>
}
)mlir";

// What NVRTC 13.0 builds (nvcc --list-gpu-arch, nvrtcGetSupportedArchs) at or above sm_80, and the
// arch-specific variants it has.
const std::vector<Target> kSupported = {
    {80, false},  {86, false},  {87, false},  {88, false},  {89, false},  {90, false},
    {100, false}, {103, false}, {110, false}, {120, false}, {121, false}, {90, true},
    {100, true},  {103, true},  {110, true},  {120, true},  {121, true},
};

const std::vector<Target> kUnsupported = {
    {80, true},         // no sm_80a
    {89, true},         // no sm_89a
    {75, false},        // below sm_80 (no bf16 tensor cores)
    {101, false},       // not in NVRTC 13.0
    {130, false},       // not yet
    {1000, false},      // not an architecture
    {2147483647, false},
    {-90, false},
    {0, true},
};

}  // namespace

TEST(GeneratorValidation, SupportedTargetsAreExactlyNvrtcs) {
  for (const Target& t : kSupported) EXPECT_TRUE(compiler::isSupportedTarget(t)) << t.arch();
  for (const Target& t : kUnsupported) EXPECT_FALSE(compiler::isSupportedTarget(t)) << t.arch();
  const std::string list = compiler::supportedTargets();
  for (const Target& t : kSupported) EXPECT_NE(list.find(t.arch()), std::string::npos) << list;
  EXPECT_EQ(list.find("sm_80a"), std::string::npos) << list;
  EXPECT_EQ(list.find("sm_75"), std::string::npos) << list;
}

TEST(GeneratorValidation, EverySupportedTargetGenerates) {
  for (const Target& t : kSupported) {
    SCOPED_TRACE(t.arch());
    EXPECT_NO_THROW({
      compiler::GeneratedFfn g = compiler::generateFfn(smallSpec(), t);
      EXPECT_EQ(g.target.arch(), t.arch());
      EXPECT_EQ(g.kernels.size(), 2u);
    });
  }
}

TEST(GeneratorValidation, UnsupportedTargetsAreRejectedByGenerateFfn) {
  for (const Target& t : kUnsupported) {
    SCOPED_TRACE(t.arch());
    const std::string message = ffnError(smallSpec(), t);
    EXPECT_NE(message.find("generateFfn: target: "), std::string::npos) << message;
    EXPECT_NE(message.find(compiler::supportedTargets()), std::string::npos) << message;
    EXPECT_NE(message.find("got " + t.arch()), std::string::npos) << message;
  }
}

TEST(GeneratorValidation, UnsupportedTargetsAreRejectedByGenerateFromMlir) {
  // The module itself is fine for a supported target.
  EXPECT_NO_THROW(compiler::generateFromMlir(kModule, "ffn.mlir", Target{90, true}));
  for (const Target& t : kUnsupported) {
    SCOPED_TRACE(t.arch());
    try {
      compiler::generateFromMlir(kModule, "ffn.mlir", t);
      ADD_FAILURE() << "generateFromMlir accepted " << t.arch();
    } catch (const Error& e) {
      const std::string message = e.what();
      EXPECT_EQ(e.code(), ErrorCode::InvalidArgument) << message;
      EXPECT_NE(message.find("generateFromMlir: target: "), std::string::npos) << message;
      EXPECT_NE(message.find(compiler::supportedTargets()), std::string::npos) << message;
      EXPECT_NE(message.find("got " + t.arch()), std::string::npos) << message;
    }
  }
}

// An explicit #twell.target in the IR goes through the same list (the attribute's verifier).
TEST(GeneratorValidation, UnsupportedTargetInTheIrIsAParseError) {
  const std::string module = R"mlir(
func.func private @f() attributes {target = #twell.target<"sm_80a", []>}
)mlir";
  try {
    compiler::generateFromMlir(module, "target.mlir", Target{80, false});
    FAIL() << "an sm_80a #twell.target was accepted";
  } catch (const Error& e) {
    const std::string message = e.what();
    EXPECT_EQ(e.code(), ErrorCode::Parse) << message;
    EXPECT_NE(message.find("target.mlir:2"), std::string::npos) << message;
    EXPECT_NE(message.find(compiler::supportedTargets()), std::string::npos) << message;
    EXPECT_NE(message.find("got \"sm_80a\""), std::string::npos) << message;
  }
}

TEST(GeneratorValidation, EnumFieldsOutOfRangeNameTheField) {
  struct Case {
    const char* expected;
    void (*corrupt)(FfnSpec&);
  };
  const Case cases[] = {
      {"generateFfn: spec.dtype: expected bf16 or f16, got 7",
       [](FfnSpec& s) { s.dtype = static_cast<DType>(7); }},
      {"generateFfn: spec.activation: expected relu or silu, got 9",
       [](FfnSpec& s) { s.activation = static_cast<Activation>(9); }},
      {"generateFfn: spec.down_layout: expected out_in or in_out, got 5",
       [](FfnSpec& s) { s.down_layout = static_cast<WeightLayout>(5); }},
      {"generateFfn: spec.dtype: expected bf16 or f16, got 255",
       [](FfnSpec& s) { s.dtype = static_cast<DType>(255); }},
      {"generateFfn: spec.consumer: expected row_gather or token_block, got 3",
       [](FfnSpec& s) { s.consumer = static_cast<ConsumerVariant>(3); }},
  };
  for (const Case& c : cases) {
    FfnSpec s = smallSpec();
    c.corrupt(s);
    EXPECT_EQ(ffnError(s, Target{90, true}), c.expected);
  }
}

// A token-block request where the shape does not allow it (d_model not a multiple of 128, an out_in
// Wd) falls back to the row consumer; where it does, the consumer is the token block.
TEST(GeneratorValidation, TokenBlockWhereTheShapeAllowsIt) {
  FfnSpec s;
  s.d_model = 512;
  s.d_ff = 1408;
  s.down_layout = WeightLayout::InOut;
  s.consumer = ConsumerVariant::TokenBlock;
  EXPECT_EQ(compiler::generateFfn(s, Target{90, true}).kernels.at(1).consumer, kernels::ConsumerKind::TokenBlock);
  EXPECT_EQ(compiler::generateFfn(s, Target{80, false}).kernels.at(1).consumer, kernels::ConsumerKind::TokenBlock);
  s.d_model = 520;
  EXPECT_EQ(compiler::generateFfn(s, Target{90, true}).kernels.at(1).consumer, kernels::ConsumerKind::WarpRow);
  s.d_model = 768;  // a multiple of 128, but Wd^T rows of 96 chunks do not tile 256 threads
  EXPECT_EQ(compiler::generateFfn(s, Target{90, true}).kernels.at(1).consumer, kernels::ConsumerKind::WarpRow);
  s.d_model = 512;
  s.down_layout = WeightLayout::OutIn;
  EXPECT_EQ(compiler::generateFfn(s, Target{90, true}).kernels.at(1).consumer, kernels::ConsumerKind::CtaRow);
}

TEST(GeneratorValidation, EveryValidEnumValueGenerates) {
  for (DType dtype : {DType::BF16, DType::FP16})
    for (WeightLayout down : {WeightLayout::OutIn, WeightLayout::InOut})
      for (Activation act : {Activation::ReLU, Activation::SiLU}) {
        FfnSpec s = smallSpec();
        s.dtype = dtype;
        s.down_layout = down;
        s.activation = act;
        s.threshold = act == Activation::SiLU ? 0.05f : 0.0f;
        EXPECT_NO_THROW(compiler::generateFfn(s, Target{80, false}))
            << to_string(dtype) << " " << to_string(down) << " " << to_string(act);
      }
}

// A threshold above the dtype's largest finite value keeps no activation (issue 16: an f16 SiLU
// threshold of 3e38 was accepted): rejected naming the field, the dtype and the bound, for both
// activations and dtypes; the bound itself is accepted.
TEST(GeneratorValidation, ThresholdAboveTheDtypeRangeIsRejected) {
  struct Case {
    DType dtype;
    Activation activation;
    float threshold;
    const char* expected;
  };
  const Case cases[] = {
      {DType::FP16, Activation::SiLU, 3e38f,
       "generateFfn: spec.threshold: expected at most 65504 with dtype f16 (its largest finite value: no activation "
       "could pass a larger threshold), got 3e+38"},
      {DType::FP16, Activation::ReLU, 65505.0f, "spec.threshold: expected at most 65504 with dtype f16"},
      {DType::BF16, Activation::ReLU, 3.4e38f, "spec.threshold: expected at most 3.38953e+38 with dtype bf16"},
      {DType::BF16, Activation::SiLU, 3.4e38f, "spec.threshold: expected at most 3.38953e+38 with dtype bf16"},
  };
  for (const Case& c : cases) {
    FfnSpec s = smallSpec();
    s.dtype = c.dtype;
    s.activation = c.activation;
    s.threshold = c.threshold;
    EXPECT_NE(ffnError(s, Target{90, true}).find(c.expected), std::string::npos) << c.expected;
  }
  FfnSpec at_bound = smallSpec();
  at_bound.dtype = DType::FP16;
  at_bound.threshold = 65504.0f;
  EXPECT_EQ(compiler::generateFfn(at_bound, Target{90, true}).layout.threshold, 65504.0f);
}

// The same bound in the dialect: #twell.layout's verifier names the threshold, the value type and the
// bound (generateFromMlir's Parse error).
TEST(GeneratorValidation, LayoutThresholdAboveTheValueRangeIsAParseError) {
  std::string text = kModule;
  const std::string from = "value = bf16, index = i16, activation = relu, threshold = 0.0";
  text.replace(text.find(from), from.size(), "value = f16, index = i16, activation = silu, threshold = 3.0e+38");
  for (size_t at; (at = text.find("xbf16")) != std::string::npos;) text.replace(at, 5, "xf16");  // the tensors' type
  try {
    compiler::generateFromMlir(text, "f16.mlir", Target{90, true});
    ADD_FAILURE() << "an f16 layout with threshold 3e38 was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::Parse) << e.what();
    EXPECT_NE(std::string(e.what()).find("threshold must be at most 65504.0, the largest finite f16 (no activation could "
                                         "pass it), got 3.0e+38"),
              std::string::npos)
        << e.what();
  }
}

// Threshold -0.0 is +0.0 (issue 16: it compiled a second kernel set, a second cache entry, for the same
// layer): generateFfn and generateFromMlir give the same kernels, names and layout as for 0.0.
TEST(GeneratorValidation, NegativeZeroThresholdGivesTheKernelsOfZero) {
  FfnSpec zero = smallSpec(), negative_zero = smallSpec();
  negative_zero.threshold = -0.0f;
  const compiler::GeneratedFfn a = compiler::generateFfn(zero, Target{90, true});
  const compiler::GeneratedFfn b = compiler::generateFfn(negative_zero, Target{90, true});
  ASSERT_EQ(a.kernels.size(), b.kernels.size());
  for (size_t i = 0; i < a.kernels.size(); ++i) {
    EXPECT_EQ(a.kernels[i].name, b.kernels[i].name);
    EXPECT_EQ(a.kernels[i].source, b.kernels[i].source);
  }
  ASSERT_EQ(a.decode.size(), b.decode.size());
  for (size_t i = 0; i < a.decode.size(); ++i) EXPECT_EQ(a.decode[i].name, b.decode[i].name);
  EXPECT_FALSE(std::signbit(b.layout.threshold));
  EXPECT_EQ(a.ir, b.ir);

  std::string text = kModule;
  const compiler::GeneratedFfn from_zero = compiler::generateFromMlir(text, "zero.mlir", Target{90, true});
  text.replace(text.find("threshold = 0.0"), 15, "threshold = -0.0");
  const compiler::GeneratedFfn from_negative_zero = compiler::generateFromMlir(text, "negative_zero.mlir", Target{90, true});
  ASSERT_EQ(from_zero.kernels.size(), from_negative_zero.kernels.size());
  for (size_t i = 0; i < from_zero.kernels.size(); ++i)
    EXPECT_EQ(from_zero.kernels[i].name, from_negative_zero.kernels[i].name);
  EXPECT_FALSE(std::signbit(from_negative_zero.layout.threshold));
}
