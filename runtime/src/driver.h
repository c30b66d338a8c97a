// The CUDA driver API, loaded lazily from libcuda.so.1 (ARCHITECTURE.md, "Launch").
//
// libtwell never links libcuda: every compile-only path (twellc --emit=ptx, the unit tests, CI) must run
// on machines without a GPU driver. The first Driver::get() dlopens libcuda.so.1, resolves the entry
// points below with cuGetProcAddress and calls cuInit(0). <cuda.h> is used for types and prototypes only.
//
// Calls go through the function pointers under their usual names, e.g.
//   const auto& cu = Driver::get();
//   check(cu.cuMemAlloc(&ptr, bytes), "cuMemAlloc");
// <cuda.h> maps versioned names with macros (cuMemAlloc -> cuMemAlloc_v2); the members are declared
// through the same macros, so `cu.cuMemAlloc` names the member that holds the _v2 entry point.
#pragma once
#include <cuda.h>

#include <cstddef>
#include <string>

namespace twell::detail {

// Every driver entry point libtwell uses. Resolved by base name with cuGetProcAddress at the ABI of the
// <cuda.h> these pointers are declared with, and the legacy default-stream semantics (what cuBLASLt
// and a default-built cudart use for stream 0).
#define TWELL_CUDA_DRIVER_FUNCTIONS(X)                                                               \
  X(cuInit)                                                                                          \
  X(cuDriverGetVersion)                                                                              \
  X(cuDeviceGetCount)                                                                                \
  X(cuDeviceGet)                                                                                     \
  X(cuDeviceGetName)                                                                                 \
  X(cuDeviceGetAttribute)                                                                            \
  X(cuDevicePrimaryCtxRetain)                                                                        \
  X(cuDevicePrimaryCtxRelease)                                                                       \
  X(cuCtxSetCurrent)                                                                                 \
  X(cuCtxGetCurrent)                                                                                 \
  X(cuCtxSynchronize)                                                                                \
  X(cuModuleLoadData)                                                                                \
  X(cuModuleLoadDataEx)                                                                              \
  X(cuModuleUnload)                                                                                  \
  X(cuModuleGetFunction)                                                                             \
  X(cuFuncSetAttribute)                                                                              \
  X(cuOccupancyMaxActiveBlocksPerMultiprocessor)                                                     \
  X(cuOccupancyMaxActiveClusters)                                                                    \
  X(cuLaunchKernel)                                                                                  \
  X(cuLaunchKernelEx)                                                                                \
  X(cuMemAlloc)                                                                                      \
  X(cuMemFree)                                                                                       \
  X(cuMemAllocHost)                                                                                  \
  X(cuMemFreeHost)                                                                                   \
  X(cuMemcpyHtoD)                                                                                    \
  X(cuMemcpyDtoH)                                                                                    \
  X(cuMemcpyHtoDAsync)                                                                               \
  X(cuMemcpyDtoHAsync)                                                                               \
  X(cuMemcpyDtoD)                                                                                    \
  X(cuMemsetD8)                                                                                      \
  X(cuMemsetD8Async)                                                                                 \
  X(cuMemsetD32Async)                                                                                \
  X(cuMemsetD16)                                                                                     \
  X(cuMemsetD16Async)                                                                                \
  X(cuMemsetD2D8Async)                                                                               \
  X(cuStreamCreate)                                                                                  \
  X(cuStreamDestroy)                                                                                 \
  X(cuStreamSynchronize)                                                                             \
  X(cuLaunchHostFunc)                                                                                \
  X(cuStreamIsCapturing)                                                                             \
  X(cuEventCreate)                                                                                   \
  X(cuEventDestroy)                                                                                  \
  X(cuEventRecord)                                                                                   \
  X(cuEventSynchronize)                                                                              \
  X(cuEventElapsedTime)                                                                              \
  X(cuGetErrorName)                                                                                  \
  X(cuGetErrorString)                                                                                \
  X(cuPointerGetAttribute)                                                                           \
  X(cuMemGetInfo)                                                                                     \
  X(cuStreamBeginCapture)                                                                            \
  X(cuStreamEndCapture)                                                                              \
  X(cuGraphInstantiateWithFlags)                                                                     \
  X(cuGraphLaunch)                                                                                   \
  X(cuGraphExecDestroy)                                                                              \
  X(cuGraphDestroy)                                                                                  \
  X(cuTensorMapEncodeTiled)

struct Driver {
#define TWELL_DECLARE_DRIVER_FUNCTION(name) decltype(&::name) name = nullptr;
  TWELL_CUDA_DRIVER_FUNCTIONS(TWELL_DECLARE_DRIVER_FUNCTION)
#undef TWELL_DECLARE_DRIVER_FUNCTION

