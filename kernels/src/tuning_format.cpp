// The tuning database's file format (twell/tuning_format.h): typed reading of one file's JSON, its
// writing, and its reading from a file (bounded and non-blocking: bounded_read.h).
#include "twell/tuning_format.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <initializer_list>
#include <limits>
#include <set>
#include <stdexcept>
#include <utility>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "bounded_read.h"
#include "twell/kernels/constraints.h"

namespace twell {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr int kMaxDepth = 16;                         // the schema nests 6 levels deep
constexpr int64_t kMaxFileBytes = int64_t{16} << 20;  // a file is a few KB per workload

[[noreturn]] void bad(const std::string& where, const std::string& what) {
  throw std::invalid_argument(fmt::format("{}: {}", where, what));
}

// A value as messages show it: at most 60 characters of its JSON.
std::string shown(const json& v) {
  std::string text = v.dump();
  return text.size() > 60 ? text.substr(0, 57) + "..." : text;
}

const json& member(const json& j, const char* key, const std::string& where) {
  if (!j.is_object()) bad(where, fmt::format("expected an object, found {}", shown(j)));
  const auto it = j.find(key);
  if (it == j.end()) bad(where, fmt::format("expected a field \"{}\", found none", key));
  return *it;
}

template <typename T>
T integer(const json& j, const char* key, const std::string& where) {
  const json& v = member(j, key, where);
  const bool fits = v.is_number_unsigned()
                        ? v.get<uint64_t>() <= static_cast<uint64_t>(std::numeric_limits<T>::max())
                        : v.is_number_integer() && v.get<int64_t>() >= std::numeric_limits<T>::min() &&
                              v.get<int64_t>() <= std::numeric_limits<T>::max();
  if (!fits)
    bad(where + "." + key, fmt::format("expected an integer in {}..{}, found {}", std::numeric_limits<T>::min(),
                                       std::numeric_limits<T>::max(), shown(v)));
  return static_cast<T>(v.get<int64_t>());
}

double number(const json& j, const char* key, const std::string& where) {
  const json& v = member(j, key, where);
  if (!v.is_number()) bad(where + "." + key, fmt::format("expected a number, found {}", shown(v)));
  return v.get<double>();
}

bool boolean(const json& j, const char* key, const std::string& where) {
  const json& v = member(j, key, where);
  if (!v.is_boolean()) bad(where + "." + key, fmt::format("expected true or false, found {}", shown(v)));
  return v.get<bool>();
}

std::string string_field(const json& j, const char* key, const std::string& where) {
  const json& v = member(j, key, where);
  if (!v.is_string()) bad(where + "." + key, fmt::format("expected a string, found {}", shown(v)));
  return v.get<std::string>();
}

template <typename Enum>
Enum one_of(const json& j, const char* key, const std::string& where,
            std::initializer_list<std::pair<const char*, Enum>> names) {
  const std::string given = string_field(j, key, where);
  std::string expected;
  for (const auto& [name, value] : names) {
    if (given == name) return value;
    expected += (expected.empty() ? "" : " or ") + std::string(name);
  }
  bad(where + "." + key, fmt::format("expected {}, found {}", expected, shown(json(given))));
}

json spec_json(const FfnSpec& s) {
  const FfnSpec k = tuning_key(s);
  return {{"d_model", k.d_model},
          {"d_ff", k.d_ff},
          {"gated", k.gated},
          {"activation", to_string(k.activation)},
          {"threshold", static_cast<double>(k.threshold)},
          {"dtype", to_string(k.dtype)},
          {"down_layout", to_string(k.down_layout)}};
}

FfnSpec spec_from(const json& j, const std::string& where) {
  FfnSpec s;
  s.d_model = integer<int64_t>(j, "d_model", where);
  s.d_ff = integer<int64_t>(j, "d_ff", where);
  s.gated = boolean(j, "gated", where);
  s.activation = one_of<Activation>(j, "activation", where, {{"relu", Activation::ReLU}, {"silu", Activation::SiLU}});
  s.threshold = static_cast<float>(number(j, "threshold", where));
  s.dtype = one_of<DType>(j, "dtype", where, {{"bf16", DType::BF16}, {"f16", DType::FP16}});
  s.down_layout =
      one_of<WeightLayout>(j, "down_layout", where, {{"out_in", WeightLayout::OutIn}, {"in_out", WeightLayout::InOut}});
  return tuning_key(s);
}

json config_json(const TunedConfig& c) {
  return {{"path", to_string(c.path)},
          {"tile_n", c.tile_n},
          {"slots", c.slots},
          {"cluster_m", c.cluster_m},
          {"consumer", to_string(c.consumer)},
          {"decode_max_tokens", c.decode_max_tokens},
          {"dense_neurons", c.dense_neurons},
          {"ms", c.ms}};
}

TunedConfig config_from(const json& j, const std::string& where) {
  TunedConfig c;
  c.path = one_of<TunedConfig::Path>(j, "path", where,
                                     {{"twell", TunedConfig::Path::TwELL},
                                      {"dense", TunedConfig::Path::Dense},
                                      {"heuristic", TunedConfig::Path::Heuristic}});
  c.tile_n = integer<int>(j, "tile_n", where);
  c.slots = integer<int>(j, "slots", where);
  c.cluster_m = integer<int>(j, "cluster_m", where);
  if (c.cluster_m != 1 && c.cluster_m != 2)  // a tune writes 1 or 2 (1 off the wgmma gate and on other paths)
    bad(where + ".cluster_m", fmt::format("expected 1 or 2, found {}", c.cluster_m));
  c.consumer = one_of<ConsumerVariant>(
      j, "consumer", where, {{"row_gather", ConsumerVariant::RowGather}, {"token_block", ConsumerVariant::TokenBlock}});
  c.decode_max_tokens = integer<int64_t>(j, "decode_max_tokens", where);
  if (c.decode_max_tokens < 0 || c.decode_max_tokens > kernels::DecodeKernelConstraints::kMaxTokens)
    bad(where + ".decode_max_tokens", fmt::format("expected 0..{} (0: the decode kernels off), found {}",
                                                  kernels::DecodeKernelConstraints::kMaxTokens, c.decode_max_tokens));
  if (j.is_object() && j.contains("dense_neurons")) {
    c.dense_neurons = integer<int64_t>(j, "dense_neurons", where);
    if (c.dense_neurons < 0 || c.dense_neurons % 64 != 0)
      bad(where + ".dense_neurons", fmt::format("expected a multiple of 64, at least 0, found {}", c.dense_neurons));
  }
  c.ms = number(j, "ms", where);
  return c;
}

json bucket_json(const TunedBucket& b) {
  json j = {{"tokens", b.tokens},     {"winner", config_json(b.winner)}, {"heuristic_ms", b.heuristic_ms},
            {"dense_ms", b.dense_ms}, {"candidates", b.candidates},      {"rejected", b.rejected}};
  if (b.runner_up) j["runner_up"] = config_json(*b.runner_up);
  return j;
}

TunedBucket bucket_from(const json& j, const std::string& where) {
  TunedBucket b;
  b.tokens = integer<int64_t>(j, "tokens", where);
  if (b.tokens < 1 || (b.tokens & (b.tokens - 1)) != 0)
    bad(where + ".tokens", fmt::format("expected a power of two, found {}", b.tokens));
  b.winner = config_from(member(j, "winner", where), where + ".winner");
  if (j.contains("runner_up")) b.runner_up = config_from(j.at("runner_up"), where + ".runner_up");
  b.heuristic_ms = number(j, "heuristic_ms", where);
  b.dense_ms = number(j, "dense_ms", where);
  b.candidates = integer<int>(j, "candidates", where);
  b.rejected = integer<int>(j, "rejected", where);
  return b;
}

}  // namespace

