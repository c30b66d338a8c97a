// Compile checks of generated kernels without a GPU, shared by the unit tests: NVRTC to a cubin with
// ptxas -v, and no register spill in its report (a spill around the wgmma accumulators returned wrong
// sums on the H200, bench/README.md v8; elsewhere it is a silent slowdown).
#pragma once
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <regex>
#include <string>

#include "NvrtcCompiler.h"
#include "twell/compiler/Generate.h"
#include "twell/kernels/validate.h"

namespace twell::testing {

// The spill counts ptxas reports for every function in `log` ("N bytes spill stores, M bytes spill
// loads"), each at most `allowed` (0 but for a kernel whose exception is documented where it is
// checked); fails the test if the log has none (ptxas -v did not reach the log).
inline void expect_no_spills(const std::string& log, const std::string& what, int allowed = 0) {
  static const std::regex spills(R"((\d+) bytes spill stores, (\d+) bytes spill loads)");
  int reports = 0;
  for (auto it = std::sregex_iterator(log.begin(), log.end(), spills); it != std::sregex_iterator(); ++it) {
    ++reports;
    EXPECT_LE(std::stoi((*it)[1].str()), allowed) << what << ": " << it->str() << "\n" << log;
    EXPECT_LE(std::stoi((*it)[2].str()), allowed) << what << ": " << it->str() << "\n" << log;
  }
  EXPECT_GT(reports, 0) << what << ": no ptxas resource report in the NVRTC log:\n" << log;
}

// Compiles `k` to a cubin for `arch` through NVRTC with ptxas -v and checks that nothing spilled (at
// most `allowed` bytes, as expect_no_spills).
inline void expect_compiles_without_spills(const compiler::KernelSource& k, const std::string& arch,
                                           const std::string& what, int allowed = 0) {
  const detail::NvrtcOutput out =
      detail::compileCuda(k.source, k.name + ".cu", arch, /*want_cubin=*/true, {"--ptxas-options=-v"});
  EXPECT_FALSE(out.cubin.empty()) << what;
  if (std::getenv("TWELL_TEST_PTXAS")) std::printf("%s: %s\n", what.c_str(), out.log.c_str());  // registers, smem
  expect_no_spills(out.log, what, allowed);
}

// `k` passes its contract for `target` (validate_kernel), then compiles as above.
inline void expect_valid_and_compiles_without_spills(const compiler::KernelSource& k, const Target& target,
                                                     const std::string& what) {
  ASSERT_EQ(kernels::validate_kernel(k, target), "") << what;
  expect_compiles_without_spills(k, target.arch(), what);
}

}  // namespace twell::testing
