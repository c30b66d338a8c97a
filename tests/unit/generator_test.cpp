// The generator end to end without a GPU: every generated kernel compiles with NVRTC and its PTX
// assembles with ptxas, for the Hopper and the portable targets; bad specs get precise errors.
#include <gtest/gtest.h>

#include <algorithm>
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
      {514, 1408, 256, 31, DType::BF16, Activation::ReLU, 0.0f, WeightLayout::OutIn},     // fma main loop
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

namespace {

FfnSpec shape(int64_t d_model, int64_t d_ff, int tile_n, int slots) {
  FfnSpec s;
  s.d_model = d_model;
  s.d_ff = d_ff;
  s.tile_n = tile_n;
  s.slots = slots;
  return s;
}

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

}  // namespace

// The gate kernel's main loop: on sm_90a, wgmma (TMA + wgmma, 384 threads, cta_m 128, cta_k 64 where
// d_model % 64 == 0 else 32, the deepest ring of at most 6 stages of (128 + tile_n) * cta_k * 2 bytes
// that fits 227 KiB beside the staging area) wherever d_model % 32 == 0 and tile_n is 64, 128 or 256. Elsewhere, and on the other targets, mma_sync (tensor cores)
// wherever d_model % 8 == 0 and 64 <= tile_n <= 1024, with cta_m = min(128, 32768 / tile_n), cta_k = 32, the deepest pipeline of 4, 3, 2
// stages whose max(stages * (cta_m + tile_n) * 80, cta_m * tile_n * 2) bytes fit 200 KiB; fma otherwise.
TEST(Generator, SelectsTheTensorCoreMainLoopWhereAllowed) {
  struct Case {
    int64_t d_model;
    int tile_n;
    int cta_m, stages;  // stages 0: fma
  };
  const std::vector<Case> cases = {
      {2048, 256, 128, 4},   // the paper's shape: 4 * 30720 bytes
      {2048, 64, 128, 4},    // the narrowest tile
      {2048, 128, 128, 4},
      {4096, 512, 64, 4},    // 4 * 46080 = 184320 bytes
      {4096, 1024, 32, 2},   // 3 * 84480 = 253440 would not fit
      {520, 256, 128, 4},    // 520 % 8 == 0
      {544, 256, 128, 4},    // 544 % 32 == 0: wgmma at cta_k 32 on sm_90a
      {544, 128, 128, 4},
      {514, 256, 64, 0},     // 514 % 8 != 0: fma, cta_m = 16384 / tile_n
      {2048, 32, 512, 0},    // tile_n 32: fma
      {514, 1024, 16, 0},
  };
  for (const Target target : {Target{90, true}, Target{80, false}, Target{120, false}}) {
    for (const auto& c : cases) {
      SCOPED_TRACE(fmt::format("{} d_model {} tile_n {}", target.arch(), c.d_model, c.tile_n));
      const auto gen = compiler::generateFfn(shape(c.d_model, 5632, c.tile_n, 7), target);
      ASSERT_EQ(gen.kernels.size(), 2u);
      const compiler::KernelSource& gate = gen.kernels[0];
      const compiler::KernelSource& down = gen.kernels[1];
      ASSERT_EQ(gate.kind, compiler::KernelKind::GateTwell);
      ASSERT_EQ(down.kind, compiler::KernelKind::GatedDown);
      const bool mma = c.stages > 0;
      const bool wgmma = mma && target.arch_specific && c.d_model % 32 == 0 &&
                         (c.tile_n == 64 || c.tile_n == 128 || c.tile_n == 256);
      // The warp-per-row consumer keeps each warp's x row in dynamic shared memory.
      EXPECT_EQ(down.smem_bytes, down.cta_m == 8 ? 8 * ((c.d_model + 255) / 256 * 256) * 2 : 0);
      EXPECT_EQ(gate.tma_persistent, wgmma);
      EXPECT_EQ(gate.persistent, wgmma);
      // The warp-per-row consumer (after a tensor-core gate, in_out Wd: shape() says which) loops over
      // rows: persistent; the CTA-per-row one is not.
      EXPECT_EQ(down.persistent, down.cta_m == 8);
      if (wgmma) {
        const int cta_k = c.d_model % 64 == 0 ? 64 : 32;
        const int stages = cta_k == 32 ? 6 : c.tile_n == 256 ? 3 : c.tile_n == 128 ? 5 : 6;
        EXPECT_EQ(gate.cta_m, 128);
        EXPECT_EQ(gate.cta_k, cta_k);
        EXPECT_EQ(gate.cluster_m, 2);  // sm_90a has multicast
        EXPECT_EQ(gate.threads, 384);
        EXPECT_EQ(gate.smem_bytes, stages * ((128 + c.tile_n) * cta_k * 2 + 16) + 128 * (c.tile_n + 8) * 2 + 1024 + 32);
        EXPECT_LE(gate.smem_bytes, 227 * 1024);
        EXPECT_EQ(gate.operand_alignment, 8);
        EXPECT_EQ(down.operand_alignment, 2);
        EXPECT_TRUE(contains(gate.source, fmt::format("static constexpr int cta_k = {};\n", cta_k))) << gate.source;
        EXPECT_TRUE(contains(gate.source, "static constexpr int mainloop = 2;")) << gate.source;
        EXPECT_TRUE(contains(gate.source, "__launch_bounds__(384, 1)")) << gate.source;
        EXPECT_TRUE(contains(gate.source, "const __grid_constant__ twell::device::GateParams p")) << gate.source;
        EXPECT_TRUE(contains(gate.source, fmt::format("static constexpr int stages = {};", stages))) << gate.source;
        EXPECT_TRUE(contains(down.source, "static constexpr int gate_mainloop = 2;")) << down.source;
        EXPECT_TRUE(contains(down.source, fmt::format("static constexpr int gate_cta_k = {};\n", cta_k))) << down.source;
        EXPECT_TRUE(contains(gen.ir, "mainloop = wgmma")) << gen.ir;
        continue;
      }
      EXPECT_EQ(gate.cta_m, c.cta_m);
      EXPECT_EQ(gate.threads, mma ? 512 : 256);
      if (mma) {
        const int stage_bytes = (c.cta_m + c.tile_n) * 40 * 2;
        EXPECT_EQ(gate.smem_bytes, std::max(c.stages * stage_bytes, c.cta_m * c.tile_n * 2));
        EXPECT_LE(gate.smem_bytes, 200 * 1024);
        if (c.stages < 4) {  // the deepest that fits
          EXPECT_GT(std::max((c.stages + 1) * stage_bytes, c.cta_m * c.tile_n * 2), 200 * 1024);
        }
        EXPECT_EQ(gate.operand_alignment, 8);
        EXPECT_EQ(down.operand_alignment, 2);
        EXPECT_TRUE(contains(gate.source, "static constexpr int cta_k = 32;\n")) << gate.source;
        EXPECT_TRUE(contains(gate.source, "static constexpr int mainloop = 1;")) << gate.source;
        EXPECT_TRUE(contains(gate.source, fmt::format("static constexpr int stages = {};", c.stages))) << gate.source;
        EXPECT_TRUE(contains(down.source, "static constexpr int gate_mainloop = 1;")) << down.source;
        EXPECT_TRUE(contains(down.source, "static constexpr int gate_cta_k = 32;\n")) << down.source;
        EXPECT_TRUE(contains(gen.ir, "mainloop = mma_sync")) << gen.ir;
      } else {
        EXPECT_EQ(gate.smem_bytes, 0);  // static shared memory only
        EXPECT_EQ(gate.operand_alignment, 1);
        EXPECT_EQ(down.operand_alignment, 1);
        const int cta_k = c.tile_n == 1024 ? 8 : 16;
        EXPECT_TRUE(contains(gate.source, fmt::format("static constexpr int cta_k = {};\n", cta_k))) << gate.source;
        EXPECT_TRUE(contains(gate.source, "static constexpr int mainloop = 0;")) << gate.source;
        EXPECT_TRUE(contains(gate.source, "static constexpr int stages = 0;")) << gate.source;
        EXPECT_TRUE(contains(down.source, "static constexpr int gate_mainloop = 0;")) << down.source;
        EXPECT_TRUE(contains(down.source, fmt::format("static constexpr int gate_cta_k = {};\n", cta_k))) << down.source;
        EXPECT_FALSE(contains(gen.ir, "mma_sync>")) << gen.ir;
      }
    }
  }
}

