// The generator's entry points: from a shape description or a `.mlir` file to CUDA C++ translation
// units, one per kernel, through the twell dialect and its passes (ARCHITECTURE.md, "Flow of one kernel").
//
// This header includes no MLIR headers, so the runtime and tools can call the generator cheaply.
#pragma once
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "twell/spec.h"

namespace twell::compiler {

enum class KernelKind {
  GateTwell,  // D2T: gate GEMM + activation + threshold + TwELL packing in the epilogue (GateParams)
  GatedDown,  // gated consumer: up projection of the active neurons, times the gate, down projection
              // (GatedDownParams)
  DenseGatedMul,  // the dense baseline's elementwise h = act(g) * u (GatedMulParams); made by the
                  // runtime (dense.h), not by the dialect
  WeightTranspose,  // the runtime's out_in -> in_out transpose of Wd (TransposeParams; plan.cpp)
  NeuronPermute,    // the runtime's reordering of weights by neuron (PermuteParams; neuron_order.cpp)
  DenseGatedUp,     // the dense path's fused h = act(x Wg^T) * (x Wu^T) (GateParams with u_map and h; made
                    // by the runtime from gate_twell_wgmma.cuh, DenseKernels::FusedGatedUp in dense.h)
  // The decode kernels (decode.cuh, GeneratedFfn::decode): the gate, up and down of at most
  // DecodeKernelConstraints::kMaxTokens rows, spread over the GPU, and the gate for at most
  // kGateSmallMaxTokens rows. The gates take (GateParams, DecodeBuffers), the others
  // (GatedDownParams, DecodeBuffers).
  DecodeGate,
  DecodeUp,
  DecodeDown,
  DecodeGateSmall,
};

// One generated kernel: a self-contained CUDA C++ translation unit for NVRTC plus its launch geometry.
struct KernelSource {
  KernelKind kind;
  std::string name;    // the extern "C" __global__ entry symbol, unique per configuration
  std::string source;  // CUDA C++; includes only "twell/device/*.cuh" (embedded in the runtime)
  int threads = 0;     // threads per CTA
  int cta_m = 0;       // token rows per CTA: grid.x = ceil(tokens / cta_m) (persistent: at most that)
  int cta_k = 0;       // the K step of a GateTwell kernel (0: no K loop)
  // CTAs per thread-block cluster (compiled in with __cluster_dims__): a tma_persistent kernel's
  // clusters share the w_gate tile, whose TMA box is then {cta_k, tile_n / cluster_m}; grid.x must be
  // a multiple of it, and the launcher sizes a persistent grid by the clusters resident at once
  // (cuOccupancyMaxActiveClusters). 1: no cluster.
  int cluster_m = 1;
  int grid_y = 1;      // grid.y (the number of N tiles for GateTwell)
  int smem_bytes = 0;  // dynamic shared memory per CTA; when > 0 the launcher must first set the
                       // kernel's CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES to it (the kernel
                       // may also have static shared memory, and the two together may pass 48 KiB);
                       // 0 for kernels with static shared memory only
  // The element alignment the kernel needs for the x and w_gate pointers and their row strides (ldx,
  // ldw): 8 (16 bytes) for a GateTwell kernel with the mma_sync main loop (cp.async), 2 for a
  // GatedDown kernel after one (its overflow recompute reads 4-byte pairs), 1 otherwise.
  int operand_alignment = 1;
  // A GateTwell kernel with the wgmma main loop: it reads x and w_gate through the TMA maps of
  // GateParams (x_map: box {cta_k, cta_m}; w_map: box {cta_k, tile_n / cluster_m}; both swizzled by
  // the box row of cta_k 16-bit values, 128 bytes at cta_k 64, 64 at cta_k 32), which the launcher
  // encodes. It is also `persistent`, launched with grid.y 1.
  bool tma_persistent = false;
  // A persistent kernel (the wgmma gate, the warp-per-row consumer): its CTAs loop over the work, so
  // the launcher starts min(ceil(tokens / cta_m) * grid_y, SMs x the CTAs resident per SM) CTAs on
  // grid.x, grid.y 1 (any grid size is correct, a multiple of cluster_m; that one fills the GPU once;
  // with clusters, the clusters resident at once times cluster_m). A persistent GatedDown
  // kernel claims rows from GatedDownParams::row_counter: a device uint32 the launcher zeroes before
  // every launch (FfnPlan::run does, stream-ordered).
  bool persistent = false;
  // A GatedDown kernel: twell.gated_down (true) or the non-gated twell.down (false, reads no w_up).
  bool gated = true;
};

// Everything the pipeline decided, for one FFN.
struct GeneratedFfn {
  std::string ir;        // the module after all passes (printable, for --emit=mlir and tests)
  TwellLayout layout;    // the layout of the hidden activation
  Target target;
  std::vector<KernelSource> kernels;  // GateTwell first, then GatedDown
  // The decode kernels of the same layer, from the consumer's `decode` attribute (twell-select-config
  // sets it to the consumer's down layout, or generateFfn's decode_down_layout): DecodeGate
  // (decode_gate, up to 64 rows), DecodeUp, DecodeDown, and DecodeGateSmall (decode_gate_small,
  // cta_m 8: up to 8 rows); or none where DecodeKernelConstraints::allowed says no (an fma gate,
  // d_model % 8 != 0, d_ff > 65536, a target with 99 KiB of shared memory per CTA) or beside the
  // token-block consumer, so select-config sets no `decode` there. Grids:
  // DecodeGate tiles x tile_n / 32 CTAs, DecodeGateSmall tiles x tile_n / 16, DecodeUp tokens x
  // tiles, DecodeDown tokens x ceil(d_model / (64 in_out, 32 out_in)); tokens <= the kernel's cta_m.
  std::vector<KernelSource> decode;
};

// Whether kernels can be generated and built by NVRTC for `target`: target.sm is one of the
// architectures NVRTC 13.0 builds for at or above sm_80, and arch_specific only where that architecture
// has an "a" variant. The one list of them is mlir::twell::SupportedArchs (KernelConstraints.h), which
// the #twell.target verifier uses too.
bool isSupportedTarget(const Target& target);

// The accepted targets, for messages: "sm_80, sm_86, ..., sm_121, sm_90a, ..., sm_121a".
std::string supportedTargets();

// Builds the twell dialect function for `spec` (twell.gated_ffn, or twell.ffn when !spec.gated) with
// the C++ API, runs the pipeline and emits CUDA. `decode_down_layout`: the Wd layout the decode kernels
// read, where it differs from spec.down_layout (a plan that gives the large-M consumer an in_out copy of
// an out_in Wd keeps its decode calls on the user's out_in Wd, which costs less than a copy at a few rows).
// Throws twell::Error(InvalidArgument) naming the field when the spec (including an enum field out of
// range) or the target (!isSupportedTarget) is illegal, Error(Compile) if the pipeline
// rejects the IR it built (a bug). Thread-safe: every call has its own MLIRContext.
GeneratedFfn generateFfn(const FfnSpec& spec, const Target& target,
                         std::optional<WeightLayout> decode_down_layout = std::nullopt);

// Same from MLIR text (one module with one func.func holding a twell.gated_ffn or a twell.gate_matmul
// feeding a twell.gated_down). `filename` is used in diagnostics. Throws twell::Error(Parse) with the
// MLIR diagnostics (file:line:col, source line) on parse or verification failure, and
// Error(InvalidArgument) with the diagnostics when the pipeline rejects the IR (not one FFN, a
// kernel's explicit #twell.target differs from `target`, an explicit `decode` attribute the decode
// kernels cannot honour) or `target` is illegal. Thread-safe.
GeneratedFfn generateFromMlir(std::string_view mlir_text, std::string_view filename, const Target& target);

}  // namespace twell::compiler
