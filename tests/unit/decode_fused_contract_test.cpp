// The fused decode kernel (KernelKind::DecodeFused, decode/decode_fused.cuh) without a GPU: the
// generator's description passes its contract (validate.h) on sm_90a and sm_80 and a broken one names
// the field; its launch geometry (launch.h): one CTA per SM (at most kFusedMaxCtas), cooperative, the
// shared memory its CTAs' rows and x tiles of 8, 16 or 32 rows need; up to how many tokens plans take it
// (fusedMaxTokens).
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <string>

#include "twell/compiler/Generate.h"
#include "twell/device/shared_memory.h"
#include "twell/kernels/constraints.h"
#include "twell/kernels/launch.h"
#include "twell/kernels/validate.h"

namespace {

using namespace twell;
using D = kernels::DecodeKernelConstraints;

compiler::KernelSource fused_kernel(int64_t d_model, int64_t d_ff, WeightLayout down, const Target& target) {
  FfnSpec s;
  s.d_model = d_model;
  s.d_ff = d_ff;
  s.down_layout = down;
  const compiler::GeneratedFfn gen = compiler::generateFfn(s, target);
  for (const compiler::KernelSource& k : gen.decode)
    if (k.kind == compiler::KernelKind::DecodeFused) return k;
  ADD_FAILURE() << "no decode_fused for d_model " << d_model << ", d_ff " << d_ff << " on " << target.arch();
  return {};
}

TEST(DecodeFusedContract, TheGeneratedKernelPassesAndABrokenOneIsNamed) {
  for (Target target : {Target{90, true}, Target{80, false}})
    for (auto [d_model, d_ff, down] : {std::tuple{int64_t{2048}, int64_t{5632}, WeightLayout::OutIn},
                                       std::tuple{int64_t{520}, int64_t{1400}, WeightLayout::InOut}}) {
      const compiler::KernelSource k = fused_kernel(d_model, d_ff, down, target);
      const std::string what = fmt::format("{} on {}", k.name, target.arch());
      EXPECT_EQ(kernels::validate_kernel(k, target), "") << what;
      EXPECT_EQ(k.threads, 768) << what;
      EXPECT_EQ(k.cta_m, 32) << what;
      EXPECT_EQ(k.smem_bytes, D::fusedSharedBytes(target.sm)) << what;
      // It waits with griddepcontrol.wait (sm_90 on): launched as a programmatic dependent there.
      EXPECT_EQ(k.dependent_launch, target.sm >= 90) << what;
      EXPECT_EQ(k.down_in_out, down == WeightLayout::InOut) << what;
      // Below sm_90 there is no programmatic dependent launch; on sm_90 either launch is correct.
      compiler::KernelSource flipped = k;
      flipped.dependent_launch = !k.dependent_launch;
      EXPECT_EQ(kernels::validate_kernel(flipped, target).find("dependent_launch: expected false below sm_90") != std::string::npos,
                target.sm < 90) << what;
      // The same description is wrong for the other target's shared memory (163 KiB against 227 KiB).
      const Target other = target.sm == 90 ? Target{80, false} : Target{90, true};
      EXPECT_NE(kernels::validate_kernel(k, other).find("smem_bytes: expected"), std::string::npos) << what;
      for (auto [field, breaks] : std::initializer_list<std::pair<const char*, void (*)(compiler::KernelSource&)>>{
               {"threads: expected 768", [](compiler::KernelSource& b) { b.threads = 256; }},
               {"cta_m: expected 32", [](compiler::KernelSource& b) { b.cta_m = 64; }},
               {"cta_m: expected 32", [](compiler::KernelSource& b) { b.cta_m = 16; }},
               {"smem_bytes: expected", [](compiler::KernelSource& b) { b.smem_bytes = 0; }},
               {"smem_bytes: expected", [](compiler::KernelSource& b) { b.smem_bytes += 2048; }},
               {"d_model: expected a multiple of 8", [](compiler::KernelSource& b) { b.d_model = 2044; }},
               {"cluster_m: expected 1", [](compiler::KernelSource& b) { b.cluster_m = 2; }},
               {"persistent", [](compiler::KernelSource& b) { b.persistent = true; }}}) {
        compiler::KernelSource broken = k;
        breaks(broken);
        EXPECT_NE(kernels::validate_kernel(broken, target).find(field), std::string::npos)
            << what << ": expected \"" << field << "\", got \"" << kernels::validate_kernel(broken, target) << "\"";
      }
    }
}

TEST(DecodeFusedContract, OneCooperativeCtaPerSmWhateverTheTokens) {
  const compiler::KernelSource k = fused_kernel(2048, 5632, WeightLayout::OutIn, Target{90, true});
  for (auto [sms, ctas] : {std::pair{132, 132u}, std::pair{108, 108u}, std::pair{1, 1u}, std::pair{256, 256u}, std::pair{300, 256u}})
    for (int64_t tokens : {1, 4, 8, 9, 16, 17, 32}) {
      const kernels::LaunchConfig c = kernels::launch_config(k, kernels::LaunchShape{tokens, 0, 0}, kernels::Occupancy{sms, 1, 0});
      const std::string what = fmt::format("{} SMs, {} tokens: {}", sms, tokens, c.describe());
      EXPECT_EQ(c.grid_x, ctas) << what;
      EXPECT_EQ(c.grid_y, 1u) << what;
      EXPECT_EQ(c.grid_z, 1u) << what;
      EXPECT_EQ(c.block_x, 768u) << what;
      EXPECT_EQ(c.block_y, 1u) << what;
      EXPECT_EQ(c.shared_bytes, static_cast<uint32_t>(D::fusedLaunchBytes(2048, 5632, ctas, tokens))) << what;
      EXPECT_EQ(c.cluster_x, 1u) << what;
      EXPECT_TRUE(c.cooperative) << what;
      EXPECT_TRUE(c.dependent_launch) << what;
      EXPECT_NE(c.describe().find(" cooperative"), std::string::npos) << what;
    }
  // The other decode kernels are not cooperative.
  FfnSpec s;
  s.d_model = 2048;
  s.d_ff = 5632;
  for (const compiler::KernelSource& other : compiler::generateFfn(s, Target{90, true}).decode) {
    if (other.kind == compiler::KernelKind::DecodeFused) continue;
    EXPECT_FALSE(kernels::launch_config(other, kernels::LaunchShape{4, 0, 0}, kernels::Occupancy{132, 1, 0}).cooperative) << other.name;
  }
}

// Where a plan takes it: a launch's shared memory (what the h pass reads, then phase 1's x rows and unit
// sums or the reduction's pair batch and segment starts, whichever is larger) within fusedSharedBytes, for x tiles
// of 32 rows (calls of 17-32 tokens), 16 (9-16) or 8 (values worked out by hand from shared_memory.h).
TEST(DecodeFusedContract, FitsWhereItsCtasRowsFit) {
  namespace sm = device::shared_memory;
  EXPECT_EQ(D::fusedSharedBytes(90), 230400);
  EXPECT_EQ(D::fusedSharedBytes(80), 164864);
  EXPECT_EQ(D::fusedCtas(132), 132);
  EXPECT_EQ(D::fusedCtas(1000), 256);
  EXPECT_EQ(D::kFusedMaxTokens, 32);
  for (auto [tokens, rows] : {std::pair{1, 8}, std::pair{8, 8}, std::pair{9, 16}, std::pair{16, 16}, std::pair{17, 32}, std::pair{32, 32}})
    EXPECT_EQ(sm::decode_fused_token_rows(tokens), rows) << tokens;
  // The paper's layer on an H200: 43 rows per CTA, 6 groups, 24 units. What the h pass reads at 8
  // token rows: a 43 x 8 x 4 = 1376, masks and rows 43 x 8 = 344, the tokens' row bits 8 x 2 x 4 = 64:
  // 1784, rounded to 1792; at 16: 2752 + 344 + 128 = 3224 (3232); at 32: 5504 + 344 + 256 = 6104 (6112).
  // Phase 1's x and sums at 8: x 8 x 2080 x 2 = 33280, sums 24 x 8 x 8 x 4 = 6144: 39424; at 16: 66560 +
  // 12288 = 78848; at 32: 133120 + 24576 = 157696. The reduction (over x and sums) at 8: a batch of 512
  // pairs x (32 + 4) = 18432 and 8 x 132 + 1 segment starts (4228): 22660; at 16: 1024 x 36 + 2113 x 4 =
  // 45316; at 32: 2048 x 36 + 4225 x 4 = 90628.
  EXPECT_EQ(sm::decode_fused_x_stride(2048), 2080);
  EXPECT_EQ(sm::decode_fused_h_bytes(43, 8), 1792);
  EXPECT_EQ(sm::decode_fused_h_bytes(43, 16), 3232);
  EXPECT_EQ(sm::decode_fused_h_bytes(43, 32), 6112);
  EXPECT_EQ(sm::decode_fused_phase1_bytes(2048, 43, 8), 39424);
  EXPECT_EQ(sm::decode_fused_phase2_bytes(132, 8), 22660);
  EXPECT_EQ(sm::decode_fused_phase1_bytes(2048, 43, 16), 78848);
  EXPECT_EQ(sm::decode_fused_phase2_bytes(132, 16), 45316);
  EXPECT_EQ(sm::decode_fused_phase1_bytes(2048, 43, 32), 157696);
  EXPECT_EQ(sm::decode_fused_phase2_bytes(132, 32), 90628);
  EXPECT_EQ(D::fusedLaunchBytes(2048, 5632, 132, 1), 41216);
  EXPECT_EQ(D::fusedLaunchBytes(2048, 5632, 132, 8), 41216);
  EXPECT_EQ(D::fusedLaunchBytes(2048, 5632, 132, 9), 82080);
  EXPECT_EQ(D::fusedLaunchBytes(2048, 5632, 132, 16), 82080);
  EXPECT_EQ(D::fusedLaunchBytes(2048, 5632, 132, 17), 163808);
  EXPECT_EQ(D::fusedLaunchBytes(2048, 5632, 132, 32), 163808);
  // d_model 520, d_ff 1400: 11 rows per CTA, the reduction the larger (8 rows: the h pass's 472 (480),
  // x 8 x 608 x 2 = 9728 and 8 units' sums 2048 against 22660 (22672); 16: 856 (864) + 45328; 32: 1624
  // (1632) + 90640).
  EXPECT_EQ(D::fusedLaunchBytes(520, 1400, 132, 8), 23152);
  EXPECT_EQ(D::fusedLaunchBytes(520, 1400, 132, 16), 46192);
  EXPECT_EQ(D::fusedLaunchBytes(520, 1400, 132, 32), 92272);
  EXPECT_EQ(D::fusedMaxTokens(2048, 5632, 132, 90), 32);
  // The paper's layer on an A100 (108 SMs, sm_80's 161 KiB): 53 rows per CTA; 32 token rows need
  // 6784 + 424 + 256 = 7464 (7472) + 133120 + 28 units' 28672 = 169264 (over): calls of at most 16 tokens.
  EXPECT_EQ(D::fusedMaxTokens(2048, 5632, 108, 80), 16);
  // d_model 4096, d_ff 16384 on sm_80's 161 KiB: 152 rows per CTA; 16 token rows need 132096 for x
  // and 38912 for 76 units' sums (over), 8 rows 91744: calls of at most 8 tokens.
  EXPECT_EQ(D::fusedMaxTokens(4096, 16384, 108, 80), 8);
  // d_model 8192, d_ff 65536 on 132 SMs: 497 rows per CTA, 216496 bytes at 8 rows: sm_90's 225 KiB,
  // not sm_80's 161; x alone at 16 rows (263168) fits neither.
  EXPECT_EQ(D::fusedLaunchBytes(8192, 65536, 132, 8), 216496);
  EXPECT_EQ(D::fusedMaxTokens(8192, 65536, 132, 90), 8);
  EXPECT_EQ(D::fusedMaxTokens(8192, 65536, 132, 80), 0);
  // The paper's layer on one SM: all 5632 rows' staging in one CTA does not fit.
  EXPECT_EQ(D::fusedMaxTokens(2048, 5632, 1, 90), 0);
  // Fewer rows than SMs: CTAs with no row still fit.
  EXPECT_EQ(D::fusedMaxTokens(512, 64, 132, 90), 32);
  // d_model 2304, d_ff 11264 on 132 SMs (the GPU test's wide shape): 86 rows per CTA; 32 token rows:
  // a 11008, masks and rows 688, bits 384: 12080; x 32 x 2336 x 2 = 149504, 44 units' sums 45056: 194560.
  EXPECT_EQ(sm::decode_fused_h_bytes(86, 32), 12080);
  EXPECT_EQ(sm::decode_fused_phase1_bytes(2304, 86, 32), 194560);
  EXPECT_EQ(D::fusedLaunchBytes(2304, 11264, 132, 32), 206640);
  EXPECT_EQ(D::fusedMaxTokens(2304, 11264, 132, 90), 32);
  // The workspace: 32 tokens x 132 CTAs segments, each with room for 43 pairs at the paper's shape.
  EXPECT_EQ(sm::decode_fused_segments(132), 4224);
  EXPECT_EQ(sm::decode_fused_pair_slots(5632, 132), 4224 * 43);
  // No SM (a context without a GPU reports 0): never.
  EXPECT_EQ(D::fusedMaxTokens(512, 1408, 0, 90), 0);
}

}  // namespace
