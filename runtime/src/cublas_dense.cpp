// The dense path (twell/dense.h): g = x Wg^T, u = x Wu^T, h = act(g) * u, y = h Wd^T. The GEMMs through
// cuBLASLt (bf16/fp16 operands, fp32 compute) and the elementwise step through a twell kernel
// (DenseGatedMul), or (FusedGatedUp) the first three in one twell wgmma kernel (DenseGatedUp, from
// gate_twell_wgmma.cuh), then cuBLASLt's down GEMM, or (CuBlas) every GEMM through cublasGemmEx as
// PyTorch calls it. Both twell kernels come from the context (bundle or JIT).
#include <cublasLt.h>
#include <cublas_v2.h>

#include <cstdint>
#include <cstdio>
#include <map>
#include <memory>
#include <optional>
#include <tuple>
#include <vector>

#include <fmt/format.h>

#include "context_impl.h"
#include "driver.h"
#include "dense_kernels.h"
#include "launcher.h"
#include "run_arguments.h"
#include "tma_map.h"
#include "twell/kernels/constraints.h"
#include "twell/kernels/validate.h"
#include "twell/dense.h"
#include "twell/device/params.h"
#include "twell/device_memory.h"
#include "twell/error.h"

namespace twell {
namespace {

void check_lt(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS)
    throw Error(ErrorCode::Cuda, fmt::format("DenseFfn: {}: cuBLASLt status {} ({})", what, static_cast<int>(s), cublasLtGetStatusString(s)));
}

void check_blas(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS)
    throw Error(ErrorCode::Cuda, fmt::format("DenseFfn: {}: cuBLAS status {} ({})", what, static_cast<int>(s), cublasGetStatusString(s)));
}

constexpr size_t kWorkspaceBytes = size_t{32} << 20;
// How many of cuBLASLt's heuristic choices DenseKernels::CuBlasLtTuned times per GEMM shape.
constexpr int kTunedCandidates = 8;

// The alignment cuBLASLt may assume for an operand: the largest power of two (at most 256, its
// default assumption) dividing both the address and the row stride in bytes. Without telling it,
// the heuristic assumes 256 and may pick a kernel that rejects an offset view (a slice of x, y).
uint32_t operand_alignment(const void* ptr, int64_t ld) {
  const uint64_t bits = reinterpret_cast<uintptr_t>(ptr) | static_cast<uint64_t>(ld) * 2 | 256;
  return static_cast<uint32_t>(bits & (~bits + 1));
}

// One GEMM of the FFN: row-major C[m, n] = A[m, k] * op(B), B stored [n, k] (b_is_n_by_k) or [k, n].
struct Gemm {
  const void* a;
  int64_t lda;
  const void* b;
  int64_t ldb;
  bool b_is_n_by_k;
  void* c;
  int64_t ldc;
  int64_t m, n, k;
};

}  // namespace

// One cuBLASLt GEMM shape, described and matched to an algorithm once: descriptors, layouts and the
// heuristic's choice are host work that need not repeat on every call of the same shape.
struct GemmPlan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t layout_b = nullptr, layout_a = nullptr, layout_c = nullptr;
  cublasLtMatmulAlgo_t algo{};
  bool timed = false;  // algo is the fastest of several candidates (DenseKernels::CuBlasLtTuned)
  GemmPlan() = default;
  GemmPlan(const GemmPlan&) = delete;
  GemmPlan& operator=(const GemmPlan&) = delete;
  ~GemmPlan() {
    if (layout_c) cublasLtMatrixLayoutDestroy(layout_c);
    if (layout_a) cublasLtMatrixLayoutDestroy(layout_a);
    if (layout_b) cublasLtMatrixLayoutDestroy(layout_b);
    if (desc) cublasLtMatmulDescDestroy(desc);
  }
};

struct DenseFfn::Impl {
  std::shared_ptr<Context::Impl> context;
  FfnSpec spec;
  int64_t max_tokens = 0;
  std::shared_ptr<LoadedKernel> gated_mul;
  std::shared_ptr<LoadedKernel> fused;  // DenseKernels::FusedGatedUp, where it applies
  cublasLtHandle_t handle = nullptr;
  cublasHandle_t blas = nullptr;  // DenseKernels::CuBlas: every GEMM through cublasGemmEx
  bool tuned = false;             // DenseKernels::CuBlasLtTuned: time cuBLASLt's top algorithms per GEMM
  std::unique_ptr<detail::DeviceBuffer> workspace, g, u;
  // Keyed by (m, n, k, lda, ldb, ldc, b_is_n_by_k, alignments of A, B, C).
  std::map<std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, bool, uint32_t, uint32_t, uint32_t>, std::unique_ptr<GemmPlan>>
      gemm_plans;

