// The kernels' contracts: what each device template (kernels/device/twell/device/) accepts, its
// shared-memory formula and its fixed geometry, written once. Included by the dialect's verifiers,
// twell-select-config, the emitter, the runtime (launch.h) and tools, so that a configuration the
// templates would reject at NVRTC time (static_assert) is a verifier error instead. No MLIR, no CUDA.
#pragma once

#include <algorithm>
#include <cstdint>
#include <iterator>
#include <limits>
#include <string>

#include "twell/device/shared_memory.h"

namespace twell::kernels {

namespace smem = ::twell::device::shared_memory;

namespace detail {
// For a, b >= 0: a * b and a + b, saturating at INT64_MAX instead of overflowing (so that an absurd
// configuration reads as too large, never as small).
constexpr int64_t saturatingMul(int64_t a, int64_t b) {
  int64_t product = 0;
  return __builtin_mul_overflow(a, b, &product) ? std::numeric_limits<int64_t>::max() : product;
}
constexpr int64_t saturatingAdd(int64_t a, int64_t b) {
  int64_t sum = 0;
  return __builtin_add_overflow(a, b, &sum) ? std::numeric_limits<int64_t>::max() : sum;
}
// An extent as the shared-memory layouts (twell/device/shared_memory.h) take it: negative counts as 0,
// beyond 2^20 as 2^20 (every layout is then far over any limit, and no product of a few overflows).
constexpr int64_t layoutExtent(int64_t v) { return std::clamp<int64_t>(v, 0, int64_t{1} << 20); }
}  // namespace detail

// Gate GEMM with the TwELL epilogue, main loop `fma` (#twell.config mainloop = fma, the default): a CTA
// computes cta_m x tile_n = 16384 outputs, 64 fp32 accumulators
// on each of 256 threads laid out 16 x 16, and stages its operands (fp32, cta_k deep) and then the
// activated tile (16-bit) in one static shared-memory buffer of at most 48 KiB.
struct GateKernelConstraints {
  static constexpr int64_t kTileElements = 16384;
  static constexpr int64_t kThreads = 256;
  static constexpr int64_t kMaxStaticSharedBytes = 48 * 1024;

  // max(cta_k * (cta_m + tile_n) * 4, cta_m * tile_n * 2), saturating at INT64_MAX instead of
  // overflowing (so that an absurd configuration reads as too large, never as small). Negative
  // arguments count as 0.
  static constexpr int64_t staticSharedBytes(int64_t ctaM, int64_t ctaK, int64_t tileN) {
    using detail::layoutExtent;
    return smem::fma_gate_bytes(layoutExtent(ctaM), layoutExtent(ctaK), layoutExtent(tileN));
  }

  // The K step twell-select-config gives a tile width: 16, halved while the operands would not fit
  // kMaxStaticSharedBytes (8 at tile_n = 1024).
  static constexpr int64_t defaultCtaK(int64_t tileN) {
    int64_t ctaM = tileN > 0 ? kTileElements / tileN : 0;
    int64_t ctaK = 16;
    while (ctaK > 1 && staticSharedBytes(ctaM, ctaK, tileN) > kMaxStaticSharedBytes) ctaK /= 2;
    return ctaK;
  }

  // cta_m * tile_n == kTileElements, without forming the product.
  static constexpr bool fillsTile(int64_t ctaM, int64_t tileN) {
    return tileN > 0 && kTileElements % tileN == 0 && ctaM == kTileElements / tileN;
  }
};

// Gate GEMM with the TwELL epilogue, main loop `mma_sync` (#twell.config mainloop = mma_sync): tensor
// cores through mma.sync m16n8k16 fed by ldmatrix, operands (16-bit) streamed by cp.async through a
// `stages`-deep pipeline of dynamic shared memory; the portable sm_80+ feature set. A CTA computes
// cta_m x tile_n outputs on 512 threads (16 warps: measured on the H200, 8 warps left the tensor
// cores waiting on latency at 12.5% occupancy; 16 fit in 128 registers each without spills),
// cta_m = min(128, 32768 / tile_n) (at most 64 fp32 accumulators per thread), K consumed 32 at a time. A stage holds cta_m + tile_n rows of 32 values
// padded to 40 (80 bytes: ldmatrix without bank conflicts); the epilogue stages the activated tile
// (16-bit) in the same buffer.
struct MmaSyncGateConstraints {
  static constexpr int64_t kCtaK = 32;
  static constexpr int64_t kThreads = 512;
  static constexpr int64_t kMinTileN = 64;
  static constexpr int64_t kMaxTileN = 1024;
  static constexpr int64_t kMaxCtaM = 128;
  static constexpr int64_t kMaxTileElements = 32768;  // cta_m * tile_n
  // x and w_gate rows are read in 16-byte cp.async chunks of 8 16-bit values: d_model, the row strides
  // and the pointers must be multiples of 8 elements.
  static constexpr int64_t kDModelMultiple = 8;
  static constexpr int64_t kOperandAlignment = 8;  // elements (16 bytes)
  static constexpr int64_t kPaddedRow = smem::kMmaSyncRow;  // elements per stage row (cta_k = 32 + 8 padding)
  static constexpr int64_t kElementBytes = 2;
  static constexpr int64_t kMaxSharedBytes = 200 * 1024;  // dynamic, opted into by the runtime
  static constexpr int64_t kMinStages = 2;
  static constexpr int64_t kMaxStages = 4;

