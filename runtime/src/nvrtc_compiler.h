// Generated CUDA C++ -> PTX or cubin with NVRTC (ARCHITECTURE.md, "Compile").
//
// The file is not called nvrtc.h: runtime/src is on libtwell's -I path, ahead of the toolkit's
// -isystem one, so a runtime/src/nvrtc.h would shadow the toolkit's <nvrtc.h>.
//
// Compilation needs no GPU and no file on disk: the device headers (runtime/device, embedded at build
// time, see cmake/EmbedHeaders.cmake) are handed to NVRTC from memory, and the source's own directory
// is kept off the include path, so `#include "twell/device/params.h"` resolves only to the embedded
// copy. Generated code must not include toolkit headers (cuda_bf16.h, CCCL): NVRTC has none built in.
#pragma once
#include <string>
#include <string_view>
#include <vector>

namespace twell::detail {

struct NvrtcOutput {
  std::string ptx;          // PTX text, without the terminating NUL; always present
  std::vector<char> cubin;  // ELF for the real arch; empty unless want_cubin
  std::string log;          // NVRTC's log (warnings), empty when there was nothing to say
  double compile_ms = 0;    // wall time of nvrtcCreateProgram .. last nvrtcGet*, milliseconds
};

// The NVRTC options compileCuda passes ahead of extra_options, in order. Part of a kernel's cache key
// (with nvrtcVersion()), so any change here changes every key.
//   --std=c++20           generated code and device headers may use C++20
//   -arch=sm_90a          want_cubin: a real arch gives the cubin (and the PTX) in one compile;
//   -arch=compute_90a     otherwise the virtual arch, PTX only (the "a" suffix is part of the target)
//   -default-device       unannotated (constexpr, inline) helpers in headers are device functions
//   -lineinfo             source lines in PTX/cubin for Nsight Compute; does not change the code
//   -DNDEBUG              device assert() compiled out
//   --no-source-include   the source's directory (the process's cwd: sources are in memory) is not
//                         searched, so includes come only from the embedded headers
// Deliberately absent: --use_fast_math (and --ftz/--prec-div/--prec-sqrt changes): results must match
// the CPU reference exactly; -G; -I of any directory on disk.
// `arch` is "sm_<NN>" with an optional "a" or "f" suffix ("sm_90a", "sm_80"); anything else throws
// Error(InvalidArgument).
std::vector<std::string> nvrtcBaseOptions(std::string_view arch, bool want_cubin);

// nvrtcBaseOptions(arch, want_cubin) followed by extra_options: exactly the list compileCuda passes to
// nvrtcCompileProgram, the one to put in the cache key.
std::vector<std::string> nvrtcCompileOptions(std::string_view arch, bool want_cubin,
                                             const std::vector<std::string>& extra_options = {});

// Compiles one translation unit. `name` labels diagnostics and line info (e.g. "<kernel>.cu").
// Thread-safe (one NVRTC program per call).
// Throws Error(InvalidArgument) for a malformed arch, Error(Compile, "NVRTC failed to compile <name> for
// <arch>:\n<log>") when NVRTC rejects the source or an option, Error(Compile) naming the NVRTC call for
// any other NVRTC failure.
NvrtcOutput compileCuda(std::string_view source, std::string_view name, std::string_view arch, bool want_cubin,
                        const std::vector<std::string>& extra_options = {});

// NVRTC's version, "<major>.<minor>" (e.g. "13.0"). Part of a kernel's cache key.
std::string nvrtcVersion();

}  // namespace twell::detail
