// NVRTC without a GPU: embedded headers, PTX and cubin output, options, errors.
#include <gtest/gtest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <regex>
#include <string>
#include <vector>

#include "NvrtcCompiler.h"
#include "twell/error.h"

namespace twell::detail {
const std::vector<std::pair<std::string_view, std::string_view>>& embeddedHeaders();
}

namespace {

using twell::Error;
using twell::ErrorCode;
using namespace twell::detail;

// A kernel that needs the embedded params.h and nothing from the toolkit.
constexpr const char* kKernel = R"(#include "twell/device/params.h"
extern "C" __global__ void count_overflow(twell::device::GateParams p) {
  if (threadIdx.x == 0 && blockIdx.x == 0) p.overflow_count[0] = static_cast<uint32_t>(p.m);
}
)";

std::filesystem::path scratchDir() {
  std::string pattern = (std::filesystem::temp_directory_path() / "twell-nvrtc-test-XXXXXX").string();
  if (mkdtemp(pattern.data()) == nullptr) ADD_FAILURE() << "mkdtemp failed for " << pattern;
  return pattern;
}

TEST(Nvrtc, VersionIsMajorDotMinor) {
  EXPECT_TRUE(std::regex_match(nvrtcVersion(), std::regex(R"(\d+\.\d+)"))) << nvrtcVersion();
}

TEST(Nvrtc, BaseOptionsNameTheTargetAndKeepExactMath) {
  const std::vector<std::string> cubin = nvrtcBaseOptions("sm_90a", true);
  const std::vector<std::string> ptx = nvrtcBaseOptions("sm_90a", false);
  EXPECT_NE(std::find(cubin.begin(), cubin.end(), "-arch=sm_90a"), cubin.end());
  EXPECT_NE(std::find(ptx.begin(), ptx.end(), "-arch=compute_90a"), ptx.end());
  EXPECT_EQ(nvrtcBaseOptions("sm_80", false), nvrtcBaseOptions("sm_80", false));
  for (const std::string& option : cubin) {
    EXPECT_EQ(option.find("fast_math"), std::string::npos) << option;
    EXPECT_NE(option.rfind("-I", 0), 0u) << "no include directory on disk: " << option;
  }
  const std::vector<std::string> with_extra = nvrtcCompileOptions("sm_90a", true, {"-DX=1"});
  ASSERT_EQ(with_extra.size(), cubin.size() + 1);
  EXPECT_EQ(with_extra.back(), "-DX=1");
}

TEST(Nvrtc, RejectsMalformedArch) {
  for (const char* arch : {"", "sm_", "90a", "compute_90a", "sm_90b", "sm_9x", "sm_90aa"}) {
    try {
      compileCuda(kKernel, "k.cu", arch, false);
      ADD_FAILURE() << "accepted arch \"" << arch << "\"";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::InvalidArgument) << e.what();
      EXPECT_NE(std::string(e.what()).find("arch"), std::string::npos) << e.what();
    }
  }
}

TEST(Nvrtc, CompilesEmbeddedHeaderToPtx) {
  const NvrtcOutput out = compileCuda(kKernel, "count_overflow.cu", "sm_90a", /*want_cubin=*/false);
  EXPECT_NE(out.ptx.find(".target sm_90a"), std::string::npos) << out.ptx;
  EXPECT_NE(out.ptx.find(".entry count_overflow"), std::string::npos) << out.ptx;
  EXPECT_EQ(out.ptx.find('\0'), std::string::npos);
  EXPECT_TRUE(out.cubin.empty());
  EXPECT_GT(out.compile_ms, 0.0);
}

TEST(Nvrtc, CompilesToSm90aCubin) {
  const NvrtcOutput out = compileCuda(kKernel, "count_overflow.cu", "sm_90a", /*want_cubin=*/true);
  ASSERT_GE(out.cubin.size(), 4u);
  EXPECT_EQ(std::string(out.cubin.data(), 4), "\x7f" "ELF");
  EXPECT_NE(out.ptx.find(".entry count_overflow"), std::string::npos);
}

