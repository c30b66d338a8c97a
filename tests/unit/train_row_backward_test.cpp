// The training backward by token row (KernelKind::TrainRowBackward) without a GPU: its generated
// source compiles with NVRTC for sm_90a and sm_80 at the paper's shape and an odd one, without spills;
// its description passes its contract; its launch geometry, name and request key; bad specs and bad
// arguments of train_row_backward are errors naming the field or argument.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <string>

#include "EmitTraining.h"
#include "NvrtcCompiler.h"
#include "nvrtc_checks.h"
#include "plan_setup.h"
#include "kernel_request.h"
#include "twell/compiler/Generate.h"
#include "twell/context.h"
#include "twell/error.h"
#include "twell/kernels/launch.h"
#include "twell/kernels/validate.h"
#include "twell/training.h"

namespace {

using namespace twell;
using compiler::KernelKind;

using twell::testing::expect_valid_and_compiles_without_spills;
using twell::testing::no_device_context;

TEST(TrainRowBackward, CompilesForSm90aAndSm80AtThePaperAndAnOddShape) {
  for (Target target : {Target{90, true}, Target{80, false}})
    for (auto [d_model, d_ff] : {std::pair{2048, 5632}, std::pair{520, 1408}, std::pair{1032, 1408}}) {
      const FfnSpec s = twell::testing::ffn_spec(d_model, d_ff);
      const compiler::KernelSource k = compiler::generateAuxiliary(KernelKind::TrainRowBackward, s, target);
      EXPECT_EQ(k.kind, KernelKind::TrainRowBackward);
      EXPECT_EQ(k.name,
                fmt::format("twell_train_row_backward_k{}_n{}_t256_s31_relu_bf16_gated1_th00000000", d_model, d_ff));
      EXPECT_NE(k.source.find(fmt::format("static constexpr int d_model = {};", d_model)), std::string::npos);
      EXPECT_NE(k.source.find(fmt::format("static constexpr int d_ff = {};", d_ff)), std::string::npos);
      // The gate the same spec gets: its main loop is what the recompute repeats.
      const compiler::GeneratedFfn forward = compiler::generateFfn(s, target);
      EXPECT_EQ(k.mainloop, forward.kernels[0].mainloop);
      EXPECT_EQ(k.operand_alignment, 8);
      expect_valid_and_compiles_without_spills(k, target, fmt::format("{} on {}", k.name, target.arch()));
    }
}

// SiLU (g recomputed: the mma chain after a tensor-core gate, the fma chain after the fma gate), f16,
// the non-gated variant, a small layout, and a d_model that is not a multiple of 8 (2-byte loads).
TEST(TrainRowBackward, VariantsCompile) {
  struct Case {
    Target target;
    int64_t d_model, d_ff;
    Activation act;
    bool gated;
    DType dtype;
    int tile_n, slots;
  };
  for (const Case& c : {Case{{90, true}, 520, 1408, Activation::SiLU, true, DType::FP16, 256, 31},
                        Case{{80, false}, 2048, 5632, Activation::SiLU, true, DType::BF16, 256, 31},
                        Case{{90, true}, 2048, 5632, Activation::ReLU, false, DType::BF16, 256, 31},
                        Case{{80, false}, 520, 1408, Activation::ReLU, false, DType::FP16, 64, 3},
                        Case{{80, false}, 100, 300, Activation::SiLU, true, DType::BF16, 32, 2},
                        Case{{90, true}, 4100, 1000, Activation::ReLU, true, DType::BF16, 1024, 255}}) {
    FfnSpec s = twell::testing::ffn_spec(c.d_model, c.d_ff);
    s.activation = c.act;
    s.threshold = c.act == Activation::SiLU ? 0.05f : 0.0f;
    s.gated = c.gated;
    s.dtype = c.dtype;
    s.tile_n = c.tile_n;
    s.slots = c.slots;
    const compiler::KernelSource k = compiler::generateAuxiliary(KernelKind::TrainRowBackward, s, c.target);
    EXPECT_EQ(k.gated, c.gated);
    EXPECT_EQ(k.operand_alignment, c.d_model % 8 == 0 ? 8 : 1);
    if (c.d_model % 8 != 0) {
      EXPECT_EQ(k.mainloop, kernels::GateMainloop::Fma) << "d_model " << c.d_model;
    }
    expect_valid_and_compiles_without_spills(k, c.target, fmt::format("{} on {}", k.name, c.target.arch()));
  }
}

TEST(TrainRowBackward, LaunchGeometryAndRequestKey) {
  FfnSpec s = twell::testing::ffn_spec(520, 1408);
  s.activation = Activation::SiLU;
  s.threshold = 0.1f;
  s.tile_n = 128;
  s.slots = 15;
  const compiler::KernelSource k = compiler::generateAuxiliary(KernelKind::TrainRowBackward, s, Target{90, true});
  const kernels::LaunchConfig c =
      kernels::launch_config(k, kernels::LaunchShape{1000, 0, 0}, kernels::Occupancy{132, 1, 0});
  EXPECT_EQ(c.grid_x, 1000u);
  EXPECT_EQ(c.grid_y, 1u);
  EXPECT_EQ(c.block_x, 256u);
  EXPECT_EQ(c.shared_bytes, 0u);
  EXPECT_EQ(k.name, "twell_train_row_backward_k520_n1408_t128_s15_silu_bf16_gated1_th3dcccccd");
  // The kernel comes through its dialect op, whose specialized text heads the source (TrainingOps.h).
  EXPECT_EQ(k.source.rfind("// %dx, %dg, %du = twell.train_row_backward ", 0), 0u) << k.source.substr(0, 200);
  EXPECT_NE(k.source.find("kernel_name = \"" + k.name + "\""), std::string::npos);
  EXPECT_NE(k.source.find("activation = silu, threshold = 0.1>>"), std::string::npos) << k.source.substr(0, 600);
  EXPECT_EQ(detail::auxiliary_request(KernelKind::TrainRowBackward, s, Target{90, true}),
            "aux train_row_backward target=sm_90a d_model=520 d_ff=1408 gated=1 activation=silu threshold=0x3dcccccd "
            "dtype=bf16 "
            "tile_n=128 slots=15");
  // Another threshold is another kernel, with another name (bundles hold kernels by name).
  s.threshold = 0.2f;
  EXPECT_NE(compiler::generateAuxiliary(KernelKind::TrainRowBackward, s, Target{90, true}).name, k.name);
  // A broken description is caught by the contract.
  compiler::KernelSource broken = k;
  broken.threads = 128;
  EXPECT_NE(kernels::validate_kernel(broken, Target{90, true}).find("threads"), std::string::npos);
  broken = k;
  broken.down_in_out = false;
  EXPECT_NE(kernels::validate_kernel(broken, Target{90, true}).find("down_in_out"), std::string::npos);
}

// ReLU after a tensor-core gate with d_model % 8 == 0 and <= 2048 takes the warp-per-row form
// (persistent, 4 warps per CTA, the grid filling the GPU once); SiLU, d_model 2056 and the fma gate the
// CTA form; the contract refuses a persistent description of a shape the warp form cannot take.
TEST(TrainRowBackward, WarpRowFormWhereItApplies) {
  const FfnSpec paper = twell::testing::ffn_spec(2048, 5632);
  const compiler::KernelSource w = compiler::generateAuxiliary(KernelKind::TrainRowBackward, paper, Target{90, true});
  EXPECT_TRUE(w.persistent);
  EXPECT_EQ(w.consumer, kernels::ConsumerKind::WarpRow);
  EXPECT_EQ(w.threads, 128);
  EXPECT_EQ(w.cta_m, 4);
  EXPECT_NE(w.source.find("static constexpr bool warp_row = true;"), std::string::npos);
  const kernels::LaunchConfig c = kernels::launch_config(w, kernels::LaunchShape{16384, 0, 0}, kernels::Occupancy{132, 2, 0});
  EXPECT_EQ(c.grid_x, 264u);
  EXPECT_EQ(c.block_x, 128u);
  EXPECT_EQ(kernels::launch_config(w, kernels::LaunchShape{5, 0, 0}, kernels::Occupancy{132, 2, 0}).grid_x, 2u);
  FfnSpec silu = paper;
  silu.activation = Activation::SiLU;
  silu.threshold = 0.05f;
  FfnSpec wide = twell::testing::ffn_spec(2056, 1024);
  FfnSpec odd = twell::testing::ffn_spec(100, 300);
  FfnSpec many_slots = twell::testing::ffn_spec(256, 1024);  // slots + 1 > the warp's 512-word window
  many_slots.tile_n = 512;
  many_slots.slots = 512;
  for (const FfnSpec& s : {silu, wide, odd, many_slots}) {
    const compiler::KernelSource k = compiler::generateAuxiliary(KernelKind::TrainRowBackward, s, Target{90, true});
    EXPECT_FALSE(k.persistent) << k.name;
    EXPECT_EQ(k.threads, 256) << k.name;
    EXPECT_NE(k.source.find("static constexpr bool warp_row = false;"), std::string::npos) << k.name;
  }
  // The CTA form compiles at slots 512 (the warp form's window could not hold a tile-row's words).
  expect_valid_and_compiles_without_spills(
      compiler::generateAuxiliary(KernelKind::TrainRowBackward, many_slots, Target{90, true}), Target{90, true},
      "train_row_backward at tile_n 512, slots 512");
  compiler::KernelSource broken = compiler::generateAuxiliary(KernelKind::TrainRowBackward, wide, Target{90, true});
  broken.persistent = true;
  broken.threads = 128;
  broken.cta_m = 4;
  broken.consumer = kernels::ConsumerKind::WarpRow;
  EXPECT_NE(kernels::validate_kernel(broken, Target{90, true}).find("d_model % 8 == 0 and <= 2048"), std::string::npos);
  broken = w;
  broken.consumer = kernels::ConsumerKind::CtaRow;
  EXPECT_NE(kernels::validate_kernel(broken, Target{90, true}).find("consumer"), std::string::npos);
}

void expect_generate_error(const FfnSpec& s, const std::string& field) {
  try {
    compiler::generateAuxiliary(KernelKind::TrainRowBackward, s, Target{90, true});
    ADD_FAILURE() << "expected an error naming " << field;
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::InvalidArgument) << e.what();
    EXPECT_NE(std::string(e.what()).find(field), std::string::npos) << e.what();
  }
}

