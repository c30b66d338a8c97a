// The tuning database (twell/tuning.h): where the files live and how writers merge them (flock, rename);
// their content is twell/tuning_format.h's.
#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <fstream>
#include <mutex>
#include <set>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <xxhash.h>

#include "cache.h"
#include "twell/error.h"
#include "twell/tuning.h"

namespace twell {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// The text whose hash names the file of (hw, spec): the key fields of the hardware (not the device name)
// and of the spec, as the first database wrote them (file names stay what they were).
std::string file_key(const TuningHardware& hw, const FfnSpec& spec) {
  TuningFile key;
  key.spec = spec;
  const json spec_json = json::parse(tuning_file_json(key, -1)).at("spec");
  const json hardware = {
      {"arch", hw.arch}, {"sm_count", hw.sm_count}, {"driver", hw.driver_version}, {"twell", hw.twell_version}};
  return json{{"hardware", hardware}, {"spec", spec_json}}.dump();
}

// Whether `file` holds what its name stands for: this hardware and this spec.
bool same_key(const TuningFile& file, const TuningHardware& hw, const FfnSpec& spec) {
  return file.hardware.arch == hw.arch && file.hardware.sm_count == hw.sm_count &&
         file.hardware.driver_version == hw.driver_version && file.hardware.twell_version == hw.twell_version &&
         same_tuning_key(file.spec, spec);
}

void warn_once(const fs::path& file, const std::string& why) {
  static std::mutex mutex;
  static std::set<std::string> warned;
  std::lock_guard lock(mutex);
  if (warned.insert(file.string()).second)
    std::fprintf(stderr, "twell: tuning database %s ignored (%s)\n", file.c_str(), why.c_str());
}

std::string utc_now() {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

[[noreturn]] void io_error(const std::string& what, const fs::path& path) {
  throw Error(ErrorCode::Io, fmt::format("TuningDatabase: {} {}: {}", what, path.string(), std::strerror(errno)));
}

}  // namespace

std::string density_workload(double density) { return fmt::format("density:{:.3g}%", 100 * density); }

std::string tune_result_json(const TuneResult& t) {
  json j = {{"workload", t.workload}, {"file", t.file.string()},
            {"seconds", t.seconds},   {"configurations", t.configurations},
            {"pruned", t.pruned},     {"compiled", t.compiled},
            {"outliers", t.outliers}};
  j["buckets"] = json::parse(tuned_buckets_json(t.buckets));
  return j.dump();
}

TuningDatabase::TuningDatabase(fs::path dir) : dir_(dir.empty() ? default_dir() : std::move(dir)) {}

fs::path TuningDatabase::default_dir() {
  if (const char* env = std::getenv("TWELL_TUNING_DIR"); env != nullptr && *env != '\0') return env;
  const fs::path cache = detail::KernelCache::default_dir();
  return cache.empty() ? fs::path() : cache / "tuning";
}

fs::path TuningDatabase::file_for(const TuningHardware& hw, const FfnSpec& spec) const {
  const std::string keyed = file_key(hw, spec);
  return dir_ / fmt::format("{}-{}sm-{:016x}.json", hw.arch, hw.sm_count, XXH64(keyed.data(), keyed.size(), 0));
}

std::optional<TuningDatabase::Entry> TuningDatabase::lookup(const TuningHardware& hw, const FfnSpec& spec,
                                                           const std::string& workload) const {
  if (dir_.empty()) return std::nullopt;
  const fs::path file = file_for(hw, spec);
  std::string why;
  const std::optional<TuningFile> read = read_tuning_file(file, &why);
  if (!read) {
    if (why != "absent") warn_once(file, why);
    return std::nullopt;
  }
  // The key's fields are checked too: a file renamed from another hardware or spec is not used.
  if (!same_key(*read, hw, spec)) {
    warn_once(file, "its hardware or spec fields are not the ones its name stands for");
    return std::nullopt;
  }
  const TuningWorkload* chosen = find_workload(*read, workload);
  if (chosen == nullptr) return std::nullopt;
  return Entry{chosen->name, chosen->buckets, file};
}

fs::path TuningDatabase::store(const TuningHardware& hw, const FfnSpec& spec, const std::string& workload,
                               const std::vector<TunedBucket>& buckets) const {
  if (dir_.empty())
    throw Error(ErrorCode::Io, "TuningDatabase::store: no directory ($TWELL_TUNING_DIR unset and no home for the default)");
  std::error_code ec;
  fs::create_directories(dir_, ec);
  if (ec) throw Error(ErrorCode::Io, fmt::format("TuningDatabase::store: cannot create {}: {}", dir_.string(), ec.message()));
  const fs::path file = file_for(hw, spec);
  const fs::path lock_path = fs::path(file.string() + ".lock");
  const int lock = ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644);
  if (lock < 0) io_error("cannot open the lock", lock_path);
  struct Unlock {
    int fd;
    ~Unlock() { ::close(fd); }  // closing releases the flock
  } unlock{lock};
  // Bounded: a writer holds the lock for a read, a merge and a rename (milliseconds).
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (::flock(lock, LOCK_EX | LOCK_NB) != 0) {
    if (errno != EWOULDBLOCK && errno != EINTR) io_error("cannot lock", lock_path);
    if (std::chrono::steady_clock::now() > deadline)
      throw Error(ErrorCode::Io, fmt::format("TuningDatabase::store: {} held by another process for 30 s", lock_path.string()));
    ::usleep(10000);
  }
  std::string why;
  std::optional<TuningFile> read = read_tuning_file(file, &why);
  // Keep the existing workloads only if the file is what its name says (this schema, this hardware and
  // spec); anything else is replaced.
  if (read && !same_key(*read, hw, spec)) why = "not this hardware's and spec's entry";
  if (!read || !same_key(*read, hw, spec)) {
    if (why != "absent") warn_once(file, why + "; replaced");
    read.emplace();
  }
  TuningFile& f = *read;
  f.hardware = hw;
  f.spec = tuning_key(spec);
  std::erase_if(f.workloads, [&](const TuningWorkload& w) { return w.name == workload; });
  std::vector<TunedBucket> sorted = buckets;
  std::sort(sorted.begin(), sorted.end(), [](const auto& a, const auto& b) { return a.tokens < b.tokens; });
  f.workloads.push_back(
      TuningWorkload{workload, utc_now(), static_cast<int64_t>(std::time(nullptr)), std::move(sorted)});
  std::sort(f.workloads.begin(), f.workloads.end(), [](const auto& a, const auto& b) { return a.name < b.name; });
  const fs::path tmp = fs::path(fmt::format("{}.{}.tmp", file.string(), ::getpid()));
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out << tuning_file_json(f) << "\n";
    out.flush();
    if (!out) {
      fs::remove(tmp, ec);
      io_error("cannot write", tmp);
    }
  }
  if (std::rename(tmp.c_str(), file.c_str()) != 0) {
    const int saved = errno;
    fs::remove(tmp, ec);
    errno = saved;
    io_error("cannot rename into", file);
  }
  return file;
}

}  // namespace twell
