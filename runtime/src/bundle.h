// Ahead-of-time bundles: a directory of compiled kernels and the manifest.json that describes them
// (README.md, "Ahead-of-time bundles", documents the schema). `twellc compile` writes them on a machine
// with the compiler; the runtime loads them on one without (Context::load_bundle).
//
//   <dir>/manifest.json             written last: a directory without one is no bundle
//   <dir>/<kernel>.cubin, .ptx, .cu  per kernel: the binary for the bundle's target, its PTX, its source
//
// A load reads every file the manifest names and checks its size and XXH64 against the manifest, and
// the manifest's own checksum (edits are refused), so a bundle either loads whole or not at all.
#pragma once
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "cache.h"
#include "twell/kernels/kernel.h"
#include "twell/spec.h"
#include "twell/tuning_format.h"

namespace twell::detail {

inline constexpr int kBundleSchemaVersion = 1;
inline constexpr const char* kBundleFormat = "twell-bundle";

// One kernel: its description and its binary (PTX and the cubin of the bundle's target).
struct BundleKernel {
  kernels::KernelSource source;
  std::shared_ptr<const CacheEntry> binary;
};

// One kernel set: what the runtime asks for by request key (kernel_request.h): an FFN's kernels (with
// its IR and layout) or one auxiliary kernel.
struct BundleSet {
  std::string request;
  std::optional<FfnSpec> spec;       // an FFN set: the spec it was made for (informational)
  std::optional<TwellLayout> layout; // an FFN set: the TwELL layout its kernels use
  std::string ir;
  std::vector<std::string> kernels;  // names, in launch order (kernels/launch.h)
  std::vector<std::string> decode;
};

class Bundle {
 public:
  // Reads and verifies the bundle in `dir`. Throws Error(NotFound) for a missing directory, manifest
  // or kernel file; Error(Parse) for a manifest that is not one (JSON, format, schema version, checksum,
  // a field's type or value) or a file whose size or checksum differs, naming the kernel or field, what
  // was expected and what was found.
  static std::shared_ptr<const Bundle> load(const std::filesystem::path& dir);

  const std::filesystem::path& dir() const { return dir_; }
  const Target& target() const { return target_; }
  const std::string& twell_version() const { return twell_version_; }
  const std::map<std::string, BundleSet>& sets() const { return sets_; }
  const BundleSet* find(const std::string& request) const;
  // The tuned choices `twellc compile --tuning-dir` embedded (the manifest's "tuning": database files,
  // each for the bundle's arch and one spec); plans take them where the machine's database has no entry.
  const std::vector<TuningFile>& tuning() const { return tuning_; }
  std::shared_ptr<const BundleKernel> kernel(const std::string& name) const;
  size_t kernel_count() const { return kernels_.size(); }

 private:
  static void check_set(const Bundle& b, const BundleSet& set);
  std::filesystem::path dir_;
  Target target_;
  std::string twell_version_;
  std::map<std::string, BundleSet> sets_;
  std::map<std::string, std::shared_ptr<const BundleKernel>> kernels_;
  std::vector<TuningFile> tuning_;
};

// Writes a bundle for `target` into `dir` (created if needed): every kernel's files, then
// manifest.json, each through a temporary file that is flushed, synced and renamed; `tuning` becomes the
// manifest's "tuning" (none when empty). Throws Error(Io) naming the file and the system's reason when
// any write fails (read-only directory, full disk); nothing is reported written that is not.
// Error(InvalidArgument) when a set names a kernel not given, or a tuning entry is for another arch.
void write_bundle(const std::filesystem::path& dir, const Target& target, const std::map<std::string, BundleSet>& sets,
                  const std::map<std::string, std::shared_ptr<const BundleKernel>>& kernels,
                  const std::vector<TuningFile>& tuning = {});

// "sm_90a" -> Target{90, true}; nullopt for anything else.
std::optional<Target> parse_target(const std::string& arch);

}  // namespace twell::detail
