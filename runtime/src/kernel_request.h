// Request keys: the canonical names of the kernel sets a plan asks for. The runtime looks them up in
// bundles and records them when it gets them from the JIT, so a bundle written by `twellc compile` is
// found by exactly the plans that would have compiled the same kernels.
#pragma once
#include <optional>
#include <string>

#include "twell/kernels/kernel.h"
#include "twell/spec.h"

namespace twell::detail {

// The FFN kernels of generateFfn(spec, target, decode_down_layout): every spec field that can change
// them, e.g. "ffn d_model=2048 d_ff=5632 gated=1 activation=relu threshold=0x00000000 dtype=bf16
// down_layout=in_out tile_n=256 slots=31 consumer=auto gate_cluster_m=auto decode=out_in target=sm_90a".
std::string ffn_request(const FfnSpec& spec, const Target& target, std::optional<WeightLayout> decode_down_layout);

// An auxiliary kernel of generateAuxiliary(kind, spec, target): only the fields it depends on
// (transpose and permute: none; the gated multiply: dtype and activation; the fused gated-up kernel:
// the shape and numerics; the training backward: the shape, numerics and layout; the weight gradients:
// the shape, layout, dtype and gated).
std::string auxiliary_request(kernels::KernelKind kind, const FfnSpec& spec, const Target& target);

}  // namespace twell::detail
