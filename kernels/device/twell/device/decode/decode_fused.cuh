// decode_fused: the whole FFN of at most 8 token rows in one persistent kernel, one CTA per SM (issue 17;
// PERFORMANCE.md, "Small M"). The four-kernel decode path (decode.cuh) pays three kernel boundaries and
// stages the TwELL matrix in between; here nothing leaves the kernel but y (bench/README.md v38):
//
// Phase 1, per CTA c of P: the contiguous rows [c d_ff / P, (c + 1) d_ff / P) of Wg, in groups of 8
//   (an n8 tile of mma.sync). x's rows go first (a few KB that must not queue behind Wg), then every
//   streaming warp requests a whole group, one cp.async.bulk per row under an mbarrier (PTX ISA 8.0
//   "cp.async.bulk"; below sm_90 cp.async 16-byte copies, the portable form), and refills its entry with
//   its next group as soon as its chain has read it. The chain per output is the large-M gates' (k16
//   mma chunks ascending, zero-padded as gate_cta_k pads them), so a = act(g) is the same bits. Each
//   active (token, j) then gets h = a (x_t . Wu_j) with the row consumers' warp dot (warp_dot_16B's
//   order), Wu_j read once for all the call's tokens that need it (its row and Wd's prefetched into L2
//   first); the CTA lists, per token, its (j, h) ascending in j.
// A grid barrier (all CTAs are resident: one per SM, launched cooperatively).
// Phase 2, per CTA: kDecodeFusedColumns (16) output columns of every token: the token's list is the
//   CTAs' lists in CTA order (so j ascending over the whole row), y = one fmaf chain per output in
//   that order from +0, as decode_down and the row consumers sum: y is the large-M path's bit for bit.
//
// Rounding and determinism: every value is the large-M kernels' (same chains, same orders), run after
// run. No TwELL matrix is written (FfnPlan::download_twell says so after such a call). Phase 1 is
// written for x tiles of 8, 16 or 32 rows (XR) but instantiated for 8 only: at 8 rows and more the
// four kernels are as fast (v38), because fewer groups of Wg fit beside more rows of x.
#pragma once
#include "twell/device/consumer/consumer_common.cuh"
#include "twell/device/primitives/grid_sync.cuh"
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#include "twell/device/primitives/hopper_primitives.cuh"
#endif

