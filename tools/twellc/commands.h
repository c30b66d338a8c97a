// twellc's subcommands. Each returns the process exit code: 0 success, 1 a reported error, 2 bad usage.
#pragma once
#include <string>
#include <vector>

#include "twell/spec.h"

namespace twellc {

int run_command(const std::vector<std::string>& args);
int emit_command(const std::vector<std::string>& args);
int compile_command(const std::vector<std::string>& args);
int cache_command(const std::vector<std::string>& args);  // cache_command.cpp: list|stats|clear|verify
int tune_command(const std::vector<std::string>& args);

// Parses "--name value" / "--name=value" options and positional arguments; unknown options are errors.
struct Args {
  std::vector<std::string> positional;
  std::vector<std::pair<std::string, std::string>> options;  // name (without --), value ("" for flags)
  bool has(const std::string& name) const;
  std::string get(const std::string& name, const std::string& fallback = "") const;
  // The option's value as an integer in [min, max] (else std::invalid_argument naming the option).
  long long get_int(const std::string& name, long long fallback, long long min, long long max) const;
  double get_double(const std::string& name, double fallback) const;
};
// `flags` take no value; `valued` take one. Throws std::invalid_argument with a usage message.
Args parse_args(const std::vector<std::string>& args, const std::vector<std::string>& flags,
                const std::vector<std::string>& valued);

// "sm_90a" -> Target{90, true}: sm_XY or sm_XYa, at least sm_80 (else std::invalid_argument naming --target).
twell::Target parse_target(const std::string& s);

// The options of one FFN layer's shape and numerics (spec_options.cpp): --d-model and --d-ff (both
// required), --tile-n, --slots, --threshold, --activation, --dtype, --down-layout, --non-gated,
// --consumer, --cluster-m. Throws std::invalid_argument naming the option.
inline const std::vector<std::string> kShapeOptions = {"d-model",    "d-ff",  "tile-n",      "slots",     "threshold",
                                                       "activation", "dtype", "down-layout", "non-gated", "consumer",
                                                       "cluster-m"};
inline const std::vector<std::string> kShapeValueOptions = {"d-model",    "d-ff",  "tile-n",      "slots",    "threshold",
                                                            "activation", "dtype", "down-layout", "consumer", "cluster-m"};
twell::FfnSpec spec_from_args(const Args& args);

}  // namespace twellc
