// One generated kernel as every layer sees it: its kind, its entry point, its configuration and its
// launch geometry, as plain data (no MLIR, no CUDA driver). The compiler's emitter fills it from the IR,
// ahead-of-time bundles store it (manifest.json), the runtime launches from it (launch.h).
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "twell/spec.h"

namespace twell::kernels {

// The generator's layout when FfnSpec leaves it unset (FfnSpec::tile_n, FfnSpec::slots): a spec that
// sets these values explicitly asks for the same kernels.
inline constexpr int kDefaultTileN = 256;
inline constexpr int kDefaultSlots = 31;

// Every kernel kind twell generates. Device templates (kernels/device/twell/device/):
enum class KernelKind : uint8_t {
  GateTwell,        // gate/gate_twell.cuh: D2T, gate GEMM + activation + TwELL packing in the epilogue (GateParams)
  GatedDown,        // consumer/gated_down.cuh: up projection of the active neurons, times the gate, down
                    // projection (GatedDownParams); `gated` false: the non-gated twell.down
  DecodeGate,       // decode/decode.cuh: the gate of at most DecodeKernelConstraints::kMaxTokens rows
  DecodeGateSmall,  //   ... of at most kGateSmallMaxTokens rows
  DecodeUp,         //   ... up projection of the active entries (GatedDownParams, DecodeBuffers)
  DecodeDown,       //   ... down projection
  DecodeFused,      // decode/decode_fused.cuh: the whole FFN of at most kFusedMaxTokens rows, one persistent
                    // cooperative kernel (GatedDownParams, DecodeFusedBuffers)
  WeightTranspose,  // aux/transpose.cuh: out_in -> in_out copy of Wd (TransposeParams)
  NeuronPermute,    // aux/permute.cuh: reordering of weights by neuron (PermuteParams)
  DenseGatedMul,    // aux/dense_ops.cuh: the dense path's h = act(g) * u (GatedMulParams, threshold)
  DenseGatedUp,     // gate/gate_twell_wgmma.cuh (GatedUp): the dense path's fused h = act(x Wg^T) * (x Wu^T)
  TrainRowBackward, // train/row_backward.cuh: the training backward by token row: dx and each entry's dg, du, h
                    // (TrainRowBackwardParams; TrainRowBackwardConstraints)
  TrainWeightGrad,  // train/weight_grad.cuh: the training weight gradients dWg, dWu, dWd^T from the row
                    // backward's per-entry values (TrainWeightGradParams; TrainWeightGradConstraints)
  TrainDenseForward,   // train/dense_elementwise.cuh: the dense training path's h and row L1 (TrainDenseForwardParams)
  TrainDenseBackward,  // train/dense_elementwise.cuh: the dense training path's dg, du, h (TrainDenseBackwardParams)
};

inline constexpr KernelKind kKernelKinds[] = {
    KernelKind::GateTwell,       KernelKind::GatedDown,     KernelKind::DecodeGate,    KernelKind::DecodeGateSmall,
    KernelKind::DecodeUp,        KernelKind::DecodeDown,    KernelKind::WeightTranspose, KernelKind::NeuronPermute,
    KernelKind::DenseGatedMul,   KernelKind::DenseGatedUp,  KernelKind::TrainRowBackward, KernelKind::TrainWeightGrad,
    KernelKind::DecodeFused,     KernelKind::TrainDenseForward, KernelKind::TrainDenseBackward};

// The name of a kind in reports and manifests ("gate_twell", "gated_down", ...).
constexpr const char* to_string(KernelKind kind) {
  switch (kind) {
    case KernelKind::GateTwell: return "gate_twell";
    case KernelKind::GatedDown: return "gated_down";
    case KernelKind::DecodeGate: return "decode_gate";
    case KernelKind::DecodeGateSmall: return "decode_gate_small";
    case KernelKind::DecodeUp: return "decode_up";
    case KernelKind::DecodeDown: return "decode_down";
    case KernelKind::DecodeFused: return "decode_fused";
    case KernelKind::WeightTranspose: return "transpose";
    case KernelKind::NeuronPermute: return "permute";
    case KernelKind::DenseGatedMul: return "dense_gated_mul";
    case KernelKind::DenseGatedUp: return "dense_gated_up";
    case KernelKind::TrainRowBackward: return "train_row_backward";
    case KernelKind::TrainWeightGrad: return "train_weight_grad";
    case KernelKind::TrainDenseForward: return "train_dense_forward";
    case KernelKind::TrainDenseBackward: return "train_dense_backward";
  }
  return "unknown";
}

inline std::optional<KernelKind> parse_kernel_kind(std::string_view name) {
  for (KernelKind kind : kKernelKinds)
    if (name == to_string(kind)) return kind;
  return std::nullopt;
}

// The gate GEMM's main loop (#twell.config mainloop): fma (portable, no tensor cores), mma_sync
// (sm_80+ tensor cores, cp.async), wgmma (sm_90a: TMA + wgmma, warp-specialized, persistent).
enum class GateMainloop : uint8_t { None, Fma, MmaSync, Wgmma };

// The consumer variants of a GatedDown kernel (GatedDownKernelConstraints): one token row per CTA,
// one token row per warp (persistent), or the token block (16 rows per CTA on tensor cores).
enum class ConsumerKind : uint8_t { None, CtaRow, WarpRow, TokenBlock };

constexpr const char* to_string(GateMainloop m) {
  return m == GateMainloop::Fma ? "fma" : m == GateMainloop::MmaSync ? "mma_sync" : m == GateMainloop::Wgmma ? "wgmma" : "none";
}
constexpr const char* to_string(ConsumerKind c) {
  return c == ConsumerKind::CtaRow ? "cta_row" : c == ConsumerKind::WarpRow ? "warp_row" : c == ConsumerKind::TokenBlock ? "token_block" : "none";
}

// One generated kernel: a self-contained CUDA C++ translation unit for NVRTC plus everything its
// launch needs (launch.h turns this into a grid).
struct KernelSource {
  KernelKind kind = KernelKind::GateTwell;
  std::string name;    // the extern "C" __global__ entry symbol, unique per configuration
  std::string source;  // CUDA C++; includes only "twell/device/..." (kernels/device, embedded by the JIT)
  // The shape the kernel was specialized for (0 where it takes it at run time).
  int64_t d_model = 0;
  int64_t d_ff = 0;
  int tile_n = 0;
  bool down_in_out = false;  // GatedDown, decode kernels, TrainRowBackward (always in_out): the w_down layout they read;
                             // TrainWeightGrad (always in_out): the layout of the dWd it writes
  GateMainloop mainloop = GateMainloop::None;  // GateTwell, DenseGatedUp: its own; GatedDown, TrainRowBackward: the gate's
  ConsumerKind consumer = ConsumerKind::None;  // GatedDown only
  int threads = 0;     // threads per CTA
  int cta_m = 0;       // token rows per CTA: grid.x = ceil(tokens / cta_m) (persistent: at most that)
  int cta_k = 0;       // the K step of a gate kernel (0: no K loop)
  int stages = 0;      // the shared-memory ring's depth (mma_sync and wgmma gates, token block; 0: none)
  // CTAs per thread-block cluster, compiled in with __cluster_dims__: a tma_persistent kernel's
  // clusters share the w_gate tile, whose TMA box is then {cta_k, tile_n / cluster_m}; grid.x must be
  // a multiple of it, and a persistent grid is sized by the clusters resident at once
  // (cuOccupancyMaxActiveClusters). 1: no cluster.
  int cluster_m = 1;
  int grid_y = 1;      // the N tiles of a gate kernel (grid.y unless persistent: then its CTAs loop over them)
  // Dynamic shared memory per CTA (the launcher opts the kernel into it when it passes 48 KiB with the
  // static part); 0 for kernels with static shared memory only. DecodeGate: the most any launch needs
  // (launch.h gives the bytes of a token count).
  int smem_bytes = 0;
  // The element alignment the kernel needs for the x and w_gate pointers and their row strides: 8
  // (16 bytes) for a tensor-core gate's cp.async or TMA, 2 for a consumer after one (its overflow
  // recompute reads 4-byte pairs), 8 for the warp-row and token-block consumers, 1 otherwise.
  int operand_alignment = 1;
  // A wgmma gate (and DenseGatedUp): it reads x and w_gate through the TMA maps of GateParams (x_map:
  // box {cta_k, cta_m}; w_map: box {cta_k, tile_n / cluster_m}; swizzled by the box row of cta_k 16-bit
  // values), which the launcher encodes. Also `persistent`.
  bool tma_persistent = false;
  // The CTAs loop over the work: launch.h starts min(work items, the CTAs resident at once). A
  // persistent GatedDown kernel claims rows from GatedDownParams::row_counter, a device uint32 the
  // launcher zeroes before every launch.
  bool persistent = false;
  // GatedDown: twell.gated_down (true) or the non-gated twell.down (false, reads no w_up); likewise
  // TrainRowBackward, and TrainWeightGrad (false: no dWu).
  bool gated = true;
  // Programmatic dependent launch (sm_90+): the kernel waits for the one before it with
  // griddepcontrol.wait, so the launcher lets it start while that one runs (decode_up, decode_down,
  // decode_fused).
  bool dependent_launch = false;
};

// The kind as reports name it: GatedDown is "gated_down" or "down" (non-gated).
inline std::string report_kind(const KernelSource& k) {
  return k.kind == KernelKind::GatedDown && !k.gated ? "down" : to_string(k.kind);
}

// Everything the pipeline decided for one FFN.
struct GeneratedFfn {
  std::string ir;        // the module after all passes (printable, for --emit=mlir and tests)
  TwellLayout layout;    // the layout of the hidden activation
  Target target;
  std::vector<KernelSource> kernels;  // GateTwell first, then GatedDown
  // The decode kernels of the same layer, from the consumer's `decode` attribute: DecodeGate,
  // DecodeUp, DecodeDown, DecodeGateSmall; or none where DecodeKernelConstraints::allowed says no.
  std::vector<KernelSource> decode;
};

}  // namespace twell::kernels
