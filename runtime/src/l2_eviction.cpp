#include "l2_eviction.h"

#include "twell/error.h"

namespace twell::detail {

L2Eviction::L2Eviction(int l2_bytes, CUstream stream) {
  const int64_t rows = (2 * static_cast<int64_t>(l2_bytes) + kColumns * 2 - 1) / (kColumns * 2);
  scratch_ = DeviceBuffer(static_cast<size_t>(rows * kColumns * 2));
  a_ = DeviceBuffer(kColumns * 2);
  c_ = DeviceBuffer(static_cast<size_t>(rows * 2));
  // Zeros: finite operands (the products are never read). The memset's dirty lines leave L2 during
  // the first read, before anything is timed.
  const Driver& d = Driver::get();
  check(d.cuMemsetD8Async(scratch_.get(), 0, scratch_.bytes(), stream), "L2Eviction: cuMemsetD8Async(scratch)");
  check(d.cuMemsetD8Async(a_.get(), 0, a_.bytes(), stream), "L2Eviction: cuMemsetD8Async(a)");
  gemv_.a = reinterpret_cast<const void*>(a_.get());
  gemv_.lda = kColumns;
  gemv_.b = reinterpret_cast<const void*>(scratch_.get());
  gemv_.ldb = kColumns;
  gemv_.b_is_n_by_k = true;
  gemv_.c = reinterpret_cast<void*>(c_.get());
  gemv_.ldc = rows;
  gemv_.m = 1;
  gemv_.n = rows;
  gemv_.k = kColumns;
  // No workspace: the GEMV needs none (and no split-K), and the context keeps this object.
  lt_ = std::make_unique<LtGemms>(DType::BF16, /*tuned=*/false, "FfnPlan calibration (L2 eviction)", 0);
  lt_->prepare(gemv_);
}

void L2Eviction::enqueue(CUstream stream) {
  std::lock_guard<std::mutex> lock(mutex_);
  lt_->run(stream, gemv_);
}

L2Eviction* context_l2_eviction(Context::Impl& context, CUstream stream) {
  if (context.l2_bytes <= 0) return nullptr;
  std::lock_guard<std::mutex> lock(context.l2_eviction_mutex);
  if (!context.l2_eviction) {
    try {
      context.make_current();
      context.l2_eviction = std::make_unique<L2Eviction>(context.l2_bytes, stream);
    } catch (const Error&) {
      return nullptr;
    }
  }
  return context.l2_eviction.get();
}

}  // namespace twell::detail
