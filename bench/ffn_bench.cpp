// twell vs cuBLASLt dense, the gated FFN at the paper's shape (d_model 2048, d_ff 5632, bf16), in one
// process: CUDA-event time per call (manual time; Google Benchmark reports the median over
// repetitions), FLOP/s of the useful work, and the ratio to dense as a counter.
// D2T alone against the same cuBLASLt GEMM. The consumer alone (gated up + down over a TwELL matrix),
// on uniform densities and on the real activation patterns of the paper model's 4 layers
// (../shared/data/paper_patterns.safetensors), with the bytes of Wu/Wd rows it must stream. Also the
// JIT: cold NVRTC compile and warm cache hit of the generated kernels (no GPU needed).
//   ./build/bin/ffn_bench --benchmark_repetitions=5 --benchmark_report_aggregates_only=true
#include <benchmark/benchmark.h>

#include <cstring>
#include <map>
#include <tuple>
#include <memory>
#include <optional>

#include "test_data.h"
#include "twell/compiler/Generate.h"
#include "twell/context.h"
#include "twell/dense.h"
#include "twell/device_memory.h"
#include "twell/format.h"
#include "twell/half.h"
#include "twell/kernels/constraints.h"
#include "twell/layer_data.h"
#include "twell/neuron_order.h"
#include "twell/safetensors.h"

using namespace twell;

