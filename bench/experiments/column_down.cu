// Experiment (bench/README.md v26; not built by CMake, not part of the library): can the down
// projection at large M read Wd from shared memory instead of the L2?
//
// At uniform 0.5% density and M = 131072 the row gather (gated_down_warp) reads a 4 KiB row of Wu and
// one of Wd^T per entry: 30 GB through the L2, 3.7 ms. This splits it in two on synthetic compact
// entry lists (28 or 56 random ascending neurons per row, stride CAP):
//   up_only  - the same warp-per-row gather, Wu only: h_j = g_j (x . Wu_j) into the list;
//   col_down - "column-stationary": CTA c keeps Wd^T[:, 16c .. 16c + 16) for every neuron in shared
//              memory (176 KiB at d_ff 5632) and walks every row's list, fmaf per column in entry
//              order, so y has the same bits as the fused gather (checked below: `bits` = 0);
//   col_down_staged - the same, each batch of R rows' compact lists first copied into shared memory;
//   fused    - the fused gather as a baseline.
// This file holds the last versions measured (bench/README.md v26): col_down with 1 or 2 threads per row,
// each loading its (j, h) pairs, and the staged variant. The earlier rows of v26's table (8 or 4 lanes
// per row sharing the pairs by shuffles, with and without the next row's list prefetched) were
// intermediate versions of col_down, replaced here. At 1% the staged variant takes 64 and 32 rows per
// batch (5120 entries of staging), at 0.5% 128 and 64.
// Build and run (H200): nvcc -O3 -arch=sm_90a -std=c++17 -o column_down column_down.cu && ./column_down
#include <cstdio>
#include <cstdint>
#include <vector>
#include <algorithm>
#include <cuda_bf16.h>
#define CK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { printf("%s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(e)); exit(1);} } while (0)
constexpr int K = 2048, N = 5632, CAP = 64;
__device__ __forceinline__ uint32_t hash(uint32_t a, uint32_t b) { uint32_t h = a * 0x9E3779B1u ^ (b + 0x7F4A7C15u) * 0x85EBCA77u; h ^= h >> 15; h *= 0x2C1B3C6Du; h ^= h >> 12; h *= 0x297A2D39u; h ^= h >> 15; return h; }
__device__ __forceinline__ float bf(uint16_t v) { return __uint_as_float(uint32_t(v) << 16); }
__device__ __forceinline__ uint16_t tobf(float f) { return __bfloat16_as_ushort(__float2bfloat16(f)); }
__global__ void fill(uint16_t* p, int64_t n, uint32_t seed) { for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) p[i] = tobf(((hash(seed, (uint32_t)i) >> 8) * (1.0f / 16777216.0f) - 0.5f)); }
__global__ void make_lists(int m, float density, int* lj, float* lg, int* cnt) {
  int row = blockIdx.x * blockDim.x + threadIdx.x; if (row >= m) return;
  int c = 0; uint32_t thr = (uint32_t)(density * 4294967296.0);
  for (int j = 0; j < N && c < CAP; ++j) if (hash(row * 7919u + 13u, j) < thr) { lj[(int64_t)row * CAP + c] = j; lg[(int64_t)row * CAP + c] = 0.5f + (hash(row, j ^ 0x5555) >> 8) * (1.0f / 16777216.0f); ++c; }
  cnt[row] = c;
}
__device__ __forceinline__ float dot8(uint4 a, uint4 b, float s) { const uint32_t* x = &a.x; const uint32_t* w = &b.x;
#pragma unroll
  for (int i = 0; i < 4; ++i) { s = fmaf(bf(x[i] & 0xFFFF), bf(w[i] & 0xFFFF), s); s = fmaf(bf(x[i] >> 16), bf(w[i] >> 16), s); } return s; }
__device__ __forceinline__ void axpy8(float* y, float h, uint4 v) { const uint32_t* w = &v.x;
#pragma unroll
  for (int i = 0; i < 4; ++i) { y[2*i] = fmaf(h, bf(w[i] & 0xFFFF), y[2*i]); y[2*i+1] = fmaf(h, bf(w[i] >> 16), y[2*i+1]); } }