namespace twell::device {

// Phase 1 for an x tile of XR rows (8, 16 or 32), then the grid barrier, then phase 2 (above).
template <class Config, int XR>
__device__ __forceinline__ void decode_fused_rows(const GatedDownParams& p, const DecodeFusedBuffers& b) {
  using Value = typename Config::Value;
  constexpr int K = Config::d_model;
  constexpr int N = Config::d_ff;
  constexpr int WARPS = shared_memory::kDecodeFusedWarps;
  constexpr int THREADS = WARPS * 32;
  // Whole rows, one entry per warp: the kept point of v38's experiments (pieces of 256 K-values in rings
  // of 2-5 entries per warp measured slower: 512-byte copies stream at 1.7 TB/s). The piece and ring
  // indexing below is that experiment's, run with one piece and one entry.
  constexpr int PIECE = K;
  constexpr int PIECES = 1;
  constexpr int LDR = K + 8;            // an entry's row stride (values)
  constexpr int LDX = K + 8;            // x row stride (values)
  constexpr int MT = XR == 32 ? 2 : 1;  // m16 tiles of x
  constexpr int COLS = shared_memory::kDecodeFusedColumns;
  // The k16 chunks of the large-M gates' chain, zero-padded as their K step pads it.
  constexpr int STEPS = (K + Config::gate_cta_k - 1) / Config::gate_cta_k * (Config::gate_cta_k / 16);
  constexpr int KCHUNKS = (K + 15) / 16;
  static_assert(Config::threads == THREADS && K % 8 == 0 && STEPS >= KCHUNKS, "decode_fused shape");
  extern __shared__ __align__(128) unsigned char dynamic_smem[];
  __shared__ __align__(8) uint64_t landed[WARPS][1];

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int m = static_cast<int>(p.m);
  const int P = static_cast<int>(gridDim.x);
  const int c = static_cast<int>(blockIdx.x);
  const int r0 = static_cast<int>(static_cast<int64_t>(c) * N / P);
  const int r1 = static_cast<int>(static_cast<int64_t>(c + 1) * N / P);
  const int rows_cap = (N + P - 1) / P;  // the workspace's rows per CTA
  const int groups = (r1 - r0 + 7) / 8;
  // Streaming warps, one entry (a group of 8 whole rows) each; each refills its entry with its next group.
  const int streamers = static_cast<int>(shared_memory::decode_fused_streamers(dynamic_smem_bytes(), m, K, rows_cap));
  constexpr int ring = 1;
  if (streamers < 1 || m > XR) __trap();  // the host sizes the launch (constraints.h): fail loudly

  // x: rows 0..m-1 the call's, row m zeros (the A fragments' rows past the call point at it).
  uint16_t* xs = reinterpret_cast<uint16_t*>(dynamic_smem);
  uint16_t* rings = xs + (m + 1) * LDX;
  float* staged_h = reinterpret_cast<float*>(rings + streamers * ring * 8 * LDR);  // [XR][rows_cap]
  unsigned char* staged_on = reinterpret_cast<unsigned char*>(staged_h + XR * rows_cap);  // [XR][rows_cap]
  uint16_t* my_ring = rings + warp * ring * 8 * LDR;

  // x first: its few KB must not queue behind the Wg copies every SM issues next (bench/README.md v38).
  for (int i = tid; i < (m + 1) * (LDX / 8); i += THREADS) {
    const int r = i / (LDX / 8), k = i % (LDX / 8) * 8;
    if (r < m && k < K)
      cp_async_16(xs + r * LDX + k, p.x + static_cast<int64_t>(r) * p.ldx + k, true);
    else
      *reinterpret_cast<uint4*>(xs + r * LDX + k) = make_uint4(0u, 0u, 0u, 0u);
  }
  cp_async_commit();

  // This warp's groups: g = warp, warp + streamers, ...; piece pc = (local group) * PIECES + q.
  const int my_groups = warp < streamers && groups > warp ? (groups - warp + streamers - 1) / streamers : 0;
  const int my_pieces = my_groups * PIECES;
  auto piece_len = [&](int pc) {
    const int k0 = pc % PIECES * PIECE;
    return K - k0 < PIECE ? K - k0 : PIECE;
  };
  // Issues piece pc into ring entry pc % ring (whose previous piece this warp has read).
  auto issue = [&](int pc) {
    if (pc >= my_pieces) {
      if constexpr (!Config::bulk_copies) cp_async_commit();  // one (empty) group per piece
      return;
    }
    const int row0 = r0 + 8 * (warp + streamers * (pc / PIECES));
    const int rows = r1 - row0 < 8 ? r1 - row0 : 8, len = piece_len(pc), k0 = pc % PIECES * PIECE;
    uint16_t* entry = my_ring + pc % ring * 8 * LDR;
    if constexpr (Config::bulk_copies) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
      asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");  // this warp's reads before the copy's writes
      __syncwarp();
      if (lane == 0) mbarrier_arrive_expect_tx(&landed[warp][pc % ring], static_cast<uint32_t>(rows * 2 * len));
      __syncwarp();
      if (lane < rows)
        asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(
                         smem_address(entry + lane * LDR)),
                     "l"(p.w_gate + static_cast<int64_t>(row0 + lane) * p.ldwg + k0), "r"(2 * len),
                     "r"(smem_address(&landed[warp][pc % ring]))
                     : "memory");
#endif
    } else {
      __syncwarp();
      for (int i = lane; i < rows * (len / 8); i += 32) {
        const int r = i / (len / 8), k = i % (len / 8) * 8;
        cp_async_16(entry + r * LDR + k, p.w_gate + static_cast<int64_t>(row0 + r) * p.ldwg + k0 + k, true);
      }
      cp_async_commit();
    }
  };
  // Waits for piece pc (below sm_90: its cp.async group); then zeroes the 8 values past a short piece
  // (the k16 chunk straddling K reads them, as the chain's padding).
  auto wait_piece = [&](int pc) {
    if constexpr (Config::bulk_copies) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
      mbarrier_wait(&landed[warp][pc % ring], static_cast<uint32_t>(pc / ring) & 1u);
#endif
    } else {
      cp_async_wait<0>();
      __syncwarp();
    }
    const int len = piece_len(pc);
    if (len % 16 != 0) {
      uint16_t* entry = my_ring + pc % ring * 8 * LDR;
      if (lane < 8) *reinterpret_cast<uint4*>(entry + lane * LDR + len) = make_uint4(0u, 0u, 0u, 0u);
      __syncwarp();
    }
  };
  if constexpr (Config::bulk_copies) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    if (lane == 0)
      for (int e = 0; e < ring; ++e) mbarrier_init(&landed[warp][e], 1);
    fence_barrier_init();
    __syncwarp();
