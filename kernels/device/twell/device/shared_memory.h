// The shared-memory layouts of the kernels, written once: the device templates lay out their shared
// memory with these functions (compiled by NVRTC) and the host contracts size launches and check
// configurations with them (twell/kernels/constraints.h, compiled by g++). Plain constexpr integer
// arithmetic with no includes, so both compilers take it. Bytes; the host passes in-range values (its
// wrappers clamp absurd ones first, so no product overflows).
#pragma once

// Functions a kernel evaluates at run time (from its launch's shared memory) are host and device ones.
#if defined(__CUDACC__) || defined(__CUDACC_RTC__)
#define TWELL_HOST_DEVICE __host__ __device__
#else
#define TWELL_HOST_DEVICE
#endif

namespace twell::device::shared_memory {

// fma gate (gate/gate_twell.cuh, static shared memory): the fp32 operands of one K step, cta_k x
// (cta_m + tile_n), then the activated tile (16-bit) in the same buffer.
constexpr long long fma_gate_bytes(long long cta_m, long long cta_k, long long tile_n) {
  const long long operands = cta_k * (cta_m + tile_n) * 4, epilogue = cta_m * tile_n * 2;
  return operands > epilogue ? operands : epilogue;
}

// mma_sync gate (gate/gate_twell.cuh): `stages` stages of cta_m + tile_n rows of 32 K-values padded to
// kMmaSyncRow (80 bytes: ldmatrix without bank conflicts), then the activated tile in the same buffer.
constexpr long long kMmaSyncRow = 40;
constexpr long long mma_sync_gate_stage_elements(long long cta_m, long long tile_n) { return (cta_m + tile_n) * kMmaSyncRow; }
constexpr long long mma_sync_gate_bytes(long long cta_m, long long tile_n, long long stages) {
  const long long ring = stages * mma_sync_gate_stage_elements(cta_m, tile_n) * 2, epilogue = cta_m * tile_n * 2;
  return ring > epilogue ? ring : epilogue;
}

// wgmma gate and the dense path's gated-up variant (gate/gate_twell_wgmma.cuh): 1 KiB to align the
// ring to the 128-byte swizzle, `stages` stages of the x box (cta_m x cta_k) and `operands` weight
// tiles (tile_n x cta_k: Wg, and Wu for gated-up), the staging area (cta_m rows of tile_n + 8 values),
// full and empty mbarriers per stage, the epilogue's 4 mbarriers.
constexpr long long wgmma_gate_a_bytes(long long cta_m, long long cta_k) { return cta_m * cta_k * 2; }
constexpr long long wgmma_gate_b_bytes(long long tile_n, long long cta_k) { return tile_n * cta_k * 2; }
constexpr long long wgmma_gate_stage_bytes(long long cta_m, long long tile_n, long long cta_k, long long operands) {
  return wgmma_gate_a_bytes(cta_m, cta_k) + operands * wgmma_gate_b_bytes(tile_n, cta_k);
}
constexpr long long wgmma_gate_staging_stride(long long tile_n) { return tile_n + 8; }
constexpr long long wgmma_gate_bytes(long long cta_m, long long tile_n, long long cta_k, long long stages,
                                     long long operands) {
  return 1024 + stages * wgmma_gate_stage_bytes(cta_m, tile_n, cta_k, operands) +
         cta_m * wgmma_gate_staging_stride(tile_n) * 2 + stages * 2 * 8 + 4 * 8;
}

// Warp-per-row consumer (consumer/gated_down.cuh): each warp's x row, d_model rounded up to 256 values.
constexpr long long warp_row_consumer_bytes(long long d_model, long long warps) { return warps * ((d_model + 255) / 256 * 256) * 2; }

// Token-block consumer (consumer/gated_down_block.cuh): the ring (stages x max(up stage, down stage)),
// G/H [16, 256], one dense tile-row per warp, the union bits, the nnz headers, the chunk's column list
// and tile bases, the chunk's end tile and padded width.
constexpr long long kBlockRows = 16, kBlockWarps = 8, kBlockChunk = 256, kBlockUpK = 64;
struct BlockConsumerLayout {
  long long stage_bytes, g_offset, dense_offset, mask_offset, nnz_offset, cols_offset, base_offset, chunk_offset, bytes;
};
constexpr BlockConsumerLayout block_consumer_layout(long long d_model, long long d_ff, long long tile_n, long long stages) {
  const long long tiles = (d_ff + tile_n - 1) / tile_n, mask_words = (tile_n + 31) / 32;
  const long long up = (kBlockChunk + kBlockRows) * kBlockUpK * 2;
  const long long down = (d_model > 1024 ? 8 : 16) * d_model * 2;  // Wd^T rows per down stage (<= 32 KiB)
  BlockConsumerLayout l{};
  l.stage_bytes = up > down ? up : down;
  l.g_offset = stages * l.stage_bytes;
  l.dense_offset = l.g_offset + kBlockRows * kBlockChunk * 2;
  l.mask_offset = l.dense_offset + kBlockWarps * tile_n * 2;
  l.nnz_offset = l.mask_offset + tiles * mask_words * 4;
  l.cols_offset = l.nnz_offset + kBlockRows * tiles * 4;
  l.base_offset = l.cols_offset + kBlockChunk * 4;
  l.chunk_offset = l.base_offset + tiles * 4;
  l.bytes = l.chunk_offset + 8;
  return l;
}

// decode_gate (decode/decode.cuh): a cp.async ring of kDecodeGateCtaK K-values per stage (rows padded to
// kDecodeGateLd) of the `rows` rows of x (16 or 64) and the slice's rows of Wg, 4 stages at 16 rows and
// 2 at 64 (two CTAs per SM either way); at least the rows x tile_n values the last CTA of a tile stages.
constexpr long long kDecodeGateCtaK = 256, kDecodeGateLd = kDecodeGateCtaK + 8;
constexpr long long decode_gate_stages(long long rows) { return rows <= 16 ? 4 : 2; }
constexpr long long decode_gate_bytes(long long rows, long long slice_n, long long tile_n) {
  const long long ring = decode_gate_stages(rows) * (rows + slice_n) * kDecodeGateLd * 2, staging = rows * tile_n * 2;
  return ring > staging ? ring : staging;
}

// decode_gate_small (decode/decode.cuh): the packing's max_tokens x tile_n values, or (bulk_rows) the
// slice's Wg rows, 2 d_model + 16 bytes each, if larger.
constexpr long long decode_gate_small_bytes(long long max_tokens, long long tile_n, long long slice_n, long long d_model,
                                            bool bulk_rows) {
  const long long staging = max_tokens * tile_n * 2, rows = bulk_rows ? slice_n * (2 * d_model + 16) : 0;
  return rows > staging ? rows : staging;
}

// decode_fused (decode/decode_fused.cuh), one CTA per SM of kDecodeFusedWarps warps, x tiles of
// token_rows rows (decode_fused_token_rows: 8, the mma's A rows 0-7, for calls of at most 8 tokens; 16,
// all its rows, up to 16; 32, two m16 tiles, up to kDecodeFusedTokens), each group of 8 Wg rows in
// kDecodeFusedSlices k slices (a warp each), a warp's loads in windows of at most kDecodeFusedWindow k32
// blocks (16 loads of 16 bytes per lane in flight: the 80 registers a thread of 768 has; bench/README.md
// v64); after the g pass its first kDecodeFusedReducerWarps warps reduce y while the others compute h
// (all of them compute h first where the CTA has more active rows than the others are warps).
// Its dynamic shared memory: first what the h pass reads (decode_fused_h_bytes: a per (row, token), the
// rows' token masks, the active rows, per token its active rows as bits, 32 a word); then phase 1's x
// rows (a stride of d_model rounded up to 64, plus 32 values: 16-byte rows, each two start 16 banks
// apart, so the mma's 16-byte A reads (8 lanes over 2 rows) do not conflict) and the (group, slice)
// units' sums [units][token_rows][8] (units: groups x kDecodeFusedSlices), which the reduction reuses
// once the g pass is done (decode_fused_phase2_bytes): a batch of kDecodeFusedBatchPerRow x token_rows
// (row, token) pairs, each with its
// kDecodeFusedColumns Wd values and h, then the start of every (token, CTA) segment of the pairs. A
// call's token_rows sizes its shared memory, so that calls of at most 8 tokens keep the smaller
// carve-out (more of the SM's L1/shared memory left L1, which the Wg stream needs: bench/README.md v64,
// v65, v77).
// At most kDecodeFusedMaxCtas CTAs (one per SM): its reducers read all m x CTAs counts in one round trip.
constexpr long long kDecodeFusedWarps = 24, kDecodeFusedReducerWarps = 16, kDecodeFusedTokens = 32, kDecodeFusedSlices = 4,
                    kDecodeFusedWindow = 16, kDecodeFusedColumns = 16, kDecodeFusedBatchPerRow = 64, kDecodeFusedMaxCtas = 256;
TWELL_HOST_DEVICE constexpr long long decode_fused_token_rows(long long tokens) { return tokens <= 8 ? 8 : tokens <= 16 ? 16 : 32; }
TWELL_HOST_DEVICE constexpr long long decode_fused_x_stride(long long d_model) { return (d_model + 63) / 64 * 64 + 32; }
// 32-bit words of row bits per CTA of at most rows_per_cta rows.
TWELL_HOST_DEVICE constexpr long long decode_fused_bit_words(long long rows_per_cta) { return (rows_per_cta + 31) / 32; }
TWELL_HOST_DEVICE constexpr long long decode_fused_h_bytes(long long rows_per_cta, long long token_rows) {
  return (rows_per_cta * token_rows * 4 + rows_per_cta * 4 * 2 + token_rows * decode_fused_bit_words(rows_per_cta) * 4 + 15) / 16 * 16;
}
TWELL_HOST_DEVICE constexpr long long decode_fused_phase1_bytes(long long d_model, long long rows_per_cta, long long token_rows) {
  const long long units = (rows_per_cta + 7) / 8 * kDecodeFusedSlices;
  return token_rows * decode_fused_x_stride(d_model) * 2 + units * token_rows * 8 * 4;
}
TWELL_HOST_DEVICE constexpr long long decode_fused_phase2_bytes(long long ctas, long long token_rows) {
  return kDecodeFusedBatchPerRow * token_rows * (2 * kDecodeFusedColumns + 4) + (token_rows * ctas + 1) * 4;
}
// A launch's dynamic shared memory: `ctas` CTAs of at most rows_per_cta = ceil(d_ff / ctas) rows each,
// x tiles of token_rows rows.
TWELL_HOST_DEVICE constexpr long long decode_fused_bytes(long long d_model, long long rows_per_cta, long long ctas,
                                                         long long token_rows) {
  const long long a = decode_fused_phase1_bytes(d_model, rows_per_cta, token_rows),
                  b = decode_fused_phase2_bytes(ctas, token_rows);
  return decode_fused_h_bytes(rows_per_cta, token_rows) + ((a > b ? a : b) + 15) / 16 * 16;
}
// Its global workspace (params.h DecodeFusedBuffers) for `ctas` CTAs: a segment per (token, CTA) of
// up to kDecodeFusedTokens tokens, each a count (a 32-bit word) and room for the CTA's ceil(d_ff / ctas)
// rows' pairs (64-bit words).
TWELL_HOST_DEVICE constexpr long long decode_fused_segments(long long ctas) { return kDecodeFusedTokens * ctas; }
TWELL_HOST_DEVICE constexpr long long decode_fused_pair_slots(long long d_ff, long long ctas) {
  return decode_fused_segments(ctas) * ((d_ff + ctas - 1) / ctas);
}

// The training weight gradients (train/weight_grad.cuh): a CTA of kTrainWeightGradWarps warps, one per
// SM (at most kTrainWeightGradMaxCtas, cooperative); each phase-4 warp sums kTrainWeightGradColumns
// columns of one neuron. Dynamic shared memory: a counter per neuron (rounded up to 4 words), then a
// column mask per warp and tile column.
constexpr long long kTrainWeightGradWarps = 16, kTrainWeightGradColumns = 256, kTrainWeightGradMaxCtas = 256;
TWELL_HOST_DEVICE constexpr long long train_weight_grad_counters(long long d_ff) { return (d_ff + 3) / 4 * 4; }
TWELL_HOST_DEVICE constexpr long long train_weight_grad_bytes(long long d_ff, long long tile_n) {
  return (train_weight_grad_counters(d_ff) + kTrainWeightGradWarps * tile_n) * 4;
}
// Its global workspace, in 32-bit words (TrainWeightGradParams::workspace): the grid barrier's two
// words, a flag per TwELL tile (both zero at launch: the runtime clears kCleared(tiles) words on the
// stream first), each neuron's start in the sorted list ([d_ff + 1]), and the per-range counts
// ([d_ff][CTAs], for up to kTrainWeightGradMaxCtas CTAs).
struct TrainWeightGradWorkspace {
  // kBarrier: grid_barrier's two words; kItems: phase 4's next item (train/weight_grad.cuh); all cleared
  // per launch with the flags.
  static constexpr long long kBarrier = 0, kItems = 2, kFlags = 4;
  TWELL_HOST_DEVICE static constexpr long long cleared(long long tiles) { return (kFlags + tiles + 3) / 4 * 4; }
  TWELL_HOST_DEVICE static constexpr long long starts(long long tiles) { return cleared(tiles); }
  TWELL_HOST_DEVICE static constexpr long long counts(long long tiles, long long d_ff) {
    return (starts(tiles) + d_ff + 1 + 3) / 4 * 4;
  }
  TWELL_HOST_DEVICE static constexpr long long words(long long tiles, long long d_ff) {
    return counts(tiles, d_ff) + d_ff * kTrainWeightGradMaxCtas;
  }
};

}  // namespace twell::device::shared_memory
