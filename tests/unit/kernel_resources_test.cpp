// The generated kernels compile without register spills (ptxas -v through NVRTC, no GPU).
//
// Also the portable (sm_80) kernels.
//
// Why a test: the wgmma gate kernel keeps 64-128 fp32 accumulators per thread in registers that the
// tensor cores write asynchronously; a build in which ptxas spilled around them returned wrong sums
// on the H200 (bench/README.md v8). The warp-per-row consumer runs at 254 registers on purpose; a
// spill there is a silent slowdown. Every tile width and value type select-config can choose for
// these kernels is checked.
#include <gtest/gtest.h>

#include <tuple>
#include <string>

#include <fmt/format.h>

#include "NvrtcCompiler.h"
#include "nvrtc_checks.h"
#include "twell/compiler/Generate.h"
#include "twell/kernels/constraints.h"
#include "twell/error.h"

namespace {

using namespace twell;
using twell::testing::expect_compiles_without_spills;

TEST(KernelResources, PortableKernelsCompileWithoutSpills) {
  // The mma_sync gate (16 warps at 128 registers) and the consumer after it, built for sm_80.
  for (DType dtype : {DType::BF16, DType::FP16})
    for (int tile_n : {64, 256, 1024}) {
      FfnSpec s;
      s.d_model = 2048;
      s.d_ff = 5632;
      s.tile_n = tile_n;
      s.slots = tile_n / 8 - 1;
      s.dtype = dtype;
      s.down_layout = WeightLayout::InOut;
      const compiler::GeneratedFfn gen = compiler::generateFfn(s, Target{80, false});
      for (const compiler::KernelSource& k : gen.kernels) {
        const std::string what = fmt::format("{} (tile_n {}, {})", k.name, tile_n, to_string(dtype));
        expect_compiles_without_spills(k, "sm_80", what);
      }
    }
}

// The non-gated consumer (twell.down: four Wd^T rows in flight instead of two entries' Wu and Wd^T
// rows), one row per warp and one row per CTA, on both feature sets.
TEST(KernelResources, NonGatedConsumersCompileWithoutSpills) {
  for (const Target target : {Target{90, true}, Target{80, false}})
    for (DType dtype : {DType::BF16, DType::FP16})
      for (int64_t d_model : {2048, 520, 2568}) {  // 2568: one row per CTA
        FfnSpec s;
        s.d_model = d_model;
        s.d_ff = 5632;
        s.gated = false;
        s.dtype = dtype;
        s.down_layout = WeightLayout::InOut;
        const compiler::GeneratedFfn gen = compiler::generateFfn(s, target);
        ASSERT_EQ(gen.kernels.size(), 2u);
        const compiler::KernelSource& k = gen.kernels[1];
        ASSERT_EQ(k.cta_m, d_model <= 2048 ? 8 : 1);
        const std::string what = fmt::format("{} ({}, d_model {}, {})", k.name, target.arch(), d_model, to_string(dtype));
        expect_compiles_without_spills(k, target.arch(), what);
      }
}

TEST(KernelResources, Sm90aKernelsCompileWithoutSpills) {
  for (DType dtype : {DType::BF16, DType::FP16})
    for (int tile_n : {64, 128, 256})
      for (int64_t d_ff : {5632, 1408}) {  // 1408: a partial last tile
        FfnSpec s;
        s.d_model = 2048;
        s.d_ff = d_ff;
        s.tile_n = tile_n;
        s.slots = tile_n / 8 - 1;
        s.dtype = dtype;
        s.down_layout = WeightLayout::InOut;  // the consumer the runtime uses: one row per warp
        const compiler::GeneratedFfn gen = compiler::generateFfn(s, Target{90, true});
        ASSERT_EQ(gen.kernels.size(), 2u);
        ASSERT_TRUE(gen.kernels[0].tma_persistent) << "expected the wgmma gate kernel";
        ASSERT_EQ(gen.kernels[1].cta_m, 8) << "expected the warp-per-row consumer";
        for (const compiler::KernelSource& k : gen.kernels) {
          const std::string what = fmt::format("{} (tile_n {}, d_ff {}, {})", k.name, tile_n, d_ff, to_string(dtype));
          expect_compiles_without_spills(k, "sm_90a", what);
        }
      }
}

// The sm_90a gate with and without clusters, at both K steps (d_model 544: cta_k 32, 64-byte swizzle).
TEST(KernelResources, Sm90aGateVariantsCompileWithoutSpills) {
  for (DType dtype : {DType::BF16, DType::FP16})
    for (int cluster : {1, 2})
      for (int64_t d_model : {2048, 544})
        for (int tile_n : {64, 256}) {
          FfnSpec s;
          s.d_model = d_model;
          s.d_ff = 1408;
          s.tile_n = tile_n;
          s.slots = tile_n / 8 - 1;
          s.dtype = dtype;
          s.gate_cluster_m = cluster;
          const compiler::GeneratedFfn gen = compiler::generateFfn(s, Target{90, true});
          const compiler::KernelSource& k = gen.kernels.at(0);
          ASSERT_TRUE(k.tma_persistent) << "expected the wgmma gate kernel";
          ASSERT_EQ(k.cluster_m, cluster);
          ASSERT_EQ(k.cta_k, d_model % 64 == 0 ? 64 : 32);
          const std::string what =
              fmt::format("{} (cluster_m {}, cta_k {}, tile_n {}, {})", k.name, cluster, k.cta_k, tile_n, to_string(dtype));
          expect_compiles_without_spills(k, "sm_90a", what);
        }
}

TEST(KernelResources, TokenBlockConsumersCompileWithoutSpills) {
  // 128 fp32 outputs per thread at d_model 2048 leave little room: every stage shape (d_model 2048:
  // 8 Wd^T rows per stage; 1024 and 512: 16), tile width and value type, on both feature sets.
  for (Target target : {Target{90, true}, Target{80, false}})
    for (DType dtype : {DType::BF16, DType::FP16})
      for (int64_t d_model : {2048, 1024, 512})
        for (int tile_n : {64, 256}) {
          FfnSpec s;
          s.d_model = d_model;
          s.d_ff = 5632;
          s.tile_n = tile_n;
          s.slots = tile_n / 8 - 1;
          s.dtype = dtype;
          s.down_layout = WeightLayout::InOut;
          s.consumer = ConsumerVariant::TokenBlock;
          const compiler::GeneratedFfn gen = compiler::generateFfn(s, target);
          ASSERT_EQ(gen.kernels.size(), 2u);
          const compiler::KernelSource& k = gen.kernels[1];
          ASSERT_EQ(k.consumer, kernels::ConsumerKind::TokenBlock) << "expected the token-block consumer";
          const std::string what =
              fmt::format("{} ({}, d_model {}, tile_n {}, {})", k.name, target.arch(), d_model, tile_n, to_string(dtype));
          expect_compiles_without_spills(k, target.arch(), what);
        }
}

// The dense path's fused gated-up kernel (two accumulator sets of 64 per thread: the gate's 128 at
// tile_n 256) at the paper's shape and a small one, both dtypes and activations.
TEST(KernelResources, FusedGatedUpCompilesWithoutSpills) {
  for (DType dtype : {DType::BF16, DType::FP16})
    for (Activation act : {Activation::ReLU, Activation::SiLU})
      for (int64_t d_model : {512, 2048}) {
        FfnSpec s;
        s.d_model = d_model;
        s.d_ff = d_model == 2048 ? 5632 : 1408;
        s.dtype = dtype;
        s.activation = act;
        s.threshold = act == Activation::SiLU ? 0.01f : 0.0f;
        const compiler::KernelSource k = compiler::generateAuxiliary(compiler::KernelKind::DenseGatedUp, s, Target{90, true});
        expect_compiles_without_spills(k, "sm_90a", fmt::format("{} ({}, {})", k.name, to_string(dtype), to_string(act)));
      }
}

}  // namespace