TEST(TrainRowBackward, BadSpecsNameTheField) {
  FfnSpec s = twell::testing::ffn_spec(20000, 1408);
  expect_generate_error(s, "spec.d_model");
  s = twell::testing::ffn_spec(0, 1408);
  expect_generate_error(s, "spec.d_model");
  s = twell::testing::ffn_spec(512, 0);
  expect_generate_error(s, "spec.d_ff");
  s = twell::testing::ffn_spec(512, 1408);
  s.tile_n = 48;
  expect_generate_error(s, "spec.tile_n");
  s = twell::testing::ffn_spec(512, 1408);
  s.activation = Activation::SiLU;
  s.threshold = 0.0f;
  expect_generate_error(s, "spec.threshold");
}

// train_row_backward's checks run before it needs a GPU: each bad argument is named.
struct Arguments {
  FfnSpec spec = [] {
    FfnSpec s = twell::testing::ffn_spec(512, 1408);
    s.down_layout = WeightLayout::InOut;
    return s;
  }();
  // Fake, well-aligned addresses: the checks below never dereference them.
  TrainRowBackwardTensors t{reinterpret_cast<const void*>(0x100000),     reinterpret_cast<const void*>(0x200000),
                            reinterpret_cast<const void*>(0x300000),     reinterpret_cast<const void*>(0x400000),
                            reinterpret_cast<const uint32_t*>(0x500000), reinterpret_cast<const void*>(0x600000),
                            reinterpret_cast<const void*>(0x700000),     reinterpret_cast<void*>(0x800000),
                            reinterpret_cast<float*>(0x900000),          reinterpret_cast<float*>(0xa00000),
                            reinterpret_cast<uint32_t*>(0xb00000)};
  int64_t tokens = 16;
  uint32_t backup_capacity = 4, grad_capacity = 8;
  float lambda = 2e-5f;
};