  // Whether the main loop can run a layout of tiles `tileN` wide over d_model = `dModel`.
  static constexpr bool dModelAllowed(int64_t dModel) { return dModel > 0 && dModel % kDModelMultiple == 0; }
  static constexpr bool tileNAllowed(int64_t tileN) { return tileN >= kMinTileN && tileN <= kMaxTileN; }
  static constexpr bool allowed(int64_t dModel, int64_t tileN) {
    return dModelAllowed(dModel) && tileNAllowed(tileN) && maxStages(tileN) >= kMinStages;
  }

  // The one cta_m of a tile width: min(128, 32768 / tile_n) (0 for tile_n <= 0).
  static constexpr int64_t ctaM(int64_t tileN) {
    return tileN <= 0 ? 0 : std::min(kMaxCtaM, kMaxTileElements / tileN);
  }
  // The dynamic shared memory of a CTA: max(stages x (cta_m + tile_n) x 40 x 2, cta_m x tile_n x 2).
  static constexpr int64_t sharedBytes(int64_t ctaM, int64_t tileN, int64_t stages) {
    using detail::layoutExtent;
    return smem::mma_sync_gate_bytes(layoutExtent(ctaM), layoutExtent(tileN), layoutExtent(stages));
  }
  // The deepest pipeline (4, 3 or 2 stages) whose shared memory fits kMaxSharedBytes at cta_m =
  // ctaM(tileN); 0 if none does.
  static constexpr int64_t maxStages(int64_t tileN) {
    for (int64_t stages = kMaxStages; stages >= kMinStages; --stages)
      if (sharedBytes(ctaM(tileN), tileN, stages) <= kMaxSharedBytes) return stages;
    return 0;
  }
};
// The paper's shape (tile_n = 256): cta_m 128, 4 stages of 30720 bytes; tile_n = 1024: cta_m 32, 2.
static_assert(MmaSyncGateConstraints::ctaM(256) == 128 && MmaSyncGateConstraints::maxStages(256) == 4 &&
              MmaSyncGateConstraints::sharedBytes(128, 256, 4) == 122880);
static_assert(MmaSyncGateConstraints::ctaM(1024) == 32 && MmaSyncGateConstraints::maxStages(1024) == 2);

// Gate GEMM with the TwELL epilogue, main loop `wgmma` (#twell.config mainloop = wgmma; sm_90a with the
// wgmma and tma features): a persistent, warp-specialized kernel of 384 threads, one producer warpgroup
// issuing TMA loads and two consumer warpgroups of 64 rows each issuing wgmma m64nNk16 with N =
// tile_n (so tile_n is 64, 128 or 256). K is consumed cta_k values at a time, one swizzle row of the
// stage: cta_k 64 = 128-byte rows (128-byte swizzle), cta_k 32 = 64-byte rows (64-byte swizzle; half
// the stage, so twice the stages in the same shared memory: a deeper prefetch). The ring holds
// `stages` stages of (cta_m + tile_n) x cta_k 16-bit values in dynamic shared memory, beside the
// epilogue's staging area (cta_m rows of tile_n + 8 16-bit values), 16 bytes of mbarriers per stage, 32
// for the epilogue's and 1 KiB to align the ring. TMA needs 16-byte aligned rows, and d_model must be a
// multiple of the K step: with a partial last K box (TMA zero-filling its tail) the f16 kernel
// returned wrong, run-to-run different sums on the H200 (bench/README.md v9; not understood yet), so
// shapes with a K tail take the mma_sync main loop.
struct WgmmaGateConstraints {
  static constexpr int64_t kCtaM = 128;
  static constexpr int64_t kDefaultCtaK = 64;
  static constexpr int64_t kMinCtaK = 32;
  static constexpr int64_t kDefaultClusterM = 2;  // where the target multicasts (bench/README.md v20)
  static constexpr int64_t kThreads = 384;
  static constexpr int64_t kOperandAlignment = 8;  // elements (16 bytes)
  static constexpr int64_t kMinStages = 2;
  static constexpr int64_t kMaxStages = 6;
  static constexpr int64_t kMaxSharedBytes = 227 * 1024;  // the sm_90 per-CTA opt-in limit