const char* to_string(TunedConfig::Path path) {
  return path == TunedConfig::Path::TwELL ? "twell" : path == TunedConfig::Path::Dense ? "dense" : "heuristic";
}

FfnSpec tuning_key(const FfnSpec& spec) {
  FfnSpec k;
  k.d_model = spec.d_model;
  k.d_ff = spec.d_ff;
  k.gated = spec.gated;
  k.activation = spec.activation;
  k.threshold = spec.threshold == 0.0f ? 0.0f : spec.threshold;  // -0.0 and 0.0 are one threshold (the same kernels)
  k.dtype = spec.dtype;
  k.down_layout = spec.down_layout;
  return k;
}

bool same_tuning_key(const FfnSpec& a, const FfnSpec& b) { return spec_json(a) == spec_json(b); }

std::string tuning_key_text(const FfnSpec& spec) {
  const FfnSpec k = tuning_key(spec);
  return fmt::format("d_model {} d_ff {} {} {} threshold {} {} {}", k.d_model, k.d_ff, k.gated ? "gated" : "non-gated",
                     to_string(k.activation), k.threshold, to_string(k.dtype), to_string(k.down_layout));
}

TuningFile parse_tuning_file(std::string_view text) {
  json j;
  try {
    // Nesting is bounded while parsing: a hostile file must not overflow the stack.
    j = json::parse(text.begin(), text.end(), [](int depth, json::parse_event_t, json&) {
      if (depth > kMaxDepth) throw std::invalid_argument(fmt::format("nested deeper than {} levels", kMaxDepth));
      return true;
    });
  } catch (const json::exception& e) {
    throw std::invalid_argument(std::string("not valid JSON: ") + std::string(e.what()).substr(0, 200));
  }
  if (!j.is_object() || !j.contains("schema") || j["schema"] != TuningFile::kSchema)
    bad("schema", fmt::format("expected {}, found {}", TuningFile::kSchema,
                              j.is_object() && j.contains("schema") ? shown(j["schema"]) : std::string("none")));
  TuningFile file;
  const json& hw = member(j, "hardware", "file");
  file.hardware.arch = string_field(hw, "arch", "hardware");
  file.hardware.sm_count = integer<int>(hw, "sm_count", "hardware");
  file.hardware.driver_version = integer<int>(hw, "driver", "hardware");
  file.hardware.twell_version = string_field(hw, "twell", "hardware");
  if (hw.contains("device")) file.hardware.device_name = string_field(hw, "device", "hardware");
  file.spec = spec_from(member(j, "spec", "file"), "spec");
  const json& workloads = member(j, "workloads", "file");
  if (!workloads.is_object()) bad("workloads", fmt::format("expected an object, found {}", shown(workloads)));
  for (const auto& [name, w] : workloads.items()) {
    const std::string where = "workloads." + name;
    TuningWorkload workload;
    workload.name = name;
    if (w.is_object() && w.contains("tuned_at")) workload.tuned_at = string_field(w, "tuned_at", where);
    workload.unix_time = integer<int64_t>(w, "unix_time", where);
    const json& buckets = member(w, "buckets", where);
    if (!buckets.is_array()) bad(where + ".buckets", fmt::format("expected an array, found {}", shown(buckets)));
    std::set<int64_t> seen;
    for (size_t i = 0; i < buckets.size(); ++i) {
      const std::string at = fmt::format("{}.buckets[{}]", where, i);
      workload.buckets.push_back(bucket_from(buckets[i], at));
      // Two buckets of one token count: which one a reader took would depend on the sort below.
      if (!seen.insert(workload.buckets.back().tokens).second)
        bad(at + ".tokens", fmt::format("expected each bucket once, found {} twice", workload.buckets.back().tokens));
    }
    std::sort(workload.buckets.begin(), workload.buckets.end(),
              [](const auto& a, const auto& b) { return a.tokens < b.tokens; });
    file.workloads.push_back(std::move(workload));
  }
  return file;
}

