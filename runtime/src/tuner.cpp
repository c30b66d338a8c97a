// The tuner (twell/tuning.h): enumerate, prune, compile in parallel, check against the reference, time
// per token bucket, store the winner and the runner-up.
#include <algorithm>
#include <atomic>
#include <bit>
#include <chrono>
#include <cmath>
#include <future>
#include <map>
#include <system_error>
#include <random>
#include <thread>

#include <fmt/format.h>
#include <xxhash.h>

#include "driver.h"
#include "twell/context.h"
#include "twell/dense.h"
#include "twell/device_memory.h"
#include "twell/error.h"
#include "twell/half.h"
#include "twell/kernels/constraints.h"
#include "twell/kernels/validate.h"
#include "twell/neuron_order.h"
#include "twell/reference.h"
#include "twell/tuning.h"

#ifndef TWELL_VERSION
#define TWELL_VERSION "unknown"
#endif

namespace twell {
namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

[[noreturn]] void bad(const std::string& what) { throw Error(ErrorCode::InvalidArgument, "tune: " + what); }

// The inverse of the standard normal CDF (Acklam's rational approximation, relative error < 1.2e-9):
// where to put the gate's mean so that a fraction p of N(mean, 1) lies above the threshold.
double normal_quantile(double p) {
  static const double a[] = {-3.969683028665376e+01, 2.209460984245205e+02, -2.759285104469687e+02,
                             1.383577518672690e+02, -3.066479806614716e+01, 2.506628277459239e+00};
  static const double b[] = {-5.447609879822406e+01, 1.615858368580409e+02, -1.556989798598866e+02,
                             6.680131188771972e+01, -1.328068155288572e+01};
  static const double c[] = {-7.784894002430293e-03, -3.223964580411365e-01, -2.400758277161838e+00,
                             -2.549732539343734e+00, 4.374664141464968e+00, 2.938163982698783e+00};
  static const double d[] = {7.784695709041462e-03, 3.224671290700398e-01, 2.445134137142996e+00, 3.754408661907416e+00};
  const double lo = 0.02425;
  if (p < lo) {
    const double q = std::sqrt(-2 * std::log(p));
    return (((((c[0] * q + c[1]) * q + c[2]) * q + c[3]) * q + c[4]) * q + c[5]) / ((((d[0] * q + d[1]) * q + d[2]) * q + d[3]) * q + 1);
  }
  if (p > 1 - lo) return -normal_quantile(1 - p);
  const double q = p - 0.5, r = q * q;
  return (((((a[0] * r + a[1]) * r + a[2]) * r + a[3]) * r + a[4]) * r + a[5]) * q /
         (((((b[0] * r + b[1]) * r + b[2]) * r + b[3]) * r + b[4]) * r + 1);
}

// Host inputs of the tune, bf16/fp16 bits: x [rows, d_model], weights in nn.Linear layouts.
struct HostInputs {
  int64_t rows = 0;
  std::vector<uint16_t> x, w_gate, w_up, w_down;
  std::string workload;
};

// Uniform random inputs at `density` (16384 distinct token rows): x ~ N(0, 1) except column 0, which is 1; Wg ~ N(0, 1/(d_model-1))
// except column 0, which is threshold - z (z the normal quantile of 1 - density), so that
// g = x Wg^T ~ N(threshold - z, 1) and a fraction `density` of the neurons is active per token (ReLU;
// about that for SiLU's magnitude test). Wu, Wd ~ U(+-1/sqrt(fan_in)) as nn.Linear initializes them.
HostInputs random_inputs(const FfnSpec& s, int64_t rows, double density) {
  HostInputs in;
  in.rows = rows;
  in.workload = density_workload(density);
  std::mt19937_64 rng(0x7e11);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  auto bits = [&](float v) { return from_float(s.dtype, v); };
  const float z = static_cast<float>(-normal_quantile(density));  // the upper quantile, exact for tiny densities
  // 16384 distinct rows, repeated beyond (drawing 2^28 normals would take seconds of the budget).
  in.x.resize(size_t(rows) * s.d_model);
  const int64_t distinct = std::min<int64_t>(rows, 16384);
  for (int64_t r = 0; r < distinct; ++r)
    for (int64_t c = 0; c < s.d_model; ++c) in.x[r * s.d_model + c] = bits(c == 0 ? 1.0f : normal(rng));
  for (int64_t r = distinct; r < rows; ++r)
    std::copy_n(in.x.begin() + (r % distinct) * s.d_model, s.d_model, in.x.begin() + r * s.d_model);
  const float wscale = 1.0f / std::sqrt(static_cast<float>(std::max<int64_t>(1, s.d_model - 1)));
  in.w_gate.resize(size_t(s.d_ff) * s.d_model);
  for (int64_t n = 0; n < s.d_ff; ++n)
    for (int64_t c = 0; c < s.d_model; ++c) in.w_gate[n * s.d_model + c] = bits(c == 0 ? s.threshold - z : wscale * normal(rng));
  auto uniform = [&](std::vector<uint16_t>& w, size_t count, int64_t fan_in) {
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    const float k = 1.0f / std::sqrt(static_cast<float>(fan_in));
    w.resize(count);
    for (auto& v : w) v = bits(k * u(rng));
  };
  if (s.gated) uniform(in.w_up, size_t(s.d_ff) * s.d_model, s.d_model);
  uniform(in.w_down, size_t(s.d_model) * s.d_ff, s.d_ff);
  return in;
}

// A real layer's inputs, its token rows repeated to `rows`; the workload names a fingerprint of its x
// and Wg (the activation pattern follows from them and the spec's threshold, which keys the file).
HostInputs layer_inputs(const FfnSpec& s, const LayerData& d, int64_t rows) {
  if (d.d_model != s.d_model || d.d_ff != s.d_ff)
    bad(fmt::format("layer: expected d_model {} and d_ff {} (the spec's), got {} and {}", s.d_model, s.d_ff, d.d_model, d.d_ff));
  if (d.tokens < 1) bad("layer: expected at least one token row of x, got 0");
  HostInputs in;
  in.rows = rows;
  uint64_t h = XXH64(d.x.data(), d.x.size() * 2, 0);
  h = XXH64(d.w_gate.data(), d.w_gate.size() * 2, h);
  in.workload = fmt::format("pattern:{:016x}", h);
  in.x.resize(size_t(rows) * s.d_model);
  for (int64_t r = 0; r < rows; ++r)
    std::copy_n(d.x.begin() + (r % d.tokens) * s.d_model, s.d_model, in.x.begin() + r * s.d_model);
  in.w_gate = d.w_gate;
  if (s.gated) in.w_up = d.w_up;
  in.w_down = d.w_down;
  return in;
}

// A candidate's plan: its configuration exactly (Dispatch::Sparse, no database), decode kernels or not.
PlanOptions sparse_options(int64_t decode_max_tokens, int64_t dense_neurons = 0) {
  PlanOptions o;
  o.dispatch = Dispatch::Sparse;
  o.decode_max_tokens = decode_max_tokens;
  o.dense_neurons = dense_neurons;
  o.tuning = PlanOptions::Tuning::Ignore;
  return o;
}

std::string describe(const TunedConfig& c) {
  if (c.path == TunedConfig::Path::Dense) return "dense (fused gate+up above 64 tokens, cuBLASLt GEMMs below; cuBLASLt down)";
  if (c.path == TunedConfig::Path::Heuristic) return "the heuristic's plan (untuned)";
  return fmt::format("tile_n {} slots {} cluster {} {}{}{}", c.tile_n, c.slots, c.cluster_m, to_string(c.consumer),
                     c.decode_max_tokens > 0 ? fmt::format(" decode<= {}", c.decode_max_tokens) : std::string(),
                     c.dense_neurons > 0 ? fmt::format(" split: {} hot neurons dense", c.dense_neurons) : std::string());
}

// Slot counts worth trying for a tile width, from the mean nnz per tile-row at that width: the
// smallest 2^k - 1 holding about the 99th percentile of a Poisson count, and its neighbours.
std::vector<int> slot_candidates(double mean_nnz, int tile_n) {
  const double p99 = mean_nnz + 2.33 * std::sqrt(std::max(mean_nnz, 1.0)) + 1;
  int s = 3;
  while (s < p99 && s < tile_n - 1) s = 2 * s + 1;
  std::vector<int> out;
  for (int v : {(s - 1) / 2, s, 2 * s + 1})
    if (v >= 3 && v < tile_n) out.push_back(v);
  // The generator's default layout (tile_n 256, slots 31) is always a candidate, so the tune can only
  // match or beat what an untuned plan runs.
  if (tile_n == 256 && std::find(out.begin(), out.end(), 31) == out.end()) out.push_back(31);
  return out;
}

}  // namespace

