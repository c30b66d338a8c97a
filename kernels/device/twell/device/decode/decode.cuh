// Decode: the FFN of a few token rows (M <= Config::max_tokens = 64, autoregressive decoding), where
// the time is reading the weights once, not math (PERFORMANCE.md, "Small M"): the dense path reads all
// of Wg, Wu and Wd; this one reads Wg and only the active rows of Wu and Wd.
//
// The large-M kernels do not spread over the GPU at such M: the D2T's CTA tile spans a whole TwELL
// tile of d_ff (paper §3), so a few rows make d_ff / tile_n CTAs (22 at the paper's shape) that each
// stream tile_n rows of Wg, and the row consumers give one warp to a row. Three kernels instead, each
// spread over all SMs:
//
//   decode_gate  one CTA per slice_n (32) columns of d_ff, all rows: Wg is read once, by d_ff / 32
//                CTAs, through the mma_sync gate's cp.async ring and the same mma.sync k16 chain, so g
//                equals the large-M gates' bit for bit. The activated values are staged in global
//                memory; the last CTA of a TwELL tile to finish (an arrival counter per tile) packs
//                the tile's rows with pack_twell_tile: the same TwELL matrix as the D2T's. On sm_90 each
//                active neuron's Wu and in_out Wd^T rows are prefetched into L2 as soon as found.
//   decode_up    one CTA per (row, tile): the tile-row's entries (an overflowing tile-row from the
//                backup, or recomputed: load_overflow_tile), h_j = g_j (x . Wu_j) with the row
//                consumers' warp dot (g_j alone for twell.down), appended to the row's entry list at
//                the offset of the tiles before it: the list is in the row consumers' order (tiles,
//                then columns, ascending).
//   decode_down  one warp per (row, 64 output columns): y = sum over the list of h_j Wd^T[j, :], one
//                fmaf chain per output in list order, 32 entries' weight loads in flight at a time.
//
// So y equals the large-M TwELL path's (gate + row consumer) bit for bit, whichever path a call takes.
// Wd is read in the layout the user gave (Config::down_in_out): an out_in Wd column costs one 32-byte
// sector per output, which at a few rows is far less than transposing Wd on every call.
#pragma once
#include "twell/device/consumer/consumer_common.cuh"
#include "twell/device/gate/twell_epilogue.cuh"
#include "twell/device/primitives/dependent_launch.cuh"  // wait_for_previous_kernel, allow_next_kernel
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#include "twell/device/primitives/hopper_primitives.cuh"
#endif

namespace twell::device {

// 16 bytes from global memory through L2 only (ld.global.cg): values other CTAs of this kernel wrote,
// which a non-coherent L1 line might hold stale.
__device__ __forceinline__ uint4 load_l2_16(const void* ptr) {
  uint4 v;
  asm volatile("ld.global.cg.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(ptr));
  return v;
}

// Both decode gates, for each active (row, neuron j) they find: j's Wu row and (in_out) Wd^T row into L2
// now, while the gate still streams Wg, so decode_up and decode_down read them from L2, not DRAM, a
// kernel boundary later (bench/README.md v28). A hint (cp.async.bulk.prefetch, PTX ISA 8.0, sm_90): rows
// of 2 d_model bytes, 16-byte aligned as the runtime checks. An out_in Wd's column is scattered over
// d_model rows: not prefetched. Below sm_90 (the portable feature set): nothing; sm_90 and newer: issued.
template <class Config>
__device__ __forceinline__ void prefetch_neuron_rows(const DecodeBuffers& d, int j) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  constexpr uint32_t kBytes = 2 * Config::d_model;
  if constexpr (Config::gated)
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(d.w_up + static_cast<int64_t>(j) * d.ldwu), "r"(kBytes)
                 : "memory");
  if constexpr (Config::down_in_out)
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(d.w_down + static_cast<int64_t>(j) * d.ldwd), "r"(kBytes)
                 : "memory");
#endif
}