std::string tuning_file_json(const TuningFile& file, int indent) {
  json hardware = {{"arch", file.hardware.arch},
                   {"sm_count", file.hardware.sm_count},
                   {"driver", file.hardware.driver_version},
                   {"twell", file.hardware.twell_version},
                   {"device", file.hardware.device_name}};
  json workloads = json::object();
  for (const TuningWorkload& w : file.workloads) {
    json buckets = json::array();
    for (const TunedBucket& b : w.buckets) buckets.push_back(bucket_json(b));
    workloads[w.name] = {{"tuned_at", w.tuned_at}, {"unix_time", w.unix_time}, {"buckets", buckets}};
  }
  const json j = {{"schema", TuningFile::kSchema},
                  {"hardware", hardware},
                  {"spec", spec_json(file.spec)},
                  {"workloads", workloads}};
  return j.dump(indent);
}

std::optional<TuningFile> read_tuning_file(const fs::path& path, std::string* why) {
  const int fd = detail::open_for_bounded_read(path);
  if (fd < 0) {
    const int error = errno;
    struct stat link {};
    if (error == ELOOP && ::lstat(path.c_str(), &link) == 0 && S_ISLNK(link.st_mode))
      *why = "a symbolic link, which is not followed (name the file it points to)";
    else
      *why = error == ENOENT ? "absent" : fmt::format("cannot open: {}", std::strerror(error));
    return std::nullopt;
  }
  struct Close {
    int fd;
    ~Close() { ::close(fd); }
  } close_fd{fd};
  const detail::BoundedRead read = detail::read_bounded(fd, kMaxFileBytes);
  switch (read.status) {
    case detail::BoundedRead::Status::Read:
      break;
    case detail::BoundedRead::Status::CannotStat:
    case detail::BoundedRead::Status::NotRegular:
      *why = "not a regular file";
      return std::nullopt;
    case detail::BoundedRead::Status::TooLarge:
      *why = fmt::format("{} bytes, above the limit of {}", read.size, kMaxFileBytes);
      return std::nullopt;
  }
  try {
    return parse_tuning_file(read.bytes);
  } catch (const std::exception& e) {
    *why = e.what();
    return std::nullopt;
  }
}

