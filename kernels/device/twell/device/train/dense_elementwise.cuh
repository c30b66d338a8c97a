// The dense training path's two elementwise steps (FfnTrainingPlan with TrainingPath::Dense; cuBLASLt
// does its GEMMs): the forward's h and row L1 after g = x Wg^T and u = x Wu^T, and the backward's dg,
// du (and h for dWd) after dh = dy Wd (TrainDenseForwardParams, TrainDenseBackwardParams). The same
// function as the TwELL path (design/TRAINING.md, "The gradients"): the activation's sparsity predicate
// decides where a, h, du and dg are nonzero, and the L1 term's sign(h) is added on that support only.
#pragma once
#include "twell/device/primitives/numerics.cuh"

namespace twell::device {

// One element of the forward: a (0 where inactive) and h = a u (non-gated: h = a), as floats.
template <class Value, int Act>
__device__ __forceinline__ float dense_hidden(uint16_t g, bool gated, uint16_t u, float threshold) {
  const uint16_t a_bits = activate<Value, Act>(g);
  if (!is_active<Value, Act>(a_bits, threshold)) return 0.0f;  // (not 0 * u: u may be inf)
  const float a = Value::to_float(a_bits);
  return gated ? a * Value::to_float(u) : a;
}

// 16-byte accesses where the rows allow them (n and ld multiples of 8, 16-byte aligned pointers: the
// plan's own buffers always are), as DenseGatedMul (aux/dense_ops.cuh: scalar accesses ran at a third of
// the bandwidth).
__device__ __forceinline__ bool rows_of_16_bytes(int64_t n, int64_t ld, const void* a, const void* b, const void* c) {
  return n % 8 == 0 && ld % 8 == 0 &&
         ((reinterpret_cast<unsigned long long>(a) | reinterpret_cast<unsigned long long>(b) |
           reinterpret_cast<unsigned long long>(c)) & 15) == 0;
}

// One CTA per row (grid-stride over rows): each thread sums |h| over its columns in column order, then
// the warps' sums by a fixed shuffle tree and the CTA's in warp order: the same fp32 row_l1 on every run.
template <class Value, int Act>
__device__ __forceinline__ void train_dense_forward(const TrainDenseForwardParams& p) {
  __shared__ float warp_sum[32];
  const bool gated = p.up != nullptr;
  const bool vector = rows_of_16_bytes(p.n, p.ld, p.gate, p.up, p.h);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = (blockDim.x + 31) / 32;
  for (int64_t row = blockIdx.x; row < p.m; row += gridDim.x) {
    const int64_t base = row * p.ld;
    float sum = 0.0f;
    if (vector) {
      for (int64_t c = int64_t{threadIdx.x} * 8; c < p.n; c += int64_t{blockDim.x} * 8) {
        const uint4 g4 = *reinterpret_cast<const uint4*>(p.gate + base + c);
        const uint4 u4 = gated ? *reinterpret_cast<const uint4*>(p.up + base + c) : make_uint4(0, 0, 0, 0);
        const uint16_t* g = reinterpret_cast<const uint16_t*>(&g4);
        const uint16_t* u = reinterpret_cast<const uint16_t*>(&u4);
        uint4 h4;
        uint16_t* h = reinterpret_cast<uint16_t*>(&h4);
#pragma unroll
        for (int i = 0; i < 8; ++i) {
          const float v = dense_hidden<Value, Act>(g[i], gated, u[i], p.threshold);
          h[i] = Value::from_float(v);
          sum += fabsf(v);
        }
        *reinterpret_cast<uint4*>(p.h + base + c) = h4;
      }
    } else {
      for (int64_t c = threadIdx.x; c < p.n; c += blockDim.x) {
        const float v = dense_hidden<Value, Act>(p.gate[base + c], gated, gated ? p.up[base + c] : uint16_t{0}, p.threshold);
        p.h[base + c] = Value::from_float(v);
        sum += fabsf(v);
      }
    }
#pragma unroll
    for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_down_sync(0xffffffffu, sum, offset);
    if (lane == 0) warp_sum[warp] = sum;
    __syncthreads();
    if (threadIdx.x == 0 && p.row_l1 != nullptr) {
      float total = 0.0f;
      for (int w = 0; w < warps; ++w) total += warp_sum[w];
      p.row_l1[row] = p.accumulate_l1 ? p.row_l1[row] + total : total;
    }
    __syncthreads();  // warp_sum is the next row's
  }
}

// One element of the backward, in place: g -> dg, u -> du (gated), dh -> h. l1: the L1 term's
// coefficient (lambda / l1_tokens, times the weight), added where apply_l1 (as the row backward).
template <class Value, int Act>
__device__ __forceinline__ void dense_grad_one(uint16_t& g, uint16_t* u, uint16_t& dh_h, bool apply_l1, float l1, float threshold) {
  const uint16_t a_bits = activate<Value, Act>(g);
  if (!is_active<Value, Act>(a_bits, threshold)) {
    g = Value::from_float(0.0f);
    if (u != nullptr) *u = Value::from_float(0.0f);
    dh_h = Value::from_float(0.0f);
    return;
  }
  const float a = Value::to_float(a_bits);
  const float uf = u != nullptr ? Value::to_float(*u) : 0.0f;
  const float h = u != nullptr ? a * uf : a;
  float dh = Value::to_float(dh_h);
  if (apply_l1) dh = dh + l1 * sign_of(h);
  const float slope = Act == kSiLU ? silu_derivative(Value::to_float(g)) : 1.0f;
  if (u != nullptr) *u = Value::from_float(dh * a);
  g = Value::from_float(u != nullptr ? (dh * uf) * slope : dh * slope);
  dh_h = Value::from_float(h);
}

// Grid-stride over the elements (8 at a time where rows_of_16_bytes).
template <class Value, int Act>
__device__ __forceinline__ void train_dense_backward(const TrainDenseBackwardParams& p) {
  const bool apply_l1 = p.apply_l1 != 0;
  const float l1 = apply_l1 ? (p.l1_weight != nullptr ? p.l1_scale * *p.l1_weight : p.l1_scale) : 0.0f;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const bool gated = p.up != nullptr;
  if (rows_of_16_bytes(p.n, p.ld, p.gate, p.up, p.dh_h)) {
    const int64_t chunks_per_row = p.n / 8, total = p.m * chunks_per_row;
    for (int64_t e = first; e < total; e += stride) {
      const int64_t at = (e / chunks_per_row) * p.ld + (e % chunks_per_row) * 8;
      uint4 g4 = *reinterpret_cast<const uint4*>(p.gate + at);
      uint4 u4 = gated ? *reinterpret_cast<const uint4*>(p.up + at) : make_uint4(0, 0, 0, 0);
      uint4 d4 = *reinterpret_cast<const uint4*>(p.dh_h + at);
      uint16_t* g = reinterpret_cast<uint16_t*>(&g4);
      uint16_t* u = reinterpret_cast<uint16_t*>(&u4);
      uint16_t* d = reinterpret_cast<uint16_t*>(&d4);
#pragma unroll
      for (int i = 0; i < 8; ++i) dense_grad_one<Value, Act>(g[i], gated ? &u[i] : nullptr, d[i], apply_l1, l1, p.threshold);
      *reinterpret_cast<uint4*>(p.gate + at) = g4;
      if (gated) *reinterpret_cast<uint4*>(p.up + at) = u4;
      *reinterpret_cast<uint4*>(p.dh_h + at) = d4;
    }
    return;
  }
  const int64_t total = p.m * p.n;
  for (int64_t e = first; e < total; e += stride) {
    const int64_t at = (e / p.n) * p.ld + e % p.n;
    dense_grad_one<Value, Act>(p.gate[at], gated ? &p.up[at] : nullptr, p.dh_h[at], apply_l1, l1, p.threshold);
  }
}

}  // namespace twell::device