void expect_argument_error(const Arguments& a, const std::string& name) {
  try {
    train_row_backward(no_device_context(), nullptr, a.spec, a.t, a.tokens, a.backup_capacity, a.grad_capacity,
                       a.lambda);
    ADD_FAILURE() << "expected an error naming " << name;
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::InvalidArgument) << e.what();
    EXPECT_NE(std::string(e.what()).find(name), std::string::npos) << "expected " << name << " in: " << e.what();
  }
}

TEST(TrainRowBackward, BadArgumentsNameTheArgument) {
  {
    Arguments a;
    a.spec.down_layout = WeightLayout::OutIn;
    expect_argument_error(a, "spec.down_layout");
  }
  {
    Arguments a;
    a.spec.slots = 0;
    expect_argument_error(a, "spec.slots");
  }
  {
    Arguments a;
    a.t.x = nullptr;
    expect_argument_error(a, "t.x");
  }
  {
    Arguments a;
    a.t.twell = nullptr;
    expect_argument_error(a, "t.twell");
  }
  {
    Arguments a;
    a.t.entry_grad = reinterpret_cast<float*>(0x900004);
    expect_argument_error(a, "t.entry_grad");
  }
  {
    Arguments a;  // quads: 16-byte stores
    a.t.backup_grad = reinterpret_cast<float*>(0xa00008);
    expect_argument_error(a, "t.backup_grad");
  }
  {
    Arguments a;
    a.t.backup = nullptr;
    expect_argument_error(a, "t.backup");
  }
  {
    Arguments a;
    a.spec.gated = false;
    expect_argument_error(a, "t.w_up");
  }
  {
    Arguments a;
    a.t.ld_dy = 100;
    expect_argument_error(a, "t.ld_dy");
  }
  {
    Arguments a;
    a.tokens = -1;
    expect_argument_error(a, "tokens");
  }
  {
    Arguments a;
    a.lambda = -1.0f;
    expect_argument_error(a, "lambda");
  }
  {
    Arguments a;
    a.grad_capacity = 2;
    expect_argument_error(a, "grad_capacity");
  }
  {
    Arguments a;
    a.t.dx = const_cast<void*>(a.t.dy);
    expect_argument_error(a, "t.dx: must not overlap t.dy");
  }
  {
    // dx starting inside x (x at 0x100000: 16 rows of 512 bf16, 16 KiB).
    Arguments a;
    a.t.dx = reinterpret_cast<void*>(0x100000 + 3 * 1024);
    expect_argument_error(a, "t.dx: must not overlap t.x");
  }
  {
    // A stride of 2^36 elements over 2^31 - 1 rows spans past 64 bits: the range saturates rather than
    // wrapping below dx (0x800000), so dx is reported as overlapping, never silently accepted.
    Arguments a;
    a.tokens = INT32_MAX;
    a.t.ld_x = int64_t{1} << 36;
    expect_argument_error(a, "t.dx: must not overlap t.x");
  }
  {
    Arguments a;
    a.t.grad_overflow_count = nullptr;
    expect_argument_error(a, "t.grad_overflow_count");
  }
  // Good arguments reach the device: there is none here.
  Arguments a;
  try {
    train_row_backward(no_device_context(), nullptr, a.spec, a.t, a.tokens, a.backup_capacity, a.grad_capacity,
                       a.lambda);
    ADD_FAILURE() << "expected Error(NoDevice)";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::NoDevice) << e.what();
  }
}

}  // namespace
