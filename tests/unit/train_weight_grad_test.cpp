// The training weight gradients (KernelKind::TrainWeightGrad) without a GPU: the generated source
// compiles with NVRTC for sm_90a and sm_80 at the paper's shape and an odd one (and variants) without
// spills; its description passes its contract and a broken one does not; its launch geometry, name and
// request key; bad specs and bad arguments of train_weight_grad are errors naming the field or argument
// (overlaps of every written buffer with every other buffer, with both byte ranges; token counts and
// list entries at their limits; strides that would wrap 64 bits; odd d_model, non-gated, 16-bit
// outputs; a null entry list of 0 bytes); the scratch sizes.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <regex>
#include <string>

#include "EmitTraining.h"
#include "NvrtcCompiler.h"
#include "kernel_request.h"
#include "nvrtc_checks.h"
#include "plan_setup.h"
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

TEST(TrainWeightGrad, CompilesForSm90aAndSm80AtThePaperAndAnOddShape) {
  for (Target target : {Target{90, true}, Target{80, false}})
    for (auto [d_model, d_ff] : {std::pair{2048, 5632}, std::pair{520, 1408}}) {
      const FfnSpec s = twell::testing::ffn_spec(d_model, d_ff);
      const compiler::KernelSource k = compiler::generateAuxiliary(KernelKind::TrainWeightGrad, s, target);
      EXPECT_EQ(k.kind, KernelKind::TrainWeightGrad);
      EXPECT_EQ(k.name, fmt::format("twell_train_weight_grad_k{}_n{}_t256_s31_bf16_gated1", d_model, d_ff));
      EXPECT_NE(k.source.find(fmt::format("static constexpr int d_model = {};", d_model)), std::string::npos);
      EXPECT_EQ(k.smem_bytes, (d_ff + 16 * 256) * 4);  // a counter per neuron, a mask per warp and tile column
      EXPECT_EQ(k.operand_alignment, 8);               // both d_models are multiples of 8: 16-byte row loads
      EXPECT_TRUE(k.down_in_out);
      expect_valid_and_compiles_without_spills(k, target, fmt::format("{} on {}", k.name, target.arch()));
    }
}

// Non-gated (two accumulators), f16, the smallest and the largest tile, slots of a whole tile, a
// d_model that is not a multiple of anything.
TEST(TrainWeightGrad, VariantsCompile) {
  struct Case {
    Target target;
    int64_t d_model, d_ff;
    bool gated;
    DType dtype;
    int tile_n, slots;
  };
  for (const Case& c :
       {Case{{90, true}, 2048, 5632, false, DType::BF16, 256, 31},
        Case{{80, false}, 520, 1408, true, DType::FP16, 64, 3}, Case{{80, false}, 100, 300, true, DType::BF16, 32, 2},
        Case{{90, true}, 4100, 1000, false, DType::FP16, 1024, 1024}}) {
    FfnSpec s = twell::testing::ffn_spec(c.d_model, c.d_ff);
    s.gated = c.gated;
    s.dtype = c.dtype;
    s.tile_n = c.tile_n;
    s.slots = c.slots;
    const compiler::KernelSource k = compiler::generateAuxiliary(KernelKind::TrainWeightGrad, s, c.target);
    EXPECT_EQ(k.gated, c.gated);
    EXPECT_EQ(k.smem_bytes, ((c.d_ff + 3) / 4 * 4 + 16 * c.tile_n) * 4);
    EXPECT_EQ(k.operand_alignment, c.d_model % 8 == 0 ? 8 : 1);
    expect_valid_and_compiles_without_spills(k, c.target, fmt::format("{} on {}", k.name, c.target.arch()));
  }
}

