// TMA map encoding (tma_map.h).
#include "tma_map.h"

#include <cuda.h>

#include <fmt/format.h>

#include "driver.h"
#include "twell/error.h"

namespace twell::detail {

void encode_tma_map(device::TmaDescriptor& map, DType dtype, const void* base, int64_t rows, int64_t cols, int64_t ld,
                    int box_rows, int box_cols, const char* what) {
  static_assert(sizeof(CUtensorMap) == sizeof(device::TmaDescriptor) && alignof(CUtensorMap) <= alignof(device::TmaDescriptor));
  if (box_cols != 32 && box_cols != 64)
    throw Error(ErrorCode::Unsupported,
                fmt::format("{}: the gate kernel's K step (cta_k) must be 32 or 64 for TMA, got {}", what, box_cols));
  const Driver& d = Driver::get();
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(cols), static_cast<cuuint64_t>(rows)};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(ld) * 2};
  const cuuint32_t box[2] = {static_cast<cuuint32_t>(box_cols), static_cast<cuuint32_t>(box_rows)};
  const cuuint32_t element_strides[2] = {1, 1};
  check(d.cuTensorMapEncodeTiled(reinterpret_cast<CUtensorMap*>(&map),
                                         dtype == DType::BF16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16, 2,
                                         const_cast<void*>(base), dims, strides, box, element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
                                         box_cols == 64 ? CU_TENSOR_MAP_SWIZZLE_128B : CU_TENSOR_MAP_SWIZZLE_64B,
                                         CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE),
                what);
}

}  // namespace twell::detail