  ~Impl() {
    gemm_plans.clear();  // descriptors before the handle
    if (handle != nullptr) cublasLtDestroy(handle);
    if (blas != nullptr) cublasDestroy(blas);
  }

  // Row-major C[m, n] = A[m, k] * op(B) where B is stored row-major as [n, k] (transposed = true,
  // nn.Linear) or [k, n]. cuBLASLt is column-major: compute C^T = op(B)^T-as-stored * A^T.
  //
  // The algorithm: cuBLASLt's first heuristic choice; with `tuned` (and a stream to time on, outside
  // capture) the fastest of its first kTunedCandidates choices, each timed on these operands (one
  // warm-up, median of 3; time_on_stream) with C in scratch memory, so y is never written here.
  const GemmPlan& gemm_plan(const Gemm& g, std::optional<Stream> timing_stream = std::nullopt) {
    const auto [a_ptr, lda, b_ptr, ldb, b_is_n_by_k, c_ptr, ldc, m, n, k] = g;
    // The column-major product's first operand is B as stored, its second A (see below).
    const uint32_t align_first = operand_alignment(b_ptr, ldb), align_second = operand_alignment(a_ptr, lda),
                   align_c = operand_alignment(c_ptr, ldc);
    auto& slot = gemm_plans[{m, n, k, lda, ldb, ldc, b_is_n_by_k, align_first, align_second, align_c}];
    const bool timed = tuned && timing_stream && !capturing(*timing_stream);
    if (slot && (slot->timed || !timed)) return *slot;  // (a choice made untimed, by prepare(), is timed at the first run())
    auto plan = std::make_unique<GemmPlan>();
    const cudaDataType_t type = spec.dtype == DType::BF16 ? CUDA_R_16BF : CUDA_R_16F;
    check_lt(cublasLtMatmulDescCreate(&plan->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F), "cublasLtMatmulDescCreate");
    // First operand of the column-major product: B as stored. [n, k] row-major is k x n column-major
    // (ld = ldb): transpose it to n x k. [k, n] row-major is n x k column-major already.
    const cublasOperation_t op_first = b_is_n_by_k ? CUBLAS_OP_T : CUBLAS_OP_N;
    const cublasOperation_t op_second = CUBLAS_OP_N;
    check_lt(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_first, sizeof(op_first)), "TRANSA");
    check_lt(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_second, sizeof(op_second)), "TRANSB");
    if (b_is_n_by_k) check_lt(cublasLtMatrixLayoutCreate(&plan->layout_b, type, k, n, ldb), "layout B");
    else check_lt(cublasLtMatrixLayoutCreate(&plan->layout_b, type, n, k, ldb), "layout B");
    check_lt(cublasLtMatrixLayoutCreate(&plan->layout_a, type, k, m, lda), "layout A");
    check_lt(cublasLtMatrixLayoutCreate(&plan->layout_c, type, n, m, ldc), "layout C");
    cublasLtMatmulPreference_t pref = nullptr;
    check_lt(cublasLtMatmulPreferenceCreate(&pref), "cublasLtMatmulPreferenceCreate");
    const uint64_t ws = kWorkspaceBytes;
    cublasLtMatmulHeuristicResult_t heuristics[kTunedCandidates]{};
    int found = 0;
    cublasStatus_t set = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws));
    const std::pair<cublasLtMatmulPreferenceAttributes_t, uint32_t> alignments[] = {
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, align_first}, {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, align_second},
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, align_c}, {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, align_c}};
    for (const auto& [attribute, bytes] : alignments)
      if (set == CUBLAS_STATUS_SUCCESS) set = cublasLtMatmulPreferenceSetAttribute(pref, attribute, &bytes, sizeof(bytes));
    const cublasStatus_t got = set != CUBLAS_STATUS_SUCCESS ? set
                               : cublasLtMatmulAlgoGetHeuristic(handle, plan->desc, plan->layout_b, plan->layout_a, plan->layout_c,
                                                                plan->layout_c, pref, timed ? kTunedCandidates : 1, heuristics, &found);
    cublasLtMatmulPreferenceDestroy(pref);
    check_lt(set, "matmul preferences (workspace, alignments)");
    check_lt(got, "cublasLtMatmulAlgoGetHeuristic");
    if (found == 0)
      throw Error(ErrorCode::Unsupported, fmt::format("DenseFfn: cuBLASLt has no algorithm for m={} n={} k={} with operands aligned to "
                                                      "{} / {} / {} bytes", m, n, k, align_second, align_first, align_c));
    plan->algo = heuristics[0].algo;
    if (timed && found > 1) plan->algo = fastest_algo(*plan, g, heuristics, found, *timing_stream);
    plan->timed = timed;
    slot = std::move(plan);
    return *slot;
  }

  static bool capturing(Stream stream) {
    CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
    return detail::Driver::get().cuStreamIsCapturing(reinterpret_cast<CUstream>(stream), &status) != CUDA_SUCCESS ||
           status != CU_STREAM_CAPTURE_STATUS_NONE;
  }

  // The fastest of cuBLASLt's candidates for g, C written to scratch memory of C's shape and stride
  // (g's own output may be the user's y). A candidate that fails to launch is skipped.
  cublasLtMatmulAlgo_t fastest_algo(const GemmPlan& plan, const Gemm& g, const cublasLtMatmulHeuristicResult_t* heuristics,
                                    int found, Stream stream) {
    detail::DeviceBuffer scratch(size_t(g.m - 1) * g.ldc * 2 + size_t(g.n) * 2);
    const float alpha = 1.0f, beta = 0.0f;
    void* c = reinterpret_cast<void*>(scratch.get());
    cublasLtMatmulAlgo_t best = heuristics[0].algo;
    double best_ms = 0;
    for (int i = 0; i < found; ++i) {
      if (heuristics[i].state != CUBLAS_STATUS_SUCCESS || heuristics[i].workspaceSize > kWorkspaceBytes) continue;
      const cublasLtMatmulAlgo_t* algo = &heuristics[i].algo;
      bool failed = false;
      const auto ms = time_on_stream(stream, [&] {
        if (failed) return;
        failed = cublasLtMatmul(handle, plan.desc, &alpha, g.b, plan.layout_b, g.a, plan.layout_a, &beta, c, plan.layout_c, c,
                                plan.layout_c, algo, reinterpret_cast<void*>(workspace->get()), kWorkspaceBytes,
                                reinterpret_cast<cudaStream_t>(stream)) != CUBLAS_STATUS_SUCCESS;
      }, 1, 3);
      if (failed) continue;
      if (best_ms == 0 || ms[1] < best_ms) {
        best_ms = ms[1];
        best = *algo;
      }
    }
    return best;
  }

  void gemm(CUstream stream, const Gemm& g, float beta = 0.0f) {
    const float alpha = 1.0f;
    if (blas != nullptr) {
      // The column-major product C^T [n, m] = op(B) A^T, as for cuBLASLt below; PyTorch's F.linear
      // makes the same call (transa T on the [n, k] weight, transb N).
      const cudaDataType_t type = spec.dtype == DType::BF16 ? CUDA_R_16BF : CUDA_R_16F;
      for (const int64_t v : {g.m, g.n, g.k, g.lda, g.ldb, g.ldc})
        if (v > INT32_MAX)
          throw Error(ErrorCode::Unsupported, fmt::format("DenseFfn (cuBLAS): a GEMM size or stride of {} exceeds cublasGemmEx's "
                                                          "int range (use DenseKernels::CuBlasLt)", v));
      check_blas(cublasSetStream(blas, reinterpret_cast<cudaStream_t>(stream)), "cublasSetStream");
      check_blas(cublasGemmEx(blas, g.b_is_n_by_k ? CUBLAS_OP_T : CUBLAS_OP_N, CUBLAS_OP_N, static_cast<int>(g.n),
                              static_cast<int>(g.m), static_cast<int>(g.k), &alpha, g.b, type, static_cast<int>(g.ldb), g.a, type,
                              static_cast<int>(g.lda), &beta, g.c, type, static_cast<int>(g.ldc), CUBLAS_COMPUTE_32F,
                              CUBLAS_GEMM_DEFAULT_TENSOR_OP),
                 "cublasGemmEx");
      return;
    }
    const GemmPlan& plan = gemm_plan(g, reinterpret_cast<Stream>(stream));
    check_lt(cublasLtMatmul(handle, plan.desc, &alpha, g.b, plan.layout_b, g.a, plan.layout_a, &beta, g.c, plan.layout_c, g.c,
                            plan.layout_c, &plan.algo, reinterpret_cast<void*>(workspace->get()), kWorkspaceBytes,
                            reinterpret_cast<cudaStream_t>(stream)),
             "cublasLtMatmul");
  }
};

