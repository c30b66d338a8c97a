#include "driver.h"

#include <dlfcn.h>

#include <algorithm>
#include <mutex>
#include <optional>
#include <vector>

#include "twell/error.h"

namespace twell::detail {
namespace {

constexpr const char* kLibrary = "libcuda.so.1";

// The outcome of the one load attempt: the driver, or the error every get() rethrows.
struct Loaded {
  std::optional<Driver> driver;
  std::string error;
};

template <typename Fn>
Fn symbol(void* library, const char* name) {
  return reinterpret_cast<Fn>(dlsym(library, name));
}

std::string describe(const Driver& d, CUresult result) {
  const char* name = nullptr;
  const char* text = nullptr;
  if (d.cuGetErrorName(result, &name) != CUDA_SUCCESS || name == nullptr)
    return "CUresult " + std::to_string(static_cast<int>(result));
  std::string out = name;
  if (d.cuGetErrorString(result, &text) == CUDA_SUCCESS && text != nullptr) out += std::string(": ") + text;
  return out;
}

Loaded load() {
  Loaded out;
  // The handle is never closed: function pointers into the driver live as long as the process.
  void* library = dlopen(kLibrary, RTLD_NOW | RTLD_LOCAL);
  if (library == nullptr) {
    const char* why = dlerror();
    out.error = std::string("CUDA driver: ") + kLibrary + " not found: " + (why ? why : "dlopen failed") +
                " (compile-only paths still work)";
    return out;
  }
  // cuInit, cuDriverGetVersion and cuGetProcAddress_v2 are exported under these exact names by every
  // driver since CUDA 12.0; everything else is looked up through cuGetProcAddress by base name, which
  // picks the versioned variant (_v2, ...) whose ABI matches the requested CUDA version.
  auto init = symbol<decltype(&::cuInit)>(library, "cuInit");
  auto get_version = symbol<decltype(&::cuDriverGetVersion)>(library, "cuDriverGetVersion");
  auto get_proc = symbol<decltype(&::cuGetProcAddress_v2)>(library, "cuGetProcAddress_v2");
  if (init == nullptr || get_version == nullptr || get_proc == nullptr) {
    out.error = std::string("CUDA driver: ") + kLibrary +
                " lacks cuInit/cuDriverGetVersion/cuGetProcAddress_v2: expected a driver for CUDA >= 12.0";
    return out;
  }
  Driver d;
  if (get_version(&d.driver_version) != CUDA_SUCCESS || d.driver_version < 12000) {
    out.error = std::string("CUDA driver: ") + kLibrary + ": expected a driver for CUDA >= 12.0 (12000), got " +
                std::to_string(d.driver_version);
    return out;
  }
  // cuGetProcAddress refuses versions above the driver's own. Up to CUDA_VERSION, every entry point
  // listed has the signature <cuda.h> declares (the _v2 variants all predate 12.0).
  const int abi_version = std::min(d.driver_version, CUDA_VERSION);
  std::string missing;
#define TWELL_RESOLVE_DRIVER_FUNCTION(name)                                                              \
  {                                                                                                      \
    void* fn = nullptr;                                                                                  \
    CUdriverProcAddressQueryResult status = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;                        \
    CUresult r = get_proc(#name, &fn, abi_version, CU_GET_PROC_ADDRESS_LEGACY_STREAM, &status);          \
    if (r != CUDA_SUCCESS || status != CU_GET_PROC_ADDRESS_SUCCESS || fn == nullptr)                     \
      missing += std::string(missing.empty() ? "" : ", ") + #name + " (CUresult " +                      \
                 std::to_string(static_cast<int>(r)) + ", status " + std::to_string(static_cast<int>(status)) + \
                 ")";                                                                                    \
    d.name = reinterpret_cast<decltype(d.name)>(fn);                                                     \
  }
  TWELL_CUDA_DRIVER_FUNCTIONS(TWELL_RESOLVE_DRIVER_FUNCTION)
#undef TWELL_RESOLVE_DRIVER_FUNCTION
  if (!missing.empty()) {
    out.error = "CUDA driver " + std::to_string(d.driver_version) + ": cuGetProcAddress found no entry point for " +
                missing + " at CUDA version " + std::to_string(abi_version);
    return out;
  }
  if (CUresult r = d.cuInit(0); r != CUDA_SUCCESS) {
    out.error = "CUDA driver: cuInit failed: " + describe(d, r);
    return out;
  }
  if (CUresult r = d.cuDeviceGetCount(&d.device_count); r != CUDA_SUCCESS) {
    out.error = "CUDA driver: cuDeviceGetCount failed: " + describe(d, r);
    return out;
  }
  if (d.device_count < 1) {
    out.error = "CUDA driver: no CUDA device: expected at least 1, cuDeviceGetCount gave " +
                std::to_string(d.device_count);
    return out;
  }
  out.driver = d;
  return out;
}

const Loaded& loaded() {
  static const Loaded instance = load();
  return instance;
}

}  // namespace

const Driver& Driver::get() {
  const Loaded& l = loaded();
  if (!l.driver) throw Error(ErrorCode::NoDevice, l.error);
  return *l.driver;
}

bool Driver::available() noexcept {
  try {
    return loaded().driver.has_value();
  } catch (...) {  // allocation failure while building the message
    return false;
  }
}

std::string Driver::unavailable_reason() { return loaded().error; }

std::string cuda_error_text(CUresult result) {
  const Loaded& l = loaded();
  if (!l.driver) return "CUresult " + std::to_string(static_cast<int>(result));
  return describe(*l.driver, result);
}

void throw_cuda_error(CUresult result, const char* what) {
  throw Error(ErrorCode::Cuda, std::string(what) + ": " + cuda_error_text(result));
}

CUcontext primary_context(int device) {
  const Driver& cu = Driver::get();
  if (device < 0 || device >= cu.device_count)
    throw Error(ErrorCode::InvalidArgument, "primary_context: device: expected an ordinal in [0, " +
                                                std::to_string(cu.device_count) + "), got " + std::to_string(device));
  static std::mutex mutex;
  static std::vector<CUcontext> contexts;
  CUcontext context = nullptr;
  {
    std::lock_guard lock(mutex);
    if (contexts.empty()) contexts.assign(static_cast<size_t>(cu.device_count), nullptr);
    CUcontext& slot = contexts[static_cast<size_t>(device)];
    if (slot == nullptr) {
      CUdevice handle = 0;
      check(cu.cuDeviceGet(&handle, device), "cuDeviceGet");
      check(cu.cuDevicePrimaryCtxRetain(&slot, handle), "cuDevicePrimaryCtxRetain");
    }
    context = slot;
  }
  CUcontext current = nullptr;
  check(cu.cuCtxGetCurrent(&current), "cuCtxGetCurrent");
  if (current != context) check(cu.cuCtxSetCurrent(context), "cuCtxSetCurrent");
  return context;
}

ContextGuard::ContextGuard(CUcontext context) {
  const Driver& cu = Driver::get();
  check(cu.cuCtxGetCurrent(&previous_), "cuCtxGetCurrent");
  if (previous_ != context) {
    check(cu.cuCtxSetCurrent(context), "cuCtxSetCurrent");
    switched_ = true;
  }
}

ContextGuard::~ContextGuard() {
  // A guard only exists after Driver::get() succeeded; a failure to restore cannot be reported here.
  if (switched_) (void)Driver::get().cuCtxSetCurrent(previous_);
}

DeviceBuffer::DeviceBuffer(size_t bytes) {
  if (bytes == 0) return;
  const Driver& cu = Driver::get();
  if (CUresult r = cu.cuMemAlloc(&ptr_, bytes); r != CUDA_SUCCESS) {
    ptr_ = 0;
    throw Error(ErrorCode::Cuda, "cuMemAlloc: " + std::to_string(bytes) + " bytes: " + cuda_error_text(r));
  }
  bytes_ = bytes;
}

DeviceBuffer::~DeviceBuffer() { reset(); }

DeviceBuffer::DeviceBuffer(DeviceBuffer&& other) noexcept : ptr_(other.ptr_), bytes_(other.bytes_) {
  other.ptr_ = 0;
  other.bytes_ = 0;
}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& other) noexcept {
  if (this != &other) {
    reset();
    ptr_ = other.ptr_;
    bytes_ = other.bytes_;
    other.ptr_ = 0;
    other.bytes_ = 0;
  }
  return *this;
}

void ensure_bytes(DeviceBuffer& b, size_t bytes, CUstream stream, const char* who) {
  if (b.bytes() >= std::max<size_t>(bytes, 1)) return;
  if (b) check(Driver::get().cuStreamSynchronize(stream), (std::string(who) + ": cuStreamSynchronize").c_str());
  b.reset();
  b = DeviceBuffer(std::max<size_t>(bytes, 1));
}

void DeviceBuffer::reset() noexcept {
  // A non-zero pointer implies Driver::get() succeeded when it was allocated.
  if (ptr_ != 0) (void)loaded().driver->cuMemFree(ptr_);
  ptr_ = 0;
  bytes_ = 0;
}

}  // namespace twell::detail