#endif
  }
  for (int pc = 0; pc < ring; ++pc) issue(pc);
  // x (below sm_90 the first group's cp.async group is newer).
  if constexpr (Config::bulk_copies)
    cp_async_wait<0>();
  else
    cp_async_wait<1>();
  __syncthreads();

  // ---- phase 1: the warp's groups ----
  // The A fragments' row addresses: x's row, or the zero row past the call.
  const int a_row8 = lane % 8 < m ? lane % 8 : m;
  for (int lg = 0; lg < my_groups; ++lg) {
    const int g = warp + streamers * lg;
    float acc[MT][4];
#pragma unroll
    for (int i = 0; i < MT; ++i)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[i][e] = 0.0f;
    for (int q = 0; q < PIECES; ++q) {
      const int pc = lg * PIECES + q;
      wait_piece(pc);
      const uint16_t* entry = my_ring + pc % ring * 8 * LDR;
      const int len = piece_len(pc);
      const int k0 = q * PIECE;
#pragma unroll 2
      for (int kk = 0; kk < len; kk += 32) {
        // B: the 8 rows' k16 chunks kk and kk + 16 (matrices k 0-7, 8-15, 16-23, 24-31).
        uint32_t bw[4];
        ldmatrix_x4(bw, entry + (lane % 8) * LDR + kk + (lane / 8) * 8);
        uint32_t a[2][MT][4];
        if constexpr (XR == 8) {
          uint32_t r[4];
          ldmatrix_x4(r, xs + a_row8 * LDX + k0 + kk + (lane / 8) * 8);
          a[0][0][0] = r[0], a[0][0][1] = 0u, a[0][0][2] = r[1], a[0][0][3] = 0u;  // rows 8..15 past the call
          a[1][0][0] = r[2], a[1][0][1] = 0u, a[1][0][2] = r[3], a[1][0][3] = 0u;
        } else {
#pragma unroll
          for (int h = 0; h < 2; ++h)
#pragma unroll
            for (int i = 0; i < MT; ++i) {
              const int row = i * 16 + lane % 16;
              ldmatrix_x4(a[h][i], xs + (row < m ? row : m) * LDX + k0 + kk + 16 * h + (lane / 16) * 8);
            }
        }
#pragma unroll
        for (int i = 0; i < MT; ++i) mma_16816<Value>(acc[i], a[0][i], bw[0], bw[1]);
        if (kk + 16 < len)
#pragma unroll
          for (int i = 0; i < MT; ++i) mma_16816<Value>(acc[i], a[1][i], bw[2], bw[3]);
      }
      __syncwarp();
      issue(pc + ring);  // the entry is read: refill it
    }
    // The chain's zero padding past K (the large-M gates' last K step): zero products.
    for (int s = KCHUNKS; s < STEPS; ++s) {
      const uint32_t zero[4] = {0u, 0u, 0u, 0u};
#pragma unroll
      for (int i = 0; i < MT; ++i) mma_16816<Value>(acc[i], zero, 0u, 0u);
    }
    // a = act(g) of (token, row) into the staging, with its flag.
    const int gl = 8 * g;  // the group's first row, local to the CTA
#pragma unroll
    for (int i = 0; i < MT; ++i)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int t = i * 16 + lane / 4 + (e / 2) * 8;
        const int rl = gl + (lane % 4) * 2 + e % 2;
        if (t < XR && r0 + rl < r1) {
          const uint16_t v = activate<Value, Config::activation>(Value::from_float(acc[i][e]));
          const bool on = t < m && is_active<Value, Config::activation>(v, Config::threshold);
          staged_h[t * rows_cap + rl] = Value::to_float(v);
          staged_on[t * rows_cap + rl] = on ? 1 : 0;
        }
      }
    __syncwarp();
    // Per neuron of the group: the tokens it is active on. First every active neuron's rows into L2
    // (Wu_j for the dots below, Wd's for phase 2), then the dots, Wu_j read once (L1 after the first token).
    for (int n = 0; n < 8 && r0 + gl + n < r1; ++n) {
      const int rl = gl + n, j = r0 + rl;
      const uint32_t tokens = __ballot_sync(0xFFFFFFFFu, lane < m && staged_on[lane * rows_cap + rl] != 0);
      if (tokens == 0) continue;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
      if (Config::gated && lane == 0)
        asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p.w_up + static_cast<int64_t>(j) * p.ldwu), "r"(2 * K)
                     : "memory");