  static constexpr bool tileNAllowed(int64_t tileN) { return tileN == 64 || tileN == 128 || tileN == 256; }
  static constexpr bool ctaKAllowed(int64_t ctaK) { return ctaK == 32 || ctaK == 64; }
  // CTAs per cluster sharing the w_gate tile (TMA multicast): each loads tile_n / cluster_m rows of it.
  static constexpr bool clusterMAllowed(int64_t clusterM) { return clusterM == 1 || clusterM == 2; }
  // The shape rules of some wgmma gate kernel (the smallest K step); a given cta_k also needs
  // d_model % cta_k == 0.
  static constexpr bool allowed(int64_t dModel, int64_t tileN) {
    return dModel > 0 && dModel % kMinCtaK == 0 && tileNAllowed(tileN);
  }
  // The K step for d_model: the default where it divides d_model, else the smaller one.
  static constexpr int64_t ctaKFor(int64_t dModel) { return dModel % kDefaultCtaK == 0 ? kDefaultCtaK : kMinCtaK; }
  static constexpr int64_t sharedBytes(int64_t tileN, int64_t ctaK, int64_t stages) {
    using detail::layoutExtent;
    return smem::wgmma_gate_bytes(kCtaM, layoutExtent(tileN), layoutExtent(ctaK), layoutExtent(stages), 1);
  }
  // The dense path's fused gated-up variant of the same kernel (GatedUp; DenseGatedUpConstraints):
  // each ring stage also holds a Wu tile of tile_n rows.
  static constexpr int64_t gatedUpSharedBytes(int64_t tileN, int64_t ctaK, int64_t stages) {
    using detail::layoutExtent;
    return smem::wgmma_gate_bytes(kCtaM, layoutExtent(tileN), layoutExtent(ctaK), layoutExtent(stages), 2);
  }
  // The deepest ring (kMaxStages down to kMinStages) that fits kMaxSharedBytes; 0 if none does.
  static constexpr int64_t maxStages(int64_t tileN, int64_t ctaK) {
    for (int64_t stages = kMaxStages; stages >= kMinStages; --stages)
      if (sharedBytes(tileN, ctaK, stages) <= kMaxSharedBytes) return stages;
    return 0;
  }
};
// The paper's shape (tile_n = 256): 3 stages of 48 KiB (cta_k 64) or 6 of 24 KiB (cta_k 32) beside
// 66 KiB of staging.
static_assert(WgmmaGateConstraints::maxStages(256, 64) == 3 && WgmmaGateConstraints::maxStages(128, 64) == 5 &&
              WgmmaGateConstraints::maxStages(64, 64) == 6 && WgmmaGateConstraints::maxStages(256, 32) == 6);

// The dense path's fused gated-up kernel (KernelKind::DenseGatedUp; gate_twell_wgmma.cuh, GatedUp):
// h = act(x Wg^T) * (x Wu^T) on sm_90a, 128-row CTA tiles, 128 columns of both g and u (one m64n256k16
// wgmma over the two weight tiles: 128 fp32 accumulators per thread, as the gate's 256 columns), K
// steps of 64 (128-byte swizzle), 3 stages of 48 KiB (x box + Wg tile + Wu tile), clusters of 2
// sharing both weight tiles by multicast.
struct DenseGatedUpConstraints {
  static constexpr int64_t kTileN = 128;
  static constexpr int64_t kCtaK = 64;
  static constexpr int64_t kStages = 3;
  static constexpr int64_t kClusterM = 2;
  static constexpr int64_t kThreads = WgmmaGateConstraints::kThreads;
  static constexpr int64_t kCtaM = WgmmaGateConstraints::kCtaM;
  static constexpr int64_t kSharedBytes = WgmmaGateConstraints::gatedUpSharedBytes(kTileN, kCtaK, kStages);
  // A gated layer on sm_90a (wgmma, TMA, multicast) whose rows are whole K steps and 16-byte columns.
  static constexpr bool allowed(bool gated, int sm, bool archSpecific, int64_t dModel, int64_t dFF) {
    return gated && sm == 90 && archSpecific && dModel > 0 && dModel % kCtaK == 0 && dFF > 0 && dFF % 8 == 0;
  }
};
static_assert(DenseGatedUpConstraints::kSharedBytes <= WgmmaGateConstraints::kMaxSharedBytes);
static_assert(DenseGatedUpConstraints::kSharedBytes == 3 * ((128 + 2 * 128) * 64 * 2 + 16) + 128 * (128 + 8) * 2 + 1024 + 32,
              "ring stages with their 2 mbarriers, the epilogue's staging slabs, ring alignment, epilogue mbarriers");

// The auxiliary kernels' fixed geometry (aux/*.cuh): 256 threads; the transpose moves 32 x 32 tiles
// with blocks of 32 x 8 threads.
struct AuxiliaryKernelConstraints {
  static constexpr int64_t kThreads = 256;
  static constexpr int64_t kTransposeTile = 32;
};

// The training backward by token row (KernelKind::TrainRowBackward; train/row_backward.cuh): one CTA of
// 256 threads per token row, like the CTA-per-row consumer (gated_down_cta). Its entries are gathered in
// chunks of max(tile_n, kMinChunk) in shared memory (static, about 20 KiB); per chunk, one warp per entry
// reduces dy . Wd^T_j and x . Wu_j, then every thread adds the chunk's du Wu_j + dg Wg_j to the fp32 dx
// columns it owns, in entry order. With d_model % 8 == 0 rows move 16 bytes at a time (operand alignment
// 8: x, dy, dx and the weights' rows and pointers), else 2 bytes; after a tensor-core gate the overflow
// recompute (and SiLU's g) reads x and Wg in 4-byte pairs, which d_model % 8 == 0 gives. dx lives in
// registers: ceil(d_model / 256) values per thread, so d_model is at most kMaxDModel (64 per thread).
// Wd is read as rows of Wd^T ([d_ff, d_model], in_out: contiguous per neuron; the runtime's
// WeightTranspose makes it from an nn.Linear Wd).
// The warp-per-row form (train_row_backward_warp; chosen by warpRow): persistent CTAs of kWarpThreads
// (kWarpCtaM warps, a row per warp at a time), launched twice (TrainRowPass: the entries' quads from Wd^T and
// Wu, then dx from Wu and Wg a 1024-column slice at a time, two entries' rows in flight), x, dy and
// a window of the row's TwELL words in static shared memory (about 42 KiB at d_model 2048), 16-byte chunks
// of a row per lane (8 values per lane and 256 columns, at most 8 chunks, so d_model <= kWarpMaxDModel); ReLU only (SiLU's act'(g) needs the gate's g, which the CTA form recomputes eight
// entries per mma), after a tensor-core gate (the overflow recompute on one warp), tile_n <= 512, slots < 512.
struct TrainRowBackwardConstraints {
  static constexpr int64_t kThreads = 256;
  static constexpr int64_t kCtaM = 1;
  static constexpr int64_t kWarpThreads = 128;
  static constexpr int64_t kWarpCtaM = kWarpThreads / 32;
  static constexpr int64_t kWarpMaxDModel = 2048;
  // The TwELL words of at least one tile-row must fit the warp's 512-word window: slots + 1 <= 512.
  static constexpr bool warpRow(int64_t dModel, int64_t tileN, int64_t slots, bool relu, bool tensorCoreGate) {
    return dModel % 8 == 0 && dModel <= kWarpMaxDModel && tileN <= 512 && slots + 1 <= 512 && relu && tensorCoreGate;
  }
  static constexpr int64_t kMinChunk = 512;
  static constexpr int64_t kMaxDModel = 16384;
  static constexpr int64_t kVectorMultiple = 8;
  static constexpr bool vector(int64_t dModel) { return dModel % kVectorMultiple == 0; }
  // The element alignment of every 16-bit operand's pointer and row stride.
  static constexpr int64_t operandAlignment(int64_t dModel, bool tensorCoreGate) {
    return vector(dModel) ? 8 : tensorCoreGate ? 2 : 1;
  }
  static constexpr bool allowed(int64_t dModel, int64_t dFF) {
    return dModel >= 1 && dModel <= kMaxDModel && dFF >= 1 && dFF <= (int64_t{1} << 24);
  }
};

// The training weight gradients (KernelKind::TrainWeightGrad; train/weight_grad.cuh): one persistent
// CTA of kThreads per SM (at most kMaxCtas), launched cooperatively (its four phases meet at grid
// barriers), so the grid depends on the device, not on M. Dynamic shared memory (sharedBytes): a
// counter per neuron and a column mask per warp and tile column, 4 bytes each; d_ff is bounded by it
// (maxDFF: 53952 neurons at tile_n 256 where the target allows 227 KiB). Workspace
// (workspaceWords, 4-byte words): the barrier, tile flags, neuron starts and the [d_ff][kMaxCtas] range
// counts; the entry list holds a word pair per TwELL word and backup_grad quad (listEntries).
// x and dy are read 8 values per 16-byte load where d_model % 8 == 0 (operand alignment 8), else
// one 16-bit value per load.
struct TrainWeightGradConstraints {
  static constexpr int64_t kThreads = smem::kTrainWeightGradWarps * 32;
  static constexpr int64_t kColumns = smem::kTrainWeightGradColumns;
  static constexpr int64_t kMaxCtas = smem::kTrainWeightGradMaxCtas;
  static constexpr int64_t kMaxDModel = 65536;
  static constexpr int64_t sharedBytes(int64_t dFF, int64_t tileN) { return smem::train_weight_grad_bytes(dFF, tileN); }
  // The kernel's static shared memory (its scan's per-warp sums: 64 bytes) stays under this reserve,
  // which the per-block limit must also hold beside the dynamic bytes.
  static constexpr int64_t kStaticReserve = 256;
  // The largest d_ff whose shared memory fits `limitBytes` (the target's per-block limit,
  // maxDynamicSharedBytes), static reserve included; the counters are whole groups of 4.
  static constexpr int64_t maxDFF(int64_t tileN, int64_t limitBytes) {
    return ((limitBytes - kStaticReserve) / 4 - smem::kTrainWeightGradWarps * tileN) / 4 * 4;
  }
  static constexpr bool allowed(int64_t dModel, int64_t dFF) {
    return dModel >= 1 && dModel <= kMaxDModel && dFF >= 1 && dFF <= (int64_t{1} << 24);
  }
  static constexpr int64_t ctas(int64_t smCount) { return smCount < kMaxCtas ? smCount : kMaxCtas; }
  static constexpr int64_t tiles(int64_t dFF, int64_t tileN) { return tileN <= 0 ? 0 : (dFF + tileN - 1) / tileN; }
  static constexpr int64_t workspaceWords(int64_t dFF, int64_t tileN) {
    return smem::TrainWeightGradWorkspace::words(tiles(dFF, tileN), dFF);
  }
  // The words the runtime zeroes on the stream before each launch (the barrier and the tile flags).
  static constexpr int64_t clearedWords(int64_t dFF, int64_t tileN) {
    return smem::TrainWeightGradWorkspace::cleared(tiles(dFF, tileN));
  }
  static constexpr int64_t listEntries(int64_t tokens, int64_t wordsPerRow, int64_t gradCapacity, int64_t tileN) {
    return tokens * wordsPerRow + gradCapacity * tileN;
  }
  static constexpr int64_t operandAlignment(int64_t dModel) { return dModel % 8 == 0 ? 8 : 1; }
};
static_assert(TrainWeightGradConstraints::sharedBytes(5632, 256) == 5632 * 4 + 16 * 256 * 4);
static_assert(TrainWeightGradConstraints::maxDFF(256, 227 * 1024) == 53952 &&
              TrainWeightGradConstraints::sharedBytes(53952, 256) + TrainWeightGradConstraints::kStaticReserve <= 227 * 1024);

// The ranges #twell.config accepts (ConfigAttr::verify), checked before any arithmetic on the fields.
// They are wide enough for any kernel configuration (a CTA has at most 1024 threads) and small enough
// that products of a few of them cannot overflow int64.
struct ConfigLimits {
  static constexpr int64_t kMaxCtaM = 4096;
  static constexpr int64_t kMaxCtaK = 1024;  // 0 = no K loop
  static constexpr int64_t kMinThreads = 32;
  static constexpr int64_t kMaxThreads = 1024;  // and a multiple of 32 (whole warps)
  static constexpr int64_t kMaxStages = 8;      // 0 = no pipeline (mainloop fma, the consumer)
  static constexpr int64_t kMaxClusterM = 8;    // the portable cluster size limit
};

// The GPU architectures a #twell.target (and the generator's twell::Target) may name: those NVRTC 13.0
// builds for (nvrtcGetSupportedArchs, nvcc --list-gpu-arch: 75 80 86 87 88 89 90 100 103 110 120 121)
// at or above sm_80 (bf16 tensor cores), and, with the "a" suffix (arch-specific features), those that
// have an arch-specific variant (sm_90a and the Blackwell family). The one list of them: Generate.h's
// isSupportedTarget/supportedTargets read it too.
struct SupportedArchs {
  static constexpr int kComputeCapabilities[] = {80, 86, 87, 88, 89, 90, 100, 103, 110, 120, 121};
  static constexpr int kArchSpecific[] = {90, 100, 103, 110, 120, 121};