TEST(TrainWeightGrad, LaunchGeometryAndRequestKey) {
  FfnSpec s = twell::testing::ffn_spec(520, 1408);
  s.activation = Activation::SiLU;
  s.threshold = 0.1f;
  s.tile_n = 128;
  s.slots = 15;
  const compiler::KernelSource k = compiler::generateAuxiliary(KernelKind::TrainWeightGrad, s, Target{90, true});
  // One cooperative CTA of 512 threads per SM (at most 256), whatever M; shared memory: 1408 counters
  // and 16 warps' masks of 128 columns.
  for (int64_t tokens : {0, 1, 100000})
    for (auto [sms, ctas] : {std::pair{132, 132u}, std::pair{300, 256u}, std::pair{1, 1u}}) {
      const kernels::LaunchConfig c =
          kernels::launch_config(k, kernels::LaunchShape{tokens, 0, 0}, kernels::Occupancy{sms, 1, 0});
      EXPECT_EQ(c.grid_x, ctas);
      EXPECT_EQ(c.grid_y, 1u);
      EXPECT_EQ(c.block_x, 512u);
      EXPECT_TRUE(c.cooperative);
      EXPECT_EQ(c.shared_bytes, (1408u + 16u * 128u) * 4u);
    }
  EXPECT_EQ(k.name, "twell_train_weight_grad_k520_n1408_t128_s15_bf16_gated1");
  EXPECT_EQ(detail::auxiliary_request(KernelKind::TrainWeightGrad, s, Target{90, true}),
            "aux train_weight_grad target=sm_90a d_model=520 d_ff=1408 gated=1 dtype=bf16 tile_n=128 slots=15");
  // The activation and threshold are not the kernel's: the same kernel for another threshold.
  s.threshold = 0.2f;
  s.activation = Activation::ReLU;
  EXPECT_EQ(compiler::generateAuxiliary(KernelKind::TrainWeightGrad, s, Target{90, true}).name, k.name);
  s.gated = false;
  EXPECT_EQ(compiler::generateAuxiliary(KernelKind::TrainWeightGrad, s, Target{90, true}).name,
            "twell_train_weight_grad_k520_n1408_t128_s15_bf16_gated0");
  // A broken description is caught by the contract.
  for (auto [field, breaks] : std::initializer_list<std::pair<const char*, void (*)(compiler::KernelSource&)>>{
           {"threads", [](compiler::KernelSource& b) { b.threads = 128; }},
           {"smem_bytes", [](compiler::KernelSource& b) { b.smem_bytes = 40960; }},
           {"grid_y", [](compiler::KernelSource& b) { b.grid_y = 2; }},
           {"d_ff", [](compiler::KernelSource& b) { b.d_ff = 60000; }},
           {"operand_alignment", [](compiler::KernelSource& b) { b.operand_alignment = 1; }},
           {"dependent_launch", [](compiler::KernelSource& b) { b.dependent_launch = true; }},
           {"down_in_out", [](compiler::KernelSource& b) { b.down_in_out = false; }},
           {"mainloop", [](compiler::KernelSource& b) { b.mainloop = kernels::GateMainloop::Fma; }}}) {
    compiler::KernelSource broken = k;
    breaks(broken);
    EXPECT_NE(kernels::validate_kernel(broken, Target{90, true}).find(field), std::string::npos) << field;
  }
}

void expect_generate_error(const FfnSpec& s, const std::string& field) {
  try {
    compiler::generateAuxiliary(KernelKind::TrainWeightGrad, s, Target{90, true});
    ADD_FAILURE() << "expected an error naming " << field;
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::InvalidArgument) << e.what();
    EXPECT_NE(std::string(e.what()).find(field), std::string::npos) << e.what();
  }
}

TEST(TrainWeightGrad, BadSpecsNameTheField) {
  expect_generate_error(twell::testing::ffn_spec(70000, 1408), "spec.d_model");
  expect_generate_error(twell::testing::ffn_spec(0, 1408), "spec.d_model");
  expect_generate_error(twell::testing::ffn_spec(512, 0), "spec.d_ff");
  expect_generate_error(twell::testing::ffn_spec(512, 60000), "spec.d_ff");  // past the neuron counters' shared memory
  FfnSpec s = twell::testing::ffn_spec(512, 1408);
  s.tile_n = 48;
  expect_generate_error(s, "spec.tile_n");
  s = twell::testing::ffn_spec(512, 1408);
  s.slots = 300;
  expect_generate_error(s, "spec.slots");
}

