// The dense path: the same FFN through cuBLASLt GEMMs (bf16/fp16 in, fp32 compute; three for a gated
// layer, two for a non-gated one) and one elementwise kernel h = act(g) * u, or act(g) (with the same
// sparsity predicate, so it computes the function the TwELL path computes); or, with
// DenseKernels::FusedGatedUp, the gate and up GEMMs and the elementwise step in one twell kernel. The
// cuBLASLt kernels are the reference on the GPU of twellc, the tests and the benchmarks; the fused
// ones (above 64 tokens; cuBLASLt's at fewer) are the path FfnPlan dispatches when sparse would be
// slower, and its dense neurons.
#pragma once
#include <memory>

#include "twell/plan.h"
#include "twell/spec.h"

namespace twell {

class Context;

// Which kernels compute g = x Wg^T, u = x Wu^T and h = act(g) * u (the down GEMM is cuBLASLt's).
enum class DenseKernels {
  // Two cuBLASLt GEMMs and an elementwise kernel (cuBLASLt's first heuristic algorithm, 32 MiB
  // workspace): the reference of the GPU tests.
  CuBlasLt,
  // One twell kernel (gate_twell_wgmma.cuh with GatedUp: persistent, TMA + wgmma, clusters of 2, both
  // weight tiles in each ring stage, h = act(g) * u in the epilogue with the same roundings), so x is
  // read once and g and u never reach memory. Where it applies: a gated spec on sm_90a, d_model % 64
  // == 0, d_ff % 8 == 0, and per call 16-byte aligned x, w_gate, w_up with row strides that are
  // multiples of 8 elements, and calls of more than 64 tokens (at 1-64 its 128-row tiles are mostly
  // padding: slower than cuBLASLt by 7-13 us on the H200, bench/README.md v69); elsewhere run() takes
  // the CuBlasLt kernels (also when the GPU cannot build or hold the fused kernel: fused() is then
  // false). What FfnPlan's dense path and its dense neurons (PlanOptions::dense_neurons) use.
  FusedGatedUp,
  // The GEMMs as PyTorch's F.linear runs them (at::cuda::blas::gemm: cublasGemmEx, fp32 compute,
  // CUBLAS_GEMM_DEFAULT_TENSOR_OP, a 32 MiB workspace) and the elementwise kernel: the baseline that
  // twellc run and ffn_bench report against, the dense computation a PyTorch user gets. On the H200
  // PyTorch's cuBLAS path took 14.1 ms for the paper's FFN at M = 131072 where CuBlasLt took 15.0
  // (bench/README.md v30: cuBLAS and cuBLASLt pick different algorithms for these shapes).
  CuBlas,
  // The CuBlasLt kernels, each GEMM with the fastest of cuBLASLt's first 8 heuristic algorithms for
  // its shape, stride and alignment, timed on the operands of the first run() (one warm-up, median of
  // 3, C in scratch memory; not during CUDA-graph capture, where the first choice is taken): the
  // fastest dense computation NVIDIA's libraries give for the FFN, so the honest baseline of twellc
  // run and ffn_bench ("the faster of PyTorch's dense and cuBLASLt", STYLE.md). The first run() of a
  // shape costs the timing (about 8 x 4 calls of each GEMM) and a scratch buffer of C's size; which
  // algorithm wins may differ between processes (results then differ in rounding, not beyond).
  CuBlasLtTuned,
};

class DenseFfn {
 public:
  // Compiles (or loads from the cache) the elementwise kernel (and the fused kernel) and creates the
  // cuBLASLt handle. Throws Error(NoDevice) without a GPU, Error(InvalidArgument) for an illegal spec.
  DenseFfn(Context& context, const FfnSpec& spec, int64_t max_tokens, DenseKernels kernels = DenseKernels::CuBlasLt);
  ~DenseFfn();
  DenseFfn(DenseFfn&&) noexcept;

  // y = FFN(x), stream-ordered; the same argument rules as FfnPlan::run. accumulate: y += FFN(x)
  // instead: the down GEMM adds the y it finds (already rounded to the dtype) in fp32 and rounds the
  // sum, so y is rounded twice (how FfnPlan adds its dense neurons to the TwELL part's y).
  void run(Stream stream, const FfnTensors& t, int64_t tokens, bool accumulate = false);

  // run()'s argument checks and cuBLASLt algorithm choices for these operands (their alignment
  // included), without launching: what can fail before any launch fails here. run() calls it first;
  // FfnPlan calls it for its dense neurons before its TwELL kernels write y.
  void prepare(const FfnTensors& t, int64_t tokens);

  // Only the gate GEMM g = x Wg^T into the object's workspace (the dense baseline of D2T).
  void run_gate(Stream stream, const FfnTensors& t, int64_t tokens);

  // Whether the fused gated-up kernel was built for this spec and target (DenseKernels::FusedGatedUp).
  bool fused() const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace twell
