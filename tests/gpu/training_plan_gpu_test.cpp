// FfnTrainingPlan (twell/training_plan.h) on the GPU, forward and backward of whole steps, against the
// CPU reference (twell/training_reference.h) and the inference plan:
//   y: bit for bit FfnPlan::run's (Dispatch::Sparse, the row consumer), within 1e-2 of the reference;
//   the L1 term (sum of row_l1 / tokens) within 1e-4 of the reference's (double) sum;
//   dx, dWg, dWu, dWd within 1e-2 of reference_training_backward, with lambda, and bit-identical on a
//   second step; the L1 coefficient through a device scalar (l1_weight) as through lambda;
//   a backup far too small (every overflowing tile-row recomputed, then the capacity grown): the same
//   gradients; shapes with odd d_model (520) and d_ff (1408), M = 1, 7, 1000; relu and silu, bf16 and
//   f16, gated and not, both Wd layouts; outputs poisoned (NaN bits) before every call.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "test_data.h"
#include "twell/context.h"
#include "twell/device_memory.h"
#include "twell/error.h"
#include "twell/half.h"
#include "twell/reference.h"
#include "twell/training_plan.h"
#include "twell/training_reference.h"

using namespace twell;
using namespace twell::testing;

namespace {

Context& plan_context() {
  static Context ctx;
  return ctx;
}

#define REQUIRE_GPU() \
  if (!plan_context().has_gpu()) GTEST_SKIP() << "no GPU: " << plan_context().no_gpu_reason()

// One training step's outputs, downloaded.
struct Step {
  std::vector<uint16_t> y, dx;
  std::vector<float> row_l1, dw_gate, dw_up, dw_down;  // dw_down: in_out [N, K]
};

FfnTensors tensors(const RandomFfn& f, DeviceMemory& x, DeviceMemory& wg, DeviceMemory& wu, DeviceMemory& wd, DeviceMemory& y) {
  FfnTensors t;
  t.x = x.data();
  t.w_gate = wg.data();
  t.w_up = f.spec.gated ? wu.data() : nullptr;
  t.w_down = wd.data();
  t.y = y.data();
  return t;
}

// A gated layer on the device: x, the weights and dy uploaded, y, dx and fp32 weight gradients allocated;
// t and g point at them.
struct GatedLayer {
  DeviceMemory x, wg, wu, wd, y, dy, dx, dwg, dwu, dwd;
  FfnTensors t;
  FfnGradients g;
  GatedLayer(Context& c, const RandomFfn& f, const std::vector<uint16_t>& dy_host)
      : x(c, f.x.size() * 2), wg(c, f.w_gate.size() * 2), wu(c, f.w_up.size() * 2), wd(c, f.w_down.size() * 2),
        y(c, f.x.size() * 2), dy(c, dy_host.size() * 2), dx(c, f.x.size() * 2), dwg(c, f.w_gate.size() * 4),
        dwu(c, f.w_up.size() * 4), dwd(c, f.w_down.size() * 4) {
    x.upload(f.x);
    wg.upload(f.w_gate);
    wu.upload(f.w_up);
    wd.upload(f.w_down);
    dy.upload(dy_host);
    t = tensors(f, x, wg, wu, wd, y);
    g.dx = dx.data();
    g.dw_gate = dwg.data();
    g.dw_up = dwu.data();
    g.dw_down = dwd.data();
  }
};

Step run_step(FfnTrainingPlan& plan, FfnTrainingState& state, const RandomFfn& f, const std::vector<uint16_t>& dy,
              float lambda, const float* l1_weight_host, StreamHandle& stream) {
  Context& c = plan_context();
  const FfnSpec& s = f.spec;
  DeviceMemory x(c, f.x.size() * 2), wg(c, f.w_gate.size() * 2), wu(c, std::max<size_t>(2, f.w_up.size() * 2)),
      wd(c, f.w_down.size() * 2), dyd(c, dy.size() * 2), y(c, f.x.size() * 2), dx(c, f.x.size() * 2),
      row_l1(c, std::max<size_t>(4, f.tokens * 4)), dwg(c, f.w_gate.size() * 4),
      dwu(c, std::max<size_t>(4, f.w_up.size() * 4)), dwd(c, f.w_down.size() * 4), l1w(c, 4);
  x.upload(f.x);
  wg.upload(f.w_gate);
  if (s.gated) wu.upload(f.w_up);
  wd.upload(f.w_down);
  dyd.upload(dy);
  for (DeviceMemory* m : {&y, &dx, &row_l1, &dwg, &dwu, &dwd}) m->fill(0xFF);  // NaN bits
  if (l1_weight_host) l1w.upload(l1_weight_host, 4);
  const FfnTensors t = tensors(f, x, wg, wu, wd, y);
  plan.forward(stream.get(), t, f.tokens, state, static_cast<float*>(row_l1.data()));
  FfnGradients g;
  g.dx = dx.data();
  g.dw_gate = dwg.data();
  g.dw_up = s.gated ? dwu.data() : nullptr;
  g.dw_down = dwd.data();
  plan.backward(stream.get(), t, dyd.data(), 0, f.tokens, state, g, lambda, 0,
                l1_weight_host ? static_cast<const float*>(l1w.data()) : nullptr);
  stream.synchronize();
  Step out;
  const size_t rows = static_cast<size_t>(f.tokens * s.d_model);
  out.y = y.download_vector<uint16_t>(rows);
  out.dx = dx.download_vector<uint16_t>(rows);
  out.row_l1 = row_l1.download_vector<float>(static_cast<size_t>(f.tokens));
  out.dw_gate = dwg.download_vector<float>(f.w_gate.size());
  if (s.gated) out.dw_up = dwu.download_vector<float>(f.w_up.size());
  out.dw_down = dwd.download_vector<float>(f.w_down.size());
  return out;
}

// y of the inference plan on the same layer (Dispatch::Sparse, the row consumer, no decode kernels).
std::vector<uint16_t> inference_y(const RandomFfn& f, const TwellLayout& layout) {
  Context& c = plan_context();
  FfnSpec s = f.spec;
  s.consumer = ConsumerVariant::RowGather;
  s.tile_n = layout.tile_n;
  s.slots = layout.slots;
  PlanOptions o;
  o.dispatch = Dispatch::Sparse;
  o.decode_max_tokens = 0;
  FfnPlan plan = c.plan(s, std::max<int64_t>(1, f.tokens), o);
  StreamHandle stream(c);
  DeviceMemory x(c, f.x.size() * 2), wg(c, f.w_gate.size() * 2), wu(c, std::max<size_t>(2, f.w_up.size() * 2)),
      wd(c, f.w_down.size() * 2), y(c, f.x.size() * 2);
  x.upload(f.x);
  wg.upload(f.w_gate);
  if (s.gated) wu.upload(f.w_up);
  wd.upload(f.w_down);
  y.fill(0xFF);
  plan.run(stream.get(), tensors(f, x, wg, wu, wd, y), f.tokens);
  stream.synchronize();
  return y.download_vector<uint16_t>(static_cast<size_t>(f.tokens * s.d_model));
}

// [N, K] in_out -> the reference's layout for spec.down_layout ([K, N] for out_in).
std::vector<float> down_as_spec(const FfnSpec& s, const std::vector<float>& in_out) {
  if (s.down_layout == WeightLayout::InOut) return in_out;
  const int64_t K = s.d_model, N = s.d_ff;
  std::vector<float> out(in_out.size());
  for (int64_t j = 0; j < N; ++j)
    for (int64_t k = 0; k < K; ++k) out[k * N + j] = in_out[j * K + k];
  return out;
}

struct Case {
  std::string name;
  FfnSpec spec;
  int64_t tokens;
  double density;
  std::optional<uint32_t> backup_capacity;
  float lambda = 0.5f;
};

// A step's outputs against the CPU reference (y, dx and the weight gradients within 1e-2, the L1 term
// within l1_tolerance relative), and a second step's bits equal to the first's. Returns the relative errors
// (dx, dWg, dWu, dWd) and the L1 term for a verbose line.
struct StepErrors {
  double l1, dx, wg, wu, wd;
};
StepErrors expect_reference_and_repeatable(const Case& c, const Step& a, const Step& b, const TrainingForward& fw,
                                           const TrainingGradients& ref, double l1_tolerance) {
  EXPECT_LT(relative_error(to_float(c.spec.dtype, a.y), fw.y), 1e-2) << "y";
  StepErrors e{};
  for (float r : a.row_l1) e.l1 += r;
  e.l1 = c.tokens > 0 ? e.l1 / double(c.tokens) : 0.0;
  EXPECT_LE(std::abs(e.l1 - fw.l1), l1_tolerance * std::abs(fw.l1) + 1e-30) << "L1 term: " << e.l1 << " vs " << fw.l1;
  e.dx = relative_error(to_float(c.spec.dtype, a.dx), ref.dx);
  e.wg = relative_error(a.dw_gate, ref.dw_gate);
  e.wd = relative_error(down_as_spec(c.spec, a.dw_down), ref.dw_down);
  e.wu = c.spec.gated ? relative_error(a.dw_up, ref.dw_up) : 0.0;
  EXPECT_LT(e.dx, 1e-2) << "dx";
  EXPECT_LT(e.wg, 1e-2) << "dWg";
  EXPECT_LT(e.wu, 1e-2) << "dWu";
  EXPECT_LT(e.wd, 1e-2) << "dWd";
  EXPECT_EQ(a.y, b.y) << "y differs between two steps";
  EXPECT_EQ(a.dx, b.dx) << "dx differs between two steps";
  EXPECT_TRUE(same_bits(a.dw_gate, b.dw_gate)) << "dWg differs between two steps";
  EXPECT_TRUE(same_bits(a.dw_up, b.dw_up)) << "dWu differs between two steps";
  EXPECT_TRUE(same_bits(a.dw_down, b.dw_down)) << "dWd differs between two steps";
  EXPECT_TRUE(same_bits(a.row_l1, b.row_l1)) << "row_l1 differs between two steps";
  return e;
}

void check(const Case& c) {
  SCOPED_TRACE(c.name);
  const RandomFfn f = make_random_ffn(c.spec, c.tokens, c.density, 4242 + static_cast<uint32_t>(c.tokens));
  const std::vector<uint16_t> dy = random_bits(c.spec.dtype, static_cast<size_t>(c.tokens * c.spec.d_model), -1.0f, 1.0f, 99);
  TrainingPlanOptions options;
  options.backup_capacity = c.backup_capacity;
  FfnTrainingPlan plan = FfnTrainingPlan::create(plan_context(), c.spec, std::max<int64_t>(1, c.tokens), options);
  FfnTrainingState state = plan.make_state();
  StreamHandle stream(plan_context());
  const Step a = run_step(plan, state, f, dy, c.lambda, nullptr, stream);
  const Step b = run_step(plan, state, f, dy, c.lambda, nullptr, stream);  // a larger backup after an overflow

  FfnSpec ref_spec = c.spec;
  ref_spec.tile_n = plan.layout().tile_n;
  ref_spec.slots = plan.layout().slots;
  const TrainingForward fw = reference_training_forward(ref_spec, f.x, f.tokens, f.weights());
  const TrainingGradients ref = reference_training_backward(ref_spec, f.x, f.weights(), fw, dy, c.lambda);

  EXPECT_EQ(a.y, inference_y(f, plan.layout())) << "y: not FfnPlan::run's bits";
  // (The second step's backup may be larger after the first one's overflow.)
  const StepErrors e = expect_reference_and_repeatable(c, a, b, fw, ref, 1e-4);
  // Without u kept from the forward (the backward recomputes it): the same bits.
  options.keep_u = false;
  FfnTrainingPlan recompute = FfnTrainingPlan::create(plan_context(), c.spec, std::max<int64_t>(1, c.tokens), options);
  FfnTrainingState recompute_state = recompute.make_state();
  const Step r = run_step(recompute, recompute_state, f, dy, c.lambda, nullptr, stream);
  EXPECT_EQ(a.dx, r.dx) << "dx differs with keep_u false";
  EXPECT_TRUE(same_bits(a.dw_gate, r.dw_gate)) << "dWg differs with keep_u false";
  EXPECT_TRUE(same_bits(a.dw_up, r.dw_up)) << "dWu differs with keep_u false";
  EXPECT_TRUE(same_bits(a.dw_down, r.dw_down)) << "dWd differs with keep_u false";
  // Where both row kernels are the warp-per-row forms (the kernel reports say), a gated state keeps u.
  bool warp_forms = c.spec.gated;
  for (const KernelReport& k : plan.kernels())
    if (k.kind == "gated_down" || k.kind == "train_row_backward") warp_forms = warp_forms && k.consumer == "warp_row";
  if (warp_forms && c.tokens > 0) {
    EXPECT_GE(state.device_bytes(), recompute_state.device_bytes() + size_t(c.tokens) * plan.layout().words_per_row(c.spec.d_ff) * 4)
        << "u per entry not kept";
  }
  if (std::getenv("TWELL_TEST_VERBOSE"))
    std::printf("%s: nnz %zu, L1 %.6g (ref %.6g), relative errors dx %.3g dWg %.3g dWu %.3g dWd %.3g, state %zu bytes\n",
                c.name.c_str(), fw.neuron.size(), e.l1, fw.l1, e.dx, e.wg, e.wu, e.wd, state.device_bytes());
}

}  // namespace

