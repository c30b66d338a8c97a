// One FFN layer's real tensors, gathered from one or more safetensors files with the naming of
// ../shared/data: `layers.<L>.{gate,up,down}.weight` (nn.Linear layouts, bf16) and `layers.<L>.x`
// (the FFN input, [tokens, d_model]). A weight split by rows across files is stored as shards
// `<name>.rows<i>`, i = 0, 1, 2, ... (as ../shared/data's paper gate); they are concatenated in
// the order of i, which must have no gaps.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "twell/safetensors.h"

namespace twell {

struct LayerData {
  int layer = 0;
  int64_t d_model = 0, d_ff = 0, tokens = 0;
  std::vector<uint16_t> x, w_gate, w_up, w_down;  // bf16 bits; w_down is [d_model, d_ff]
  bool random_up_down = false;  // up/down weights were absent and drawn at random (seeded)
  std::vector<std::string> sources;
};

// `layer` unset: the files must hold exactly one layer. Missing up/down weights are an error naming
// the tensor unless `random_up_down_if_missing` (then both are drawn uniformly in ±1/sqrt(fan_in) with
// a fixed seed, as nn.Linear initializes them). Throws Error(NotFound / InvalidArgument) naming the
// tensor, the files, and expected vs given shape or dtype.
LayerData load_layer(const std::vector<SafeTensors>& files, std::optional<int> layer, bool random_up_down_if_missing);

// The layers present (numbers L with any `layers.L.` tensor), ascending.
std::vector<int> layers_in(const std::vector<SafeTensors>& files);

}  // namespace twell
