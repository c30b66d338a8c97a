// Autotuning per model shape (issue 16): the tuning database and the tuner.
//
// The tuner (tune(), Context::tune, `twellc tune`, Python twell.tune) enumerates the configurations a
// plan can take for one FFN spec (TwELL tile width and slots, the sm_90a gate's cluster, the gated
// consumer variant, the decode kernels' cut-off, the dense path, and on a real layer the hot/cold split
// point, TunedConfig::dense_neurons), checks each against the dense
// reference on the same inputs (a configuration whose y differs by more than 1e-2 relative error is
// rejected, not ranked), times the survivors per token-count bucket with CUDA events (GPU time, one
// warm-up, median of `reps`, inputs rotated through buffers larger than L2), and writes the winner and
// the runner-up of every bucket to the database.
//
// The database: JSON files in TuningDatabase::default_dir() ($TWELL_TUNING_DIR, else the "tuning"
// folder beside the kernel cache), one file per hardware x spec:
//   <dir>/<arch>-<sm_count>sm-<key>.json   key: 16 hex digits of XXH64 over the hardware and spec fields
//   {
//     "schema": 1,
//     "hardware": {"arch": "sm_90a", "sm_count": 132, "driver": 13000, "twell": "0.14.0", "device": "NVIDIA H200"},
//     "spec": {"d_model": 2048, "d_ff": 5632, "gated": true, "activation": "relu", "threshold": 0,
//              "dtype": "bf16", "down_layout": "out_in"},
//     "workloads": {                        // "density:0.5%" (uniform random inputs) or "pattern:<16 hex>"
//       "density:0.5%": {"tuned_at": "2026-12-01T18:00:00Z", "unix_time": 1796150400,
//         "buckets": [ {"tokens": 16384,    // the bucket: calls of tokens/2+1 .. tokens rows (powers of 2)
//                       "winner":    {"path": "twell", "tile_n": 256, "slots": 31, "cluster_m": 2,
//                                     "consumer": "row_gather", "decode_max_tokens": 64, "dense_neurons": 0, "ms": 1.04},
//                       "runner_up": {...},  // absent when one candidate survived
//                       "heuristic_ms": 1.05, "dense_ms": 1.52, "candidates": 13, "rejected": 0} ] } } }
// "path" is "twell" (the TwELL kernels with that configuration), "dense" (DenseKernels::FusedGatedUp) or
// "heuristic" (the untuned plan was fastest, ties included: plans then keep their own layout).
// Writers of one file are serialized by flock on <file>.lock and publish by rename, merging: a tune
// replaces only its own workload, so concurrent tunes of different workloads both survive. A file that
// cannot be read as this schema for this key (damaged, another schema, renamed from another key, not a
// regular file, above 16 MiB) reads as absent, and a store replaces it. The records and the reading and
// writing of one file are twell/tuning_format.h's (a library below the compiler and the runtime).
//
// Who reads it:
//   - Plans (Context::plan, PlanOptions::tuning). The entry taken, in this order: this GPU's file (its
//     hardware key: arch, SM count, driver, twell version; only with a GPU), else the entry a loaded
//     bundle embeds for this spec (below), else none (the heuristic). An entry whose layout cannot be
//     built there (a bundle without those kernels, memory) is ignored: the plan is made as without it.
//   - Bundles. `twellc compile --tuning-dir DIR [--tuning-workload W]` embeds, per target, the file of
//     DIR whose arch, twell version and spec match (the SM count and driver are the tuning machine's,
//     which a bundle cannot know of the machine it runs on: any of them matches; the most recently tuned
//     of several) as the manifest's "tuning", and compiles the kernels of its tuned layouts into the
//     bundle. The embedded entry applies to any GPU of the bundle's arch; a file for the GPU itself in
//     the deployment's database takes precedence.
//   - The compiler. twell-select-config's `tuning-file=<path>` (with `tokens=`, `tuning-workload=`)
//     takes the gate's cluster_m, the consumer variant and the decode choice from the bucket holding
//     `tokens` where the file is for the kernels' arch and the FFN's spec, and the tuned tile_n and slots
//     are those of the FFN's tensor type (the layout is part of the type: the pass does not change it).
#pragma once
#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "twell/layer_data.h"
#include "twell/spec.h"
#include "twell/tuning_format.h"  // TunedConfig, TunedBucket, TuningHardware, the file format

