// Token-block gated consumer on tensor cores (#twell.config cta_m = 16 on a gated_down; the portable
// mma.sync feature set, sm_80 and newer). For a block of 16 token rows X [16, K]:
//
//   U   = union of the rows' active columns of g (per tile of d_ff, in ascending column order)
//   H   = g ⊙ (X Wu[U]^T)          [16, |U|]   up projection, mma.sync m16n8k16, fp32 -> rounded to Value
//   Y  += H Wd^T[U]                [16, K]     down projection, mma.sync, fp32 accumulators in registers
//
// The issue's tensor-core consumer for 2-10% density: each gathered row of Wu and Wd^T is read once
// per block of 16 rows instead of once per active entry, so rows share the weight traffic wherever
// their active sets overlap (real layers: 2-3x less traffic at 16 rows, bench/README.md v14), and the
// multiply-adds run on tensor cores instead of CUDA cores. Zero entries of the union (a column active
// in another row of the block) multiply g = 0: they cost tensor-core time, not traffic, and add exact
// zeros.
//
// The union is processed in chunks of at most 256 columns (whole tiles, ascending). Per chunk:
//   1. cols[] lists the chunk's union columns; G [16, 256] (shared) holds g at (row, position in cols).
//   2. Up: Wu rows cols[i], 64 values of K per stage, with the X slice, through a ring of `stages`
//      cp.async stages (Config::stages); warp w computes union columns [32w, 32w + 32).
//   3. H = Value(g * u) overwrites G in place (same thread, same element).
//   4. Down: Wd^T rows cols[i], 8 or 16 rows of K per stage, through the same ring; warp w owns output
//      columns [w K/8, (w + 1) K/8): 16 x K/8 fp32 accumulators (128 registers per thread at K = 2048).
// Shared-memory rows are stored with their 16-byte chunks XOR-swizzled by (row % 8), so the ldmatrix
// reads of 8 rows at one column hit 8 different bank groups.
//
// Overflowing tile-rows (nnz > slots) are read from the backup or, when it was full, recomputed with
// the gate's arithmetic (recompute_gate_tile): the same bits either way, so y does not depend on the
// backup capacity. Every sum runs in a fixed order (union order, mma k order): bitwise deterministic.
//
// Rounding: h is rounded to the value type before the down projection (as the dense path rounds its
// h tensor, so an f16 h beyond 65504 becomes inf as it does there); the row-gather consumers keep h in
// fp32. Both stay within the 1e-2 contract.
#pragma once
#include "twell/device/consumer/consumer_common.cuh"

namespace twell::device {

__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const void* smem) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_address(smem)));
}

// Shared-memory plan of the token-block consumer; the host mirrors it in
// GatedDownKernelConstraints::blockSharedBytes (shared_memory.h's layout) and the kernel traps if it was
// launched with less.
template <class Config>
struct BlockConsumerShape {
  static constexpr int K = Config::d_model;
  static constexpr int N = Config::d_ff;
  static constexpr int TILE_N = Config::tile_n;
  static constexpr int TILES = (N + TILE_N - 1) / TILE_N;
  static constexpr int MASK_WORDS = (TILE_N + 31) / 32;  // union bits per tile
  static constexpr int BM = shared_memory::kBlockRows;      // token rows per CTA (mma M)
  static constexpr int WARPS = shared_memory::kBlockWarps;
  static constexpr int CHUNK = shared_memory::kBlockChunk;   // union columns per chunk
  static constexpr int UP_K = shared_memory::kBlockUpK;      // K values per up stage
  static constexpr int DOWN_ROWS = K > 1024 ? 8 : 16;        // Wd^T rows per down stage (<= 32 KiB)
  static constexpr int STAGES = Config::stages;
  // The layout (shared_memory.h: the host sizes launches by the same function).
  static constexpr shared_memory::BlockConsumerLayout L = shared_memory::block_consumer_layout(K, N, TILE_N, STAGES);
  static constexpr int STAGE_BYTES = L.stage_bytes;
  static constexpr int G_OFFSET = L.g_offset;
  static constexpr int DENSE_OFFSET = L.dense_offset;
  static constexpr int MASK_OFFSET = L.mask_offset;
  static constexpr int NNZ_OFFSET = L.nnz_offset;
  static constexpr int COLS_OFFSET = L.cols_offset;
  static constexpr int BASE_OFFSET = L.base_offset;
  static constexpr int CHUNK_OFFSET = L.chunk_offset;  // the chunk's end tile and padded width
  static constexpr int BYTES = L.bytes;
  static_assert(K == 128 || K == 256 || K == 512 || K == 1024 || K == 2048,
                "token-block consumer: d_model 128, 256, 512, 1024 or 2048 (whole Wd^T rows per load pass)");
  static_assert(TILE_N <= CHUNK, "token-block consumer: tile_n <= 256");
  static_assert(STAGES >= 3, "token-block consumer: at least 3 stages");
  static_assert(Config::gated, "token-block consumer: gated layers only (twell.down takes the row gather)");
};

