// decode_fused: the whole FFN of at most 8 token rows in one persistent, cooperative kernel, one CTA per
// SM (issue 17; PERFORMANCE.md, "Small M"; bench/README.md v38, v64). At a few rows the FFN is bound by
// reading Wg, so the kernel is built around streaming it (bench/experiments/decode_stream.cu measured
// the forms this one keeps):
//
// Phase 1, per CTA c of P: the contiguous rows [c d_ff / P, (c + 1) d_ff / P) of Wg, in groups of 8
//   rows (an n8 mma tile), each group's d_model split into k slices, one warp per (group, slice) unit.
//   Every lane requests its 16-byte pieces of Wg with plain loads into registers before anything waits
//   (one window of up to kDecodeFusedWindow k32 blocks: at the paper's shape all ~174 KB of the CTA's
//   share at once), x having gone first by cp.async so that it does not queue behind Wg. A lane (row
//   n = lane / 4, quad lane q = lane % 4) holds values 8 q .. 8 q + 7 of its row in each k32 block; its
//   first two words are the B fragment of one mma.m16n8k16 and its last two of another (PTX ISA,
//   "Matrix Fragments for mma.m16n8k16"), the A fragments being x's row n at the same values (one
//   16-byte read): each mma sums 16 of the block's products, a permutation of the block's k order
//   applied to A and B alike. Each unit's blocks run ascending; the slices' sums are added in slice
//   order. g is rounded to the value type and activated as every twell gate does (numerics.cuh).
// Then per active row j of the CTA (a warp each): Wd's data for j into L2 (phase 2 reads it), and per
//   active token h = a (x_t . Wu_j) with the row consumers' warp dot order (non-gated: h = a) into the
//   workspace; the token masks of every row and the CTA's active rows as bits are written too.
// The grid barrier: one release add per CTA on a 64-bit arrival count and acquire polls of it.
// Phase 2, per CTA: kDecodeFusedColumns (16) output columns: the active rows of the whole layer,
//   ascending, from the CTAs' bit words (one round trip of P words), then their masks, h and Wd
//   columns (a second), in batches of kDecodeFusedBatch; y of (token, column) is the sum over runs of
//   kDecodeFusedRun consecutive entries, each run one fmaf chain from +0, the runs added in order.
//
// Rounding and determinism: the gate's g is the dot of the large-M gates in another order (k slices of
// d_model, each in k16 steps over a permuted k, then the slices), y's sum over the entries another
// grouping (runs of kDecodeFusedRun), so a value may differ from the large-M
// path's in its last bits, and a neuron within that of the threshold may be active on one path and
// not the other; y is then within the documented tolerance (1e-2 relative) of the large-M path's, not
// its bits. Every order is fixed by the shape and the launch's CTA count, so y is the same bits on
// every run. No TwELL matrix is written (FfnPlan::download_twell says so after such a call).
#pragma once
#include "twell/device/consumer/consumer_common.cuh"
#include "twell/device/primitives/grid_sync.cuh"  // load_l2_u32

namespace twell::device {

// 16 bytes of global memory that no kernel of the call writes (a weight), streamed: no L1 allocation
// (PTX ISA, ld "L1::no_allocate"; the read-only path).
__device__ __forceinline__ uint4 load_stream_16(const uint16_t* ptr) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(ptr));
  return v;
}

// The grid barrier of decode_fused: arrivals only ever grow (P per launch), so a launch's target is the
// next multiple of P above what a CTA read before its own arrival (at most P - 1 arrivals of its launch
// precede that read). The count is 64-bit: it does not wrap. The read is issued early (thread 0, once
// the CTA's Wg loads are in flight) and used at the barrier, so that its round trip is not waited for.
__device__ __forceinline__ unsigned long long fused_barrier_seen(const unsigned long long* arrivals) {
  unsigned long long v = 0;
  if (threadIdx.x == 0) asm volatile("ld.relaxed.gpu.global.u64 %0, [%1];" : "=l"(v) : "l"(arrivals) : "memory");
  return v;
}
__device__ __forceinline__ void fused_barrier(unsigned long long* arrivals, unsigned long long seen) {
  __syncthreads();
  if (threadIdx.x == 0) {
    const unsigned long long target = (seen / gridDim.x + 1) * gridDim.x;
    __threadfence();  // the CTA's writes before its arrival
    asm volatile("red.release.gpu.global.add.u64 [%0], 1;" ::"l"(arrivals) : "memory");
    unsigned long long v;
    do {
      asm volatile("ld.acquire.gpu.global.u64 %0, [%1];" : "=l"(v) : "l"(arrivals) : "memory");
    } while (static_cast<long long>(v - target) < 0);
  }
  __syncthreads();
}

