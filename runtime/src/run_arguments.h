// The argument checks of FfnPlan::run and DenseFfn::run (run_arguments.cpp).
#pragma once
#include <cstdint>
#include <string>

#include "twell/plan.h"
#include "twell/spec.h"

namespace twell {

// The pointer checks every entry point shares (each words its own errors around them):
// "<name>: expected a device pointer, got null" or "<name>: expected a <alignment>-byte aligned device
// pointer, got <p>" where p is null or misaligned, else "".
std::string pointer_problem(const char* name, const void* p, int alignment);
// Whether CUDA knows `p` as device (or unified) memory (cuPointerGetAttribute); needs a current context.
bool is_device_memory(const void* p);
// The operand alignment a generated kernel's loads need (KernelSource::operand_alignment, in 16-bit
// elements): "" where p (null included: checked elsewhere) and its row stride ld are multiples of
// `elements`, else "<name>: expected a <2 elements>-byte aligned device pointer (<why>), got <p>" or
// "<ld_name>: expected a row stride that is a multiple of <elements> elements, got <ld>".
std::string operand_alignment_problem(const char* name, const void* p, const char* ld_name, int64_t ld, int elements,
                                      const std::string& why);

// The byte range [begin, end) a buffer spans, for overlap checks (empty where it spans none: a null
// pointer, no bytes, no rows). Ends saturate at the top of the address space: rows of 2^36 elements over
// 2^31 tokens would wrap 64 bits (no allocation is that large, but a check must not wrap and miss an
// overlap).
struct ByteRange {
  const char* name;
  uintptr_t begin, end;
};
ByteRange bytes_range(const char* name, const void* p, int64_t bytes);
// A row-major [rows, row_elements] matrix with row stride ld (> 0, in elements): ((rows - 1) * ld +
// row_elements) * element_bytes bytes.
ByteRange matrix_range(const char* name, const void* p, int64_t rows, int64_t ld, int64_t row_elements, int element_bytes);
// "" where the two ranges are disjoint, else "<written>: must not overlap <other>: expected disjoint byte
// ranges, got [b, e) and [b, e)".
std::string overlap_problem(const ByteRange& written, const ByteRange& other);

// Which of FfnTensors' operands a call reads, so which check_run_arguments checks.
enum class RunOperands {
  Gate,            // x and w_gate (the gate alone)
  GateAndWeights,  // and w_up, w_down (a training backward: y is not read)
  All,             // and y (a forward)
};

// Throws Error(InvalidArgument), prefixed by `who` and naming the argument: null or misaligned
// pointers, pointers that are not device memory, strides shorter than the row, token counts out of
// range, y overlapping x; for the operands `operands` names (the others are not used and not checked).
void check_run_arguments(const char* who, const FfnSpec& spec, const FfnTensors& t, int64_t tokens, int64_t max_tokens,
                         RunOperands operands = RunOperands::All);

}  // namespace twell
