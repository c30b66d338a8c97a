// `twellc tune`: autotunes one FFN shape on this GPU and stores the result in the tuning database
// (twell/tuning.h), which later plans of that shape read.
#include <cstdio>
#include <sstream>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "commands.h"
#include "twell/context.h"
#include "twell/error.h"
#include "twell/layer_data.h"
#include "twell/safetensors.h"
#include "twell/tuning.h"

namespace twellc {
namespace {

const char* kTuneHelp =
    "usage: twellc tune --d-model D --d-ff F [--tokens M,...] [--density P | --weights FILE[,FILE...] --layer N]\n"
    "                   [--target sm_90a] [--budget-s S] [--reps R] [--threshold t] [--activation relu|silu]\n"
    "                   [--dtype bf16|f16] [--down-layout out_in|in_out] [--non-gated] [--tuning-dir DIR] [--no-write] [--json]\n"
    "  Enumerates the configurations of the plan's kernels (tile_n, slots, cluster, consumer, decode kernels, the\n"
    "  dense path), prunes with the cost model, compiles the candidates in parallel, checks each against the dense\n"
    "  reference (a configuration that changes results is rejected), times them per token bucket (CUDA events,\n"
    "  GPU time, median of --reps) and writes the winner and the runner-up per bucket to the tuning database\n"
    "  ($TWELL_TUNING_DIR, default <kernel cache>/tuning). Plans of this shape then use it.\n"
    "  --tokens      token counts, one bucket each (rounded up to powers of two); default 1,16,256,16384,131072\n"
    "  --density     uniform random inputs with this fraction of active neurons (default 0.005)\n"
    "  --weights     safetensors files holding layers.<N>.x and the gate weight (../shared/data naming;\n"
    "                --patterns is the same option); missing up/down weights are drawn at random\n"
    "  --layer       with --weights: the layer N of layers.<N>.* (default: the files' only layer)\n"
    "  --budget-s    stop timing new candidates after this many seconds (default 60; 0: no limit)\n"
    "  --reps        timed calls per candidate and bucket, of which the median counts (default 5)\n"
    "  --target      the kernels' target (default: this GPU's)\n"
    "  --tuning-dir  the database to write (default $TWELL_TUNING_DIR, else <kernel cache>/tuning)\n"
    "  --no-write    tune without storing the result;  --json: print the result as one JSON object\n"
    "  Needs a GPU. --tile-n, --slots, --consumer and --cluster-m are refused: the tuner chooses them.\n";

std::vector<int64_t> parse_tokens(const std::string& list) {
  if (!list.empty() && list.back() == ',')
    throw std::invalid_argument(fmt::format("--tokens: expected a comma-separated list of counts, got '{}' (a trailing comma)", list));
  std::vector<int64_t> out;
  std::stringstream in(list);
  std::string item;
  while (std::getline(in, item, ',')) {
    size_t used = 0;
    long long v = 0;
    try {
      v = std::stoll(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used == 0 || used != item.size() || v < 1 || v > (1 << 24))
      throw std::invalid_argument(fmt::format("--tokens: expected a comma-separated list of counts in 1..{}, got '{}'", 1 << 24, list));
    out.push_back(v);
  }
  if (out.empty()) throw std::invalid_argument("--tokens: expected at least one count, got an empty list");
  return out;
}

}  // namespace

int tune_command(const std::vector<std::string>& argv) {
  Args args;
  twell::TuneRequest request;
  std::optional<twell::Target> target;
  try {
    std::vector<std::string> flags = {"help", "no-write", "json", "non-gated"};
    std::vector<std::string> valued = kShapeValueOptions;
    for (const char* o : {"tokens", "density", "weights", "patterns", "layer", "target", "budget-s", "reps", "tuning-dir"})
      valued.push_back(o);
    args = parse_args(argv, flags, valued);
    if (args.has("help")) {
      std::fputs(kTuneHelp, stdout);
      return 0;
    }
    if (!args.positional.empty())
      throw std::invalid_argument(fmt::format("expected options only, got '{}'", args.positional.front()));
    for (const char* chosen : {"tile-n", "slots", "consumer", "cluster-m"})
      if (args.has(chosen)) throw std::invalid_argument(fmt::format("--{}: the tuner chooses it; expected it absent", chosen));
    if (!args.has("d-model") || !args.has("d-ff"))
      throw std::invalid_argument("--d-model and --d-ff: expected both (the shape to tune), got " +
                                  std::string(args.has("d-model") ? "only --d-model" : args.has("d-ff") ? "only --d-ff" : "neither"));
    request.spec = spec_from_args(args);
    if (args.has("tokens")) request.tokens = parse_tokens(args.get("tokens"));
    if (args.has("weights") && args.has("patterns"))
      throw std::invalid_argument("--patterns: the same option as --weights; expected one of them, got both");
    const bool weights = args.has("weights") || args.has("patterns");
    if (weights && args.has("density"))
      throw std::invalid_argument("--density: expected either it (random inputs) or --weights (a real layer), got both");
    request.density = args.get_double("density", 0.005);
    if (!(request.density > 0 && request.density < 1))
      throw std::invalid_argument(fmt::format("--density: expected a fraction in (0, 1), got {}", request.density));
    request.budget_s = args.get_double("budget-s", 60);
    if (!(request.budget_s >= 0)) throw std::invalid_argument(fmt::format("--budget-s: expected >= 0, got {}", request.budget_s));
    request.reps = static_cast<int>(args.get_int("reps", 5, 1, 1000));
    request.write = !args.has("no-write");
    request.database = args.get("tuning-dir", "");
    if (args.has("target")) target = parse_target(args.get("target"));
    if (weights) {
      std::vector<twell::SafeTensors> files;
      std::stringstream list(args.has("weights") ? args.get("weights") : args.get("patterns"));
      for (std::string f; std::getline(list, f, ',');) files.push_back(twell::SafeTensors::read(f));
      std::optional<int> layer;
      if (args.has("layer")) layer = static_cast<int>(args.get_int("layer", 0, 0, 1 << 30));
      request.layer = twell::load_layer(files, layer, /*random_up_down_if_missing=*/true);
    } else if (args.has("layer")) {
      throw std::invalid_argument("--layer: expected it with --weights FILE, got it alone");
    }
  } catch (const std::invalid_argument& e) {
    std::fprintf(stderr, "twellc tune: %s\n%s", e.what(), kTuneHelp);
    return 2;
  } catch (const twell::Error& e) {
    std::fprintf(stderr, "twellc tune: error: %s\n", e.what());
    return 1;
  }
  const bool json_out = args.has("json");
  request.progress = [&](const std::string& line) {
    std::fprintf(json_out ? stderr : stdout, "%s\n", line.c_str());
    std::fflush(json_out ? stderr : stdout);
  };
  try {
    twell::ContextOptions options;
    options.target = target;
    twell::Context ctx(options);
    const twell::TuneResult r = ctx.tune(request);
    if (json_out) {
      nlohmann::json j = {{"workload", r.workload}, {"file", r.file.string()},     {"seconds", r.seconds},
                          {"configurations", r.configurations}, {"pruned", r.pruned}, {"compiled", r.compiled},
                          {"outliers", r.outliers},  {"buckets", nlohmann::json::array()}};
      for (const auto& b : r.buckets)
        j["buckets"].push_back({{"tokens", b.tokens}, {"winner_ms", b.winner.ms}, {"winner_path", twell::to_string(b.winner.path)},
                                {"tile_n", b.winner.tile_n}, {"slots", b.winner.slots}, {"cluster_m", b.winner.cluster_m},
                                {"consumer", twell::to_string(b.winner.consumer)}, {"decode_max_tokens", b.winner.decode_max_tokens},
                                {"runner_up_ms", b.runner_up ? b.runner_up->ms : 0.0}, {"heuristic_ms", b.heuristic_ms},
                                {"dense_ms", b.dense_ms}, {"candidates", b.candidates}, {"rejected", b.rejected}});
      std::printf("%s\n", j.dump(1).c_str());
    }
    return 0;
  } catch (const twell::Error& e) {
    std::fprintf(stderr, "twellc tune: error: %s\n", e.what());
    return 1;
  }
}

}  // namespace twellc
