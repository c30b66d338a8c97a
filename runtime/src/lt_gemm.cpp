// LtGemms (lt_gemm.h): cuBLASLt's column-major interface for row-major operands.
#include "lt_gemm.h"

#include <cublasLt.h>

#include <fmt/format.h>

#include "twell/device_memory.h"
#include "twell/error.h"

namespace twell::detail {
namespace {

void check_lt(cublasStatus_t s, const char* owner, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS)
    throw Error(ErrorCode::Cuda, fmt::format("{}: {}: cuBLASLt status {} ({})", owner, what, static_cast<int>(s),
                                             cublasLtGetStatusString(s)));
}

// How many of cuBLASLt's heuristic choices a tuned LtGemms times per GEMM shape.
constexpr int kTunedCandidates = 8;

// The alignment cuBLASLt may assume for an operand: the largest power of two (at most 256, its
// default assumption) dividing both the address and the row stride in bytes. Without telling it,
// the heuristic assumes 256 and may pick a kernel that rejects an offset view (a slice of x, y).
uint32_t operand_alignment(const void* ptr, int64_t ld, int element_bytes) {
  const uint64_t bits = reinterpret_cast<uintptr_t>(ptr) | static_cast<uint64_t>(ld) * element_bytes | 256;
  return static_cast<uint32_t>(bits & (~bits + 1));
}

bool capturing(CUstream stream) {
  CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
  return Driver::get().cuStreamIsCapturing(stream, &status) != CUDA_SUCCESS || status != CU_STREAM_CAPTURE_STATUS_NONE;
}

}  // namespace

struct LtGemms::Plan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t layout_b = nullptr, layout_a = nullptr, layout_c = nullptr;
  cublasLtMatmulAlgo_t algo{};
  bool timed = false;  // algo is the fastest of several candidates
  Plan() = default;
  Plan(const Plan&) = delete;
  Plan& operator=(const Plan&) = delete;
  ~Plan() {
    if (layout_c) cublasLtMatrixLayoutDestroy(layout_c);
    if (layout_a) cublasLtMatrixLayoutDestroy(layout_a);
    if (layout_b) cublasLtMatrixLayoutDestroy(layout_b);
    if (desc) cublasLtMatmulDescDestroy(desc);
  }
};

LtGemms::LtGemms(DType dtype, bool tuned, const char* owner, size_t workspace_bytes)
    : dtype_(dtype), tuned_(tuned), owner_(owner), workspace_bytes_(workspace_bytes) {
  cublasLtHandle_t h = nullptr;
  check_lt(cublasLtCreate(&h), owner_, "cublasLtCreate");
  handle_ = h;
  workspace_ = std::make_unique<DeviceBuffer>(workspace_bytes_);
}

LtGemms::~LtGemms() {
  plans_.clear();  // descriptors before the handle
  if (handle_ != nullptr) cublasLtDestroy(static_cast<cublasLtHandle_t>(handle_));
}

void* LtGemms::workspace() const { return reinterpret_cast<void*>(workspace_->get()); }

void LtGemms::prepare(const LtGemm& g) { plan(g, std::nullopt); }

