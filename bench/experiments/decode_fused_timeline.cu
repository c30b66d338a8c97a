// Experiment (issue 17, bench/README.md v75, v77, v78): where a decode_fused call spends its time. The library's
// kernel (decode/decode_fused.cuh) with its timeline hook defined: thread 0 of every CTA stamps
// %globaltimer (ns, one clock for the GPU) and clock64 (its SM's cycles) at each phase boundary. Calls
// run from a CUDA graph of 32 calls (4 per copy) over 8 copies of the weights (> L2), as FfnPlan::run launches them
// (cooperative, programmatic stream serialization); the stamps are the last call's. Uniform weights
// with column 0 shifting each neuron to the density (tests/common/test_data.h's recipe; 0.5% and 2%), Wd in_out.
// Another kernel version (bench/README.md v77's forms) can be timed by putting its device headers first
// on the include path; the workspace is sized for either form.
// Not part of the library.
//   (from the repository root) nvcc -gencode=arch=compute_90a,code=sm_90a -O3 -std=c++20 -I kernels/device
//     -I kernels/include -I runtime/include -o decode_fused_timeline bench/experiments/decode_fused_timeline.cu
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <utility>
#include <vector>

__device__ unsigned long long g_stamp[256][9][2];
#define TWELL_DECODE_FUSED_STAMP(stage)                      \
  do {                                                       \
    if (threadIdx.x == 0) {                                  \
      unsigned long long t_;                                 \
      asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t_)); \
      g_stamp[blockIdx.x][stage][0] = t_;                    \
      g_stamp[blockIdx.x][stage][1] = clock64();             \
    }                                                        \
  } while (0)
#include "twell/device/decode/decode_fused.cuh"
#include "twell/half.h"  // the host's bf16 conversions (round to nearest even, as cvt.rn)

using twell::bf16_to_float;
using twell::float_to_bf16;

#define CHECK(x)                                                                              \
  do {                                                                                        \
    cudaError_t e_ = (x);                                                                     \
    if (e_ != cudaSuccess) {                                                                  \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      std::exit(1);                                                                           \
    }                                                                                         \
  } while (0)

#ifndef TWELL_TIMELINE_K  // d_model (a half-width Wg stream: -DTWELL_TIMELINE_K=1024, bench/README.md v78)
#define TWELL_TIMELINE_K 2048
#endif
constexpr int K = TWELL_TIMELINE_K, N = 5632, COPIES = 8;
struct Config {
  using Value = twell::device::BF16;
  static constexpr int d_model = K, d_ff = N, tile_n = 256, slots = 31, activation = 0;
  static constexpr float threshold = 0.0f;
  static constexpr int threads = 768, max_tokens = 32, cta_m = 32, slice_n = 32, mma_warps = 2;
  static constexpr bool gated = true, down_in_out = true;
  static constexpr int down_columns_per_lane = 2, gate_mainloop = 2, gate_cta_k = 64;
};
__global__ void __launch_bounds__(768, 1)
    fused(const twell::device::GatedDownParams p, const twell::device::DecodeFusedBuffers d) {
  twell::device::decode_fused<Config>(p, d);
}

