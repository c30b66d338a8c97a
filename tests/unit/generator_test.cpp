// The generator end to end without a GPU: every generated kernel compiles with NVRTC and its PTX
// assembles with ptxas, for the Hopper and the portable targets; bad specs get precise errors.
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>

#include <fmt/format.h>

#include "twell/compiler/Generate.h"
#include "twell/context.h"
#include "twell/error.h"

using namespace twell;

namespace {

const char* kPtxas = "/usr/local/cuda/bin/ptxas";

void expect_ptx_assembles(const std::string& ptx, const std::string& arch, const std::string& name) {
  const auto dir = std::filesystem::temp_directory_path() / fmt::format("twell_ptxas_{}", ::getpid());
  std::filesystem::create_directories(dir);
  const auto file = dir / (name + ".ptx");
  std::ofstream(file) << ptx;
  const std::string cmd = fmt::format("{} -arch={} {} -o {} 2>&1", kPtxas, arch, file.string(), (dir / (name + ".cubin")).string());
  EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
  std::filesystem::remove_all(dir);
}

ContextOptions memory_only(Target t) {
  ContextOptions o;
  o.disk_cache = false;
  o.target = t;
  return o;
}

}  // namespace

TEST(Generator, EveryKernelCompilesAndAssembles) {
  if (!std::filesystem::exists(kPtxas)) GTEST_SKIP() << "ptxas not found at " << kPtxas << ": cannot assemble the PTX";
  struct Case {
    int64_t d_model, d_ff;
    int tile_n, slots;
    DType dtype;
    Activation act;
    float threshold;
    WeightLayout down;
  };
  const std::vector<Case> cases = {
      {2048, 5632, 256, 31, DType::BF16, Activation::ReLU, 0.0f, WeightLayout::OutIn},   // the paper's shape
      {512, 1408, 256, 63, DType::BF16, Activation::ReLU, 0.0f, WeightLayout::OutIn},    // model "tiny"
      {520, 1408, 128, 15, DType::FP16, Activation::ReLU, 0.25f, WeightLayout::InOut},   // odd d_model, fp16
      {72, 300, 32, 7, DType::BF16, Activation::SiLU, 0.05f, WeightLayout::OutIn},
      {4096, 11008, 1024, 127, DType::BF16, Activation::ReLU, 0.0f, WeightLayout::OutIn},
  };
  for (const Target target : {Target{90, true}, Target{80, false}}) {
    Context ctx(memory_only(target));
    for (const auto& c : cases) {
      FfnSpec s;
      s.d_model = c.d_model;
      s.d_ff = c.d_ff;
      s.tile_n = c.tile_n;
      s.slots = c.slots;
      s.dtype = c.dtype;
      s.activation = c.act;
      s.threshold = c.threshold;
      s.down_layout = c.down;
      const auto gen = compiler::generateFfn(s, target);
      ASSERT_EQ(gen.kernels.size(), 2u);
      EXPECT_EQ(gen.layout.tile_n, c.tile_n);
      EXPECT_EQ(gen.layout.slots, c.slots);
      EXPECT_NE(gen.ir.find("twell."), std::string::npos);
      for (const auto& k : ctx.compile(gen)) {
        EXPECT_GT(k.ptx.size(), 0u);
        EXPECT_GT(k.cubin_bytes, 0u);
        EXPECT_NE(k.ptx.find(".entry " + k.report.name), std::string::npos) << k.report.name;
        expect_ptx_assembles(k.ptx, target.arch(), k.report.name);
      }
    }
  }
}

TEST(Generator, KernelNamesDifferWhenConstantsDiffer) {
  FfnSpec a;
  a.d_model = 512;
  a.d_ff = 1408;
  FfnSpec b = a;
  b.threshold = 0.125f;
  const auto ga = compiler::generateFfn(a, Target{});
  const auto gb = compiler::generateFfn(b, Target{});
  EXPECT_NE(ga.kernels[0].name, gb.kernels[0].name);
  EXPECT_NE(ga.kernels[0].source, gb.kernels[0].source);
  EXPECT_NE(ga.kernels[0].name, compiler::generateFfn(a, Target{80, false}).kernels[0].name);
}

TEST(Generator, IllegalSpecsNameTheField) {
  auto message = [](FfnSpec s) {
    try {
      compiler::generateFfn(s, Target{});
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("(no error)");
  };
  FfnSpec s;
  s.d_model = 512;
  s.d_ff = 1408;
  s.tile_n = 300;
  EXPECT_NE(message(s).find("tile_n"), std::string::npos) << message(s);
  s.tile_n = 256;
  s.slots = 0;
  EXPECT_NE(message(s).find("slots"), std::string::npos) << message(s);
  s.slots = 31;
  s.threshold = -0.5f;
  EXPECT_NE(message(s).find("threshold"), std::string::npos) << message(s);
}

TEST(Generator, FromMlirReportsParseErrorsWithLocation) {
  try {
    compiler::generateFromMlir("func.func @f() { twell.bogus }", "bad.mlir", Target{});
    FAIL() << "expected a parse error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::Parse);
    EXPECT_NE(std::string(e.what()).find("bad.mlir:1"), std::string::npos) << e.what();
  }
}