#endif
      if constexpr (Config::down_in_out) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
        if (lane == 0)
          asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p.w_down + static_cast<int64_t>(j) * p.ldwd),
                       "r"(2 * K)
                       : "memory");
#endif
      } else {
        for (int k = lane; k < K; k += 32)
          asm volatile("prefetch.global.L2 [%0];" ::"l"(p.w_down + static_cast<int64_t>(k) * p.ldwd + j) : "memory");
      }
    }
    for (int n = 0; n < 8 && r0 + gl + n < r1; ++n) {
      const int rl = gl + n, j = r0 + rl;
      const uint32_t tokens = __ballot_sync(0xFFFFFFFFu, lane < m && staged_on[lane * rows_cap + rl] != 0);
      if constexpr (Config::gated) {
        const uint16_t* wu = p.w_up + static_cast<int64_t>(j) * p.ldwu;
        for (uint32_t left = tokens; left != 0; left &= left - 1) {
          const int t = __ffs(left) - 1;
          // warp_dot_16B's order: lane l sums chunks 8 l + 256 i, then the butterfly.
          float s = 0.0f;
          for (int k = lane * 8; k < K; k += 32 * 8)
            s = dot8<Value>(*reinterpret_cast<const uint4*>(xs + t * LDX + k), *reinterpret_cast<const uint4*>(wu + k), s);
          const float u = warp_sum(s);
          if (lane == 0) staged_h[t * rows_cap + rl] *= u;  // h = a u, as decode_up
        }
      }
    }
  }
  __syncthreads();
  // The CTA's list per token, ascending in j, into the workspace.
  for (int t = warp; t < m; t += WARPS) {
    uint32_t* out = b.entries + (static_cast<int64_t>(c) * 32 + t) * rows_cap * 2;
    uint32_t count = 0;
    for (int base = 0; base < r1 - r0; base += 32) {
      const int rl = base + lane;
      const bool on = rl < r1 - r0 && staged_on[t * rows_cap + rl] != 0;
      const uint32_t ballot = __ballot_sync(0xFFFFFFFFu, on);
      if (on) {
        const uint32_t at = count + __popc(ballot & lanemask_lt());
        *reinterpret_cast<uint2*>(out + 2 * at) = make_uint2(static_cast<uint32_t>(r0 + rl), __float_as_uint(staged_h[t * rows_cap + rl]));
      }
      count += __popc(ballot);
    }
    if (lane == 0) b.counts[c * 32 + t] = count;
  }

  grid_barrier(b.barrier);

  // ---- phase 2: COLS output columns per CTA and pass ----
  // Shared memory, reused: the (CTA, token) offsets [P + 1][32] (exclusive, per token), the tokens'
  // list starts [33], then per entry of a batch its j, h and COLS weights.
  uint32_t* offsets = reinterpret_cast<uint32_t*>(dynamic_smem);
  uint32_t* token_start = offsets + (P + 1) * 32;
  uint32_t* entry_j = token_start + 40;
  // Entries per batch, a multiple of 8 (the weights stay 16-byte aligned).
  const int budget = static_cast<int>((dynamic_smem_bytes() - ((P + 1) * 32 + 40) * 4) / (4 + 4 + 2 * COLS)) / 8 * 8;
  float* entry_h = reinterpret_cast<float*>(entry_j + budget);
  uint16_t* entry_w = reinterpret_cast<uint16_t*>(entry_h + budget);  // [budget][COLS]
  // The counts of every (CTA, token), loaded once (all in flight), then per token the exclusive scan
  // over CTAs (one warp per token, CTAs in lane-contiguous runs).
  for (int i = tid; i < P * m; i += THREADS) offsets[i / m * 32 + i % m] = load_l2_u32(b.counts + i / m * 32 + i % m);
  __syncthreads();
  for (int t = warp; t < m; t += WARPS) {
    const int per = (P + 31) / 32, c0 = lane * per;
    uint32_t run = 0;
    for (int cc = c0; cc < c0 + per && cc < P; ++cc) run += offsets[cc * 32 + t];
    uint32_t before = run;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const uint32_t v = __shfl_up_sync(0xFFFFFFFFu, before, o);
      if (lane >= o) before += v;
    }
    before -= run;
    for (int cc = c0; cc < c0 + per && cc < P; ++cc) {
      const uint32_t n = offsets[cc * 32 + t];
      offsets[cc * 32 + t] = before;
      before += n;
    }
    if (lane == 31) offsets[P * 32 + t] = before;  // the token's total
  }
  __syncthreads();
  if (warp == 0) {
    uint32_t total = lane < m ? offsets[P * 32 + lane] : 0u, start = total;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const uint32_t v = __shfl_up_sync(0xFFFFFFFFu, start, o);
      if (lane >= o) start += v;
    }
    token_start[lane] = start - total;
    if (lane == 31) token_start[32] = start;
  }
  __syncthreads();
  const uint32_t entries = token_start[32];
  const int col = tid % COLS;
  for (int chunk = c; chunk * COLS < K; chunk += P) {
    const int k0 = chunk * COLS;
    float y[2] = {0.0f, 0.0f};
    for (uint32_t e0 = 0; e0 < entries || e0 == 0; e0 += budget) {
      const uint32_t e1 = entries - e0 < static_cast<uint32_t>(budget) ? entries : e0 + budget;
      // The batch's entries, each found by two binary searches (its token among the lists' starts, its
      // CTA among the token's offsets), so that every thread's loads are independent and in flight together.
      const int batch = static_cast<int>(e1 - e0);
#pragma unroll 4
      for (int i = tid; i < batch; i += THREADS) {
        const uint32_t e = e0 + static_cast<uint32_t>(i);
        int t = 0;
        for (int step = 16; step > 0; step >>= 1)
          if (t + step < m && token_start[t + step] <= e) t += step;
        const uint32_t within = e - token_start[t];
        int lo = 0;  // the last CTA whose offset <= within
        for (int step = 128; step > 0; step >>= 1)
          if (lo + step < P && offsets[(lo + step) * 32 + t] <= within) lo += step;
        const uint2 v = load_l2_pair(b.entries + ((static_cast<int64_t>(lo) * 32 + t) * rows_cap + (within - offsets[lo * 32 + t])) * 2);
        entry_j[i] = v.x;
        entry_h[i] = __uint_as_float(v.y);
      }
      __syncthreads();
      if constexpr (Config::down_in_out) {
#pragma unroll 4
        for (int i = tid; i < batch * (COLS / 8); i += THREADS) {
          const int e = i / (COLS / 8), k = k0 + i % (COLS / 8) * 8;
          const uint16_t* w = p.w_down + static_cast<int64_t>(entry_j[e]) * p.ldwd + k;
          uint4 v = make_uint4(0u, 0u, 0u, 0u);
          if (k + 8 <= K) v = *reinterpret_cast<const uint4*>(w);  // K % 8 == 0: a chunk is all in or all out
          *reinterpret_cast<uint4*>(entry_w + e * COLS + i % (COLS / 8) * 8) = v;
        }
      } else {
#pragma unroll 4
        for (int i = tid; i < batch * COLS; i += THREADS) {
          const int e = i / COLS, k = k0 + i % COLS;
          entry_w[e * COLS + i % COLS] = k < K ? p.w_down[static_cast<int64_t>(k) * p.ldwd + entry_j[e]] : uint16_t{0};
        }
      }
      __syncthreads();
#pragma unroll
      for (int pass = 0; pass < 2; ++pass) {
        const int t = tid / COLS + pass * (THREADS / COLS);
        if (t < m) {
          const uint32_t first = token_start[t], last = token_start[t + 1];
          for (uint32_t e = first > e0 ? first : e0; e < last && e < e1; ++e)
            y[pass] = fmaf(entry_h[e - e0], Value::to_float(entry_w[(e - e0) * COLS + col]), y[pass]);
        }
      }
      __syncthreads();
      if (entries == 0) break;
    }
#pragma unroll
    for (int pass = 0; pass < 2; ++pass) {
      const int t = tid / COLS + pass * (THREADS / COLS);
      if (t < m && k0 + col < K) p.y[static_cast<int64_t>(t) * p.ldy + k0 + col] = Value::from_float(y[pass]);
    }
  }
}

// The kernel's body (at most Config::max_tokens = 8 rows; the host launches with
// DecodeKernelConstraints::fusedSharedBytes).
template <class Config>
__device__ __forceinline__ void decode_fused(const GatedDownParams& p, const DecodeFusedBuffers& b) {
  static_assert(Config::max_tokens == 8, "one m16 tile, rows 8..15 zero");
  if (p.m < 1 || p.m > Config::max_tokens) __trap();
  decode_fused_rows<Config, 8>(p, b);
}

}  // namespace twell::device
