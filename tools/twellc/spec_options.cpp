// The options that describe one FFN layer (twellc emit and twellc compile) and --target.
#include <cmath>
#include <stdexcept>

#include <fmt/format.h>

#include "commands.h"

namespace twellc {

twell::Target parse_target(const std::string& s) {
  // sm_<major><minor>[a]; the generator then checks that NVRTC can build for it.
  const bool a = !s.empty() && s.back() == 'a';
  const std::string digits = s.substr(0, s.size() - (a ? 1 : 0));
  if (digits.rfind("sm_", 0) != 0 || digits.size() < 5 || digits.size() > 6 || digits[3] == '0' ||
      digits.find_first_not_of("0123456789", 3) != std::string::npos)
    throw std::invalid_argument(fmt::format("--target: expected sm_XY or sm_XYa (e.g. sm_90a), got '{}'", s));
  const int sm = std::stoi(digits.substr(3));
  if (sm < 80) throw std::invalid_argument(fmt::format("--target: twell needs sm_80 or newer (bf16 cvt), got '{}'", s));
  return twell::Target{sm, a};
}

twell::FfnSpec spec_from_args(const Args& args) {
  if (!args.has("d-model") || !args.has("d-ff"))
    throw std::invalid_argument(
        !args.has("d-model") && !args.has("d-ff")
            ? std::string("expected FILE.mlir or --d-model D --d-ff F, got neither")
            : fmt::format("--{}: expected it beside --{} (a shape needs both d_model and d_ff), got only --{}",
                          args.has("d-model") ? "d-ff" : "d-model", args.has("d-model") ? "d-model" : "d-ff",
                          args.has("d-model") ? "d-model" : "d-ff"));
  twell::FfnSpec spec;
  spec.d_model = args.get_int("d-model", 0, 1, 65536);
  spec.d_ff = args.get_int("d-ff", 0, 1, int64_t{1} << 24);
  const double threshold = args.get_double("threshold", 0.0);
  spec.threshold = static_cast<float>(threshold);
  if (!std::isfinite(spec.threshold))
    throw std::invalid_argument(fmt::format("--threshold: expected a finite f32 (|t| <= 3.4e38), got {}", threshold));
  // The layout's rules (#twell.layout's verifier), checked here so that the errors name the options.
  if (args.has("tile-n")) {
    spec.tile_n = static_cast<int>(args.get_int("tile-n", 256, 32, 1024));
    if ((*spec.tile_n & (*spec.tile_n - 1)) != 0)
      throw std::invalid_argument(fmt::format("--tile-n: expected a power of two in 32..1024, got {}", *spec.tile_n));
  }
  if (args.has("slots")) {
    const int tile_n = spec.tile_n.value_or(256);
    spec.slots = static_cast<int>(args.get_int("slots", 31, 1, 1024));
    if (*spec.slots > tile_n)
      throw std::invalid_argument(fmt::format("--slots: expected 1..tile_n ({}), got {}", tile_n, *spec.slots));
  }
  const std::string act = args.get("activation", "relu"), dtype = args.get("dtype", "bf16"), down = args.get("down-layout", "out_in");
  if (act != "relu" && act != "silu") throw std::invalid_argument(fmt::format("--activation: expected relu or silu, got '{}'", act));
  if (dtype != "bf16" && dtype != "f16") throw std::invalid_argument(fmt::format("--dtype: expected bf16 or f16, got '{}'", dtype));
  if (down != "out_in" && down != "in_out")
    throw std::invalid_argument(fmt::format("--down-layout: expected out_in or in_out, got '{}'", down));
  spec.activation = act == "relu" ? twell::Activation::ReLU : twell::Activation::SiLU;
  if (act == "silu" && !(spec.threshold > 0.0f))
    throw std::invalid_argument(fmt::format(
        "--threshold: expected a value > 0 with --activation silu (a neuron is active iff |silu(g)| > threshold), got {}",
        spec.threshold));
  spec.dtype = dtype == "bf16" ? twell::DType::BF16 : twell::DType::FP16;
  if (spec.threshold > twell::max_finite(spec.dtype))
    throw std::invalid_argument(fmt::format("--threshold: expected at most {} with --dtype {} (its largest finite value: no "
                                            "activation could pass a larger threshold), got {}",
                                            twell::max_finite(spec.dtype), dtype, spec.threshold));
  spec.down_layout = down == "out_in" ? twell::WeightLayout::OutIn : twell::WeightLayout::InOut;
  spec.gated = !args.has("non-gated");
  if (act == "relu" && spec.threshold < 0.0f)
    throw std::invalid_argument(fmt::format("--threshold: expected a value >= 0 with --activation relu, got {}", spec.threshold));
  if (args.has("consumer")) {
    const std::string consumer = args.get("consumer");
    if (consumer != "rows" && consumer != "block")
      throw std::invalid_argument(fmt::format("--consumer: expected rows or block, got '{}'", consumer));
    spec.consumer = consumer == "rows" ? twell::ConsumerVariant::RowGather : twell::ConsumerVariant::TokenBlock;
    if (!spec.gated && consumer == "block")
      throw std::invalid_argument("--consumer: the token block is a gated kernel; with --non-gated expected rows, got 'block'");
  }
  if (args.has("cluster-m")) spec.gate_cluster_m = static_cast<int>(args.get_int("cluster-m", 2, 1, 2));
  return spec;
}

}  // namespace twellc
