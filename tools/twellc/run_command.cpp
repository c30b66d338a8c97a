// `twellc run`: the main job. Loads a real layer, measures its sparsity, generates and compiles the
// TwELL kernels, and (with a GPU) runs the TwELL FFN and the dense FFN (the faster of cuBLAS's GEMMs as
// PyTorch calls them and cuBLASLt with its algorithms timed) against the CPU reference. Human-readable progress on stdout, or one JSON document with --json.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <optional>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "commands.h"
#include "twell/context.h"
#include "twell/dense.h"
#include "twell/device_memory.h"
#include "twell/error.h"
#include "twell/half.h"
#include "twell/layer_data.h"
#include "twell/neuron_order.h"
#include "twell/reference.h"

extern "C" const unsigned char twell_sample_begin[];
extern "C" const unsigned char twell_sample_end[];

namespace twellc {
namespace {

using Clock = std::chrono::steady_clock;
double ms_since(Clock::time_point t) { return std::chrono::duration<double, std::milli>(Clock::now() - t).count(); }

const char* kRunHelp =
    "usage: twellc run [FILE.safetensors ...] [options]\n"
    "  With no file, runs on the embedded real sample (layer 1 of model 'tiny', 1024 tokens).\n"
    "  Several files are merged (e.g. the paper model's gate shards and x).\n"
    "  --layer N          which layer (required when the files hold several)\n"
    "  --tile-n T         TwELL tile width (default 256)\n"
    "  --slots S          entries per tile-row (default: chosen from the measured nnz, see output)\n"
    "  --threshold t      sparsity threshold (default 0: relu(g) > 0)\n"
    "  --random-up-down   draw missing up/down weights at random (seeded) instead of failing\n"
    "  --reps R           timed repetitions per path (default 20; median reported)\n"
    "  --dense-neurons N  the hot/cold split (PlanOptions::dense_neurons): N most active neurons run dense,\n"
    "                     a multiple of 64 below d_ff; 'auto' (default): the cost model's choice; 0: none\n"
    "  --json             print one JSON document instead of the report\n";

struct Stats {
  double mean = 0;
  int64_t p99 = 0, max = 0, tile_max = 0, tile_p99 = 0;
  int64_t rows_overflowing = 0, tile_rows_overflowing = 0;
  double density = 0;
};

// nnz statistics of the activated gate a [tokens, d_ff] for a layout (tile width + slots).
Stats sparsity_stats(const std::vector<uint16_t>& a, int64_t tokens, int64_t d_ff, const twell::TwellLayout& l) {
  Stats s;
  std::vector<int64_t> row_nnz(tokens), tile_nnz;
  const int64_t tiles = l.tiles(d_ff);
  for (int64_t r = 0; r < tokens; ++r) {
    bool overflow = false;
    for (int64_t t = 0; t < tiles; ++t) {
      int64_t n = 0;
      for (int64_t c = t * l.tile_n; c < std::min<int64_t>(d_ff, (t + 1) * l.tile_n); ++c) n += twell::is_active(l, a[r * d_ff + c]);
      tile_nnz.push_back(n);
      row_nnz[r] += n;
      if (n > l.slots) {
        ++s.tile_rows_overflowing;
        overflow = true;
      }
    }
    s.rows_overflowing += overflow;
  }
  auto pct = [](std::vector<int64_t> v, double q) {
    if (v.empty()) return int64_t{0};
    std::sort(v.begin(), v.end());
    return v[std::min<size_t>(v.size() - 1, static_cast<size_t>(std::ceil(q * v.size())) - (q > 0 ? 1 : 0))];
  };
  for (int64_t n : row_nnz) s.mean += static_cast<double>(n);
  s.mean = tokens ? s.mean / tokens : 0;
  s.density = s.mean / d_ff;
  s.p99 = pct(row_nnz, 0.99);
  s.max = pct(row_nnz, 1.0);
  s.tile_p99 = pct(tile_nnz, 0.99);
  s.tile_max = pct(tile_nnz, 1.0);
  return s;
}

// Smallest slots of the form 2^k - 1 (one word is the header, so a tile-row is 2^k words) that holds
// at least 99% of tile-rows; the rest go to the overflow path (exact, slower).
int choose_slots(int64_t tile_p99, int tile_n) {
  int words = 8;
  while (words - 1 < tile_p99 && words < tile_n) words *= 2;
  return std::min(words - 1, tile_n);
}

std::vector<float> download_y(twell::DeviceMemory& y, int64_t count, size_t* poisoned) {
  auto bits = y.download_vector<uint16_t>(static_cast<size_t>(count));
  *poisoned = static_cast<size_t>(std::count(bits.begin(), bits.end(), uint16_t{0xFFFF}));
  return twell::to_float(twell::DType::BF16, bits);
}

}  // namespace

int run_command(const std::vector<std::string>& argv) {
  Args args;
  try {
    args = parse_args(argv, {"json", "random-up-down", "help"}, {"layer", "tile-n", "slots", "threshold", "reps", "dense-neurons"});
  } catch (const std::invalid_argument& e) {
    std::fprintf(stderr, "twellc run: %s\n%s", e.what(), kRunHelp);
    return 2;
  }
  if (args.has("help")) {
    std::fputs(kRunHelp, stdout);
    return 0;
  }
  const bool json_out = args.has("json");
  nlohmann::json report;
  auto say = [&](const std::string& line) {
    if (!json_out) std::printf("%s\n", line.c_str());
    std::fflush(stdout);
  };
  try {
    // 1. Load.
    auto t0 = Clock::now();
    std::vector<twell::SafeTensors> files;
    if (args.positional.empty()) {
      files.push_back(twell::SafeTensors::parse(std::vector<uint8_t>(twell_sample_begin, twell_sample_end),
                                                "<embedded sample: tiny_l01 layer 1>"));
    } else {
      for (const auto& f : args.positional) files.push_back(twell::SafeTensors::read(f));
    }
    std::optional<int> layer;
    if (args.has("layer")) layer = static_cast<int>(args.get_int("layer", 0, 0, 1 << 30));
    const twell::LayerData d = twell::load_layer(files, layer, args.has("random-up-down"));
    const int reps = static_cast<int>(args.get_int("reps", 20, 1, 100000));
    say(fmt::format("== twell run: layer {} of {}", d.layer, fmt::join(d.sources, " + ")));
    say(fmt::format("   tokens {}, d_model {}, d_ff {}, bf16{}  (loaded in {:.0f} ms)", d.tokens, d.d_model, d.d_ff,
                    d.random_up_down ? ", up/down weights RANDOM (absent from the files)" : "", ms_since(t0)));
    report["input"] = {{"sources", d.sources}, {"layer", d.layer},       {"tokens", d.tokens},
                       {"d_model", d.d_model}, {"d_ff", d.d_ff},         {"random_up_down", d.random_up_down}};

    // 2. Sparsity of the real activations, and the layout.
    twell::FfnSpec spec;
    spec.d_model = d.d_model;
    spec.d_ff = d.d_ff;
    spec.threshold = static_cast<float>(args.get_double("threshold", 0.0));
    spec.tile_n = static_cast<int>(args.get_int("tile-n", 256, 32, 1024));
    t0 = Clock::now();
    twell::TwellLayout probe = twell::layout_for(spec);
    twell::validate_layout(probe);
    const std::vector<uint16_t> a = twell::reference_gate(spec, d.x, d.tokens, d.w_gate);
    const Stats pre = sparsity_stats(a, d.tokens, d.d_ff, probe);
    spec.slots = static_cast<int>(args.get_int("slots", choose_slots(pre.tile_p99, *spec.tile_n), 1, *spec.tile_n));
    const twell::TwellLayout layout = twell::layout_for(spec);
    twell::validate_layout(layout);
    const Stats st = sparsity_stats(a, d.tokens, d.d_ff, layout);
    const int64_t tile_rows = d.tokens * layout.tiles(d.d_ff);
    say(fmt::format("== sparsity of relu(x Wg^T) (CPU, {:.0f} ms)", ms_since(t0)));
    say(fmt::format("   nnz per row: mean {:.1f} ({:.2f}% dense), p99 {}, max {}", st.mean, 100 * st.density, st.p99, st.max));
    say(fmt::format("   nnz per {}-wide tile-row: p99 {}, max {}", layout.tile_n, st.tile_p99, st.tile_max));
    say(fmt::format("   layout: tile_n {}, slots {} ({}{})", layout.tile_n, layout.slots,
                    args.has("slots") ? "given" : "chosen: smallest 2^k-1 holding 99% of tile-rows",
                    layout.threshold != 0 ? fmt::format(", threshold {}", layout.threshold) : ""));
    say(fmt::format("   overflow: {} of {} rows and {} of {} tile-rows exceed {} slots (routed exactly via the backup)",
                    st.rows_overflowing, d.tokens, st.tile_rows_overflowing, tile_rows, layout.slots));
    report["sparsity"] = {{"nnz_mean", st.mean}, {"density", st.density}, {"nnz_p99", st.p99}, {"nnz_max", st.max},
                          {"tile_nnz_p99", st.tile_p99}, {"tile_nnz_max", st.tile_max},
                          {"rows_overflowing", st.rows_overflowing}, {"tile_rows_overflowing", st.tile_rows_overflowing},
                          {"tile_rows", tile_rows}};
    // The hot/cold split: neuron activity over these tokens, the hot-first order, the cost model's split.
    // The activated gate packed once: the activity counts now, the CPU reference below.
    const twell::TwellMatrix h_ref = twell::pack_twell(layout, a, d.tokens, d.d_ff, UINT32_MAX);
    const std::vector<uint64_t> activity = twell::neuron_activity(h_ref);
    const std::vector<int64_t> order = twell::hot_first_order(activity);
    const std::vector<uint64_t> sorted = twell::in_order(activity, order);
    const std::string split_arg = args.get("dense-neurons", "auto");
    int64_t split = 0;
    if (split_arg == "auto") {
      split = twell::choose_dense_neurons(spec, d.tokens, sorted, d.tokens);
    } else {
      size_t used = 0;
      try {
        split = std::stoll(split_arg, &used);
      } catch (const std::exception&) {
        used = 0;
      }
      if (used == 0 || used != split_arg.size() || split < 0 || split % 64 != 0 || split >= d.d_ff)
        throw std::invalid_argument(fmt::format("--dense-neurons: expected 'auto' or a multiple of 64 in 0..{} (below d_ff = {}), "
                                                "got '{}'", (d.d_ff - 1) / 64 * 64, d.d_ff, split_arg));
    }
    uint64_t total = 0, covered = 0;
    for (size_t i = 0; i < sorted.size(); ++i) (static_cast<int64_t>(i) < split ? covered : total) += sorted[i];
    total += covered;
    const double predicted_split = twell::predict_split_ms(spec, d.tokens, sorted, d.tokens, split);
    const double predicted_twell = twell::predict_split_ms(spec, d.tokens, sorted, d.tokens, 0);
    if (split > 0)
      say(fmt::format("   hot/cold split: the {} most active neurons ({}) hold {:.1f}% of the nonzeros and run dense; cost "
                      "model (H200 rates): {:.3f} ms split vs {:.3f} ms all TwELL",
                      split, split_arg == "auto" ? "the cost model's choice" : "given", total ? 100.0 * covered / total : 0.0,
                      predicted_split, predicted_twell));
    else
      say(fmt::format("   hot/cold split: none ({}; cost model, H200 rates: {:.3f} ms all TwELL)",
                      split_arg == "auto" ? "the cost model keeps every neuron on TwELL" : "given", predicted_twell));
    report["split"] = {{"dense_neurons", split}, {"nonzeros_covered", total ? double(covered) / total : 0.0},
                       {"predicted_ms", predicted_split}, {"predicted_ms_all_twell", predicted_twell}};
    report["layout"] = {{"tile_n", layout.tile_n}, {"slots", layout.slots}, {"value", "bf16"}, {"index_bits", layout.index_bits},
                        {"activation", twell::to_string(layout.activation)}, {"threshold", layout.threshold}};

    // 3. Generate and compile.
    twell::Context ctx;
    t0 = Clock::now();
    twell::PlanOptions options;
    options.dispatch = twell::Dispatch::Sparse;  // the main job runs and checks the TwELL kernels themselves
    twell::FfnPlan plan = ctx.plan(spec, d.tokens, options);
    // The feature set and consumer variant, read off the kernels the plan holds (the first one may be
    // the down-weight transpose).
    bool hopper = false, warp_rows = false, token_block = false;
    for (const auto& k : plan.kernels()) {
      if (k.kind == "gate_twell") hopper = k.threads == 384;
      if (k.kind == "gated_down" || k.kind == "down") {
        warp_rows |= k.consumer == "warp_row";
        token_block |= k.consumer == "token_block";
      }
    }
    say(fmt::format("== kernels for {} ({} gate GEMM with the TwELL epilogue, {} consumers; decode kernels for calls of "
                    "at most 64 tokens), the plan's generated and compiled in {:.0f} ms",
                    ctx.target().arch(),
                    hopper ? "sm_90a feature set: persistent warp-specialized TMA + wgmma"
                           : "portable feature set: mma.sync + cp.async",
                    std::string(warp_rows ? "row-per-warp" : "row-per-CTA") + (token_block ? " and token-block" : ""),
                    ms_since(t0)));
    nlohmann::json kernels = nlohmann::json::array();
    for (const auto& k : plan.kernels()) {
      // The grid the runtime launches (launch.h): a persistent kernel runs grid.y 1, looping over its tiles.
      say(fmt::format("   {:<17} {:<70} cache {:<6} compile {:7.1f} ms  PTX {:6} B  cubin {:6} B  CTA {} rows x {} threads, {}{}",
                      k.kind, k.name, k.cache, k.compile_ms, k.ptx_bytes, k.cubin_bytes, k.cta_m, k.threads,
                      k.persistent ? (k.tiles > 0 ? fmt::format("persistent (grid.y 1, over {} tiles)", k.tiles)
                                                  : std::string("persistent (grid.y 1)"))
                                   : fmt::format("grid.y {}", k.grid_y),
                      k.cluster_m > 1 ? fmt::format(", clusters of {} CTAs", k.cluster_m) : std::string()));
      kernels.push_back({{"kind", k.kind}, {"name", k.name}, {"cache", k.cache}, {"compile_ms", k.compile_ms},
                         {"ptx_bytes", k.ptx_bytes}, {"cubin_bytes", k.cubin_bytes}, {"arch", k.arch},
                         {"cta_m", k.cta_m}, {"threads", k.threads}, {"grid_y", k.grid_y}, {"persistent", k.persistent},
                         {"tiles", k.tiles}, {"consumer", k.consumer}, {"cluster_m", k.cluster_m}});
    }
    report["target"] = ctx.target().arch();
    report["kernels"] = kernels;
    // The split plan's kernels: the TwELL part, d_ff - split neurons (the dense ones go to cuBLASLt).
    std::optional<twell::FfnPlan> split_plan;
    if (split > 0) {
      twell::PlanOptions so = options;
      so.dense_neurons = split;
      t0 = Clock::now();
      split_plan.emplace(ctx.plan(spec, d.tokens, so));
      for (const auto& k : split_plan->kernels())
        if (k.kind != "transpose")
          say(fmt::format("   split: {:<17} {:<70} cache {:<6} compile {:7.1f} ms  (TwELL part: {} neurons)", k.kind, k.name, k.cache,
                          k.compile_ms, d.d_ff - split));
      say(fmt::format("   the split plan's kernels generated and compiled in {:.0f} ms", ms_since(t0)));
    }

    // 4. CPU reference.
    t0 = Clock::now();
    const twell::HostFfnWeights w{d.w_gate, d.w_up, d.w_down};
    // The gate was computed and packed above for the statistics: no recomputation.
    const std::vector<float> y_ref = twell::reference_gated_down(spec, d.x, h_ref, w);
    say(fmt::format("== CPU reference (fp32 accumulate) in {:.0f} ms", ms_since(t0)));

    if (!ctx.has_gpu()) {
      say(fmt::format("== no GPU: {} -- kernels were generated and compiled, nothing was run on a GPU", ctx.no_gpu_reason()));
      report["gpu"] = {{"present", false}, {"reason", ctx.no_gpu_reason()}};
      if (json_out) std::printf("%s\n", report.dump(2, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
      return 0;
    }

    // 5. GPU: TwELL and dense, each checked against the CPU reference, then timed.
    twell::StreamHandle stream(ctx);
    auto upload = [&](const std::vector<uint16_t>& v) {
      twell::DeviceMemory m(ctx, v.size() * 2);
      m.upload(v);
      return m;
    };
    twell::DeviceMemory x = upload(d.x), wg = upload(d.w_gate), wu = upload(d.w_up), wd = upload(d.w_down);
    twell::DeviceMemory y(ctx, static_cast<size_t>(d.tokens * d.d_model) * 2);
    const twell::FfnTensors tensors{x.data(), wg.data(), wu.data(), wd.data(), y.data()};
    const int64_t y_count = d.tokens * d.d_model;

    y.fill(0xFF);  // poison: 0xFFFF is a NaN no correct run writes here
    plan.run(stream.get(), tensors, d.tokens);
    const twell::OverflowReport overflow = plan.last_overflow(stream.get());
    // A call of a few rows may take the fused decode kernel, which makes no TwELL matrix to check.
    if (plan.last_path() != "decode") twell::validate_twell(plan.download_twell(stream.get()));
    size_t poisoned = 0;
    const std::vector<float> y_twell = download_y(y, y_count, &poisoned);
    const double err_twell = twell::relative_error(y_twell, y_ref);
    y.fill(0xFF);
    plan.run(stream.get(), tensors, d.tokens);
    stream.synchronize();
    size_t poisoned2 = 0;
    const bool deterministic = download_y(y, y_count, &poisoned2) == y_twell && poisoned2 == poisoned;  // NaN-free data
    const std::vector<double> t_twell = twell::time_on_stream(stream.get(), [&] { plan.run(stream.get(), tensors, d.tokens); }, 3, reps);

    // The baseline: the faster of cuBLAS's GEMMs as PyTorch's F.linear calls them and cuBLASLt with its
    // candidates timed (dense.h), each checked against the CPU reference.
    double err_dense = 0, med_dense = 0;
    size_t poisoned_dense = 0;
    std::string dense_name;
    for (const auto& [kernels, name] : {std::pair{twell::DenseKernels::CuBlas, "cuBLAS, as PyTorch's F.linear"},
                                        std::pair{twell::DenseKernels::CuBlasLtTuned, "cuBLASLt, algorithms timed"}}) {
      twell::DenseFfn dense(ctx, spec, d.tokens, kernels);
      y.fill(0xFF);
      dense.run(stream.get(), tensors, d.tokens);
      stream.synchronize();
      size_t unwritten = 0;
      const double err = twell::relative_error(download_y(y, y_count, &unwritten), y_ref);
      const auto t = twell::time_on_stream(stream.get(), [&] { dense.run(stream.get(), tensors, d.tokens); }, 3, reps);
      if (dense_name.empty() || t[t.size() / 2] < med_dense) {
        med_dense = t[t.size() / 2];
        dense_name = name;
      }
      err_dense = std::max(err_dense, err);
      poisoned_dense += unwritten;
    }

    // The split: the weights ordered hot-first (the same function), the first `split` neurons dense.
    double err_split = 0, med_split = 0;
    size_t poisoned_split = 0;
    bool deterministic_split = true;
    if (split > 0) {
      twell::FfnSpec ps = spec;
      std::vector<uint16_t> pg = d.w_gate, pu = d.w_up, pd = d.w_down;
      twell::permute_neurons(ps, order, pg, pu, pd);
      twell::DeviceMemory pwg = upload(pg), pwu = upload(pu), pwd = upload(pd);
      const twell::FfnTensors pt{x.data(), pwg.data(), pwu.data(), pwd.data(), y.data()};
      split_plan->run(stream.get(), pt, d.tokens);
      split_plan->last_overflow(stream.get());  // grows the backup for the next run if needed (never wrong)
      y.fill(0xFF);
      split_plan->run(stream.get(), pt, d.tokens);
      stream.synchronize();
      const std::vector<float> y_split = download_y(y, y_count, &poisoned_split);
      err_split = twell::relative_error(y_split, y_ref);  // against the reference of the original weights
      y.fill(0xFF);
      split_plan->run(stream.get(), pt, d.tokens);
      stream.synchronize();
      size_t again = 0;
      deterministic_split = download_y(y, y_count, &again) == y_split && again == poisoned_split;
      const auto t_split = twell::time_on_stream(stream.get(), [&] { split_plan->run(stream.get(), pt, d.tokens); }, 3, reps);
      med_split = t_split[t_split.size() / 2];
    }

    // Decoding: the first rows again as a call of their own, which takes the decode kernels
    // (PlanOptions::decode_max_tokens): the four decode kernels give the same bits as those rows of the
    // full run (rows are independent, and they repeat the large-M kernels' arithmetic); the fused one
    // (decode_fused_max_tokens, where it fits) sums in another order: within 1e-2 of them. Then both
    // paths timed from a CUDA graph (host launch overhead excluded; twell::time_graph_on_stream).
    const int64_t decode_rows = std::min<int64_t>(8, d.tokens);
    bool has_decode = false;
    for (const auto& k : plan.kernels()) has_decode |= k.kind == "decode_gate";
    bool decode_same = true, decode_fused = false;
    double decode_err = 0;
    double med_decode = 0, med_decode_dense = 0;
    if (has_decode) {
      y.fill(0xFF);
      plan.run(stream.get(), tensors, decode_rows);
      stream.synchronize();
      decode_fused = plan.last_path() == "decode";  // the fused kernel (no TwELL matrix)
      size_t poisoned_decode = 0;
      const std::vector<float> y_decode = download_y(y, decode_rows * d.d_model, &poisoned_decode);
      const std::vector<float> y_rows(y_twell.begin(), y_twell.begin() + static_cast<std::ptrdiff_t>(y_decode.size()));
      decode_err = twell::relative_error(y_decode, y_rows);
      decode_same = poisoned_decode == 0 && (decode_fused ? decode_err < 1e-2 : y_decode == y_rows);
      twell::DenseFfn small_dense(ctx, spec, decode_rows, twell::DenseKernels::CuBlas);
      const auto t_decode = twell::time_graph_on_stream(stream.get(), [&] { plan.run(stream.get(), tensors, decode_rows); }, 10, reps);
      const auto t_small = twell::time_graph_on_stream(stream.get(), [&] { small_dense.run(stream.get(), tensors, decode_rows); }, 10, reps);
      med_decode = t_decode[t_decode.size() / 2];
      med_decode_dense = t_small[t_small.size() / 2];
    }

    const double med_twell = t_twell[t_twell.size() / 2];
    say(fmt::format("== GPU: {} ({} SMs)", ctx.device_name(), ctx.sm_count()));
    say(fmt::format("   TwELL FFN   rel. error vs CPU reference {:.3e}  unwritten outputs {}  bitwise deterministic {}  "
                    "median {:.3f} ms over {} runs",
                    err_twell, poisoned, deterministic ? "yes" : "NO", med_twell, reps));
    say(fmt::format("   dense FFN   rel. error vs CPU reference {:.3e}  unwritten outputs {}  median {:.3f} ms (the faster of cuBLAS "
                    "and tuned cuBLASLt: {})", err_dense, poisoned_dense, med_dense, dense_name));
    if (split > 0)
      say(fmt::format("   split FFN   rel. error vs CPU reference {:.3e}  unwritten outputs {}  bitwise deterministic {}  "
                      "median {:.3f} ms  ({} neurons dense, weights ordered hot-first)",
                      err_split, poisoned_split, deterministic_split ? "yes" : "NO", med_split, split));
    say(fmt::format("   overflow: {} tile-rows reported by the gate kernel (CPU: {}), backup capacity {}{}",
                    overflow.overflowing_tile_rows, st.tile_rows_overflowing, overflow.backup_capacity,
                    overflow.recomputed ? " (full: the rest were recomputed by the consumer)" : ""));
    if (has_decode)
      say(fmt::format("   decode      the first {} rows as one call ({}): {} (rel. error {:.1e});  "
                      "{:.1f} us vs dense {:.1f} us per call (CUDA graph)",
                      decode_rows, decode_fused ? "the fused decode kernel" : "the four decode kernels",
                      decode_fused ? (decode_same ? "within 1e-2 of the full run's rows" : "NOT within 1e-2 of the full run's rows")
                                   : (decode_same ? "the same bits as the full run's rows" : "NOT the same bits as the full run's rows"),
                      decode_err, 1e3 * med_decode, 1e3 * med_decode_dense));
    const double best = split > 0 ? std::min(med_twell, med_split) : med_twell;
    say(fmt::format("   speed: TwELL takes {:.2f}x the dense time{}{}", med_twell / med_dense,
                    split > 0 ? fmt::format(", the split {:.2f}x", med_split / med_dense) : std::string(),
                    best < med_dense ? "" : " (Dispatch::Auto, the default of the runtime API, would pick dense here)"));
    const bool ok = err_twell < 1e-2 && err_dense < 1e-2 && poisoned == 0 && poisoned_dense == 0 && deterministic &&
                    err_split < 1e-2 && poisoned_split == 0 && deterministic_split && decode_same;
    say(ok ? fmt::format("== PASS: TwELL{} and dense agree with the CPU reference (rel. error < 1e-2)", split > 0 ? ", split" : "")
           : std::string("== FAIL: see above"));
    report["gpu"] = {{"present", true}, {"device", ctx.device_name()}, {"sm_count", ctx.sm_count()},
                     {"twell", {{"rel_error", err_twell}, {"unwritten", poisoned}, {"deterministic", deterministic},
                                {"median_ms", med_twell}, {"overflow_tile_rows", overflow.overflowing_tile_rows},
                                {"backup_capacity", overflow.backup_capacity}}},
                     {"dense", {{"rel_error", err_dense}, {"unwritten", poisoned_dense}, {"median_ms", med_dense}, {"kernels", dense_name}}},
                     {"split", split > 0 ? nlohmann::json{{"dense_neurons", split}, {"rel_error", err_split},
                                                          {"unwritten", poisoned_split}, {"deterministic", deterministic_split},
                                                          {"median_ms", med_split}}
                                         : nlohmann::json(nullptr)},
                     {"decode", has_decode ? nlohmann::json{{"rows", decode_rows}, {"fused", decode_fused}, {"agrees_with_full_run", decode_same},
                                                            {"relative_error", decode_err},
                                                            {"median_us", 1e3 * med_decode}, {"dense_median_us", 1e3 * med_decode_dense}}
                                           : nlohmann::json(nullptr)},
                     {"reps", reps}, {"pass", ok}};
    if (json_out) std::printf("%s\n", report.dump(2, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
    return ok ? 0 : 1;
  } catch (const twell::Error& e) {
    std::fprintf(stderr, "twellc run: error: %s\n", e.what());
    return 1;
  } catch (const std::invalid_argument& e) {
    std::fprintf(stderr, "twellc run: %s\n", e.what());
    return 2;
  }
}

}  // namespace twellc