namespace {

constexpr int64_t kDModel = 2048, kDff = 5632;

Context& context() {
  static Context ctx;
  return ctx;
}

// One problem per (tokens, density): host data made once, uploaded once.
struct Problem {
  testing::RandomFfn host;
  std::unique_ptr<DeviceMemory> x, wg, wu, wd, y;
  double nnz_per_row = -1;  // measured on the first TwELL run (sized_plan): the density actually made
  FfnTensors tensors() const {
    return {x->data(), wg->data(), host.spec.gated ? wu->data() : nullptr, wd->data(), y->data()};
  }
};

// `gated` = false: a non-gated layer, y = act(x Wg^T) Wd^T (no Wu).
Problem& problem(int64_t tokens, int density_permille, bool gated = true) {
  static std::map<std::tuple<int64_t, int, bool>, std::unique_ptr<Problem>> cache;
  auto& p = cache[{tokens, density_permille, gated}];
  if (!p) {
    p = std::make_unique<Problem>();
    FfnSpec s;
    s.d_model = kDModel;
    s.d_ff = kDff;
    s.gated = gated;
    // Slots: the paper's 31 (compression 8) up to 5%; at 10% (25.6 entries per 256-wide tile-row on
    // average) most tile-rows would overflow 31, so 63.
    s.slots = density_permille >= 100 ? 63 : 31;
    p->host = testing::make_random_ffn(s, tokens, density_permille / 1000.0, 42);
    Context& c = context();
    auto up = [&](const std::vector<uint16_t>& v) {
      auto m = std::make_unique<DeviceMemory>(c, v.size() * 2);
      m->upload(v);
      return m;
    };
    p->x = up(p->host.x);
    p->wg = up(p->host.w_gate);
    if (gated) p->wu = up(p->host.w_up);
    p->wd = up(p->host.w_down);
    p->y = std::make_unique<DeviceMemory>(c, tokens * kDModel * 2);
  }
  return *p;
}

// Marks the benchmark skipped, with the reason, where no GPU is present.
bool gpu_or_skip(benchmark::State& state) {
  if (context().has_gpu()) return true;
  state.SkipWithError(("no GPU: " + context().no_gpu_reason()).c_str());
  return false;
}

// A TwELL-only plan for the problem, its backup sized by one untimed run (as a served model's plan
// would be after its first batch), so timed runs never recompute overflowing tile-rows.
// `consumer`: the consumer variant (FfnSpec::consumer); unset, the plan's first run times both.
// The first time, it also counts the nonzeros that run made (each tile-row's header holds its true
// count, overflowing or not).
FfnPlan sized_plan(Problem& p, int64_t tokens, Stream stream, std::optional<ConsumerVariant> consumer = std::nullopt,
                   std::optional<int> gate_cluster = std::nullopt) {
  PlanOptions twell_path;
  twell_path.dispatch = Dispatch::Sparse;
  FfnSpec spec = p.host.spec;
  spec.consumer = consumer;
  spec.gate_cluster_m = gate_cluster;
  FfnPlan plan = context().plan(spec, tokens, twell_path);
  plan.run(stream, p.tensors(), tokens);
  plan.last_overflow(stream);
  if (p.nnz_per_row < 0) {
    const TwellMatrix h = plan.download_twell(stream);
    const int64_t tiles = h.layout.tiles(h.d_ff), stride = h.layout.slots + 1;
    int64_t nnz = 0;
    for (int64_t t = 0; t < h.rows * tiles; ++t) nnz += h.words[t * stride];
    p.nnz_per_row = static_cast<double>(nnz) / tokens;
  }
  return plan;
}

// Useful FLOPs: the gate GEMM (dense) plus up and down for the active neurons.
double useful_flops(int64_t tokens, double density) { return 2.0 * tokens * kDModel * kDff * (1.0 + 2.0 * density); }

// Times one path on the (M, density) problem of the state's arguments: the TwELL plan (pinned to the
// TwELL kernels, not the dispatcher's choice) or cuBLASLt, the whole FFN or the gate GEMM alone;
// `tflop` is the work counted per call. `automatic`: instead a Dispatch::Auto plan (the runtime's
// default), after the first run() that times its paths (each consumer variant and dense) and keeps
// the fastest. `gate_cluster`: FfnSpec::gate_cluster_m of the TwELL plan (unset: the generator's).
void time_path(benchmark::State& state, bool sparse, bool gate_only, double tflop, const char* counter,
               std::optional<ConsumerVariant> consumer = std::nullopt, bool gated = true, bool automatic = false,
               std::optional<int> gate_cluster = std::nullopt, DenseKernels dense_kernels = DenseKernels::CuBlasLt) {
  if (!gpu_or_skip(state)) return;
  Context& ctx = context();
  const int64_t tokens = state.range(0);
  Problem& p = problem(tokens, static_cast<int>(state.range(1)), gated);
  StreamHandle stream(ctx);
  std::unique_ptr<FfnPlan> plan;
  std::unique_ptr<DenseFfn> dense;
  if (sparse) plan = std::make_unique<FfnPlan>(sized_plan(p, tokens, stream.get(), consumer, gate_cluster));
  if (automatic) {
    plan = std::make_unique<FfnPlan>(ctx.plan(p.host.spec, tokens));  // Dispatch::Auto
    plan->run(stream.get(), p.tensors(), tokens);                      // calibrates this token bucket
    state.SetLabel("picked " + plan->last_path());
  }
  if (!sparse) dense = std::make_unique<DenseFfn>(ctx, p.host.spec, tokens, dense_kernels);
  auto call = [&] {
    if (sparse && gate_only) plan->run_gate(stream.get(), p.tensors(), tokens);
    else if (sparse) plan->run(stream.get(), p.tensors(), tokens);
    else if (gate_only) dense->run_gate(stream.get(), p.tensors(), tokens);
    else dense->run(stream.get(), p.tensors(), tokens);
  };
  for (auto _ : state) {
    const auto ms = time_on_stream(stream.get(), call, 2, 5);
    state.SetIterationTime(ms[ms.size() / 2] / 1e3);
  }
  state.counters[counter] = benchmark::Counter(tflop, benchmark::Counter::kIsIterationInvariantRate);
  if (sparse) state.counters["nnz/row"] = p.nnz_per_row;
}

// sparse: the TwELL plan with the consumer `variant`; variant -1: the Dispatch::Auto plan (its choice of
// row gather, token block or dense). Dense: `variant` is the DenseKernels (dense_cublas: cublasGemmEx as
// PyTorch's F.linear calls it, the baseline a PyTorch user compares with; bench/README.md v30;
// dense_cublaslt_tuned: cuBLASLt's first 8 algorithms timed per GEMM, v31).
void BM_GatedFfn(benchmark::State& state, bool sparse, int variant) {
  const auto consumer = sparse && variant >= 0 ? std::optional(static_cast<ConsumerVariant>(variant)) : std::nullopt;
  time_path(state, sparse, false, useful_flops(state.range(0), state.range(1) / 1000.0) / 1e12, "TFLOP/s(useful)", consumer,
            true, sparse && variant < 0, std::nullopt, sparse ? DenseKernels::CuBlasLt : static_cast<DenseKernels>(variant));
}

// The dense path with twell's fused gated-up kernel (DenseKernels::FusedGatedUp: g, u and h = act(g) * u
// in one wgmma kernel, then cuBLASLt's down GEMM), the path Dispatch::Auto and the dense neurons of a
// split plan take, beside cuBLASLt's three GEMMs + elementwise (BM_GatedFfn/dense_cublaslt).
void BM_DenseFused(benchmark::State& state) {
  if (!gpu_or_skip(state)) return;
  Context& ctx = context();
  const int64_t tokens = state.range(0);
  Problem& p = problem(tokens, static_cast<int>(state.range(1)));
  StreamHandle stream(ctx);
  DenseFfn dense(ctx, p.host.spec, tokens, DenseKernels::FusedGatedUp);
  if (!dense.fused()) {
    state.SkipWithError("the fused gated-up kernel does not apply here (sm_90a only)");
    return;
  }
  for (auto _ : state) {
    const auto ms = time_on_stream(stream.get(), [&] { dense.run(stream.get(), p.tensors(), tokens); }, 2, 5);
    state.SetIterationTime(ms[ms.size() / 2] / 1e3);
  }
  state.counters["TFLOP/s(dense)"] =
      benchmark::Counter(6.0 * tokens * kDModel * kDff / 1e12, benchmark::Counter::kIsIterationInvariantRate);
}

// The non-gated FFN (y = act(x Wg^T) Wd^T: twell.ffn) against cuBLASLt's two GEMMs. Useful FLOPs:
// the first GEMM plus the down projection of the active neurons.
void BM_NonGatedFfn(benchmark::State& state, bool sparse) {
  const double density = state.range(1) / 1000.0;
  time_path(state, sparse, false, 2.0 * state.range(0) * kDModel * kDff * (1.0 + density) / 1e12, "TFLOP/s(useful)",
            std::nullopt, /*gated=*/false);
}

// D2T alone (gate GEMM + activation + TwELL packing) against cuBLASLt's plain gate GEMM (bf16 out):
// PERFORMANCE.md's target is >= 90% of cuBLAS throughput at M = 131072. `cluster` 0: the generator's
// choice (clusters of 2 on sm_90a), else FfnSpec::gate_cluster_m.
void BM_Gate(benchmark::State& state, bool sparse, int cluster) {
  time_path(state, sparse, true, 2.0 * state.range(0) * kDModel * kDff / 1e12, "TFLOP/s", std::nullopt, true, false,
            cluster > 0 ? std::optional<int>(cluster) : std::nullopt);
}

void GateArgs(benchmark::internal::Benchmark* b) {
  for (int64_t m : {256, 16384, 131072}) b->Args({m, 5});
  b->ArgNames({"M", "density_permille"})->UseManualTime()->Unit(benchmark::kMillisecond)->Iterations(3);
}

// The consumer alone over the TwELL matrix the D2T kernel made from the problem (run_gate once, then
// run_consumer timed). Bytes: the Wu and Wd rows of every nonzero (2 * d_model * 2 bytes each).
// Third argument: the consumer variant (0 RowGather, 1 TokenBlock).
void BM_Consumer(benchmark::State& state) {
  if (!gpu_or_skip(state)) return;
  Context& ctx = context();
  const int64_t tokens = state.range(0);
  Problem& p = problem(tokens, static_cast<int>(state.range(1)));
  StreamHandle stream(ctx);
  FfnPlan plan = sized_plan(p, tokens, stream.get(), static_cast<ConsumerVariant>(state.range(2)));
  plan.run_gate(stream.get(), p.tensors(), tokens);
  const double nnz = tokens * p.nnz_per_row;
  for (auto _ : state) {
    const auto ms = time_on_stream(stream.get(), [&] { plan.run_consumer(stream.get(), p.tensors(), tokens); }, 2, 5);
    state.SetIterationTime(ms[ms.size() / 2] / 1e3);
  }
  state.counters["GB/s(Wu,Wd rows)"] = benchmark::Counter(nnz * 4.0 * kDModel, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["nnz/row"] = p.nnz_per_row;
}

void ConsumerArgs(benchmark::internal::Benchmark* b) {
  for (int variant : {0, 1})
    for (int64_t m : {256, 16384, 131072})
      for (int permille : {5, 10, 20, 50, 100}) b->Args({m, permille, variant});
  b->ArgNames({"M", "density_permille", "consumer"})->UseManualTime()->Unit(benchmark::kMillisecond)->Iterations(3);
}

// The real patterns of layer `layer` as dense activated rows [tokens, d_ff] (the 1477 rows repeated),
// and each neuron's activity over the first `calibration_rows` source rows. False (and the state
// skipped, saying why) when the file is missing or malformed.
bool real_pattern(benchmark::State& state, int layer, int64_t tokens, int64_t calibration_rows, std::vector<uint16_t>& dense,
                  std::vector<uint64_t>& activity, int64_t& nnz) {
  const auto file = testing::shared_data_dir() / "paper_patterns.safetensors";
  if (!std::filesystem::exists(file)) {
    state.SkipWithError(("missing " + file.string()).c_str());
    return false;
  }
  const SafeTensors st = SafeTensors::read(file);
  const std::string prefix = "layers." + std::to_string(layer) + ".";
  const TensorView row_ptr = st.at(prefix + "row_ptr"), col = st.at(prefix + "col"), val = st.at(prefix + "val");
  if (row_ptr.dtype != "I32" || col.dtype != "I16" || val.dtype != "BF16" || row_ptr.shape.size() != 1) {
    state.SkipWithError((prefix + "{row_ptr, col, val}: expected I32, I16, BF16 vectors").c_str());
    return false;
  }
  const int64_t rows = row_ptr.shape.at(0) - 1;
  std::vector<int32_t> ptr(rows + 1);
  std::memcpy(ptr.data(), row_ptr.data.data(), ptr.size() * 4);
  dense.assign(tokens * kDff, 0);
  activity.assign(kDff, 0);
  nnz = 0;
  for (int64_t r = 0; r < std::max(tokens, rows); ++r) {
    const int64_t src = r % rows;
    for (int32_t e = ptr[src]; e < ptr[src + 1]; ++e) {
      int16_t c;
      uint16_t v;
      std::memcpy(&c, col.data.data() + 2 * e, 2);
      std::memcpy(&v, val.data.data() + 2 * e, 2);
      if (c < 0 || c >= kDff) {
        state.SkipWithError((prefix + "col: an index outside 0.." + std::to_string(kDff - 1)).c_str());
        return false;
      }
      if (r < tokens) {
        dense[r * kDff + c] = v;
        ++nnz;
      }
      if (r < calibration_rows) ++activity[c];
    }
  }
  return true;
}

// The real patterns: relu(x Wg^T) of layer `layer` of the paper model (1477 held-out tokens, CSR),
// repeated to M rows, packed with the plan's layout (overflowing tile-rows in the backup), uploaded;
// the consumer alone over it with random x, Wu, Wd (the files hold no up/down weights). The gate GEMM
// it would follow costs what BM_Gate measures, whatever the pattern.
void BM_ConsumerRealPattern(benchmark::State& state) {
  if (!gpu_or_skip(state)) return;
  Context& ctx = context();
  const int layer = static_cast<int>(state.range(0));
  const int64_t tokens = state.range(1);
  std::vector<uint16_t> dense;
  std::vector<uint64_t> activity;
  int64_t nnz = 0;
  if (!real_pattern(state, layer, tokens, 0, dense, activity, nnz)) return;
  Problem& p = problem(tokens, 5);  // x, Wg, Wu, Wd of the uniform problem (Wg unused: no recompute)
  StreamHandle stream(ctx);
  PlanOptions twell_path;
  twell_path.dispatch = Dispatch::Sparse;
  FfnSpec spec = p.host.spec;
  spec.consumer = static_cast<ConsumerVariant>(state.range(2));
  FfnPlan plan = ctx.plan(spec, tokens, twell_path);
  const TwellMatrix h = pack_twell(plan.layout(), dense, tokens, kDff, UINT32_MAX);
  plan.upload_twell(stream.get(), h);
  for (auto _ : state) {
    const auto ms = time_on_stream(stream.get(), [&] { plan.run_consumer(stream.get(), p.tensors(), tokens); }, 2, 5);
    state.SetIterationTime(ms[ms.size() / 2] / 1e3);
  }
  state.counters["nnz/row"] = static_cast<double>(nnz) / tokens;
  state.counters["overflow tile-rows"] = h.overflow_count;
  state.counters["GB/s(Wu,Wd rows)"] = benchmark::Counter(nnz * 4.0 * kDModel, benchmark::Counter::kIsIterationInvariantRate);
}

void RealPatternArgs(benchmark::internal::Benchmark* b) {
  for (int variant : {0, 1})
    for (int layer = 0; layer < 4; ++layer) b->Args({layer, 16384, variant});
  b->ArgNames({"layer", "M", "consumer"})->UseManualTime()->Unit(benchmark::kMillisecond)->Iterations(3);
}

// The hot/cold split (PlanOptions::dense_neurons) on the real patterns of one paper layer, M = 16384:
// the neurons ordered by their activity over the first half of the 1477 held-out tokens (so the split
// is judged on tokens it was not chosen on, too), the split from the cost model (third argument -1)
// or given. Timed in one process, each a median: the D2T over the TwELL neurons (run_gate; its time
// does not depend on the pattern), the consumer over the real pattern of those neurons (uploaded),
// the dense neurons (y +=, the plan's DenseKernels::FusedGatedUp), and cuBLASLt's whole dense FFN.
// The layer's time is the sum of the three parts (these layers' x and Wg are not in the data, so the
// parts cannot run as one call on the real pattern); the counters show each.
void BM_RealLayerSplit(benchmark::State& state) {
  if (!gpu_or_skip(state)) return;
  Context& ctx = context();
  const int layer = static_cast<int>(state.range(0));
  const int64_t tokens = state.range(1);
  std::vector<uint16_t> dense;
  std::vector<uint64_t> activity;
  int64_t nnz = 0;
  if (!real_pattern(state, layer, tokens, 1477 / 2, dense, activity, nnz)) return;
  const std::vector<int64_t> order = hot_first_order(activity);
  const std::vector<uint64_t> sorted = in_order(activity, order);
  Problem& p = problem(tokens, 5);
  const int64_t k = state.range(2) >= 0 ? state.range(2) : choose_dense_neurons(p.host.spec, tokens, sorted, 1477 / 2);
  // The TwELL neurons' columns of the pattern, hot-first order.
  const int64_t cold = kDff - k;
  std::vector<uint16_t> pattern(tokens * cold);
  int64_t cold_nnz = 0;
  for (int64_t r = 0; r < tokens; ++r)
    for (int64_t i = 0; i < cold; ++i) {
      pattern[r * cold + i] = dense[r * kDff + order[k + i]];
      cold_nnz += pattern[r * cold + i] != 0;
    }
  StreamHandle stream(ctx);
  PlanOptions o;
  o.dispatch = Dispatch::Sparse;
  o.dense_neurons = k;
  FfnPlan plan = ctx.plan(p.host.spec, tokens, o);
  const TwellMatrix h = pack_twell(plan.layout(), pattern, tokens, cold, UINT32_MAX);
  std::unique_ptr<DenseFfn> hot;
  if (k > 0) {
    FfnSpec hs = p.host.spec;
    hs.d_ff = k;
    hot = std::make_unique<DenseFfn>(ctx, hs, tokens, DenseKernels::FusedGatedUp);  // as the plan's dense neurons
  }
  DenseFfn whole(ctx, p.host.spec, tokens);
  const FfnTensors t = p.tensors();
  FfnTensors hot_t = t;  // the first k neurons of the (random) weights, full row strides
  hot_t.ld_gate = hot_t.ld_up = kDModel;
  hot_t.ld_down = kDff;
  auto median = [](std::vector<double> v) { return v[v.size() / 2]; };
  double gate_ms = 0, consumer_ms = 0, hot_ms = 0, dense_ms = 0;
  for (auto _ : state) {
    gate_ms = median(time_on_stream(stream.get(), [&] { plan.run_gate(stream.get(), t, tokens); }, 2, 5));
    plan.upload_twell(stream.get(), h);
    consumer_ms = median(time_on_stream(stream.get(), [&] { plan.run_consumer(stream.get(), t, tokens); }, 2, 5));
    if (hot) hot_ms = median(time_on_stream(stream.get(), [&] { hot->run(stream.get(), hot_t, tokens, true); }, 2, 5));
    dense_ms = median(time_on_stream(stream.get(), [&] { whole.run(stream.get(), t, tokens); }, 2, 5));
    state.SetIterationTime((gate_ms + consumer_ms + hot_ms) / 1e3);
  }
  state.counters["dense_neurons"] = static_cast<double>(k);
  state.counters["nnz/row"] = static_cast<double>(nnz) / tokens;
  state.counters["TwELL nnz/row"] = static_cast<double>(cold_nnz) / tokens;
  state.counters["gate ms"] = gate_ms;
  state.counters["consumer ms"] = consumer_ms;
  state.counters["dense part ms"] = hot_ms;
  state.counters["dense FFN ms"] = dense_ms;
  state.counters["predicted ms"] = predict_split_ms(p.host.spec, tokens, sorted, 1477 / 2, k);
  state.counters["x dense"] = dense_ms / (gate_ms + consumer_ms + hot_ms);
}

void RealLayerSplitArgs(benchmark::internal::Benchmark* b) {
  for (int layer = 0; layer < 4; ++layer) b->Args({layer, 16384, -1});
  for (int64_t k : {0, 1024, 2048, 3072, 4096, 4608}) b->Args({1, 16384, k});
  for (int64_t k : {0, 1024, 2048, 3072}) b->Args({3, 16384, k});
  b->ArgNames({"layer", "M", "dense_neurons"})->UseManualTime()->Unit(benchmark::kMillisecond)->Iterations(1);
}

// Paper layer 1 end to end on its real x and gate weight (../shared/data paper_l1_*; random Wu, Wd as
// the files hold none): 1024 tokens repeated to M, the activity of the first 512 picks the hot-first
// order and the split (cost model), then one FfnPlan::run with the split (Sparse), without it, with
// Dispatch::Auto over the split plan, and cuBLASLt's dense FFN; argument 1: 0 dense, 1 TwELL without
// split, 2 split, 3 Auto over the split.
// Paper layer 1's real x (1024 tokens) and gate weight (../shared/data paper_l1_*) with random Wu, Wd
// (the files hold none), read once; nullptr (the state skipped, naming the file) where a file is missing.
const LayerData* paper_layer1(benchmark::State& state) {
  const auto dir = testing::shared_data_dir();
  for (const char* n : {"paper_l1_gate_a.safetensors", "paper_l1_gate_b.safetensors", "paper_l1_x.safetensors"})
    if (!std::filesystem::exists(dir / n)) {
      state.SkipWithError(("missing " + (dir / n).string()).c_str());
      return nullptr;
    }
  static const LayerData d = load_layer({SafeTensors::read(dir / "paper_l1_gate_a.safetensors"),
                                         SafeTensors::read(dir / "paper_l1_gate_b.safetensors"), SafeTensors::read(dir / "paper_l1_x.safetensors")},
                                        1, true);
  return &d;
}

void BM_PaperLayer1(benchmark::State& state) {
  if (!gpu_or_skip(state)) return;
  const LayerData* layer = paper_layer1(state);
  if (!layer) return;
  static std::unique_ptr<testing::RandomFfn> f;  // permuted hot-first, x repeated to 16384 rows
  static int64_t split = 0;
  Context& ctx = context();
  StreamHandle stream(ctx);
  const int64_t tokens = state.range(0);
  if (!f || f->tokens != tokens) {
    const LayerData& d = *layer;
    f = std::make_unique<testing::RandomFfn>();
    f->spec.d_model = d.d_model;
    f->spec.d_ff = d.d_ff;
    f->tokens = tokens;
    f->x.resize(tokens * d.d_model);
    for (int64_t r = 0; r < tokens; ++r) std::copy_n(d.x.begin() + (r % d.tokens) * d.d_model, d.d_model, f->x.begin() + r * d.d_model);
    f->w_gate = d.w_gate;
    f->w_up = d.w_up;
    f->w_down = d.w_down;
    // The activity of the first 512 real tokens.
    const int64_t calibration = 512;
    DeviceMemory x(ctx, calibration * d.d_model * 2), wg(ctx, d.w_gate.size() * 2), wu(ctx, d.w_up.size() * 2), wd(ctx, d.w_down.size() * 2),
        y(ctx, calibration * d.d_model * 2);
    x.upload(std::vector<uint16_t>(d.x.begin(), d.x.begin() + calibration * d.d_model));
    wg.upload(d.w_gate);
    wu.upload(d.w_up);
    wd.upload(d.w_down);
    PlanOptions o;
    o.dispatch = Dispatch::Sparse;
    FfnPlan calib = ctx.plan(f->spec, calibration, o);
    const FfnTensors ct{x.data(), wg.data(), wu.data(), wd.data(), y.data()};
    calib.run(stream.get(), ct, calibration);
    calib.last_overflow(stream.get());
    calib.run(stream.get(), ct, calibration);
    const std::vector<uint64_t> activity = neuron_activity(calib.download_twell(stream.get()));
    const std::vector<int64_t> order = hot_first_order(activity);
    const std::vector<uint64_t> sorted = in_order(activity, order);
    split = choose_dense_neurons(f->spec, tokens, sorted, calibration);
    permute_neurons(f->spec, order, f->w_gate, f->w_up, f->w_down);
  }
  auto up = [&](const std::vector<uint16_t>& v) {
    auto m = std::make_unique<DeviceMemory>(ctx, v.size() * 2);
    m->upload(v);
    return m;
  };
  auto x = up(f->x), wg = up(f->w_gate), wu = up(f->w_up), wd = up(f->w_down);
  DeviceMemory y(ctx, tokens * f->spec.d_model * 2);
  const FfnTensors t{x->data(), wg->data(), wu->data(), wd->data(), y.data()};
  const int mode = static_cast<int>(state.range(1));
  std::unique_ptr<FfnPlan> plan;
  std::unique_ptr<DenseFfn> dense;
  if (mode == 0) {
    dense = std::make_unique<DenseFfn>(ctx, f->spec, tokens);
  } else {
    PlanOptions o;
    o.dispatch = mode == 3 ? Dispatch::Auto : Dispatch::Sparse;
    o.dense_neurons = mode >= 2 ? split : 0;
    plan = std::make_unique<FfnPlan>(ctx.plan(f->spec, tokens, o));
    plan->run(stream.get(), t, tokens);  // Auto: calibrates; Sparse: sizes the backup
    if (mode != 3) plan->last_overflow(stream.get());
    if (mode == 3) state.SetLabel("picked " + plan->last_path());
  }
  auto call = [&] { plan ? plan->run(stream.get(), t, tokens) : dense->run(stream.get(), t, tokens); };
  for (auto _ : state) {
    const auto ms = time_on_stream(stream.get(), call, 2, 5);
    state.SetIterationTime(ms[ms.size() / 2] / 1e3);
  }
  state.counters["dense_neurons"] = mode >= 2 ? static_cast<double>(split) : 0.0;
}

void PaperLayer1Args(benchmark::internal::Benchmark* b) {
  for (int64_t m : {16384, 131072})  // 131072: PERFORMANCE.md's real-data anchor (dense 14.0 ms, reference 38.1)
    for (int mode : {0, 1, 2, 3}) b->Args({m, mode});
  b->ArgNames({"M", "path"})->UseManualTime()->Unit(benchmark::kMillisecond)->Iterations(3);
}

// Decoding (PERFORMANCE.md, "Small M": the dense FFN reads all 69 MB of weights, 43 us at M = 1; a
// sparse one must read the 23 MB Wg but only the active rows of Wu and Wd: the target is >= 3x dense
// at 0.5%). Paths: 0 cuBLASLt (three GEMMs + elementwise), 1 twell with the decode kernels
// (PlanOptions::decode_max_tokens; the fused decode kernel up to its most, 32 rows), 2 twell
// with the large-M kernels only, 3 the dense path a plan runs (DenseKernels::FusedGatedUp: cuBLASLt at these token counts since v69), 4 the four decode
// kernels without the fused one; Wd out_in (nn.Linear) or in_out (in_out 1). Each call reads another of kDecodeLayers copies of the weights (nn.Linear
// layouts), so the weights come from DRAM as in a model whose layers do not all fit the L2; the calls
// run from a CUDA graph (time_graph_on_stream), so the host's launch overhead is not timed: what a
// serving loop that captures its decode step sees.
constexpr int kDecodeLayers = 4;

// The device copy bandwidth this machine's H200 measured (PERFORMANCE.md: about 4.3 TB/s): a decode
// call's floor is the bytes it must read over it.
constexpr double kCopyBytesPerSecond = 4.3e12;

// kDecodeLayers copies of one layer's weights on the device (the same values), Wd [d_model, d_ff] as
// given (nn.Linear, out_in) or transposed to [d_ff, d_model] (in_out): copy l is entries 3 l .. 3 l + 2.
std::vector<std::unique_ptr<DeviceMemory>> decode_weight_copies(Context& ctx, int64_t d_model, int64_t d_ff, const std::vector<uint16_t>& w_gate,
                                                                const std::vector<uint16_t>& w_up, const std::vector<uint16_t>& w_down,
                                                                bool in_out) {
  std::vector<uint16_t> wd = w_down;
  if (in_out)
    for (int64_t i = 0; i < d_model; ++i)
      for (int64_t j = 0; j < d_ff; ++j) wd[j * d_model + i] = w_down[i * d_ff + j];
  std::vector<std::unique_ptr<DeviceMemory>> copies;
  for (int l = 0; l < kDecodeLayers; ++l)
    for (const std::vector<uint16_t>* w : {&w_gate, &w_up, static_cast<const std::vector<uint16_t>*>(&wd)}) {
      copies.push_back(std::make_unique<DeviceMemory>(ctx, w->size() * 2));
      copies.back()->upload(*w);
    }
  return copies;
}

// A decode benchmark's timed calls: each call on the next copy of the weights (base's x and y), from a
// CUDA graph of 5 kDecodeLayers calls; the median per call. A plan runs every copy once first (Auto
// times its paths, the backup is sized), outside the capture.
void time_decode(benchmark::State& state, Stream stream, const std::vector<std::unique_ptr<DeviceMemory>>& copies, const FfnTensors& base,
                 int64_t tokens, FfnPlan* plan, DenseFfn* dense) {
  auto tensors = [&](int l) {
    FfnTensors t = base;
    t.w_gate = copies[3 * l]->data();
    t.w_up = copies[3 * l + 1]->data();
    t.w_down = copies[3 * l + 2]->data();
    return t;
  };
  if (plan) {
    for (int l = 0; l < kDecodeLayers; ++l) plan->run(stream, tensors(l), tokens);
    if (plan->last_path() == "twell")  // the fused decode kernel and the dense path make no TwELL matrix
      plan->last_overflow(stream);     // the backup's size for these inputs: no recompute in the timed calls
    plan->run(stream, tensors(0), tokens);  // grows the backup now, not inside the capture
  }
  int layer = 0;
  auto call = [&] {
    const FfnTensors t = tensors(layer);
    layer = (layer + 1) % kDecodeLayers;
    plan ? plan->run(stream, t, tokens) : dense->run(stream, t, tokens);
  };
  for (auto _ : state) {
    const auto ms = time_graph_on_stream(stream, call, 5 * kDecodeLayers, 5);
    state.SetIterationTime(ms[ms.size() / 2] / 1e3);
  }
}

void BM_Decode(benchmark::State& state) {
  if (!gpu_or_skip(state)) return;
  Context& ctx = context();
  const int64_t tokens = state.range(0);
  const int path = static_cast<int>(state.range(2));
  const bool in_out = state.range(3) != 0;
  Problem& p = problem(tokens, static_cast<int>(state.range(1)));
  FfnSpec spec = p.host.spec;
  spec.down_layout = in_out ? WeightLayout::InOut : WeightLayout::OutIn;
  StreamHandle stream(ctx);
  static std::map<std::tuple<int64_t, int64_t, bool>, std::vector<std::unique_ptr<DeviceMemory>>> copies;
  auto& layers = copies[{tokens, state.range(1), in_out}];
  if (layers.empty()) layers = decode_weight_copies(ctx, kDModel, kDff, p.host.w_gate, p.host.w_up, p.host.w_down, in_out);
  std::unique_ptr<FfnPlan> plan;
  std::unique_ptr<DenseFfn> dense;
  if (path == 0 || path == 3) {
    dense = std::make_unique<DenseFfn>(ctx, spec, tokens, path == 3 ? DenseKernels::FusedGatedUp : DenseKernels::CuBlasLt);
  } else {
    PlanOptions o;
    o.dispatch = Dispatch::Sparse;
    o.decode_max_tokens = path == 1 || path == 4 ? 64 : 0;
    o.decode_fused_max_tokens = path == 4 ? 0 : kernels::DecodeKernelConstraints::kFusedMaxTokens;
    plan = std::make_unique<FfnPlan>(ctx.plan(spec, tokens, o));
  }
  time_decode(state, stream.get(), layers, p.tensors(), tokens, plan.get(), dense.get());
  // The bytes a call must read: dense, all three weights; sparse, Wg and the active rows of Wu and Wd.
  const double weight_bytes = 3.0 * kDModel * kDff * 2;
  state.counters["GB/s(dense bytes)"] = benchmark::Counter(weight_bytes / 1e9, benchmark::Counter::kIsIterationInvariantRate);
}

// Decoding on paper layer 1's real x and gate weight (../shared/data paper_l1_*; random Wu, Wd: the
// files hold none): the first M of its 1024 real tokens, so the active neurons are the real ones (5%
// of d_ff per token on average, with hot neurons: the union over 64 tokens is far below 64 times it).
// Paths: 0 cuBLASLt, 1 twell's decode kernels (Sparse: the fused one up to its most, the four beyond),
// 5 PlanOptions' defaults (Dispatch::Auto: what a user gets; the label says what it picked); Wd out_in
// or in_out. Counters: the active neurons per token and their union (the gate on the host in fp32,
// so a neuron within rounding of 0 may count otherwise), the bytes a sparse call must read (Wg, and
// the union's Wu and Wd rows), its floor at kCopyBytesPerSecond and the bytes per second achieved.
void BM_DecodeRealLayer1(benchmark::State& state) {
  if (!gpu_or_skip(state)) return;
  const LayerData* d = paper_layer1(state);
  if (!d) return;
  static std::vector<std::vector<int64_t>> active;  // per real token, its active neurons (the first 64 tokens)
  if (active.empty()) {
    for (int64_t r = 0; r < 64; ++r) {
      std::vector<float> xr(d->d_model);
      for (int64_t k = 0; k < d->d_model; ++k) xr[k] = bf16_to_float(d->x[r * d->d_model + k]);
      active.emplace_back();
      for (int64_t j = 0; j < d->d_ff; ++j) {
        float g = 0.0f;
        for (int64_t k = 0; k < d->d_model; ++k) g += xr[k] * bf16_to_float(d->w_gate[j * d->d_model + k]);
        if (g > 0.0f) active.back().push_back(j);
      }
    }
  }
  Context& ctx = context();
  const int64_t tokens = state.range(0);
  const int path = static_cast<int>(state.range(1));
  const bool in_out = state.range(2) != 0;
  FfnSpec spec;
  spec.d_model = d->d_model;
  spec.d_ff = d->d_ff;
  spec.down_layout = in_out ? WeightLayout::InOut : WeightLayout::OutIn;
  static std::map<bool, std::vector<std::unique_ptr<DeviceMemory>>> copies;
  auto& layers = copies[in_out];
  if (layers.empty()) layers = decode_weight_copies(ctx, d->d_model, d->d_ff, d->w_gate, d->w_up, d->w_down, in_out);
  DeviceMemory x(ctx, tokens * d->d_model * 2), y(ctx, tokens * d->d_model * 2);
  x.upload(std::vector<uint16_t>(d->x.begin(), d->x.begin() + tokens * d->d_model));
  const FfnTensors base{x.data(), nullptr, nullptr, nullptr, y.data()};
  StreamHandle stream(ctx);
  std::unique_ptr<FfnPlan> plan;
  std::unique_ptr<DenseFfn> dense;
  if (path == 0) {
    dense = std::make_unique<DenseFfn>(ctx, spec, tokens, DenseKernels::CuBlasLt);
  } else {
    PlanOptions o;
    if (path == 1) o.dispatch = Dispatch::Sparse;
    plan = std::make_unique<FfnPlan>(ctx.plan(spec, tokens, o));
  }
  time_decode(state, stream.get(), layers, base, tokens, plan.get(), dense.get());
  if (plan) state.SetLabel("ran " + plan->last_path());
  std::vector<bool> in_union(d->d_ff, false);
  int64_t per_token = 0, union_rows = 0;
  for (int64_t r = 0; r < tokens; ++r)
    for (int64_t j : active[r]) {
      ++per_token;
      if (!in_union[j]) ++union_rows, in_union[j] = true;
    }
  const double must_read = 2.0 * d->d_model * d->d_ff + union_rows * 4.0 * d->d_model;
  state.counters["active/token"] = static_cast<double>(per_token) / tokens;
  state.counters["union"] = static_cast<double>(union_rows);
  state.counters["floor us"] = must_read / kCopyBytesPerSecond * 1e6;
  state.counters["GB/s(must read)"] = benchmark::Counter(must_read / 1e9, benchmark::Counter::kIsIterationInvariantRate);
}

void DecodeRealLayer1Args(benchmark::internal::Benchmark* b) {
  for (int64_t m : {1, 2, 4, 8, 16, 32, 64})
    for (int path : {0, 1, 5})
      for (int in_out : {0, 1}) b->Args({m, path, in_out});
  b->ArgNames({"M", "path", "in_out"})->UseManualTime()->Unit(benchmark::kMicrosecond)->Iterations(5);
}

void DecodeArgs(benchmark::internal::Benchmark* b) {
  for (int64_t m : {1, 2, 4, 8, 16, 32, 64})
    for (int permille : {5, 10, 20})
      for (int path : {0, 1, 2, 3, 4})
        for (int in_out : {0, 1}) b->Args({m, permille, path, in_out});
  b->ArgNames({"M", "density_permille", "path", "in_out"})->UseManualTime()->Unit(benchmark::kMicrosecond)->Iterations(5);
}

void BM_JitColdCompile(benchmark::State& state) {
  FfnSpec s;
  s.d_model = kDModel;
  s.d_ff = kDff;
  for (auto _ : state) {
    ContextOptions o;
    o.disk_cache = false;  // a fresh memory-only cache: every plan compiles
    Context ctx(o);
    benchmark::DoNotOptimize(ctx.compile(compiler::generateFfn(s, ctx.target())));
  }
  state.SetLabel("generate + NVRTC of 2 kernels");
}

void BM_JitWarmHit(benchmark::State& state) {
  FfnSpec s;
  s.d_model = kDModel;
  s.d_ff = kDff;
  ContextOptions o;
  o.disk_cache = false;
  Context ctx(o);
  const auto gen = compiler::generateFfn(s, ctx.target());
  ctx.compile(gen);
  for (auto _ : state) benchmark::DoNotOptimize(ctx.compile(gen));
  state.SetLabel("memory cache hit of 2 kernels (after generation)");
}

void FfnArgs(benchmark::internal::Benchmark* b) {
  for (int permille : {5, 20, 50}) b->Args({256, permille});
  // M = 131072 at 0.5%: the paper's anchor (dense 13.6 ms, reference TwELL 8.35 ms, target 5.5 ms).
  for (int64_t m : {16384, 131072})
    for (int permille : {5, 10, 20, 50, 100}) b->Args({m, permille});
  b->ArgNames({"M", "density_permille"})->UseManualTime()->Unit(benchmark::kMillisecond)->Iterations(3);
}

}  // namespace

BENCHMARK_CAPTURE(BM_GatedFfn, twell_rows, true, 0)->Apply(FfnArgs);
BENCHMARK_CAPTURE(BM_GatedFfn, twell_block, true, 1)->Apply(FfnArgs);
BENCHMARK_CAPTURE(BM_GatedFfn, twell_auto, true, -1)->Apply(FfnArgs);
BENCHMARK_CAPTURE(BM_GatedFfn, dense_cublaslt, false, static_cast<int>(DenseKernels::CuBlasLt))->Apply(FfnArgs);
BENCHMARK_CAPTURE(BM_GatedFfn, dense_cublas, false, static_cast<int>(DenseKernels::CuBlas))->Apply(FfnArgs);
BENCHMARK_CAPTURE(BM_GatedFfn, dense_cublaslt_tuned, false, static_cast<int>(DenseKernels::CuBlasLtTuned))->Apply(FfnArgs);
BENCHMARK(BM_DenseFused)->Apply(FfnArgs);
BENCHMARK_CAPTURE(BM_NonGatedFfn, twell, true)->Apply(FfnArgs);
BENCHMARK_CAPTURE(BM_NonGatedFfn, dense_cublaslt, false)->Apply(FfnArgs);
BENCHMARK_CAPTURE(BM_Gate, twell_d2t, true, 0)->Apply(GateArgs);
BENCHMARK_CAPTURE(BM_Gate, twell_d2t_no_cluster, true, 1)->Apply(GateArgs);
BENCHMARK_CAPTURE(BM_Gate, dense_cublaslt_gemm, false, 0)->Apply(GateArgs);
BENCHMARK(BM_Consumer)->Apply(ConsumerArgs);
BENCHMARK(BM_ConsumerRealPattern)->Apply(RealPatternArgs);
BENCHMARK(BM_RealLayerSplit)->Apply(RealLayerSplitArgs);
BENCHMARK(BM_PaperLayer1)->Apply(PaperLayer1Args);
BENCHMARK(BM_Decode)->Apply(DecodeArgs);
BENCHMARK(BM_DecodeRealLayer1)->Apply(DecodeRealLayer1Args);
BENCHMARK(BM_JitColdCompile)->Unit(benchmark::kMillisecond)->Iterations(3);
BENCHMARK(BM_JitWarmHit)->Unit(benchmark::kMicrosecond);

BENCHMARK_MAIN();
