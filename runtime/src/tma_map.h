// TMA maps for the wgmma kernels (the D2T gate, the fused dense gated-up kernel): the one place that
// calls cuTensorMapEncodeTiled (plan_launch.cpp, cublas_dense.cpp).
#pragma once
#include <cstdint>

#include "twell/device/params.h"
#include "twell/spec.h"

namespace twell::detail {

// The TMA map of a row-major [rows, cols] 16-bit matrix with row stride `ld` elements, read in boxes of
// box_rows x box_cols (the kernel's cta_k: 64 columns = one 128-byte swizzle row, 32 = one 64-byte row;
// gate_twell_wgmma.cuh): out-of-bounds elements arrive as zeros (CUDA driver API,
// cuTensorMapEncodeTiled). The caller has checked the 16-byte alignment of the base and of the stride
// that the driver requires. Throws Error(Unsupported) for another box width, Error(Cuda) naming `what`
// when the driver refuses.
void encode_tma_map(device::TmaDescriptor& map, DType dtype, const void* base, int64_t rows, int64_t cols, int64_t ld,
                    int box_rows, int box_cols, const char* what);

}  // namespace twell::detail
