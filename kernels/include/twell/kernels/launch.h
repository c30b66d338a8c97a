// The launch geometry of every kernel kind, as one function of the kernel's data (kernel.h) and the
// call's size: the one place grids, blocks, clusters, dynamic shared memory and dependent launch are
// decided. The runtime's launcher (runtime/src/launcher.cpp) passes the result to cuLaunchKernelEx;
// tools report it (twellc run, twell-opt --twell-emit-cuda), so what they print is what runs.
#pragma once
#include <algorithm>
#include <cstdint>
#include <string>

#include "twell/kernels/constraints.h"
#include "twell/kernels/kernel.h"

namespace twell::kernels {

// What the device can hold of one loaded kernel (cuOccupancy*; the launcher queries it once per module).
struct Occupancy {
  int sm_count = 0;
  int ctas_per_sm = 1;        // CTAs of this kernel resident on one SM at once
  int resident_clusters = 0;  // cluster_m > 1: clusters resident on the GPU at once
};

// The size of one call: token rows for the FFN kernels; `rows` x `cols` of the matrix an auxiliary
// kernel walks (WeightTranspose: the out_in Wd [d_model, d_ff]; NeuronPermute: the matrix permuted;
// DenseGatedMul, TrainDenseForward, TrainDenseBackward: [tokens, d_ff]).
struct LaunchShape {
  int64_t tokens = 0;
  int64_t rows = 0;
  int64_t cols = 0;
};

struct LaunchConfig {
  uint32_t grid_x = 1, grid_y = 1, grid_z = 1;
  uint32_t block_x = 1, block_y = 1, block_z = 1;
  uint32_t cluster_x = 1;       // compiled in (__cluster_dims__) where > 1; the launcher does not set it again
  uint32_t shared_bytes = 0;    // dynamic shared memory of this launch
  bool dependent_launch = false;
  bool cooperative = false;  // CU_LAUNCH_ATTRIBUTE_COOPERATIVE: every CTA resident at once (a grid barrier, or
                             // CTAs waiting on each other's words: decode_fused)

