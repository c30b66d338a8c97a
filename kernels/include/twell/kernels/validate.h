// Whether a kernel description (kernel.h) is one the contracts allow: every field against its kind's
// rules in constraints.h, the shared memory against the layout it must have (shared_memory.h). The
// runtime checks every kernel a bundle gives it (a manifest edited with its checksum recomputed still
// cannot make it launch a kernel with a wrong grid, block or shared memory) and every kernel the JIT
// emits (a divergence between emitter and contracts is a bug caught before launch).
#pragma once
#include <cmath>
#include <cstdio>
#include <string>

#include "twell/kernels/constraints.h"
#include "twell/kernels/kernel.h"
#include "twell/spec.h"

namespace twell::kernels {

// "" when `k` is allowed for `target`, else the first violation: the field, what its kind expects and
// what it holds ("threads: expected 384 (the wgmma gate), found 33").
inline std::string validate_kernel(const KernelSource& k, const Target& target) {
  auto expect = [](const char* field, int64_t expected, int64_t found, const char* why) -> std::string {
    return expected == found ? std::string()
                             : std::string(field) + ": expected " + std::to_string(expected) + " (" + why + "), found " +
                                   std::to_string(found);
  };
  auto range = [](const char* field, int64_t lo, int64_t hi, int64_t found) -> std::string {
    return found >= lo && found <= hi ? std::string()
                                      : std::string(field) + ": expected " + std::to_string(lo) + ".." + std::to_string(hi) +
                                            ", found " + std::to_string(found);
  };
  auto first = [](std::initializer_list<std::string> checks) {
    for (const std::string& c : checks)
      if (!c.empty()) return c;
    return std::string();
  };
  const bool pow2 = k.tile_n > 0 && (k.tile_n & (k.tile_n - 1)) == 0;
  const int64_t tiles = k.tile_n > 0 ? (k.d_ff + k.tile_n - 1) / k.tile_n : 0;
  std::string shape = first({range("d_model", 1, 65536, k.d_model), range("d_ff", 1, int64_t{1} << 24, k.d_ff),
                             range("tile_n", 32, 1024, k.tile_n),
                             pow2 ? std::string() : "tile_n: expected a power of two, found " + std::to_string(k.tile_n),
                             range("cluster_m", 1, 2, k.cluster_m)});
  if (k.name.empty()) return "entry: expected a name, found none";
  using D = DecodeKernelConstraints;
  switch (k.kind) {
    case KernelKind::GateTwell: {
      if (!shape.empty()) return shape;
      if (std::string e = expect("grid_y", tiles, k.grid_y, "the d_ff tiles"); !e.empty()) return e;
      if (k.mainloop == GateMainloop::Wgmma) {
        using W = WgmmaGateConstraints;
        return first({target.sm == 90 && target.arch_specific ? std::string() : "mainloop: wgmma needs sm_90a, the target is " + target.arch(),
                      expect("threads", W::kThreads, k.threads, "the wgmma gate"), expect("cta_m", W::kCtaM, k.cta_m, "the wgmma gate"),
                      W::ctaKAllowed(k.cta_k) ? std::string() : "cta_k: expected 32 or 64, found " + std::to_string(k.cta_k),
                      W::tileNAllowed(k.tile_n) ? std::string() : "tile_n: expected 64, 128 or 256 (wgmma N), found " + std::to_string(k.tile_n),
                      range("stages", W::kMinStages, W::kMaxStages, k.stages),
                      expect("smem_bytes", W::sharedBytes(k.tile_n, k.cta_k, k.stages), k.smem_bytes, "the wgmma gate's layout"),
                      k.persistent && k.tma_persistent ? std::string() : "persistent: expected the TMA-fed persistent kernel",
                      expect("operand_alignment", W::kOperandAlignment, k.operand_alignment, "TMA")});
      }
      if (k.mainloop == GateMainloop::MmaSync) {
        using M = MmaSyncGateConstraints;
        return first({expect("threads", M::kThreads, k.threads, "the mma_sync gate"),
                      expect("cta_m", M::ctaM(k.tile_n), k.cta_m, "the mma_sync gate at this tile_n"),
                      expect("cta_k", M::kCtaK, k.cta_k, "the mma_sync gate"), range("stages", M::kMinStages, M::kMaxStages, k.stages),
                      expect("smem_bytes", M::sharedBytes(k.cta_m, k.tile_n, k.stages), k.smem_bytes, "the mma_sync gate's layout"),
                      expect("cluster_m", 1, k.cluster_m, "no clusters"), k.persistent ? "persistent: expected a grid-per-tile kernel" : "",
                      expect("operand_alignment", M::kOperandAlignment, k.operand_alignment, "cp.async")});
      }
      if (k.mainloop == GateMainloop::Fma) {
        using F = GateKernelConstraints;
        return first({expect("threads", F::kThreads, k.threads, "the fma gate"),
                      F::fillsTile(k.cta_m, k.tile_n) ? std::string() : "cta_m: expected 16384 / tile_n, found " + std::to_string(k.cta_m),
                      range("cta_k", 1, 1024, k.cta_k),
                      F::staticSharedBytes(k.cta_m, k.cta_k, k.tile_n) <= F::kMaxStaticSharedBytes ? std::string() : "cta_k: the fma gate's operands pass 48 KiB",
                      expect("smem_bytes", 0, k.smem_bytes, "static shared memory only"), expect("cluster_m", 1, k.cluster_m, "no clusters"),
                      k.persistent ? "persistent: expected a grid-per-tile kernel" : ""});
      }
      return "mainloop: expected fma, mma_sync or wgmma for a gate kernel, found none";
    }
    case KernelKind::GatedDown: {
      using G = GatedDownKernelConstraints;
      if (!shape.empty()) return shape;
      if (k.mainloop == GateMainloop::None) return "mainloop: expected the gate's (fma, mma_sync or wgmma), found none";
      const std::string common = first({expect("threads", 256, k.threads, "every consumer"), expect("grid_y", 1, k.grid_y, "a consumer"),
                                        expect("cluster_m", 1, k.cluster_m, "no clusters")});
      if (!common.empty()) return common;
      if (k.consumer == ConsumerKind::CtaRow)
        return first({expect("cta_m", 1, k.cta_m, "one row per CTA"), expect("smem_bytes", 0, k.smem_bytes, "static shared memory only"),
                      k.persistent ? "persistent: expected one CTA per row" : ""});
      if (k.consumer == ConsumerKind::WarpRow)
        return first({expect("cta_m", G::kWarpRowThreads / 32, k.cta_m, "one row per warp"),
                      G::warpRowAllowed(k.mainloop != GateMainloop::Fma, k.down_in_out, k.d_model, k.threads) ? std::string()
                          : "consumer: the warp-per-row consumer needs a tensor-core gate, in_out Wd and d_model % 8 == 0, <= 2048",
                      expect("smem_bytes", G::warpRowSharedBytes(k.d_model), k.smem_bytes, "the warps' x rows"),
                      k.persistent ? std::string() : "persistent: expected the persistent warp-per-row consumer"});
      if (k.consumer == ConsumerKind::TokenBlock)
        return first({expect("cta_m", G::kBlockCtaM, k.cta_m, "the token block"),
                      G::blockShapeAllowed(k.mainloop != GateMainloop::Fma, k.down_in_out, k.d_model, k.tile_n) ? std::string()
                          : "consumer: the token block needs a tensor-core gate, in_out Wd, d_model 128..2048 a power of two, tile_n <= 256",
                      range("stages", G::kBlockMinStages, G::kBlockMaxStages, k.stages),
                      expect("smem_bytes", G::blockSharedBytes(k.d_model, k.d_ff, k.tile_n, k.stages), k.smem_bytes, "the token block's layout"),
                      k.smem_bytes <= G::maxDynamicSharedBytes(target.sm) ? std::string() : "smem_bytes: more than the target allows",
                      k.persistent ? "persistent: expected one CTA per 16 rows" : ""});
      return "consumer: expected cta_row, warp_row or token_block for a gated_down kernel, found none";
    }
    case KernelKind::DecodeGate:
    case KernelKind::DecodeGateSmall:
    case KernelKind::DecodeUp:
    case KernelKind::DecodeDown:
    case KernelKind::DecodeFused: {
      if (!shape.empty()) return shape;
      const std::string common =
          first({k.tile_n % D::kSliceN == 0 ? std::string() : "tile_n: expected a multiple of 32 (decode slices)",
                 range("d_ff", 1, D::kMaxDFF, k.d_ff), k.d_model % 8 == 0 ? std::string() : "d_model: expected a multiple of 8",
                 expect("cluster_m", 1, k.cluster_m, "no clusters"), expect("grid_y", 1, k.grid_y, "decode grids are 1-D"),
                 k.persistent ? "persistent: decode kernels are not" : ""});
      if (!common.empty()) return common;
      if (k.kind == KernelKind::DecodeGate)
        return first({expect("threads", D::kGateThreads, k.threads, "decode_gate"), expect("cta_m", D::kMaxTokens, k.cta_m, "decode_gate"),
                      expect("smem_bytes", D::gateSharedBytes(k.tile_n, D::kMaxTokens), k.smem_bytes, "decode_gate's ring at 64 rows")});
      if (k.kind == KernelKind::DecodeGateSmall)
        return first({expect("threads", D::kGateSmallThreads, k.threads, "decode_gate_small"),
                      expect("cta_m", D::kGateSmallMaxTokens, k.cta_m, "decode_gate_small"),
                      expect("smem_bytes", D::gateSmallSharedBytes(k.tile_n, k.d_model, target.sm), k.smem_bytes, "decode_gate_small's layout")});
      if (k.kind == KernelKind::DecodeUp)
        return first({expect("threads", D::kUpThreads, k.threads, "decode_up"), expect("cta_m", D::kMaxTokens, k.cta_m, "decode_up"),
                      expect("smem_bytes", 0, k.smem_bytes, "decode_up")});
      // decode_fused waits with griddepcontrol.wait before its first global read (dependent_launch.cuh), so
      // on sm_90 it may be launched as a dependent or not (bundles from before it waited say false); below
      // sm_90 there is no such launch.
      if (k.kind == KernelKind::DecodeFused)
        return first({expect("threads", D::kFusedThreads, k.threads, "decode_fused"), expect("cta_m", D::kFusedMaxTokens, k.cta_m, "decode_fused"),
                      expect("smem_bytes", D::fusedSharedBytes(target.sm), k.smem_bytes, "decode_fused (all the target allows)"),
                      k.dependent_launch && target.sm < 90 ? "dependent_launch: expected false below sm_90 (no programmatic dependent launch)" : ""});
      return first({expect("threads", D::kDownThreads, k.threads, "decode_down"), expect("cta_m", D::kMaxTokens, k.cta_m, "decode_down"),
                    expect("smem_bytes", 0, k.smem_bytes, "decode_down")});
    }
    case KernelKind::WeightTranspose:
    case KernelKind::NeuronPermute:
    case KernelKind::DenseGatedMul:
    case KernelKind::TrainDenseForward:
    case KernelKind::TrainDenseBackward:
      return first({expect("threads", AuxiliaryKernelConstraints::kThreads, k.threads, "the auxiliary kernels"),
                    expect("smem_bytes", 0, k.smem_bytes, "static shared memory only"), expect("cluster_m", 1, k.cluster_m, "no clusters"),
                    expect("grid_y", 1, k.grid_y, "grid-stride kernels"), k.persistent ? "persistent: expected a grid-stride kernel" : ""});
    case KernelKind::DenseGatedUp: {
      using C = DenseGatedUpConstraints;
      return first({DenseGatedUpConstraints::allowed(true, target.sm, target.arch_specific, k.d_model, k.d_ff) ? std::string()
                        : "dense_gated_up: expected sm_90a, d_model % 64 == 0 and d_ff % 8 == 0",
                    expect("tile_n", C::kTileN, k.tile_n, "the fused kernel"), expect("threads", C::kThreads, k.threads, "the fused kernel"),
                    expect("cta_m", C::kCtaM, k.cta_m, "the fused kernel"), expect("cta_k", C::kCtaK, k.cta_k, "the fused kernel"),
                    expect("stages", C::kStages, k.stages, "the fused kernel"), expect("cluster_m", C::kClusterM, k.cluster_m, "the fused kernel"),
                    expect("grid_y", (k.d_ff + C::kTileN - 1) / C::kTileN, k.grid_y, "the d_ff tiles"),
                    expect("smem_bytes", C::kSharedBytes, k.smem_bytes, "the fused kernel's layout"),
                    k.persistent && k.tma_persistent ? std::string() : "persistent: expected the TMA-fed persistent kernel"});
    }
    case KernelKind::TrainRowBackward: {
      using T = TrainRowBackwardConstraints;
      if (!shape.empty()) return shape;
      return first({T::allowed(k.d_model, k.d_ff) ? std::string() : "d_model: expected 1.." + std::to_string(T::kMaxDModel) + ", found " + std::to_string(k.d_model),
                    k.mainloop == GateMainloop::None ? "mainloop: expected the gate's (fma, mma_sync or wgmma), found none" : "",
                    k.mainloop != GateMainloop::Fma && k.d_model % 8 != 0 ? "d_model: a tensor-core gate's recompute needs a multiple of 8" : "",
                    k.persistent ? expect("threads", T::kWarpThreads, k.threads, "the warp-per-row backward")
                                 : expect("threads", T::kThreads, k.threads, "the row backward"),
                    k.persistent ? expect("cta_m", T::kWarpCtaM, k.cta_m, "a row per warp")
                                 : expect("cta_m", T::kCtaM, k.cta_m, "one row per CTA"),
                    // (Its ReLU-only and slots rules are the device code's static_assert: the description holds
                    // neither the activation nor the slots.)
                    k.persistent && !T::warpRow(k.d_model, k.tile_n, 0, true, k.mainloop != GateMainloop::Fma)
                        ? "persistent: the warp-per-row backward needs a tensor-core gate, d_model % 8 == 0 and <= " +
                              std::to_string(T::kWarpMaxDModel) + ", tile_n <= 512"
                        : std::string(),
                    k.consumer != (k.persistent ? ConsumerKind::WarpRow : ConsumerKind::CtaRow)
                        ? std::string("consumer: expected warp_row for the persistent form, cta_row for the CTA-per-row one, found ") +
                              to_string(k.consumer)
                        : std::string(),
                    expect("grid_y", 1, k.grid_y, "one row per CTA"), expect("cluster_m", 1, k.cluster_m, "no clusters"),
                    expect("smem_bytes", 0, k.smem_bytes, "static shared memory only"),
                    expect("operand_alignment", T::operandAlignment(k.d_model, k.mainloop != GateMainloop::Fma), k.operand_alignment,
                           "its row loads"),
                    k.down_in_out ? std::string() : "down_in_out: expected the in_out Wd (rows of Wd^T)",
                    k.tma_persistent ? "tma_persistent: expected no TMA" : ""});
    }
    case KernelKind::TrainWeightGrad: {
      using T = TrainWeightGradConstraints;
      if (!shape.empty()) return shape;
      const int64_t limit = GatedDownKernelConstraints::maxDynamicSharedBytes(target.sm);
      return first({T::allowed(k.d_model, k.d_ff) ? std::string() : "d_model: expected 1.." + std::to_string(T::kMaxDModel) + ", found " + std::to_string(k.d_model),
                    k.d_ff <= T::maxDFF(k.tile_n, limit) ? std::string() : "d_ff: expected at most " + std::to_string(T::maxDFF(k.tile_n, limit)) + " (a shared-memory counter per neuron), found " + std::to_string(k.d_ff),
                    expect("threads", T::kThreads, k.threads, "the persistent CTA"), expect("cta_m", 1, k.cta_m, "as the auxiliary kernels: the grid does not depend on tokens"),
                    expect("grid_y", 1, k.grid_y, "a one-dimensional grid"),
                    expect("cluster_m", 1, k.cluster_m, "no clusters"),
                    expect("smem_bytes", T::sharedBytes(k.d_ff, k.tile_n), k.smem_bytes, "the neuron counters and column masks"),
                    k.smem_bytes <= limit ? std::string() : "smem_bytes: more than the target allows",
                    expect("operand_alignment", T::operandAlignment(k.d_model), k.operand_alignment, "its row loads"),
                    k.mainloop == GateMainloop::None ? std::string() : "mainloop: expected none (no gate arithmetic is repeated)",
                    k.down_in_out ? std::string() : "down_in_out: expected the in_out dWd (rows of dWd^T)",
                    k.persistent || k.tma_persistent ? "persistent: expected the cooperative grid (not the gates' persistent forms)" : "",
                    k.dependent_launch ? "dependent_launch: expected false (train_weight_grad does not wait for the kernel before it)" : ""});
    }
  }
  return "kind: not a twell kernel kind";
}

// "" when every field of `s` is one the generator accepts (its enums in range, the variant and cluster
// choices, the layout's rules, the activation's threshold, at most max_finite(dtype)), else the first
// violation, naming the field after `prefix` ("spec." for the generator, "FfnSpec::" for the runtime):
// "spec.tile_n: expected a power of two in 32..1024, got 33". The one owner of these rules: generateFfn checks specs with it,
// and the runtime before looking up kernels, so a deployment without the JIT names the field too.
inline std::string validate_spec(const FfnSpec& s, const std::string& prefix) {
  auto field = [&](const char* name) { return prefix + name + ": "; };
  if (s.dtype != DType::BF16 && s.dtype != DType::FP16)
    return field("dtype") + "expected bf16 or f16, got " + std::to_string(static_cast<int>(s.dtype));
  if (s.activation != Activation::ReLU && s.activation != Activation::SiLU)
    return field("activation") + "expected relu or silu, got " + std::to_string(static_cast<int>(s.activation));
  if (s.consumer && *s.consumer != ConsumerVariant::RowGather && *s.consumer != ConsumerVariant::TokenBlock)
    return field("consumer") + "expected row_gather or token_block, got " + std::to_string(static_cast<int>(*s.consumer));
  if (!s.gated && s.consumer == ConsumerVariant::TokenBlock)
    return field("consumer") + "the token block is a gated kernel; a non-gated layer (" + prefix +
           "gated = false) takes row_gather or leaves consumer unset, got token_block";
  if (s.gate_cluster_m && *s.gate_cluster_m != 1 && *s.gate_cluster_m != 2)
    return field("gate_cluster_m") + "expected 1 or 2 CTAs per cluster (or unset), got " + std::to_string(*s.gate_cluster_m);
  if (s.down_layout != WeightLayout::OutIn && s.down_layout != WeightLayout::InOut)
    return field("down_layout") + "expected out_in or in_out, got " + std::to_string(static_cast<int>(s.down_layout));
  const int tile_n = s.tile_n.value_or(kDefaultTileN);
  if (tile_n < 32 || tile_n > 1024 || (tile_n & (tile_n - 1)) != 0)
    return field("tile_n") + "expected a power of two in 32..1024, got " + std::to_string(tile_n);
  const int slots = s.slots.value_or(kDefaultSlots);
  if (slots < 1 || slots > tile_n) return field("slots") + "expected 1..tile_n (" + std::to_string(tile_n) + "), got " + std::to_string(slots);
  if (!std::isfinite(s.threshold)) return field("threshold") + "expected a finite f32, got " + std::to_string(s.threshold);
  if (s.activation == Activation::ReLU && s.threshold < 0.0f)
    return field("threshold") + "expected a value >= 0 with ReLU (active iff relu(g) > threshold), got " + std::to_string(s.threshold);
  if (s.activation == Activation::SiLU && !(s.threshold > 0.0f))
    return field("threshold") + "expected a value > 0 with SiLU (active iff |silu(g)| > threshold), got " + std::to_string(s.threshold);
  if (s.threshold > max_finite(s.dtype)) {
    auto text = [](float v) {
      char buffer[32];
      std::snprintf(buffer, sizeof buffer, "%g", static_cast<double>(v));
      return std::string(buffer);
    };
    return field("threshold") + "expected at most " + text(max_finite(s.dtype)) + " with dtype " + to_string(s.dtype) +
           " (its largest finite value: no activation could pass a larger threshold), got " + text(s.threshold);
  }
  return "";
}

// `s` as the runtime and the generator key, name and compile it: a threshold of -0.0 becomes +0.0.
// Both zeros give the same predicate (relu(g) > t; SiLU rejects zero), so one layer gets one kernel
// set and one cache entry, not two with different names.
inline FfnSpec canonical_spec(FfnSpec s) {
  if (s.threshold == 0.0f) s.threshold = 0.0f;
  return s;
}

}  // namespace twell::kernels
