// Hot and cold neurons (twell/neuron_order.h): activity counts, the hot-first order, the permutation of
// host weights and the cost model that picks PlanOptions::dense_neurons.
#include "twell/neuron_order.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <numeric>
#include <tuple>

#include <fmt/format.h>

#include "context_impl.h"
#include "launcher.h"
#include "run_arguments.h"  // is_device_memory
#include "twell/error.h"

namespace twell {

std::vector<uint64_t> neuron_activity(const TwellMatrix& m) {
  validate_twell(m);  // every index below is then in range
  const TwellLayout& l = m.layout;
  const int64_t tiles = l.tiles(m.d_ff), wpr = l.words_per_row(m.d_ff);
  std::vector<uint64_t> activity(m.d_ff, 0);
  for (int64_t r = 0; r < m.rows; ++r) {
    for (int64_t t = 0; t < tiles; ++t) {
      const uint32_t* w = &m.words[r * wpr + t * (l.slots + 1)];
      const int64_t n0 = t * l.tile_n, valid = std::min<int64_t>(l.tile_n, m.d_ff - n0);
      if (w[0] <= static_cast<uint32_t>(l.slots)) {
        for (uint32_t e = 0; e < w[0]; ++e) ++activity[n0 + (w[1 + e] & 0xFFFFu)];
      } else if (w[1] == kBackupMissing) {
        throw Error(ErrorCode::InvalidArgument,
                    fmt::format("neuron_activity: m: row {}, tile {} overflowed a full backup, so its nonzeros are unknown; "
                                "grow the backup (FfnPlan::last_overflow) and run again", r, t));
      } else {
        const uint16_t* row = &m.backup[static_cast<size_t>(w[1]) * l.tile_n];
        for (int64_t c = 0; c < valid; ++c) activity[n0 + c] += is_active(l, row[c]) ? 1 : 0;
      }
    }
  }
  return activity;
}

std::vector<int64_t> hot_first_order(std::span<const uint64_t> activity) {
  std::vector<int64_t> order(activity.size());
  std::iota(order.begin(), order.end(), int64_t{0});
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return activity[a] > activity[b]; });
  return order;
}

namespace {
// The spec's shape within FfnSpec's limits (so d_ff * d_model cannot overflow) and `order` a
// permutation of 0..d_ff-1.
void check_order(const FfnSpec& spec, std::span<const int64_t> order) {
  auto bad = [](const std::string& m) { throw Error(ErrorCode::InvalidArgument, "permute_neurons: " + m); };
  const int64_t n = spec.d_ff, k = spec.d_model;
  if (k < 1 || k > 65536) bad(fmt::format("spec.d_model: expected 1..65536, got {}", k));
  if (n < 1 || n > (int64_t{1} << 24)) bad(fmt::format("spec.d_ff: expected 1..16777216, got {}", n));
  if (static_cast<int64_t>(order.size()) != n) bad(fmt::format("order: expected {} entries (d_ff), got {}", n, order.size()));
  std::vector<char> seen(n, 0);
  for (size_t i = 0; i < order.size(); ++i) {
    if (order[i] < 0 || order[i] >= n) bad(fmt::format("order[{}]: expected a neuron 0..{}, got {}", i, n - 1, order[i]));
    if (seen[order[i]]++) bad(fmt::format("order[{}]: neuron {} appears twice (order must be a permutation)", i, order[i]));
  }
}
}  // namespace

std::vector<uint64_t> in_order(std::span<const uint64_t> activity, std::span<const int64_t> order) {
  if (order.size() != activity.size())
    throw Error(ErrorCode::InvalidArgument, fmt::format("in_order: order: expected {} entries (activity's), got {}", activity.size(),
                                                        order.size()));
  std::vector<uint64_t> out(order.size());
  for (size_t i = 0; i < order.size(); ++i) {
    if (order[i] < 0 || static_cast<size_t>(order[i]) >= activity.size())
      throw Error(ErrorCode::InvalidArgument,
                  fmt::format("in_order: order[{}]: expected a neuron 0..{}, got {}", i, activity.size() - 1, order[i]));
    out[i] = activity[order[i]];
  }
  return out;
}

