// The tuning database (twell/tuning.h): JSON files per hardware x spec, merged under flock.
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <fstream>
#include <mutex>
#include <set>
#include <sstream>

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

json spec_json(const FfnSpec& s) {
  // -0.0 and 0.0 are one threshold (the same kernels).
  const double threshold = s.threshold == 0.0f ? 0.0 : static_cast<double>(s.threshold);
  return {{"d_model", s.d_model},       {"d_ff", s.d_ff},          {"gated", s.gated},
          {"activation", to_string(s.activation)}, {"threshold", threshold}, {"dtype", to_string(s.dtype)},
          {"down_layout", to_string(s.down_layout)}};
}

json hardware_key_json(const TuningHardware& hw) {
  return {{"arch", hw.arch}, {"sm_count", hw.sm_count}, {"driver", hw.driver_version}, {"twell", hw.twell_version}};
}

json config_json(const TunedConfig& c) {
  return {{"path", to_string(c.path)}, {"tile_n", c.tile_n},     {"slots", c.slots},
          {"cluster_m", c.cluster_m},  {"consumer", to_string(c.consumer)}, {"decode_max_tokens", c.decode_max_tokens},
          {"ms", c.ms}};
}

TunedConfig config_from(const json& j) {
  TunedConfig c;
  const std::string path = j.at("path").get<std::string>();
  if (path != "twell" && path != "dense" && path != "heuristic")
    throw std::invalid_argument("path: expected twell, dense or heuristic, got " + path.substr(0, 40));
  c.path = path == "twell" ? TunedConfig::Path::TwELL : path == "dense" ? TunedConfig::Path::Dense : TunedConfig::Path::Heuristic;
  c.tile_n = j.at("tile_n").get<int>();
  c.slots = j.at("slots").get<int>();
  c.cluster_m = j.at("cluster_m").get<int>();
  const std::string consumer = j.at("consumer").get<std::string>();
  if (consumer != "row_gather" && consumer != "token_block")
    throw std::invalid_argument("consumer: expected row_gather or token_block, got " + consumer);
  c.consumer = consumer == "row_gather" ? ConsumerVariant::RowGather : ConsumerVariant::TokenBlock;
  c.decode_max_tokens = j.at("decode_max_tokens").get<int64_t>();
  c.ms = j.at("ms").get<double>();
  return c;
}

json bucket_json(const TunedBucket& b) {
  json j = {{"tokens", b.tokens},         {"winner", config_json(b.winner)}, {"heuristic_ms", b.heuristic_ms},
            {"dense_ms", b.dense_ms},     {"candidates", b.candidates},      {"rejected", b.rejected}};
  if (b.runner_up) j["runner_up"] = config_json(*b.runner_up);
  return j;
}

TunedBucket bucket_from(const json& j) {
  TunedBucket b;
  b.tokens = j.at("tokens").get<int64_t>();
  if (b.tokens < 1 || (b.tokens & (b.tokens - 1)) != 0)
    throw std::invalid_argument(fmt::format("tokens: expected a power of two, got {}", b.tokens));
  b.winner = config_from(j.at("winner"));
  if (j.contains("runner_up")) b.runner_up = config_from(j.at("runner_up"));
  b.heuristic_ms = j.at("heuristic_ms").get<double>();
  b.dense_ms = j.at("dense_ms").get<double>();
  b.candidates = j.at("candidates").get<int>();
  b.rejected = j.at("rejected").get<int>();
  return b;
}

// The file's JSON, or null when absent, unreadable, damaged or of another schema (`why` says which).
json read_file(const fs::path& file, std::string* why) {
  // Never blocks (O_NONBLOCK: a FIFO at the path), never follows a link, reads regular files only and
  // at most kMaxFileBytes (a database file is a few KB per workload).
  constexpr off_t kMaxFileBytes = off_t{16} << 20;
  const int fd = ::open(file.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
  if (fd < 0) {
    *why = errno == ENOENT ? "absent" : fmt::format("cannot open: {}", std::strerror(errno));
    return nullptr;
  }
  struct Close {
    int fd;
    ~Close() { ::close(fd); }
  } close_fd{fd};
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    *why = "not a regular file";
    return nullptr;
  }
  if (st.st_size > kMaxFileBytes) {
    *why = fmt::format("{} bytes, above the limit of {}", static_cast<int64_t>(st.st_size), static_cast<int64_t>(kMaxFileBytes));
    return nullptr;
  }
  std::string text(static_cast<size_t>(st.st_size), '\0');
  size_t got = 0;
  while (got < text.size()) {
    const ssize_t n = ::read(fd, text.data() + got, text.size() - got);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    got += static_cast<size_t>(n);
  }
  text.resize(got);
  // Nesting is bounded (a hostile file must not overflow the stack): the schema is 5 levels deep.
  json j;
  try {
    j = json::parse(text, [](int depth, json::parse_event_t, json&) {
      if (depth > 16) throw std::invalid_argument("nested more than 16 levels");
      return true;
    });
  } catch (const std::exception& e) {
    *why = std::string("not valid JSON: ") + std::string(e.what()).substr(0, 200);
    return nullptr;
  }
  if (!j.is_object() || !j.contains("schema") || j["schema"] != TuningDatabase::kSchema) {
    *why = fmt::format("not schema {}", TuningDatabase::kSchema);
    return nullptr;
  }
  return j;
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
  json j = {{"workload", t.workload}, {"file", t.file.string()}, {"seconds", t.seconds},
            {"configurations", t.configurations}, {"pruned", t.pruned}, {"compiled", t.compiled},
            {"outliers", t.outliers}, {"buckets", json::array()}};
  for (const TunedBucket& b : t.buckets) j["buckets"].push_back(bucket_json(b));
  return j.dump();
}