TEST(GpuTrainingPlan, StepsAgainstTheReference) {
  REQUIRE_GPU();
  const FfnSpec relu_bf16 = make_spec(512, 1408, true, Activation::ReLU, 0.0f, DType::BF16, WeightLayout::OutIn);
  const FfnSpec odd = make_spec(520, 1408, true, Activation::ReLU, 0.0f, DType::BF16, WeightLayout::InOut);
  const FfnSpec silu = make_spec(256, 1024, true, Activation::SiLU, 0.05f, DType::FP16, WeightLayout::OutIn);
  const FfnSpec plain = make_spec(256, 1024, false, Activation::ReLU, 0.0f, DType::BF16, WeightLayout::InOut);
  // 88 tiles of 64 (slots 7): three windows of 32 tiles in both row kernels' walks.
  FfnSpec narrow = make_spec(256, 5632, true, Activation::ReLU, 0.0f, DType::BF16, WeightLayout::InOut);
  narrow.tile_n = 64;
  narrow.slots = 7;
  for (const Case& c : {Case{"relu bf16 out_in M=1000 2%", relu_bf16, 1000, 0.02, {}},
                        Case{"relu bf16 out_in M=1000 0.1%", relu_bf16, 1000, 0.001, {}},
                        Case{"relu bf16 out_in M=1 5%", relu_bf16, 1, 0.05, {}},
                        Case{"odd 520x1408 in_out M=7 20%", odd, 7, 0.2, {}},
                        Case{"heavy rows, backup of 1 tile-row, M=300 20%", relu_bf16, 300, 0.2, 1u},
                        Case{"silu f16 M=200 5%", silu, 200, 0.05, {}},
                        Case{"non-gated M=300 2%", plain, 300, 0.02, {}},
                        Case{"lambda 0 M=256 0.5%", relu_bf16, 256, 0.005, {}, 0.0f},
                        // Some tile-rows overflow, others not: kept u read at ordinals shifted by overflowing
                        // tile-rows' entries (backed up, or recomputed with a backup of one tile-row).
                        Case{"10% M=1000", relu_bf16, 1000, 0.10, {}},
                        Case{"10% M=1000, backup of 1 tile-row", relu_bf16, 1000, 0.10, 1u},
                        Case{"tile_n 64, 88 tiles, M=200 8%", narrow, 200, 0.08, {}},
                        // A partial last tile with the warp-per-row forms (d_model 512): d_ff 1001, and 41 (one
                        // partial tile: a split's TwELL part at 960 dense neurons).
                        Case{"d_ff 1001 M=1000 5%", make_spec(512, 1001, true, Activation::ReLU, 0.0f, DType::BF16, WeightLayout::OutIn),
                             1000, 0.05, {}},
                        Case{"d_ff 41 M=1000 5%", make_spec(512, 41, true, Activation::ReLU, 0.0f, DType::BF16, WeightLayout::OutIn),
                             1000, 0.05, {}}})
    check(c);
}

