// The argument checks of FfnPlan::run and DenseFfn::run (run_arguments.cpp).
#pragma once
#include <cstdint>

#include "twell/plan.h"
#include "twell/spec.h"

namespace twell {

// Throws Error(InvalidArgument), prefixed by `who` and naming the argument: null or misaligned
// pointers, pointers that are not device memory, strides shorter than the row, token counts out of
// range, y overlapping x. `needs_output` false: y, w_up and w_down are not used (the gate alone) and
// not checked.
void check_run_arguments(const char* who, const FfnSpec& spec, const FfnTensors& t, int64_t tokens, int64_t max_tokens,
                         bool needs_output = true);

}  // namespace twell
