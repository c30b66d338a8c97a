#include "NvrtcCompiler.h"

#include <nvrtc.h>

#include <cctype>
#include <chrono>
#include <memory>
#include <utility>

#include "twell/error.h"

namespace twell::detail {

namespace {

// NUL-terminated copies of the embedded headers in the form nvrtcCreateProgram takes, built once.
struct HeaderTable {
  std::vector<std::string> names, contents;
  std::vector<const char*> name_ptrs, content_ptrs;

  HeaderTable() {
    for (const auto& [name, content] : embeddedHeaders()) {
      names.emplace_back(name);
      contents.emplace_back(content);
    }
    for (size_t i = 0; i < names.size(); ++i) {
      name_ptrs.push_back(names[i].c_str());
      content_ptrs.push_back(contents[i].c_str());
    }
  }
};

const HeaderTable& headerTable() {
  static const HeaderTable table;
  return table;
}

// "sm_" digits, then at most one of 'a' (arch-specific) or 'f' (family-specific).
void checkArch(std::string_view arch) {
  bool ok = arch.size() > 3 && arch.substr(0, 3) == "sm_";
  size_t i = 3;
  while (ok && i < arch.size() && std::isdigit(static_cast<unsigned char>(arch[i]))) ++i;
  ok = ok && i > 3 && (i == arch.size() || (i + 1 == arch.size() && (arch[i] == 'a' || arch[i] == 'f')));
  if (!ok)
    throw Error(ErrorCode::InvalidArgument,
                "compileCuda: arch: expected \"sm_<NN>\" with an optional 'a' or 'f' suffix (e.g. \"sm_90a\"), got \"" +
                    std::string(arch) + "\"");
}

struct ProgramDeleter {
  void operator()(nvrtcProgram program) const { nvrtcDestroyProgram(&program); }
};
using Program = std::unique_ptr<std::remove_pointer_t<nvrtcProgram>, ProgramDeleter>;

[[noreturn]] void fail(std::string_view call, nvrtcResult result, std::string_view name, std::string_view arch) {
  throw Error(ErrorCode::Compile, std::string(call) + " failed for " + std::string(name) + " (" + std::string(arch) +
                                      "): " + nvrtcGetErrorString(result));
}

std::string programLog(nvrtcProgram program) {
  size_t size = 0;
  if (nvrtcGetProgramLogSize(program, &size) != NVRTC_SUCCESS || size <= 1) return {};
  std::string log(size, '\0');
  if (nvrtcGetProgramLog(program, log.data()) != NVRTC_SUCCESS) return {};
  while (!log.empty() && (log.back() == '\0' || log.back() == '\n')) log.pop_back();
  return log;
}

}  // namespace

std::vector<std::string> nvrtcBaseOptions(std::string_view arch, bool want_cubin) {
  checkArch(arch);
  std::string target = want_cubin ? std::string(arch) : "compute_" + std::string(arch.substr(3));
  return {"--std=c++20", "-arch=" + target, "-default-device", "-lineinfo", "-DNDEBUG", "--no-source-include"};
}

std::vector<std::string> nvrtcCompileOptions(std::string_view arch, bool want_cubin,
                                             const std::vector<std::string>& extra_options) {
  std::vector<std::string> options = nvrtcBaseOptions(arch, want_cubin);
  options.insert(options.end(), extra_options.begin(), extra_options.end());
  return options;
}

NvrtcOutput compileCuda(std::string_view source, std::string_view name, std::string_view arch, bool want_cubin,
                        const std::vector<std::string>& extra_options) {
  const std::vector<std::string> options = nvrtcCompileOptions(arch, want_cubin, extra_options);
  std::vector<const char*> option_ptrs;
  option_ptrs.reserve(options.size());
  for (const std::string& o : options) option_ptrs.push_back(o.c_str());
  const HeaderTable& headers = headerTable();
  const std::string source_text(source), name_text(name);

  const auto start = std::chrono::steady_clock::now();
  nvrtcProgram raw = nullptr;
  if (nvrtcResult r = nvrtcCreateProgram(&raw, source_text.c_str(), name_text.c_str(),
                                         static_cast<int>(headers.names.size()), headers.content_ptrs.data(),
                                         headers.name_ptrs.data());
      r != NVRTC_SUCCESS)
    fail("nvrtcCreateProgram", r, name, arch);
  Program program(raw);

  NvrtcOutput out;
  const nvrtcResult compiled =
      nvrtcCompileProgram(program.get(), static_cast<int>(option_ptrs.size()), option_ptrs.data());
  out.log = programLog(program.get());
  if (compiled != NVRTC_SUCCESS) {
    std::string message = "NVRTC failed to compile " + name_text + " for " + std::string(arch) + ":\n" + out.log;
    if (compiled != NVRTC_ERROR_COMPILATION) message += std::string(out.log.empty() ? "" : "\n") + nvrtcGetErrorString(compiled);
    throw Error(ErrorCode::Compile, message);
  }

  size_t ptx_size = 0;
  if (nvrtcResult r = nvrtcGetPTXSize(program.get(), &ptx_size); r != NVRTC_SUCCESS)
    fail("nvrtcGetPTXSize", r, name, arch);
  out.ptx.resize(ptx_size);
  if (nvrtcResult r = nvrtcGetPTX(program.get(), out.ptx.data()); r != NVRTC_SUCCESS) fail("nvrtcGetPTX", r, name, arch);
  while (!out.ptx.empty() && out.ptx.back() == '\0') out.ptx.pop_back();

  if (want_cubin) {
    size_t cubin_size = 0;
    if (nvrtcResult r = nvrtcGetCUBINSize(program.get(), &cubin_size); r != NVRTC_SUCCESS)
      fail("nvrtcGetCUBINSize", r, name, arch);
    if (cubin_size == 0)
      throw Error(ErrorCode::Compile, "nvrtcGetCUBINSize for " + name_text + " (" + std::string(arch) +
                                          "): expected a cubin for a real arch, got 0 bytes");
    out.cubin.resize(cubin_size);
    if (nvrtcResult r = nvrtcGetCUBIN(program.get(), out.cubin.data()); r != NVRTC_SUCCESS)
      fail("nvrtcGetCUBIN", r, name, arch);
  }
  out.compile_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  return out;
}

std::string nvrtcVersion() {
  int major = 0, minor = 0;
  if (nvrtcResult r = ::nvrtcVersion(&major, &minor); r != NVRTC_SUCCESS)
    throw Error(ErrorCode::Compile, std::string("nvrtcVersion failed: ") + nvrtcGetErrorString(r));
  return std::to_string(major) + "." + std::to_string(minor);
}

}  // namespace twell::detail