TEST(Nvrtc, ExtraOptionsReachTheCompiler) {
  const char* source = "static_assert(TWELL_TEST_VALUE == 7, \"extra option lost\");\n"
                       "extern \"C\" __global__ void k() {}\n";
  EXPECT_NO_THROW(compileCuda(source, "extra.cu", "sm_80", false, {"-DTWELL_TEST_VALUE=7"}));
}

TEST(Nvrtc, PtxAssemblesWithPtxas) {
  const std::filesystem::path ptxas = "/usr/local/cuda/bin/ptxas";
  if (!std::filesystem::exists(ptxas)) GTEST_SKIP() << "ptxas not found at " << ptxas << ": cannot assemble the PTX";
  const NvrtcOutput out = compileCuda(kKernel, "count_overflow.cu", "sm_90a", false);
  const std::filesystem::path dir = scratchDir();
  const std::filesystem::path ptx = dir / "k.ptx", cubin = dir / "k.cubin";
  std::ofstream(ptx) << out.ptx;
  const std::string command = ptxas.string() + " -arch=sm_90a " + ptx.string() + " -o " + cubin.string() + " 2>&1";
  const int status = std::system(command.c_str());
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << command << " exited with status " << status;
  EXPECT_GT(std::filesystem::file_size(cubin), 0u);
  std::filesystem::remove_all(dir);
}

TEST(Nvrtc, CompileErrorCarriesTheLog) {
  const char* source = "extern \"C\" __global__ void k(int* out) { *out = undefined_symbol; }\n";
  try {
    compileCuda(source, "bad.cu", "sm_90a", true);
    FAIL() << "an undefined identifier compiled";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::Compile);
    const std::string message = e.what();
    EXPECT_NE(message.find("NVRTC failed to compile bad.cu for sm_90a:\n"), std::string::npos) << message;
    EXPECT_NE(message.find("bad.cu(1)"), std::string::npos) << message;
    EXPECT_NE(message.find("identifier \"undefined_symbol\" is undefined"), std::string::npos) << message;
  }
}

TEST(Nvrtc, RejectedOptionIsACompileError) {
  try {
    compileCuda(kKernel, "k.cu", "sm_90a", false, {"--no-such-option"});
    FAIL() << "an unknown option was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::Compile) << e.what();
    EXPECT_NE(std::string(e.what()).find("NVRTC failed to compile k.cu for sm_90a"), std::string::npos) << e.what();
  }
}

TEST(Nvrtc, IncludesComeOnlyFromEmbeddedHeaders) {
  // A header that exists in the working directory must not be found: sources live in memory.
  const std::filesystem::path dir = scratchDir();
  std::ofstream(dir / "on_disk_only.h") << "#define ON_DISK 1\n";
  const std::filesystem::path cwd = std::filesystem::current_path();
  std::filesystem::current_path(dir);
  std::string message;
  try {
    compileCuda("#include \"on_disk_only.h\"\n__global__ void k() {}\n", "disk.cu", "sm_90a", false);
  } catch (const Error& e) {
    message = e.what();
  }
  std::filesystem::current_path(cwd);
  EXPECT_NE(message.find("could not open source file \"on_disk_only.h\""), std::string::npos) << message;
  std::filesystem::remove_all(dir);
}

// Every device header compiles on its own, as the first include of a translation unit.
TEST(Nvrtc, EveryEmbeddedHeaderCompilesStandalone) {
  ASSERT_FALSE(embeddedHeaders().empty());
  for (const auto& [name, content] : embeddedHeaders()) {
    const std::string source = "#include \"" + std::string(name) + "\"\n";
    try {
      compileCuda(source, std::string(name) + ".check.cu", "sm_90a", false);
    } catch (const Error& e) {
      ADD_FAILURE() << name << ": " << e.what();
    }
  }
}

}  // namespace
