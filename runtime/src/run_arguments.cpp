// The argument checks of FfnPlan::run, run_gate, run_consumer and DenseFfn::run: every pointer,
// stride, alignment and token count before any launch.
#include "run_arguments.h"

#include <algorithm>

#include <fmt/format.h>

#include "driver.h"
#include "plan_impl.h"
#include "twell/error.h"

namespace twell {

std::string pointer_problem(const char* name, const void* p, int alignment) {
  if (p == nullptr) return fmt::format("{}: expected a device pointer, got null", name);
  if (reinterpret_cast<uintptr_t>(p) % alignment != 0)
    return fmt::format("{}: expected a {}-byte aligned device pointer, got {}", name, alignment, p);
  return {};
}

ByteRange bytes_range(const char* name, const void* p, int64_t bytes) {
  const auto b = reinterpret_cast<uintptr_t>(p);
  return ByteRange{name, b, p == nullptr || bytes <= 0 ? b : b + std::min<uintptr_t>(bytes, UINTPTR_MAX - b)};
}

ByteRange matrix_range(const char* name, const void* p, int64_t rows, int64_t ld, int64_t row_elements, int element_bytes) {
  if (rows <= 0) return bytes_range(name, p, 0);
  if (rows - 1 > (int64_t{1} << 56) / ld) return bytes_range(name, p, INT64_MAX);
  return bytes_range(name, p, ((rows - 1) * ld + row_elements) * element_bytes);
}

std::string overlap_problem(const ByteRange& written, const ByteRange& other) {
  if (!(written.begin < other.end && other.begin < written.end)) return "";
  return fmt::format("{}: must not overlap {}: expected disjoint byte ranges, got [{:#x}, {:#x}) and [{:#x}, {:#x})",
                     written.name, other.name, written.begin, written.end, other.begin, other.end);
}

bool is_device_memory(const void* p) {
  unsigned int type = 0;
  const CUresult r = detail::Driver::get().cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
                                                                  reinterpret_cast<CUdeviceptr>(p));
  return r == CUDA_SUCCESS && (type == CU_MEMORYTYPE_DEVICE || type == CU_MEMORYTYPE_UNIFIED);
}

void check_run_arguments(const char* who, const FfnSpec& spec, const FfnTensors& t, int64_t tokens, int64_t max_tokens,
                         RunOperands operands) {
  auto bad = [&](const std::string& m) { throw Error(ErrorCode::InvalidArgument, fmt::format("{}: {}", who, m)); };
  if (tokens < 0 || tokens > max_tokens) bad(fmt::format("tokens: expected 0..{} (the plan's max_tokens), got {}", max_tokens, tokens));
  auto check_ptr = [&](const char* name, const void* p) {
    if (std::string problem = pointer_problem(name, p, 2); !problem.empty()) bad(problem);
    if (!is_device_memory(p)) {
      unsigned int memory_type = 0;  // which of the two the message says
      const CUresult r = detail::Driver::get().cuPointerGetAttribute(&memory_type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
                                                                      reinterpret_cast<CUdeviceptr>(p));
      bad(fmt::format("{}: expected device memory (cuMemAlloc/cudaMalloc), got {} which is {}", name, p,
                      r != CUDA_SUCCESS ? "not known to CUDA (host memory?)" : "host memory"));
    }
  };
  auto check_ld = [&](const char* name, int64_t ld, int64_t row) {
    if (ld != 0 && ld < row) bad(fmt::format("{}: expected a row stride >= {} elements (or 0 = dense), got {}", name, row, ld));
  };
  // Strides beyond 2^36 elements cannot address real memory (and would overflow offset arithmetic).
  for (const auto& [name, ld] : {std::pair{"ld_x", t.ld_x}, std::pair{"ld_gate", t.ld_gate}, std::pair{"ld_up", t.ld_up},
                                 std::pair{"ld_down", t.ld_down}, std::pair{"ld_y", t.ld_y}})
    if (ld < 0 || ld > (int64_t{1} << 36))
      bad(fmt::format("{}: expected a row stride in 0..2^36 elements (0 = dense), got {}", name, ld));
  check_ptr("x", t.x);
  check_ptr("w_gate", t.w_gate);
  check_ld("ld_x", t.ld_x, spec.d_model);
  check_ld("ld_gate", t.ld_gate, spec.d_model);
  if (operands == RunOperands::Gate) return;
  if (spec.gated && t.w_up == nullptr)
    bad("w_up: expected a device pointer (the up weight of a gated layer; a layer without one is "
        "FfnSpec::gated = false), got null");
  if (spec.gated) check_ptr("w_up", t.w_up);
  else if (t.w_up != nullptr || t.ld_up != 0)
    bad(fmt::format("w_up: a non-gated FFN (FfnSpec::gated = false) has no up projection; expected w_up = nullptr and "
                    "ld_up = 0, got {} and {}", t.w_up, t.ld_up));
  check_ptr("w_down", t.w_down);
  const bool in_out = spec.down_layout == WeightLayout::InOut;
  check_ld("ld_up", t.ld_up, spec.d_model);
  check_ld("ld_down", t.ld_down, in_out ? spec.d_model : spec.d_ff);
  if (operands == RunOperands::GateAndWeights) return;
  check_ptr("y", t.y);
  check_ld("ld_y", t.ld_y, spec.d_model);
  // The bytes each spans: (tokens - 1) strides plus one row (a strided view's last row ends before the
  // stride does, and its owner's next allocation may start right there); saturating, as strides reach 2^36.
  const int64_t ldx = t.ld_x ? t.ld_x : spec.d_model, ldy = t.ld_y ? t.ld_y : spec.d_model;
  if (overlap_problem(matrix_range("y", t.y, tokens, ldy, spec.d_model, 2),
                      matrix_range("x", t.x, tokens, ldx, spec.d_model, 2)) != "")
    bad("y: must not overlap x (the consumer reads x while writing y)");
}

