// D2T, the portable correct-first version: H = act(X Wg^T) computed by a CTA-tiled GEMM with fp32
// accumulation, packed into TwELL in the epilogue of the CTA that produced the tile (paper §3, TwELL:
// the N extent of the CTA tile is the TwELL tile width, so no other CTA's data is needed).
//
// CTA tile: Config::cta_m rows x Config::tile_n columns (cta_m * tile_n = 16384, 64 fp32 accumulators
// per thread over 256 threads), K consumed Config::cta_k at a time through shared memory. Any M, K, N:
// rows, columns and K beyond the matrix are masked (TWELL_FORMAT.md, requirement 4).
//
// Epilogue, per (row, tile), deterministic (requirement 2): the activated tile-row is staged in shared
// memory; one warp per row counts the active entries with __ballot_sync, then writes them in ascending
// column order at the positions given by the ballot prefix (popc of the lanes below). A tile-row with
// more than `slots` entries is never truncated (requirement 1): it claims a backup slot with one
// atomicAdd and stores its whole activated tile-row there; word 1 of the header then holds the backup
// index, or kBackupMissing when the backup is full (consumers recompute it; the counter tells the host
// how large the backup must be next time).
#pragma once
#include "twell/device/numerics.cuh"

namespace twell::device {

template <class Config>
__device__ __forceinline__ void gate_twell(const GateParams& p) {
  using Value = typename Config::Value;
  constexpr int K = Config::d_model;
  constexpr int N = Config::d_ff;
  constexpr int TILE_N = Config::tile_n;
  constexpr int SLOTS = Config::slots;
  constexpr int CTA_M = Config::cta_m;
  constexpr int CTA_K = Config::cta_k;
  constexpr int THREADS = Config::threads;
  static_assert(THREADS == 256, "the thread layout below is 16 x 16");
  static_assert(CTA_M % 16 == 0 && TILE_N % 16 == 0, "micro-tiles are (cta_m/16) x (tile_n/16)");
  constexpr int MICRO_M = CTA_M / 16;
  constexpr int MICRO_N = TILE_N / 16;
  constexpr int TILES = (N + TILE_N - 1) / TILE_N;
  constexpr int WORDS_PER_ROW = TILES * (SLOTS + 1);

  // Main loop operands (fp32, K-major so the inner product reads broadcast/consecutive words) and the
  // epilogue's activated tile share one buffer: the epilogue starts after the last K step.
  constexpr int OPERAND_BYTES = CTA_K * (CTA_M + TILE_N) * 4;
  constexpr int EPILOGUE_BYTES = CTA_M * TILE_N * 2;
  constexpr int SMEM_BYTES = OPERAND_BYTES > EPILOGUE_BYTES ? OPERAND_BYTES : EPILOGUE_BYTES;
  static_assert(SMEM_BYTES <= 48 * 1024, "static shared memory is limited to 48 KiB: lower cta_k (config)");
  __shared__ __align__(16) unsigned char smem[SMEM_BYTES];
  float (*As)[CTA_M] = reinterpret_cast<float (*)[CTA_M]>(smem);
  float (*Bs)[TILE_N] = reinterpret_cast<float (*)[TILE_N]>(smem + CTA_K * CTA_M * 4);
  uint16_t (*Hs)[TILE_N] = reinterpret_cast<uint16_t (*)[TILE_N]>(smem);

  const int tid = threadIdx.x;
  const int tx = tid % 16;
  const int ty = tid / 16;
  const int64_t m0 = static_cast<int64_t>(blockIdx.x) * CTA_M;
  const int tile = blockIdx.y;
  const int n0 = tile * TILE_N;

  float acc[MICRO_M][MICRO_N];
#pragma unroll
  for (int i = 0; i < MICRO_M; ++i)
#pragma unroll
    for (int j = 0; j < MICRO_N; ++j) acc[i][j] = 0.0f;

  for (int k0 = 0; k0 < K; k0 += CTA_K) {
    for (int e = tid; e < CTA_M * CTA_K; e += THREADS) {
      const int r = e / CTA_K, kk = e % CTA_K;
      const int64_t row = m0 + r;
      const int k = k0 + kk;
      As[kk][r] = (row < p.m && k < K) ? Value::to_float(p.x[row * p.ldx + k]) : 0.0f;
    }
    for (int e = tid; e < TILE_N * CTA_K; e += THREADS) {
      const int c = e / CTA_K, kk = e % CTA_K;
      const int n = n0 + c;
      const int k = k0 + kk;
      Bs[kk][c] = (n < N && k < K) ? Value::to_float(p.w_gate[static_cast<int64_t>(n) * p.ldw + k]) : 0.0f;
    }
    __syncthreads();
    // Each accumulator is one fmaf chain in ascending k (the CPU reference and the consumer's
    // overflow recompute use the same order, so all three agree bit for bit).
#pragma unroll
    for (int kk = 0; kk < CTA_K; ++kk) {
      float a[MICRO_M], b[MICRO_N];
#pragma unroll
      for (int i = 0; i < MICRO_M; ++i) a[i] = As[kk][ty * MICRO_M + i];
#pragma unroll
      for (int j = 0; j < MICRO_N; ++j) b[j] = Bs[kk][tx + 16 * j];
#pragma unroll
      for (int i = 0; i < MICRO_M; ++i)
#pragma unroll
        for (int j = 0; j < MICRO_N; ++j) acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
    }
    __syncthreads();
  }

  // Epilogue 1: round to the value type (as a dense GEMM's output would be), activate, stage.
#pragma unroll
  for (int i = 0; i < MICRO_M; ++i)
#pragma unroll
    for (int j = 0; j < MICRO_N; ++j)
      Hs[ty * MICRO_M + i][tx + 16 * j] = activate<Value, Config::activation>(Value::from_float(acc[i][j]));
  __syncthreads();

  // Epilogue 2: one warp per tile-row; ballot + prefix gives each entry its slot in column order.
  const int warp = tid / 32;
  const int lane = tid % 32;
  const int valid_n = N - n0 < TILE_N ? N - n0 : TILE_N;
  for (int r = warp; r < CTA_M; r += THREADS / 32) {
    const int64_t row = m0 + r;
    if (row >= p.m) break;
    uint32_t* out = p.twell + row * WORDS_PER_ROW + tile * (SLOTS + 1);
    uint32_t nnz = 0;
    for (int c0 = 0; c0 < TILE_N; c0 += 32) {
      const int c = c0 + lane;
      const bool active = c < valid_n && is_active<Value, Config::activation>(Hs[r][c], Config::threshold);
      nnz += __popc(__ballot_sync(0xFFFFFFFFu, active));
    }
    if (nnz <= SLOTS) {
      uint32_t base = 0;
      for (int c0 = 0; c0 < TILE_N; c0 += 32) {
        const int c = c0 + lane;
        const bool active = c < valid_n && is_active<Value, Config::activation>(Hs[r][c], Config::threshold);
        const uint32_t ballot = __ballot_sync(0xFFFFFFFFu, active);
        if (active) out[1 + base + __popc(ballot & lanemask_lt())] = (static_cast<uint32_t>(Hs[r][c]) << 16) | c;
        base += __popc(ballot);
      }
      if (lane == 0) out[0] = nnz;
    } else {
      uint32_t slot = 0;
      if (lane == 0) slot = atomicAdd(p.overflow_count, 1u);
      slot = __shfl_sync(0xFFFFFFFFu, slot, 0);
      const bool stored = slot < p.backup_capacity;
      if (stored) {
        uint16_t* dst = p.backup + static_cast<int64_t>(slot) * TILE_N;
        for (int c = lane; c < TILE_N; c += 32) {
          const bool active = c < valid_n && is_active<Value, Config::activation>(Hs[r][c], Config::threshold);
          dst[c] = active ? Hs[r][c] : static_cast<uint16_t>(0);
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
