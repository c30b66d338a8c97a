#include "bundle.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <functional>
#include <thread>
#include <limits>
#include <cstring>
#include <fstream>
#include <set>
#include <sstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "twell/device/params.h"
#include "twell/error.h"
#include "twell/kernels/validate.h"

namespace twell::detail {
namespace {

using nlohmann::json;
namespace fs = std::filesystem;

std::string hex64(uint64_t v) { return fmt::format("{:016x}", v); }
std::string checksum(const void* data, size_t bytes) { return hex64(XXH64(data, bytes, 0)); }

// The manifest's own checksum: XXH64 of its compact text without the "checksum" field.
std::string manifest_checksum(json manifest) {
  manifest.erase("checksum");
  const std::string text = manifest.dump();
  return checksum(text.data(), text.size());
}

[[noreturn]] void parse_error(const fs::path& dir, const std::string& what) {
  throw Error(ErrorCode::Parse, fmt::format("bundle {}: {}", dir.string(), what));
}

json layout_json(const TwellLayout& l) {
  return {{"tile_n", l.tile_n}, {"slots", l.slots}, {"value", to_string(l.value)}, {"index_bits", l.index_bits},
          {"activation", to_string(l.activation)}, {"threshold", l.threshold}};
}

json spec_json(const FfnSpec& s) {
  json j = {{"d_model", s.d_model},   {"d_ff", s.d_ff},         {"gated", s.gated},
            {"activation", to_string(s.activation)}, {"threshold", s.threshold}, {"dtype", to_string(s.dtype)},
            {"down_layout", to_string(s.down_layout)}};
  if (s.tile_n) j["tile_n"] = *s.tile_n;
  if (s.slots) j["slots"] = *s.slots;
  if (s.consumer) j["consumer"] = to_string(*s.consumer);
  if (s.gate_cluster_m) j["gate_cluster_m"] = *s.gate_cluster_m;
  return j;
}

json kernel_json(const kernels::KernelSource& k) {
  return {{"kind", kernels::to_string(k.kind)},
          {"entry", k.name},
          {"params_version", device::kParamsVersion},
          {"config",
           {{"d_model", k.d_model}, {"d_ff", k.d_ff}, {"tile_n", k.tile_n}, {"down_in_out", k.down_in_out},
            {"mainloop", kernels::to_string(k.mainloop)}, {"consumer", kernels::to_string(k.consumer)},
            {"gated", k.gated}, {"cta_k", k.cta_k}, {"stages", k.stages}, {"operand_alignment", k.operand_alignment}}},
          {"launch",
           {{"threads", k.threads}, {"cta_m", k.cta_m}, {"cluster_m", k.cluster_m}, {"grid_y", k.grid_y},
            {"persistent", k.persistent}, {"tma_persistent", k.tma_persistent},
            {"dependent_launch", k.dependent_launch}}},
          {"smem_bytes", k.smem_bytes}};
}

// A value as an error message shows it: at most 80 characters of its JSON.
std::string shown(const json& v) {
  std::string text = v.dump();
  return text.size() > 80 ? text.substr(0, 77) + "..." : text;
}

// Reads one typed field, naming it in the error: integers must be JSON integers within T's range
// (no silent narrowing, no floats or booleans), booleans booleans, strings strings.
template <typename T>
T field(const fs::path& dir, const json& j, const char* key, const std::string& where) {
  if (!j.is_object() || !j.contains(key)) parse_error(dir, fmt::format("{}: expected a field \"{}\", found none", where, key));
  const json& v = j.at(key);
  if constexpr (std::is_same_v<T, std::string>) {
    if (v.is_string()) return v.get<std::string>();
    parse_error(dir, fmt::format("{}: field \"{}\": expected a string, found {}", where, key, shown(v)));
  } else if constexpr (std::is_same_v<T, bool>) {
    if (v.is_boolean()) return v.get<bool>();
    parse_error(dir, fmt::format("{}: field \"{}\": expected true or false, found {}", where, key, shown(v)));
  } else if constexpr (std::is_floating_point_v<T>) {
    if (v.is_number()) return v.get<T>();
    parse_error(dir, fmt::format("{}: field \"{}\": expected a number, found {}", where, key, shown(v)));
  } else {
    const bool fits = v.is_number_unsigned()
                          ? v.get<uint64_t>() <= static_cast<uint64_t>(std::numeric_limits<T>::max())
                          : v.is_number_integer() && v.get<int64_t>() >= static_cast<int64_t>(std::numeric_limits<T>::min()) &&
                                (std::is_unsigned_v<T> || v.get<int64_t>() <= static_cast<int64_t>(std::numeric_limits<T>::max()));
    if (fits) return v.is_number_unsigned() ? static_cast<T>(v.get<uint64_t>()) : static_cast<T>(v.get<int64_t>());
    parse_error(dir, fmt::format("{}: field \"{}\": expected an integer in {}..{}, found {}", where, key,
                                 std::numeric_limits<T>::min(), std::numeric_limits<T>::max(), shown(v)));
  }
}

template <typename Enum>
Enum enum_field(const fs::path& dir, const json& j, const char* key, const std::string& where,
                std::initializer_list<Enum> values) {
  const std::string text = field<std::string>(dir, j, key, where);
  std::string names;
  for (Enum v : values) {
    if (text == kernels::to_string(v)) return v;
    names += (names.empty() ? "" : ", ") + std::string(kernels::to_string(v));
  }
  parse_error(dir, fmt::format("{}: field \"{}\": expected one of {}, found \"{}\"", where, key, names, text));
}

kernels::KernelSource kernel_from_json(const fs::path& dir, const std::string& name, const json& j) {
  const std::string where = "kernel " + name;
  kernels::KernelSource k;
  const std::string kind = field<std::string>(dir, j, "kind", where);
  const auto parsed = kernels::parse_kernel_kind(kind);
  if (!parsed) parse_error(dir, fmt::format("{}: field \"kind\": expected a twell kernel kind, found \"{}\"", where, kind));
  k.kind = *parsed;
  k.name = field<std::string>(dir, j, "entry", where);
  if (k.name != name) parse_error(dir, fmt::format("{}: field \"entry\": expected \"{}\", found \"{}\"", where, name, k.name));
  const auto params = field<uint32_t>(dir, j, "params_version", where);
  if (params != device::kParamsVersion)
    parse_error(dir, fmt::format("{}: params_version: expected {} (this runtime's parameter blocks), found {}; rebuild the "
                                 "bundle with this twell's twellc compile", where, device::kParamsVersion, params));
  const json& c = j.contains("config") ? j.at("config") : json();
  const std::string cw = where + " config";
  k.d_model = field<int64_t>(dir, c, "d_model", cw);
  k.d_ff = field<int64_t>(dir, c, "d_ff", cw);
  k.tile_n = field<int>(dir, c, "tile_n", cw);
  k.down_in_out = field<bool>(dir, c, "down_in_out", cw);
  using kernels::ConsumerKind;
  using kernels::GateMainloop;
  k.mainloop = enum_field(dir, c, "mainloop", cw, {GateMainloop::None, GateMainloop::Fma, GateMainloop::MmaSync, GateMainloop::Wgmma});
  k.consumer = enum_field(dir, c, "consumer", cw,
                          {ConsumerKind::None, ConsumerKind::CtaRow, ConsumerKind::WarpRow, ConsumerKind::TokenBlock});
  k.gated = field<bool>(dir, c, "gated", cw);
  k.cta_k = field<int>(dir, c, "cta_k", cw);
  k.stages = field<int>(dir, c, "stages", cw);
  k.operand_alignment = field<int>(dir, c, "operand_alignment", cw);
  const json& l = j.contains("launch") ? j.at("launch") : json();
  const std::string lw = where + " launch";
  k.threads = field<int>(dir, l, "threads", lw);
  k.cta_m = field<int>(dir, l, "cta_m", lw);
  k.cluster_m = field<int>(dir, l, "cluster_m", lw);
  k.grid_y = field<int>(dir, l, "grid_y", lw);
  k.persistent = field<bool>(dir, l, "persistent", lw);
  k.tma_persistent = field<bool>(dir, l, "tma_persistent", lw);
  k.dependent_launch = field<bool>(dir, l, "dependent_launch", lw);
  k.smem_bytes = field<int>(dir, j, "smem_bytes", where);
  // Every value is checked against its kind's contract once the binaries are read (validate.h).
  return k;
}

// The bytes of a regular file (after symbolic links) of at most `max_bytes`: anything else (a FIFO,
// a device, a directory) is refused before it is opened, so a load never blocks or reads without end.
std::string read_file(const fs::path& path, uint64_t max_bytes) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0)
    throw Error(ErrorCode::NotFound, fmt::format("cannot open {}: {}", path.string(), std::strerror(errno)));
  if (!S_ISREG(st.st_mode))
    throw Error(ErrorCode::Parse, fmt::format("{}: expected a regular file, found {}", path.string(),
                                              S_ISDIR(st.st_mode) ? "a directory" : "a FIFO, socket or device"));
  if (static_cast<uint64_t>(st.st_size) > max_bytes)
    throw Error(ErrorCode::Parse, fmt::format("{}: expected at most {} bytes, found {}", path.string(), max_bytes, st.st_size));
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(ErrorCode::NotFound, fmt::format("cannot open {}: {}", path.string(), std::strerror(errno)));
  std::string data(static_cast<size_t>(st.st_size), '\0');
  in.read(data.data(), static_cast<std::streamsize>(data.size()));
  if (static_cast<uint64_t>(in.gcount()) != data.size())
    throw Error(ErrorCode::Io, fmt::format("cannot read {}: expected {} bytes, read {}", path.string(), data.size(), in.gcount()));
  return data;
}

