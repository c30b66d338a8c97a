// D2T: H = act(X Wg^T), the gate GEMM, packed into TwELL in the epilogue of the CTA that produced
// the tile (paper §3: the N extent of the CTA tile is the TwELL tile width, so no other CTA's data is
// needed; twell_epilogue.cuh). Two main loops, chosen by the generator (Config::mainloop):
//
//   fma (0)       CTA tile cta_m x tile_n (cta_m * tile_n = 16384), fp32 FMA, K through static shared
//                 memory cta_k at a time. Any K and any alignment.
//   wgmma (2)     sm_90a: persistent, warp-specialized TMA + wgmma kernel (gate_twell_wgmma.cuh).
//   mma_sync (1)  tensor cores: mma.sync m16n8k16 (bf16/f16 in, fp32 accumulate) fed by ldmatrix from a
//                 `stages`-deep cp.async ring in dynamic shared memory (the portable sm_80+ feature
//                 set). Needs K % 8 == 0 and 16-byte aligned rows of x and Wg (operand_alignment 8).
//
// Any M, N: rows and columns beyond the matrix are masked (TWELL_FORMAT.md, requirement 4). Each
// output element is one fixed-order accumulation chain over K, so results are bitwise reproducible;
// the consumer's overflow recompute (gated_down.cuh) repeats the same chain.
#pragma once
#include "twell/device/primitives/tile_primitives.cuh"
#include "twell/device/gate/twell_epilogue.cuh"
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#include "twell/device/gate/gate_twell_wgmma.cuh"
#endif

