// The twell kernels of the dense path (twell/dense.h), obtained like any other (bundle or JIT): one
// place decides which ones a spec needs, for DenseFfn and for the plans that record them in bundles.
#pragma once
#include <memory>

#include "context_impl.h"
#include "twell/dense.h"

namespace twell::detail {

struct DenseKernelSet {
  std::shared_ptr<LoadedKernel> gated_mul;  // DenseGatedMul: h = act(g) * u after cuBLASLt's GEMMs
  std::shared_ptr<LoadedKernel> fused;      // DenseGatedUp where it applies, else null
};

// DenseGatedMul always; DenseGatedUp for DenseKernels::FusedGatedUp where DenseGatedUpConstraints
// allow it (null where not, or where it could not be obtained or loaded: it is optional, the cuBLASLt
// kernels compute the same function). Throws what obtaining DenseGatedMul throws.
DenseKernelSet dense_kernels(Context::Impl& context, const FfnSpec& spec, DenseKernels kernels);

}  // namespace twell::detail
