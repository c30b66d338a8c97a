// The dense baseline: the same FFN through cuBLASLt GEMMs (bf16/fp16 in, fp32 compute; three for a
// gated layer, two for a non-gated one) and one elementwise kernel h = act(g) * u, or act(g) (with
// the same sparsity predicate, so it computes the function the TwELL path computes). Used by twellc, the tests and the benchmarks as the reference
// on the GPU, and (issue 3) as the path the plan dispatches when sparse would be slower.
#pragma once
#include <memory>

#include "twell/plan.h"
#include "twell/spec.h"

namespace twell {

class Context;

class DenseFfn {
 public:
  // Compiles (or loads from the cache) the elementwise kernel and creates the cuBLASLt handle.
  // Throws Error(NoDevice) without a GPU, Error(InvalidArgument) for an illegal spec.
  DenseFfn(Context& context, const FfnSpec& spec, int64_t max_tokens);
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

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace twell