  static constexpr bool isSupported(int64_t computeCapability, bool archSpecific) {
    const int64_t cc = computeCapability;
    if (archSpecific) return std::find(std::begin(kArchSpecific), std::end(kArchSpecific), cc) != std::end(kArchSpecific);
    return std::find(std::begin(kComputeCapabilities), std::end(kComputeCapabilities), cc) !=
           std::end(kComputeCapabilities);
  }

  // "sm_80, sm_86, ..., sm_121, sm_90a, ..., sm_121a"
  static std::string list() {
    std::string text;
    for (int cc : kComputeCapabilities) text += (text.empty() ? "sm_" : ", sm_") + std::to_string(cc);
    for (int cc : kArchSpecific) text += ", sm_" + std::to_string(cc) + "a";
    return text;
  }
};

// Consumer (twell.gated_down; twell.down without the token block), three variants told apart by cta_m:
// one token row per CTA (cta_m = 1, any shape), or one token row per warp (cta_m = threads / 32;
// gated_down_warp in gated_down.cuh, persistent): x in shared memory and the fp32 y of the row in the
// warp's registers, 8 values per lane per 256 columns, so it needs 16-byte rows
// (after a tensor-core gate, d_model % 8 == 0, in_out down weights) and d_model <= 2048 (registers).
// Its overflow recompute of a gate value repeats the gate kernel's arithmetic (to stay bit-exact), so
// its #twell.config carries the gate kernel's `mainloop`; after an mma_sync or wgmma gate it reads x
// and w_gate in 4-byte pairs (operand alignment 2 elements).
// The third, the token block (cta_m = 16; gated_down_block.cuh), multiplies the union of the active
// columns of 16 token rows with mma.sync: x, Wu and Wd^T rows move in 16-byte cp.async chunks through a
// `stages`-deep ring in dynamic shared memory (operand alignment 8), each of 8 warps keeps 16 x
// d_model / 8 fp32 outputs in registers (d_model a power of two from 128 to 2048), and a union chunk is
// at most 256 columns of whole tiles (tile_n <= 256).
struct GatedDownKernelConstraints {
  static constexpr int64_t kCtaM = 1;
  static constexpr int64_t kOperandAlignmentAfterMmaSync = 2;  // and after wgmma
  static constexpr int64_t kWarpRowMaxDModel = 2048;
  static constexpr int64_t kWarpRowDModelMultiple = 8;
  static constexpr int64_t kWarpRowOperandAlignment = 8;  // 16-byte x, Wu, Wd^T and y rows
  static constexpr int64_t kWarpRowThreads = 256;         // more warps per CTA only spill
  // A tensor-core gate's recompute reads 4-byte pairs of x and Wg: d_model % 8 == 0 (mma_sync) or
  // % 32 == 0 (wgmma) as for the gate (the consumer's mainloop names the gate's).
  static constexpr bool warpRowAllowed(bool tensorCoreGate, bool inOut, int64_t dModel, int64_t threads) {
    return tensorCoreGate && inOut && dModel > 0 && dModel % kWarpRowDModelMultiple == 0 &&
           dModel <= kWarpRowMaxDModel && threads == kWarpRowThreads;
  }
  // Dynamic shared memory of a warp-per-row CTA (gated_down_warp): each warp's x row, d_model rounded
  // up to 256 values of 2 bytes (32 KiB at d_model 2048).
  static constexpr int64_t warpRowSharedBytes(int64_t dModel) {
    return smem::warp_row_consumer_bytes(detail::layoutExtent(dModel), kWarpRowThreads / 32);
  }