// Byte offset of 16-byte chunk `q` of row `r` in a swizzled array of rows `row_bytes` long.
__device__ __forceinline__ int swizzled(int r, int q, int row_bytes) { return r * row_bytes + ((q ^ (r & 7)) << 4); }

template <class Config>
__device__ __forceinline__ void gated_down_block(const GatedDownParams& p) {
  using S = BlockConsumerShape<Config>;
  using Value = typename Config::Value;
  constexpr int K = S::K, N = S::N, TILE_N = S::TILE_N, TILES = S::TILES, MW = S::MASK_WORDS;
  constexpr int BM = S::BM, WARPS = S::WARPS, CHUNK = S::CHUNK, R = S::STAGES;
  constexpr int SLOTS = Config::slots;
  constexpr int WORDS_PER_ROW = TILES * (SLOTS + 1);
  constexpr int Y_COLS = K / WARPS;  // output columns per warp
  constexpr int Y_TILES = Y_COLS / 8;
  static_assert(Config::threads == 32 * WARPS && Config::cta_m == BM && Config::gate_mainloop >= 1 && Config::down_in_out,
                "token-block consumer: 256 threads, cta_m = 16, tensor-core gate, in_out Wd");

  extern __shared__ __align__(128) unsigned char smem[];
  require_dynamic_smem(S::BYTES);  // host and device agree on the layout
  unsigned char* ring = smem;
  unsigned char* gh = smem + S::G_OFFSET;  // [BM][CHUNK] Value bits, swizzled rows of 512 bytes
  uint16_t* dense_tiles = reinterpret_cast<uint16_t*>(smem + S::DENSE_OFFSET);
  uint32_t* masks = reinterpret_cast<uint32_t*>(smem + S::MASK_OFFSET);  // [TILES][MW]
  uint32_t* nnz_s = reinterpret_cast<uint32_t*>(smem + S::NNZ_OFFSET);   // [BM][TILES]
  int* cols = reinterpret_cast<int*>(smem + S::COLS_OFFSET);             // [CHUNK], -1 = padding
  int* tile_base = reinterpret_cast<int*>(smem + S::BASE_OFFSET);       // [TILES] first union position
  // The current chunk's end tile and padded width, read back from shared memory where needed: kept
  // in registers across the up and down loops they spill (the y accumulators take 128 registers).
  int* chunk = reinterpret_cast<int*>(smem + S::CHUNK_OFFSET);

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int64_t row0 = static_cast<int64_t>(blockIdx.x) * BM;
  const int rows = p.m - row0 < BM ? static_cast<int>(p.m - row0) : BM;

  for (int i = tid; i < BM * TILES; i += 32 * WARPS) {
    const int r = i / TILES, t = i % TILES;
    nnz_s[i] = r < rows ? p.twell[(row0 + r) * WORDS_PER_ROW + static_cast<int64_t>(t) * (SLOTS + 1)] : 0u;
  }
  for (int i = tid; i < TILES * MW; i += 32 * WARPS) masks[i] = 0u;
  __syncthreads();

  // The activated dense tile-row (r, t) of an overflowing tile-row into this warp's buffer.
  uint16_t* dense_tile = dense_tiles + warp * TILE_N;
  auto load_dense = [&](int r, int t, int valid_n) {
    const uint32_t slot = p.twell[(row0 + r) * WORDS_PER_ROW + static_cast<int64_t>(t) * (SLOTS + 1) + 1];
    load_overflow_tile<Config>(p, slot, p.x + (row0 + r) * p.ldx, t * TILE_N, valid_n, dense_tile, lane, 32, warp, 1);
    __syncwarp();
  };
  // Visits every active (column c in the tile, g bits) of the tile-rows (r, t) for pair indices
  // i = first, first + step, ... < count (r = i / tiles + 0, t = t_first + i % tiles); warp-wide. The
  // entry words of 4 tile-rows are loaded before any visit, so 4 L2 round trips overlap (the pairs are
  // many and short: ~1-30 entries each). Overflowing tile-rows go one at a time through load_dense.
  auto for_each_entry_of = [&](int first, int count, int step, int tiles, int t_first, auto&& visit) {
    constexpr int BATCH = 4;
    for (int i0 = first; i0 < count; i0 += BATCH * step) {
      uint32_t word[BATCH];
      int n[BATCH];
#pragma unroll
      for (int b = 0; b < BATCH; ++b) {
        const int i = i0 + b * step;
        const int r = i / tiles, t = t_first + i % tiles;
        const uint32_t nnz = i < count ? nnz_s[r * TILES + t] : 0u;
        n[b] = nnz <= SLOTS ? static_cast<int>(nnz) : 0;
        word[b] = lane < n[b] ? p.twell[(row0 + r) * WORDS_PER_ROW + static_cast<int64_t>(t) * (SLOTS + 1) + 1 + lane] : 0u;
      }
#pragma unroll
      for (int b = 0; b < BATCH; ++b) {
        const int i = i0 + b * step;
        const int r = i / tiles, t = t_first + i % tiles;
        if (lane < n[b]) visit(r, t, static_cast<int>(word[b] & 0xFFFFu), static_cast<uint16_t>(word[b] >> 16));
        // Tile-rows with more than 32 entries (slots > 31), and overflowing ones.
        if (i < count) {
          const uint32_t nnz = nnz_s[r * TILES + t];
          if (nnz > 32 && nnz <= SLOTS) {
            const uint32_t* header = p.twell + (row0 + r) * WORDS_PER_ROW + static_cast<int64_t>(t) * (SLOTS + 1);
            for (int e = 32 + lane; e < static_cast<int>(nnz); e += 32)
              visit(r, t, static_cast<int>(header[1 + e] & 0xFFFFu), static_cast<uint16_t>(header[1 + e] >> 16));
          } else if (nnz > SLOTS) {
            const int valid_n = N - t * TILE_N < TILE_N ? N - t * TILE_N : TILE_N;
            load_dense(r, t, valid_n);
            for (int c = lane; c < valid_n; c += 32)
              if (is_active<Value, Config::activation>(dense_tile[c], Config::threshold)) visit(r, t, c, dense_tile[c]);
            __syncwarp();  // dense_tile is free again
          }
        }
      }
    }
  };
  // 1. The union of the block's active columns, per tile.
  for_each_entry_of(warp, BM * TILES, WARPS, TILES, 0,
                    [&](int, int t, int c, uint16_t) { atomicOr(&masks[t * MW + c / 32], 1u << (c % 32)); });
  __syncthreads();

  float y[Y_TILES][4];
#pragma unroll
  for (int j = 0; j < Y_TILES; ++j) y[j][0] = y[j][1] = y[j][2] = y[j][3] = 0.0f;

  auto tile_count = [&](int t) {
    int n = 0;
#pragma unroll
    for (int w = 0; w < MW; ++w) n += __popc(masks[t * MW + w]);
    return n;
  };
  // Position of column c of tile t in the chunk's union list.
  auto position = [&](int t, int c) {
    int pos = tile_base[t];
    for (int w = 0; w < c / 32; ++w) pos += __popc(masks[t * MW + w]);
    return pos + __popc(masks[t * MW + c / 32] & ((1u << (c % 32)) - 1u));
  };

  // A ring of R cp.async stages: stage i of a phase lands in slot i % R; loads run R - 2 stages ahead
  // and are issued after the stage's compute, so the slot they overwrite was last read two barriers
  // earlier (a down k16 step reads two consecutive slots when DOWN_ROWS = 8).
  auto prologue = [&](int n, auto&& load) {
    for (int i = 0; i < R - 2; ++i) {
      if (i < n) load(i, ring + (i % R) * S::STAGE_BYTES);
      cp_async_commit();
    }
  };
  auto body = [&](int n, auto&& load, auto&& compute) {
    for (int i = 0; i < n; ++i) {
      cp_async_wait<R - 3>();
      __syncthreads();
      compute(i);
      const int j = i + R - 2;
      if (j < n) load(j, ring + (j % R) * S::STAGE_BYTES);
      cp_async_commit();
    }
  };

  int t0 = 0;
  while (t0 < TILES) {
    // 2. The chunk: whole tiles [t0, t1) with at most CHUNK union columns (every thread computes the
    // same boundaries; thread 0 records the bases).
    int total = 0, t1 = t0;
    while (t1 < TILES) {
      const int n = tile_count(t1);
      if (total + n > CHUNK) break;
      if (tid == 0) tile_base[t1] = total;
      total += n;
      ++t1;
    }
    if (total == 0) {
      t0 = t1;
      continue;
    }
    if (tid == 0) {
      chunk[0] = t1;
      chunk[1] = (total + 15) / 16 * 16;
    }
    __syncthreads();  // tile_base and chunk written; the previous chunk's readers of cols and G are done
    const int padded = chunk[1];
    for (int i = tid; i < (t1 - t0) * MW; i += 32 * WARPS) {
      const int t = t0 + i / MW, w = i % MW;
      uint32_t bits = masks[t * MW + w];
      int pos = tile_base[t];
      for (int v = 0; v < w; ++v) pos += __popc(masks[t * MW + v]);
      while (bits != 0) {
        const int b = __ffs(bits) - 1;
        bits &= bits - 1;
        cols[pos++] = t * TILE_N + w * 32 + b;
      }
    }
    for (int i = total + tid; i < padded; i += 32 * WARPS) cols[i] = -1;
    for (int i = tid; i < BM * CHUNK * 2 / 16; i += 32 * WARPS) reinterpret_cast<uint4*>(gh)[i] = uint4{0u, 0u, 0u, 0u};
    __syncthreads();
    // G: g of every active (row, column) at its union position.
    for_each_entry_of(warp, BM * (t1 - t0), WARPS, t1 - t0, t0, [&](int r, int t, int c, uint16_t g) {
      const int pos = position(t, c);
      *reinterpret_cast<uint16_t*>(gh + swizzled(r, pos / 8, CHUNK * 2) + (pos % 8) * 2) = g;
    });

    // 3. Up projection: u [16, padded] = X Wu[cols]^T, warp w on columns [32w, 32w + 32).
    const int up_steps = K / S::UP_K;
    // Thread tid moves chunk q = tid % 8 of rows tid / 8 + 32 j: rows 0..15 of X, then Wu[cols[r - 16]]
    // (a warp's 4 rows are all X or all Wu).
    auto load_up = [&](int s, unsigned char* slot) {
      const int q = tid % 8, k = s * S::UP_K + q * 8;
      for (int r = tid / 8; r < padded + BM; r += 32) {
        if (r < BM) {
          cp_async_16(slot + swizzled(r, q, 128), p.x + (row0 + (r < rows ? r : 0)) * p.ldx + k, r < rows);
        } else {
          const int col = cols[r - BM];
          cp_async_16(slot + swizzled(r, q, 128), p.w_up + static_cast<int64_t>(col >= 0 ? col : 0) * p.ldwu + k, col >= 0);
        }
      }
    };
    float u[4][4];
#pragma unroll
    for (int j = 0; j < 4; ++j) u[j][0] = u[j][1] = u[j][2] = u[j][3] = 0.0f;
    const bool up_warp = warp * 32 < padded;
    auto compute_up = [&](int s) {
      if (!up_warp) return;
      const unsigned char* slot = ring + (s % R) * S::STAGE_BYTES;
#pragma unroll
      for (int kk = 0; kk < S::UP_K / 16; ++kk) {
        uint32_t a[4];
        ldmatrix_x4(a, slot + swizzled(lane % 16, 2 * kk + lane / 16, 128));
#pragma unroll
        for (int jp = 0; jp < 2; ++jp) {
          const int n = warp * 32 + jp * 16;
          if (n >= padded) break;
          uint32_t b[4];
          ldmatrix_x4(b, slot + swizzled(BM + n + lane % 8 + (lane / 16) * 8, 2 * kk + (lane / 8) % 2, 128));
          mma_16816<Value>(u[2 * jp], a, b[0], b[1]);
          mma_16816<Value>(u[2 * jp + 1], a, b[2], b[3]);
        }
      }
    };
    prologue(up_steps, load_up);
    body(up_steps, load_up, compute_up);

    // 4. Down projection: Wd^T rows cols[i], DR rows per stage.
    constexpr int DR = S::DOWN_ROWS;
    const int down_steps = padded / DR;
    // Thread tid moves chunk q = tid % (K / 8) of rows tid / (K / 8) + RP j of the stage.
    constexpr int CPR = K / 8, RP = 32 * WARPS / CPR;
    static_assert(DR % RP == 0, "token-block consumer: whole rows per pass");
    auto load_down = [&](int s, unsigned char* slot) {
      const int q = tid % CPR;
#pragma unroll
      for (int j = 0; j < DR / RP; ++j) {
        const int r = tid / CPR + RP * j;
        const int col = cols[s * DR + r];
        cp_async_16(slot + swizzled(r, q, K * 2), p.w_down + static_cast<int64_t>(col >= 0 ? col : 0) * p.ldwd + q * 8,
                    col >= 0);
      }
    };
    // h = Value(g * u) in place of g: accumulator (row lane/4 [+8], columns 2(lane%4) + {0,1}).
    // The register peak (y and u live): the lane and its shared-memory row are re-derived here rather
    // than kept from the top of the chunk loop (asm volatile is not hoisted; kept, they spilled).
    if (up_warp) {
      uint32_t lane;
      asm volatile("mov.u32 %0, %%laneid;" : "=r"(lane));
      unsigned char* gh = smem + S::G_OFFSET;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int c = warp * 32 + j * 8 + 2 * (lane % 4);
        if (c >= padded) break;
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const int r = lane / 4 + 8 * half;
          uint32_t* cell = reinterpret_cast<uint32_t*>(gh + swizzled(r, c / 8, CHUNK * 2) + (c % 8) * 2);
          const uint32_t g2 = *cell;
          const uint32_t h0 = Value::from_float(Value::to_float(static_cast<uint16_t>(g2)) * u[j][2 * half]);
          const uint32_t h1 = Value::from_float(Value::to_float(static_cast<uint16_t>(g2 >> 16)) * u[j][2 * half + 1]);
          *cell = h0 | (h1 << 16);
        }
      }
    }
    __syncthreads();  // every warp is done with the up stages before the down loads overwrite them
    prologue(down_steps, load_down);
    // The ring's first wait-and-barrier orders the h writes before the H reads below.
    auto compute_down = [&](int s) {
      constexpr int PAIR = 16 / DR;
      if (s % PAIR != PAIR - 1) return;
      const int k16 = s / PAIR;  // union rows [16 k16, 16 k16 + 16)
      uint32_t a[4];
      ldmatrix_x4(a, gh + swizzled(lane % 16, 2 * k16 + lane / 16, CHUNK * 2));
      // Row kr (0..15) of the k16 step: slot of stage 16 k16 / DR + kr / DR, row kr % DR there.
      const int kr = lane % 8 + ((lane / 8) % 2) * 8;
      const unsigned char* slot = ring + ((s - PAIR + 1 + kr / DR) % R) * S::STAGE_BYTES;
#pragma unroll
      for (int jp = 0; jp < Y_TILES / 2; ++jp) {
        const int n = warp * Y_COLS + jp * 16 + (lane / 16) * 8;
        uint32_t b[4];
        ldmatrix_x4_trans(b, slot + swizzled(kr % DR, n / 8, K * 2));
        mma_16816<Value>(y[2 * jp], a, b[0], b[1]);
        mma_16816<Value>(y[2 * jp + 1], a, b[2], b[3]);
      }
    };
    body(down_steps, load_down, compute_down);
    t0 = chunk[0];
    __syncthreads();  // every warp has read chunk[0] before thread 0 writes the next chunk's
  }

  // y rows: accumulator (row lane/4 [+8], columns 2(lane%4) + {0,1}) of each n8 tile.
#pragma unroll
  for (int j = 0; j < Y_TILES; ++j) {
    const int c = warp * Y_COLS + j * 8 + 2 * (lane % 4);
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int r = lane / 4 + 8 * half;
      if (r < rows)
        *reinterpret_cast<uint32_t*>(p.y + (row0 + r) * p.ldy + c) =
            static_cast<uint32_t>(Value::from_float(y[j][2 * half])) |
            (static_cast<uint32_t>(Value::from_float(y[j][2 * half + 1])) << 16);
    }
  }
}

}  // namespace twell::device