// The paper's shape, exactly: on sm_90a the wgmma kernel with 3 TMA stages of (128 + 256) * 128 bytes and
// the epilogue's 128 x (256 + 8) staging area, in clusters of 2 CTAs sharing the w_gate tile.
TEST(Generator, PaperShapeUsesFourTmaStagesOfWgmmaOnSm90a) {
  const auto gen = compiler::generateFfn(shape(2048, 5632, 256, 31), Target{90, true});
  EXPECT_EQ(gen.kernels[0].cta_m, 128);
  EXPECT_EQ(gen.kernels[0].grid_y, 22);
  EXPECT_EQ(gen.kernels[0].threads, 384);
  EXPECT_TRUE(gen.kernels[0].tma_persistent);
  EXPECT_EQ(gen.kernels[0].smem_bytes, 3 * (49152 + 16) + 128 * 264 * 2 + 1024 + 32);
  EXPECT_EQ(gen.kernels[0].operand_alignment, 8);
  EXPECT_EQ(gen.kernels[1].operand_alignment, 2);
  EXPECT_EQ(gen.kernels[0].cta_k, 64);
  EXPECT_EQ(gen.kernels[0].cluster_m, 2);
  EXPECT_TRUE(contains(gen.kernels[0].source, "__cluster_dims__(2, 1, 1)")) << gen.kernels[0].source;
  EXPECT_EQ(gen.kernels[1].cluster_m, 1);
  EXPECT_TRUE(contains(gen.ir, "#twell.config<cta_m = 128, cta_k = 64, threads = 384, mainloop = wgmma, stages = 3, cluster_m = 2>"))
      << gen.ir;
  EXPECT_TRUE(contains(gen.ir, "#twell.config<cta_m = 1, threads = 256, mainloop = wgmma, consumer = cta_row>")) << gen.ir;
}

