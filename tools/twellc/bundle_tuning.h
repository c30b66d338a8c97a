// `twellc compile --tuning-dir DIR [--tuning-workload W]`: the tuning database entry a bundle embeds,
// and the tuned configurations whose kernels it must hold (README.md, "twellc compile").
#pragma once
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "twell/context.h"
#include "twell/tuning_format.h"

namespace twellc {

// The entry of the tuning database directory `dir` (twellc tune's files) for the key fields of `spec`
// on `arch`, tuned by `twell_version`. The SM count and driver of a file are the tuning machine's, which
// a bundle cannot know of the machine it will run on: every file of the arch, twell version and spec
// matches, and of several (GPUs or drivers of one arch) the most recently tuned is taken. `workload`
// non-empty: only that workload is kept. *file: the file taken. nullopt when no file matches. A file
// that does not read as the schema is reported on stderr and skipped. Throws std::invalid_argument
// naming --tuning-dir when `dir` is not a directory, --tuning-workload when the file lacks `workload`
// (naming the ones it holds).
std::optional<twell::TuningFile> bundle_tuning(const std::filesystem::path& dir, const twell::FfnSpec& spec,
                                               const std::string& arch, const std::string& twell_version,
                                               const std::string& workload, std::filesystem::path* file);

// Makes, through `make_plans(spec, options)`, the plans of every TwELL configuration plans take from
// `entry` (twell_choice of each bucket of each workload) the way Context::plan asks for their kernels
// (PlanOptions::tuning): with Dispatch::Auto, and with Dispatch::Sparse, which also fixes the tuned
// consumer where `spec` leaves it unset. Returns them as text ("tile_n 128 slots 15 cluster_m 1
// token_block, ..."; "" for none). Rethrows a plan's twell::Error naming `file` and the layout.
std::string compile_tuned_layouts(
    const twell::FfnSpec& spec, const twell::TuningFile& entry, const std::filesystem::path& file,
    const std::function<void(const twell::FfnSpec&, const twell::PlanOptions&)>& make_plans);

}  // namespace twellc
