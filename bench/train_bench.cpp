// twell's training kernels against the dense GEMMs they replace, in one process, at the paper's shape
// (d_model 2048, d_ff 5632, bf16); bench/README.md v37-v52:
//   BM_TrainRowBackward  the backward by token row (train_row_backward, in_out Wd) and the weight gradients
//                        (train_weight_grad) against cuBLAS's GEMMs of the same shapes;
//   BM_TrainingStep      a whole FfnTrainingPlan step (forward + backward, an nn.Linear Wd, lambda 1e-3,
//                        fp32 dW; counters forward_ms, backward_ms) against nine cuBLAS GEMMs; path
//                        twell_step_recompute_u without u kept from the forward (keep_u false, v48);
//                        twell_dense_step: the plan's dense path (TrainingDispatch::Dense, v58), twell_auto_step:
//                        TrainingDispatch::Auto (counters auto_sparse_ms, auto_dense_ms: its timing).
//   build/bin/train_bench --benchmark_filter=BM_TrainingStep      (or BM_TrainRowBackward)
// Layouts are the heuristic ones (PlanOptions::Tuning::Ignore): a tuning database does not move them.
//
// What train_row_backward computes (dh on the support, du, dg, dx = du Wu + dg Wg) is, densely, three
// GEMMs of M x d_model x d_ff (dh = dy Wd, then dg Wg and du Wu) and elementwise work. The baseline is
// twell's dense FFN forward with cuBLAS (DenseFfn, DenseKernels::CuBlas: the same three GEMM shapes and
// one elementwise kernel), what PyTorch's autograd runs for that part of the backward. The weight
// gradients (three more GEMMs densely, dWg = dg^T x, dWu = du^T x, dWd = dy^T h: the same FLOPs, so the
// same baseline) are twell's train_weight_grad (path twell_weight_grad), timed after one row backward.
//
// GPU time (time_on_stream: the stream held while the calls are queued), one warm-up, median of the
// timed calls; inputs from make_random_ffn (uniform activity at the density), the TwELL matrix from the
// plan's own gate kernel. BM_TrainingStep's twell paths also report the host's microseconds in forward()
// and backward() called on an idle GPU (forward_host_us, backward_host_us).
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>

#include <fmt/format.h>

#include "test_data.h"
#include "twell/context.h"
#include "twell/dense.h"
#include "twell/device_memory.h"
#include "twell/plan.h"
#include "twell/training.h"
#include "twell/training_plan.h"

using namespace twell;
using namespace twell::testing;