constexpr uint64_t kMaxManifestBytes = uint64_t{64} << 20;
constexpr uint64_t kMaxKernelFileBytes = uint64_t{256} << 20;
constexpr int kMaxManifestDepth = 16;  // the schema nests 5 deep

// JSON whose nesting is bounded while parsing: a manifest nested without end must not exhaust the
// stack (the checksum's dump recurses). Throws json::exception, or std::length_error when too deep.
json parse_manifest_json(const std::string& text) {
  return json::parse(text, [](int depth, json::parse_event_t, json&) {
    if (depth > kMaxManifestDepth) throw std::length_error("nested deeper than " + std::to_string(kMaxManifestDepth) + " levels");
    return true;
  });
}

// A kernel's name is its entry symbol and its files' stem: a C identifier, nothing else.
bool is_identifier(const std::string& name) {
  return !name.empty() && name.size() <= 200 && !std::isdigit(static_cast<unsigned char>(name[0])) &&
         std::all_of(name.begin(), name.end(), [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; });
}

// A file name inside the bundle's directory: printable, no separator, not . or ..
bool is_file_name(const std::string& name) {
  return !name.empty() && name != "." && name != ".." && name.find('/') == std::string::npos &&
         std::all_of(name.begin(), name.end(), [](char c) { return c > ' ' && c != 0x7f; });
}

