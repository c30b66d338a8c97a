#include "bundle_tuning.h"

#include <algorithm>
#include <cstdio>
#include <stdexcept>
#include <system_error>

#include <fmt/format.h>

#include "twell/error.h"

namespace twellc {

namespace fs = std::filesystem;

std::optional<twell::TuningFile> bundle_tuning(const fs::path& dir, const twell::FfnSpec& spec, const std::string& arch,
                                               const std::string& twell_version, const std::string& workload,
                                               fs::path* file) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec))
    throw std::invalid_argument(
        fmt::format("--tuning-dir: expected a tuning database directory (twellc tune's), got '{}' ({})", dir.string(),
                    fs::exists(dir, ec) ? "not a directory" : "nothing there"));
  std::vector<fs::path> names;
  for (const auto& e : fs::directory_iterator(dir, ec))
    if (e.path().extension() == ".json") names.push_back(e.path());
  if (ec) throw std::invalid_argument(fmt::format("--tuning-dir: cannot list '{}': {}", dir.string(), ec.message()));
  std::sort(names.begin(), names.end());
  std::optional<twell::TuningFile> best;
  int64_t best_time = -1;
  for (const fs::path& name : names) {
    std::string why;
    std::optional<twell::TuningFile> f = twell::read_tuning_file(name, &why);
    if (!f) {
      std::fprintf(stderr, "twellc compile: %s ignored (%s)\n", name.c_str(), why.c_str());
      continue;
    }
    if (f->hardware.arch != arch || f->hardware.twell_version != twell_version ||
        !twell::same_tuning_key(f->spec, spec))
      continue;
    const twell::TuningWorkload* newest = twell::find_workload(*f, "");
    const int64_t time = newest ? newest->unix_time : 0;
    if (time > best_time) {
      best_time = time;
      best = std::move(f);
      *file = name;
    }
  }
  if (!best || workload.empty()) return best;
  const twell::TuningWorkload* kept = twell::find_workload(*best, workload);
  if (kept == nullptr) {
    std::string held;
    for (const auto& w : best->workloads) held += (held.empty() ? "" : ", ") + w.name;
    throw std::invalid_argument(fmt::format("--tuning-workload: expected a workload of {} ({}), got '{}'",
                                            file->string(), held.empty() ? "none" : held, workload));
  }
  best->workloads = {*kept};
  return best;
}

std::string compile_tuned_layouts(
    const twell::FfnSpec& spec, const twell::TuningFile& entry, const fs::path& file,
    const std::function<void(const twell::FfnSpec&, const twell::PlanOptions&)>& make_plans) {
  std::vector<twell::TunedConfig> done;
  std::string text;
  for (const twell::TuningWorkload& w : entry.workloads)
    for (const twell::TunedBucket& b : w.buckets) {
      const twell::TunedConfig* c = twell::twell_choice(b);
      if (c == nullptr || std::any_of(done.begin(), done.end(), [&](const twell::TunedConfig& d) {
            return d.tile_n == c->tile_n && d.slots == c->slots && d.cluster_m == c->cluster_m &&
                   d.consumer == c->consumer;
          }))
        continue;
      done.push_back(*c);
      const twell::FfnSpec tuned = twell::with_tuned_layout(spec, *c);
      twell::FfnSpec fixed = tuned;
      if (!fixed.consumer) fixed.consumer = c->consumer;
      twell::PlanOptions automatic, sparse;
      sparse.dispatch = twell::Dispatch::Sparse;
      try {
        make_plans(tuned, automatic);
        make_plans(fixed, sparse);
      } catch (const twell::Error& e) {
        throw twell::Error(e.code(),
                           fmt::format("--tuning-dir: {}: the tuned layout tile_n {} slots {} cluster_m {}: {}",
                                       file.string(), c->tile_n, c->slots, c->cluster_m, e.what()));
      }
      text += fmt::format("{}tile_n {} slots {} cluster_m {} {}", text.empty() ? "" : ", ", c->tile_n, c->slots,
                          c->cluster_m, twell::to_string(c->consumer));
    }
  return text;
}

}  // namespace twellc