// train_weight_grad's checks run before it needs a GPU: each bad argument is named.
struct Arguments {
  FfnSpec spec = twell::testing::ffn_spec(512, 1408);
  TrainWeightGradTensors t = [] {
    TrainWeightGradTensors t;
    // Fake, well-aligned addresses far apart: the checks below never dereference them.
    t.x = reinterpret_cast<const void*>(0x10000000);
    t.dy = reinterpret_cast<const void*>(0x20000000);
    t.twell = reinterpret_cast<const uint32_t*>(0x30000000);
    t.entry_grad = reinterpret_cast<const float*>(0x40000000);
    t.backup_grad = reinterpret_cast<const float*>(0x50000000);
    t.dw_gate = reinterpret_cast<void*>(0x60000000);
    t.dw_up = reinterpret_cast<void*>(0x70000000);
    t.dw_down = reinterpret_cast<void*>(0x80000000);
    t.workspace = reinterpret_cast<void*>(0x90000000);
    t.entry_list = reinterpret_cast<void*>(0xA0000000);
    return t;
  }();
  int64_t tokens = 16;
  uint32_t grad_capacity = 8;
};


void expect_argument_error(const Arguments& a, const std::string& name) {
  try {
    train_weight_grad(no_device_context(), nullptr, a.spec, a.t, a.tokens, a.grad_capacity);
    ADD_FAILURE() << "expected an error naming " << name;
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::InvalidArgument) << e.what();
    EXPECT_NE(std::string(e.what()).find(name), std::string::npos) << "expected " << name << " in: " << e.what();
  }
}

TEST(TrainWeightGrad, BadArgumentsNameTheArgument) {
  auto with = [](auto change) {
    Arguments a;
    change(a);
    return a;
  };
  expect_argument_error(with([](Arguments& a) { a.spec.slots = 0; }), "spec.slots");
  expect_argument_error(with([](Arguments& a) { a.spec.d_model = 70000; }), "spec.d_model");
  expect_argument_error(with([](Arguments& a) { a.t.x = nullptr; }), "t.x");
  expect_argument_error(with([](Arguments& a) { a.t.dy = reinterpret_cast<const void*>(0x20000001); }), "t.dy");
  expect_argument_error(with([](Arguments& a) { a.t.twell = nullptr; }), "t.twell");
  expect_argument_error(with([](Arguments& a) { a.t.entry_grad = reinterpret_cast<const float*>(0x40000008); }),
                        "t.entry_grad");
  expect_argument_error(with([](Arguments& a) { a.t.backup_grad = nullptr; }), "t.backup_grad");
  expect_argument_error(with([](Arguments& a) { a.t.dw_gate = nullptr; }), "t.dw_gate");
  expect_argument_error(with([](Arguments& a) { a.t.dw_down = reinterpret_cast<void*>(0x80000002); }), "t.dw_down");
  expect_argument_error(with([](Arguments& a) { a.spec.gated = false; }), "t.dw_up");
  expect_argument_error(with([](Arguments& a) { a.t.dw_up = nullptr; }), "t.dw_up");
  expect_argument_error(with([](Arguments& a) { a.t.ld_dw_up = 100; }), "t.ld_dw_up");
  expect_argument_error(with([](Arguments& a) { a.t.ld_x = 511; }), "t.ld_x");
  expect_argument_error(with([](Arguments& a) { a.tokens = -1; }), "tokens");
  expect_argument_error(with([](Arguments& a) { a.tokens = int64_t{1} << 31; }), "tokens");
  expect_argument_error(with([](Arguments& a) { a.tokens = int64_t{1} << 30; }),
                        "tokens");  // 2^32 list entries or more
  // d_model 512: x and dy are read 8 values per 16-byte load.
  expect_argument_error(with([](Arguments& a) { a.t.x = reinterpret_cast<const void*>(0x10000008); }), "t.x");
  expect_argument_error(with([](Arguments& a) { a.t.ld_dy = 516; }), "t.ld_dy");
  expect_argument_error(with([](Arguments& a) { a.t.workspace = nullptr; }), "t.workspace");
  expect_argument_error(with([](Arguments& a) { a.t.workspace = reinterpret_cast<void*>(0x90000004); }), "t.workspace");
  expect_argument_error(with([](Arguments& a) { a.t.entry_list = reinterpret_cast<void*>(0xA0000004); }),
                        "t.entry_list");
  expect_argument_error(with([](Arguments& a) { a.t.entry_list = a.t.dw_up; }), "t.entry_list");
  expect_argument_error(with([](Arguments& a) { a.t.workspace = const_cast<void*>(a.t.x); }), "t.workspace");
  expect_argument_error(with([](Arguments& a) { a.t.entry_list = reinterpret_cast<char*>(0x90000000) + 1024; }),
                        "t.entry_list");
  expect_argument_error(with([](Arguments& a) { a.t.workspace = const_cast<float*>(a.t.entry_grad) + 64; }),
                        "t.workspace");
  // dWd over dWg's rows, dWg over dy.
  expect_argument_error(with([](Arguments& a) { a.t.dw_down = static_cast<char*>(a.t.dw_gate) + 4096; }), "t.dw_down");
  expect_argument_error(with([](Arguments& a) { a.t.dw_gate = const_cast<void*>(a.t.dy); }), "t.dw_gate");
  // A null backup_grad is fine without grad rows; 16-bit outputs need only 2-byte alignment. Good
  // arguments reach the device: there is none here.
  for (const Arguments& a : {Arguments{}, with([](Arguments& a) {
                               a.grad_capacity = 0;
                               a.t.backup_grad = nullptr;
                             }),
                             with([](Arguments& a) {
                               a.t.output_dtype = true;
                               a.t.dw_down = reinterpret_cast<void*>(0x80000002);
                             })}) {
    try {
      train_weight_grad(no_device_context(), nullptr, a.spec, a.t, a.tokens, a.grad_capacity);
      ADD_FAILURE() << "expected Error(NoDevice)";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::NoDevice) << e.what();
    }
  }
}