// A kernel file named by the manifest: present, of the recorded size and checksum.
std::string checked_file(const fs::path& dir, const std::string& kernel, const json& files, const char* role, bool required) {
  if (!files.is_object() || !files.contains(role)) {
    if (!required) return {};
    parse_error(dir, fmt::format("kernel {}: files: expected a \"{}\" entry, found none", kernel, role));
  }
  const json& f = files.at(role);
  const std::string where = fmt::format("kernel {} {} file", kernel, role);
  const auto name = field<std::string>(dir, f, "path", where);
  if (!is_file_name(name))
    parse_error(dir, fmt::format("{}: path: expected a file name inside the bundle, found {}", where, shown(json(name))));
  const auto bytes = field<uint64_t>(dir, f, "bytes", where);
  if (bytes < 1 || bytes > kMaxKernelFileBytes)
    parse_error(dir, fmt::format("{}: bytes: expected 1..{}, found {}", where, kMaxKernelFileBytes, bytes));
  const auto sum = field<std::string>(dir, f, "xxh64", where);
  const fs::path path = dir / name;
  std::string data;
  try {
    // At most the recorded size + 1: a longer file is reported as such without reading it whole.
    data = read_file(path, bytes);
  } catch (const Error& e) {
    throw Error(e.code(), fmt::format("bundle {}: kernel {}: {} file ({}): {}", dir.string(), kernel, role, name, e.what()));
  }
  if (data.size() != bytes)
    parse_error(dir, fmt::format("kernel {}: {} ({}): expected {} bytes, found {} (truncated or replaced)", kernel, role,
                                 name, bytes, data.size()));
  const std::string actual = checksum(data.data(), data.size());
  if (actual != sum)
    parse_error(dir, fmt::format("kernel {}: {} ({}): expected XXH64 {}, found {} (the file was changed)", kernel, role,
                                 name, sum, actual));
  return data;
}

