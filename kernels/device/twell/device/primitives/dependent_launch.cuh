// Programmatic dependent launch (PTX ISA "griddepcontrol", sm_90): the launcher starts a kernel whose
// KernelSource::dependent_launch is set with the programmatic stream serialization attribute, so its
// CTAs become resident while the kernel before it still runs (as that kernel's CTAs leave their SMs);
// griddepcontrol.wait then blocks until that kernel has completed and its writes are visible, so every
// read of what it wrote and every write it might still read comes after the wait. launch_dependents lets
// the next kernel start launching early. Below sm_90 the launcher does not set the attribute and both
// are no-ops.
#pragma once

namespace twell::device {

__device__ __forceinline__ void wait_for_previous_kernel() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
__device__ __forceinline__ void allow_next_kernel() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

}  // namespace twell::device
