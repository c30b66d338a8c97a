// cuBLASLt GEMMs in row-major terms, for the dense inference path (DenseFfn, cublas_dense.cpp) and the
// dense training path (FfnTrainingPlan, training_dense.cpp): bf16/fp16 operands, fp32 compute, C in the
// operands' type or fp32. A shape's descriptors and algorithm are made once (host work that need not
// repeat on every call).
#pragma once
#include <cuda.h>

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <tuple>

#include "driver.h"
#include "twell/spec.h"

namespace twell::detail {

// Row-major C[m, n] = op(A)[m, k] * op(B)[k, n] (+ beta C). Strides in elements.
struct LtGemm {
  const void* a = nullptr;
  int64_t lda = 0;
  bool a_is_k_by_m = false;  // A stored [k, m] (its transpose is used: the weight gradients' dg^T x)
  const void* b = nullptr;
  int64_t ldb = 0;
  bool b_is_n_by_k = false;  // B stored [n, k] (an nn.Linear weight: x W^T) or [k, n]
  void* c = nullptr;
  int64_t ldc = 0;
  int64_t m = 0, n = 0, k = 0;
  bool c_fp32 = false;  // C (and D) in fp32, else in the operands' dtype
};

class LtGemms {
 public:
  // `owner` prefixes error messages ("DenseFfn", "FfnTrainingPlan"). tuned: each shape's algorithm is
  // the fastest of cuBLASLt's first heuristic choices, timed on the first run() with a stream outside
  // capture (DenseKernels::CuBlasLtTuned); otherwise its first choice. Needs the context current.
  // workspace_bytes: device memory cuBLASLt may use (0: none, which rules out split-K algorithms).
  LtGemms(DType dtype, bool tuned, const char* owner, size_t workspace_bytes = kWorkspaceBytes);
  ~LtGemms();
  LtGemms(const LtGemms&) = delete;
  LtGemms& operator=(const LtGemms&) = delete;

  // Chooses g's algorithm now (untimed) so run() launches without heuristic queries. Throws
  // Error(Unsupported) where cuBLASLt has none for g's shape and alignments, Error(Cuda) on a status.
  void prepare(const LtGemm& g);
  // Enqueues g on the stream; D = C (in place). Throws as prepare, Error(Cuda) for a failed launch.
  void run(CUstream stream, const LtGemm& g, float beta = 0.0f);
  void* workspace() const;   // workspace_bytes of device memory (cuBLAS may share it: one stream at a time)
  static constexpr size_t kWorkspaceBytes = size_t{32} << 20;

  struct Plan;

 private:
  const Plan& plan(const LtGemm& g, std::optional<CUstream> timing_stream);
  DType dtype_;
  bool tuned_;
  const char* owner_;
  size_t workspace_bytes_;
  void* handle_ = nullptr;  // cublasLtHandle_t
  std::unique_ptr<DeviceBuffer> workspace_;
  // (m, n, k, lda, ldb, ldc, a_is_k_by_m, b_is_n_by_k, c_fp32, alignments of A, B, C)
  std::map<std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, bool, bool, bool, uint32_t, uint32_t, uint32_t>,
           std::unique_ptr<Plan>>
      plans_;
};

}  // namespace twell::detail