// cuBLASLt is column-major: the row-major C[m, n] is the column-major C^T [n, m], computed as
// op(B)^T-as-stored [n, k] times op(A)^T-as-stored [k, m]. B stored [n, k] row-major is k x n column-major
// (ld = ldb): transposed to n x k; stored [k, n] it is n x k already. A stored [m, k] row-major is k x m
// column-major already; stored [k, m] it is m x k: transposed.
//
// The algorithm: cuBLASLt's first heuristic choice; when tuned (and a stream to time on, outside capture)
// the fastest of its first kTunedCandidates choices, each timed on these operands (one warm-up, median
// of 3; time_on_stream) with C in scratch memory, so C is never written here.
const LtGemms::Plan& LtGemms::plan(const LtGemm& g, std::optional<CUstream> timing_stream) {
  const int c_bytes = g.c_fp32 ? 4 : 2;
  const uint32_t align_first = operand_alignment(g.b, g.ldb, 2), align_second = operand_alignment(g.a, g.lda, 2),
                 align_c = operand_alignment(g.c, g.ldc, c_bytes);
  auto& slot = plans_[{g.m, g.n, g.k, g.lda, g.ldb, g.ldc, g.a_is_k_by_m, g.b_is_n_by_k, g.c_fp32, align_first, align_second, align_c}];
  const bool timed = tuned_ && timing_stream && !capturing(*timing_stream);
  if (slot && (slot->timed || !timed)) return *slot;  // (a choice made untimed, by prepare(), is timed at the first run())
  auto p = std::make_unique<Plan>();
  const cudaDataType_t type = dtype_ == DType::BF16 ? CUDA_R_16BF : CUDA_R_16F;
  const cudaDataType_t c_type = g.c_fp32 ? CUDA_R_32F : type;
  check_lt(cublasLtMatmulDescCreate(&p->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F), owner_, "cublasLtMatmulDescCreate");
  const cublasOperation_t op_first = g.b_is_n_by_k ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_second = g.a_is_k_by_m ? CUBLAS_OP_T : CUBLAS_OP_N;
  check_lt(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_first, sizeof(op_first)), owner_, "TRANSA");
  check_lt(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_second, sizeof(op_second)), owner_, "TRANSB");
  if (g.b_is_n_by_k) check_lt(cublasLtMatrixLayoutCreate(&p->layout_b, type, g.k, g.n, g.ldb), owner_, "layout B");
  else check_lt(cublasLtMatrixLayoutCreate(&p->layout_b, type, g.n, g.k, g.ldb), owner_, "layout B");
  if (g.a_is_k_by_m) check_lt(cublasLtMatrixLayoutCreate(&p->layout_a, type, g.m, g.k, g.lda), owner_, "layout A");
  else check_lt(cublasLtMatrixLayoutCreate(&p->layout_a, type, g.k, g.m, g.lda), owner_, "layout A");
  check_lt(cublasLtMatrixLayoutCreate(&p->layout_c, c_type, g.n, g.m, g.ldc), owner_, "layout C");
  cublasLtMatmulPreference_t pref = nullptr;
  check_lt(cublasLtMatmulPreferenceCreate(&pref), owner_, "cublasLtMatmulPreferenceCreate");
  const uint64_t ws = workspace_bytes_;
  cublasLtMatmulHeuristicResult_t heuristics[kTunedCandidates]{};
  int found = 0;
  cublasStatus_t set = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws));
  const std::pair<cublasLtMatmulPreferenceAttributes_t, uint32_t> alignments[] = {
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, align_first}, {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, align_second},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, align_c}, {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, align_c},
      // Split-K partial sums only in fp32 (or none): reduced in the 16-bit output type (the INPLACE and
      // OUTPUT_TYPE schemes) g would be rounded more than once, and entries near zero would take another
      // activity than an fp32 sum rounded once gives (the training reference's and the TwELL gate's; 2% of
      // dx at d_model 512, d_ff 1408, 50% density, session 23).
      {CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, uint32_t{CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE}}};
  for (const auto& [attribute, bytes] : alignments)
    if (set == CUBLAS_STATUS_SUCCESS) set = cublasLtMatmulPreferenceSetAttribute(pref, attribute, &bytes, sizeof(bytes));
  const auto handle = static_cast<cublasLtHandle_t>(handle_);
  const cublasStatus_t got = set != CUBLAS_STATUS_SUCCESS
                                 ? set
                                 : cublasLtMatmulAlgoGetHeuristic(handle, p->desc, p->layout_b, p->layout_a, p->layout_c, p->layout_c,
                                                                  pref, timed ? kTunedCandidates : 1, heuristics, &found);
  cublasLtMatmulPreferenceDestroy(pref);
  check_lt(set, owner_, "matmul preferences (workspace, alignments)");
  check_lt(got, owner_, "cublasLtMatmulAlgoGetHeuristic");
  if (found == 0)
    throw Error(ErrorCode::Unsupported, fmt::format("{}: cuBLASLt has no algorithm for m={} n={} k={} with operands aligned to "
                                                    "{} / {} / {} bytes", owner_, g.m, g.n, g.k, align_second, align_first, align_c));
  p->algo = heuristics[0].algo;
  if (timed && found > 1) {
    // The fastest candidate, C written to scratch memory of C's shape and stride (g's own C may be the
    // user's y). A candidate that fails to launch is skipped.
    DeviceBuffer scratch(size_t(g.m - 1) * g.ldc * c_bytes + size_t(g.n) * c_bytes);
    const float alpha = 1.0f, beta = 0.0f;
    void* c = reinterpret_cast<void*>(scratch.get());
    double best_ms = 0;
    for (int i = 0; i < found; ++i) {
      if (heuristics[i].state != CUBLAS_STATUS_SUCCESS || heuristics[i].workspaceSize > workspace_bytes_) continue;
      const cublasLtMatmulAlgo_t* algo = &heuristics[i].algo;
      bool failed = false;
      const auto ms = time_on_stream(reinterpret_cast<Stream>(*timing_stream), [&] {
        if (failed) return;
        failed = cublasLtMatmul(handle, p->desc, &alpha, g.b, p->layout_b, g.a, p->layout_a, &beta, c, p->layout_c, c, p->layout_c,
                                algo, workspace(), workspace_bytes_, reinterpret_cast<cudaStream_t>(*timing_stream)) != CUBLAS_STATUS_SUCCESS;
      }, 1, 3);
      if (failed) continue;
      if (best_ms == 0 || ms[1] < best_ms) {
        best_ms = ms[1];
        p->algo = *algo;
      }
    }
  }
  p->timed = timed;
  slot = std::move(p);
  return *slot;
}

void LtGemms::run(CUstream stream, const LtGemm& g, float beta) {
  const float alpha = 1.0f;
  const Plan& p = plan(g, stream);
  check_lt(cublasLtMatmul(static_cast<cublasLtHandle_t>(handle_), p.desc, &alpha, g.b, p.layout_b, g.a, p.layout_a, &beta, g.c,
                          p.layout_c, g.c, p.layout_c, &p.algo, workspace(), workspace_bytes_, reinterpret_cast<cudaStream_t>(stream)),
           owner_, "cublasLtMatmul");
}

}  // namespace twell::detail