template <class Config>
__device__ __forceinline__ void decode_fused(const GatedDownParams& p, const DecodeFusedBuffers& b) {
  using Value = typename Config::Value;
  namespace sm = shared_memory;
  constexpr int K = Config::d_model;
  constexpr int N = Config::d_ff;
  constexpr int THREADS = Config::threads;
  constexpr int WARPS = THREADS / 32;
  constexpr int KB = (K + 31) / 32;  // k32 blocks of a row (the last zero-padded)
  constexpr int S = static_cast<int>(sm::kDecodeFusedSlices);  // k slices of a group, a warp (unit) each
  constexpr int PER = (KB + S - 1) / S;                          // k32 blocks per slice
  constexpr int NW = (PER + static_cast<int>(sm::kDecodeFusedWindow) - 1) / static_cast<int>(sm::kDecodeFusedWindow);
  constexpr int WIN = (PER + NW - 1) / NW;                       // blocks per window (<= kDecodeFusedWindow)
  constexpr bool EXACT = K % 32 == 0 && KB % S == 0 && PER % WIN == 0;  // every window's loads inside its slice and K
  constexpr int LDX = static_cast<int>(sm::decode_fused_x_stride(K));
  constexpr int COLS = static_cast<int>(sm::kDecodeFusedColumns);
  constexpr int BATCH = static_cast<int>(sm::kDecodeFusedBatch);
  constexpr int RUN = static_cast<int>(sm::kDecodeFusedRun);
  constexpr int XR = static_cast<int>(sm::kDecodeFusedTokens);
  static_assert(Config::threads == sm::kDecodeFusedWarps * 32 && Config::max_tokens == XR && K % 8 == 0, "decode_fused shape");
  extern __shared__ __align__(128) unsigned char dynamic_smem[];
  __shared__ int scan_total[WARPS];
  __shared__ int active_count;

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int m = static_cast<int>(p.m);
  const int P = static_cast<int>(gridDim.x), c = static_cast<int>(blockIdx.x);
  if (m < 1 || m > XR) __trap();
  const int rows_cap = (N + P - 1) / P;
  const int words = static_cast<int>(sm::decode_fused_words(rows_cap));  // bit words per CTA
  // x's rows are written first: their room is checked before, the whole layout's once Wg is in flight.
  require_dynamic_smem(static_cast<uint32_t>(XR * LDX * 2));
  const int r0 = static_cast<int>(static_cast<int64_t>(c) * N / P);
  const int R = static_cast<int>(static_cast<int64_t>(c + 1) * N / P) - r0;
  const int units = (R + 7) / 8 * S;

  // Phase 1's shared memory (sm::decode_fused_phase1_bytes): x [XR][LDX], the units' sums [units][XR
  // tokens][8 rows], a per (row, token), the rows' token masks, the active rows ascending.
  uint16_t* xs = reinterpret_cast<uint16_t*>(dynamic_smem);
  float* sums = reinterpret_cast<float*>(xs + XR * LDX);
  float* act = sums + (rows_cap + 7) / 8 * S * XR * 8;                    // [rows_cap][XR]
  uint32_t* row_mask = reinterpret_cast<uint32_t*>(act + rows_cap * XR);  // [rows_cap]
  int* active = reinterpret_cast<int*>(row_mask + rows_cap);              // [rows_cap]

  // x first: rows past the call and values past K are zeros (the padded k32 block multiplies zeros).
  for (int i = tid; i < XR * (KB * 4); i += THREADS) {
    const int t = i / (KB * 4), k = i % (KB * 4) * 8;
    const bool valid = t < m && k < K;
    cp_async_16(xs + t * LDX + k, p.x + (valid ? static_cast<int64_t>(t) * p.ldx + k : 0), valid);
  }
  cp_async_commit();

  // The warp's units u = warp, warp + WARPS, ... (group u / S, slice u % S: k32 blocks [slice * PER,
  // min(KB, (slice + 1) * PER))), each in NW windows of WIN blocks: at the paper's shape one window
  // per warp, all its loads in flight at once (a shape with more windows waits for each).
  const int n = lane / 4, q = lane % 4;
  // Unit u's window: its first k32 block, and the end of its slice's blocks.
  auto window_first = [](int u, int window) { return u % S * PER + window * WIN; };
  auto slice_end = [](int u) { return (u % S + 1) * PER < KB ? (u % S + 1) * PER : KB; };
  // The loads of unit u's window into buf.
  auto issue = [&](uint4 (&buf)[WIN], int u, int window) {
    const int row = 8 * (u / S) + n, first = window_first(u, window), end = slice_end(u);
    const bool valid_row = row < R;
    const uint16_t* src = p.w_gate + static_cast<int64_t>(r0 + (valid_row ? row : 0)) * p.ldwg + 8 * q + 32 * first;
#pragma unroll
    for (int i = 0; i < WIN; ++i)
      buf[i] = valid_row && (EXACT || (first + i < end && 32 * (first + i) + 8 * q < K)) ? load_stream_16(src + 32 * i)
                                                                                      : make_uint4(0u, 0u, 0u, 0u);
  };
  // The window's 2 WIN mma steps into acc.
  auto consume = [&](const uint4 (&buf)[WIN], float (&acc)[4], int u, int window) {
    const int first = window_first(u, window), end = slice_end(u);
    const uint16_t* xrow = xs + n * LDX + 8 * q + 32 * first;
#pragma unroll
    for (int i = 0; i < WIN; ++i) {
      // Blocks past the slice or KB are skipped, not multiplied by zeros: x's row is not written past
      // block KB (0 * NaN is NaN). Inside KB the last block's values past K are zeros in x and Wg.
      if (!EXACT && first + i >= end) break;
      // The lane's 8 values of x's row n at the same k: A's words in the same places as B's.
      const uint4 xv = *reinterpret_cast<const uint4*>(xrow + 32 * i);
      const uint32_t a0[4] = {xv.x, 0u, xv.y, 0u};
      const uint32_t a1[4] = {xv.z, 0u, xv.w, 0u};
      mma_16816<Value>(acc, a0, buf[i].x, buf[i].y);
      mma_16816<Value>(acc, a1, buf[i].z, buf[i].w);
    }
  };
  // The unit's sums: D rows are tokens (lane / 4), columns the group's rows 2 q, 2 q + 1.
  auto store = [&](const float (&acc)[4], int u) {
    sums[(u * XR + n) * 8 + 2 * q] = acc[0];
    sums[(u * XR + n) * 8 + 2 * q + 1] = acc[1];
  };
  unsigned long long seen;  // the barrier's arrivals before this CTA's (thread 0's; fused_barrier)
  {
    // The warp's first unit: its first window requested before x is waited for.
    uint4 buf[WIN];
    if (warp < units) issue(buf, warp, 0);
    require_dynamic_smem(static_cast<uint32_t>(sm::decode_fused_bytes(K, rows_cap, P)));
    seen = fused_barrier_seen(b.arrivals);
    cp_async_wait<0>();
    __syncthreads();
    if (warp < units) {
      float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
      consume(buf, acc, warp, 0);
#pragma unroll 1
      for (int window = 1; window < NW; ++window) {
        issue(buf, warp, window);
        consume(buf, acc, warp, window);
      }
      store(acc, warp);
    }
  }
  // More units than warps (rows per CTA above 8 WARPS / S): one window at a time.
#pragma unroll 1
  for (int u = warp + WARPS; u < units; u += WARPS) {
    uint4 buf[WIN];
    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll 1
    for (int window = 0; window < NW; ++window) {
      issue(buf, u, window);
      consume(buf, acc, u, window);
    }
    store(acc, u);
  }
  __syncthreads();

  // g per (row, token): the slices in order, rounded, activated; the rows' token masks (8 lanes per
  // row: tokens 0..7).
  for (int base = 0; base < R * XR; base += THREADS) {  // uniform trip count: the ballot below
    const int i = base + tid, r = i / XR, t = i % XR;
    bool on = false;
    if (r < R) {
      float s = 0.0f;
#pragma unroll
      for (int sl = 0; sl < S; ++sl) s += sums[((r / 8 * S + sl) * XR + t) * 8 + r % 8];
      const uint16_t a = activate<Value, Config::activation>(Value::from_float(s));
      on = t < m && is_active<Value, Config::activation>(a, Config::threshold);
      act[r * XR + t] = Value::to_float(a);
    }
    const uint32_t ballot = __ballot_sync(0xFFFFFFFFu, on);
    if (r < R && t == 0) {
      const uint32_t mask = (ballot >> (lane & ~(XR - 1))) & ((1u << XR) - 1u);
      row_mask[r] = mask;
      b.token_mask[r0 + r] = mask;
    }
  }
  __syncthreads();
  // The active rows ascending, and the CTA's bit words (warp 0, 32 rows per ballot).
  if (warp == 0) {
    int count = 0;
    for (int base = 0; base < words * 64; base += 32) {
      const bool on = base + lane < R && row_mask[base + lane] != 0;
      const uint32_t ballot = __ballot_sync(0xFFFFFFFFu, on);
      if (on) active[count + __popc(ballot & lanemask_lt())] = base + lane;
      count += __popc(ballot);
      if (lane == 0) {
        if (base % 64 == 0) b.rows_on[static_cast<int64_t>(c) * words + base / 64] = ballot;
        else b.rows_on[static_cast<int64_t>(c) * words + base / 64] |= static_cast<unsigned long long>(ballot) << 32;
      }
    }
    if (lane == 0) active_count = count;
  }
  __syncthreads();
  const int n_active = active_count;
  // h per active (row, token), a warp per row: Wd's data into L2 first (phase 2 reads it), then Wu_j
  // once for all the row's tokens (warp_dot_16B, the row consumers' dot).
  for (int e = warp; e < n_active; e += WARPS) {
    const int r = active[e], j = r0 + r;
    const uint32_t mask = row_mask[r];
    if constexpr (Config::down_in_out) {
      for (int k = lane * 64; k < K; k += 32 * 64)
        asm volatile("prefetch.global.L2 [%0];" ::"l"(p.w_down + static_cast<int64_t>(j) * p.ldwd + k) : "memory");
    } else {
      for (int k = lane; k < K; k += 32)
        asm volatile("prefetch.global.L2 [%0];" ::"l"(p.w_down + static_cast<int64_t>(k) * p.ldwd + j) : "memory");
    }
    for (uint32_t left = mask; left != 0; left &= left - 1) {
      const int t = __ffs(left) - 1;
      float h = act[r * XR + t];
      if constexpr (Config::gated) h *= warp_dot_16B<Value, K>(xs + t * LDX, p.w_up + static_cast<int64_t>(j) * p.ldwu, lane);  // h = a u
      if (lane == 0) b.h[static_cast<int64_t>(t) * N + j] = h;
    }
  }

  fused_barrier(b.arrivals, seen);

  // ---- phase 2 (its shared memory from the start again: sm::decode_fused_phase2_bytes) ----
  unsigned long long* word_bits = reinterpret_cast<unsigned long long*>(dynamic_smem);  // [P * words]
  int* word_start = reinterpret_cast<int*>(word_bits + P * words);                     // [P * words + 1]
  int* ej = word_start + P * words + 1;                                                 // [BATCH]
  uint32_t* em = reinterpret_cast<uint32_t*>(ej + BATCH);                               // [BATCH]
  float* eh = reinterpret_cast<float*>(em + BATCH);                                     // [BATCH][XR]
  float* runs = eh + BATCH * XR;                                                        // [BATCH / RUN][XR][COLS]
  uint16_t* ew = reinterpret_cast<uint16_t*>(runs + BATCH / RUN * XR * COLS);           // [BATCH][COLS]
  // Round trip 1: every CTA's words (thread-contiguous runs of them), the exclusive scan of their bits.
  const int total_words = P * words;
  const int wper = (total_words + THREADS - 1) / THREADS;
  int mine = 0;
  for (int i = tid * wper; i < (tid + 1) * wper && i < total_words; ++i) {
    unsigned long long v;
    asm volatile("ld.relaxed.gpu.global.u64 %0, [%1];" : "=l"(v) : "l"(b.rows_on + i) : "memory");
    word_bits[i] = v;
    mine += __popcll(v);
  }
  int incl = mine;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const int v = __shfl_up_sync(0xFFFFFFFFu, incl, o);
    if (lane >= o) incl += v;
  }
  if (lane == 31) scan_total[warp] = incl;
  __syncthreads();
  int before = incl - mine;
  for (int w = 0; w < warp; ++w) before += scan_total[w];
  for (int i = tid * wper; i < (tid + 1) * wper && i < total_words; ++i) {
    word_start[i] = before;
    before += __popcll(word_bits[i]);
  }
  if (tid == THREADS - 1) word_start[total_words] = before;
  __syncthreads();
  const int entries = word_start[total_words];
  const int col = tid % COLS, tok = tid / COLS;  // y's (token, column) of threads below XR * COLS
  for (int chunk = c; chunk * COLS < K; chunk += P) {
    const int k0 = chunk * COLS;
    float y = 0.0f;
    for (int e0 = 0; e0 < entries || e0 == 0; e0 += BATCH) {
      const int batch = entries - e0 < BATCH ? entries - e0 : BATCH;
      // The batch's rows: a thread per word meeting it, its bits in order.
      for (int i = tid; i < total_words; i += THREADS)
        if (word_start[i] < e0 + batch && word_start[i + 1] > e0) {
          const int row0 = static_cast<int>(static_cast<int64_t>(i / words) * N / P) + 64 * (i % words);
          int at = word_start[i];
          for (unsigned long long v = word_bits[i]; v != 0; v &= v - 1, ++at)
            if (at >= e0 && at < e0 + batch) ej[at - e0] = row0 + __ffsll(static_cast<long long>(v)) - 1;
        }
      __syncthreads();
      // Round trip 2: a thread per entry issues all its loads (mask, h of the call's tokens, the
      // COLS Wd values) before storing any.
      for (int i = tid; i < batch; i += THREADS) {
        const int j = ej[i];
        const uint32_t mask = load_l2_u32(b.token_mask + j);
        float h[XR];
#pragma unroll
        for (int t = 0; t < XR; ++t) h[t] = t < m ? __uint_as_float(load_l2_u32(reinterpret_cast<const uint32_t*>(b.h + static_cast<int64_t>(t) * N + j))) : 0.0f;
        uint16_t w[COLS];
        if constexpr (Config::down_in_out) {
#pragma unroll
          for (int h8 = 0; h8 < COLS / 8; ++h8) {
            uint4 v = make_uint4(0u, 0u, 0u, 0u);
            if (k0 + 8 * h8 < K) v = *reinterpret_cast<const uint4*>(p.w_down + static_cast<int64_t>(j) * p.ldwd + k0 + 8 * h8);
            const uint32_t vw[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
            for (int e = 0; e < 4; ++e) w[8 * h8 + 2 * e] = static_cast<uint16_t>(vw[e]), w[8 * h8 + 2 * e + 1] = static_cast<uint16_t>(vw[e] >> 16);
          }
        } else {
#pragma unroll
          for (int k = 0; k < COLS; ++k) w[k] = k0 + k < K ? p.w_down[static_cast<int64_t>(k0 + k) * p.ldwd + j] : uint16_t{0};
        }
        em[i] = mask;
#pragma unroll
        for (int t = 0; t < XR; ++t) eh[i * XR + t] = h[t];
#pragma unroll
        for (int k = 0; k < COLS; ++k) ew[i * COLS + k] = w[k];
      }
      __syncthreads();
      // Runs of RUN entries: one fmaf chain per (run, token, column).
      const int nruns = (batch + RUN - 1) / RUN;
      for (int i = tid; i < nruns * XR * COLS; i += THREADS) {
        const int run = i / (XR * COLS), t = i / COLS % XR, k = i % COLS;
        float s = 0.0f;
        if (t < m) {
          const int end = (run + 1) * RUN < batch ? (run + 1) * RUN : batch;
          for (int e = run * RUN; e < end; ++e)
            if (em[e] >> t & 1u) s = fmaf(eh[e * XR + t], Value::to_float(ew[e * COLS + k]), s);
        }
        runs[i] = s;
      }
      __syncthreads();
      if (tok < XR)
        for (int run = 0; run < nruns; ++run) y += runs[(run * XR + tok) * COLS + col];
      __syncthreads();
      if (entries == 0) break;
    }
    if (tok < m && k0 + col < K) p.y[static_cast<int64_t>(tok) * p.ldy + k0 + col] = Value::from_float(y);
  }
}

}  // namespace twell::device