// Writes `data` to `path` through a temporary file in the same directory: every step checked.
void write_file(const fs::path& path, std::string_view data) {
  // Unique per process, thread and call: concurrent writers of one directory never share a temporary.
  static std::atomic<uint64_t> counter{0};
  const fs::path tmp = path.string() + fmt::format(".tmp.{}.{}.{}", ::getpid(), std::hash<std::thread::id>{}(std::this_thread::get_id()),
                                                   counter.fetch_add(1));
  auto fail = [&](const char* step) {
    const int err = errno;
    ::unlink(tmp.c_str());
    throw Error(ErrorCode::Io, fmt::format("writing the bundle file {}: {} failed: {}", path.string(), step, std::strerror(err)));
  };
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) fail("open");
  size_t done = 0;
  while (done < data.size()) {
    const ssize_t n = ::write(fd, data.data() + done, data.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      ::close(fd);
      fail("write");
    }
    done += static_cast<size_t>(n);
  }
  if (::fsync(fd) != 0) {
    ::close(fd);
    fail("fsync");
  }
  if (::close(fd) != 0) fail("close");
  if (::rename(tmp.c_str(), path.c_str()) != 0) fail("rename");
}

}  // namespace

std::optional<Target> parse_target(const std::string& arch) {
  if (arch.size() < 5 || arch.compare(0, 3, "sm_") != 0) return std::nullopt;
  Target t;
  std::string digits = arch.substr(3);
  t.arch_specific = !digits.empty() && digits.back() == 'a';
  if (t.arch_specific) digits.pop_back();
  if (digits.empty() || digits.size() > 3 || digits.find_first_not_of("0123456789") != std::string::npos) return std::nullopt;
  t.sm = std::stoi(digits);
  return t;
}

