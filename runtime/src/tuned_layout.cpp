#include "tuned_layout.h"

#include <fmt/format.h>

#include "twell/kernels/validate.h"

namespace twell::detail {

bool sets_tuned_fields(const FfnSpec& spec) { return spec.tile_n || spec.slots || spec.gate_cluster_m; }

std::optional<TuningCandidate> embedded_tuning(const std::vector<std::shared_ptr<const Bundle>>& bundles,
                                               const FfnSpec& spec, const std::string& arch,
                                               const std::string& workload) {
  for (const auto& bundle : bundles)
    for (const TuningFile& file : bundle->tuning()) {
      if (file.hardware.arch != arch || !same_tuning_key(file.spec, spec)) continue;
      const TuningWorkload* w = find_workload(file, workload);
      if (w != nullptr && !w->buckets.empty())
        return TuningCandidate{"bundle " + bundle->dir().string(), w->name, w->buckets};
    }
  return std::nullopt;
}

TunedLayout tuned_layout(const FfnSpec& spec, int64_t max_tokens, Dispatch dispatch,
                         const std::optional<TuningCandidate>& database,
                         const std::optional<TuningCandidate>& embedded) {
  if (sets_tuned_fields(spec)) return {spec, "option", false};
  const TuningCandidate* entry = database && !database->buckets.empty()   ? &*database
                                 : embedded && !embedded->buckets.empty() ? &*embedded
                                                                          : nullptr;
  if (entry == nullptr) return {spec, "heuristic", false};
  const TunedBucket& bucket = *bucket_for(entry->buckets, max_tokens);
  const std::string where = fmt::format("{} workload {} bucket {}", entry->origin, entry->workload, bucket.tokens);
  const TunedConfig* best = twell_choice(bucket);
  if (best == nullptr)
    return {spec,
            fmt::format("heuristic ({}: {})", where,
                        bucket.winner.path == TunedConfig::Path::Dense
                            ? "the dense path was fastest, with no TwELL runner-up"
                            : "the untuned plan was fastest"),
            false};
  FfnSpec s = with_tuned_layout(spec, *best);
  if (dispatch != Dispatch::Auto && !s.consumer) s.consumer = best->consumer;
  if (const std::string wrong = kernels::validate_spec(s, ""); !wrong.empty())  // an entry this version cannot build
    return {spec, fmt::format("heuristic ({}: not a legal layout here: {})", where, wrong), false};
  return {
      s,
      fmt::format("{}: tile_n {} slots {} cluster_m {}{}", where, best->tile_n, best->slots, best->cluster_m,
                  s.consumer && !spec.consumer ? fmt::format(" consumer {}", to_string(*s.consumer)) : std::string()),
      true};
}

}  // namespace twell::detail