__device__ __forceinline__ float warp_sum(float v) { for (int o = 16; o; o >>= 1) v += __shfl_xor_sync(~0u, v, o); return v; }
__device__ __forceinline__ uint4 ldl2(const uint16_t* p) { return *reinterpret_cast<const uint4*>(p); }

// C: fused proxy (2 entries in flight, Wu and Wd rows).
__global__ void __launch_bounds__(256) fused(int m, const uint16_t* x, const uint16_t* wu, const uint16_t* wd, const int* lj, const float* lg, const int* cnt, uint16_t* y) {
  int lane = threadIdx.x % 32; int64_t warps = (int64_t)gridDim.x * 8;
  for (int64_t row = blockIdx.x * 8 + threadIdx.x / 32; row < m; row += warps) {
    uint4 xr[8]; for (int i = 0; i < 8; ++i) xr[i] = ldl2(x + row * K + 8 * lane + 256 * i);
    float acc[64]; for (int i = 0; i < 64; ++i) acc[i] = 0.f;
    int c = cnt[row];
    for (int e = 0; e < c; e += 2) {
      int P = c - e >= 2 ? 2 : 1; uint4 u4[2][8], d4[2][8]; int j[2]; float g[2];
      for (int q = 0; q < 2; ++q) { j[q] = q < P ? lj[row * CAP + e + q] : 0; g[q] = q < P ? lg[row * CAP + e + q] : 0.f; }
#pragma unroll
      for (int q = 0; q < 2; ++q) for (int i = 0; i < 8; ++i) { u4[q][i] = ldl2(wu + (int64_t)j[q] * K + 8 * lane + 256 * i); d4[q][i] = ldl2(wd + (int64_t)j[q] * K + 8 * lane + 256 * i); }
#pragma unroll
      for (int q = 0; q < 2; ++q) { if (q >= P) break; float u = 0.f; for (int i = 0; i < 8; ++i) u = dot8(xr[i], u4[q][i], u); float h = g[q] * warp_sum(u); for (int i = 0; i < 8; ++i) axpy8(&acc[8 * i], h, d4[q][i]); }
    }
    for (int i = 0; i < 8; ++i) { uint32_t w[4]; for (int t = 0; t < 4; ++t) w[t] = tobf(acc[8*i+2*t]) | (uint32_t(tobf(acc[8*i+2*t+1])) << 16); *reinterpret_cast<uint4*>(y + row * K + 8 * lane + 256 * i) = make_uint4(w[0], w[1], w[2], w[3]); }
  }
}
// A: up only, IF entries in flight; writes h into lh.
template <int IF>
__global__ void __launch_bounds__(256) up_only(int m, const uint16_t* x, const uint16_t* wu, const int* lj, const float* lg, const int* cnt, float* lh) {
  int lane = threadIdx.x % 32; int64_t warps = (int64_t)gridDim.x * 8;
  for (int64_t row = blockIdx.x * 8 + threadIdx.x / 32; row < m; row += warps) {
    uint4 xr[8]; for (int i = 0; i < 8; ++i) xr[i] = ldl2(x + row * K + 8 * lane + 256 * i);
    int c = cnt[row];
    for (int e = 0; e < c; e += IF) {
      uint4 u4[IF][8]; int j[IF];
#pragma unroll
      for (int q = 0; q < IF; ++q) j[q] = e + q < c ? lj[row * CAP + e + q] : 0;
#pragma unroll
      for (int q = 0; q < IF; ++q) for (int i = 0; i < 8; ++i) u4[q][i] = ldl2(wu + (int64_t)j[q] * K + 8 * lane + 256 * i);
#pragma unroll
      for (int q = 0; q < IF; ++q) { float u = 0.f; for (int i = 0; i < 8; ++i) u = dot8(xr[i], u4[q][i], u); u = warp_sum(u); if (lane == 0 && e + q < c) lh[row * CAP + e + q] = lg[row * CAP + e + q] * u; }
    }
  }
}
// B: column-stationary down: CTA owns columns [c0, c0 + CW) of y and holds Wd[:, c0:c0+CW] in shared memory.
// TPR threads per row (1 or 2), each CPT = CW/TPR columns (16-byte LDS each 8); each thread walks its row's (j, h)
// pairs itself (8-byte loads, same address for the row's lanes): no shuffles. Entries in order per column (fmaf).
__global__ void pack_pairs(int m, const int* lj, const float* lh, int2* lp) { int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; if (i < (int64_t)m * CAP) lp[i] = make_int2(lj[i], __float_as_int(lh[i])); }
template <int CW, int TPR, int THREADS, int PRE>
__global__ void __launch_bounds__(THREADS) col_down(int m, const uint16_t* wd, const int2* lp, const int* cnt, uint16_t* y, int row_groups) {
  extern __shared__ __align__(16) uint16_t ws[];  // [N][CW]
  constexpr int CPT = CW / TPR;
  const int c0 = blockIdx.x * CW;
  for (int i = threadIdx.x; i < N * CW / 8; i += THREADS) { int j = i / (CW / 8), q = i % (CW / 8); *reinterpret_cast<uint4*>(ws + j * CW + q * 8) = ldl2(wd + (int64_t)j * K + c0 + q * 8); }
  __syncthreads();
  const int sub = threadIdx.x % TPR;
  constexpr int GROUPS = THREADS / TPR;
  const int group = threadIdx.x / TPR;
  const int64_t rows_per = (m + row_groups - 1) / row_groups;
  const int64_t r0 = blockIdx.y * rows_per, r1 = (r0 + rows_per < m ? r0 + rows_per : (int64_t)m);
  for (int64_t row = r0 + group; row < r1; row += GROUPS) {
    const int c = __ldg(cnt + row);
    const int2* list = lp + row * CAP;
    int2 pre[PRE];
#pragma unroll
    for (int k = 0; k < PRE; ++k) pre[k] = __ldg(list + k);  // speculative: past the count is unused
    float acc[CPT];
#pragma unroll
    for (int i = 0; i < CPT; ++i) acc[i] = 0.f;
    auto step = [&](int2 e) {
      const float h = __int_as_float(e.y);
      const uint16_t* w = ws + e.x * CW + sub * CPT;
#pragma unroll
      for (int q = 0; q < CPT / 8; ++q) { uint4 v = *reinterpret_cast<const uint4*>(w + 8 * q); axpy8(&acc[8 * q], h, v); }
    };
#pragma unroll
    for (int k = 0; k < PRE; ++k) if (k < c) step(pre[k]);
    for (int e = PRE; e < c; ++e) step(__ldg(list + e));
    uint16_t* out = y + row * K + c0 + sub * CPT;
#pragma unroll
    for (int q = 0; q < CPT / 8; ++q) { uint32_t w[4]; for (int t = 0; t < 4; ++t) w[t] = tobf(acc[8*q+2*t]) | (uint32_t(tobf(acc[8*q+2*t+1])) << 16); *reinterpret_cast<uint4*>(out + 8 * q) = make_uint4(w[0], w[1], w[2], w[3]); }
  }
}
// B2: as col_down, but compact lists (offsets) staged into shared memory by the whole CTA, R rows at a time
// (coalesced 16-byte copies), so each entry's (j, h) is one shared-memory read, not one L1 line.
template <int R, int S>
__global__ void __launch_bounds__(512) col_down_staged(int m, const uint16_t* wd, const int2* lpc, const int64_t* off, uint16_t* y) {
  constexpr int CW = 16, TPR = 2, CPT = 8, THREADS = 512;
  extern __shared__ __align__(16) uint16_t ws[];  // [N][CW], then S entries
  int2* ls = reinterpret_cast<int2*>(ws + N * CW);
  const int c0 = blockIdx.x * CW;
  for (int i = threadIdx.x; i < N * CW / 8; i += THREADS) { int j = i / (CW / 8), q = i % (CW / 8); *reinterpret_cast<uint4*>(ws + j * CW + q * 8) = ldl2(wd + (int64_t)j * K + c0 + q * 8); }
  const int sub = threadIdx.x % TPR, group = threadIdx.x / TPR;  // 256 groups; rows per batch R <= 256
  for (int64_t base = 0; base < m; base += R) {
    const int64_t rend = base + R < m ? base + R : m;
    const int64_t e0 = off[base], e1 = off[rend];
    __syncthreads();  // previous batch done with ls (and ws loaded)
    const bool staged = e1 - e0 <= S;
    if (staged) for (int64_t i = e0 + threadIdx.x; i < e1; i += THREADS) ls[i - e0] = __ldg(lpc + i);
    __syncthreads();
    if (group < R && base + group < m) {
      const int64_t row = base + group;
      const int64_t a = off[row], b = off[row + 1];
      float acc[CPT];
#pragma unroll
      for (int i = 0; i < CPT; ++i) acc[i] = 0.f;
      for (int64_t e = a; e < b; ++e) {
        const int2 en = staged ? ls[e - e0] : __ldg(lpc + e);
        const float h = __int_as_float(en.y);
        uint4 v = *reinterpret_cast<const uint4*>(ws + en.x * CW + sub * CPT);
        axpy8(acc, h, v);
      }
      uint32_t w[4]; for (int t = 0; t < 4; ++t) w[t] = tobf(acc[2*t]) | (uint32_t(tobf(acc[2*t+1])) << 16);
      *reinterpret_cast<uint4*>(y + row * K + c0 + sub * CPT) = make_uint4(w[0], w[1], w[2], w[3]);
    }
  }
}
__global__ void compact(int m, const int2* lp, const int* cnt, const int64_t* off, int2* lpc) {
  int64_t row = blockIdx.x; for (int e = threadIdx.x; e < cnt[row]; e += blockDim.x) lpc[off[row] + e] = lp[row * CAP + e]; }
