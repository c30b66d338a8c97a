#include "launcher.h"

#include <fmt/format.h>

#include "twell/device/params.h"

namespace twell::detail {

void launch(const LoadedKernel& k, const kernels::LaunchShape& shape, void** args, CUstream stream, const char* who) {
  const kernels::LaunchConfig c = kernels::launch_config(k.source, shape, k.occupancy);
  CUlaunchAttribute attributes[2]{};
  unsigned count = 0;
  if (c.dependent_launch) {
    attributes[count].id = CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
    attributes[count++].value.programmaticStreamSerializationAllowed = 1;
  }
  if (c.cooperative) {  // the driver refuses the launch unless every CTA can be resident at once
    attributes[count].id = CU_LAUNCH_ATTRIBUTE_COOPERATIVE;
    attributes[count++].value.cooperative = 1;
  }
  CUlaunchConfig config{};
  config.gridDimX = c.grid_x;
  config.gridDimY = c.grid_y;
  config.gridDimZ = c.grid_z;
  config.blockDimX = c.block_x;
  config.blockDimY = c.block_y;
  config.blockDimZ = c.block_z;
  config.sharedMemBytes = c.shared_bytes;
  config.hStream = stream;
  config.attrs = attributes;
  config.numAttrs = count;
  // The message is formatted only on failure: this is every kernel's host path.
  if (const CUresult r = Driver::get().cuLaunchKernelEx(&config, k.function, args, nullptr); r != CUDA_SUCCESS)
    check(r, fmt::format("{}: launching {} ({})", who, k.source.name, c.describe()).c_str());
}

void launch_transpose16(const LoadedKernel& k, const void* in, int64_t rows, int64_t cols, int64_t ld_in, void* out,
                        int64_t ld_out, CUstream stream, const char* who) {
  device::TransposeParams p{static_cast<const uint16_t*>(in), static_cast<uint16_t*>(out), rows, cols, ld_in, ld_out};
  void* args[1] = {&p};
  launch(k, kernels::LaunchShape{0, rows, cols}, args, stream, who);
}

}  // namespace twell::detail