namespace {
// The dense path (TrainingDispatch::Dense: cuBLASLt GEMMs and the two elementwise kernels) on the same
// cases: y and the gradients within 1e-2 of the reference, the L1 term within 2e-3 (h from the
// dtype-rounded u, the reference's from fp32 u), the same bits on a second step, the path reported, the
// state's bytes g and u's; then a second backward of the consumed state refused by name.
// With options.dense_neurons (the split: the dense path's kernels on the first neurons, TwELL on the rest)
// the same checks, the path reported Sparse and the state holding the dense neurons' g and u.
void check_dense(const Case& c, int64_t dense_neurons = 0) {
  SCOPED_TRACE(c.name + (dense_neurons ? " (split at " + std::to_string(dense_neurons) + ")" : " (dense path)"));
  const RandomFfn f = make_random_ffn(c.spec, c.tokens, c.density, 4242 + static_cast<uint32_t>(c.tokens));
  const std::vector<uint16_t> dy = random_bits(c.spec.dtype, static_cast<size_t>(c.tokens * c.spec.d_model), -1.0f, 1.0f, 99);
  TrainingPlanOptions options;
  options.backup_capacity = c.backup_capacity;
  options.dispatch = dense_neurons ? TrainingDispatch::Sparse : TrainingDispatch::Dense;
  options.dense_neurons = dense_neurons;
  FfnTrainingPlan plan = FfnTrainingPlan::create(plan_context(), c.spec, std::max<int64_t>(1, c.tokens), options);
  bool reported = false;
  for (const KernelReport& k : plan.kernels()) reported = reported || k.kind == "train_dense_backward";
  EXPECT_TRUE(reported) << "the dense path's kernels are not in the plan's reports";
  FfnTrainingState state = plan.make_state();
  StreamHandle stream(plan_context());
  const Step a = run_step(plan, state, f, dy, c.lambda, nullptr, stream);
  if (dense_neurons) {
    EXPECT_EQ(state.path(), TrainingPath::Sparse);
    EXPECT_GE(state.device_bytes(), size_t(c.tokens) * size_t(dense_neurons) * (c.spec.gated ? 4 : 2)) << "the dense neurons' g and u";
  } else {
    EXPECT_EQ(state.path(), TrainingPath::Dense);
    EXPECT_EQ(state.device_bytes(), size_t(plan.dense_state_bytes(c.tokens)) + 8) << "g, u and the overflow word";
  }
  const Step b = run_step(plan, state, f, dy, c.lambda, nullptr, stream);
  FfnSpec ref_spec = c.spec;
  ref_spec.tile_n = plan.layout().tile_n;
  ref_spec.slots = plan.layout().slots;
  const TrainingForward fw = reference_training_forward(ref_spec, f.x, f.tokens, f.weights());
  const TrainingGradients ref = reference_training_backward(ref_spec, f.x, f.weights(), fw, dy, c.lambda);
  const StepErrors e = expect_reference_and_repeatable(c, a, b, fw, ref, 2e-3);
  if (std::getenv("TWELL_TEST_VERBOSE"))
    std::printf("%s (%s %lld): L1 %.6g (ref %.6g), relative errors dx %.3g dWg %.3g dWu %.3g dWd %.3g\n", c.name.c_str(),
                dense_neurons ? "split" : "dense", static_cast<long long>(dense_neurons), e.l1, fw.l1, e.dx, e.wg, e.wu, e.wd);
}
}  // namespace

namespace {
// The specs both the dense path's and the split's reference tests run (d_ff 1001: rows that are not whole
// 16-byte chunks, so the elementwise kernels take their scalar loops).
struct PathSpecs {
  FfnSpec relu_bf16 = make_spec(512, 1408, true, Activation::ReLU, 0.0f, DType::BF16, WeightLayout::OutIn);
  FfnSpec odd = make_spec(520, 1408, true, Activation::ReLU, 0.0f, DType::BF16, WeightLayout::InOut);
  FfnSpec silu = make_spec(256, 1024, true, Activation::SiLU, 0.05f, DType::FP16, WeightLayout::OutIn);
  FfnSpec plain = make_spec(256, 1024, false, Activation::ReLU, 0.0f, DType::BF16, WeightLayout::InOut);
  FfnSpec odd_rows = make_spec(200, 1001, true, Activation::ReLU, 0.0f, DType::BF16, WeightLayout::OutIn);
};
}  // namespace