int main() {
  int sms = 0;
  CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  if (sms > twell::device::shared_memory::kDecodeFusedMaxCtas) {  // g_stamp's rows: FfnPlan's most CTAs
    std::fprintf(stderr, "decode_fused_timeline: %d SMs, at most 256 supported\n", sms);
    return 1;
  }
  namespace sm = twell::device::shared_memory;
  const int rows_cap = (N + sms - 1) / sms;
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  const size_t n = static_cast<size_t>(N) * K;
  const float ws = 1.0f / std::sqrt(float(K));
  std::vector<uint16_t> wg(n), wu(n), wd(n);
  for (size_t i = 0; i < n; ++i)
    wg[i] = float_to_bf16(u(rng) * ws), wu[i] = float_to_bf16(u(rng) * ws),
    wd[i] = float_to_bf16(u(rng) / std::sqrt(float(N)));
  // Each neuron's standard deviation of g over uniform x without column 0; column 0 (x's is 1) then shifts
  // the neuron so that P(g > 0) is the density (z below: P(N(0,1) > z)).
  std::vector<double> sd(N);
  for (int j = 0; j < N; ++j) {
    double var = 0;
    for (int k = 1; k < K; ++k)
      var += double(bf16_to_float(wg[size_t(j) * K + k])) * bf16_to_float(wg[size_t(j) * K + k]) / 3.0;
    sd[j] = std::sqrt(var);
  }
  std::vector<uint16_t*> dwg(COPIES), dwu(COPIES), dwd(COPIES);
  for (int c = 0; c < COPIES; ++c) {
    CHECK(cudaMalloc(&dwg[c], n * 2));
    CHECK(cudaMalloc(&dwu[c], n * 2));
    CHECK(cudaMalloc(&dwd[c], n * 2));
    CHECK(cudaMemcpy(dwu[c], wu.data(), n * 2, cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(dwd[c], wd.data(), n * 2, cudaMemcpyHostToDevice));
  }
  std::vector<uint16_t> x(32 * K);
  for (auto& v : x) v = float_to_bf16(u(rng));
  for (int t = 0; t < 32; ++t) x[t * K] = float_to_bf16(1.0f);
  uint16_t *dx, *dy;
  CHECK(cudaMalloc(&dx, x.size() * 2));
  CHECK(cudaMalloc(&dy, x.size() * 2));
  CHECK(cudaMemcpy(dx, x.data(), x.size() * 2, cudaMemcpyHostToDevice));
  unsigned long long *pairs, *arrivals;
  uint32_t* counts;
  CHECK(cudaMalloc(&pairs, size_t(sm::decode_fused_pair_slots(N, sms)) * 8));
  CHECK(cudaMalloc(&counts, size_t(sm::decode_fused_segments(sms)) * 8));  // room for 64-bit counts (v77's form (a))
  CHECK(cudaMemset(counts, 0, size_t(sm::decode_fused_segments(sms)) * 8));
  CHECK(cudaMalloc(&arrivals, 16));
  CHECK(cudaMemset(arrivals, 0, 16));
  CHECK(cudaFuncSetAttribute(fused, cudaFuncAttributeMaxDynamicSharedMemorySize, 225 * 1024));
  cudaStream_t s;
  CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  std::printf(
      "stage: 0 resident, 1 x arrived (and every warp's Wg loads issued), 2 Wg streamed and multiplied, 8 g, masks, "
      "row bits, Wu and in_out Wd prefetches, 3 pairs' j and counts written; a CTA's reducers (those with a column "
      "chunk): 4 "
      "the counts read and scanned (6: every CTA's publication seen), 5 the first batch's pairs, Wd and h in shared "
      "memory, 7 y written\n");
  for (const auto& [permille, z] : {std::pair{5, 2.5758}, std::pair{20, 2.0537}}) {
    for (int j = 0; j < N; ++j) wg[size_t(j) * K] = float_to_bf16(float(-sd[j] * z));
    for (int c = 0; c < COPIES; ++c) CHECK(cudaMemcpy(dwg[c], wg.data(), n * 2, cudaMemcpyHostToDevice));
    for (int m : {1, 4, 16, 32}) {
      const int bytes = static_cast<int>(sm::decode_fused_bytes(K, rows_cap, sms, sm::decode_fused_token_rows(m)));
      int layer = 0;
      auto one = [&] {
        twell::device::GatedDownParams p{};
        p.x = dx;
        p.w_gate = dwg[layer];
        p.w_up = dwu[layer];
        p.w_down = dwd[layer];
        p.y = dy;
        p.m = m;
        p.ldx = p.ldwg = p.ldwu = p.ldwd = p.ldy = K;
        layer = (layer + 1) % COPIES;
        twell::device::DecodeFusedBuffers b{pairs, counts, arrivals};
        cudaLaunchConfig_t cfg = {};
        cfg.gridDim = dim3(sms);
        cfg.blockDim = dim3(768);
        cfg.stream = s;
        cfg.dynamicSmemBytes = bytes;
        cudaLaunchAttribute attr[2];
        attr[0].id = cudaLaunchAttributeCooperative;
        attr[0].val.cooperative = 1;
        attr[1].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        attr[1].val.programmaticStreamSerializationAllowed = 1;
        cfg.attrs = attr;
        cfg.numAttrs = 2;
        CHECK(cudaLaunchKernelEx(&cfg, fused, p, b));
      };
      one();
      CHECK(cudaStreamSynchronize(s));
      cudaGraph_t g;
      cudaGraphExec_t ge;
      CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
      for (int i = 0; i < 4 * COPIES; ++i) one();
      CHECK(cudaStreamEndCapture(s, &g));
      CHECK(cudaGraphInstantiate(&ge, g, 0));
      cudaEvent_t e0, e1;
      CHECK(cudaEventCreate(&e0));
      CHECK(cudaEventCreate(&e1));
      std::vector<float> per;
      for (int rep = 0; rep < 7; ++rep) {
        CHECK(cudaEventRecord(e0, s));
        CHECK(cudaGraphLaunch(ge, s));
        CHECK(cudaEventRecord(e1, s));
        CHECK(cudaEventSynchronize(e1));
        float ms;
        CHECK(cudaEventElapsedTime(&ms, e0, e1));
        per.push_back(ms * 1e3f / (4 * COPIES));
      }
      std::sort(per.begin(), per.end());
      unsigned long long st[256][9][2];
      CHECK(cudaMemcpyFromSymbol(st, g_stamp, sizeof(st)));
      std::vector<uint32_t> cnt(size_t(m) * sms);
      CHECK(cudaMemcpy(cnt.data(), counts, cnt.size() * 4, cudaMemcpyDeviceToHost));
      // Time 0: the median CTA's residency (a CTA whose SM the previous call left early becomes resident
      // before the previous call is complete, and waits).
      std::vector<unsigned long long> res(sms);
      for (int c = 0; c < sms; ++c) res[c] = st[c][0][0];
      std::nth_element(res.begin(), res.begin() + sms / 2, res.end());
      const unsigned long long t0 = res[sms / 2];
      std::printf(
          "\nM %d, %d permille: %.2f us per call in the graph (median of 7); last call's stamps, us after the median "
          "CTA's "
          "stage 0\n",
          m, permille, per[3]);
      std::printf(
          "stage   min    med    max   | per-CTA cycles from the stage before: med   max   | owners med  others med "
          "(owners: CTAs with active rows)\n");
      const int order[] = {0, 1, 2, 8, 3, 6, 4, 5, 7};
      for (int o = 0; o < 9; ++o) {
        const int k = order[o];
        std::vector<double> v, d, own, oth;
        for (int c = 0; c < sms; ++c) {
          if (o >= 5 && c * 16 >= K) continue;  // no column chunk: no reducer stages
          v.push_back((double(st[c][k][0]) - double(t0)) / 1e3);
          if (o > 0) d.push_back(double(st[c][k][1] - st[c][order[o - 1]][1]));
          bool owner = false;
          for (int t = 0; t < m; ++t) owner = owner || cnt[size_t(t) * sms + c] > 0;
          (owner ? own : oth).push_back((double(st[c][k][0]) - double(t0)) / 1e3);
        }
        auto med = [](std::vector<double> a) {
          if (a.empty()) return -1.0;
          std::sort(a.begin(), a.end());
          return a[a.size() / 2];
        };
        auto mx = [](const std::vector<double>& a) { return a.empty() ? -1.0 : *std::max_element(a.begin(), a.end()); };
        auto mn = [](const std::vector<double>& a) { return a.empty() ? -1.0 : *std::min_element(a.begin(), a.end()); };
        std::printf("  %d   %6.2f %6.2f %6.2f   |   %8.0f %8.0f   |   %6.2f (%zu)  %6.2f (%zu)\n", k, mn(v), med(v),
                    mx(v), o ? med(d) : 0.0, o ? mx(d) : 0.0, med(own), own.size(), med(oth), oth.size());
      }
      {
        std::vector<double> a, b2;
        for (int c = 0; c < sms; ++c)
          a.push_back(double(st[c][8][1] - st[c][2][1])), b2.push_back(double(st[c][3][1] - st[c][8][1]));
        std::sort(a.begin(), a.end());
        std::sort(b2.begin(), b2.end());
        std::printf(
            "  stage 2 -> 8 (g pass) cycles med %.0f max %.0f; 8 -> 3 (pairs' j and counts) med %.0f max %.0f\n",
            a[a.size() / 2], a.back(), b2[b2.size() / 2], b2.back());
      }
      // y of the last call (every copy holds the same values) against the CPU (double sums; g rounded to
      // bf16 and activated as the kernel does; neurons within 1e-3 of 0 are counted, "near", since the
      // kernel's fp32 order may decide them otherwise), and its bits' hash (FNV-1a) for the reader to compare
      // with another build of the kernel that changes no arithmetic (nothing here asserts it).
      std::vector<uint16_t> y(size_t(m) * K);
      CHECK(cudaMemcpy(y.data(), dy, y.size() * 2, cudaMemcpyDeviceToHost));
      double err2 = 0, ref2 = 0;
      int near = 0, active = 0;
      for (int t = 0; t < m; ++t) {
        std::vector<double> yr(K, 0.0);
        for (int j = 0; j < N; ++j) {
          double g = 0;
          for (int k = 0; k < K; ++k) g += double(bf16_to_float(x[t * K + k])) * bf16_to_float(wg[size_t(j) * K + k]);
          const double a = bf16_to_float(float_to_bf16(float(g)));
          if (std::fabs(g) < 1e-3) ++near;
          if (!(a > 0)) continue;
          ++active;
          double uu = 0;
          for (int k = 0; k < K; ++k) uu += double(bf16_to_float(x[t * K + k])) * bf16_to_float(wu[size_t(j) * K + k]);
          for (int k = 0; k < K; ++k) yr[k] += a * uu * bf16_to_float(wd[size_t(j) * K + k]);
        }
        for (int k = 0; k < K; ++k)
          err2 += (bf16_to_float(y[t * K + k]) - yr[k]) * (bf16_to_float(y[t * K + k]) - yr[k]), ref2 += yr[k] * yr[k];
      }
      uint64_t h = 1469598103934665603ull;
      for (auto v : y) h = (h ^ v) * 1099511628211ull;
      CHECK(cudaGraphLaunch(ge, s));
      CHECK(cudaStreamSynchronize(s));
      std::vector<uint16_t> y2(y.size());
      CHECK(cudaMemcpy(y2.data(), dy, y2.size() * 2, cudaMemcpyDeviceToHost));
      std::printf("y: %d active (%d near 0), relative error %.2e against the CPU, bits %s run to run, hash %016llx\n",
                  active, near, std::sqrt(err2 / ref2), y == y2 ? "the same" : "DIFFERENT",
                  static_cast<unsigned long long>(h));
    }
  }
  return 0;
}