detail::DenseKernelSet detail::dense_kernels(Context::Impl& context, const FfnSpec& spec, DenseKernels kernels) {
  DenseKernelSet set;
  set.gated_mul = context.auxiliary(kernels::KernelKind::DenseGatedMul, spec, "DenseFfn");
  const Target& target = context.target;
  if (kernels == DenseKernels::FusedGatedUp &&
      kernels::DenseGatedUpConstraints::allowed(spec.gated, target.sm, target.arch_specific, spec.d_model, spec.d_ff)) {
    try {
      set.fused = context.auxiliary(kernels::KernelKind::DenseGatedUp, spec, "DenseFfn");
    } catch (const Error&) {
      // An optional kernel: if it cannot be had (no bundle holds it and no JIT) or this GPU cannot
      // build or hold it, the cuBLASLt kernels compute the same function (fused() says which).
      set.fused = nullptr;
    }
  }
  return set;
}

bool DenseFfn::fused() const { return impl_ && impl_->fused != nullptr; }

DenseFfn::DenseFfn(Context& context, const FfnSpec& spec, int64_t max_tokens, DenseKernels kernels) : impl_(std::make_unique<Impl>()) {
  Impl& p = *impl_;
  p.context = context_impl(context);
  if (!p.context->gpu) throw Error(ErrorCode::NoDevice, "DenseFfn: needs a GPU (" + p.context->no_gpu_reason + ")");
  if (spec.d_model <= 0 || spec.d_ff <= 0 || max_tokens < 1)
    throw Error(ErrorCode::InvalidArgument, fmt::format("DenseFfn: expected d_model, d_ff, max_tokens >= 1, got {}, {}, {}",
                                                        spec.d_model, spec.d_ff, max_tokens));
  p.spec = twell::kernels::canonical_spec(spec);  // the request key Context::plan makes
  p.max_tokens = max_tokens;
  detail::DenseKernelSet set = detail::dense_kernels(*p.context, p.spec, kernels);
  p.gated_mul = std::move(set.gated_mul);
  p.fused = std::move(set.fused);
  p.context->make_current();
  check_lt(cublasLtCreate(&p.handle), "cublasLtCreate");
  p.workspace = std::make_unique<detail::DeviceBuffer>(kWorkspaceBytes);
  p.tuned = kernels == DenseKernels::CuBlasLtTuned;
  if (kernels == DenseKernels::CuBlas) {
    check_blas(cublasCreate(&p.blas), "cublasCreate");
    check_blas(cublasSetWorkspace(p.blas, reinterpret_cast<void*>(p.workspace->get()), kWorkspaceBytes), "cublasSetWorkspace");
  }
  p.g = std::make_unique<detail::DeviceBuffer>(size_t(max_tokens) * spec.d_ff * 2);
  if (spec.gated) p.u = std::make_unique<detail::DeviceBuffer>(size_t(max_tokens) * spec.d_ff * 2);
}