// decode_gate's ring for MT m16 row tiles: stages, and bytes (the host's DecodeKernelConstraints::
// gateSharedBytes is the same formula; decode_gate traps when launched with less).
template <class Config>
struct DecodeGateRing {
  // The layout is shared_memory.h's (the host sizes launches by it).
  static constexpr int kCtaK = shared_memory::kDecodeGateCtaK;  // K per stage: 512 contiguous bytes of each Wg row (DRAM bursts)
  static constexpr int kLd = shared_memory::kDecodeGateLd;      // +16 bytes: the 8 rows of an ldmatrix hit distinct banks
  static constexpr int stages(int mt) { return shared_memory::decode_gate_stages(16 * mt); }  // two CTAs per SM at any MT
  static constexpr int bytes(int mt) { return shared_memory::decode_gate_bytes(16 * mt, Config::slice_n, Config::tile_n); }
};

// decode_gate's GEMM with MT m16 row tiles (16 * MT >= p.m rows): this CTA's slice of act(x Wg^T) into
// d.act. Each stage holds 256 K-values of the slice's 32 Wg rows and of the rows of x.
template <class Config, int MT>
__device__ __forceinline__ void decode_gate_rows(const GateParams& p, const DecodeBuffers& d) {
  using Value = typename Config::Value;
  using Ring = DecodeGateRing<Config>;
  constexpr int K = Config::d_model;
  constexpr int N = Config::d_ff;
  constexpr int TILE_N = Config::tile_n;
  constexpr int SLICE = Config::slice_n;
  constexpr int SLICES = TILE_N / SLICE;  // CTAs per TwELL tile
  constexpr int CTA_K = Ring::kCtaK;
  constexpr int LD = Ring::kLd;
  constexpr int STAGES = Ring::stages(MT);
  constexpr int ROWS = 16 * MT;
  constexpr int THREADS = Config::threads;
  constexpr int STAGE_ELEMS = (ROWS + SLICE) * LD;
  constexpr int KT = (K + CTA_K - 1) / CTA_K;
  // The k16 chunks of the large-M gates' chain, zero-padded as their K step pads it (no more).
  constexpr int STEPS = (K + Config::gate_cta_k - 1) / Config::gate_cta_k * (Config::gate_cta_k / 16);
  static_assert(16 * STEPS <= KT * CTA_K, "the ring's stages cover the chain");
  constexpr int CHUNKS = CTA_K / 8;           // 16-byte chunks per row and stage
  constexpr int ROWS_PER_PASS = THREADS / CHUNKS;
  static_assert(Config::mma_warps * 16 == SLICE && TILE_N % SLICE == 0, "each mma warp owns 16 columns of the slice");
  static_assert(THREADS % CHUNKS == 0 && SLICE % ROWS_PER_PASS == 0, "whole rows per pass");
  static_assert(ROWS <= Config::max_tokens && K % 8 == 0 && STAGES >= 2, "decode gate shape");
  extern __shared__ __align__(128) unsigned char dynamic_smem[];
  uint16_t* smem = reinterpret_cast<uint16_t*>(dynamic_smem);

  const int tid = threadIdx.x;
  const int warp = tid / 32;
  const int lane = tid % 32;
  const int tile = blockIdx.x / SLICES;
  const int n0 = tile * TILE_N + static_cast<int>(blockIdx.x % SLICES) * SLICE;
  if (n0 >= N) return;  // the slices past d_ff in the last tile only arrive

  // Streaming Wg is the kernel's work, so every warp issues copies (the mma warps are the first
  // mma_warps): thread t moves chunk t % 32 of rows t / 32 + 8i, 512 contiguous bytes per row and
  // stage. Rows of x past p.m are zeroed once instead of copied each stage.
  const int chunk = tid % CHUNKS * 8;
  const int m = static_cast<int>(p.m);
  for (int i = tid; i < STAGES * (ROWS - m) * (LD / 8); i += THREADS) {
    const int stage = i / ((ROWS - m) * (LD / 8)), rest = i % ((ROWS - m) * (LD / 8));
    *reinterpret_cast<uint4*>(smem + stage * STAGE_ELEMS + (m + rest / (LD / 8)) * LD + rest % (LD / 8) * 8) =
        make_uint4(0u, 0u, 0u, 0u);
  }
  auto load_stage = [&](int stage, int kt) {
    uint16_t* As = smem + stage * STAGE_ELEMS;
    uint16_t* Bs = As + ROWS * LD;
    const int k = kt * CTA_K + chunk;
    const bool k_valid = k < K;
    for (int r = tid / CHUNKS; r < m; r += ROWS_PER_PASS)
      cp_async_16(As + r * LD + chunk, k_valid ? p.x + r * p.ldx + k : p.x, k_valid);
#pragma unroll
    for (int r = tid / CHUNKS; r < SLICE; r += ROWS_PER_PASS) {
      const bool valid = k_valid && n0 + r < N;
      cp_async_16(Bs + r * LD + chunk, valid ? p.w_gate + static_cast<int64_t>(n0 + r) * p.ldw + k : p.w_gate, valid);
    }
  };
  float acc[MT][2][4];
#pragma unroll
  for (int i = 0; i < MT; ++i)
#pragma unroll
    for (int j = 0; j < 2; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.0f;
#pragma unroll
  for (int s = 0; s < STAGES - 1; ++s) {
    if (s < KT) load_stage(s, s);
    cp_async_commit();
  }
  // Per output, the mma_sync gate's chain (gate_twell.cuh): k16 chunks in ascending order (the chunks
  // past K, zero here, add nothing). Not unrolled over stages: the loop waits on memory, not on issue.
#pragma unroll 1
  for (int kt = 0; kt < KT; ++kt) {
    cp_async_wait<STAGES - 2>();
    __syncthreads();
    if (kt + STAGES - 1 < KT) load_stage((kt + STAGES - 1) % STAGES, kt + STAGES - 1);
    cp_async_commit();
    if (warp >= Config::mma_warps) continue;
    const uint16_t* As = smem + (kt % STAGES) * STAGE_ELEMS;
    const uint16_t* Bs = As + ROWS * LD;
#pragma unroll 2
    for (int kk = 0; kk < CTA_K; kk += 16) {
      if (kt * CTA_K + kk >= 16 * STEPS) break;  // past the chain's padding: the same chunks as the gates
      mma_k16_step<Value, MT, 2>(acc, As, Bs + warp * 16 * LD, LD, kk, lane);
    }
  }
  cp_async_wait<0>();
  if (warp >= Config::mma_warps) return;
#pragma unroll
  for (int i = 0; i < MT; ++i)
#pragma unroll
    for (int j = 0; j < 2; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int row = i * 16 + lane / 4 + (e / 2) * 8;
        const int n = n0 + warp * 16 + j * 8 + (lane % 4) * 2 + e % 2;
        if (row < p.m && n < N) {
          const uint16_t v = activate<Value, Config::activation>(Value::from_float(acc[i][j][e]));
          d.act[row * d.act_ld + n] = v;
          if (is_active<Value, Config::activation>(v, Config::threshold)) prefetch_neuron_rows<Config>(d, n);
        }
      }
}

// The end of both decode gates: this CTA arrives at its TwELL tile (the threadFenceReduction pattern:
// fence the stores to d.act, then count); the last of the tile's CTAs packs the tile's rows with the
// D2T's packing and resets the counter for the next launch.
template <class Config>
__device__ __forceinline__ void decode_gate_arrive_and_pack(const GateParams& p, const DecodeBuffers& d) {
  constexpr int N = Config::d_ff;
  constexpr int TILE_N = Config::tile_n;
  constexpr int SLICES = TILE_N / Config::slice_n;
  constexpr int THREADS = Config::threads;
  extern __shared__ __align__(128) unsigned char dynamic_smem[];
  uint16_t* staged = reinterpret_cast<uint16_t*>(dynamic_smem);  // [p.m][TILE_N]
  __shared__ bool last_arrival;
  const int tid = threadIdx.x;
  const int tile = blockIdx.x / SLICES;
  __threadfence();
  __syncthreads();
  if (tid == 0) {
    last_arrival = atomicAdd(d.tile_arrivals + tile, 1u) == SLICES - 1;
    if (last_arrival) d.tile_arrivals[tile] = 0;  // every slice arrived: ready for the next launch
  }
  __syncthreads();
  if (!last_arrival) return;
  __threadfence();
  const int tile0 = tile * TILE_N;
  const int valid_n = N - tile0 < TILE_N ? N - tile0 : TILE_N;
  for (int c = tid; c < p.m * (TILE_N / 8); c += THREADS) {
    const int r = c / (TILE_N / 8), c8 = c % (TILE_N / 8) * 8;
    *reinterpret_cast<uint4*>(staged + r * TILE_N + c8) =
        c8 < valid_n ? load_l2_16(d.act + r * d.act_ld + tile0 + c8) : make_uint4(0u, 0u, 0u, 0u);
  }
  __syncthreads();
  pack_twell_tile<Config>(p, staged, 0, tile, static_cast<int>(p.m), tid / 32, THREADS / 32);
}

// decode_gate: up to 64 rows through the shared-memory ring (16 or 64 rows of x per stage).
template <class Config>
__device__ __forceinline__ void decode_gate(const GateParams& p, const DecodeBuffers& d) {
  if (p.m > Config::max_tokens) __trap();  // the launcher keeps M <= max_tokens: fail loudly
  allow_next_kernel();
  const int mt = p.m <= 16 ? 1 : 4;
  require_dynamic_smem(DecodeGateRing<Config>::bytes(mt));
  // Row tiles for 16 or 64 rows (mma on zero rows costs issue slots, not memory; a third variant
  // costs instruction-cache misses, which profiling showed among the main stalls).
  if (mt == 1)
    decode_gate_rows<Config, 1>(p, d);
  else
    decode_gate_rows<Config, 4>(p, d);
  decode_gate_arrive_and_pack<Config>(p, d);
}

// decode_gate_small: at most 8 rows (Config::max_tokens = 8), where decode_gate's ring (barriers,
// per-thread copies of 512-byte row pieces) reached only about 1.4 TB/s (bench/README.md v25). Each warp
// owns one n8 tile (8 columns) of the CTA's slice and runs the same k16 chain as the other gates
// (chunks zero-padded as Config::gate_cta_k pads them): the same bits. x's fragment pairs come from L1
// (the rows of the m16 tile past 8 are zero). The Wg rows:
//   sm_90 and later: each of the slice's rows is bulk-copied (cp.async.bulk, PTX ISA 8.0) into a
//   padded shared-memory row, in pieces of 512 K-values each under its own mbarrier, all issued at
//   the start: large contiguous reads, no per-thread copies, no CTA barrier in the loop, and the chain
//   starts on the first piece; then ldmatrix as the ring does.
//   Config::bulk_rows says so; the host sizes the shared memory for it (slice_n rows of 2 K + 16 bytes).
//   Below sm_90: the 4-byte fragment pairs straight from global memory, 16 chunks in flight.
template <class Config>
__device__ __forceinline__ void decode_gate_small(const GateParams& p, const DecodeBuffers& d) {
  using Value = typename Config::Value;
  constexpr int K = Config::d_model;
  constexpr int N = Config::d_ff;
  constexpr int TILE_N = Config::tile_n;
  constexpr int SLICE = Config::slice_n;
  constexpr int SLICES = TILE_N / SLICE;
  constexpr int STEPS = (K + Config::gate_cta_k - 1) / Config::gate_cta_k * (Config::gate_cta_k / 16);
  constexpr int U = 8;
  static_assert(Config::threads / 32 * 8 == SLICE && Config::max_tokens <= 8 && K % 8 == 0, "one n8 tile per warp");
  if (p.m > Config::max_tokens) __trap();
  allow_next_kernel();
  extern __shared__ __align__(128) unsigned char dynamic_smem[];
  require_dynamic_smem(shared_memory::decode_gate_small_bytes(Config::max_tokens, TILE_N, SLICE, K, Config::bulk_rows));
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int slice0 = blockIdx.x / SLICES * TILE_N + static_cast<int>(blockIdx.x % SLICES) * SLICE;
  const int n0 = slice0 + warp * 8;
  const int g = lane / 4, c2 = lane % 4 * 2;
  const bool x_valid = g < p.m;
  const uint16_t* x = p.x + (x_valid ? g : 0) * p.ldx + c2;
  auto pair = [](const uint16_t* ptr) {
    uint32_t v;
    asm volatile("ld.global.nc.b32 %0, [%1];" : "=r"(v) : "l"(ptr));
    return v;
  };
  // x's pairs of chunk s (k = 16 s): K % 8 == 0, so k < K covers columns k + c2 (+1), k + 8 < K the others.
  auto load_x = [&](int s, uint32_t (&a)[2]) {
    const int k = 16 * s;
    a[0] = x_valid && k < K ? pair(x + k) : 0u;
    a[1] = x_valid && k + 8 < K ? pair(x + k + 8) : 0u;
  };
  float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  auto multiply = [&](int s, const uint32_t (&b)[2], const uint32_t (&a)[2]) {
    const uint32_t frag[4] = {a[0], 0u, a[1], 0u};  // rows 8..15 of the m16 tile are past M
    if (s < STEPS) mma_16816<Value>(acc, frag, b[0], b[1]);
  };
  if constexpr (Config::bulk_rows) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    constexpr int LDB = K + 8;  // row stride in values: +16 bytes, so ldmatrix's 8 rows hit distinct banks
    // The rows arrive in K pieces of PIECE values, each under its own mbarrier, so the chain starts on
    // the first piece while the others land (PIECE is a multiple of U chunks: a block never straddles).
    constexpr int PIECE = 512;
    constexpr int PIECES = (K + PIECE - 1) / PIECE;
    static_assert(PIECE % (16 * U) == 0, "blocks of U chunks inside one piece");
    uint16_t* rows = reinterpret_cast<uint16_t*>(dynamic_smem);
    __shared__ __align__(8) uint64_t piece_landed[PIECES];
    if (threadIdx.x == 0) {
      for (int q = 0; q < PIECES; ++q) mbarrier_init(&piece_landed[q], 1);
      fence_barrier_init();
    }
    __syncthreads();
    // Thread 0 announces every piece's bytes; then lane r of warp 0 issues row r's copies, so the
    // slice's copies go out in parallel rather than one after another from one thread.
    const int valid_rows = N - slice0 < SLICE ? (N > slice0 ? N - slice0 : 0) : SLICE;
    if (threadIdx.x == 0)
      for (int q = 0; q < PIECES; ++q)
        mbarrier_arrive_expect_tx(&piece_landed[q], static_cast<uint32_t>(valid_rows * 2 * (K - q * PIECE < PIECE ? K - q * PIECE : PIECE)));
    __syncwarp();
    if (threadIdx.x < valid_rows) {
      const int r = threadIdx.x;
      for (int q = 0; q < PIECES; ++q) {
        const int k0 = q * PIECE, bytes = 2 * (K - k0 < PIECE ? K - k0 : PIECE);
        asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(
                         smem_address(rows + r * LDB + k0)),
                     "l"(p.w_gate + static_cast<int64_t>(slice0 + r) * p.ldw + k0), "r"(bytes), "r"(smem_address(&piece_landed[q]))
                     : "memory");
      }
    }
    // Rows past d_ff (the last tile's last slice) are zeros, not copies; so is every row's pad, which
    // the last k16 chunk's upper half reads when K % 16 == 8.
    for (int i = threadIdx.x; i < SLICE * (K / 8 + 1); i += Config::threads) {
      const int r = i / (K / 8 + 1), c = i % (K / 8 + 1) * 8;
      if (c == K || slice0 + r >= N) *reinterpret_cast<uint4*>(rows + r * LDB + c) = make_uint4(0u, 0u, 0u, 0u);
    }
    __syncthreads();
    if (n0 < N) {
      const uint16_t* b_rows = rows + (warp * 8 + lane % 8) * LDB + (lane / 8) % 2 * 8;
      // x's fragments are loaded one block of U chunks ahead of the block that multiplies them (issued
      // after this block's ldmatrix: issued before it, ptxas spills at some d_model), so the chain does
      // not wait on its own block's x loads: 1 us less at M = 1, 1-5 at M = 4 (bench/README.md v27).
      uint32_t a[U][2], a_next[U][2];
#pragma unroll
      for (int u = 0; u < U; ++u) load_x(u, a_next[u]);
#pragma unroll 1
      for (int s0 = 0; s0 < STEPS; s0 += U) {
        if (16 * s0 % PIECE == 0 && 16 * s0 < K) mbarrier_wait(&piece_landed[16 * s0 / PIECE], 0);
        uint32_t b[U][2];
#pragma unroll
        for (int u = 0; u < U; ++u) {
          a[u][0] = a_next[u][0];
          a[u][1] = a_next[u][1];
          uint32_t r[4];
          if (16 * (s0 + u) < K) {
            ldmatrix_x4(r, b_rows + 16 * (s0 + u));  // matrices 2, 3 repeat 0, 1: lanes 16..31 mirror 0..15
          } else {
            r[0] = r[1] = 0u;  // the chain's zero padding past K
          }
          b[u][0] = r[0];
          b[u][1] = r[1];
        }
#pragma unroll
        for (int u = 0; u < U; ++u) load_x(s0 + U + u, a_next[u]);  // past the chain: zeros, no load
#pragma unroll
        for (int u = 0; u < U; ++u) multiply(s0 + u, b[u], a[u]);
      }
    }
    __syncthreads();  // the rows are read: the packing may reuse the shared memory
#endif
  } else if (n0 < N) {
    const bool w_valid = n0 + g < N;
    const uint16_t* w = p.w_gate + static_cast<int64_t>(w_valid ? n0 + g : 0) * p.ldw + c2;
    auto load = [&](int s, uint32_t (&b)[2], uint32_t (&a)[2]) {
      const int k = 16 * s;
      b[0] = w_valid && k < K ? pair(w + k) : 0u;
      b[1] = w_valid && k + 8 < K ? pair(w + k + 8) : 0u;
      load_x(s, a);
    };
    constexpr int V = 2 * U;
    uint32_t b0[V][2], a0[V][2], b1[V][2], a1[V][2];
#pragma unroll
    for (int u = 0; u < V; ++u) load(u, b0[u], a0[u]);
#pragma unroll 1
    for (int s0 = 0; s0 < STEPS; s0 += 2 * V) {
#pragma unroll
      for (int u = 0; u < V; ++u) load(s0 + V + u, b1[u], a1[u]);
#pragma unroll
      for (int u = 0; u < V; ++u) multiply(s0 + u, b0[u], a0[u]);
#pragma unroll
      for (int u = 0; u < V; ++u) load(s0 + 2 * V + u, b0[u], a0[u]);
#pragma unroll
      for (int u = 0; u < V; ++u) multiply(s0 + V + u, b1[u], a1[u]);
    }
  }
  if (n0 < N && x_valid)
