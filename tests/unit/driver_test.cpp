// The lazily loaded CUDA driver on a machine that may have none: nothing may throw on the probing
// path, and the failure must say what is missing.
#include <gtest/gtest.h>

#include <dlfcn.h>

#include <string>

#include "driver.h"
#include "twell/error.h"

namespace {

using twell::Error;
using twell::ErrorCode;
using namespace twell::detail;

bool libcudaLoadable() {
  void* handle = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (handle != nullptr) dlclose(handle);
  return handle != nullptr;
}

TEST(Driver, AvailableNeverThrows) {
  bool available = true;
  EXPECT_NO_THROW(available = Driver::available());
  EXPECT_EQ(available, Driver::available());  // the outcome is remembered
  if (!libcudaLoadable()) {
    EXPECT_FALSE(available);
  }
}

TEST(Driver, GetThrowsNoDeviceNamingLibcuda) {
  if (libcudaLoadable()) GTEST_SKIP() << "libcuda.so.1 is present on this machine: the no-driver path cannot be tested";
  for (int attempt = 0; attempt < 2; ++attempt) {  // the second call rethrows the remembered failure
    try {
      Driver::get();
      FAIL() << "Driver::get() succeeded without libcuda.so.1";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::NoDevice);
      EXPECT_NE(std::string(e.what()).find("libcuda.so.1"), std::string::npos) << e.what();
      EXPECT_EQ(Driver::unavailable_reason(), e.what());
    }
  }
}

TEST(Driver, WithADriverGetDescribesIt) {
  if (!Driver::available()) GTEST_SKIP() << "no CUDA driver or device on this machine";
  const Driver& cu = Driver::get();
  EXPECT_EQ(Driver::unavailable_reason(), "");
  EXPECT_GE(cu.driver_version, 12000);
  EXPECT_GE(cu.device_count, 1);
  EXPECT_NE(cu.cuMemAlloc, nullptr);
  EXPECT_NE(cu.cuLaunchKernel, nullptr);
}

TEST(Driver, CheckPassesSuccessAndNamesTheCallOnFailure) {
  EXPECT_NO_THROW(check(CUDA_SUCCESS, "cuMemAlloc"));
  try {
    check(CUDA_ERROR_INVALID_VALUE, "cuMemAlloc(64 bytes)");
    FAIL() << "check() accepted an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::Cuda);
    const std::string message = e.what();
    EXPECT_EQ(message.rfind("cuMemAlloc(64 bytes): ", 0), 0u) << message;
    const char* expected = Driver::available() ? "CUDA_ERROR_INVALID_VALUE" : "CUresult 1";
    EXPECT_NE(message.find(expected), std::string::npos) << message;
  }
}

TEST(Driver, EmptyDeviceBufferNeedsNoDriver) {
  DeviceBuffer none;
  EXPECT_EQ(none.get(), 0u);
  EXPECT_EQ(none.bytes(), 0u);
  EXPECT_FALSE(none);
  DeviceBuffer zero(0);
  EXPECT_FALSE(zero);
  DeviceBuffer moved(std::move(zero));
  EXPECT_FALSE(moved);
}

TEST(Driver, WithoutADriverAllocationAndContextsThrowNoDevice) {
  if (Driver::available()) GTEST_SKIP() << "a CUDA device is present: the no-driver path cannot be tested";
  try {
    DeviceBuffer buffer(256);
    FAIL() << "allocated without a driver";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::NoDevice) << e.what();
  }
  try {
    primary_context(0);
    FAIL() << "got a context without a driver";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::NoDevice) << e.what();
  }
}

}  // namespace
