// `twellc compile`: ahead-of-time bundles. For each target, the kernels every plan of the layer needs
// (the gate, the consumers, the decode kernels, the transpose, the dense path's kernels, the neuron
// reordering), compiled by NVRTC, written with a manifest.json into DIR/<target>/ (README.md,
// "Ahead-of-time bundles"). Needs no GPU. A program linking twell::runtime alone loads the result.
#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "bundle_tuning.h"
#include "commands.h"
#include "mlir_input.h"
#include "twell/compiler/Generate.h"
#include "twell/context.h"
#include "twell/error.h"
#include "twell/kernels/constraints.h"
#include "twell/layer_data.h"
#include "twell/safetensors.h"
#include "twell/training_plan.h"
#include "twell/tuning.h"

// The embedded sample (sample.S): what `twellc run` runs without files.
extern "C" const unsigned char twell_sample_begin[];
extern "C" const unsigned char twell_sample_end[];

namespace twellc {

namespace {

const char* kCompileHelp =
    "usage: twellc compile --d-model D --d-ff F [options] -o DIR    from a shape\n"
    "       twellc compile --sample [options] -o DIR                the embedded sample's shape (twellc run)\n"
    "       twellc compile FILE.mlir [options] -o DIR               the kernels of a twell dialect file (its consumer\n"
    "                                                               must read an in_out Wd); prints the FfnSpec plans "
    "use\n"
    "  -o DIR, --out DIR       write one bundle per target into DIR/<target>/ (manifest.json, .cubin, .ptx, .cu)\n"
    "  --target LIST           comma-separated targets (default sm_90a), e.g. sm_90a,sm_80\n"
    "  --max-tokens M          the plans' max_tokens (default 131072; only sizes workspaces, not kernels)\n"
    "  --dense-neurons K       also the kernels of plans with PlanOptions::dense_neurons = K (the hot/cold split)\n"
    "  --training              also the kernels of FfnTrainingPlan (twell/training_plan.h) with dispatch Auto: the\n"
    "                          training kernels and the dense training path's (with --dense-neurons, the split's too),\n"
    "                          so that a context without the JIT can make training plans from the bundle\n"
    "  --tuning-dir DIR        embed the tuned choices of the tuning database DIR (twellc tune's) for this spec and\n"
    "                          each target, and compile their layouts' kernels too: the file of the target's arch,\n"
    "                          this twell version and spec (any SM count and driver; the most recent of several).\n"
    "                          Plans made from the bundle take them where the machine's own database has no entry\n"
    "  --tuning-workload W     embed only workload W of that file (default: all of its workloads)\n"
    "  shape options: --tile-n T --slots S --threshold t --activation relu|silu --dtype bf16|f16\n"
    "                 --down-layout out_in|in_out --non-gated --consumer rows|block --cluster-m 1|2\n"
    "  The runtime finds a bundle's kernels for exactly this spec (shape and options as given here).\n";

std::vector<twell::Target> parse_targets(const std::string& list) {
  std::vector<twell::Target> targets;
  if (list.empty() || list.back() == ',')
    throw std::invalid_argument(fmt::format("--target: expected a comma-separated list like sm_90a,sm_80, got '{}'", list));
  std::stringstream in(list);
  std::string item;
  while (std::getline(in, item, ',')) {
    const twell::Target t = parse_target(item);
    if (!twell::kernels::SupportedArchs::isSupported(t.sm, t.arch_specific))
      throw std::invalid_argument(fmt::format("--target: expected one of {}, got '{}'", twell::kernels::SupportedArchs::list(), item));
    for (const auto& seen : targets)
      if (seen.arch() == t.arch()) throw std::invalid_argument(fmt::format("--target: {} given twice", item));
    targets.push_back(t);
  }
  if (targets.empty()) throw std::invalid_argument(fmt::format("--target: expected a comma-separated list like sm_90a,sm_80, got '{}'", list));
  return targets;
}

// The kernels of a .mlir file as the kernel set of the FfnSpec a plan would ask them for: its shape,
// numerics, layout (tile_n and slots), consumer variant and gate cluster, an in_out consumer (plans
// transpose an out_in Wd) and the user's Wd layout as its decode kernels read it. Prints that spec.
twell::FfnSpec add_mlir_kernels(twell::Context& ctx, const std::string& text, const std::string& file, const twell::Target& target) {
  const twell::compiler::GeneratedFfn gen = twell::compiler::generateFromMlir(text, file, target);
  const twell::kernels::KernelSource& gate = gen.kernels.at(0);
  const twell::kernels::KernelSource& consumer = gen.kernels.at(1);
  if (!consumer.down_in_out)
    throw twell::Error(twell::ErrorCode::InvalidArgument,
                       fmt::format("FILE.mlir: {}: a plan's consumer reads an in_out w_down (it transposes an out_in one first): "
                                   "expected down_layout = #twell.down_layout<in_out> on the consumer, got out_in", file));
  twell::FfnSpec spec;
  spec.d_model = gate.d_model;
  spec.d_ff = gate.d_ff;
  spec.gated = consumer.gated;
  spec.activation = gen.layout.activation;
  spec.threshold = gen.layout.threshold;
  spec.dtype = gen.layout.value;
  spec.down_layout = twell::WeightLayout::InOut;
  spec.tile_n = gen.layout.tile_n;
  spec.slots = gen.layout.slots;
  spec.consumer = consumer.consumer == twell::kernels::ConsumerKind::TokenBlock ? twell::ConsumerVariant::TokenBlock
                                                                               : twell::ConsumerVariant::RowGather;
  if (gate.mainloop == twell::kernels::GateMainloop::Wgmma) spec.gate_cluster_m = gate.cluster_m;
  // The decode kernels read w_down as the user gives it: the plans of this bundle take that layout.
  const twell::WeightLayout user_layout =
      gen.decode.empty() || gen.decode.front().down_in_out ? twell::WeightLayout::InOut : twell::WeightLayout::OutIn;
  ctx.add_kernels(spec, gen, user_layout);
  spec.down_layout = user_layout;
  std::printf("%s: the plans that take these kernels: FfnSpec{d_model %lld, d_ff %lld, gated %d, %s, threshold %a, %s, "
              "down_layout %s, tile_n %d, slots %d, consumer %s%s}\n",
              target.arch().c_str(), static_cast<long long>(spec.d_model), static_cast<long long>(spec.d_ff), spec.gated ? 1 : 0,
              twell::to_string(spec.activation), static_cast<double>(spec.threshold), twell::to_string(spec.dtype),
              twell::to_string(spec.down_layout), *spec.tile_n, *spec.slots, twell::to_string(*spec.consumer),
              spec.gate_cluster_m ? fmt::format(", gate_cluster_m {}", *spec.gate_cluster_m).c_str() : "");
  return spec;
}

}  // namespace

int compile_command(const std::vector<std::string>& argv) {
  try {
    std::vector<std::string> valued{"target",         "out", "o", "max-tokens", "dense-neurons", "tuning-dir",
                                    "tuning-workload"};
    valued.insert(valued.end(), kShapeValueOptions.begin(), kShapeValueOptions.end());
    // -o is spelled like the other options' short form would be; parse_args takes --name only.
    std::vector<std::string> args_in = argv;
    for (auto& a : args_in)
      if (a == "-o") a = "--o";
    const Args args = parse_args(args_in, {"help", "non-gated", "sample", "training"}, valued);
    if (args.has("help")) {
      std::fputs(kCompileHelp, stdout);
      return 0;
    }
    if (args.positional.size() > 1)
      throw std::invalid_argument(fmt::format("expected at most one FILE.mlir, got {}", args.positional.size()));
    std::string mlir_file, mlir_text;
    if (!args.positional.empty()) {
      mlir_file = args.positional[0];
      for (const auto& o : kShapeOptions)
        if (args.has(o))
          throw std::invalid_argument(fmt::format("--{}: shape options describe an FFN without a .mlir file; '{}' already "
                                                  "describes one", o, mlir_file));
      if (args.has("sample")) throw std::invalid_argument("--sample: expected it or FILE.mlir, got both");
      mlir_text = read_mlir_file(mlir_file);
    }
    if (args.has("o") && args.has("out")) throw std::invalid_argument("-o and --out: expected one of them, got both");
    const std::string out = args.has("o") ? args.get("o") : args.get("out");
    if (out.empty()) throw std::invalid_argument("-o DIR: expected the output directory, got none");
    const auto targets = parse_targets(args.get("target", "sm_90a"));
    twell::FfnSpec spec;
    if (args.has("sample")) {
      for (const auto& o : {"d-model", "d-ff"})
        if (args.has(o)) throw std::invalid_argument(fmt::format("--{}: --sample gives the shape, got both", o));
      const twell::LayerData d = twell::load_layer(
          {twell::SafeTensors::parse(std::vector<uint8_t>(twell_sample_begin, twell_sample_end), "<embedded sample>")},
          std::nullopt, false);
      std::vector<std::string> with_shape(args_in);
      with_shape.insert(with_shape.end(), {"--d-model", std::to_string(d.d_model), "--d-ff", std::to_string(d.d_ff)});
      std::vector<std::string> flags{"help", "non-gated", "sample", "training"};
      spec = spec_from_args(parse_args(with_shape, flags, valued));
    } else if (mlir_file.empty()) {
      spec = spec_from_args(args);
    }
    const std::string tuning_dir = args.get("tuning-dir", "");
    // An empty value would read as the option left out: no tuned choices, or every workload, silently.
    if (args.has("tuning-dir") && tuning_dir.empty())
      throw std::invalid_argument("--tuning-dir: expected a tuning database directory (twellc tune's), got ''");
    if (args.has("tuning-workload") && args.get("tuning-workload", "").empty())
      throw std::invalid_argument(
          "--tuning-workload: expected a workload name (e.g. density:0.5%, pattern:<16 hex>), got '' (leave the option out "
          "for every workload)");
    if (args.has("tuning-workload") && tuning_dir.empty())
      throw std::invalid_argument("--tuning-workload: expected with --tuning-dir, got it alone");
    if (!tuning_dir.empty()) {
      if (!mlir_file.empty())
        throw std::invalid_argument(
            fmt::format("--tuning-dir: expected a shape (--d-model/--d-ff or --sample), got '{}', whose "
                        "kernels carry their own configuration (twell-opt's twell-select-config takes "
                        "tuning-file=FILE for a .mlir)",
                        mlir_file));
      for (const char* o : {"tile-n", "slots", "cluster-m"})
        if (args.has(o))
          throw std::invalid_argument(
              fmt::format("--tuning-dir: expected a spec that leaves tile_n, slots and the cluster to the "
                          "tuned entry, got --{} (plans of it take no tuned layout: config_source "
                          "\"option\")",
                          o));
    }
    twell::PlanOptions options;  // Dispatch::Auto: the dense path's kernels too; the decode kernels are part of the FFN's set
    const int64_t dense_neurons = args.get_int("dense-neurons", 0, 0, int64_t{1} << 24);
    const int64_t max_tokens = args.get_int("max-tokens", 131072, 1, (int64_t{1} << 31) - 1);
    const bool training = args.has("training");
    // The plans of one spec: the whole layer, and with --dense-neurons the split's TwELL part (d_ff - K
    // neurons) and its dense part; with --training the training plans of the same (their kernels are
    // recorded by the context, which save_bundle writes).
    auto make_plans = [&](twell::Context& ctx, const twell::FfnSpec& s, const twell::PlanOptions& o,
                          std::vector<twell::KernelReport>& training_kernels) {
      if (training && s.d_model > twell::kernels::TrainRowBackwardConstraints::kMaxDModel)
        throw std::invalid_argument(fmt::format("--training: expected d_model <= {} (train_row_backward keeps a row of dx in "
                                                "registers), got {}", twell::kernels::TrainRowBackwardConstraints::kMaxDModel,
                                                s.d_model));
      twell::FfnPlan plan = ctx.plan(s, max_tokens, o);
      if (dense_neurons > 0) {
        twell::PlanOptions split = o;
        split.dense_neurons = dense_neurons;
        ctx.plan(s, max_tokens, split);
      }
      // (a tuned token-block consumer is an inference choice: training's forward takes the row consumer of
      // the same layout)
      if (training) {
        twell::FfnSpec ts = s;
        if (ts.consumer && *ts.consumer == twell::ConsumerVariant::TokenBlock && !mlir_file.empty())
          throw std::invalid_argument(fmt::format("--training: expected a .mlir whose consumer is the row gather (training's "
                                                  "forward computes the L1 term in the row consumers), got '{}' with the token block",
                                                  mlir_file));
        ts.consumer.reset();
        twell::TrainingPlanOptions t;
        t.dispatch = twell::TrainingDispatch::Auto;
        t.tuning = o.tuning;
        t.tuning_dir = o.tuning_dir;
        t.tuning_workload = o.tuning_workload;
        auto keep = [&](const twell::FfnTrainingPlan& tp) {  // the kernels the inference plans lack
          for (const twell::KernelReport& k : tp.kernels())
            if (k.kind.rfind("train_", 0) == 0 &&
                std::none_of(training_kernels.begin(), training_kernels.end(),
                             [&](const twell::KernelReport& seen) { return seen.name == k.name; }))
              training_kernels.push_back(k);
        };
        keep(twell::FfnTrainingPlan::create(ctx, ts, max_tokens, t));
        if (dense_neurons > 0) {
          t.dense_neurons = dense_neurons;
          keep(twell::FfnTrainingPlan::create(ctx, ts, max_tokens, t));
        }
      }
      return plan;
    };
    struct TargetBundle {
      twell::Context ctx;
      twell::FfnPlan plan;
      std::vector<twell::KernelReport> training_kernels;
      std::vector<twell::TuningFile> tuning;
      std::string tuning_note;
    };
    // Every target's plans first, then the writes: a spec one target rejects writes no bundle at all.
    std::vector<TargetBundle> bundles;
    for (const twell::Target& target : targets) {
      twell::ContextOptions context_options;
      context_options.target = target;
      context_options.device = twell::ContextOptions::kNoDevice;  // compile only: any target, no workspace
      twell::Context ctx(context_options);
      if (!mlir_file.empty()) spec = add_mlir_kernels(ctx, mlir_text, mlir_file, target);
      // The tuned entry first: a bad --tuning-workload costs no compilation.
      const std::string version = twell::tuning_hardware(ctx).twell_version;
      std::filesystem::path file;
      std::optional<twell::TuningFile> entry;
      if (!tuning_dir.empty())
        entry = bundle_tuning(tuning_dir, spec, target.arch(), version, args.get("tuning-workload", ""), &file);
      std::vector<twell::KernelReport> training_kernels;
      twell::FfnPlan plan = make_plans(ctx, spec, options, training_kernels);
      TargetBundle b{std::move(ctx), std::move(plan), std::move(training_kernels), {}, {}};
      if (!tuning_dir.empty()) {
        if (!entry) {
          b.tuning_note = fmt::format("no entry of {} for this spec on {} (twell {}): no tuned choices embedded",
                                      tuning_dir, target.arch(), version);
        } else {
          const std::string layouts = compile_tuned_layouts(
              spec, *entry, file,
              [&](const twell::FfnSpec& s, const twell::PlanOptions& o) { make_plans(b.ctx, s, o, b.training_kernels); });
          std::string workloads;
          for (const auto& w : entry->workloads) workloads += (workloads.empty() ? "" : ", ") + w.name;
          b.tuning_note = fmt::format(
              "tuned choices of {} ({}, {} SMs, driver {}; workloads {}) embedded; their layouts: {}", file.string(),
              entry->hardware.device_name, entry->hardware.sm_count, entry->hardware.driver_version, workloads,
              layouts.empty() ? "none (no bucket chose a TwELL layout)" : layouts);
          b.tuning.push_back(std::move(*entry));
        }
      }
      bundles.push_back(std::move(b));
    }
    for (auto& [ctx, plan, training_kernels, tuning, tuning_note] : bundles) {
      const twell::Target& target = ctx.target();
      const std::filesystem::path dir = std::filesystem::path(out) / target.arch();
      ctx.save_bundle(dir, tuning);
      std::printf("%s: %zu kernels of the plan (layout tile_n %d, slots %d) and the dense path's -> %s\n", target.arch().c_str(),
                  plan.kernels().size(), plan.layout().tile_n, plan.layout().slots, dir.c_str());
      for (const auto& k : plan.kernels())
        std::printf("  %-18s %-60s cache %-6s cubin %7zu B  threads %d cta_m %d %s\n", k.kind.c_str(), k.name.c_str(),
                    k.cache.c_str(), k.cubin_bytes, k.threads, k.cta_m,
                    k.persistent ? (k.tiles > 0 ? fmt::format("persistent over {} tiles", k.tiles) : std::string("persistent")).c_str()
                                 : fmt::format("grid.y {}", k.grid_y).c_str());
      if (!training_kernels.empty()) {
        std::printf("  and %zu kernels of the training plans%s (the training plans' forwards take the plans' kernels):\n",
                    training_kernels.size(), dense_neurons > 0 ? fmt::format(", whole and split at {}", dense_neurons).c_str() : "");
        for (const auto& k : training_kernels)
          std::printf("  %-20s %-72s cache %-6s cubin %7zu B  threads %d\n", k.kind.c_str(), k.name.c_str(), k.cache.c_str(),
                      k.cubin_bytes, k.threads);
      }
      if (!tuning_note.empty()) std::printf("  tuning: %s\n", tuning_note.c_str());
    }
    return 0;
  } catch (const twell::Error& e) {
    std::fprintf(stderr, "twellc compile: error: %s\n", e.what());
    return 1;
  } catch (const std::invalid_argument& e) {
    std::fprintf(stderr, "twellc compile: %s\n%s", e.what(), kCompileHelp);
    return 2;
  }
}

}  // namespace twellc