DenseFfn::~DenseFfn() = default;
DenseFfn::DenseFfn(DenseFfn&&) noexcept = default;

namespace {
// The FFN's GEMMs for these tensors: gate, up (gated), down; g and u are the object's workspaces.
std::vector<Gemm> ffn_gemms(const DenseFfn::Impl& p, const FfnTensors& t, int64_t tokens) {
  const FfnSpec& s = p.spec;
  const int64_t ldx = t.ld_x ? t.ld_x : s.d_model, ldy = t.ld_y ? t.ld_y : s.d_model;
  const bool in_out = s.down_layout == WeightLayout::InOut;
  void* g = reinterpret_cast<void*>(p.g->get());
  std::vector<Gemm> gemms{{t.x, ldx, t.w_gate, t.ld_gate ? t.ld_gate : s.d_model, true, g, s.d_ff, tokens, s.d_ff, s.d_model}};
  if (s.gated)
    gemms.push_back({t.x, ldx, t.w_up, t.ld_up ? t.ld_up : s.d_model, true, reinterpret_cast<void*>(p.u->get()), s.d_ff, tokens,
                     s.d_ff, s.d_model});
  gemms.push_back({g, s.d_ff, t.w_down, t.ld_down ? t.ld_down : (in_out ? s.d_model : s.d_ff), !in_out, t.y, ldy, tokens,
                   s.d_model, s.d_ff});
  return gemms;
}
}  // namespace

void DenseFfn::run_gate(Stream stream, const FfnTensors& t, int64_t tokens) {
  Impl& p = *impl_;
  p.context->make_current();
  check_run_arguments("DenseFfn::run_gate", p.spec, t, tokens, p.max_tokens, RunOperands::Gate);
  if (tokens == 0) return;
  p.gemm(reinterpret_cast<CUstream>(stream), ffn_gemms(p, t, tokens).front());  // g = x Wg^T
}