  // Token block (gated_down_block.cuh; its layout is smem::block_consumer_layout, twell/device/shared_memory.h).
  static constexpr int64_t kBlockCtaM = smem::kBlockRows;
  static constexpr int64_t kBlockThreads = 256;
  static constexpr int64_t kBlockDModelMultiple = 128;
  static constexpr int64_t kBlockMaxDModel = 2048;
  static constexpr int64_t kBlockMaxTileN = 256;
  static constexpr int64_t kBlockOperandAlignment = 8;
  static constexpr int64_t kBlockMinStages = 3;
  static constexpr int64_t kBlockMaxStages = 6;
  static constexpr int64_t kBlockChunk = smem::kBlockChunk;  // union columns per chunk
  // Dynamic shared memory of one CTA: the ring (stages x max(up stage, down stage)), G/H [16, 256],
  // one dense tile-row per warp, the union bits, the nnz headers, the chunk's column list and tile
  // bases, and two ints. 0 when the shape is outside the variant.
  static constexpr int64_t blockSharedBytes(int64_t dModel, int64_t dFF, int64_t tileN, int64_t stages) {
    if (dModel <= 0 || dModel > kBlockMaxDModel || tileN <= 0 || tileN > kBlockMaxTileN || dFF <= 0 ||
        dFF > (int64_t{1} << 24) || stages < 0 || stages > kBlockMaxStages)
      return 0;
    return smem::block_consumer_layout(dModel, dFF, tileN, stages).bytes;
  }
  // The deepest ring (6 down to 3 stages) that fits `maxSharedBytes`; 0 if none does.
  static constexpr int64_t blockStages(int64_t dModel, int64_t dFF, int64_t tileN, int64_t maxSharedBytes) {
    for (int64_t stages = kBlockMaxStages; stages >= kBlockMinStages; --stages) {
      const int64_t bytes = blockSharedBytes(dModel, dFF, tileN, stages);
      if (bytes > 0 && bytes <= maxSharedBytes) return stages;
    }
    return 0;
  }
  // d_model a power of two from 128 to 2048: a Wd^T row is K / 8 16-byte chunks and the 256 threads
  // load whole rows per pass (K / 8 divides 256 or 256 divides it).
  static constexpr bool blockShapeAllowed(bool tensorCoreGate, bool inOut, int64_t dModel, int64_t tileN) {
    return tensorCoreGate && inOut && dModel >= kBlockDModelMultiple && dModel <= kBlockMaxDModel &&
           (dModel & (dModel - 1)) == 0 && tileN > 0 && tileN <= kBlockMaxTileN;
  }
  // Dynamic shared memory a CTA may opt into, by compute capability (CUDA C++ Programming Guide,
  // "Technical Specifications per Compute Capability": 227 KiB on 9.x/10.x, 163 KiB on 8.0/8.7, 99 KiB
  // on 8.6/8.9/12.x).
  static constexpr int64_t maxDynamicSharedBytes(int sm) {
    if (sm == 80 || sm == 87) return 163 * 1024;
    if (sm == 86 || sm == 89 || sm >= 120) return 99 * 1024;
    return 227 * 1024;
  }
};
// The decode kernels (kernels/device/twell/device/decode/decode.cuh) for at most kMaxTokens token rows, made
// beside every consumer whose gate is a tensor-core one (they repeat its mma.sync chain) and whose rows
// move 16 bytes at a time (d_model % 8 == 0): decode_gate (kGateThreads, one CTA per kSliceN columns
// of d_ff; copy issue, not math, bounds it at a few rows, hence many threads), decode_up (kUpThreads,
// one CTA per row and tile), decode_down (one warp per row and downColumns outputs). Their workspace is sized by d_ff: at most kMaxDFF.
struct DecodeKernelConstraints {
  static constexpr int64_t kMaxTokens = 64;
  static constexpr int64_t kSliceN = 32;
  static constexpr int64_t kGateThreads = 256;   // every warp streams Wg; kGateMmaWarps multiply
  static constexpr int64_t kGateMmaWarps = 2;    // 16 columns of the slice each
  static constexpr int64_t kUpThreads = 128;
  static constexpr int64_t kDownThreads = 32;
  // decode_down's output columns per warp: two per lane reading rows of an in_out Wd, one per lane
  // reading columns of an out_in one.
  static constexpr int64_t downColumns(bool inOut) { return inOut ? 64 : 32; }
  static constexpr int64_t kMaxDFF = 65536;
  // decode_gate's cp.async ring (DecodeGateRing in decode.cuh, the same formula): stages of kGateCtaK
  // K-values (rows padded to kGateLd) of the 16 or 64 rows of x that `tokens` rows need and of the
  // kSliceN rows of Wg, 4 stages at 16 rows and 2 at 64 (two CTAs per SM either way); at least
  // the rows x tile_n values the last CTA of a tile stages for packing.
  static constexpr int64_t kGateCtaK = smem::kDecodeGateCtaK;
  static constexpr int64_t kGateLd = smem::kDecodeGateLd;
  static constexpr int64_t gateRows(int64_t tokens) { return tokens <= 16 ? 16 : 64; }
  static constexpr int64_t gateSharedBytes(int64_t tileN, int64_t tokens) {
    return smem::decode_gate_bytes(gateRows(tokens), kSliceN, detail::layoutExtent(tileN));
  }
  // decode_gate_small (at most kGateSmallMaxTokens rows): one warp per n8 tile of its kGateSmallSliceN
  // columns. On sm_90 and later (bulkRows) each Wg row of the slice is one bulk copy into a shared row
  // of 2 d_model + 16 bytes, where that fits kGateSmallMaxRowBytes (d_model <= 6392); elsewhere the
  // mma fragments come from global memory and shared memory only packs the tile's rows.
  static constexpr int64_t kGateSmallMaxTokens = 8;
  static constexpr int64_t kGateSmallSliceN = 16;
  static constexpr int64_t kGateSmallThreads = kGateSmallSliceN / 8 * 32;
  static constexpr int64_t kGateSmallMaxRowBytes = 200 * 1024;
  // Room for the kernels' static shared memory (the arrival flag, mbarriers) beside the dynamic part.
  static constexpr int64_t kStaticSharedReserve = 1024;
  static constexpr bool gateSmallBulkRows(int64_t dModel, int sm) {
    const int64_t bytes = kGateSmallSliceN * (2 * dModel + 16);
    return sm >= 90 && bytes <= kGateSmallMaxRowBytes &&
           bytes + kStaticSharedReserve <= GatedDownKernelConstraints::maxDynamicSharedBytes(sm);
  }
  static constexpr int64_t gateSmallSharedBytes(int64_t tileN, int64_t dModel, int sm) {
    return smem::decode_gate_small_bytes(kGateSmallMaxTokens, detail::layoutExtent(tileN), kGateSmallSliceN,
                                         detail::layoutExtent(dModel), gateSmallBulkRows(dModel, sm));
  }
  // decode_fused (at most kFusedMaxTokens rows; PlanOptions::decode_fused_max_tokens): one CTA of
  // kFusedThreads per SM (at most kFusedMaxCtas), launched cooperatively. The kernel may take all the
  // shared memory the target allows (fusedSharedBytes, its attribute); a launch passes what its shape
  // and token count need (fusedLaunchBytes: the h pass's arrays for the CTA's ceil(d_ff / CTAs) rows, then
  // the larger of x's 8, 16 or 32 rows with the units' sums and the reduction's batch, which reuses
  // them), no more, so that the rest stays L1 (a larger carve-out slowed the Wg stream, bench/README.md
  // v64, v77). fusedMaxTokens: the most tokens whose launch fits the target (32,
  // else 16 or 8 where only x tiles of that many rows fit, 0 where none does).
  static constexpr int64_t kFusedMaxTokens = smem::kDecodeFusedTokens;
  static constexpr int64_t kFusedThreads = smem::kDecodeFusedWarps * 32;
  static constexpr int64_t kFusedMaxCtas = smem::kDecodeFusedMaxCtas;
  // Its static shared memory (the scan's totals, the compiler's) stays under kFusedStaticReserve.
  static constexpr int64_t kFusedStaticReserve = 2048;
  static constexpr int64_t fusedSharedBytes(int sm) {
    return GatedDownKernelConstraints::maxDynamicSharedBytes(sm) - kFusedStaticReserve;
  }
  static constexpr int64_t fusedCtas(int64_t smCount) { return smCount < kFusedMaxCtas ? smCount : kFusedMaxCtas; }
  static constexpr int64_t fusedLaunchBytes(int64_t dModel, int64_t dFF, int64_t ctas, int64_t tokens) {
    return smem::decode_fused_bytes(dModel, (dFF + ctas - 1) / ctas, ctas, smem::decode_fused_token_rows(tokens));
  }
  static constexpr int64_t fusedMaxTokens(int64_t dModel, int64_t dFF, int64_t smCount, int sm) {
    const int64_t ctas = fusedCtas(smCount);
    if (ctas < 1) return 0;
    for (int64_t tokens : {kFusedMaxTokens, int64_t{16}, int64_t{8}})
      if (fusedLaunchBytes(dModel, dFF, ctas, tokens) <= fusedSharedBytes(sm)) return tokens;
    return 0;
  }
  // Also: decode_gate's shared memory at 64 rows must fit the target (not on the 99 KiB parts:
  // sm_86, sm_89, sm_120, sm_121), and not beside the token-block consumer, which rounds h to the
  // value type where the decode kernels repeat the row consumers' fp32 sums.
  static constexpr bool allowed(bool tensorCoreGate, bool tokenBlockConsumer, int64_t dModel, int64_t dFF, int64_t tileN,
                                int sm) {
    return tensorCoreGate && !tokenBlockConsumer && dModel > 0 && dModel % 8 == 0 &&
           dFF > 0 && dFF <= kMaxDFF && tileN >= kSliceN &&
           tileN % kSliceN == 0 &&
           gateSharedBytes(tileN, kMaxTokens) + kStaticSharedReserve <= GatedDownKernelConstraints::maxDynamicSharedBytes(sm);
  }
};
static_assert(DecodeKernelConstraints::gateSharedBytes(256, 1) == 101376 &&
              DecodeKernelConstraints::gateSharedBytes(256, 64) == 101376 &&
              DecodeKernelConstraints::gateSharedBytes(1024, 64) == 131072);

// The paper's shape on sm_90a: 6 stages, 224416 bytes.
static_assert(GatedDownKernelConstraints::blockSharedBytes(2048, 5632, 256, 6) == 224416 &&
              GatedDownKernelConstraints::blockStages(2048, 5632, 256, 227 * 1024) == 6);

}  // namespace twell::kernels