void permute_neurons(const FfnSpec& spec, std::span<const int64_t> order, std::vector<uint16_t>& w_gate,
                     std::vector<uint16_t>& w_up, std::vector<uint16_t>& w_down) {
  auto bad = [](const std::string& m) { throw Error(ErrorCode::InvalidArgument, "permute_neurons: " + m); };
  check_order(spec, order);
  const int64_t n = spec.d_ff, k = spec.d_model;
  const size_t size = static_cast<size_t>(n * k);
  if (w_gate.size() != size) bad(fmt::format("w_gate: expected {} elements (d_ff x d_model), got {}", size, w_gate.size()));
  if (spec.gated && w_up.size() != size) bad(fmt::format("w_up: expected {} elements (d_ff x d_model), got {}", size, w_up.size()));
  if (!spec.gated && !w_up.empty()) bad(fmt::format("w_up: expected empty (a non-gated spec), got {} elements", w_up.size()));
  if (w_down.size() != size) bad(fmt::format("w_down: expected {} elements (d_model x d_ff), got {}", size, w_down.size()));
  // All three results first, then swapped in: a failed allocation leaves every weight as it was.
  auto permute_rows = [&](const std::vector<uint16_t>& w) {  // [d_ff, d_model]
    std::vector<uint16_t> out(w.size());
    for (int64_t i = 0; i < n; ++i) std::copy_n(w.begin() + order[i] * k, k, out.begin() + i * k);
    return out;
  };
  std::vector<uint16_t> gate = permute_rows(w_gate), up = spec.gated ? permute_rows(w_up) : std::vector<uint16_t>{}, down;
  if (spec.down_layout == WeightLayout::InOut) {
    down = permute_rows(w_down);
  } else {  // [d_model, d_ff]: permute the columns of every row
    down.resize(w_down.size());
    for (int64_t r = 0; r < k; ++r)
      for (int64_t i = 0; i < n; ++i) down[r * n + i] = w_down[r * n + order[i]];
  }
  w_gate.swap(gate);
  if (spec.gated) w_up.swap(up);
  w_down.swap(down);
}