void expect_no_device(const Arguments& a, const std::string& what) {
  try {
    train_weight_grad(no_device_context(), nullptr, a.spec, a.t, a.tokens, a.grad_capacity);
    ADD_FAILURE() << what << ": expected Error(NoDevice)";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::NoDevice) << what << ": " << e.what();
  }
}

std::string argument_error(const Arguments& a) {
  try {
    train_weight_grad(no_device_context(), nullptr, a.spec, a.t, a.tokens, a.grad_capacity);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

template <class Change>
Arguments with(Change change) {
  Arguments a;
  change(a);
  return a;
}

// The kernel reads the TwELL words and the quads while other warps write the outputs: an output over
// any of them is an overlap too (training.h: "must not overlap each other or any input").
TEST(TrainWeightGrad, OutputsMustNotOverlapTheTwellWordsOrTheQuads) {
  expect_argument_error(with([](Arguments& a) { a.t.dw_gate = const_cast<uint32_t*>(a.t.twell) + 100; }), "t.twell");
  expect_argument_error(with([](Arguments& a) { a.t.dw_up = const_cast<float*>(a.t.entry_grad); }), "t.entry_grad");
  expect_argument_error(with([](Arguments& a) { a.t.dw_down = const_cast<float*>(a.t.backup_grad) + 4; }),
                        "t.backup_grad");
  // Right after the last quad of backup_grad (8 grad rows of 256 quads) is not an overlap.
  expect_no_device(with([](Arguments& a) { a.t.dw_down = const_cast<float*>(a.t.backup_grad) + 8 * 256 * 4; }),
                   "dw_down right after backup_grad");
}

// The workspace and the entry list against every other buffer, and the messages give both byte ranges.
TEST(TrainWeightGrad, ScratchMustNotOverlapAnyBuffer) {
  const Arguments base;
  const int64_t workspace_bytes = train_weight_grad_workspace_bytes(base.spec);
  const int64_t list_bytes = train_weight_grad_list_bytes(base.spec, base.tokens, base.grad_capacity);
  ASSERT_EQ(workspace_bytes % 16, 0);
  ASSERT_EQ(list_bytes, (16 * 192 + 8 * 256) * 8);  // 6 tiles x 32 words per row, 8 grad rows of 256
  const std::pair<const char*, const void*> others[] = {{"t.x", base.t.x},
                                                        {"t.dy", base.t.dy},
                                                        {"t.twell", base.t.twell},
                                                        {"t.entry_grad", base.t.entry_grad},
                                                        {"t.backup_grad", base.t.backup_grad},
                                                        {"t.dw_gate", base.t.dw_gate},
                                                        {"t.dw_up", base.t.dw_up},
                                                        {"t.dw_down", base.t.dw_down}};
  for (const auto& [other, q] : others) {
    // The scratch buffer's last 16 bytes on the other's first.
    const auto near = reinterpret_cast<uintptr_t>(q);
    Arguments a = base;
    a.t.workspace = reinterpret_cast<void*>(near - workspace_bytes + 16);
    std::string m = argument_error(a);
    EXPECT_NE(m.find("t.workspace"), std::string::npos) << other << ": " << m;
    EXPECT_NE(m.find(other), std::string::npos) << other << ": " << m;
    EXPECT_NE(m.find(fmt::format("{}", q)), std::string::npos) << "the other's range in: " << m;
    a = base;
    a.t.entry_list = reinterpret_cast<void*>(near - list_bytes + 8);
    m = argument_error(a);
    EXPECT_NE(m.find("t.entry_list"), std::string::npos) << other << ": " << m;
    EXPECT_NE(m.find(other), std::string::npos) << other << ": " << m;
    // Just before it is fine.
    a.t.entry_list = reinterpret_cast<void*>(near - list_bytes);
    expect_no_device(a, std::string("entry_list right before ") + other);
  }
  // The entry list's end one word into the workspace, then right before it.
  Arguments a = base;
  a.t.entry_list = static_cast<char*>(a.t.workspace) - list_bytes + 8;
  const std::string m = argument_error(a);
  EXPECT_NE(m.find("t.entry_list"), std::string::npos) << m;
  EXPECT_NE(m.find("t.workspace"), std::string::npos) << m;
  a.t.entry_list = static_cast<char*>(a.t.workspace) - list_bytes;
  expect_no_device(a, "entry_list right before workspace");
  a.t.entry_list = static_cast<char*>(a.t.workspace) + workspace_bytes;
  expect_no_device(a, "entry_list right after workspace");
}

// An empty entry list (no tokens, no grad rows) is train_weight_grad_list_bytes' 0 bytes: a null pointer
// (cudaMalloc of 0 bytes) is fine; the kernel writes zeros without reading one.
TEST(TrainWeightGrad, EmptyEntryListMayBeNull) {
  Arguments a;
  a.tokens = 0;
  a.grad_capacity = 0;
  a.t.backup_grad = nullptr;
  a.t.entry_list = nullptr;
  ASSERT_EQ(train_weight_grad_list_bytes(a.spec, a.tokens, a.grad_capacity), 0);
  expect_no_device(a, "tokens 0, no grad rows, null entry list");
  // Grad rows make room in the list even without tokens.
  a.grad_capacity = 1;
  a.t.backup_grad = reinterpret_cast<const float*>(0x50000000);
  expect_argument_error(a, "t.entry_list");
  // tokens 0 does not read x or dy: any overlap with them is harmless, the others still count.
  a = Arguments{};
  a.tokens = 0;
  a.t.workspace = const_cast<void*>(a.t.x);
  expect_no_device(a, "tokens 0, workspace at x");
  a.t.workspace = const_cast<float*>(a.t.backup_grad);
  expect_argument_error(a, "t.backup_grad");
}

// Arguments for M near 2^31: the smallest TwELL row (one tile of 32 columns, one slot: 2 words), so the
// list stays under 2^32 entries; fake buffers 2^44 bytes apart (x alone spans 2^41).
Arguments huge_arguments() {
  Arguments a;
  a.spec = twell::testing::ffn_spec(512, 32);
  a.spec.tile_n = 32;
  a.spec.slots = 1;
  a.grad_capacity = 0;
  const auto at = [](int i) { return reinterpret_cast<void*>(uintptr_t{1} << 44 | uintptr_t(i) << 45); };
  a.t.x = at(0);
  a.t.dy = at(1);
  a.t.twell = static_cast<const uint32_t*>(at(2));
  a.t.entry_grad = static_cast<const float*>(at(3));
  a.t.backup_grad = static_cast<const float*>(at(4));
  a.t.dw_gate = at(5);
  a.t.dw_up = at(6);
  a.t.dw_down = at(7);
  a.t.workspace = at(8);
  a.t.entry_list = at(9);
  return a;
}

TEST(TrainWeightGrad, TokensAndListEntriesAtTheLimits) {
  Arguments a = huge_arguments();
  a.tokens = INT32_MAX;  // 2^32 - 2 list entries
  expect_no_device(a, "tokens 2^31 - 1, 2 words per row");
  a.grad_capacity = 1;  // + 32 quads: 2^32 + 30
  std::string m = argument_error(a);
  EXPECT_NE(m.find("tokens: "), std::string::npos) << m;
  EXPECT_NE(m.find("4294967326"), std::string::npos) << "the count given: " << m;
  // grad_capacity alone past 2^32 entries: it is grad_capacity that is named, whatever the tokens.
  a.tokens = 1;
  a.grad_capacity = UINT32_MAX;
  m = argument_error(a);
  EXPECT_EQ(m.rfind("train_weight_grad: grad_capacity: ", 0), 0u) << m;
  EXPECT_EQ(train_weight_grad_list_bytes(a.spec, 1, UINT32_MAX), (2 + int64_t{UINT32_MAX} * 32) * 8);
}

// Row strides up to 2^36 elements over 2^28 rows: x spans about 2^65 bytes, past 64 bits; the overlap
// checks must not wrap around and miss the workspace sitting on x.
TEST(TrainWeightGrad, HugeStridesDoNotHideOverlaps) {
  // x (then dy) above every other buffer: its rows run to the end of the address space.
  const void* top = reinterpret_cast<const void*>(uintptr_t{3} << 48);
  Arguments a = huge_arguments();
  a.tokens = int64_t{1} << 28;
  a.t.ld_x = int64_t{1} << 36;
  a.t.x = top;
  expect_no_device(a, "x with a 2^36 stride, alone");
  a.t.workspace = const_cast<void*>(a.t.x);
  expect_argument_error(a, "t.workspace");
  a = huge_arguments();
  a.tokens = int64_t{1} << 28;
  a.t.ld_dy = int64_t{1} << 36;
  a.t.dy = top;
  a.t.dw_gate = static_cast<char*>(const_cast<void*>(a.t.dy)) + 4096;
  expect_argument_error(a, "t.dw_gate");
}

// d_model not a multiple of 8: x and dy are read one value at a time, so 2-byte alignment and any
// stride; non-gated specs take no dw_up; fp32 outputs need 4 bytes, 16-bit outputs 2.
TEST(TrainWeightGrad, OddDModelNonGatedAndOutputTypes) {
  Arguments a;
  a.spec = twell::testing::ffn_spec(100, 300);
  a.t.x = reinterpret_cast<const void*>(0x10000002);
  a.t.ld_x = 101;
  a.t.ld_dy = 103;
  expect_no_device(a, "d_model 100, x at 2 bytes, odd strides");
  a.t.x = reinterpret_cast<const void*>(0x10000001);
  std::string m = argument_error(a);
  EXPECT_NE(m.find("t.x: expected a 2-byte aligned"), std::string::npos) << m;
  EXPECT_NE(m.find("0x10000001"), std::string::npos) << m;
  a = Arguments{};
  a.t.ld_x = 99;
  a.spec = twell::testing::ffn_spec(100, 300);
  m = argument_error(a);
  EXPECT_NE(m.find("t.ld_x: expected a row stride in 100..2^36"), std::string::npos) << m;
  EXPECT_NE(m.find("got 99"), std::string::npos) << m;
  a = Arguments{};
  a.spec.gated = false;
  a.t.dw_up = nullptr;
  expect_no_device(a, "non-gated");
  a.t.ld_dw_up = 512;
  expect_argument_error(a, "t.dw_up");
  a = Arguments{};
  a.t.dw_gate = reinterpret_cast<void*>(0x60000002);
  m = argument_error(a);
  EXPECT_NE(m.find("t.dw_gate: expected a 4-byte aligned"), std::string::npos) << m;
  a.t.output_dtype = true;
  expect_no_device(a, "16-bit outputs at 2 bytes");
  // 16-bit outputs are half the bytes: dw_up may start right after dw_gate's 16-bit rows.
  a = Arguments{};
  a.t.output_dtype = true;
  a.t.dw_up = static_cast<char*>(a.t.dw_gate) + 1408 * 512 * 2;
  expect_no_device(a, "16-bit dw_up right after dw_gate");
  a.t.output_dtype = false;
  m = argument_error(a);
  EXPECT_NE(m.find("t.dw_up: must not overlap t.dw_gate"), std::string::npos) << m;
}

// The contract's d_ff limit (maxDFF) must leave room for the kernel's static shared memory: the
// launch's dynamic bytes plus what ptxas reports ("N bytes smem") must fit the target's opt-in limit,
// or cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES) refuses the kernel at the largest d_ffs.
// maxDFF keeps TrainWeightGradConstraints::kStaticReserve for the static bytes (found by the review:
// without it the d_ffs 54001..54013 at tile_n 256 on sm_90 passed the contract and failed at load time).
TEST(TrainWeightGrad, SharedMemoryAtTheLargestDffFitsTheTarget) {
  using T = kernels::TrainWeightGradConstraints;
  for (auto [target, tile_n] : {std::pair{Target{90, true}, 256}, std::pair{Target{80, false}, 1024}}) {
    const int64_t limit = kernels::GatedDownKernelConstraints::maxDynamicSharedBytes(target.sm);
    FfnSpec s = twell::testing::ffn_spec(512, T::maxDFF(tile_n, limit));
    s.tile_n = tile_n;
    const compiler::KernelSource k = compiler::generateAuxiliary(KernelKind::TrainWeightGrad, s, target);
    const detail::NvrtcOutput out =
        detail::compileCuda(k.source, k.name + ".cu", target.arch(), /*want_cubin=*/true, {"--ptxas-options=-v"});
    std::smatch match;
    static const std::regex smem(R"((\d+) bytes smem)");
    ASSERT_TRUE(std::regex_search(out.log, match, smem)) << out.log;
    const int64_t static_bytes = std::stoll(match[1].str());
    EXPECT_LE(k.smem_bytes + static_bytes, limit)
        << k.name << ": " << k.smem_bytes << " dynamic + " << static_bytes << " static bytes on " << target.arch();
  }
}

TEST(TrainWeightGrad, ScratchSizes) {
  const FfnSpec paper = twell::testing::ffn_spec(2048, 5632);
  // 22 tiles: barrier and flags (28 words), starts (5633, to 5660), counts 5632 x 256.
  EXPECT_EQ(train_weight_grad_workspace_bytes(paper), (28 + 5636 + 5632 * 256) * 4);
  // 704 words per row (22 tiles x 32) and 256 quads per grad row, 8 bytes each.
  EXPECT_EQ(train_weight_grad_list_bytes(paper, 16384, 100), (16384 * 704 + 100 * 256) * 8);
  EXPECT_EQ(train_weight_grad_list_bytes(paper, 0, 0), 0);
}

}  // namespace
