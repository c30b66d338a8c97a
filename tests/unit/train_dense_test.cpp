// The dense training path's elementwise kernels (KernelKind::TrainDenseForward, TrainDenseBackward)
// without a GPU: they compile with NVRTC for sm_90a and sm_80, bf16/f16, relu/silu, without spills;
// their descriptions pass the auxiliary kernels' contract; their names, request keys and launch
// geometry (one CTA per row for the forward, grid-stride for the backward).
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <string>

#include "kernel_request.h"
#include "nvrtc_checks.h"
#include "plan_setup.h"
#include "twell/compiler/Generate.h"
#include "twell/kernels/launch.h"
#include "twell/kernels/validate.h"

namespace {

using namespace twell;
using compiler::KernelKind;
using twell::testing::expect_valid_and_compiles_without_spills;

TEST(TrainDense, CompilesForEveryTargetTypeAndActivation) {
  for (const Target target : {Target{90, true}, Target{80, false}})
    for (const DType dtype : {DType::BF16, DType::FP16})
      for (const Activation act : {Activation::ReLU, Activation::SiLU})
        for (const KernelKind kind : {KernelKind::TrainDenseForward, KernelKind::TrainDenseBackward}) {
          FfnSpec s = twell::testing::ffn_spec(2048, 5632);
          s.dtype = dtype;
          s.activation = act;
          const compiler::KernelSource k = compiler::generateAuxiliary(kind, s, target);
          EXPECT_EQ(k.kind, kind);
          EXPECT_EQ(k.name, fmt::format("twell_{}_{}_{}", kernels::to_string(kind), to_string(dtype), to_string(act)));
          EXPECT_EQ(k.threads, 256);
          EXPECT_NE(k.source.find("twell/device/train/dense_elementwise.cuh"), std::string::npos);
          expect_valid_and_compiles_without_spills(k, target, fmt::format("{} on {}", k.name, target.arch()));
        }
}

TEST(TrainDense, NameRequestKeyAndLaunchGeometry) {
  FfnSpec s = twell::testing::ffn_spec(520, 1408);
  s.threshold = 0.25f;
  const compiler::KernelSource fwd = compiler::generateAuxiliary(KernelKind::TrainDenseForward, s, Target{90, true});
  const compiler::KernelSource bwd = compiler::generateAuxiliary(KernelKind::TrainDenseBackward, s, Target{90, true});
  // Keyed by dtype and activation only (the threshold, sizes and gating are arguments).
  EXPECT_EQ(detail::auxiliary_request(KernelKind::TrainDenseForward, s, Target{90, true}),
            "aux train_dense_forward target=sm_90a dtype=bf16 activation=relu");
  s.d_model = 64;
  s.gated = false;
  EXPECT_EQ(compiler::generateAuxiliary(KernelKind::TrainDenseBackward, s, Target{90, true}).name, bwd.name);
  EXPECT_EQ(kernels::parse_kernel_kind("train_dense_backward"), KernelKind::TrainDenseBackward);
  const kernels::Occupancy o{132, 8, 0};
  // The forward: a CTA per row (at most 65535, grid-stride beyond); the backward: a thread per element up
  // to 65535 CTAs.
  EXPECT_EQ(kernels::launch_config(fwd, kernels::LaunchShape{0, 1000, 1408}, o).grid_x, 1000u);
  EXPECT_EQ(kernels::launch_config(fwd, kernels::LaunchShape{0, 100000, 1408}, o).grid_x, 65535u);
  EXPECT_EQ(kernels::launch_config(fwd, kernels::LaunchShape{0, 0, 1408}, o).grid_x, 1u);
  EXPECT_EQ(kernels::launch_config(bwd, kernels::LaunchShape{0, 10, 1408}, o).grid_x, (10u * 1408u + 255u) / 256u);
  EXPECT_EQ(kernels::launch_config(bwd, kernels::LaunchShape{0, 100000, 5632}, o).grid_x, 65535u);
  EXPECT_EQ(kernels::validate_kernel(fwd, Target{90, true}), "");
  compiler::KernelSource broken = bwd;
  broken.threads = 128;
  EXPECT_NE(kernels::validate_kernel(broken, Target{90, true}).find("threads"), std::string::npos);
}

}  // namespace
