// Evicts the GPU's L2 cache between timed calls, so that a timed call reads its weights from DRAM as a
// layer of a model does (the other layers' weights went through L2 since its last call). Dispatch::Auto's
// calibration (plan_dispatch.cpp) uses it before every call it times.
#pragma once
#include <cuda.h>

#include <memory>
#include <mutex>

#include "context_impl.h"
#include "driver.h"
#include "lt_gemm.h"

namespace twell::detail {

class L2Eviction;

// The context's eviction (Context::Impl::l2_eviction), made at its first use on `stream` (the context
// current) and kept for the context's life: twice the L2 (120 MiB on the H200), not one allocation and
// cuBLASLt handle per calibrated bucket (a model's layers calibrate hundreds of buckets). Null where it
// could not be made (no memory: calibrations then time back to back; tried again at the next use).
L2Eviction* context_l2_eviction(Context::Impl& context, CUstream stream);

class L2Eviction {
 public:
  // A scratch of twice `l2_bytes` (CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE), zeroed once, and a cuBLASLt GEMV
  // that reads it. Needs the context current. Throws Error(Cuda) when the memory or cuBLASLt is not there
  // (callers then time without eviction).
  L2Eviction(int l2_bytes, CUstream stream);
  // Enqueues the read of the whole scratch on `stream`: every L2 line then holds scratch data, clean.
  // Thread-safe: calibrations on several threads and streams share the context's one (a mutex orders the
  // calls into cuBLASLt; the scratch is only read and c's values are never used).
  // Reads, not writes: a memset leaves L2 full of dirty lines, whose write-back then lands inside the next
  // timed call (about 6-7 us per call at the paper's decode shape on the H200, bench/README.md v71).
  void enqueue(CUstream stream);

 private:
  // The scratch as a [n, kColumns] bf16 matrix B; the GEMV computes c[1, n] = a[1, kColumns] B^T.
  static constexpr int64_t kColumns = 4096;
  std::mutex mutex_;
  DeviceBuffer scratch_, a_, c_;
  LtGemm gemv_;
  std::unique_ptr<LtGemms> lt_;
};

}  // namespace twell::detail