const TuningWorkload* find_workload(const TuningFile& file, const std::string& name) {
  const TuningWorkload* found = nullptr;
  for (const TuningWorkload& w : file.workloads)
    if (name.empty() ? found == nullptr || w.unix_time > found->unix_time : w.name == name) found = &w;
  return found;
}

const TunedBucket* bucket_for(const std::vector<TunedBucket>& buckets, int64_t tokens) {
  for (const TunedBucket& b : buckets)
    if (b.tokens >= tokens) return &b;
  return buckets.empty() ? nullptr : &buckets.back();
}

const TunedConfig* twell_choice(const TunedBucket& bucket) {
  using Path = TunedConfig::Path;
  auto applicable = [](const TunedConfig& c) { return c.path == Path::TwELL && c.dense_neurons == 0; };
  if (applicable(bucket.winner)) return &bucket.winner;
  if (bucket.winner.path != Path::Heuristic && bucket.runner_up && applicable(*bucket.runner_up)) return &*bucket.runner_up;
  return nullptr;
}

FfnSpec with_tuned_layout(const FfnSpec& spec, const TunedConfig& config) {
  FfnSpec s = spec;
  s.tile_n = config.tile_n;
  s.slots = config.slots;
  s.gate_cluster_m = config.cluster_m;
  return s;
}

std::string tuned_buckets_json(const std::vector<TunedBucket>& buckets) {
  json list = json::array();
  for (const TunedBucket& b : buckets) list.push_back(bucket_json(b));
  return list.dump();
}

}  // namespace twell