const char* to_string(TunedConfig::Path path) {
  return path == TunedConfig::Path::TwELL ? "twell" : path == TunedConfig::Path::Dense ? "dense" : "heuristic";
}

TuningDatabase::TuningDatabase(fs::path dir) : dir_(dir.empty() ? default_dir() : std::move(dir)) {}

fs::path TuningDatabase::default_dir() {
  if (const char* env = std::getenv("TWELL_TUNING_DIR"); env != nullptr && *env != '\0') return env;
  const fs::path cache = detail::KernelCache::default_dir();
  return cache.empty() ? fs::path() : cache / "tuning";
}

fs::path TuningDatabase::file_for(const TuningHardware& hw, const FfnSpec& spec) const {
  const std::string keyed = json{{"hardware", hardware_key_json(hw)}, {"spec", spec_json(spec)}}.dump();
  return dir_ / fmt::format("{}-{}sm-{:016x}.json", hw.arch, hw.sm_count, XXH64(keyed.data(), keyed.size(), 0));
}

std::optional<TuningDatabase::Entry> TuningDatabase::lookup(const TuningHardware& hw, const FfnSpec& spec,
                                                           const std::string& workload) const {
  if (dir_.empty()) return std::nullopt;
  const fs::path file = file_for(hw, spec);
  std::string why;
  const json j = read_file(file, &why);
  if (j.is_null()) {
    if (why != "absent") warn_once(file, why);
    return std::nullopt;
  }
  try {
    // The key's fields are checked too: a file renamed from another hardware or spec is not used.
    if (j.at("hardware").at("arch") != hw.arch || j.at("hardware").at("sm_count") != hw.sm_count ||
        j.at("hardware").at("driver") != hw.driver_version || j.at("hardware").at("twell") != hw.twell_version ||
        j.at("spec") != spec_json(spec))
      throw std::invalid_argument("its hardware or spec fields are not the ones its name stands for");
    const json& workloads = j.at("workloads");
    std::string chosen = workload;
    if (chosen.empty()) {
      int64_t newest = -1;
      for (const auto& [name, w] : workloads.items())
        if (w.at("unix_time").get<int64_t>() > newest) {
          newest = w.at("unix_time").get<int64_t>();
          chosen = name;
        }
    }
    if (chosen.empty() || !workloads.contains(chosen)) return std::nullopt;
    Entry e{chosen, {}, file};
    for (const json& b : workloads.at(chosen).at("buckets")) e.buckets.push_back(bucket_from(b));
    std::sort(e.buckets.begin(), e.buckets.end(), [](const auto& a, const auto& b) { return a.tokens < b.tokens; });
    return e;
  } catch (const std::exception& ex) {
    warn_once(file, ex.what());
    return std::nullopt;
  }
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
  json j = read_file(file, &why);
  // Keep the existing workloads only if the file is what its name says (a well-formed object of this
  // schema for this hardware and spec); anything else is replaced.
  const bool keep = j.is_object() && j.contains("workloads") && j["workloads"].is_object() && j.contains("hardware") &&
                    j["hardware"].is_object() && j.contains("spec") && j["spec"] == spec_json(spec) &&
                    j["hardware"].value("arch", "") == hw.arch && j["hardware"].value("sm_count", -1) == hw.sm_count &&
                    j["hardware"].value("driver", -1) == hw.driver_version && j["hardware"].value("twell", "") == hw.twell_version;
  if (!keep) {
    if (why != "absent") warn_once(file, (why.empty() ? std::string("not this hardware's and spec's entry") : why) + "; replaced");
    j = json{{"schema", kSchema}, {"workloads", json::object()}};
  }
  j["hardware"] = hardware_key_json(hw);
  j["hardware"]["device"] = hw.device_name;
  j["spec"] = spec_json(spec);
  json list = json::array();
  for (const TunedBucket& b : buckets) list.push_back(bucket_json(b));
  j["workloads"][workload] = {{"tuned_at", utc_now()}, {"unix_time", static_cast<int64_t>(std::time(nullptr))}, {"buckets", list}};
  const fs::path tmp = fs::path(fmt::format("{}.{}.tmp", file.string(), ::getpid()));
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out << j.dump(1) << "\n";
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