void permute_neurons(Context& context, Stream stream, const FfnSpec& spec, std::span<const int64_t> order,
                     const FfnTensors& in, const DeviceFfnWeights& out) {
  auto bad = [](const std::string& m) { throw Error(ErrorCode::InvalidArgument, "permute_neurons: " + m); };
  check_order(spec, order);
  const std::shared_ptr<Context::Impl> ctx = context_impl(context);
  if (!ctx->gpu) throw Error(ErrorCode::NoDevice, "permute_neurons: needs a GPU (" + ctx->no_gpu_reason + ")");
  ctx->make_current();
  const detail::Driver& d = detail::Driver::get();
  const int64_t n = spec.d_ff, k = spec.d_model;
  const bool in_out = spec.down_layout == WeightLayout::InOut;
  // One matrix to reorder: its name, pointers, shape [rows, cols] and strides, by rows or columns.
  struct Job {
    const char* name;
    const void* in;
    void* out;
    int64_t ld_in, ld_out, rows, cols;
    bool by_rows;
  };
  std::vector<Job> jobs{{"w_gate", in.w_gate, out.w_gate, in.ld_gate, out.ld_gate, n, k, true}};
  if (spec.gated) jobs.push_back({"w_up", in.w_up, out.w_up, in.ld_up, out.ld_up, n, k, true});
  else if (in.w_up != nullptr || out.w_up != nullptr)
    bad("w_up: a non-gated spec has no up weight; expected null in `in` and `out`");
  jobs.push_back(in_out ? Job{"w_down", in.w_down, out.w_down, in.ld_down, out.ld_down, n, k, true}
                        : Job{"w_down", in.w_down, out.w_down, in.ld_down, out.ld_down, k, n, false});
  for (Job& j : jobs) {
    j.ld_in = j.ld_in ? j.ld_in : j.cols;
    j.ld_out = j.ld_out ? j.ld_out : j.cols;
    for (const auto& [side, ptr, ld] : {std::tuple{"in", j.in, j.ld_in}, std::tuple{"out", static_cast<const void*>(j.out), j.ld_out}}) {
      if (ptr == nullptr) bad(fmt::format("{}.{}: expected a device pointer, got null", side, j.name));
      if (reinterpret_cast<uintptr_t>(ptr) % 2 != 0) bad(fmt::format("{}.{}: expected a 2-byte aligned pointer, got {}", side, j.name, ptr));
      if (ld < j.cols || ld > (int64_t{1} << 36))
        bad(fmt::format("{}.ld for {}: expected a row stride in {}..2^36 elements (0 = dense), got {}", side, j.name, j.cols, ld));
      if (!is_device_memory(ptr)) bad(fmt::format("{}.{}: expected device memory, got {}", side, j.name, ptr));
    }
    const auto span_of = [&](const void* p, int64_t ld) {
      const auto b = reinterpret_cast<uintptr_t>(p);
      return std::pair{b, b + static_cast<uintptr_t>(((j.rows - 1) * ld + j.cols) * 2)};
    };
    const auto [ib, ie] = span_of(j.in, j.ld_in);
    const auto [ob, oe] = span_of(j.out, j.ld_out);
    if (ib < oe && ob < ie) bad(fmt::format("out.{}: must not overlap in.{} (the reordering reads all of it)", j.name, j.name));
  }
  const std::shared_ptr<LoadedKernel> kernel = ctx->auxiliary(kernels::KernelKind::NeuronPermute, FfnSpec{}, "permute_neurons");
  std::vector<uint32_t> order32(order.begin(), order.end());
  detail::DeviceBuffer order_d(order32.size() * 4);
  detail::check(d.cuMemcpyHtoD(order_d.get(), order32.data(), order32.size() * 4), "permute_neurons: cuMemcpyHtoD(order)");
  // A pageable copy may return before its DMA lands, ordered on the legacy stream only: wait for it
  // before kernels on `stream` (which may be non-blocking) read the order.
  detail::check(d.cuStreamSynchronize(nullptr), "permute_neurons: cuStreamSynchronize(order's copy)");
  auto cu = reinterpret_cast<CUstream>(stream);
  for (const Job& j : jobs) {
    device::PermuteParams p{static_cast<const uint16_t*>(j.in), static_cast<uint16_t*>(j.out),
                            reinterpret_cast<const uint32_t*>(order_d.get()), j.rows, j.cols, j.ld_in, j.ld_out, j.by_rows ? 1u : 0u, 0u};
    void* args[1] = {&p};
    detail::launch(*kernel, kernels::LaunchShape{0, j.rows, j.cols}, args, cu, "permute_neurons");
  }
  // order_d is freed on return: the kernels reading it must be done.
  detail::check(d.cuStreamSynchronize(cu), "permute_neurons: cuStreamSynchronize");
}