  std::string describe() const {
    std::string s = "grid (" + std::to_string(grid_x) + ", " + std::to_string(grid_y) + ", " + std::to_string(grid_z) +
                    ") block (" + std::to_string(block_x) + ", " + std::to_string(block_y) + ", " + std::to_string(block_z) +
                    ") shared " + std::to_string(shared_bytes);
    if (cluster_x > 1) s += " cluster " + std::to_string(cluster_x);
    if (dependent_launch) s += " pdl";
    if (cooperative) s += " cooperative";
    return s;
  }
};

// grid.x of a persistent kernel over `tokens` rows (grid.y 1): with clusters, cluster_m consecutive
// m-blocks times the grid_y tiles make a cluster's work item and as many clusters start as are resident
// at once (at most one per item, gate_twell_wgmma.cuh); without, min(m-blocks x grid_y tiles, SMs x
// resident CTAs per SM). Any size is correct; this one fills the GPU once.
constexpr uint32_t persistent_grid_x(const KernelSource& k, int64_t tokens, const Occupancy& o) {
  const int64_t m_blocks = (tokens + k.cta_m - 1) / k.cta_m;
  if (k.cluster_m > 1) {
    const int64_t items = (m_blocks + k.cluster_m - 1) / k.cluster_m * k.grid_y;
    return static_cast<uint32_t>(k.cluster_m * std::min<int64_t>(items, o.resident_clusters));
  }
  return static_cast<uint32_t>(std::min<int64_t>(m_blocks * k.grid_y, int64_t{o.sm_count} * o.ctas_per_sm));
}

// The launch of `k` for `shape` (tokens >= 1 for the FFN kernels). Grids by kind:
//   GateTwell, GatedDown, DenseGatedUp  (ceil(tokens / cta_m), grid_y); persistent: (persistent_grid_x, 1)
//   DecodeGate       tiles x tile_n / kSliceN CTAs; shared memory for the rows `tokens` needs
//   DecodeGateSmall  tiles x tile_n / kGateSmallSliceN CTAs
//   DecodeUp         tokens x tiles CTAs (one per row and tile)
//   DecodeDown       tokens x ceil(d_model / downColumns) single-warp CTAs
//   DecodeFused      one CTA per SM (at most kFusedMaxCtas), cooperative; shared memory for the CTAs' rows
//                    and the call's x tiles of 8, 16 or 32 rows
//   WeightTranspose  32 x 32 tiles of [rows, cols]: (ceil(cols / 32), ceil(rows / 32)), blocks of 32 x 8
//   NeuronPermute    min(ceil(rows * cols / threads), 16 per SM) CTAs (grid-stride loop)
//   DenseGatedMul    min(ceil(rows * cols / threads), 65535) CTAs (grid-stride loop)
//   TrainDenseBackward  the same
//   TrainDenseForward   min(rows, 65535) CTAs (one row at a time, grid-stride over rows)
//   TrainRowBackward tokens CTAs (one per token row); the warp-per-row form: persistent_grid_x (per pass)
//   TrainWeightGrad  one CTA per SM (at most kMaxCtas), cooperative; dynamic shared memory smem_bytes
constexpr LaunchConfig launch_config(const KernelSource& k, const LaunchShape& shape, const Occupancy& o) {
  LaunchConfig c;
  c.block_x = static_cast<uint32_t>(k.threads);
  c.shared_bytes = static_cast<uint32_t>(k.smem_bytes);
  c.cluster_x = static_cast<uint32_t>(k.cluster_m);
  c.dependent_launch = k.dependent_launch;
  const int64_t tiles = k.tile_n > 0 ? (k.d_ff + k.tile_n - 1) / k.tile_n : 0;
  using D = DecodeKernelConstraints;
  switch (k.kind) {
    case KernelKind::GateTwell:
    case KernelKind::GatedDown:
    case KernelKind::DenseGatedUp:
      if (k.persistent) {
        c.grid_x = persistent_grid_x(k, shape.tokens, o);
      } else {
        c.grid_x = static_cast<uint32_t>((shape.tokens + k.cta_m - 1) / k.cta_m);
        c.grid_y = static_cast<uint32_t>(k.grid_y);
      }
      break;
    case KernelKind::DecodeGate:
      c.grid_x = static_cast<uint32_t>(tiles * (k.tile_n / D::kSliceN));
      c.shared_bytes = static_cast<uint32_t>(D::gateSharedBytes(k.tile_n, shape.tokens));
      break;
    case KernelKind::DecodeGateSmall:
      c.grid_x = static_cast<uint32_t>(tiles * (k.tile_n / D::kGateSmallSliceN));
      break;
    case KernelKind::DecodeUp:
      c.grid_x = static_cast<uint32_t>(shape.tokens * tiles);
      break;
    case KernelKind::DecodeFused:
      c.grid_x = static_cast<uint32_t>(D::fusedCtas(o.sm_count));
      c.shared_bytes = static_cast<uint32_t>(D::fusedLaunchBytes(k.d_model, k.d_ff, c.grid_x, shape.tokens));
      c.cooperative = true;
      break;
    case KernelKind::DecodeDown: {
      const int64_t columns = D::downColumns(k.down_in_out);
      c.grid_x = static_cast<uint32_t>(shape.tokens * ((k.d_model + columns - 1) / columns));
      break;
    }
    case KernelKind::WeightTranspose:
      c.grid_x = static_cast<uint32_t>((shape.cols + 31) / 32);
      c.grid_y = static_cast<uint32_t>((shape.rows + 31) / 32);
      c.block_x = 32;
      c.block_y = static_cast<uint32_t>(k.threads / 32);
      break;
    case KernelKind::NeuronPermute:
      c.grid_x = static_cast<uint32_t>(
          std::min<int64_t>((shape.rows * shape.cols + k.threads - 1) / k.threads, int64_t{o.sm_count} * 16));
      break;
    case KernelKind::TrainDenseForward:
      c.grid_x = static_cast<uint32_t>(std::clamp<int64_t>(shape.rows, 1, 65535));
      break;
    case KernelKind::DenseGatedMul:
    case KernelKind::TrainDenseBackward:
      c.grid_x = static_cast<uint32_t>(std::min<int64_t>((shape.rows * shape.cols + k.threads - 1) / k.threads, 65535));
      break;
    case KernelKind::TrainRowBackward:  // the warp-per-row form is persistent
      c.grid_x = k.persistent ? persistent_grid_x(k, shape.tokens, o) : static_cast<uint32_t>(shape.tokens);
      break;
    case KernelKind::TrainWeightGrad:
      c.grid_x = static_cast<uint32_t>(TrainWeightGradConstraints::ctas(o.sm_count));
      c.cooperative = true;
      break;
  }
  return c;
}

}  // namespace twell::kernels