TEST(GpuTrainingPlan, DensePathAgainstTheReference) {
  REQUIRE_GPU();
  const PathSpecs k;
  const FfnSpec &relu_bf16 = k.relu_bf16, &odd = k.odd, &silu = k.silu, &plain = k.plain, &odd_rows = k.odd_rows;
  for (const Case& c : {Case{"relu bf16 out_in M=1000 2%", relu_bf16, 1000, 0.02, {}},
                        Case{"relu bf16 out_in M=1 5%", relu_bf16, 1, 0.05, {}},
                        Case{"odd 520x1408 in_out M=7 20%", odd, 7, 0.2, {}},
                        Case{"silu f16 M=200 5%", silu, 200, 0.05, {}},
                        Case{"non-gated M=300 2%", plain, 300, 0.02, {}},
                        Case{"lambda 0 M=256 0.5%", relu_bf16, 256, 0.005, {}, 0.0f},
                        Case{"d_ff 1001 (scalar elementwise loops), M=333 10%", odd_rows, 333, 0.10, {}},
                        Case{"every row heavy, M=500 50%", relu_bf16, 500, 0.5, {}}})
    check_dense(c);
}

namespace {
// `call` throws Error(InvalidArgument) whose message names `needle`; `what` says what was not refused.
void expect_refused(const std::function<void()>& call, const std::string& needle, const std::string& what) {
  try {
    call();
    ADD_FAILURE() << what << " not refused";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::InvalidArgument) << e.what();
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

// A forward and backward of zero tokens write zero weight gradients (poisoned first) on d's buffers.
void expect_zero_token_gradients(FfnTrainingPlan& plan, FfnTrainingState& state, GatedLayer& d, size_t weight_elements,
                                 StreamHandle& stream) {
  for (DeviceMemory* m : {&d.dwg, &d.dwu, &d.dwd}) m->fill(0xFF);
  plan.forward(stream.get(), d.t, 0, state);
  plan.backward(stream.get(), d.t, d.dy.data(), 0, 0, state, d.g, 0.1f);
  stream.synchronize();
  for (DeviceMemory* m : {&d.dwg, &d.dwu, &d.dwd}) {
    const std::vector<float> w = m->download_vector<float>(weight_elements);
    EXPECT_TRUE(std::all_of(w.begin(), w.end(), [](float v) { return v == 0.0f; })) << "a weight gradient of 0 tokens is not zero";
  }
}
}  // namespace

// A dense forward's state serves one backward (g and u became dg and du); zero tokens write zero weight
// gradients; the common argument checks hold on the dense path too.
TEST(GpuTrainingPlan, DensePathStateAndZeroTokens) {
  REQUIRE_GPU();
  Context& c = plan_context();
  const FfnSpec s = make_spec(256, 1024, true, Activation::ReLU, 0.0f, DType::BF16, WeightLayout::OutIn);
  const RandomFfn f = make_random_ffn(s, 64, 0.02, 11);
  TrainingPlanOptions o;
  o.dispatch = TrainingDispatch::Dense;
  FfnTrainingPlan plan = FfnTrainingPlan::create(c, s, f.tokens, o);
  FfnTrainingState state = plan.make_state();
  StreamHandle stream(c);
  GatedLayer d(c, f, random_bits(s.dtype, f.x.size(), -1.0f, 1.0f, 12));
  plan.forward(stream.get(), d.t, f.tokens, state);
  expect_refused([&] { plan.backward(stream.get(), d.t, d.dy.data(), 0, f.tokens, state, d.g, -1.0f); }, "lambda", "lambda -1");
  plan.backward(stream.get(), d.t, d.dy.data(), 0, f.tokens, state, d.g, 0.1f);
  expect_refused([&] { plan.backward(stream.get(), d.t, d.dy.data(), 0, f.tokens, state, d.g, 0.1f); }, "state",
                 "a second backward of one dense forward");
  // A gate-only forward (no y, no row_l1) still computes u on the dense path: w_up is checked.
  FfnTensors no_up = d.t;
  no_up.y = nullptr;
  no_up.w_up = nullptr;
  expect_refused([&] { plan.forward(stream.get(), no_up, f.tokens, state); }, "w_up", "a gate-only dense forward without w_up");
  // Weight gradients overlapping each other are refused before anything is written.
  plan.forward(stream.get(), d.t, f.tokens, state);
  FfnGradients overlapping = d.g;
  overlapping.dw_up = d.g.dw_gate;
  expect_refused([&] { plan.backward(stream.get(), d.t, d.dy.data(), 0, f.tokens, state, overlapping, 0.1f); }, "g.dw_up",
                 "overlapping weight gradients");
  plan.backward(stream.get(), d.t, d.dy.data(), 0, f.tokens, state, d.g, 0.1f);  // the state was not consumed
  expect_zero_token_gradients(plan, state, d, f.w_gate.size(), stream);
}

// The split (TrainingPlanOptions::dense_neurons): the first neurons on the dense path's kernels, the rest on
// TwELL, y, row_l1 and dx summed. Any neuron order is correct (hot-first only makes it faster): the
// reference's cases with splits from 64 neurons to all but 64, overflowing tile-rows on the TwELL part.
TEST(GpuTrainingPlan, SplitPathAgainstTheReference) {
  REQUIRE_GPU();
  const PathSpecs k;
  const FfnSpec &relu_bf16 = k.relu_bf16, &odd = k.odd, &silu = k.silu, &plain = k.plain, &odd_rows = k.odd_rows;
  const std::pair<Case, int64_t> cases[] = {
      {Case{"relu bf16 out_in M=1000 2%", relu_bf16, 1000, 0.02, {}}, 512},
      {Case{"relu bf16 out_in M=1 5%", relu_bf16, 1, 0.05, {}}, 64},
      {Case{"odd 520x1408 in_out M=7 20%", odd, 7, 0.2, {}}, 1344},
      {Case{"silu f16 M=200 5%", silu, 200, 0.05, {}}, 256},
      {Case{"non-gated M=300 2%", plain, 300, 0.02, {}}, 128},
      {Case{"lambda 0 M=256 0.5%", relu_bf16, 256, 0.005, {}, 0.0f}, 256},
      {Case{"d_ff 1001, 41 TwELL neurons, M=333 10%", odd_rows, 333, 0.10, {}}, 960},
      {Case{"every row heavy, backup of 1 tile-row, M=500 50%", relu_bf16, 500, 0.5, 1u}, 256},
      {Case{"d_model 512, d_ff 1001, 41 TwELL neurons, M=1000 5%",
            make_spec(512, 1001, true, Activation::ReLU, 0.0f, DType::BF16, WeightLayout::OutIn), 1000, 0.05, {}}, 960}};
  for (const auto& [c, split] : cases) check_dense(c, split);
}

// A split forward's state serves one backward (its dense neurons' g and u became dg and du); its gate-only
// forward reads Wu (the dense neurons' u); zero tokens write zero weight gradients on both parts; under
// Auto the split is the sparse candidate.
TEST(GpuTrainingPlan, SplitPathStateAndZeroTokens) {
  REQUIRE_GPU();
  Context& c = plan_context();
  const FfnSpec s = make_spec(256, 1024, true, Activation::ReLU, 0.0f, DType::BF16, WeightLayout::OutIn);
  const RandomFfn f = make_random_ffn(s, 64, 0.02, 11);
  TrainingPlanOptions o;
  o.dense_neurons = 320;
  FfnTrainingPlan plan = FfnTrainingPlan::create(c, s, f.tokens, o);
  FfnTrainingState state = plan.make_state();
  StreamHandle stream(c);
  GatedLayer d(c, f, random_bits(s.dtype, f.x.size(), -1.0f, 1.0f, 12));
  plan.forward(stream.get(), d.t, f.tokens, state);
  plan.backward(stream.get(), d.t, d.dy.data(), 0, f.tokens, state, d.g, 0.1f);
  stream.synchronize();
  const std::vector<uint16_t> dx = d.dx.download_vector<uint16_t>(f.x.size());
  expect_refused([&] { plan.backward(stream.get(), d.t, d.dy.data(), 0, f.tokens, state, d.g, 0.1f); }, "state",
                 "a second backward of one split forward");
  FfnTensors no_up = d.t;
  no_up.y = nullptr;
  no_up.w_up = nullptr;
  expect_refused([&] { plan.forward(stream.get(), no_up, f.tokens, state); }, "w_up", "a gate-only split forward without w_up");
  expect_zero_token_gradients(plan, state, d, f.w_gate.size(), stream);
  // Auto with the split: one decision, and the path it took gives the split's or the dense path's dx.
  o.dispatch = TrainingDispatch::Auto;
  FfnTrainingPlan automatic = FfnTrainingPlan::create(c, s, f.tokens, o);
  FfnTrainingState auto_state = automatic.make_state();
  d.dx.fill(0xFF);
  automatic.forward(stream.get(), d.t, f.tokens, auto_state);
  automatic.backward(stream.get(), d.t, d.dy.data(), 0, f.tokens, auto_state, d.g, 0.1f);
  stream.synchronize();
  ASSERT_EQ(automatic.decisions().size(), 1u);
  EXPECT_LT(relative_error(to_float(s.dtype, d.dx.download_vector<uint16_t>(f.x.size())), to_float(s.dtype, dx)), 1e-2);
}

// TrainingDispatch::Auto: one timing per (decision key, bucket), the faster path taken, its results those
// of the path it took (within the reference's tolerance), recalibrate() forgets.
TEST(GpuTrainingPlan, AutoTimesBothPathsOncePerBucket) {
  REQUIRE_GPU();
  const FfnSpec s = make_spec(512, 1408, true, Activation::ReLU, 0.0f, DType::BF16, WeightLayout::OutIn);
  const RandomFfn f = make_random_ffn(s, 1000, 0.3, 5);
  const std::vector<uint16_t> dy = random_bits(s.dtype, f.x.size(), -1.0f, 1.0f, 6);
  TrainingPlanOptions o;
  o.dispatch = TrainingDispatch::Auto;
  FfnTrainingPlan plan = FfnTrainingPlan::create(plan_context(), s, f.tokens, o);
  FfnTrainingState state = plan.make_state();
  StreamHandle stream(plan_context());
  const Step a = run_step(plan, state, f, dy, 0.5f, nullptr, stream);
  ASSERT_EQ(plan.decisions().size(), 1u);
  const TrainingDecision first = plan.decisions()[0];
  EXPECT_EQ(first.max_tokens, 1024);
  EXPECT_GT(first.sparse_ms, 0.0);
  EXPECT_GT(first.dense_ms, 0.0);
  EXPECT_EQ(first.path, first.dense_ms < first.sparse_ms ? TrainingPath::Dense : TrainingPath::Sparse);
  EXPECT_EQ(first.dense_steps, 3);
  // At 30% the TwELL step is ~10x the dense one (bench/README.md v58): its timing stops after two timed steps.
  EXPECT_EQ(first.sparse_steps, 2);
  EXPECT_GT(first.sparse_ms, 2 * first.dense_ms);
  EXPECT_EQ(state.path(), first.path);
  const Step b = run_step(plan, state, f, dy, 0.5f, nullptr, stream);
  ASSERT_EQ(plan.decisions().size(), 1u);
  EXPECT_EQ(plan.decisions()[0].sparse_ms, first.sparse_ms) << "timed again";
  EXPECT_EQ(a.dx, b.dx);
  FfnSpec ref_spec = s;
  ref_spec.tile_n = plan.layout().tile_n;
  ref_spec.slots = plan.layout().slots;
  const TrainingForward fw = reference_training_forward(ref_spec, f.x, f.tokens, f.weights());
  const TrainingGradients ref = reference_training_backward(ref_spec, f.x, f.weights(), fw, dy, 0.5f);
  EXPECT_LT(relative_error(to_float(s.dtype, a.dx), ref.dx), 1e-2);
  EXPECT_LT(relative_error(a.dw_gate, ref.dw_gate), 1e-2);
  EXPECT_LT(relative_error(down_as_spec(s, a.dw_down), ref.dw_down), 1e-2);
  std::printf("auto at M=1000, 30%%: sparse %.3f ms, dense %.3f ms -> %s\n", first.sparse_ms, first.dense_ms,
              first.path == TrainingPath::Dense ? "dense" : "sparse");
  // Under Auto a state serves one backward whichever path it took.
  GatedLayer d(plan_context(), f, dy);
  plan.forward(stream.get(), d.t, f.tokens, state);
  plan.backward(stream.get(), d.t, d.dy.data(), 0, f.tokens, state, d.g, 0.5f);
  try {
    plan.backward(stream.get(), d.t, d.dy.data(), 0, f.tokens, state, d.g, 0.5f);
    ADD_FAILURE() << "a second backward under Auto not refused";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("state"), std::string::npos) << e.what();
  }
  plan.recalibrate();
  EXPECT_TRUE(plan.decisions().empty());
}