namespace {
// Whether run() takes the fused gated-up kernel for these GEMMs (ffn_gemms): it is built, and TMA can
// read x, Wg and Wu (16-byte aligned, strides multiples of 8 elements).
bool takes_fused(const DenseFfn::Impl& p, const std::vector<Gemm>& gemms) {
  return p.fused && operand_aligned(gemms[0].a, gemms[0].lda, 8) && operand_aligned(gemms[0].b, gemms[0].ldb, 8) &&
         operand_aligned(gemms[1].b, gemms[1].ldb, 8);
}
}  // namespace

void DenseFfn::prepare(const FfnTensors& t, int64_t tokens) {
  Impl& p = *impl_;
  p.context->make_current();
  check_run_arguments("DenseFfn::run", p.spec, t, tokens, p.max_tokens);
  if (tokens == 0) return;
  const std::vector<Gemm> gemms = ffn_gemms(p, t, tokens);
  // The fused kernel replaces the gate and up GEMMs: then only the down GEMM's algorithm is needed.
  if (p.blas != nullptr) return;  // cublasGemmEx chooses per call
  for (size_t i = takes_fused(p, gemms) ? gemms.size() - 1 : 0; i < gemms.size(); ++i) p.gemm_plan(gemms[i]);
}

void DenseFfn::run(Stream stream, const FfnTensors& t, int64_t tokens, bool accumulate) {
  Impl& p = *impl_;
  const FfnSpec& s = p.spec;
  prepare(t, tokens);  // every check and algorithm choice before the first launch
  if (tokens == 0) return;
  auto cu = reinterpret_cast<CUstream>(stream);
  const std::vector<Gemm> gemms = ffn_gemms(p, t, tokens);
  void* g = reinterpret_cast<void*>(p.g->get());
  if (takes_fused(p, gemms)) {
    // h = act(x Wg^T) * (x Wu^T) in one kernel, into g's workspace; then the down GEMM.
    const kernels::KernelSource& src = p.fused->source;
    const Gemm& gate = gemms[0];
    const Gemm& up = gemms[1];
    device::GateParams gp{};
    gp.x = static_cast<const uint16_t*>(gate.a);
    gp.w_gate = static_cast<const uint16_t*>(gate.b);
    gp.m = tokens;
    gp.ldx = gate.lda;
    gp.ldw = gate.ldb;
    gp.h = static_cast<uint16_t*>(g);
    gp.ldh = s.d_ff;
    detail::encode_tma_map(gp.x_map, s.dtype, gate.a, tokens, s.d_model, gate.lda, src.cta_m, src.cta_k,
                           "DenseFfn::run: cuTensorMapEncodeTiled(x)");
    detail::encode_tma_map(gp.w_map, s.dtype, gate.b, s.d_ff, s.d_model, gate.ldb, src.tile_n / src.cluster_m, src.cta_k,
                           "DenseFfn::run: cuTensorMapEncodeTiled(w_gate)");
    detail::encode_tma_map(gp.u_map, s.dtype, up.b, s.d_ff, s.d_model, up.ldb, src.tile_n / src.cluster_m, src.cta_k,
                           "DenseFfn::run: cuTensorMapEncodeTiled(w_up)");
    void* args[1] = {&gp};
    detail::launch(*p.fused, kernels::LaunchShape{tokens, 0, 0}, args, cu, "DenseFfn::run");
    p.gemm(cu, gemms.back(), accumulate ? 1.0f : 0.0f);
    return;
  }
  for (size_t i = 0; i + 1 < gemms.size(); ++i) p.gemm(cu, gemms[i]);  // g = x Wg^T (and u = x Wu^T)
  void* u = s.gated ? reinterpret_cast<void*>(p.u->get()) : nullptr;  // non-gated: h = act(g)
  device::GatedMulParams mul{static_cast<const uint16_t*>(g), static_cast<const uint16_t*>(u), static_cast<uint16_t*>(g),
                             tokens, s.d_ff, s.d_ff};
  float threshold = s.threshold;
  void* args[2] = {&mul, &threshold};
  detail::launch(*p.gated_mul, kernels::LaunchShape{0, tokens, s.d_ff}, args, cu, "DenseFfn::run (gated multiply)");
  // accumulate: cuBLASLt's D = H Wd^T + beta C with C = D = y (same layout, in place).
  p.gemm(cu, gemms.back(), accumulate ? 1.0f : 0.0f);
}

}  // namespace twell
