// A 16-bit matrix transpose through 32 x 32 shared-memory tiles (padded by one element so that the
// column reads hit 32 different banks); reads and writes are coalesced. Launched with 32 x 8 threads
// per CTA, grid (ceil(cols / 32), ceil(rows / 32)).
#pragma once
#include "twell/device/params.h"

namespace twell::device {

__device__ __forceinline__ void transpose16(const TransposeParams& p) {
  __shared__ uint16_t tile[32][33];
  const int64_t c0 = static_cast<int64_t>(blockIdx.x) * 32, r0 = static_cast<int64_t>(blockIdx.y) * 32;
  for (int dy = threadIdx.y; dy < 32; dy += 8) {
    const int64_t r = r0 + dy, c = c0 + threadIdx.x;
    if (r < p.rows && c < p.cols) tile[dy][threadIdx.x] = p.in[r * p.ld_in + c];
  }
  __syncthreads();
  for (int dy = threadIdx.y; dy < 32; dy += 8) {
    const int64_t c = c0 + dy, r = r0 + threadIdx.x;  // output row c, column r
    if (r < p.rows && c < p.cols) p.out[c * p.ld_out + r] = tile[threadIdx.x][dy];
  }
}

}  // namespace twell::device