// The L1 coefficient read from a device scalar (autograd's upstream gradient of the L1 term) gives the
// gradients of lambda = that scalar, up to fp32(1 / M) * w against fp32(w / M): within 1e-5.
TEST(GpuTrainingPlan, L1WeightOnTheDevice) {
  REQUIRE_GPU();
  const FfnSpec s = make_spec(512, 1408, true, Activation::ReLU, 0.0f, DType::BF16, WeightLayout::OutIn);
  const RandomFfn f = make_random_ffn(s, 333, 0.02, 7);
  const std::vector<uint16_t> dy = random_bits(s.dtype, static_cast<size_t>(f.tokens * s.d_model), -1e-3f, 1e-3f, 8);
  FfnTrainingPlan plan = FfnTrainingPlan::create(plan_context(), s, f.tokens);
  FfnTrainingState state = plan.make_state();
  StreamHandle stream(plan_context());
  const float w = 3.0f;
  const Step host = run_step(plan, state, f, dy, w, nullptr, stream);
  const Step device = run_step(plan, state, f, dy, 1.0f, &w, stream);
  const Step none = run_step(plan, state, f, dy, 0.0f, nullptr, stream);
  EXPECT_LT(relative_error(device.dw_gate, host.dw_gate), 1e-5);
  EXPECT_LT(relative_error(device.dw_up, host.dw_up), 1e-5);
  // The L1 term must matter here (dy is small): without it dWg moves well beyond that.
  EXPECT_GT(relative_error(none.dw_gate, host.dw_gate), 1e-2);
}