// A set's kernels are what its request asks for: an FFN set a gate and a consumer (and the four
// decode kernels, or none) of one shape and its layout; an auxiliary set one kernel of its kind.
void Bundle::check_set(const Bundle& b, const BundleSet& set) {
  const std::string where = "set " + set.request;
  auto kind_of = [&](const std::string& name) { return b.kernels_.at(name)->source; };
  auto expect_kinds = [&](const char* list, const std::vector<std::string>& names, std::initializer_list<kernels::KernelKind> kinds) {
    std::string expected, found;
    for (kernels::KernelKind k : kinds) expected += (expected.empty() ? "" : ", ") + std::string(kernels::to_string(k));
    for (const std::string& n : names) found += (found.empty() ? "" : ", ") + std::string(kernels::to_string(kind_of(n).kind));
    if (expected != found) parse_error(b.dir_, fmt::format("{}: {}: expected the kinds [{}], found [{}]", where, list, expected, found));
  };
  using kernels::KernelKind;
  if (set.request.rfind("ffn ", 0) == 0) {
    expect_kinds("kernels", set.kernels, {KernelKind::GateTwell, KernelKind::GatedDown});
    if (!set.decode.empty())
      expect_kinds("decode", set.decode,
                   {KernelKind::DecodeGate, KernelKind::DecodeUp, KernelKind::DecodeDown, KernelKind::DecodeGateSmall, KernelKind::DecodeFused});
    if (!set.layout) parse_error(b.dir_, fmt::format("{}: expected a layout, found none", where));
    const TwellLayout& l = *set.layout;
    if ((l.tile_n & (l.tile_n - 1)) != 0 || l.tile_n < 32 || l.tile_n > 1024 || l.slots < 1 || l.slots > l.tile_n || l.index_bits != 16)
      parse_error(b.dir_, fmt::format("{}: layout: expected tile_n a power of two in 32..1024, slots 1..tile_n and index_bits 16, "
                                      "found {}, {} and {}", where, l.tile_n, l.slots, l.index_bits));
    const kernels::KernelSource gate = kind_of(set.kernels.front());
    // The emitter names every FFN kernel by its shape and layout (..._k<d_model>_n<d_ff>_t<tile_n>_s<slots>_<activation>_<dtype>_),
    // and the binary holds that name: the layout and the kernels must say the same.
    const std::string infix = fmt::format("_k{}_n{}_t{}_s{}_{}_{}_", gate.d_model, gate.d_ff, l.tile_n, l.slots, to_string(l.activation),
                                          to_string(l.value));
    for (const auto* list : {&set.kernels, &set.decode})
      for (const std::string& n : *list) {
        const kernels::KernelSource k = kind_of(n);
        if (k.d_model != gate.d_model || k.d_ff != gate.d_ff || k.tile_n != l.tile_n)
          parse_error(b.dir_, fmt::format("{}: kernel {}: expected d_model {}, d_ff {} and the layout's tile_n {}, found {}, {} and {}",
                                          where, n, gate.d_model, gate.d_ff, l.tile_n, k.d_model, k.d_ff, k.tile_n));
        if (n.find(infix) == std::string::npos)
          parse_error(b.dir_, fmt::format("{}: kernel {}: expected a kernel of the set's layout ({}), found another", where, n, infix));
        if (k.kind != kernels::KernelKind::GateTwell &&
            n.find(std::string("_") + (k.down_in_out ? "in_out" : "out_in") + "_") == std::string::npos)
          parse_error(b.dir_, fmt::format("{}: kernel {}: down_in_out {}: expected the kernel's own w_down layout", where, n, k.down_in_out));
      }
    return;
  }
  if (set.request.rfind("aux ", 0) == 0) {
    const std::string kind = set.request.substr(4, set.request.find(' ', 4) - 4);
    const auto parsed = kernels::parse_kernel_kind(kind);
    if (!parsed || set.kernels.size() != 1 || !set.decode.empty() || kind_of(set.kernels.front()).kind != *parsed)
      parse_error(b.dir_, fmt::format("{}: expected one kernel of kind {}, found {} kernels{}", where, kind, set.kernels.size(),
                                      set.kernels.empty() ? "" : std::string(" (the first: ") + kernels::to_string(kind_of(set.kernels.front()).kind) + ")"));
    // The request's fields are in the helper's name (and so in its binary).
    auto field_of = [&](const std::string& key) {
      const size_t at = set.request.find(" " + key + "=");
      if (at == std::string::npos) return std::string();
      const size_t from = at + key.size() + 2;
      return set.request.substr(from, set.request.find(' ', from) - from);
    };
    const std::string& name = set.kernels.front();
    std::string expected;
    if (*parsed == KernelKind::DenseGatedMul) expected = fmt::format("twell_dense_gated_mul_{}_{}", field_of("dtype"), field_of("activation"));
    if (*parsed == KernelKind::DenseGatedUp)
      expected = fmt::format("twell_dense_gated_up_k{}_n{}_{}_{}", field_of("d_model"), field_of("d_ff"), field_of("activation"),
                             field_of("dtype"));
    if (*parsed == KernelKind::TrainDenseForward || *parsed == KernelKind::TrainDenseBackward)
      expected = fmt::format("twell_{}_{}_{}", kernels::to_string(*parsed), field_of("dtype"), field_of("activation"));
    if (*parsed == KernelKind::WeightTranspose) expected = "twell_transpose16";
    if (*parsed == KernelKind::NeuronPermute) expected = "twell_permute16";
    if (*parsed == KernelKind::TrainRowBackward)
      expected = fmt::format("twell_train_row_backward_k{}_n{}_t{}_s{}_{}_{}_gated{}_th{}", field_of("d_model"), field_of("d_ff"),
                             field_of("tile_n"), field_of("slots"), field_of("activation"), field_of("dtype"), field_of("gated"),
                             field_of("threshold").substr(std::min<size_t>(2, field_of("threshold").size())));
    if (*parsed == KernelKind::TrainWeightGrad)
      expected = fmt::format("twell_train_weight_grad_k{}_n{}_t{}_s{}_{}_gated{}", field_of("d_model"), field_of("d_ff"),
                             field_of("tile_n"), field_of("slots"), field_of("dtype"), field_of("gated"));
    if (name != expected)
      parse_error(b.dir_, fmt::format("{}: expected the kernel {}, found {}", where, expected, name));
    if (*parsed == KernelKind::DenseGatedUp) {
      const kernels::KernelSource k = kind_of(name);
      if (std::to_string(k.d_model) != field_of("d_model") || std::to_string(k.d_ff) != field_of("d_ff"))
        parse_error(b.dir_, fmt::format("{}: kernel {}: expected d_model {} and d_ff {}, found {} and {}", where, name, field_of("d_model"),
                                        field_of("d_ff"), k.d_model, k.d_ff));
    }
    return;
  }
  parse_error(b.dir_, fmt::format("{}: request: expected \"ffn ...\" or \"aux ...\"", where));
}

const BundleSet* Bundle::find(const std::string& request) const {
  const auto it = sets_.find(request);
  return it == sets_.end() ? nullptr : &it->second;
}

std::shared_ptr<const BundleKernel> Bundle::kernel(const std::string& name) const {
  const auto it = kernels_.find(name);
  return it == kernels_.end() ? nullptr : it->second;
}