// The consumer takes one token row per warp (cta_m = 8 of 256 threads) where its rows are 16-byte
// vectors in registers: after a tensor-core gate, in_out down weights (what FfnPlan hands it, having
// transposed an nn.Linear Wd), d_model % 8 == 0 and <= 2048; else one row per CTA.
TEST(Generator, ConsumerTakesOneRowPerWarpWhereItsRowsFitRegisters) {
  FfnSpec s = shape(2048, 5632, 256, 31);
  s.down_layout = WeightLayout::InOut;
  EXPECT_EQ(compiler::generateFfn(s, Target{90, true}).kernels[1].cta_m, 8);
  EXPECT_EQ(compiler::generateFfn(s, Target{80, false}).kernels[1].cta_m, 8);
  s.d_model = 2056;
  EXPECT_EQ(compiler::generateFfn(s, Target{90, true}).kernels[1].cta_m, 1);
  s.d_model = 514;  // the fma gate
  EXPECT_EQ(compiler::generateFfn(s, Target{90, true}).kernels[1].cta_m, 1);
  s = shape(2048, 5632, 256, 31);  // out_in
  EXPECT_EQ(compiler::generateFfn(s, Target{90, true}).kernels[1].cta_m, 1);
}

// A non-gated layer (spec.gated = false): twell.ffn, the same gate kernel and a consumer that reads no
// up weight (twell.down, kernel twell_down_*), one row per warp or per CTA like the gated one; the token
// block is gated only: asking for it is an error naming spec.consumer.
TEST(Generator, NonGatedLayerGetsTheDownConsumer) {
  FfnSpec s = shape(2048, 5632, 256, 31);
  s.gated = false;
  s.down_layout = WeightLayout::InOut;
  s.consumer = ConsumerVariant::TokenBlock;
  try {
    compiler::generateFfn(s, Target{90, true});
    ADD_FAILURE() << "a non-gated token block was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::InvalidArgument);
    EXPECT_TRUE(contains(e.what(), "spec.consumer: the token block is a gated kernel")) << e.what();
  }
  s.consumer = ConsumerVariant::RowGather;
  for (const Target target : {Target{90, true}, Target{80, false}}) {
    const auto gen = compiler::generateFfn(s, target);
    ASSERT_EQ(gen.kernels.size(), 2u);
    EXPECT_TRUE(contains(gen.ir, "twell.down")) << gen.ir;
    EXPECT_FALSE(contains(gen.ir, "twell.gated_down")) << gen.ir;
    EXPECT_EQ(gen.kernels[1].name.rfind("twell_down_k2048_n5632_t256_s31_relu_bf16_in_out_", 0), 0u) << gen.kernels[1].name;
    EXPECT_EQ(gen.kernels[1].cta_m, 8);
    EXPECT_TRUE(contains(gen.kernels[1].source, "static constexpr bool gated = false;"));
    // The gate kernel is the gated layer's, bit for bit.
    FfnSpec g = s;
    g.gated = true;
    g.consumer.reset();
    EXPECT_EQ(compiler::generateFfn(g, target).kernels[0].source, gen.kernels[0].source);
  }
  s.d_model = 2568;
  EXPECT_EQ(compiler::generateFfn(s, Target{90, true}).kernels[1].cta_m, 1);
}