// dw_down_as_weight (an out_in Wd, gradients in its dtype): dw_down is [K, N] like the weight, the bits of
// the default plan's dWd^T transposed, into dense rows (ld 0) and into rows padded to a longer stride (left
// untouched past N, and nothing written past row K); dx, dWg and dWu keep their bits (the plan's Wd^T
// buffer, which now takes dWd^T, is read by the row backward first). Bad dw_down arguments are refused.
// A split plan (dense_neurons 256) the same way: its TwELL columns bit for bit, its dense ones (another
// GEMM orientation, dy^T h against h^T dy) within a 16-bit rounding.
TEST(GpuTrainingPlan, DwDownAsWeightIsTheTransposeBitForBit) {
  REQUIRE_GPU();
  Context& c = plan_context();
  const FfnSpec s = make_spec(512, 1408, true, Activation::ReLU, 0.0f, DType::BF16, WeightLayout::OutIn);
  const int64_t K = s.d_model, N = s.d_ff;
  for (const auto& [density, split] : {std::pair{0.02, int64_t{0}}, {0.3, int64_t{0}}, {0.02, int64_t{256}}, {0.3, int64_t{256}}}) {
    // 30%: tile-rows overflow (backed up and recomputed)
    SCOPED_TRACE(fmt::format("density {} split {}", density, split));
    const RandomFfn f = make_random_ffn(s, 1000, density, 21);
    StreamHandle stream(c);
    GatedLayer d(c, f, random_bits(s.dtype, f.x.size(), -1.0f, 1.0f, 22));
    TrainingPlanOptions o;
    o.gradients_in_dtype = true;
    o.backup_capacity = 2u;
    o.dense_neurons = split;
    FfnTrainingPlan rows = FfnTrainingPlan::create(c, s, f.tokens, o);
    o.dw_down_as_weight = true;
    FfnTrainingPlan as_weight = FfnTrainingPlan::create(c, s, f.tokens, o);
    struct Out {
      std::vector<uint16_t> dx, dwg, dwu, dwd;
    };
    // One step into d's buffers, dw_down into `dwd` (poisoned; `elements` of it downloaded).
    const auto step = [&](FfnTrainingPlan& plan, DeviceMemory& dwd, size_t elements, int64_t ld_arg) {
      FfnTrainingState state = plan.make_state();
      for (DeviceMemory* m : {&d.dx, &d.dwg, &d.dwu, &dwd}) m->fill(0xFF);
      plan.forward(stream.get(), d.t, f.tokens, state, nullptr);
      FfnGradients g = d.g;
      g.dw_down = dwd.data();
      g.ld_dw_down = ld_arg;
      plan.backward(stream.get(), d.t, d.dy.data(), 0, f.tokens, state, g, 1e-3f);
      stream.synchronize();
      return Out{d.dx.download_vector<uint16_t>(f.x.size()), d.dwg.download_vector<uint16_t>(size_t(N * K)),
                 d.dwu.download_vector<uint16_t>(size_t(N * K)), dwd.download_vector<uint16_t>(elements)};
    };
    DeviceMemory dense(c, size_t((K + 1) * N) * 2), padded(c, size_t((K + 1) * (N + 24)) * 2);
    const Out ref = step(rows, d.dwd, size_t(N * K), 0);  // dWd^T [N, K]
    for (const int64_t ld : {N, N + 24}) {
      SCOPED_TRACE(ld);
      // [K, N] in rows of ld, and one more row of ld that nothing may write.
      const Out got = step(as_weight, ld == N ? dense : padded, size_t((K + 1) * ld), ld == N ? 0 : ld);
      EXPECT_EQ(got.dx, ref.dx) << "dx";  // (the same GEMMs on a split's dense neurons)
      EXPECT_EQ(got.dwg, ref.dwg) << "dWg";
      EXPECT_EQ(got.dwu, ref.dwu) << "dWu";
      size_t differ = 0, outside = 0, nonzero = 0;
      std::vector<float> hot_got, hot_ref;  // the split's dense columns
      for (int64_t k = 0; k <= K; ++k)
        for (int64_t j = 0; j < ld; ++j) {
          const uint16_t v = got.dwd[size_t(k * ld + j)];
          if (k == K || j >= N) {
            outside += v != 0xFFFF;
            continue;
          }
          const uint16_t r = ref.dwd[size_t(j * K + k)];
          if (j < split) {
            hot_got.push_back(bf16_to_float(v));
            hot_ref.push_back(bf16_to_float(r));
          } else {
            differ += v != r;
          }
          nonzero += (r & 0x7FFF) != 0;
        }
      EXPECT_EQ(differ, 0u) << "dWd as the weight is not dWd^T transposed";
      if (split) {
        EXPECT_LT(relative_error(hot_got, hot_ref), 1e-2) << "the dense neurons' dWd columns";
      }
      EXPECT_EQ(outside, 0u) << "the transpose wrote past N in a row or past row K";
      EXPECT_GT(nonzero, size_t(N * K / 4)) << "dWd^T mostly zero: the comparison would prove little";
    }
  }
  // Bad dw_down arguments under the option, refused by name before any launch.
  const RandomFfn f = make_random_ffn(s, 64, 0.02, 23);
  GatedLayer d(c, f, random_bits(s.dtype, f.x.size(), -1.0f, 1.0f, 24));
  TrainingPlanOptions o;
  o.gradients_in_dtype = true;
  o.dw_down_as_weight = true;
  FfnTrainingPlan plan = FfnTrainingPlan::create(c, s, f.tokens, o);
  FfnTrainingState state = plan.make_state();
  StreamHandle stream(c);
  plan.forward(stream.get(), d.t, f.tokens, state, nullptr);
  const auto refused = [&](const FfnGradients& g, const void* dy, const std::string& needle) {
    try {
      plan.backward(stream.get(), d.t, dy, 0, f.tokens, state, g, 0.1f);
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::InvalidArgument) << e.what();
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
      return;
    }
    ADD_FAILURE() << "not refused: " << needle;
  };
  FfnGradients short_rows = d.g;
  short_rows.ld_dw_down = K;  // rows of d_ff now: K < N
  refused(short_rows, d.dy.data(), "g.ld_dw_down");
  FfnGradients on_gate = d.g;
  on_gate.dw_down = d.dwg.data();
  refused(on_gate, d.dy.data(), "g.dw_gate");
  FfnGradients on_x = d.g;
  on_x.dw_down = d.x.data();
  refused(on_x, d.dy.data(), "t.x");
  refused(d.g, d.dwd.data(), "dy");  // dy over dw_down
  plan.backward(stream.get(), d.t, d.dy.data(), 0, f.tokens, state, d.g, 0.1f);  // still works
  stream.synchronize();
}