namespace {
constexpr int64_t kUnchecked = -1;  // check_activity's granularity where the caller takes none

void check_activity(const char* who, const FfnSpec& spec, int64_t tokens, std::span<const uint64_t> a, int64_t rows,
                    std::span<const std::pair<const char*, double>> rates, double dense_overhead_ms, int64_t granularity) {
  auto bad = [&](const std::string& m) { throw Error(ErrorCode::InvalidArgument, fmt::format("{}: {}", who, m)); };
  if (spec.d_ff < 1 || spec.d_ff > (int64_t{1} << 24)) bad(fmt::format("spec.d_ff: expected 1..16777216, got {}", spec.d_ff));
  if (static_cast<int64_t>(a.size()) != spec.d_ff)
    bad(fmt::format("sorted_activity: expected {} entries (d_ff), got {}", spec.d_ff, a.size()));
  if (!std::is_sorted(a.begin(), a.end(), std::greater<>()))
    bad("sorted_activity: expected descending counts (the activity in hot_first_order)");
  if (rows < 1) bad(fmt::format("rows: expected the calibration row count >= 1, got {}", rows));
  if (!a.empty() && a.front() > static_cast<uint64_t>(rows))
    bad(fmt::format("sorted_activity: a neuron active in {} rows, more than the {} calibration rows (rows)", a.front(), rows));
  for (const auto& [name, rate] : rates)
    if (!(rate > 0) || !std::isfinite(rate)) bad(fmt::format("{}: expected a positive finite rate, got {}", name, rate));
  if (!(dense_overhead_ms >= 0) || !std::isfinite(dense_overhead_ms))
    bad(fmt::format("model.dense_overhead_ms: expected a finite value >= 0, got {}", dense_overhead_ms));
  if (granularity != kUnchecked && (granularity < 64 || granularity % 64 != 0))
    bad(fmt::format("model.granularity: expected a positive multiple of 64 (what dense_neurons takes), got {}", granularity));
  if (tokens < 1) bad(fmt::format("tokens: expected >= 1, got {}", tokens));
  if (spec.d_model < 1) bad(fmt::format("spec.d_model: expected >= 1, got {}", spec.d_model));
}

// The split among 0, granularity, 2 granularity, ... below d_ff with the least cost(cold nonzeros, split)
// (ties: the smaller split), and its cost.
template <class Cost>
std::pair<int64_t, double> best_split(const FfnSpec& spec, std::span<const uint64_t> sorted_activity, int64_t granularity,
                                      Cost&& cost) {
  uint64_t cold = std::accumulate(sorted_activity.begin(), sorted_activity.end(), uint64_t{0});
  std::pair<int64_t, double> best{0, cost(cold, 0)};
  for (int64_t k = granularity; k < spec.d_ff; k += granularity) {
    for (int64_t j = k - granularity; j < k; ++j) cold -= sorted_activity[j];
    if (const double ms = cost(cold, k); ms < best.second) best = {k, ms};
  }
  return best;
}

using Rates = std::array<std::pair<const char*, double>, 3>;
Rates inference_rates(const SplitCostModel& m) {
  return Rates{{{"model.dense_tflops", m.dense_tflops}, {"model.gate_tflops", m.gate_tflops}, {"model.gather_tbps", m.gather_tbps}}};
}

// The three terms both cost models share (ms): `dense_flops_per` M d_model FLOP per dense neuron at
// dense_tflops, a density-independent 2 M d_model FLOP per other neuron at fixed_tflops, and
// `rows_per_entry` d_model-long 16-bit weight rows per remaining active entry at gather_tbps.
struct CostTerms {
  double dense_flops_per, rows_per_entry, dense_tflops, fixed_tflops, gather_tbps;
};
double terms_ms(const FfnSpec& spec, int64_t tokens, uint64_t cold_nnz, int64_t rows, int64_t dense, const CostTerms& c) {
  const double t = static_cast<double>(tokens), d_model = static_cast<double>(spec.d_model);
  const double dense_flops = c.dense_flops_per * t * d_model * static_cast<double>(dense);
  const double fixed_flops = 2.0 * t * d_model * static_cast<double>(spec.d_ff - dense);
  const double entry_bytes = c.rows_per_entry * d_model * 2.0;
  const double gather_bytes = t * static_cast<double>(cold_nnz) / static_cast<double>(rows) * entry_bytes;
  return dense_flops / (c.dense_tflops * 1e9) + fixed_flops / (c.fixed_tflops * 1e9) + gather_bytes / (c.gather_tbps * 1e9);
}

// SplitCostModel: dense GEMMs over the dense neurons, the D2T gate over the others, and the consumer's
// Wu/Wd rows per remaining nonzero.
double split_ms(const FfnSpec& spec, int64_t tokens, uint64_t cold_nnz, int64_t rows, int64_t dense, const SplitCostModel& m) {
  const CostTerms c{spec.gated ? 6.0 : 4.0, spec.gated ? 2.0 : 1.0, m.dense_tflops, m.gate_tflops, m.gather_tbps};
  return terms_ms(spec, tokens, cold_nnz, rows, dense, c) + (dense > 0 ? m.dense_overhead_ms : 0.0);
}
}  // namespace

double predict_split_ms(const FfnSpec& spec, int64_t tokens, std::span<const uint64_t> sorted_activity, int64_t rows,
                        int64_t dense_neurons, const SplitCostModel& model) {
  check_activity("predict_split_ms", spec, tokens, sorted_activity, rows, inference_rates(model), model.dense_overhead_ms,
                 kUnchecked);
  if (dense_neurons < 0 || dense_neurons >= spec.d_ff)
    throw Error(ErrorCode::InvalidArgument, fmt::format("predict_split_ms: dense_neurons: expected 0..{} (below d_ff), got {}",
                                                        spec.d_ff - 1, dense_neurons));
  const uint64_t cold = std::accumulate(sorted_activity.begin() + dense_neurons, sorted_activity.end(), uint64_t{0});
  return split_ms(spec, tokens, cold, rows, dense_neurons, model);
}