namespace twell {

class Context;

class TuningDatabase {
 public:
  static constexpr int kSchema = TuningFile::kSchema;
  // dir empty: default_dir().
  explicit TuningDatabase(std::filesystem::path dir = {});
  // $TWELL_TUNING_DIR if set and non-empty, else <the kernel cache's default directory>/tuning; empty
  // (no database) when neither exists.
  static std::filesystem::path default_dir();
  const std::filesystem::path& dir() const noexcept { return dir_; }

  // The spec fields that key an entry: shape and numerics (not the layout fields a tune chooses).
  std::filesystem::path file_for(const TuningHardware& hw, const FfnSpec& spec) const;

  // The buckets tuned for `workload` ("" = the most recently tuned workload of this hardware and spec),
  // ascending by tokens; empty when there is none. Never throws for a missing, unreadable or damaged
  // file (reads as absent; a damaged one is reported once on stderr).
  struct Entry {
    std::string workload;
    std::vector<TunedBucket> buckets;
    std::filesystem::path file;
  };
  std::optional<Entry> lookup(const TuningHardware& hw, const FfnSpec& spec, const std::string& workload = "") const;

  // Merges `buckets` as `workload` into the file of (hw, spec): under flock of <file>.lock, read,
  // replace the workload, write a temporary file, rename. Throws Error(Io) when the directory cannot be
  // created or written (naming the path and the OS error).
  std::filesystem::path store(const TuningHardware& hw, const FfnSpec& spec, const std::string& workload,
                              const std::vector<TunedBucket>& buckets) const;

 private:
  std::filesystem::path dir_;
};

// The workload name of uniform random inputs at `density` (fraction of active neurons), three
// significant digits: "density:0.5%", "density:0.001%".
std::string density_workload(double density);

struct TuneRequest {
  FfnSpec spec;  // shape and numerics; layout fields (tile_n, slots, consumer, gate_cluster_m) are ignored
  std::vector<int64_t> tokens{1, 16, 256, 16384, 131072};  // one bucket each (rounded up to powers of two)
  // The inputs: uniform random at `density` (x ~ N(0, 1), Wg ~ N(0, 1/d_model), the threshold placed
  // at the normal quantile 1 - density), or a real layer (x, Wg and, where present, Wu and Wd; its rows
  // repeated to fill the largest bucket) with workload "pattern:<fingerprint of its x and Wg>".
  double density = 0.005;
  std::optional<LayerData> layer;
  double budget_s = 60;  // candidates beyond the budget are skipped (reported); 0: no limit
  int reps = 5;          // timed calls per candidate and bucket (median)
  int compile_threads = 0;  // NVRTC threads; 0: hardware concurrency
  bool write = true;        // store the result in `database`
  std::filesystem::path database;  // empty: TuningDatabase::default_dir()
  std::function<void(const std::string&)> progress;  // one line per step (with the time left)
};

struct TuneResult {
  TuningHardware hardware;
  std::string workload;
  std::vector<TunedBucket> buckets;
  std::filesystem::path file;  // where it was stored ("" when not written)
  int configurations = 0;      // enumerated (legal for the target)
  int pruned = 0;              // skipped by the cost model or the budget
  int compiled = 0;            // kernels compiled (cache misses)
  int outliers = 0;            // timed calls above 1.5x their median
  double seconds = 0;
};

// Tunes on ctx's GPU. Throws Error(NoDevice) without one, Error(InvalidArgument) naming the field for
// an illegal spec, token count (< 1) or density (outside (0, 1)), Error(Io) when the database cannot be
// written.
TuneResult tune(Context& ctx, const TuneRequest& request);

// The result as one JSON object: workload, file, seconds, configurations, pruned, compiled, outliers,
// and buckets in the database's bucket form (tokens, winner, runner_up, heuristic_ms, dense_ms,
// candidates, rejected). What twell_context_tune returns.
std::string tune_result_json(const TuneResult& result);

// The hardware key of ctx (arch, SM count, driver, twell version).
TuningHardware tuning_hardware(Context& ctx);

}  // namespace twell