std::shared_ptr<const Bundle> Bundle::load(const fs::path& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec))
    throw Error(ErrorCode::NotFound, fmt::format("bundle {}: expected a directory made by twellc compile, found {}", dir.string(),
                                                 fs::exists(dir, ec) ? "a file" : "nothing"));
  const fs::path manifest_path = dir / "manifest.json";
  if (!fs::exists(manifest_path, ec))
    throw Error(ErrorCode::NotFound, fmt::format("bundle {}: expected manifest.json, found none (not a bundle, or its "
                                                 "writing did not finish)", dir.string()));
  json m;
  std::string text;
  try {
    text = read_file(manifest_path, kMaxManifestBytes);
  } catch (const Error& e) {
    throw Error(e.code(), fmt::format("bundle {}: manifest.json: {}", dir.string(), e.what()));
  }
  try {
    m = parse_manifest_json(text);
  } catch (const json::exception& e) {
    parse_error(dir, fmt::format("manifest.json: expected JSON, found a parse error: {}", e.what()));
  } catch (const std::length_error& e) {
    parse_error(dir, fmt::format("manifest.json: expected the bundle schema, found JSON {}", e.what()));
  }
  if (!m.is_object()) parse_error(dir, "manifest.json: expected a JSON object");
  const auto format = field<std::string>(dir, m, "format", "manifest");
  if (format != kBundleFormat) parse_error(dir, fmt::format("manifest: format: expected \"{}\", found \"{}\"", kBundleFormat, format));
  const auto schema = field<int>(dir, m, "schema_version", "manifest");
  if (schema != kBundleSchemaVersion)
    parse_error(dir, fmt::format("manifest: schema_version: expected {}, found {} (made by another twell version; "
                                 "rebuild it with this one's twellc compile)", kBundleSchemaVersion, schema));
  const auto sum = field<std::string>(dir, m, "checksum", "manifest");
  if (sum != manifest_checksum(m))
    parse_error(dir, fmt::format("manifest: checksum: expected {} (the manifest's contents), found {}: manifest.json was "
                                 "edited after twellc compile wrote it", manifest_checksum(m), sum));
  auto bundle = std::make_shared<Bundle>();
  bundle->dir_ = dir;
  bundle->twell_version_ = field<std::string>(dir, m, "twell_version", "manifest");
  const auto arch = field<std::string>(dir, m, "target", "manifest");
  const auto target = parse_target(arch);
  if (!target) parse_error(dir, fmt::format("manifest: target: expected an arch like sm_90a, found \"{}\"", arch));
  bundle->target_ = *target;
  if (!m.contains("kernels") || !m.at("kernels").is_object()) parse_error(dir, "manifest: kernels: expected an object");
  for (const auto& [name, j] : m.at("kernels").items()) {
    if (!is_identifier(name)) parse_error(dir, fmt::format("kernels: expected kernel names that are C identifiers, found {}", shown(json(name))));
    auto k = std::make_shared<BundleKernel>();
    k->source = kernel_from_json(dir, name, j);
    const json files = j.contains("files") ? j.at("files") : json();
    CacheEntry binary;
    binary.ptx = checked_file(dir, name, files, "ptx", true);
    const std::string cubin = checked_file(dir, name, files, "cubin", true);
    binary.cubin.assign(cubin.begin(), cubin.end());
    k->source.source = checked_file(dir, name, files, "source", false);
    // The files must be this kernel's: its entry point in the PTX and in the cubin's symbols.
    if (binary.ptx.find(".entry " + name) == std::string::npos)
      parse_error(dir, fmt::format("kernel {}: ptx: expected the entry {}, found a PTX without it", name, name));
    if (cubin.find(name) == std::string::npos)
      parse_error(dir, fmt::format("kernel {}: cubin: expected the entry {}, found a cubin without it", name, name));
    if (const std::string wrong = kernels::validate_kernel(k->source, bundle->target_); !wrong.empty())
      parse_error(dir, fmt::format("kernel {} ({}): {}", name, kernels::to_string(k->source.kind), wrong));
    // The description's block and cluster are the binary's (__launch_bounds__, __cluster_dims__ in its PTX).
    const std::string maxntid = fmt::format(".maxntid {}, 1, 1", k->source.threads);
    if (binary.ptx.find(maxntid) == std::string::npos)
      parse_error(dir, fmt::format("kernel {}: launch threads: expected the PTX's {} (its launch bounds), found another", name, maxntid));
    const bool clustered = binary.ptx.find(".reqnctapercluster") != std::string::npos;
    if (clustered != (k->source.cluster_m > 1) ||
        (clustered && binary.ptx.find(fmt::format(".reqnctapercluster {}, 1, 1", k->source.cluster_m)) == std::string::npos))
      parse_error(dir, fmt::format("kernel {}: launch cluster_m: expected the PTX's cluster dimensions, found cluster_m {}", name,
                                   k->source.cluster_m));
    k->binary = std::make_shared<const CacheEntry>(std::move(binary));
    bundle->kernels_.emplace(name, std::move(k));
  }
  if (!m.contains("sets") || !m.at("sets").is_array()) parse_error(dir, "manifest: sets: expected an array");
  for (const json& s : m.at("sets")) {
    BundleSet set;
    set.request = field<std::string>(dir, s, "request", "set");
    const std::string where = "set " + set.request;
    set.ir = s.contains("ir") ? field<std::string>(dir, s, "ir", where) : std::string();
    if (s.contains("spec")) {  // informational, kept so that a bundle saved again still says it
      const json& j = s.at("spec");
      const std::string w = where + " spec";
      FfnSpec spec;
      spec.d_model = field<int64_t>(dir, j, "d_model", w);
      spec.d_ff = field<int64_t>(dir, j, "d_ff", w);
      spec.gated = field<bool>(dir, j, "gated", w);
      spec.threshold = field<float>(dir, j, "threshold", w);
      spec.activation = field<std::string>(dir, j, "activation", w) == "silu" ? Activation::SiLU : Activation::ReLU;
      spec.dtype = field<std::string>(dir, j, "dtype", w) == "f16" ? DType::FP16 : DType::BF16;
      spec.down_layout = field<std::string>(dir, j, "down_layout", w) == "in_out" ? WeightLayout::InOut : WeightLayout::OutIn;
      if (j.contains("tile_n")) spec.tile_n = field<int>(dir, j, "tile_n", w);
      if (j.contains("slots")) spec.slots = field<int>(dir, j, "slots", w);
      if (j.contains("consumer"))
        spec.consumer = field<std::string>(dir, j, "consumer", w) == "token_block" ? ConsumerVariant::TokenBlock : ConsumerVariant::RowGather;
      if (j.contains("gate_cluster_m")) spec.gate_cluster_m = field<int>(dir, j, "gate_cluster_m", w);
      set.spec = spec;
    }
    if (s.contains("layout")) {
      const json& l = s.at("layout");
      TwellLayout layout;
      layout.tile_n = field<int>(dir, l, "tile_n", where + " layout");
      layout.slots = field<int>(dir, l, "slots", where + " layout");
      layout.index_bits = field<int>(dir, l, "index_bits", where + " layout");
      layout.threshold = field<float>(dir, l, "threshold", where + " layout");
      const auto value = field<std::string>(dir, l, "value", where + " layout");
      const auto activation = field<std::string>(dir, l, "activation", where + " layout");
      if ((value != "bf16" && value != "f16") || (activation != "relu" && activation != "silu") || layout.tile_n < 1 ||
          layout.slots < 1)
        parse_error(dir, fmt::format("{}: layout: expected value bf16|f16, activation relu|silu, tile_n and slots >= 1, "
                                     "found {}", where, l.dump()));
      layout.value = value == "bf16" ? DType::BF16 : DType::FP16;
      layout.activation = activation == "relu" ? Activation::ReLU : Activation::SiLU;
      set.layout = layout;
    }
    for (const char* list : {"kernels", "decode"}) {
      if (!s.contains(list)) continue;
      for (const json& n : s.at(list)) {
        if (!n.is_string()) parse_error(dir, fmt::format("{}: {}: expected kernel names, found {}", where, list, n.dump()));
        const std::string name = n.get<std::string>();
        if (!bundle->kernels_.count(name))
          parse_error(dir, fmt::format("{}: names the kernel {}, which the manifest's kernels do not hold", where, name));
        (std::string(list) == "kernels" ? set.kernels : set.decode).push_back(name);
      }
    }
    check_set(*bundle, set);
    if (!bundle->sets_.emplace(set.request, std::move(set)).second)
      parse_error(dir, fmt::format("{}: expected each request once, found it twice", where));
  }
  if (m.contains("tuning")) {
    if (!m.at("tuning").is_array())
      parse_error(dir, fmt::format("manifest: tuning: expected an array, found {}", shown(m.at("tuning"))));
    for (size_t i = 0; i < m.at("tuning").size(); ++i) {
      TuningFile file;
      try {
        file = parse_tuning_file(m.at("tuning")[i].dump());
      } catch (const std::invalid_argument& e) {
        parse_error(dir, fmt::format("manifest: tuning[{}]: {}", i, e.what()));
      }
      if (file.hardware.arch != arch)
        parse_error(dir, fmt::format("manifest: tuning[{}]: hardware.arch: expected the bundle's target {}, found {}",
                                     i, arch, file.hardware.arch));
      bundle->tuning_.push_back(std::move(file));
    }
  }
  return bundle;
}