int64_t choose_dense_neurons(const FfnSpec& spec, int64_t tokens, std::span<const uint64_t> sorted_activity, int64_t rows,
                             const SplitCostModel& model) {
  check_activity("choose_dense_neurons", spec, tokens, sorted_activity, rows, inference_rates(model), model.dense_overhead_ms,
                 model.granularity);
  return best_split(spec, sorted_activity, model.granularity,
                    [&](uint64_t cold, int64_t k) { return split_ms(spec, tokens, cold, rows, k, model); })
      .first;
}

namespace {
Rates training_rates(const TrainingSplitCostModel& m) {
  return Rates{{{"model.dense_tflops", m.dense_tflops}, {"model.twell_fixed_tflops", m.twell_fixed_tflops},
                {"model.gather_tbps", m.gather_tbps}}};
}

void check_twell_overhead(const char* who, const TrainingSplitCostModel& m) {
  if (!(m.twell_overhead_ms >= 0) || !std::isfinite(m.twell_overhead_ms))
    throw Error(ErrorCode::InvalidArgument,
                fmt::format("{}: model.twell_overhead_ms: expected a finite value >= 0, got {}", who, m.twell_overhead_ms));
}

// TrainingSplitCostModel's terms: the dense path's GEMMs over the dense neurons, the TwELL path's fixed part
// over the others, and its row reads per remaining active entry.
double training_ms(const FfnSpec& spec, int64_t tokens, uint64_t cold_nnz, int64_t rows, int64_t dense,
                   const TrainingSplitCostModel& m) {
  const CostTerms c{spec.gated ? 18.0 : 12.0, spec.gated ? 8.0 : 5.0, m.dense_tflops, m.twell_fixed_tflops, m.gather_tbps};
  // (The dense path alone, dense = d_ff, is the fitted 740 TFLOP/s; each part of a split pays its own fixed cost.)
  return terms_ms(spec, tokens, cold_nnz, rows, dense, c) + (dense > 0 && dense < spec.d_ff ? m.dense_overhead_ms : 0.0) +
         (dense < spec.d_ff ? m.twell_overhead_ms : 0.0);
}
}  // namespace

double predict_training_step_ms(const FfnSpec& spec, int64_t tokens, std::span<const uint64_t> sorted_activity, int64_t rows,
                                int64_t dense_neurons, const TrainingSplitCostModel& model) {
  check_activity("predict_training_step_ms", spec, tokens, sorted_activity, rows, training_rates(model),
                 model.dense_overhead_ms, kUnchecked);
  check_twell_overhead("predict_training_step_ms", model);
  if (dense_neurons < 0 || dense_neurons > spec.d_ff)
    throw Error(ErrorCode::InvalidArgument, fmt::format("predict_training_step_ms: dense_neurons: expected 0..{} (d_ff: the dense "
                                                        "path), got {}", spec.d_ff, dense_neurons));
  const uint64_t cold = std::accumulate(sorted_activity.begin() + dense_neurons, sorted_activity.end(), uint64_t{0});
  return training_ms(spec, tokens, cold, rows, dense_neurons, model);
}

int64_t choose_training_dense_neurons(const FfnSpec& spec, int64_t tokens, std::span<const uint64_t> sorted_activity,
                                      int64_t rows, const TrainingSplitCostModel& model) {
  check_activity("choose_training_dense_neurons", spec, tokens, sorted_activity, rows, training_rates(model),
                 model.dense_overhead_ms, model.granularity);
  check_twell_overhead("choose_training_dense_neurons", model);
  const auto [best, best_ms] = best_split(spec, sorted_activity, model.granularity, [&](uint64_t cold, int64_t k) {
    return training_ms(spec, tokens, cold, rows, k, model);
  });
  return training_ms(spec, tokens, 0, rows, spec.d_ff, model) < best_ms ? spec.d_ff : best;  // d_ff: the dense path
}

}  // namespace twell
