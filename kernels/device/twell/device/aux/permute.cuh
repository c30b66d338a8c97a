// Neuron reordering of a 16-bit weight matrix (PermuteParams): a one-time preparation step of the
// hot/cold split (twell/neuron_order.h), so a plain grid-stride gather; the writes are coalesced, and so
// are the reads of a row permutation.
#pragma once
#include "twell/device/params.h"

namespace twell::device {

__device__ __forceinline__ void permute16(const PermuteParams& p) {
  const int64_t total = p.rows * p.cols;
  for (int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < total;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = e / p.cols, c = e % p.cols;
    const int64_t from_r = p.by_rows ? static_cast<int64_t>(p.order[r]) : r;
    const int64_t from_c = p.by_rows ? c : static_cast<int64_t>(p.order[c]);
    p.out[r * p.ld_out + c] = p.in[from_r * p.ld_in + from_c];
  }
}

}  // namespace twell::device