// Two layers (other weights, one spec) sharing one plan, as twell.torch's layers do: forwards and
// backwards interleaved in every order give each layer's own step's bits. The plan's Wd^T buffer then holds
// another layer's transpose, or this state's (a backward right after its forward reads it without a new
// transpose, training_plan.h), or dWd^T (dw_down_as_weight): a backward that read the wrong one would differ.
TEST(GpuTrainingPlan, LayersSharingThePlanInAnyOrder) {
  REQUIRE_GPU();
  Context& c = plan_context();
  const FfnSpec s = make_spec(512, 1408, true, Activation::ReLU, 0.0f, DType::BF16, WeightLayout::OutIn);
  const RandomFfn fa = make_random_ffn(s, 300, 0.05, 31), fb = make_random_ffn(s, 300, 0.05, 32);
  GatedLayer a(c, fa, random_bits(s.dtype, fa.x.size(), -1.0f, 1.0f, 33)), b(c, fb, random_bits(s.dtype, fb.x.size(), -1.0f, 1.0f, 34));
  StreamHandle stream(c);
  using Grads = std::vector<std::vector<uint8_t>>;
  const auto download = [&](GatedLayer& l) {
    stream.synchronize();
    return Grads{l.dx.download_vector<uint8_t>(l.dx.bytes()), l.dwg.download_vector<uint8_t>(l.dwg.bytes()),
                 l.dwu.download_vector<uint8_t>(l.dwu.bytes()), l.dwd.download_vector<uint8_t>(l.dwd.bytes())};
  };
  const auto poison = [](GatedLayer& l) {
    for (DeviceMemory* m : {&l.dx, &l.dwg, &l.dwu, &l.dwd}) m->fill(0xFF);
  };
  for (const bool as_weight : {false, true}) {
    SCOPED_TRACE(as_weight ? "dw_down_as_weight" : "dWd^T");
    TrainingPlanOptions o;
    o.gradients_in_dtype = true;
    o.dw_down_as_weight = as_weight;
    // Each layer alone on its own plan: the expected bits.
    const auto alone = [&](GatedLayer& l, const RandomFfn& f) {
      FfnTrainingPlan own = FfnTrainingPlan::create(c, s, f.tokens, o);
      FfnTrainingState st = own.make_state();
      poison(l);
      own.forward(stream.get(), l.t, f.tokens, st, nullptr);
      own.backward(stream.get(), l.t, l.dy.data(), 0, f.tokens, st, l.g, 1e-3f);
      return download(l);
    };
    const Grads ref_a = alone(a, fa), ref_b = alone(b, fb);
    ASSERT_NE(ref_a[3], ref_b[3]) << "the two layers' dWd should differ";
    FfnTrainingPlan shared = FfnTrainingPlan::create(c, s, fa.tokens, o);
    FfnTrainingState sa = shared.make_state(), sb = shared.make_state();
    // Orders: A's backward after B's forward (B's Wd^T in the buffer), after B's backward (B's dWd^T or Wd^T),
    // then B's after A's backward (A's transpose carries another state's number); and each right after its forward.
    // "FaBaBa": a second backward of one forward after dWd^T took the buffer (dw_down_as_weight).
    for (const char* order : {"FaFbBbBa", "FaFbBaBb", "FaBaFbBb", "FaBaBa"}) {
      SCOPED_TRACE(order);
      poison(a);
      poison(b);
      Grads got_a, got_b;
      for (const char* op = order; *op != '\0'; op += 2) {
        GatedLayer& l = op[1] == 'a' ? a : b;
        FfnTrainingState& st = op[1] == 'a' ? sa : sb;
        const int64_t tokens = op[1] == 'a' ? fa.tokens : fb.tokens;
        if (op[0] == 'F') {
          shared.forward(stream.get(), l.t, tokens, st, nullptr);
        } else {
          shared.backward(stream.get(), l.t, l.dy.data(), 0, tokens, st, l.g, 1e-3f);
          (op[1] == 'a' ? got_a : got_b) = download(l);
        }
      }
      EXPECT_TRUE(got_a == ref_a) << "layer A's gradients differ from its own step's";
      if (std::string(order).find('b') != std::string::npos) {
        EXPECT_TRUE(got_b == ref_b) << "layer B's gradients differ from its own step's";
      }
    }
    // The reuse is taken: Wd overwritten after the forward (against the contract) leaves the backward on the
    // forward's transpose, so A's own gradients come back.
    poison(a);
    shared.forward(stream.get(), a.t, fa.tokens, sa, nullptr);
    stream.synchronize();  // (upload() does not wait for the stream's transpose of the old Wd)
    a.wd.upload(fb.w_down);
    shared.backward(stream.get(), a.t, a.dy.data(), 0, fa.tokens, sa, a.g, 1e-3f);
    EXPECT_TRUE(download(a) == ref_a) << "the backward right after its forward transposed Wd again";
    // A gate-only forward of the state in between (no consumer, no transpose) gets a new number: the backward
    // transposes the Wd it is given (here B's, in A's buffer): the step of layer A with B's Wd.
    a.wd.upload(fa.w_down);
    shared.forward(stream.get(), a.t, fa.tokens, sa, nullptr);  // A's transpose, numbered for this forward
    stream.synchronize();
    a.wd.upload(fb.w_down);
    FfnTensors gate_only = a.t;
    gate_only.y = nullptr;
    shared.forward(stream.get(), gate_only, fa.tokens, sa, nullptr);
    poison(a);
    shared.backward(stream.get(), a.t, a.dy.data(), 0, fa.tokens, sa, a.g, 1e-3f);
    const Grads got_mixed = download(a);
    const Grads ref_mixed = alone(a, fa);  // a.wd holds B's Wd
    EXPECT_TRUE(got_mixed == ref_mixed) << "after a gate-only forward the backward read the earlier forward's Wd^T";
    EXPECT_FALSE(got_mixed == ref_a) << "A's step with B's Wd should differ from A's own";
    a.wd.upload(fa.w_down);
  }
}