template <class F> float timeit(F f, int reps = 7) { cudaEvent_t a, b; CK(cudaEventCreate(&a)); CK(cudaEventCreate(&b)); std::vector<float> t; f(); CK(cudaDeviceSynchronize());
  for (int r = 0; r < reps; ++r) { CK(cudaEventRecord(a)); f(); CK(cudaEventRecord(b)); CK(cudaEventSynchronize(b)); float ms; CK(cudaEventElapsedTime(&ms, a, b)); t.push_back(ms); } std::sort(t.begin(), t.end()); return t[reps / 2]; }
int main(int argc, char** argv) {
  const int m = 131072; int sms; CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  uint16_t *x, *wu, *wd, *y1, *y2; int *lj, *cnt; float *lg, *lh; int2 *lp, *lpc; int64_t* off;
  CK(cudaMalloc(&x, (size_t)m * K * 2)); CK(cudaMalloc(&wu, (size_t)N * K * 2)); CK(cudaMalloc(&wd, (size_t)N * K * 2));
  CK(cudaMalloc(&y1, (size_t)m * K * 2)); CK(cudaMalloc(&y2, (size_t)m * K * 2));
  CK(cudaMalloc(&lj, (size_t)m * CAP * 4)); CK(cudaMalloc(&lg, (size_t)m * CAP * 4)); CK(cudaMalloc(&lh, (size_t)m * CAP * 4)); CK(cudaMalloc(&cnt, (size_t)m * 4)); CK(cudaMalloc(&lp, (size_t)m * CAP * 8)); CK(cudaMalloc(&lpc, (size_t)m * CAP * 8)); CK(cudaMalloc(&off, (size_t)(m + 1) * 8));
  fill<<<1024, 256>>>(x, (int64_t)m * K, 1); fill<<<1024, 256>>>(wu, (int64_t)N * K, 2); fill<<<1024, 256>>>(wd, (int64_t)N * K, 3); CK(cudaGetLastError());
  printf("density  fused  up2  up4  d(16,2,512,8)  d(16,2,1024,4) staged(R128|64) staged(R64|32)  up4+best  bits\n");
  for (float d : {0.005f, 0.01f}) {
    make_lists<<<m / 256, 256>>>(m, d, lj, lg, cnt); CK(cudaGetLastError());
    float tf = timeit([&] { fused<<<sms * 8, 256>>>(m, x, wu, wd, lj, lg, cnt, y1); });
    float tu2 = timeit([&] { up_only<2><<<sms * 8, 256>>>(m, x, wu, lj, lg, cnt, lh); });
    float tu4 = timeit([&] { up_only<4><<<sms * 8, 256>>>(m, x, wu, lj, lg, cnt, lh); });
    auto sm16 = N * 16 * 2;
#define DV(CW, TPR, TH, PRE, RG) [&] { auto kern = col_down<CW, TPR, TH, PRE>; int sm = N * CW * 2; CK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, sm)); return timeit([&] { kern<<<dim3(K / CW, RG), TH, sm>>>(m, wd, lp, cnt, y2, RG); }); }()
    up_only<4><<<sms * 8, 256>>>(m, x, wu, lj, lg, cnt, lh); pack_pairs<<<(m * CAP + 255) / 256, 256>>>(m, lj, lh, lp); CK(cudaGetLastError());
    float td1 = DV(16, 2, 512, 8, 1);
    float td2 = DV(16, 2, 1024, 4, 1);
    std::vector<int> hc(m); CK(cudaMemcpy(hc.data(), cnt, m * 4, cudaMemcpyDeviceToHost)); std::vector<int64_t> ho(m + 1, 0); for (int i = 0; i < m; ++i) ho[i + 1] = ho[i] + hc[i];
    CK(cudaMemcpy(off, ho.data(), (m + 1) * 8, cudaMemcpyHostToDevice)); compact<<<m, 64>>>(m, lp, cnt, off, lpc); CK(cudaGetLastError());
#define DS(R, S) [&] { auto kern = col_down_staged<R, S>; int sm = N * 16 * 2 + S * 8; CK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, sm)); return timeit([&] { kern<<<K / 16, 512, sm>>>(m, wd, lpc, off, y2); }); }()
    float td3 = d < 0.0075f ? DS(128, 5120) : DS(64, 5120);
    float td4 = d < 0.0075f ? DS(64, 5120) : DS(32, 5120);
    { auto kern = col_down_staged<128, 5120>; CK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, N * 32 + 5120 * 8)); }
    { auto kern = col_down_staged<64, 5120>; CK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, N * 32 + 5120 * 8)); }
    // bits: fused y1 against up_only<4> + col_down<16, 2, 512, 8>, then + col_down_staged<64>; y2 poisoned before each
    CK(cudaMemset(y2, 0xFF, (size_t)m * K * 2));
    up_only<4><<<sms * 8, 256>>>(m, x, wu, lj, lg, cnt, lh); pack_pairs<<<(m * CAP + 255) / 256, 256>>>(m, lj, lh, lp); col_down<16, 2, 512, 8><<<dim3(K / 16, 1), 512, sm16>>>(m, wd, lp, cnt, y2, 1); CK(cudaGetLastError()); CK(cudaDeviceSynchronize());
    size_t diff0 = 0; { std::vector<uint16_t> a((size_t)m * K), b((size_t)m * K); CK(cudaMemcpy(a.data(), y1, a.size() * 2, cudaMemcpyDeviceToHost)); CK(cudaMemcpy(b.data(), y2, b.size() * 2, cudaMemcpyDeviceToHost)); for (size_t i = 0; i < a.size(); ++i) diff0 += a[i] != b[i]; }
    CK(cudaMemset(y2, 0xFF, (size_t)m * K * 2)); col_down_staged<64, 5120><<<K / 16, 512, N * 32 + 5120 * 8>>>(m, wd, lpc, off, y2); CK(cudaGetLastError()); CK(cudaDeviceSynchronize());
    std::vector<uint16_t> a((size_t)m * K), b((size_t)m * K); CK(cudaMemcpy(a.data(), y1, a.size() * 2, cudaMemcpyDeviceToHost)); CK(cudaMemcpy(b.data(), y2, b.size() * 2, cudaMemcpyDeviceToHost));
    size_t diff = 0; for (size_t i = 0; i < a.size(); ++i) diff += a[i] != b[i];
    float best = std::min(std::min(td1, td2), std::min(td3, td4));
    printf("%.3f  %.3f  %.3f  %.3f  %.3f  %.3f  %.3f  %.3f  %.3f  %zu %zu\n", d, tf, tu2, tu4, td1, td2, td3, td4, tu4 + best, diff0, diff);
  }
}
