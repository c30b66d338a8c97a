#include "twell/spec.h"

namespace twell {

const char* to_string(DType t) { return t == DType::BF16 ? "bf16" : "f16"; }
const char* to_string(Activation a) { return a == Activation::ReLU ? "relu" : "silu"; }
const char* to_string(WeightLayout l) { return l == WeightLayout::OutIn ? "out_in" : "in_out"; }
const char* to_string(ConsumerVariant c) { return c == ConsumerVariant::RowGather ? "row_gather" : "token_block"; }

}  // namespace twell