// The backward enqueues its kernels and returns (training_plan.h: its one host wait is the forward's
// overflow count): called while the stream is held by a host function (time_on_stream's hold, released
// when the call returns, or after 200 ms), it returns at once; a backward that waited for its own kernels
// would wait out the hold. (Each call once loaded its kernels' module and unloaded it on return, which
// waits for the kernels: bench/README.md v51.) The forward likewise.
TEST(GpuTrainingPlan, ForwardAndBackwardDoNotWaitForTheirKernels) {
  REQUIRE_GPU();
  Context& c = plan_context();
  const FfnSpec s = make_spec(512, 1408, true, Activation::ReLU, 0.0f, DType::BF16, WeightLayout::OutIn);
  const RandomFfn f = make_random_ffn(s, 1000, 0.02, 11);
  FfnTrainingPlan plan = FfnTrainingPlan::create(c, s, f.tokens);
  FfnTrainingState state = plan.make_state();
  StreamHandle stream(c);
  GatedLayer d(c, f, random_bits(s.dtype, f.x.size(), -1.0f, 1.0f, 12));
  DeviceMemory row_l1(c, f.tokens * 4);
  const FfnTensors& t = d.t;
  auto forward = [&] { plan.forward(stream.get(), t, f.tokens, state, static_cast<float*>(row_l1.data())); };
  auto backward = [&] { plan.backward(stream.get(), t, d.dy.data(), 0, f.tokens, state, d.g, 1e-3f); };
  forward();  // sizes the state and the backward's scratch (growth may wait, once)
  backward();
  stream.synchronize();
  const auto host_ms = [&](const std::function<void()>& call) {
    double ms = 0;
    time_on_stream(stream.get(), [&] {
      const auto t0 = std::chrono::steady_clock::now();
      call();
      ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    }, 0, 1);
    return ms;
  };
  for (int step = 0; step < 3; ++step) {
    EXPECT_LT(host_ms(forward), 150.0) << "step " << step;
    stream.synchronize();  // the backward's one wait (the forward's overflow count) is then over
    EXPECT_LT(host_ms(backward), 150.0) << "step " << step;
    stream.synchronize();
  }
}

// Bad arguments are refused by name, and the plan keeps working.
TEST(GpuTrainingPlan, RefusesBadArguments) {
  REQUIRE_GPU();
  const FfnSpec s = make_spec(256, 1024, true, Activation::ReLU, 0.0f, DType::BF16, WeightLayout::OutIn);
  const RandomFfn f = make_random_ffn(s, 64, 0.02, 11);
  const std::vector<uint16_t> dy = random_bits(s.dtype, static_cast<size_t>(f.tokens * s.d_model), -1.0f, 1.0f, 12);
  FfnTrainingPlan plan = FfnTrainingPlan::create(plan_context(), s, f.tokens);
  FfnTrainingPlan other = FfnTrainingPlan::create(plan_context(), s, f.tokens);
  FfnTrainingState state = plan.make_state(), foreign = other.make_state();
  StreamHandle stream(plan_context());
  GatedLayer d(plan_context(), f, dy);
  const FfnTensors& t = d.t;
  const FfnGradients& g = d.g;
  DeviceMemory &x = d.x, &wg = d.wg, &dx = d.dx, &dwg = d.dwg, &dyd = d.dy;
  auto refused = [](const std::function<void()>& fn, const std::string& needle) {
    try {
      fn();
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::InvalidArgument) << e.what();
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
      return;
    }
    ADD_FAILURE() << "not refused: " << needle;
  };
  refused([&] { plan.backward(stream.get(), t, dyd.data(), 0, f.tokens, state, g, 0.1f); }, "state");
  refused([&] { plan.forward(stream.get(), t, f.tokens, foreign); }, "state");
  refused([&] { plan.forward(stream.get(), t, f.tokens + 1, state); }, "tokens");
  refused([&] { plan.forward(stream.get(), t, f.tokens, state, reinterpret_cast<float*>(2)); }, "row_l1");
  plan.forward(stream.get(), t, f.tokens, state);
  refused([&] { plan.backward(stream.get(), t, dyd.data(), 0, f.tokens - 1, state, g, 0.1f); }, "tokens");
  refused([&] { plan.backward(stream.get(), t, dyd.data(), 0, f.tokens, state, g, -1.0f); }, "lambda");
  FfnGradients overlapping = g;
  overlapping.dx = x.data();
  refused([&] { plan.backward(stream.get(), t, dyd.data(), 0, f.tokens, state, overlapping, 0.1f); }, "overlap");
  FfnGradients no_up = g;
  no_up.dw_up = nullptr;
  refused([&] { plan.backward(stream.get(), t, dyd.data(), 0, f.tokens, state, no_up, 0.1f); }, "dw_up");
  // dx over a weight it reads, or a weight gradient written after it: refused before any launch.
  FfnGradients on_weight = g;
  on_weight.dx = wg.data();
  refused([&] { plan.backward(stream.get(), t, dyd.data(), 0, f.tokens, state, on_weight, 0.1f); }, "t.w_gate");
  FfnGradients on_grad = g;
  on_grad.dw_down = dx.data();
  refused([&] { plan.backward(stream.get(), t, dyd.data(), 0, f.tokens, state, on_grad, 0.1f); }, "g.dw_down");
  // A misaligned weight gradient is refused before dx is written (dx keeps its poison).
  dx.fill(0xFF);
  FfnGradients misaligned = g;
  misaligned.dw_gate = static_cast<char*>(dwg.data()) + 2;
  refused([&] { plan.backward(stream.get(), t, dyd.data(), 0, f.tokens, state, misaligned, 0.1f); }, "g.dw_gate");
  stream.synchronize();
  const std::vector<uint16_t> untouched = dx.download_vector<uint16_t>(f.x.size());
  EXPECT_TRUE(std::all_of(untouched.begin(), untouched.end(), [](uint16_t v) { return v == 0xFFFF; }))
      << "dx written before a bad weight gradient was refused";
  // A state whose plan is gone is refused by the next plan, even one made at the same address.
  {
    FfnTrainingPlan gone = FfnTrainingPlan::create(plan_context(), s, f.tokens);
    FfnTrainingState orphan = gone.make_state();
    gone = FfnTrainingPlan();
    FfnTrainingPlan next = FfnTrainingPlan::create(plan_context(), s, f.tokens);
    refused([&] { next.forward(stream.get(), t, f.tokens, orphan); }, "state");
  }
  // Still works.
  plan.backward(stream.get(), t, dyd.data(), 0, f.tokens, state, g, 0.1f);
  stream.synchronize();
  FfnSpec block = s;
  block.consumer = ConsumerVariant::TokenBlock;
  refused([&] { FfnTrainingPlan::create(plan_context(), block, 64); }, "spec.consumer");
}
