// Elementwise kernels of the dense baseline path (cuBLASLt does the GEMMs):
// h = act(g) * u, rounded to the value type, as a dense framework computes a gated FFN; h = act(g)
// for a non-gated one (p.up null).
#pragma once
#include "twell/device/primitives/numerics.cuh"

namespace twell::device {

// The sparsity predicate applies here too, so the dense path computes exactly the function the
// TwELL path computes (the plan may dispatch either).
template <class Value, int Act>
__device__ __forceinline__ void gated_mul(const GatedMulParams& p, float threshold) {
  const int64_t total = p.m * p.n;
  for (int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < total;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = e / p.n, c = e % p.n;
    const int64_t at = r * p.ld + c;
    const uint16_t a_bits = activate<Value, Act>(p.gate[at]);
    const float a = is_active<Value, Act>(a_bits, threshold) ? Value::to_float(a_bits) : 0.0f;
    p.h[at] = p.up ? Value::from_float(a * Value::to_float(p.up[at])) : Value::from_float(a);
  }
}

}  // namespace twell::device