namespace twell::device {

template <class Config>
__device__ __forceinline__ void gate_twell_fma(const GateParams& p) {
  using Value = typename Config::Value;
  constexpr int K = Config::d_model;
  constexpr int N = Config::d_ff;
  constexpr int TILE_N = Config::tile_n;
  constexpr int CTA_M = Config::cta_m;
  constexpr int CTA_K = Config::cta_k;
  constexpr int THREADS = Config::threads;
  static_assert(THREADS == 256, "the thread layout below is 16 x 16");
  static_assert(CTA_M % 16 == 0 && TILE_N % 16 == 0, "micro-tiles are (cta_m/16) x (tile_n/16)");
  constexpr int MICRO_M = CTA_M / 16;
  constexpr int MICRO_N = TILE_N / 16;

  // Main loop operands (fp32, K-major so the inner product reads broadcast/consecutive words) and the
  // epilogue's activated tile share one buffer: the epilogue starts after the last K step.
  constexpr int SMEM_BYTES = shared_memory::fma_gate_bytes(CTA_M, CTA_K, TILE_N);
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

  pack_twell_tile<Config>(p, &Hs[0][0], m0, tile);
}

template <class Config>
__device__ __forceinline__ void gate_twell_mma(const GateParams& p) {
  using Value = typename Config::Value;
  constexpr int K = Config::d_model;
  constexpr int N = Config::d_ff;
  constexpr int TILE_N = Config::tile_n;
  constexpr int CTA_M = Config::cta_m;
  constexpr int CTA_K = 32;
  constexpr int STAGES = Config::stages;
  constexpr int THREADS = Config::threads;
  static_assert(Config::cta_k == CTA_K && THREADS % 32 == 0, "mma_sync main loop: cta_k 32, whole warps");
  static_assert(STAGES >= 2, "the cp.async ring needs at least 2 stages");
  static_assert(K % 8 == 0, "cp.async moves 16-byte chunks: d_model % 8 == 0");
  // The warps tile the CTA as WARPS_M x WARPS_N (at most 4 warps along M, each at least 16 rows);
  // each warp owns a WM x WN block of m16n8 accumulator tiles.
  constexpr int WARPS = THREADS / 32;
  constexpr int WARPS_M = CTA_M / 16 < 4 ? CTA_M / 16 : 4;
  constexpr int WARPS_N = WARPS / WARPS_M;
  static_assert(WARPS_M * WARPS_N == WARPS, "the warps must tile the CTA");
  constexpr int WM = CTA_M / WARPS_M, WN = TILE_N / WARPS_N;
  constexpr int MT = WM / 16, NT = WN / 8;
  static_assert(WM % 16 == 0 && WN % 16 == 0, "warp tile must be a multiple of 16 x 16");
  // Shared-memory rows of 32 K-elements padded to 40 (80 bytes): the 8 row addresses of an ldmatrix
  // land in 8 disjoint groups of 4 banks (no conflicts).
  constexpr int LD = shared_memory::kMmaSyncRow;
  constexpr int STAGE_ELEMS = shared_memory::mma_sync_gate_stage_elements(CTA_M, TILE_N);
  constexpr int KT = (K + CTA_K - 1) / CTA_K;
  constexpr int TILES = (N + TILE_N - 1) / TILE_N;
  extern __shared__ __align__(128) unsigned char dynamic_smem[];
  require_dynamic_smem(shared_memory::mma_sync_gate_bytes(CTA_M, TILE_N, STAGES));  // the host sized it by the same layout
  uint16_t* smem = reinterpret_cast<uint16_t*>(dynamic_smem);

  const int tid = threadIdx.x;
  const int warp = tid / 32;
  const int lane = tid % 32;
  const int wm = warp / WARPS_N, wn = warp % WARPS_N;
  // Tiles vary fastest across consecutive CTAs: the CTAs running together share one block of x rows,
  // and Wg (at most d_ff x d_model) stays in L2, so x is read from memory about once.
  const int64_t linear = static_cast<int64_t>(blockIdx.y) * gridDim.x + blockIdx.x;
  const int tile = static_cast<int>(linear % TILES);
  const int64_t m0 = linear / TILES * CTA_M;
  const int n0 = tile * TILE_N;

  auto load_stage = [&](int stage, int kt) {
    uint16_t* As = smem + stage * STAGE_ELEMS;
    uint16_t* Bs = As + CTA_M * LD;
    const int k0 = kt * CTA_K;
    for (int c = tid; c < CTA_M * 4; c += THREADS) {
      const int r = c / 4, kc = (c % 4) * 8;
      const int64_t row = m0 + r;
      const bool valid = row < p.m && k0 + kc < K;
      cp_async_16(As + r * LD + kc, valid ? p.x + row * p.ldx + k0 + kc : p.x, valid);
    }
    for (int c = tid; c < TILE_N * 4; c += THREADS) {
      const int r = c / 4, kc = (c % 4) * 8;
      const int n = n0 + r;
      const bool valid = n < N && k0 + kc < K;
      cp_async_16(Bs + r * LD + kc, valid ? p.w_gate + static_cast<int64_t>(n) * p.ldw + k0 + kc : p.w_gate, valid);
    }
  };

  float acc[MT][NT][4];
#pragma unroll
  for (int i = 0; i < MT; ++i)
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.0f;

#pragma unroll
  for (int s = 0; s < STAGES - 1; ++s) {
    if (s < KT) load_stage(s, s);
    cp_async_commit();
  }
  for (int kt = 0; kt < KT; ++kt) {
    cp_async_wait<STAGES - 2>();
    __syncthreads();  // stage kt landed for everyone; everyone is done with stage kt - 1
    if (kt + STAGES - 1 < KT) load_stage((kt + STAGES - 1) % STAGES, kt + STAGES - 1);
    cp_async_commit();
    const uint16_t* As = smem + (kt % STAGES) * STAGE_ELEMS;
    const uint16_t* Bs = As + CTA_M * LD;
#pragma unroll
    for (int kk = 0; kk < CTA_K; kk += 16)
      mma_k16_step<Value, MT, NT>(acc, As + wm * WM * LD, Bs + wn * WN * LD, LD, kk, lane);
  }
  cp_async_wait<0>();
  __syncthreads();  // the ring is free: reuse it to stage the activated tile

  uint16_t* staged = smem;  // [CTA_M][TILE_N]
#pragma unroll
  for (int i = 0; i < MT; ++i)
#pragma unroll
    for (int j = 0; j < NT; ++j) {
      const int row = wm * WM + i * 16 + lane / 4;
      const int col = wn * WN + j * 8 + (lane % 4) * 2;
#pragma unroll
      for (int e = 0; e < 4; ++e)
        staged[(row + (e / 2) * 8) * TILE_N + col + e % 2] =
            activate<Value, Config::activation>(Value::from_float(acc[i][j][e]));
    }
  __syncthreads();
  pack_twell_tile<Config>(p, staged, m0, tile);
}

template <class Config>
__device__ __forceinline__ void gate_twell(const GateParams& p) {
  if constexpr (Config::mainloop == 2) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    gate_twell_wgmma<Config>(p);
#else
    static_assert(Config::mainloop != 2, "mainloop wgmma needs the sm_90a target");
#endif
  } else if constexpr (Config::mainloop == 1) {
    gate_twell_mma<Config>(p);
  } else {
    gate_twell_fma<Config>(p);
  }
}

}  // namespace twell::device