std::string operand_alignment_problem(const char* name, const void* p, const char* ld_name, int64_t ld, int elements,
                                      const std::string& why) {
  if (p == nullptr || operand_aligned(p, ld, elements)) return "";
  if (reinterpret_cast<uintptr_t>(p) % (2 * elements) != 0)
    return fmt::format("{}: expected a {}-byte aligned device pointer ({}), got {}", name, 2 * elements, why, p);
  return fmt::format("{}: expected a row stride that is a multiple of {} elements, got {}", ld_name, elements, ld);
}

// The tensor-core main loop moves 16-byte chunks of x and Wg rows (cp.async), and its consumer reads
// x, Wu and Wd^T rows 16 bytes at a time: the generated kernels say how aligned (in elements) those
// operands and their row strides must be.
void check_operand_alignment(const FfnPlan::Impl& p, const FfnTensors& t, bool gate_only) {
  int need = 1;
  for (const auto* k : {p.gate.get(), p.consumer.get()}) need = std::max(need, k->source.operand_alignment);
  if (need == 1) return;
  const FfnSpec& s = p.spec;
  auto check = [&](const char* name, const void* ptr, const char* ld_name, int64_t ld) {
    if (ptr == nullptr || operand_aligned(ptr, ld, need)) return;  // (the message only on failure: per-call host time)
    const std::string why = fmt::format("the generated kernels load {}-element chunks", need);
    throw Error(ErrorCode::InvalidArgument, "FfnPlan::run: " + operand_alignment_problem(name, ptr, ld_name, ld, need, why));
  };
  check("x", t.x, "ld_x", t.ld_x ? t.ld_x : s.d_model);
  check("w_gate", t.w_gate, "ld_gate", t.ld_gate ? t.ld_gate : s.d_model);
  if (gate_only || need < 8) return;
  // The consumer then reads rows of Wu and Wd^T with 16-byte loads too (gated_down.cuh); one row per
  // warp (operand alignment 8) also writes rows of y 16 bytes at a time.
  if (s.gated) check("w_up", t.w_up, "ld_up", t.ld_up ? t.ld_up : s.d_model);
  if (s.down_layout == WeightLayout::InOut) check("w_down", t.w_down, "ld_down", t.ld_down ? t.ld_down : s.d_model);
  if (p.consumer->source.operand_alignment >= 8) check("y", t.y, "ld_y", t.ld_y ? t.ld_y : s.d_model);
}

bool block_operands_aligned(const FfnSpec& s, const FfnTensors& t) {
  auto ok = [](const void* ptr, int64_t ld) { return operand_aligned(ptr, ld, 8); };
  return ok(t.x, t.ld_x ? t.ld_x : s.d_model) && ok(t.w_up, t.ld_up ? t.ld_up : s.d_model) &&
         ok(t.y, t.ld_y ? t.ld_y : s.d_model) &&
         (s.down_layout == WeightLayout::OutIn || ok(t.w_down, t.ld_down ? t.ld_down : s.d_model));
}
}  // namespace twell
