// The one launch path of the runtime: every kernel goes through launch(), with the launch
// configuration its contract gives (twell/kernels/launch.h) for the call's size.
#pragma once
#include <cuda.h>

#include "context_impl.h"

namespace twell::detail {

// Launches `k` with `args` (pointers to its parameter blocks, in order) on `stream`, through
// cuLaunchKernelEx: grid, block and dynamic shared memory from launch_config(k.source, shape,
// k.occupancy), and programmatic stream serialization where the kernel takes a dependent launch
// (KernelSource::dependent_launch; it waits with griddepcontrol.wait). A kernel's cluster size is
// compiled in (__cluster_dims__), so no cluster attribute is passed. Throws Error(Cuda) naming `who`
// and the kernel when the driver refuses.
void launch(const LoadedKernel& k, const kernels::LaunchShape& shape, void** args, CUstream stream, const char* who);

// out = in^T for a [rows, cols] matrix of 16-bit values (row strides ld_in >= cols, ld_out >= rows, in
// elements) with the WeightTranspose kernel `k` (device/aux/transpose.cuh): an nn.Linear Wd into the consumer's Wd^T
// rows, and dWd^T back into the weight's layout. Throws as launch().
void launch_transpose16(const LoadedKernel& k, const void* in, int64_t rows, int64_t cols, int64_t ld_in, void* out,
                        int64_t ld_out, CUstream stream, const char* who);

}  // namespace twell::detail