void write_bundle(const fs::path& dir, const Target& target, const std::map<std::string, BundleSet>& sets,
                  const std::map<std::string, std::shared_ptr<const BundleKernel>>& kernels,
                  const std::vector<TuningFile>& tuning) {
  for (const TuningFile& file : tuning)
    if (file.hardware.arch != target.arch())
      throw Error(ErrorCode::InvalidArgument,
                  fmt::format("write_bundle: the tuning entry of {}: hardware.arch: expected the "
                              "bundle's target {}, got {}",
                              tuning_key_text(file.spec), target.arch(), file.hardware.arch));
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw Error(ErrorCode::Io, fmt::format("writing the bundle {}: cannot create the directory: {}", dir.string(), ec.message()));
  // The files of a bundle already there (when its manifest reads as one), to remove those this one lacks.
  std::vector<std::string> old_files;
  std::set<std::string> new_files;
  try {
    const json old = parse_manifest_json(read_file(dir / "manifest.json", kMaxManifestBytes));
    for (const auto& [name, k] : old.at("kernels").items())
      for (const auto& [role, f] : k.at("files").items()) {
        const std::string file = f.at("path").get<std::string>();
        if (is_file_name(file)) old_files.push_back(file);
      }
  } catch (const std::exception&) {
    old_files.clear();  // no bundle there (or not one we can read): remove nothing
  }
  json m;
  m["format"] = kBundleFormat;
  m["schema_version"] = kBundleSchemaVersion;
  m["twell_version"] = TWELL_VERSION;
  m["target"] = target.arch();
  m["kernels"] = json::object();
  for (const auto& [name, k] : kernels) {
    if (!is_identifier(name))
      throw Error(ErrorCode::InvalidArgument, fmt::format("write_bundle: kernel name {}: expected a C identifier", shown(json(name))));
    json j = kernel_json(k->source);
    json files;
    auto put = [&](const char* role, const std::string& ext, std::string_view data) {
      const std::string file = name + ext;
      write_file(dir / file, data);
      new_files.insert(file);
      files[role] = {{"path", file}, {"bytes", data.size()}, {"xxh64", checksum(data.data(), data.size())}};
    };
    put("cubin", ".cubin", std::string_view(k->binary->cubin.data(), k->binary->cubin.size()));
    put("ptx", ".ptx", k->binary->ptx);
    if (!k->source.source.empty()) put("source", ".cu", k->source.source);
    j["files"] = files;
    m["kernels"][name] = j;
  }
  m["sets"] = json::array();
  for (const auto& [request, s] : sets) {
    json j = {{"request", request}, {"kernels", s.kernels}};
    if (!s.decode.empty()) j["decode"] = s.decode;
    if (s.spec) j["spec"] = spec_json(*s.spec);
    if (s.layout) j["layout"] = layout_json(*s.layout);
    if (!s.ir.empty()) j["ir"] = s.ir;
    for (const auto* list : {&s.kernels, &s.decode})
      for (const std::string& name : *list)
        if (!kernels.count(name))
          throw Error(ErrorCode::InvalidArgument, fmt::format("write_bundle: set {} names the kernel {}, which was not given",
                                                              request, name));
    m["sets"].push_back(j);
  }
  for (const TuningFile& file : tuning) m["tuning"].push_back(json::parse(tuning_file_json(file, -1)));
  m["checksum"] = manifest_checksum(m);
  write_file(dir / "manifest.json", m.dump(2) + "\n");
  // A bundle written over another keeps none of the old one's kernel files (only files its manifest
  // named: nothing else in the directory is touched).
  for (const std::string& file : old_files)
    if (!new_files.count(file)) fs::remove(dir / file, ec);
}

}  // namespace twell::detail