  int driver_version = 0;  // cuDriverGetVersion: 1000 * major + 10 * minor, e.g. 13000
  int device_count = 0;    // >= 1 once get() succeeded

  // The process-wide driver, loaded on the first call (thread-safe; later calls are one atomic load).
  // Throws Error(NoDevice) when libcuda.so.1 cannot be opened (the message carries dlerror()), when it
  // predates CUDA 12.0 or lacks an entry point, when cuInit(0) fails, or when there is no device. A
  // failure is remembered: every later call throws the same error without retrying.
  static const Driver& get();
  // True iff get() succeeds (driver loaded, at least one device). Never throws.
  static bool available() noexcept;
  // Why get() fails (the message it throws), or "" when the driver is available. Never throws
  // Error; for Context::no_gpu_reason and skip messages.
  static std::string unavailable_reason();
};

// "CUDA_ERROR_OUT_OF_MEMORY: out of memory"; "CUresult 2" when the driver is not loaded.
std::string cuda_error_text(CUresult result);

[[noreturn]] void throw_cuda_error(CUresult result, const char* what);

// Throws Error(Cuda, "<what>: CUDA_ERROR_NAME: description") unless result is CUDA_SUCCESS.
inline void check(CUresult result, const char* what) {
  if (result != CUDA_SUCCESS) [[unlikely]]
    throw_cuda_error(result, what);
}

// The primary context of `device` (the one cudart and cuBLASLt share), retained on the first call for
// that device and held for the life of the process (releasing it from a static destructor would race
// the driver's own teardown), and made current on the calling thread. Thread-safe.
// Throws Error(NoDevice) without a driver, Error(InvalidArgument) for an ordinal outside
// [0, device_count), Error(Cuda) when the driver refuses.
CUcontext primary_context(int device);

// Makes `context` current on the calling thread and restores the previously current one on scope
// exit, so library calls leave the caller's current context as they found it. Not movable.
class ContextGuard {
 public:
  explicit ContextGuard(CUcontext context);
  ~ContextGuard();
  ContextGuard(const ContextGuard&) = delete;
  ContextGuard& operator=(const ContextGuard&) = delete;

 private:
  CUcontext previous_ = nullptr;
  bool switched_ = false;
};

// Device memory from cuMemAlloc (256-byte aligned), freed on destruction. Move-only. Allocation needs a
// current context (see primary_context); a zero-byte buffer holds no allocation and get() == 0.
// Throws Error(NoDevice) without a driver, Error(Cuda) naming the size when cuMemAlloc fails.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t bytes);
  ~DeviceBuffer();
  DeviceBuffer(DeviceBuffer&& other) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  CUdeviceptr get() const noexcept { return ptr_; }
  size_t bytes() const noexcept { return bytes_; }
  explicit operator bool() const noexcept { return ptr_ != 0; }
  // Frees the allocation now (errors from cuMemFree are ignored, as in the destructor).
  void reset() noexcept;

 private:
  CUdeviceptr ptr_ = 0;
  size_t bytes_ = 0;
};

// Makes `b` hold at least `bytes` (at least 1): where smaller, it is replaced by a new allocation after
// the stream's earlier work (which may still read the old one) has finished. `who` prefixes errors.
void ensure_bytes(DeviceBuffer& b, size_t bytes, CUstream stream, const char* who);

}  // namespace twell::detail
