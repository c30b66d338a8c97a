// twellc — twell's command-line driver.
//   twellc run [FILE.safetensors ...] [--layer N] ...   the main job (see `twellc run --help`)
//   twellc emit (FILE.mlir | --d-model D --d-ff F) ...   ahead-of-time MLIR / CUDA / PTX
//   twellc compile (--d-model D --d-ff F | --sample) -o DIR   ahead-of-time bundles for the runtime
//   twellc cache list|stats|clear|verify [--dir D]        the kernel cache directory
//   twellc tune --d-model D --d-ff F ...                 autotuning into the tuning database
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <stdexcept>

#include <fmt/format.h>

#include "commands.h"

namespace twellc {

bool Args::has(const std::string& name) const {
  for (const auto& [n, v] : options)
    if (n == name) return true;
  return false;
}

std::string Args::get(const std::string& name, const std::string& fallback) const {
  for (const auto& [n, v] : options)
    if (n == name) return v;
  return fallback;
}

namespace {
// The whole of `v` parsed by `parse` (std::stoll / std::stod), else std::invalid_argument naming the option.
template <class T, class Parse>
T parse_whole(const std::string& name, const std::string& v, const char* expected, Parse parse) {
  size_t used = 0;
  T r{};
  try {
    r = parse(v, &used);
  } catch (const std::out_of_range&) {
    throw std::invalid_argument(fmt::format("--{}: expected {}, got '{}' (out of range)", name, expected, v));
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != v.size() || v.empty()) throw std::invalid_argument(fmt::format("--{}: expected {}, got '{}'", name, expected, v));
  return r;
}
}  // namespace

long long Args::get_int(const std::string& name, long long fallback, long long min, long long max) const {
  if (!has(name)) return fallback;
  const std::string expected = fmt::format("an integer in {}..{}", min, max);
  const long long v = parse_whole<long long>(name, get(name), expected.c_str(),
                                             [](const std::string& v, size_t* used) { return std::stoll(v, used); });
  if (v < min || v > max) throw std::invalid_argument(fmt::format("--{}: expected {}, got {}", name, expected, v));
  return v;
}

double Args::get_double(const std::string& name, double fallback) const {
  if (!has(name)) return fallback;
  return parse_whole<double>(name, get(name), "a finite number", [](const std::string& v, size_t* used) { return std::stod(v, used); });
}

Args parse_args(const std::vector<std::string>& args, const std::vector<std::string>& flags,
                const std::vector<std::string>& valued) {
  auto in = [](const std::vector<std::string>& v, const std::string& s) {
    for (const auto& x : v)
      if (x == s) return true;
    return false;
  };
  Args a;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& s = args[i];
    if (s.size() > 1 && s[0] == '-' && s.rfind("--", 0) != 0)
      throw std::invalid_argument(fmt::format("unknown option {} (options are spelled --name)", s));
    if (s.rfind("--", 0) != 0 || s == "--") {
      a.positional.push_back(s);
      continue;
    }
    std::string name = s.substr(2), value;
    const size_t eq = name.find('=');
    const bool inline_value = eq != std::string::npos;
    if (inline_value) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
    }
    if (in(flags, name)) {
      if (inline_value) throw std::invalid_argument(fmt::format("--{} takes no value, got '{}'", name, value));
    } else if (in(valued, name)) {
      if (!inline_value) {
        if (i + 1 >= args.size())
          throw std::invalid_argument(fmt::format("--{}: expected a value after it, got the end of the command line", name));
        value = args[++i];
      }
    } else {
      throw std::invalid_argument(fmt::format("unknown option --{}", name));
    }
    if (a.has(name)) throw std::invalid_argument(fmt::format("--{} given twice", name));
    a.options.emplace_back(name, value);
  }
  return a;
}

}  // namespace twellc

int main(int argc, char** argv) {
  const std::string usage =
      "usage: twellc run [FILE.safetensors ...] [options]   run the sparse FFN on real data (default: embedded sample)\n"
      "       twellc emit (FILE.mlir | --d-model D --d-ff F) [--emit mlir|cuda|ptx] [--out DIR]\n"
      "       twellc compile (FILE.mlir | --d-model D --d-ff F | --sample) [--target sm_90a,sm_80] [--tuning-dir DIR] -o DIR\n"
      "                                                     ahead-of-time bundles\n"
      "       twellc tune --d-model D --d-ff F [--tokens M,...] [--density P | --weights FILE[,FILE...] --layer N]\n"
      "                                                     autotune into the tuning database (needs a GPU)\n"
      "       twellc cache list|stats|clear|verify [--dir D]   the kernel cache (twellc cache --help)\n"
      "       twellc <command> --help                       options of a command\n";
  if (argc < 2) {
    std::fprintf(stderr, "twellc: expected a command (run, emit, compile, tune or cache), got none\n%s", usage.c_str());
    return 2;
  }
  const std::string cmd = argv[1];
  std::vector<std::string> rest(argv + 2, argv + argc);
  if (cmd == "run" || cmd == "emit" || cmd == "compile" || cmd == "tune" || cmd == "cache") {
    int rc = 1;
    try {
      rc = cmd == "run"       ? twellc::run_command(rest)
           : cmd == "emit"    ? twellc::emit_command(rest)
           : cmd == "compile" ? twellc::compile_command(rest)
           : cmd == "tune"    ? twellc::tune_command(rest)
                              : twellc::cache_command(rest);
    } catch (const std::exception& e) {  // the commands report twell::Error themselves; anything else lands here
      std::fprintf(stderr, "twellc %s: error: %s\n", cmd.c_str(), e.what());
      return 1;
    }
    if (std::fflush(stdout) != 0 || std::ferror(stdout)) {
      std::fprintf(stderr, "twellc %s: error: writing standard output failed: %s\n", cmd.c_str(), std::strerror(errno));
      return 1;
    }
    return rc;
  }
  if (cmd == "--help" || cmd == "-h" || cmd == "help") {
    std::fputs(usage.c_str(), stdout);
    return 0;
  }
  std::fprintf(stderr, "twellc: unknown command '%s'\n%s", cmd.c_str(), usage.c_str());
  return 2;
}