#pragma unroll
    for (int e = 0; e < 2; ++e)
      if (n0 + c2 + e < N) {
        const int j = n0 + c2 + e;
        const uint16_t v = activate<Value, Config::activation>(Value::from_float(acc[e]));
        d.act[g * d.act_ld + j] = v;
        if (is_active<Value, Config::activation>(v, Config::threshold)) prefetch_neuron_rows<Config>(d, j);
      }
  decode_gate_arrive_and_pack<Config>(p, d);
}

// One CTA per (row, tile) (blockIdx.x = row * tiles + tile). Two memory round trips on the common path:
// the tile-row's words with the headers before it (the list offset), then x and the Wu rows.
template <class Config>
__device__ __forceinline__ void decode_up(const GatedDownParams& p, const DecodeBuffers& d) {
  using Value = typename Config::Value;
  constexpr int K = Config::d_model;
  constexpr int N = Config::d_ff;
  constexpr int TILE_N = Config::tile_n;
  constexpr int SLOTS = Config::slots;
  constexpr int TILES = (N + TILE_N - 1) / TILE_N;
  constexpr int WORDS_PER_ROW = TILES * (SLOTS + 1);
  constexpr int THREADS = Config::threads;
  constexpr int WARPS = THREADS / 32;
  __shared__ uint32_t tile_words[SLOTS + 1];
  __shared__ int cols[TILE_N];
  __shared__ float gates[TILE_N];
  __shared__ __align__(16) uint16_t dense_tile[TILE_N];
  __shared__ uint32_t list_offset, overflow_entries;

  const int tid = threadIdx.x;
  const int warp = tid / 32;
  const int lane = tid % 32;
  const int64_t row = blockIdx.x / TILES;
  const int tile = static_cast<int>(blockIdx.x % TILES);
  wait_for_previous_kernel();  // the TwELL matrix
  allow_next_kernel();
  if (row >= p.m) return;
  const uint32_t* words = p.twell + row * WORDS_PER_ROW;
  // The header and every slot (used or not: one round trip), and, on the last warp, the entries of the
  // tiles before this one: where this tile-row's entries start in the row's list.
  for (int e = tid; e <= SLOTS; e += THREADS) tile_words[e] = words[tile * (SLOTS + 1) + e];
  if (warp == WARPS - 1) {
    uint32_t before = 0;
    for (int t = lane; t < tile; t += 32) before += words[t * (SLOTS + 1)];
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) before += __shfl_xor_sync(0xFFFFFFFFu, before, o);
    if (lane == 0) list_offset = before;
  }
  __syncthreads();
  const uint32_t nnz = tile_words[0];
  if (nnz == 0) return;  // the same for the whole CTA
  const uint16_t* x = p.x + row * p.ldx;
  const int n0 = tile * TILE_N;
  const int valid_n = N - n0 < TILE_N ? N - n0 : TILE_N;
  if (nnz <= SLOTS) {
    for (uint32_t e = tid; e < nnz; e += THREADS) {
      const uint32_t w = tile_words[1 + e];
      cols[e] = n0 + static_cast<int>(w & 0xFFFFu);
      gates[e] = Value::to_float(static_cast<uint16_t>(w >> 16));
    }
  } else {
    load_overflow_tile<Config>(p, tile_words[1], x, n0, valid_n, dense_tile, tid, THREADS, 0, WARPS);
    __syncthreads();
    if (warp == 0) {
      const int added = list_active_columns<Config>(dense_tile, valid_n, n0, cols, gates, 0, lane);
      if (lane == 0) overflow_entries = static_cast<uint32_t>(added);
    }
  }
  __syncthreads();
  // The header's nnz is what decode_down counts; a tile-row that disagrees (only a corrupt matrix can)
  // still fills exactly nnz list slots, with h = 0 past its entries, so no slot is left unwritten.
  const uint32_t found = nnz <= SLOTS ? nnz : (overflow_entries < nnz ? overflow_entries : nnz);
  uint32_t* out = d.entries + (row * N + list_offset) * 2;
  for (uint32_t e = warp; e < nnz; e += WARPS) {
    int j = n0;
    float h = 0.0f;
    if (e < found) {
      j = cols[e];
      h = gates[e];
      // The row consumers' dot (gated_down.cuh): lane l sums chunks 8l + 256i, then the butterfly.
      if constexpr (Config::gated) h *= warp_dot_16B<Value, K>(x, p.w_up + static_cast<int64_t>(j) * p.ldwu, lane);
    }
    if (lane == 0) {
      out[2 * e] = static_cast<uint32_t>(j);
      out[2 * e + 1] = __float_as_uint(h);
    }
  }
}

