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
#include "twell/context.h"
#include "twell/dense.h"
#include "twell/device_memory.h"
#include "twell/format.h"
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
               std::optional<int> gate_cluster = std::nullopt) {
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
  if (!sparse) dense = std::make_unique<DenseFfn>(ctx, p.host.spec, tokens);
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
// row gather, token block or dense).
void BM_GatedFfn(benchmark::State& state, bool sparse, int variant) {
  time_path(state, sparse, false, useful_flops(state.range(0), state.range(1) / 1000.0) / 1e12, "TFLOP/s(useful)",
            variant < 0 ? std::nullopt : std::optional(static_cast<ConsumerVariant>(variant)), true, variant < 0);
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
  for (int64_t m : {16384, 131072}) b->Args({m, 5});
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
    for (int64_t m : {16384, 131072})
      for (int permille : {5, 10, 20, 50, 100}) b->Args({m, permille, variant});
  b->ArgNames({"M", "density_permille", "consumer"})->UseManualTime()->Unit(benchmark::kMillisecond)->Iterations(3);
}

// The real patterns: relu(x Wg^T) of layer `layer` of the paper model (1477 held-out tokens, CSR),
// repeated to M rows, packed with the plan's layout (overflowing tile-rows in the backup), uploaded;
// the consumer alone over it with random x, Wu, Wd (the files hold no up/down weights). The gate GEMM
// it would follow costs what BM_Gate measures, whatever the pattern.
void BM_ConsumerRealPattern(benchmark::State& state) {
  if (!gpu_or_skip(state)) return;
  Context& ctx = context();
  const auto file = testing::shared_data_dir() / "paper_patterns.safetensors";
  if (!std::filesystem::exists(file)) {
    state.SkipWithError(("missing " + file.string()).c_str());
    return;
  }
  const int layer = static_cast<int>(state.range(0));
  const int64_t tokens = state.range(1);
  const SafeTensors st = SafeTensors::read(file);
  const std::string prefix = "layers." + std::to_string(layer) + ".";
  const TensorView row_ptr = st.at(prefix + "row_ptr"), col = st.at(prefix + "col"), val = st.at(prefix + "val");
  if (row_ptr.dtype != "I32" || col.dtype != "I16" || val.dtype != "BF16" || row_ptr.shape.size() != 1) {
    state.SkipWithError((prefix + "{row_ptr, col, val}: expected I32, I16, BF16 vectors").c_str());
    return;
  }
  const int64_t rows = row_ptr.shape.at(0) - 1;
  std::vector<int32_t> ptr(rows + 1);
  std::memcpy(ptr.data(), row_ptr.data.data(), ptr.size() * 4);
  std::vector<uint16_t> dense(tokens * kDff, 0);
  int64_t nnz = 0;
  for (int64_t r = 0; r < tokens; ++r) {
    const int64_t src = r % rows;
    for (int32_t e = ptr[src]; e < ptr[src + 1]; ++e) {
      int16_t c;
      uint16_t v;
      std::memcpy(&c, col.data.data() + 2 * e, 2);
      std::memcpy(&v, val.data.data() + 2 * e, 2);
      if (c < 0 || c >= kDff) {
        state.SkipWithError((prefix + "col: an index outside 0.." + std::to_string(kDff - 1)).c_str());
        return;
      }
      dense[r * kDff + c] = v;
      ++nnz;
    }
  }
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
BENCHMARK_CAPTURE(BM_GatedFfn, dense_cublaslt, false, 0)->Apply(FfnArgs);
BENCHMARK_CAPTURE(BM_NonGatedFfn, twell, true)->Apply(FfnArgs);
BENCHMARK_CAPTURE(BM_NonGatedFfn, dense_cublaslt, false)->Apply(FfnArgs);
BENCHMARK_CAPTURE(BM_Gate, twell_d2t, true, 0)->Apply(GateArgs);
BENCHMARK_CAPTURE(BM_Gate, twell_d2t_no_cluster, true, 1)->Apply(GateArgs);
BENCHMARK_CAPTURE(BM_Gate, dense_cublaslt_gemm, false, 0)->Apply(GateArgs);
BENCHMARK(BM_Consumer)->Apply(ConsumerArgs);
BENCHMARK(BM_ConsumerRealPattern)->Apply(RealPatternArgs);
BENCHMARK(BM_JitColdCompile)->Unit(benchmark::kMillisecond)->Iterations(3);
BENCHMARK(BM_JitWarmHit)->Unit(benchmark::kMicrosecond);

BENCHMARK_MAIN();
