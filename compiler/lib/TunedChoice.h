// What twell-select-config takes from a tuning database file (its `tuning-file` option) for the
// kernels of one FFN: the entry's TwELL configuration of the bucket holding `tokens`, where the entry is
// for the kernels' arch, the FFN's shape and numerics and its tensor type's layout. No MLIR here: the
// pass reads the op, this decides (tests/unit/tuned_choice_test.cpp).
#pragma once
#include <cstdint>
#include <optional>
#include <string>

#include "twell/tuning_format.h"

namespace twell::compiler {

// An FFN as a tuning entry is keyed, read from its consumer op.
struct TunedFfn {
  std::string arch;              // the kernels' target, "sm_90a"
  FfnSpec spec;                  // d_model, d_ff, gated, activation, threshold, dtype, and the user's w_down layout
  int64_t tileN = 0, slots = 0;  // the layout of its tensor type
};

struct TunedChoice {
  // The bucket's TwELL configuration (its tile_n and slots are the FFN's) when the entry applies.
  std::optional<TunedConfig> config;
  // Whether the decode kernels paid off in the entry's buckets of at most
  // DecodeKernelConstraints::kMaxTokens tokens (any chose them, or the untuned plan, which has them);
  // unset when the entry does not apply or has no such bucket.
  std::optional<bool> decode;
  // The twell.config_source attribute: "tuning-file <path> workload <w> bucket <tokens>: tile_n .. slots
  // .. cluster_m .. consumer ..[ decode on|off]", or "heuristic (tuning-file <path>: <why not>)".
  std::string source;
};

// `file` as read from `path` (nullopt: unreadable, `whyUnread` says why); `workload` "" = the most
// recently tuned; `tokens` 0 = the largest bucket.
TunedChoice tunedChoice(const std::optional<TuningFile>& file, const std::string& path, const std::string& whyUnread,
                        const TunedFfn& ffn, int64_t tokens, const std::string& workload);

}  // namespace twell::compiler
