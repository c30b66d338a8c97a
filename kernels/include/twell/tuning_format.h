// The tuning database's file format (issue 16): the records one file holds and the code that reads and
// writes them. Below both readers: the runtime's TuningDatabase (twell/tuning.h: where the files live,
// locking, merging) and bundles that embed an entry, and the compiler's twell-select-config
// (`tuning-file=`). JSON and file reading only: no CUDA, no MLIR. The schema is documented in tuning.h.
#pragma once
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "twell/spec.h"

namespace twell {

// One configuration of a plan for one spec.
struct TunedConfig {
  // TwELL: the TwELL kernels with the fields below; Dense: DenseKernels::FusedGatedUp; Heuristic: the
  // untuned plan (no database entry applies: what Context::plan makes by itself) was fastest.
  enum class Path { TwELL, Dense, Heuristic };
  Path path = Path::TwELL;
  int tile_n = 256;
  int slots = 31;
  int cluster_m = 1;  // the sm_90a wgmma gate's CTAs per cluster (1 elsewhere)
  ConsumerVariant consumer = ConsumerVariant::RowGather;
  int64_t decode_max_tokens = 0;  // the plan's decode cut-off (0: the decode kernels off)
  double ms = 0;                  // median GPU time of one call at the bucket's token count
  // The hot/cold split (PlanOptions::dense_neurons), tuned on a real layer only: measured with the
  // weights ordered hot_first_order(neuron_activity) of that layer's own rows (twell/neuron_order.h),
  // tile_n and slots then being the cold part's layout. Plans never apply it from the database (the
  // order of a caller's weights is the caller's): twell_choice skips such a configuration, and a caller
  // who orders the weights that way passes it as PlanOptions::dense_neurons. 0: no split. Files
  // without the field read as 0.
  int64_t dense_neurons = 0;
};

// "twell", "dense", "heuristic".
const char* to_string(TunedConfig::Path path);

// One token-count bucket's result: calls of tokens/2 + 1 .. tokens rows (tokens a power of two).
struct TunedBucket {
  int64_t tokens = 0;
  TunedConfig winner;
  std::optional<TunedConfig> runner_up;
  double heuristic_ms = 0;  // the plan the heuristics give (no database): Dispatch::Auto, default layout
  double dense_ms = 0;      // DenseKernels::FusedGatedUp (twell's dense path)
  int candidates = 0, rejected = 0;
};

// What a database entry is keyed by besides the workload.
struct TuningHardware {
  std::string arch;  // "sm_90a"
  int sm_count = 0;
  int driver_version = 0;  // cuDriverGetVersion
  std::string twell_version;
  std::string device_name;  // informational, not part of the key
};

// One tune's result: the buckets of one workload ("density:0.5%" or "pattern:<16 hex>").
struct TuningWorkload {
  std::string name;
  std::string tuned_at;              // UTC, "2026-12-01T18:00:00Z"
  int64_t unix_time = 0;             // the same instant: which workload is the most recent
  std::vector<TunedBucket> buckets;  // ascending by tokens
};

// One file: the tuned workloads of one hardware and spec.
struct TuningFile {
  static constexpr int kSchema = 1;
  TuningHardware hardware;
  // The fields that key an entry: shape and numerics (d_model, d_ff, gated, activation, threshold,
  // dtype, down_layout); the layout fields a tune chooses are unset.
  FfnSpec spec;
  std::vector<TuningWorkload> workloads;  // ascending by name
};

// The key fields of `spec` (the others unset; threshold -0.0 as 0.0).
FfnSpec tuning_key(const FfnSpec& spec);

// Whether a and b have the same key fields.
bool same_tuning_key(const FfnSpec& a, const FfnSpec& b);

// The key fields as messages show them: "d_model 2048 d_ff 5632 gated relu threshold 0 bf16 out_in".
std::string tuning_key_text(const FfnSpec& spec);

// Parses one file's JSON. Throws std::invalid_argument naming the field, what was expected and what
// was found (not JSON, nested deeper than 16 levels, another schema, a missing or mistyped field, an
// unknown path or consumer name, a bucket whose tokens is not a power of two or that appears twice in a
// workload, a cluster_m other than 1 or 2, a decode_max_tokens outside 0..64).
TuningFile parse_tuning_file(std::string_view text);

// The file's JSON (`indent` as nlohmann::json::dump's; -1: compact), which parse_tuning_file reads back
// to an equal TuningFile.
std::string tuning_file_json(const TuningFile& file, int indent = 1);

// Reads and parses `path`. Never blocks (a FIFO at the path), never follows a final symbolic link, reads
// regular files of at most 16 MiB only, never throws: nullopt with *why set ("absent" when there is no
// file; else what is wrong with it) for anything else.
std::optional<TuningFile> read_tuning_file(const std::filesystem::path& path, std::string* why);

// The workload named `name`, or the most recently tuned one when `name` is empty; nullptr when there is
// none.
const TuningWorkload* find_workload(const TuningFile& file, const std::string& name);

// The bucket holding calls of `tokens` rows: the smallest with bucket.tokens >= tokens, else the largest;
// nullptr when `buckets` (ascending) is empty.
const TunedBucket* bucket_for(const std::vector<TunedBucket>& buckets, int64_t tokens);

// The TwELL configuration a plan takes from `bucket`: the winner when it is a TwELL one without a
// hot/cold split; where the dense path or a split configuration won, the runner-up when it is such a
// TwELL one (a plan with Dispatch::Auto takes the dense path by itself); else nullptr (the untuned plan
// was fastest, or ranked above every applicable configuration: it keeps its own layout).
const TunedConfig* twell_choice(const TunedBucket& bucket);

// `spec` with the layout fields a tuned configuration sets: tile_n, slots and gate_cluster_m (the
// consumer is the caller's: a plan with Dispatch::Auto times both variants itself).
FfnSpec with_tuned_layout(const FfnSpec& spec, const TunedConfig& config);

// The buckets as a JSON array in the file's bucket form (what twell_context_tune returns).
std::string tuned_buckets_json(const std::vector<TunedBucket>& buckets);

}  // namespace twell