namespace {

constexpr int64_t kDModel = 2048, kDff = 5632;

Context& context() {
  static Context ctx;
  return ctx;
}

FfnSpec paper_spec() {
  FfnSpec s;
  s.d_model = kDModel;
  s.d_ff = kDff;
  s.down_layout = WeightLayout::InOut;  // train_row_backward reads Wd^T rows
  return s;
}

// args: M, density in permille (5 = 0.5%); path 0 = the row backward, 1 = the dense cuBLAS baseline,
// 2 = the weight gradients.
void BM_TrainRowBackward(benchmark::State& state, int path) {
  Context& ctx = context();
  if (!ctx.has_gpu()) {
    state.SkipWithError(("no GPU: " + ctx.no_gpu_reason()).c_str());
    return;
  }
  const int64_t m = state.range(0);
  const double density = static_cast<double>(state.range(1)) / 1000.0;
  const FfnSpec spec = paper_spec();
  const RandomFfn f = make_random_ffn(spec, m, density, 5);
  StreamHandle stream(ctx);
  DeviceMemory x(ctx, f.x.size() * 2), wg(ctx, f.w_gate.size() * 2), wu(ctx, f.w_up.size() * 2),
      wd(ctx, f.w_down.size() * 2), dy(ctx, f.x.size() * 2), dx(ctx, f.x.size() * 2);
  x.upload(f.x);
  wg.upload(f.w_gate);
  wu.upload(f.w_up);
  wd.upload(f.w_down);
  dy.upload(random_bits(spec.dtype, f.x.size(), -1.0f, 1.0f, 77));
  std::vector<double> ms;
  if (path == 1) {  // the dense baseline of either twell kernel: three GEMMs of the same shapes
    DenseFfn dense(ctx, spec, m, DenseKernels::CuBlas);
    FfnTensors t;
    t.x = x.data();
    t.w_gate = wg.data();
    t.w_up = wu.data();
    t.w_down = wd.data();
    t.y = dx.data();
    ms = time_on_stream(stream.get(), [&] { dense.run(stream.get(), t, m); }, 1, 7);
    state.SetLabel("dense cuBLAS: 3 GEMMs M x 2048 x 5632 + elementwise");
  } else {
    PlanOptions o;
    o.dispatch = Dispatch::Sparse;
    o.tuning = PlanOptions::Tuning::Ignore;
    FfnPlan plan = ctx.plan(spec, m, o);
    FfnTensors t;
    t.x = x.data();
    t.w_gate = wg.data();
    plan.run_gate(stream.get(), t, m);
    const TwellMatrix h = plan.download_twell(stream.get());
    DeviceMemory words(ctx, h.words.size() * 4), backup(ctx, std::max<size_t>(2, h.backup.size() * 2));
    words.upload(h.words);
    if (!h.backup.empty()) backup.upload(h.backup);
    const uint32_t grad_capacity = std::max(h.overflow_count, h.backup_capacity);
    DeviceMemory entry_grad(ctx, entry_grad_floats(h.layout, kDff, m) * 4),
        backup_grad(ctx, std::max<int64_t>(8, backup_grad_floats(h.layout, grad_capacity) * 4)), counter(ctx, 4);
    TrainRowBackwardTensors b;
    b.x = x.data();
    b.w_gate = wg.data();
    b.w_up = wu.data();
    b.w_down = wd.data();
    b.twell = static_cast<const uint32_t*>(words.data());
    b.backup = backup.data();
    b.dy = dy.data();
    b.dx = dx.data();
    b.entry_grad = static_cast<float*>(entry_grad.data());
    b.backup_grad = static_cast<float*>(backup_grad.data());
    b.grad_overflow_count = static_cast<uint32_t*>(counter.data());
    if (path == 0) {
      ms = time_on_stream(stream.get(), [&] { train_row_backward(ctx, stream.get(), spec, b, m, h.backup_capacity, grad_capacity, 2e-5f); }, 1, 7);
    } else {  // path 2: the weight gradients from the row backward's per-entry outputs
      train_row_backward(ctx, stream.get(), spec, b, m, h.backup_capacity, grad_capacity, 2e-5f);
      DeviceMemory dwg(ctx, size_t(kDff) * kDModel * 4), dwu(ctx, size_t(kDff) * kDModel * 4), dwd(ctx, size_t(kDff) * kDModel * 4);
      TrainWeightGradTensors w;
      w.x = x.data();
      w.dy = dy.data();
      w.twell = b.twell;
      w.entry_grad = b.entry_grad;
      w.backup_grad = b.backup_grad;
      w.dw_gate = dwg.data();
      w.dw_up = dwu.data();
      w.dw_down = dwd.data();
      DeviceMemory workspace(ctx, train_weight_grad_workspace_bytes(spec)),
          list(ctx, train_weight_grad_list_bytes(spec, m, grad_capacity));
      w.workspace = workspace.data();
      w.entry_list = list.data();
      ms = time_on_stream(stream.get(), [&] { train_weight_grad(ctx, stream.get(), spec, w, m, grad_capacity); }, 1, 7);
    }
    uint64_t nnz = 0;
    const int64_t wpr = h.layout.words_per_row(kDff);
    for (int64_t r = 0; r < m; ++r)
      for (int64_t tile = 0; tile < h.layout.tiles(kDff); ++tile) nnz += h.words[r * wpr + tile * (h.layout.slots + 1)];
    state.SetLabel(fmt::format("twell {}: measured density {:.2f}%, {} overflowing tile-rows",
                               path == 0 ? "row backward" : "weight gradients (dWg, dWu, dWd^T, fp32)",
                               100.0 * double(nnz) / double(m * kDff), h.overflow_count));
  }
  std::sort(ms.begin(), ms.end());
  for (auto _ : state) state.SetIterationTime(ms[ms.size() / 2] / 1e3);
}

// A whole training step of one layer (args as above), path 0: FfnTrainingPlan::forward then backward
// (twell/training_plan.h; an nn.Linear Wd, transposed on the stream in the backward, as a PyTorch user
// has it; lambda 1e-3, fp32 weight gradients); path 2: the same without u kept from the forward
// (TrainingPlanOptions::keep_u false: the backward recomputes it, v48); path 1: the dense baseline, nine GEMMs of M x 2048 x
// 5632 (the forward's three, the backward's six) as three DenseFfn (cuBLAS) runs, elementwise work
// included there. The label gives the step's device memory: the state and the backward's scratch.
void BM_TrainingStep(benchmark::State& state, int path) {
  Context& ctx = context();
  if (!ctx.has_gpu()) {
    state.SkipWithError(("no GPU: " + ctx.no_gpu_reason()).c_str());
    return;
  }
  const int64_t m = state.range(0);
  const double density = static_cast<double>(state.range(1)) / 1000.0;
  FfnSpec spec = paper_spec();
  spec.down_layout = WeightLayout::OutIn;
  const RandomFfn f = make_random_ffn(spec, m, density, 5);
  StreamHandle stream(ctx);
  const size_t w_elems = f.w_gate.size();
  DeviceMemory x(ctx, f.x.size() * 2), wg(ctx, w_elems * 2), wu(ctx, w_elems * 2), wd(ctx, w_elems * 2),
      dy(ctx, f.x.size() * 2), dx(ctx, f.x.size() * 2), y(ctx, f.x.size() * 2);
  x.upload(f.x);
  wg.upload(f.w_gate);
  wu.upload(f.w_up);
  wd.upload(f.w_down);
  dy.upload(random_bits(spec.dtype, f.x.size(), -1.0f, 1.0f, 77));
  FfnTensors t;
  t.x = x.data();
  t.w_gate = wg.data();
  t.w_up = wu.data();
  t.w_down = wd.data();
  t.y = y.data();
  std::vector<double> ms;
  if (path == 1) {
    DenseFfn dense(ctx, spec, m, DenseKernels::CuBlas);
    ms = time_on_stream(stream.get(), [&] { for (int i = 0; i < 3; ++i) dense.run(stream.get(), t, m); }, 1, 5);
    state.SetLabel("dense cuBLAS: 9 GEMMs M x 2048 x 5632 + elementwise");
  } else {
    TrainingPlanOptions options;
    options.tuning = PlanOptions::Tuning::Ignore;
    options.keep_u = path != 2;
    options.dispatch = path == 3 ? TrainingDispatch::Dense : path == 4 ? TrainingDispatch::Auto : TrainingDispatch::Sparse;
    FfnTrainingPlan plan = FfnTrainingPlan::create(ctx, spec, m, options);
    FfnTrainingState st = plan.make_state();
    DeviceMemory dwg(ctx, w_elems * 4), dwu(ctx, w_elems * 4), dwd(ctx, w_elems * 4), row_l1(ctx, size_t(m) * 4);
    FfnGradients g;
    g.dx = dx.data();
    g.dw_gate = dwg.data();
    g.dw_up = dwu.data();
    g.dw_down = dwd.data();
    auto forward = [&] { plan.forward(stream.get(), t, m, st, static_cast<float*>(row_l1.data())); };
    auto backward = [&] { plan.backward(stream.get(), t, dy.data(), 0, m, st, g, 1e-3f); };
    forward();  // sizes the state and the scratch, grows the backup if the first step overflowed it
    backward();
    stream.synchronize();
    if (st.path() == TrainingPath::Dense) {
      // The dense path's backward consumes its forward's state (and waits for nothing on the host): whole
      // steps.
      const std::vector<double> s_ms = time_on_stream(stream.get(), [&] { forward(); backward(); }, 1, 11);
      ms = {s_ms[s_ms.size() / 2]};
    } else {
      // Timed apart: the backward waits on the host for its forward's overflow count, which time_on_stream's
      // held stream would delay (the forward's event is complete here). A step is the sum of the medians.
      const std::vector<double> f_ms = time_on_stream(stream.get(), forward, 1, 11);
      stream.synchronize();
      const std::vector<double> b_ms = time_on_stream(stream.get(), backward, 1, 11);
      ms = {f_ms[f_ms.size() / 2] + b_ms[b_ms.size() / 2]};
      state.counters["forward_ms"] = f_ms[f_ms.size() / 2];
      state.counters["backward_ms"] = b_ms[b_ms.size() / 2];
    }
    for (const TrainingDecision& d : plan.decisions()) {
      state.counters["auto_sparse_ms"] = d.sparse_ms;
      state.counters["auto_dense_ms"] = d.dense_ms;
    }
    // The host's time in each call with the GPU idle before it (launches are asynchronous: the calls' checks,
    // driver calls and launches), the latency before a step's first kernel (bench/README.md v56-v57).
    std::vector<double> f_host, b_host;
    for (int i = 0; i < 11; ++i) {
      stream.synchronize();
      const auto t0 = std::chrono::steady_clock::now();
      forward();
      const auto t1 = std::chrono::steady_clock::now();
      stream.synchronize();
      const auto t2 = std::chrono::steady_clock::now();
      backward();
      const auto t3 = std::chrono::steady_clock::now();
      f_host.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
      b_host.push_back(std::chrono::duration<double, std::micro>(t3 - t2).count());
    }
    stream.synchronize();
    std::sort(f_host.begin(), f_host.end());
    std::sort(b_host.begin(), b_host.end());
    state.counters["forward_host_us"] = f_host[f_host.size() / 2];
    state.counters["backward_host_us"] = b_host[b_host.size() / 2];
    std::sort(ms.begin(), ms.end());
    state.SetLabel(fmt::format("twell step ({} path): state {:.1f} MB, backward scratch {:.1f} MB without overflowing tile-rows",
                               st.path() == TrainingPath::Dense ? "dense" : "sparse", st.device_bytes() / 1e6,
                               plan.backward_scratch_bytes(m, 0) / 1e6));
  }
  const double median = ms[ms.size() / 2];
  for (auto _ : state) state.SetIterationTime(median / 1e3);
  state.counters["ms"] = median;
}

void Args(benchmark::internal::Benchmark* b) {
  for (int64_t m : {16384, 65536})
    for (int permille : {5, 10, 20, 50}) b->Args({m, permille});
  b->ArgNames({"M", "density_permille"})->UseManualTime()->Unit(benchmark::kMillisecond)->Iterations(1);
}

}  // namespace

BENCHMARK_CAPTURE(BM_TrainRowBackward, twell, 0)->Apply(Args);
BENCHMARK_CAPTURE(BM_TrainRowBackward, dense_cublas, 1)->Apply(Args);
BENCHMARK_CAPTURE(BM_TrainRowBackward, twell_weight_grad, 2)->Apply(Args);
BENCHMARK_CAPTURE(BM_TrainingStep, twell_step, 0)->Apply(Args);
BENCHMARK_CAPTURE(BM_TrainingStep, dense_step, 1)->Apply(Args);
BENCHMARK_CAPTURE(BM_TrainingStep, twell_step_recompute_u, 2)->Apply(Args);
BENCHMARK_CAPTURE(BM_TrainingStep, twell_dense_step, 3)->Apply(Args);
BENCHMARK_CAPTURE(BM_TrainingStep, twell_auto_step, 4)->Apply(Args);
BENCHMARK_MAIN();