// The paper's shape on the portable feature set: 4 stages of (128 + 256) * 80 bytes of mma.sync.
TEST(Generator, PaperShapeUsesFourStagesOfMmaSyncOnSm90) {
  const auto gen = compiler::generateFfn(shape(2048, 5632, 256, 31), Target{90, false});
  EXPECT_EQ(gen.kernels[0].cta_m, 128);
  EXPECT_EQ(gen.kernels[0].grid_y, 22);
  EXPECT_FALSE(gen.kernels[0].tma_persistent);
  EXPECT_EQ(gen.kernels[0].smem_bytes, 122880);
  EXPECT_EQ(gen.kernels[0].operand_alignment, 8);
  EXPECT_EQ(gen.kernels[1].operand_alignment, 2);
  EXPECT_TRUE(contains(gen.ir, "#twell.config<cta_m = 128, cta_k = 32, threads = 512, mainloop = mma_sync, stages = 4>"))
      << gen.ir;
  EXPECT_TRUE(contains(gen.ir, "#twell.config<cta_m = 1, threads = 256, mainloop = mma_sync, consumer = cta_row>")) << gen.ir;
}

// A hand-written configuration is kept; its consumer follows its main loop, and the two kernels' names
// differ from those of the selected (mma_sync) configuration.
TEST(Generator, ExplicitFmaConfigFromMlirIsKept) {
  const char* fma = R"mlir(
#L = #twell.layout<tile_n = 256, slots = 31, value = bf16, index = i16, activation = relu, threshold = 0.0>
func.func @ffn(%x: tensor<?x2048xbf16>, %wg: tensor<5632x2048xbf16>, %wu: tensor<5632x2048xbf16>,
               %wd: tensor<2048x5632xbf16>) -> tensor<?x2048xbf16> {
  %h = twell.gate_matmul %x, %wg {config = #twell.config<cta_m = 64, cta_k = 16, threads = 256>}
      : (tensor<?x2048xbf16>, tensor<5632x2048xbf16>) -> tensor<?x5632xbf16, #L>
  %y = twell.gated_down %x, %h, %wu, %wd
      : (tensor<?x2048xbf16>, tensor<?x5632xbf16, #L>, tensor<5632x2048xbf16>, tensor<2048x5632xbf16>) -> tensor<?x2048xbf16>
  return %y : tensor<?x2048xbf16>
}
)mlir";
  const auto gen = compiler::generateFromMlir(fma, "fma.mlir", Target{90, true});
  const auto selected = compiler::generateFfn(shape(2048, 5632, 256, 31), Target{90, true});
  ASSERT_EQ(gen.kernels.size(), 2u);
  EXPECT_EQ(gen.kernels[0].smem_bytes, 0);
  EXPECT_EQ(gen.kernels[0].cta_m, 64);
  EXPECT_EQ(gen.kernels[0].operand_alignment, 1);
  EXPECT_EQ(gen.kernels[1].operand_alignment, 1);
  EXPECT_TRUE(contains(gen.kernels[1].source, "static constexpr int gate_mainloop = 0;")) << gen.kernels[1].source;
  EXPECT_NE(gen.kernels[0].name, selected.kernels[0].name);
  EXPECT_NE(gen.kernels[1].name, selected.kernels[1].name);
}

TEST(Generator, MismatchedMainLoopsAreRejected) {
  const char* mismatch = R"mlir(
#L = #twell.layout<tile_n = 256, slots = 31, value = bf16, index = i16, activation = relu, threshold = 0.0>
func.func @ffn(%x: tensor<?x2048xbf16>, %wg: tensor<5632x2048xbf16>, %wu: tensor<5632x2048xbf16>,
               %wd: tensor<2048x5632xbf16>) -> tensor<?x2048xbf16> {
  %h = twell.gate_matmul %x, %wg {config = #twell.config<cta_m = 128, cta_k = 32, threads = 512, mainloop = mma_sync, stages = 4>}
      : (tensor<?x2048xbf16>, tensor<5632x2048xbf16>) -> tensor<?x5632xbf16, #L>
  %y = twell.gated_down %x, %h, %wu, %wd {config = #twell.config<cta_m = 1, threads = 256, consumer = cta_row>}
      : (tensor<?x2048xbf16>, tensor<?x5632xbf16, #L>, tensor<5632x2048xbf16>, tensor<2048x5632xbf16>) -> tensor<?x2048xbf16>
  return %y : tensor<?x2048xbf16>
}
)mlir";
  try {
    compiler::generateFromMlir(mismatch, "mismatch.mlir", Target{90, true});
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::InvalidArgument);
    EXPECT_TRUE(contains(e.what(), "mismatch.mlir:7")) << e.what();
    EXPECT_TRUE(contains(e.what(), "mainloop fma differs from mainloop mma_sync")) << e.what();
  }
}

// The consumer recomputes overflowing tile-rows from its x: an x other than the gate's would give wrong
// rows only where the backup ran out, so the generator refuses it.
TEST(Generator, ConsumerReadsTheGatesX) {
  const char* other_x = R"mlir(
#L = #twell.layout<tile_n = 256, slots = 31, value = bf16, index = i16, activation = relu, threshold = 0.0>
func.func @ffn(%x: tensor<?x512xbf16>, %x2: tensor<?x512xbf16>, %wg: tensor<1408x512xbf16>,
               %wd: tensor<512x1408xbf16>) -> tensor<?x512xbf16> {
  %h = twell.gate_matmul %x, %wg : (tensor<?x512xbf16>, tensor<1408x512xbf16>) -> tensor<?x1408xbf16, #L>
  %y = twell.down %x2, %h, %wd : (tensor<?x512xbf16>, tensor<?x1408xbf16, #L>, tensor<512x1408xbf16>) -> tensor<?x512xbf16>
  return %y : tensor<?x512xbf16>
}
)mlir";
  try {
    compiler::generateFromMlir(other_x, "other_x.mlir", Target{90, true});
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::InvalidArgument);
    EXPECT_TRUE(contains(e.what(), "other_x.mlir:6")) << e.what();
    EXPECT_TRUE(contains(e.what(), "x (operand 0) must be the x of the twell.gate_matmul producing h")) << e.what();
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
  s.threshold = 0.0f;
  s.gate_cluster_m = 3;
  EXPECT_NE(message(s).find("spec.gate_cluster_m: expected 1 or 2"), std::string::npos) << message(s);
}

// spec.gate_cluster_m picks the sm_90a gate's cluster (unset: 2); the other main loops run none.
TEST(Generator, GateClusterFollowsTheSpec) {
  FfnSpec s;
  s.d_model = 512;
  s.d_ff = 1408;
  EXPECT_EQ(compiler::generateFfn(s, Target{90, true}).kernels[0].cluster_m, 2);
  s.gate_cluster_m = 1;
  const auto one = compiler::generateFfn(s, Target{90, true});
  EXPECT_EQ(one.kernels[0].cluster_m, 1);
  EXPECT_FALSE(contains(one.kernels[0].source, "__cluster_dims__")) << one.kernels[0].source;
  s.gate_cluster_m = 2;
  const auto two = compiler::generateFfn(s, Target{90, true});
  EXPECT_TRUE(contains(two.kernels[0].source, "__cluster_dims__(2, 1, 1)")) << two.kernels[0].source;
  EXPECT_NE(one.kernels[0].name, two.kernels[0].name);
  s.gate_cluster_m = 1;
  EXPECT_EQ(compiler::generateFfn(s, Target{80, false}).kernels[0].cluster_m, 1);
  // A cluster asked of a gate that cannot have one (sm_80: mma_sync) is an error naming the field.
  s.gate_cluster_m = 2;
  try {
    compiler::generateFfn(s, Target{80, false});
    ADD_FAILURE() << "gate_cluster_m = 2 on sm_80 was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::InvalidArgument);
    EXPECT_NE(std::string(e.what()).find("spec.gate_cluster_m: 2 CTAs per cluster needs the wgmma gate"),
              std::string::npos)
        << e.what();
  }
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
