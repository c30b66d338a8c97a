#include "kernel_request.h"

#include <bit>
#include <cstdint>

#include <fmt/format.h>

namespace twell::detail {
namespace {
template <typename T>
std::string optional_text(const std::optional<T>& v) {
  return v ? fmt::format("{}", *v) : std::string("auto");
}
std::string threshold_bits(float t) { return fmt::format("{:#010x}", std::bit_cast<uint32_t>(t)); }
}  // namespace

std::string ffn_request(const FfnSpec& s, const Target& target, std::optional<WeightLayout> decode) {
  return fmt::format(
      "ffn d_model={} d_ff={} gated={} activation={} threshold={} dtype={} down_layout={} tile_n={} slots={} consumer={} "
      "gate_cluster_m={} decode={} target={}",
      s.d_model, s.d_ff, s.gated ? 1 : 0, to_string(s.activation), threshold_bits(s.threshold), to_string(s.dtype),
      to_string(s.down_layout), s.tile_n.value_or(kernels::kDefaultTileN), s.slots.value_or(kernels::kDefaultSlots),
      s.consumer ? to_string(*s.consumer) : "auto", optional_text(s.gate_cluster_m),
      decode ? to_string(*decode) : "none", target.arch());
}

std::string auxiliary_request(kernels::KernelKind kind, const FfnSpec& s, const Target& target) {
  using kernels::KernelKind;
  std::string key = fmt::format("aux {} target={}", kernels::to_string(kind), target.arch());
  if (kind == KernelKind::DenseGatedMul || kind == KernelKind::TrainDenseForward || kind == KernelKind::TrainDenseBackward)
    key += fmt::format(" dtype={} activation={}", to_string(s.dtype), to_string(s.activation));
  if (kind == KernelKind::DenseGatedUp)
    key += fmt::format(" d_model={} d_ff={} activation={} threshold={} dtype={}", s.d_model, s.d_ff, to_string(s.activation),
                       threshold_bits(s.threshold), to_string(s.dtype));
  if (kind == KernelKind::TrainRowBackward)
    key += fmt::format(" d_model={} d_ff={} gated={} activation={} threshold={} dtype={} tile_n={} slots={}", s.d_model, s.d_ff,
                       s.gated ? 1 : 0, to_string(s.activation), threshold_bits(s.threshold), to_string(s.dtype),
                       s.tile_n.value_or(kernels::kDefaultTileN), s.slots.value_or(kernels::kDefaultSlots));
  if (kind == KernelKind::TrainWeightGrad)
    key += fmt::format(" d_model={} d_ff={} gated={} dtype={} tile_n={} slots={}", s.d_model, s.d_ff, s.gated ? 1 : 0,
                       to_string(s.dtype), s.tile_n.value_or(kernels::kDefaultTileN), s.slots.value_or(kernels::kDefaultSlots));
  return key;
}

}  // namespace twell::detail