namespace {

// The decode kernels (GeneratedFfn::decode): made for tensor-core gates on both feature sets, for both
// down layouts and gated or not, and none after the fma gate (d_model % 8 != 0) or past d_ff 65536.
TEST(KernelResources, DecodeKernelsCompileWithoutSpills) {
  for (Target target : {Target{90, true}, Target{80, false}})
    for (DType dtype : {DType::BF16, DType::FP16})
      for (auto [d_model, down, gated] : {std::tuple{2048, WeightLayout::OutIn, true}, std::tuple{520, WeightLayout::InOut, true},
                                          std::tuple{512, WeightLayout::OutIn, false}})
        for (int tile_n : {64, 256}) {
          FfnSpec s;
          s.d_model = d_model;
          s.d_ff = 1400;
          s.tile_n = tile_n;
          s.slots = tile_n / 8 - 1;
          s.dtype = dtype;
          s.down_layout = down;
          s.gated = gated;
          const compiler::GeneratedFfn gen = compiler::generateFfn(s, target);
          ASSERT_EQ(gen.decode.size(), 5u);
          EXPECT_EQ(gen.decode[0].kind, compiler::KernelKind::DecodeGate);
          EXPECT_EQ(gen.decode[1].kind, compiler::KernelKind::DecodeUp);
          EXPECT_EQ(gen.decode[2].kind, compiler::KernelKind::DecodeDown);
          EXPECT_EQ(gen.decode[3].kind, compiler::KernelKind::DecodeGateSmall);
          EXPECT_EQ(gen.decode[3].cta_m, 8);
          EXPECT_EQ(gen.decode[4].kind, compiler::KernelKind::DecodeFused);
          EXPECT_EQ(gen.decode[4].cta_m, 32);
          EXPECT_EQ(gen.decode[4].smem_bytes, kernels::DecodeKernelConstraints::fusedSharedBytes(target.sm));
          for (const compiler::KernelSource& k : gen.decode) {
            EXPECT_NE(k.source.find(down == WeightLayout::InOut ? "down_in_out = true" : "down_in_out = false"), std::string::npos);
            const std::string what = fmt::format("{} ({}, d_model {}, tile_n {}, {})", k.name, target.arch(), d_model, tile_n,
                                                 to_string(dtype));
            // decode_fused holds 16 loads of 16 bytes per lane in flight (64 of the 80 registers its 768
            // threads allow: every byte of the CTA's Wg share requested at once, bench/README.md v64), and
            // ptxas spills a few scalars beside them (72-76 bytes stored, 192-196 loaded on sm_90a and sm_80
            // at d_model 2048 with x's second m16 tile, v68: calls of at most 16 tokens timed within
            // ~0.5 us of v67's 56 / 64). Measured at that; at most 256 allowed.
            expect_compiles_without_spills(k, target.arch(), what, k.kind == compiler::KernelKind::DecodeFused ? 256 : 0);
          }
        }
  FfnSpec fma;
  fma.d_model = 514;  // the fma gate: no mma.sync chain to repeat
  fma.d_ff = 1408;
  EXPECT_TRUE(compiler::generateFfn(fma, Target{90, true}).decode.empty());
  FfnSpec wide;
  wide.d_model = 256;
  wide.d_ff = 65537;
  EXPECT_TRUE(compiler::generateFfn(wide, Target{90, true}).decode.empty());
  // decode_gate's 99 KiB at 64 rows does not fit beside its static shared memory on the 99 KiB parts.
  FfnSpec paper;
  paper.d_model = 2048;
  paper.d_ff = 5632;
  for (int sm : {86, 89, 120})
    EXPECT_TRUE(compiler::generateFfn(paper, Target{sm, false}).decode.empty()) << "sm_" << sm;
  EXPECT_EQ(compiler::generateFfn(paper, Target{80, false}).decode.size(), 5u);
  // Not beside the token block (it rounds h; the decode kernels repeat the row consumers' sums).
  FfnSpec block = paper;
  block.down_layout = WeightLayout::InOut;
  block.consumer = ConsumerVariant::TokenBlock;
  EXPECT_TRUE(compiler::generateFfn(block, Target{90, true}).decode.empty());
}

// generateFfn's decode_down_layout: a plan gives the large-M consumer an in_out copy of an out_in Wd but
// keeps decode calls on the user's out_in Wd, from one generateFfn. The decode kernels then read Wd as
// asked and are those of a plain out_in spec, names included (a decode kernel's name hashes its own
// constants, not the consumer's: twellc emit --down-layout out_in gives the runtime's).
TEST(KernelResources, DecodeKernelsReadTheDownLayoutAsked) {
  FfnSpec in_out;
  in_out.d_model = 2048;
  in_out.d_ff = 5632;
  in_out.down_layout = WeightLayout::InOut;
  FfnSpec out_in = in_out;
  out_in.down_layout = WeightLayout::OutIn;
  const Target target{90, true};
  const compiler::GeneratedFfn asked = compiler::generateFfn(in_out, target, WeightLayout::OutIn);
  const compiler::GeneratedFfn plain = compiler::generateFfn(out_in, target);
  const compiler::GeneratedFfn own = compiler::generateFfn(in_out, target);
  ASSERT_EQ(asked.decode.size(), 5u);
  ASSERT_EQ(plain.decode.size(), 5u);
  ASSERT_EQ(own.decode.size(), 5u);
  EXPECT_EQ(asked.kernels.back().source.find("down_in_out = false"), std::string::npos) << "the large-M consumer reads in_out";
  for (size_t i = 0; i < 5; ++i) {
    EXPECT_NE(asked.decode[i].name.find("out_in"), std::string::npos) << asked.decode[i].name;
    EXPECT_NE(asked.decode[i].source.find("down_in_out = false"), std::string::npos) << asked.decode[i].name;
    EXPECT_EQ(asked.decode[i].name, plain.decode[i].name);
    EXPECT_EQ(asked.decode[i].source, plain.decode[i].source) << asked.decode[i].name;
    EXPECT_NE(own.decode[i].source.find("down_in_out = true"), std::string::npos) << own.decode[i].name;
    EXPECT_NE(own.decode[i].name, asked.decode[i].name);
  }
  EXPECT_EQ(compiler::generateFfn(out_in, target, WeightLayout::OutIn).decode[2].source, plain.decode[2].source);
  try {
    compiler::generateFfn(in_out, target, static_cast<WeightLayout>(7));
    ADD_FAILURE() << "decode_down_layout 7 accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::InvalidArgument);
    EXPECT_NE(std::string(e.what()).find("decode_down_layout: expected WeightLayout::OutIn or InOut, got 7"), std::string::npos)
        << e.what();
  }
}

}  // namespace
