#include "TunedChoice.h"

#include <limits>

#include "llvm/Support/FormatVariadic.h"
#include "twell/kernels/constraints.h"

namespace twell::compiler {

TunedChoice tunedChoice(const std::optional<TuningFile>& file, const std::string& path, const std::string& whyUnread,
                        const TunedFfn& ffn, int64_t tokens, const std::string& workload) {
  auto heuristic = [&](const std::string& why) {
    return TunedChoice{std::nullopt, std::nullopt, llvm::formatv("heuristic (tuning-file {0}: {1})", path, why).str()};
  };
  if (!file) return heuristic(whyUnread);
  if (file->hardware.arch != ffn.arch)
    return heuristic(llvm::formatv("tuned on {0}, the kernels' target is {1}", file->hardware.arch, ffn.arch).str());
  if (!same_tuning_key(file->spec, ffn.spec))
    return heuristic(
        llvm::formatv("tuned for {0}, this FFN is {1}", tuning_key_text(file->spec), tuning_key_text(ffn.spec)).str());
  const TuningWorkload* w = find_workload(*file, workload);
  if (w == nullptr || w->buckets.empty()) {
    std::string held;
    for (const TuningWorkload& each : file->workloads) held += (held.empty() ? "" : ", ") + each.name;
    return heuristic(
        w != nullptr
            ? llvm::formatv("workload {0} has no buckets", w->name).str()
            : llvm::formatv("no workload '{0}' (it holds: {1})", workload, held.empty() ? "none" : held).str());
  }
  const TunedBucket& bucket = *bucket_for(w->buckets, tokens == 0 ? std::numeric_limits<int64_t>::max() : tokens);
  const std::string where = llvm::formatv("workload {0} bucket {1}", w->name, bucket.tokens).str();
  const TunedConfig* best = twell_choice(bucket);
  if (best == nullptr)
    return heuristic(where + (bucket.winner.path == TunedConfig::Path::Dense
                                  ? ": the dense path was fastest, with no TwELL runner-up"
                                  : ": the untuned configuration was fastest"));
  if (best->tile_n != ffn.tileN || best->slots != ffn.slots)
    return heuristic(
        llvm::formatv("{0}: tuned layout tile_n {1} slots {2}, this FFN's tensor type has tile_n {3} slots {4} "
                      "(the layout is the type's: write the tuned one there)",
                      where, best->tile_n, best->slots, ffn.tileN, ffn.slots)
            .str());
  TunedChoice choice{*best, std::nullopt, {}};
  // The decode kernels serve calls of at most kMaxTokens rows: the small buckets measured them.
  for (const TunedBucket& b : w->buckets) {
    if (b.tokens > kernels::DecodeKernelConstraints::kMaxTokens) continue;
    const TunedConfig* c = twell_choice(b);
    const bool on = b.winner.path == TunedConfig::Path::Heuristic || (c != nullptr && c->decode_max_tokens > 0);
    if (on || c != nullptr) choice.decode = choice.decode.value_or(false) || on;
  }
  choice.source = llvm::formatv("tuning-file {0} {1}: tile_n {2} slots {3} cluster_m {4} consumer {5}{6}", path, where,
                                best->tile_n, best->slots, best->cluster_m, to_string(best->consumer),
                                choice.decode ? (*choice.decode ? " decode on" : " decode off") : "")
                      .str();
  return choice;
}

}  // namespace twell::compiler
