// PlanOptions::tuning: which tuned entry a plan takes (this machine's tuning database first, then the
// entries its loaded bundles embed) and the layout that entry gives (Context::plan, plan_build.cpp).
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "bundle.h"
#include "twell/plan.h"
#include "twell/tuning_format.h"

namespace twell::detail {

// One tuned workload a plan may take, and where it comes from.
struct TuningCandidate {
  std::string origin;  // "database <file>" | "bundle <dir>"
  std::string workload;
  std::vector<TunedBucket> buckets;  // ascending by tokens
};

// Whether `spec` sets a layout field a tune chooses (tile_n, slots, gate_cluster_m): then no tuned
// entry applies ("option").
bool sets_tuned_fields(const FfnSpec& spec);

// The entry embedded in `bundles` (the first, in load order) for the key fields of `spec` on `arch` that
// holds `workload` ("" = that entry's most recent one) with at least one bucket; nullopt when none does.
std::optional<TuningCandidate> embedded_tuning(const std::vector<std::shared_ptr<const Bundle>>& bundles,
                                               const FfnSpec& spec, const std::string& arch,
                                               const std::string& workload);

// What PlanOptions::tuning gives a plan.
struct TunedLayout {
  FfnSpec spec;        // what the plan is made of: `spec`, with the tuned layout fields where an entry applies
  std::string source;  // FfnPlan::config_source()
  bool tuned = false;  // spec holds a tuned layout (a plan that cannot be built of it is made of `spec` instead)
};

// The spec's own layout fields first ("option"); else `database` (this machine's entry for its GPU and
// the spec) when it has buckets, else `embedded` (a bundle's: any GPU of the bundle's arch), else the
// heuristic. Of the entry: the bucket holding max_tokens (else the largest), its TwELL configuration
// (twell_choice: where the untuned plan won, the heuristic) with, for a Dispatch other than Auto (which
// times both consumers itself), its consumer where `spec` leaves it unset.
TunedLayout tuned_layout(const FfnSpec& spec, int64_t max_tokens, Dispatch dispatch,
                         const std::optional<TuningCandidate>& database,
                         const std::optional<TuningCandidate>& embedded);

}  // namespace twell::detail
