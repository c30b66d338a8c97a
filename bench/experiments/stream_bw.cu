// Experiment (bench/README.md v38): how fast can one wave of 132 CTAs stream a 23 MB weight matrix
// (the paper shape's Wg) from DRAM on the H200, by the mechanisms a decode gate can use? Each CTA reads
// a contiguous 1/132 of the matrix; 4 copies (92 MB > L2) are read in turn. Not part of the library.
//   nvcc -arch=sm_90a -O3 -std=c++17 -o stream_bw bench/experiments/stream_bw.cu
#include <cstdio>
#include <cstdint>
#include <vector>
#include <algorithm>
#include <cuda_runtime.h>

#define CHECK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { printf("%s: %s\n", #x, cudaGetErrorString(e)); return 1; } } while (0)

__device__ uint32_t sink;

// LDG.128: every thread U loads of 16 bytes in flight per step.
template <int U>
__global__ void __launch_bounds__(256, 1) ldg_stream(const uint4* w, int64_t n16) {
  const int64_t per = (n16 + gridDim.x - 1) / gridDim.x;
  const int64_t begin = blockIdx.x * per, end = min(n16, begin + per);
  uint32_t acc = 0;
  for (int64_t i = begin + threadIdx.x; i < end; i += 256 * U) {
    uint4 v[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t j = i + u * 256;
      v[u] = j < end ? __ldg(w + j) : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int u = 0; u < U; ++u) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
  }
  if (acc == 0x12345678u) sink = acc;
}

__device__ __forceinline__ uint32_t smem_addr(const void* p) { return static_cast<uint32_t>(__cvta_generic_to_shared(p)); }

// cp.async.bulk: `warps` warps, each with a ring of R entries of `bytes` bytes (lane 0 issues).
__global__ void __launch_bounds__(256, 1) bulk_stream(const char* w, int64_t total, int bytes, int R, int warps) {
  extern __shared__ __align__(128) char smem[];
  __shared__ __align__(8) uint64_t bar[8][16];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t per = total / gridDim.x / bytes / warps * bytes * warps;  // whole pieces per CTA
  const int64_t base = blockIdx.x * per;
  const int pieces = static_cast<int>(per / bytes / warps);
  if (warp >= warps) return;
  char* ring = smem + static_cast<int64_t>(warp) * R * bytes;
  if (lane == 0) {
    for (int e = 0; e < R; ++e) asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(smem_addr(&bar[warp][e])));
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncwarp();
  auto issue = [&](int p) {
    if (p >= pieces || lane != 0) return;
    const char* src = w + base + (static_cast<int64_t>(p) * warps + warp) * bytes;
    uint64_t* b = &bar[warp][p % R];
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_addr(b)), "r"(bytes) : "memory");
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                     smem_addr(ring + p % R * bytes)),
                 "l"(src), "r"(bytes), "r"(smem_addr(b))
                 : "memory");
  };
  for (int p = 0; p < R; ++p) issue(p);
  uint32_t acc = 0;
  for (int p = 0; p < pieces; ++p) {
    asm volatile(
        "{\n.reg .pred done;\nwait_%=:\nmbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n@!done bra wait_%=;\n}\n" ::"r"(
            smem_addr(&bar[warp][p % R])),
        "r"((p / R) & 1)
        : "memory");
    acc ^= reinterpret_cast<const uint32_t*>(ring + p % R * bytes)[lane];
    __syncwarp();
    issue(p + R);
  }
  if (acc == 0x12345678u) sink = acc;
}

int main() {
  const int64_t bytes = 2048LL * 5632 * 2;  // 23 MB
  const int copies = 4;
  int sms = 0;
  CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  std::vector<char*> w(copies);
  for (auto& p : w) {
    CHECK(cudaMalloc(&p, bytes));
    CHECK(cudaMemset(p, 1, bytes));
  }
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  auto time = [&](auto launch) {
    std::vector<float> ms;
    for (int rep = 0; rep < 7; ++rep) {
      cudaEventRecord(a);
      for (int i = 0; i < 20; ++i) launch(w[i % copies]);
      cudaEventRecord(b);
      cudaEventSynchronize(b);
      float t = 0;
      cudaEventElapsedTime(&t, a, b);
      ms.push_back(t * 1000.0f / 20);
    }
    std::sort(ms.begin(), ms.end());
    return ms[3];
  };
  auto report = [&](const char* what, float us) { printf("%-44s %7.2f us  %5.2f TB/s\n", what, us, bytes / us / 1e6); };
  report("ldg.128, 4 in flight per thread", time([&](char* p) { ldg_stream<4><<<sms, 256>>>(reinterpret_cast<uint4*>(p), bytes / 16); }));
  report("ldg.128, 8 in flight per thread", time([&](char* p) { ldg_stream<8><<<sms, 256>>>(reinterpret_cast<uint4*>(p), bytes / 16); }));
  report("ldg.128, 16 in flight per thread", time([&](char* p) { ldg_stream<16><<<sms, 256>>>(reinterpret_cast<uint4*>(p), bytes / 16); }));
  CHECK(cudaFuncSetAttribute(bulk_stream, cudaFuncAttributeMaxDynamicSharedMemorySize, 200 * 1024));
  struct Case { int bytes, R, warps; };
  for (Case c : {Case{512, 8, 8}, Case{4096, 4, 6}, Case{4096, 6, 8}, Case{8192, 3, 8}, Case{16384, 6, 2}, Case{32768, 6, 1},
                 Case{16384, 12, 1}, Case{4096, 16, 1}}) {
    char what[80];
    snprintf(what, sizeof what, "bulk %5d B x %2d ring x %d warps (%3d KB)", c.bytes, c.R, c.warps, c.bytes * c.R * c.warps / 1024);
    report(what, time([&](char* p) { bulk_stream<<<sms, 256, c.bytes * c.R * c.warps>>>(p, bytes, c.bytes, c.R, c.warps); }));
  }
  CHECK(cudaGetLastError());
  CHECK(cudaDeviceSynchronize());
  return 0;
}
