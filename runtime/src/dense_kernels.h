// The dense path's fused gated-up kernel (DenseKernels::FusedGatedUp in twell/dense.h): its CUDA source
// and launch geometry for a spec, made by the runtime from gate_twell_wgmma.cuh (GatedUp). Internal:
// cublas_dense.cpp launches it, the unit tests compile it.
#pragma once
#include "twell/compiler/Generate.h"
#include "twell/spec.h"

namespace twell::detail {

// The kernel for a gated spec on sm_90a with d_model % 64 == 0 and d_ff % 8 == 0 (the caller checks):
// h = act(x Wg^T) * (x Wu^T) into GateParams::h, 128 x 128 CTA tiles, clusters of 2.
compiler::KernelSource fused_gated_up_source(const FfnSpec& spec);

}  // namespace twell::detail