// One warp per (row, 32 lanes x Config::down_columns_per_lane output columns) (blockIdx.x = row *
// chunks + chunk): lane l owns columns c = 32 w chunk + w l .. + w - 1. in_out Wd: two columns per
// lane, one 4-byte load per entry; out_in: one column per lane (each load is a 32-byte sector of its
// own, so twice the warps keep twice the sectors in flight). Two round trips for a row of up to 32
// entries: the headers with the list, then the weights.
template <class Config>
__device__ __forceinline__ void decode_down(const GatedDownParams& p, const DecodeBuffers& d) {
  using Value = typename Config::Value;
  constexpr int K = Config::d_model;
  constexpr int N = Config::d_ff;
  constexpr int TILE_N = Config::tile_n;
  constexpr int SLOTS = Config::slots;
  constexpr int TILES = (N + TILE_N - 1) / TILE_N;
  constexpr int WORDS_PER_ROW = TILES * (SLOTS + 1);
  constexpr int W = Config::down_columns_per_lane;
  constexpr int CHUNKS = (K + 32 * W - 1) / (32 * W);
  constexpr uint32_t FULL = 0xFFFFFFFFu;
  static_assert(Config::threads == 32 && K % 2 == 0 && (W == 1 || W == 2), "one warp, one or two columns per lane");
  static_assert(W == 1 || Config::down_in_out, "two columns per lane read rows of Wd^T");
  const int lane = threadIdx.x;
  const int64_t row = blockIdx.x / CHUNKS;
  const int c = static_cast<int>(blockIdx.x % CHUNKS) * 32 * W + W * lane;
  wait_for_previous_kernel();  // the entry lists
  if (row >= p.m) return;
  // The row's entry count, and (in the same round trip) the first 32 list slots, used or not.
  const uint32_t* list = d.entries + row * N * 2;
  uint2 first = make_uint2(0u, 0u);
  if (lane < N) first = *reinterpret_cast<const uint2*>(list + 2 * lane);
  uint32_t entries = 0;
  for (int t = lane; t < TILES; t += 32) entries += p.twell[row * WORDS_PER_ROW + t * (SLOTS + 1)];
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) entries += __shfl_xor_sync(FULL, entries, o);
  float y0 = 0.0f, y1 = 0.0f;
  for (uint32_t base = 0; base < entries; base += 32) {
    const uint32_t count = entries - base < 32 ? entries - base : 32;
    int j = 0;
    float h = 0.0f;
    if (lane < count) {
      const uint2 v = base == 0 ? first : *reinterpret_cast<const uint2*>(list + 2 * (base + lane));
      j = static_cast<int>(v.x);
      h = __uint_as_float(v.y);
    }
    // All 32 entries' weights in flight before the FMAs, which then run in list order.
    uint32_t w[32];
#pragma unroll
    for (int e = 0; e < 32; ++e) {
      const int64_t je = __shfl_sync(FULL, j, e);
      w[e] = 0u;
      if (e < count && c < K) {
        if constexpr (W == 2)
          w[e] = *reinterpret_cast<const uint32_t*>(p.w_down + je * p.ldwd + c);
        else if constexpr (Config::down_in_out)
          w[e] = p.w_down[je * p.ldwd + c];
        else
          w[e] = p.w_down[c * p.ldwd + je];
      }
    }
#pragma unroll
    for (int e = 0; e < 32; ++e) {
      const float he = __shfl_sync(FULL, h, e);
      if (e < count) {
        y0 = fmaf(he, Value::to_float(static_cast<uint16_t>(w[e])), y0);
        if constexpr (W == 2) y1 = fmaf(he, Value::to_float(static_cast<uint16_t>(w[e] >> 16)), y1);
      }
    }
  }
  if (c < K) {
    p.y[row * p.ldy + c] = Value::from_float(y0);
    if constexpr (W == 2) p.y[row * p.ldy + c + 1] = Value::from_float(y1);
  }
}

}  // namespace twell::device