TuningHardware tuning_hardware(Context& ctx) {
  TuningHardware hw;
  hw.arch = ctx.target().arch();
  hw.sm_count = ctx.sm_count();
  hw.driver_version = ctx.has_gpu() ? detail::Driver::get().driver_version : 0;
  hw.twell_version = TWELL_VERSION;
  hw.device_name = ctx.device_name();
  return hw;
}

TuneResult Context::tune(const TuneRequest& request) { return twell::tune(*this, request); }

TuneResult tune(Context& ctx, const TuneRequest& r) {
  const auto start = Clock::now();
  auto say = [&](const std::string& line) {
    if (r.progress) r.progress(line);
  };
  if (!ctx.has_gpu()) throw Error(ErrorCode::NoDevice, "tune: needs a GPU (" + ctx.no_gpu_reason() + ")");
  FfnSpec spec = r.spec;
  spec.tile_n.reset();
  spec.slots.reset();
  spec.consumer.reset();
  spec.gate_cluster_m.reset();
  if (const std::string e = kernels::validate_spec(spec, "spec."); !e.empty()) bad(e);
  if (r.tokens.empty()) bad("tokens: expected at least one token count, got none");
  std::vector<int64_t> buckets;
  for (int64_t t : r.tokens) {
    if (t < 1 || t > (int64_t{1} << 24)) bad(fmt::format("tokens: expected counts in 1..{}, got {}", int64_t{1} << 24, t));
    buckets.push_back(static_cast<int64_t>(std::bit_ceil(static_cast<uint64_t>(t))));
  }
  std::sort(buckets.begin(), buckets.end());
  buckets.erase(std::unique(buckets.begin(), buckets.end()), buckets.end());
  if (!r.layer && !(r.density > 0 && r.density < 1)) bad(fmt::format("density: expected a fraction in (0, 1), got {}", r.density));
  if (r.reps < 1 || r.reps > 1000) bad(fmt::format("reps: expected 1..1000, got {}", r.reps));
  if (r.budget_s < 0) bad(fmt::format("budget_s: expected >= 0 (0: no limit), got {}", r.budget_s));

  TuneResult result;
  result.hardware = tuning_hardware(ctx);
  const int64_t max_m = buckets.back();
  const HostInputs in = r.layer ? layer_inputs(spec, *r.layer, max_m) : random_inputs(spec, max_m, r.density);
  result.workload = in.workload;
  say(fmt::format("tune: d_model {} d_ff {} {} {} threshold {} on {} ({} SMs), workload {}, buckets {}", spec.d_model, spec.d_ff,
                  to_string(spec.dtype), to_string(spec.activation), spec.threshold, result.hardware.device_name,
                  result.hardware.sm_count, in.workload, fmt::join(buckets, ", ")));

  // Device inputs. x and y rotate through max_m rows: a bucket of m rows takes successive m-row
  // windows, so repeated calls do not find their x in L2 (the weights, tens of MB, are read each call).
  StreamHandle stream(ctx);
  DeviceMemory x(ctx, in.x.size() * 2), wg(ctx, in.w_gate.size() * 2), wd(ctx, in.w_down.size() * 2),
      y(ctx, size_t(max_m) * spec.d_model * 2);
  std::optional<DeviceMemory> wu;
  x.upload(in.x);
  wg.upload(in.w_gate);
  wd.upload(in.w_down);
  if (spec.gated) {
    wu.emplace(ctx, in.w_up.size() * 2);
    wu->upload(in.w_up);
  }
  // The weights ordered hot-first (the hot/cold split's candidates), once the layer's activity is known.
  std::optional<DeviceMemory> wg_hot, wu_hot, wd_hot;
  auto tensors = [&](int64_t window, int64_t m, bool hot_first = false) {
    const int64_t windows = std::max<int64_t>(1, max_m / m);
    const size_t offset = size_t(window % windows) * m * spec.d_model;
    FfnTensors t;
    t.x = static_cast<const uint16_t*>(x.data()) + offset;
    t.w_gate = hot_first ? wg_hot->data() : wg.data();
    t.w_up = spec.gated ? (hot_first ? wu_hot->data() : wu->data()) : nullptr;
    t.w_down = hot_first ? wd_hot->data() : wd.data();
    t.y = static_cast<uint16_t*>(y.data()) + offset;
    return t;
  };
  // The rows of y a candidate is checked on: all of a call of up to 16384 rows, else the first and the
  // last 8192 (rows are independent; these hold the first and last tiles of every kernel's grid, the
  // overflow backup's first and last slots), so a check costs milliseconds, not seconds, at M = 131072.
  auto download_y = [&](int64_t m) {
    const int64_t part = m <= 16384 ? m : 8192;
    std::vector<uint16_t> bits(size_t(m <= 16384 ? m : 2 * part) * spec.d_model);
    const size_t part_bytes = size_t(part) * spec.d_model * 2;
    y.download(bits.data(), part_bytes);
    if (m > 16384) y.download(bits.data() + size_t(part) * spec.d_model, part_bytes, size_t(m - part) * spec.d_model * 2);
    std::vector<float> out(bits.size());
    for (size_t i = 0; i < bits.size(); ++i) out[i] = to_float(spec.dtype, bits[i]);
    return out;
  };
  // Times fn(window) for one bucket: GPU time (time_on_stream), median of reps; outliers counted.
  auto time_bucket = [&](const std::function<void(int64_t)>& fn) {
    int64_t window = 0;
    const auto ms = time_on_stream(stream.get(), [&] { fn(window++); }, 1, r.reps);
    const double median = ms[ms.size() / 2];
    for (double t : ms) result.outliers += t > 1.5 * median;
    return median;
  };

  // The reference per bucket (cuBLASLt's dense FFN on the first window) and the dense path's time.
  std::map<int64_t, std::vector<float>> reference;
  std::map<int64_t, double> dense_ms;
  {
    DenseFfn ref(ctx, spec, max_m, DenseKernels::CuBlasLt);
    DenseFfn fused(ctx, spec, max_m, DenseKernels::FusedGatedUp);
    for (int64_t m : buckets) {
      y.fill(0xFF);
      ref.run(stream.get(), tensors(0, m), m);
      stream.synchronize();
      reference[m] = download_y(m);
      dense_ms[m] = time_bucket([&](int64_t w) { fused.run(stream.get(), tensors(w, m), m); });
    }
  }
  // Mean nnz per neuron-tile: measured where the inputs are real (one sparse run of the default
  // layout), else the requested density.
  double density = r.density;
  // A real layer's hot/cold split points worth timing (PlanOptions::dense_neurons; none for uniform
  // inputs, which have no hot neurons): the cost model's choice (choose_dense_neurons) and half and
  // one and a half times it, with the weights ordered hot-first by the activity of the probe's rows.
  std::vector<int64_t> split_points;
  if (r.layer) {
    FfnPlan probe = ctx.plan(spec, std::min<int64_t>(max_m, 16384), sparse_options(0));
    const int64_t m = std::min<int64_t>(max_m, 16384);
    probe.run(stream.get(), tensors(0, m), m);
    const TwellMatrix h = probe.download_twell(stream.get());
    const int64_t wpr = h.layout.words_per_row(h.d_ff);
    uint64_t nnz = 0;
    for (int64_t row = 0; row < h.rows; ++row)
      for (int64_t t = 0; t < h.layout.tiles(h.d_ff); ++t) nnz += h.words[row * wpr + t * (h.layout.slots + 1)];
    density = double(nnz) / (double(h.rows) * h.d_ff);
    say(fmt::format("  measured density {:.3f}% over {} rows", 100 * density, h.rows));
    try {
      const std::vector<uint64_t> activity = neuron_activity(h);
      const std::vector<int64_t> order = hot_first_order(activity);
      const int64_t chosen = choose_dense_neurons(spec, m, in_order(activity, order), h.rows);
      for (int64_t n : {chosen / 2, chosen, chosen * 3 / 2}) {
        n = std::min(n / 64 * 64, (spec.d_ff - 1) / 64 * 64);
        if (n > 0 && std::find(split_points.begin(), split_points.end(), n) == split_points.end()) split_points.push_back(n);
      }
      if (!split_points.empty()) {
        std::vector<uint16_t> g = in.w_gate, u = in.w_up, d = in.w_down;
        permute_neurons(spec, order, g, u, d);
        wg_hot.emplace(ctx, g.size() * 2);
        wg_hot->upload(g);
        wd_hot.emplace(ctx, d.size() * 2);
        wd_hot->upload(d);
        if (spec.gated) {
          wu_hot.emplace(ctx, u.size() * 2);
          wu_hot->upload(u);
        }
      }
      say(fmt::format("  hot/cold split: the cost model chooses {} dense neurons; timing {}", chosen,
                      split_points.empty() ? std::string("no split") : fmt::format("{}", fmt::join(split_points, ", "))));
    } catch (const Error& e) {  // e.g. a tile-row that overflowed a full backup: its nonzeros are unknown
      split_points.clear();
      say(fmt::format("  hot/cold split not tuned: {}", std::string(e.what()).substr(0, 200)));
    }
  }

  // The configuration space the contracts allow on this target, pruned by the cost model: slots far
  // below the mean nnz (nearly every tile-row overflows) are not tried.
  const bool hopper = ctx.target().sm == 90 && ctx.target().arch_specific;
  std::vector<TunedConfig> configs;
  for (int tile_n : {64, 128, 256, 512}) {
    const double mean = density * tile_n;
    for (int slots : slot_candidates(mean, tile_n))
      for (int cluster : hopper ? std::vector<int>{1, 2} : std::vector<int>{1})
        for (ConsumerVariant consumer : {ConsumerVariant::RowGather, ConsumerVariant::TokenBlock}) {
          FfnSpec s = spec;
          s.tile_n = tile_n;
          s.slots = slots;
          s.gate_cluster_m = cluster;
          s.consumer = consumer;
          if (!kernels::validate_spec(s, "").empty()) continue;  // not legal for these fields
          // Clusters are the wgmma gate's (the generator refuses cluster 2 where the gate is another).
          if (cluster == 2 && !kernels::WgmmaGateConstraints::allowed(spec.d_model, tile_n)) continue;
          ++result.configurations;
          const bool default_layout = tile_n == 256 && slots == 31;
          if (slots < mean / 2 && !default_layout) {
            ++result.pruned;
            continue;
          }
          configs.push_back(TunedConfig{TunedConfig::Path::TwELL, tile_n, slots, cluster, consumer, 0, 0});
        }
  }
  // The generator's default layout first, then by distance from the expected nnz per tile-row: under a
  // budget the likeliest winners are timed first.
  std::stable_sort(configs.begin(), configs.end(), [&](const TunedConfig& x, const TunedConfig& y) {
    auto rank = [&](const TunedConfig& c) {
      if (c.tile_n == 256 && c.slots == 31) return -1.0;
      return std::abs(std::log2((c.slots + 1.0) / (density * c.tile_n + 1.0)));
    };
    return rank(x) < rank(y);
  });
  // The split candidates right after the default layout (timed before the budget can run out): the
  // cold part's layout is the default tile width with the default and a halved slot count (the cold
  // neurons are sparser), the row consumer (the token block is not timed with a split by Dispatch::Sparse).
  {
    std::vector<TunedConfig> split;
    const int cluster = hopper && kernels::WgmmaGateConstraints::allowed(spec.d_model, 256) ? 2 : 1;
    for (int64_t n : split_points)
      for (int slots : {15, 31}) {
        FfnSpec s = spec;
        s.d_ff = spec.d_ff - n;
        s.tile_n = 256;
        s.slots = slots;
        s.gate_cluster_m = cluster;
        s.consumer = ConsumerVariant::RowGather;
        if (!kernels::validate_spec(s, "").empty()) continue;
        ++result.configurations;
        TunedConfig c{TunedConfig::Path::TwELL, 256, slots, cluster, ConsumerVariant::RowGather, 0, 0.0, n};
        split.push_back(c);
      }
    configs.insert(configs.begin() + std::min<size_t>(1, configs.size()), split.begin(), split.end());
  }
  say(fmt::format("  {} configurations legal here, {} pruned by the cost model, {} to compile", result.configurations,
                  result.pruned, configs.size()));

  // Compile the candidates' plans in parallel (NVRTC in threads; the cache serializes identical kernels).
  const auto before = ctx.cache_counters();
  auto spec_of = [&](const TunedConfig& c) {
    FfnSpec s = spec;
    s.tile_n = c.tile_n;
    s.slots = c.slots;
    s.gate_cluster_m = c.cluster_m;
    s.consumer = c.consumer;
    return s;
  };
  // Compile every candidate's kernels in parallel (NVRTC in threads; Context::plan is thread-safe and
  // the cache serializes identical kernels). The plans made here hold one token row: no workspace.
  std::vector<std::string> compile_error(configs.size());
  {
    const unsigned threads = r.compile_threads > 0 ? unsigned(r.compile_threads) : std::max(1u, std::thread::hardware_concurrency());
    std::atomic<size_t> next{0};
    auto work = [&] {
      for (size_t k = next++; k < configs.size(); k = next++) {
        if (r.budget_s > 0 && seconds_since(start) > r.budget_s) {
          compile_error[k] = "budget";
          continue;
        }
        try {
          ctx.plan(spec_of(configs[k]), 1, sparse_options(64, configs[k].dense_neurons));
        } catch (const std::exception& e) {  // not only twell::Error: nothing may escape a thread
          compile_error[k] = e.what();
        }
      }
    };
    std::vector<std::thread> pool;
    try {
      for (unsigned i = 1; i < std::min<size_t>(threads, configs.size()); ++i) pool.emplace_back(work);
    } catch (const std::system_error&) {
      // Fewer threads than asked: those running (and this one) share the work.
    }
    work();
    for (auto& t : pool) t.join();
  }
  result.compiled = static_cast<int>(ctx.cache_counters().misses - before.misses);
  for (size_t k = 0; k < configs.size(); ++k)
    if (!compile_error[k].empty() && compile_error[k] != "budget")
      say(fmt::format("  {} not built: {}", describe(configs[k]), compile_error[k].substr(0, 300)));
  say(fmt::format("  compiled: {} kernels in {:.1f} s (cache misses)", result.compiled, seconds_since(start)));

  // Per bucket, the times of the heuristic's plan (no database: what an untuned plan runs), of the dense
  // path, and of every candidate that agrees with the reference.
  std::map<int64_t, TunedBucket> per_bucket;
  std::map<int64_t, std::vector<TunedConfig>> ranked;
  {
    PlanOptions heuristic_options;
    heuristic_options.tuning = PlanOptions::Tuning::Ignore;
    FfnPlan heuristic = ctx.plan(spec, max_m, heuristic_options);
    for (int64_t m : buckets) {
      TunedBucket& b = per_bucket[m];
      b.tokens = m;
      b.dense_ms = dense_ms[m];
      b.heuristic_ms = time_bucket([&](int64_t w) { heuristic.run(stream.get(), tensors(w, m), m); });
      TunedConfig h;
      h.path = TunedConfig::Path::Heuristic;
      h.ms = b.heuristic_ms;
      ranked[m].push_back(h);
      TunedConfig dense;
      dense.path = TunedConfig::Path::Dense;
      dense.ms = b.dense_ms;
      ranked[m].push_back(dense);
    }
  }
  // One plan at one bucket: checked against the reference on the first window (a configuration that
  // changes results is rejected, not ranked), then timed over rotating windows.
  auto evaluate = [&](FfnPlan& plan, TunedConfig config, int64_t m) {
    TunedBucket& b = per_bucket[m];
    ++b.candidates;
    y.fill(0xFF);
    const bool hot_first = config.dense_neurons > 0;
    plan.run(stream.get(), tensors(0, m, hot_first), m);
    stream.synchronize();
    const double err = relative_error(download_y(m), reference[m]);
    if (!(err <= 1e-2)) {  // NaN rejects too
      ++b.rejected;
      say(fmt::format("  M={}: {} rejected: relative error {:.3e} against the reference", m, describe(config), err));
      return;
    }
    config.ms = time_bucket([&](int64_t w) { plan.run(stream.get(), tensors(w, m, hot_first), m); });
    ranked[m].push_back(config);
  };
  // Candidate by candidate, one max_m plan alive at a time (its workspace, then the next one's).
  size_t timed = 0;
  for (size_t k = 0; k < configs.size(); ++k) {
    if (!compile_error[k].empty() || (r.budget_s > 0 && seconds_since(start) > r.budget_s)) {
      ++result.pruned;
      continue;
    }
    try {
      const int64_t split = configs[k].dense_neurons;
      FfnPlan plan = ctx.plan(spec_of(configs[k]), max_m, sparse_options(64, split));
      std::optional<FfnPlan> no_decode;
      for (int64_t m : buckets) {
        // Calls of at most 64 rows take the decode kernels of a plan that has them (the row consumer's;
        // the token block has none); the same configuration without them is the other candidate.
        const bool decode = m <= 64 && configs[k].consumer == ConsumerVariant::RowGather;
        TunedConfig config = configs[k];
        config.decode_max_tokens = decode ? 64 : 0;
        evaluate(plan, config, m);
        if (decode) {
          if (!no_decode) no_decode.emplace(ctx.plan(spec_of(configs[k]), max_m, sparse_options(0, split)));
          config.decode_max_tokens = 0;
          evaluate(*no_decode, config, m);
        }
      }
    } catch (const Error& e) {  // e.g. out of memory for this layout's workspace: the others go on
      say(fmt::format("  {} skipped: {}", describe(configs[k]), std::string(e.what()).substr(0, 300)));
      continue;
    }
    if (++timed % 8 == 0 || k + 1 == configs.size()) {
      const double left = r.budget_s > 0 ? std::max(0.0, r.budget_s - seconds_since(start)) : 0;
      say(fmt::format("  timed {} of {} candidates ({:.0f} s elapsed{})", timed, configs.size(), seconds_since(start),
                      r.budget_s > 0 ? fmt::format(", {:.0f} s left", left) : std::string()));
    }
  }
  for (int64_t m : buckets) {
    TunedBucket& b = per_bucket[m];
    auto& list = ranked[m];
    // Ties go to the heuristic's plan (first in the list: stable sort), then to the dense path.
    std::stable_sort(list.begin(), list.end(), [](const auto& x, const auto& y) { return x.ms < y.ms; });
    b.winner = list[0];
    if (list.size() > 1) b.runner_up = list[1];
    say(fmt::format("  M={:>6}: {:.4f} ms {} | runner-up {:.4f} ms | heuristic {:.4f} ms, dense {:.4f} ms ({} timed, {} "
                    "rejected)", m, b.winner.ms, describe(b.winner), b.runner_up ? b.runner_up->ms : 0.0, b.heuristic_ms,
                    b.dense_ms, b.candidates, b.rejected));
    result.buckets.push_back(b);
  }
  if (r.write) result.file = TuningDatabase(r.database).store(result.hardware, spec, result.workload, result.buckets);
  result.seconds = seconds_since(start);
  say(fmt::format("tune: done in {:.1f} s{}{}", result.seconds, result.file.empty() ? "" : ", stored in " + result.file.string(),
                  result.outliers ? fmt::format(" ({} timed calls were outliers, above 1.5x their median)", result.outliers)
                                  : std::string()));
  return result;
}

}  // namespace twell
