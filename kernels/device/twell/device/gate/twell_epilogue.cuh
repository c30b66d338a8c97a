// The TwELL packing epilogue of the gate GEMM (paper §3), shared by every main loop: the CTA's
// activated tile (cta_m rows x tile_n columns, value bits) is staged in shared memory; one warp per
// tile-row counts the active entries with __ballot_sync, then writes them in ascending column order at
// the positions given by the ballot prefix (the entries of the lanes below): deterministic, no atomics
// (TWELL_FORMAT.md, requirement 2).
//
// A tile-row with more than `slots` entries is never truncated (requirement 1): it claims a backup
// slot with one atomicAdd and stores its whole activated tile-row there; word 1 of the header then
// holds the backup index, or kBackupMissing when the backup is full (the consumer recomputes the
// tile-row; the counter tells the host how large the backup must be next time).
#pragma once
#include "twell/device/primitives/numerics.cuh"

namespace twell::device {

// `rows` staged rows (row r at staged + r * STRIDE, global row m0 + r) are packed by warps
// [0, warps) counted from `warp` (this thread's warp among them): the whole CTA by default, or the
// packer warps of the wgmma kernel.
//
// 8 columns per lane: lane l holds columns 256 k + 8 l .. + 7 of chunk k, read with one 16-byte
// shared-memory load, so chunk order, lane order and bit order are ascending column order; the
// per-lane counts (at most 8: 4 bits) are prefixed with one ballot per bit. Per 256 columns that is one
// load and 4 ballots instead of 8 dependent 2-byte loads and ballots per pass: the wgmma gate's packer
// warps must finish a tile's two slabs within one main loop, and with the per-column walk they did
// not (bench/README.md v22). Needs 16-byte aligned staged rows (STRIDE % 8 == 0, `staged` 16-byte
// aligned) and a 16-byte aligned backup (device allocations are).
template <class Config, int STRIDE = Config::tile_n>
__device__ __forceinline__ void pack_twell_tile(const GateParams& p, const uint16_t* staged, int64_t m0, int tile,
                                                int rows = Config::cta_m, int warp = threadIdx.x / 32,
                                                int warps = Config::threads / 32) {
  using Value = typename Config::Value;
  constexpr int N = Config::d_ff;
  constexpr int TILE_N = Config::tile_n;
  constexpr int SLOTS = Config::slots;
  constexpr int WORDS_PER_ROW = (N + TILE_N - 1) / TILE_N * (SLOTS + 1);
  constexpr int CHUNKS = (TILE_N + 255) / 256;  // 256 columns: 8 per lane
  static_assert(TILE_N % 8 == 0 && STRIDE % 8 == 0, "8 columns per lane, 16-byte row chunks");
  const int lane = threadIdx.x % 32;
  const int n0 = tile * TILE_N;
  const int valid_n = N - n0 < TILE_N ? N - n0 : TILE_N;
  for (int r = warp; r < rows; r += warps) {
    const int64_t row = m0 + r;
    if (row >= p.m) break;
    uint16_t v[CHUNKS][8];
    uint32_t mask[CHUNKS], below[CHUNKS], nnz = 0;
#pragma unroll
    for (int k = 0; k < CHUNKS; ++k) {
      const int c0 = 256 * k + 8 * lane;
      uint4 chunk = make_uint4(0, 0, 0, 0);
      if (c0 < TILE_N) chunk = *reinterpret_cast<const uint4*>(staged + r * STRIDE + c0);
      const uint32_t words[4] = {chunk.x, chunk.y, chunk.z, chunk.w};
      mask[k] = 0;
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        v[k][j] = static_cast<uint16_t>(words[j / 2] >> (16 * (j % 2)));
        if (c0 + j < valid_n && is_active<Value, Config::activation>(v[k][j], Config::threshold)) mask[k] |= 1u << j;
      }
      const uint32_t count = __popc(mask[k]);
      below[k] = nnz;  // the entries of the chunks before, then of the lanes below
#pragma unroll
      for (int b = 0; b < 4; ++b) {
        const uint32_t ballot = __ballot_sync(0xFFFFFFFFu, (count >> b) & 1u);
        below[k] += static_cast<uint32_t>(__popc(ballot & lanemask_lt())) << b;
        nnz += static_cast<uint32_t>(__popc(ballot)) << b;
      }
    }
    uint32_t* out = p.twell + row * WORDS_PER_ROW + tile * (SLOTS + 1);
    if (nnz <= SLOTS) {
#pragma unroll
      for (int k = 0; k < CHUNKS; ++k) {
        uint32_t* slot = out + 1 + below[k];
#pragma unroll
        for (int j = 0; j < 8; ++j)
          if (mask[k] >> j & 1u) *slot++ = (static_cast<uint32_t>(v[k][j]) << 16) | static_cast<uint32_t>(256 * k + 8 * lane + j);
      }
      if (lane == 0) out[0] = nnz;
    } else {
      // Never truncated (requirement 1): the whole activated tile-row goes to a backup slot.
      uint32_t slot = 0;
      if (lane == 0) slot = atomicAdd(p.overflow_count, 1u);
      slot = __shfl_sync(0xFFFFFFFFu, slot, 0);
      const bool stored = slot < p.backup_capacity;
      if (stored) {
#pragma unroll
        for (int k = 0; k < CHUNKS; ++k) {
          const int c0 = 256 * k + 8 * lane;
          if (c0 >= TILE_N) continue;
          uint32_t kept[4];
#pragma unroll
          for (int w = 0; w < 4; ++w)
            kept[w] = (mask[k] >> (2 * w) & 1u ? static_cast<uint32_t>(v[k][2 * w]) : 0u) |
                      (mask[k] >> (2 * w + 1) & 1u ? static_cast<uint32_t>(v[k][2 * w + 1]) << 16 : 0u);
          *reinterpret_cast<uint4*>(p.backup + static_cast<int64_t>(slot) * TILE_N + c0) =
              make_uint4(kept[0], kept[1], kept[2], kept[3]);
        }
      }
      if (lane == 0) {
        out[0] = nnz;
        out[1] = stored ? slot : kBackupMissing;
      }
    }
  }
}

}  // namespace twell::device
