// Gathering a layer's tensors from safetensors files (twell/layer_data.h).
#include "twell/layer_data.h"

#include <algorithm>
#include <cmath>
#include <random>
#include <set>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "quoted_text.h"
#include "twell/error.h"
#include "twell/half.h"

namespace twell {
namespace {

// A decimal number that fits in `max`, else nullopt (names may carry any digits).
std::optional<int64_t> parse_index(const std::string& digits, int64_t max) {
  if (digits.empty() || digits.size() > 18 || !std::all_of(digits.begin(), digits.end(), ::isdigit)) return std::nullopt;
  const int64_t v = std::stoll(digits);
  return v <= max ? std::optional<int64_t>(v) : std::nullopt;
}

std::string file_list(const std::vector<SafeTensors>& files) {
  std::vector<std::string> s;
  for (const auto& f : files) s.push_back(f.source());
  return fmt::format("{}", fmt::join(s, ", "));
}

// The matrix `name` [rows, cols] (rows/cols < 0: any), whole or from row shards. nullopt if absent.
std::optional<std::vector<uint16_t>> find_matrix(const std::vector<SafeTensors>& files, const std::string& name,
                                                 int64_t rows, int64_t cols, int64_t* rows_out, int64_t* cols_out) {
  const SafeTensors* holder = nullptr;
  for (const auto& f : files)
    if (f.contains(name)) {
      if (holder != nullptr)
        throw Error(ErrorCode::InvalidArgument, fmt::format("tensor '{}' is in both '{}' and '{}': expected it in one file",
                                                            name, holder->source(), f.source()));
      holder = &f;
    }
  if (holder != nullptr) return holder->matrix16(name, DType::BF16, rows, cols, rows_out, cols_out);
  std::vector<std::pair<int64_t, std::pair<const SafeTensors*, std::string>>> shards;
  const std::string prefix = name + ".rows";
  for (const auto& f : files)
    for (const auto& n : f.names())
      if (n.rfind(prefix, 0) == 0) {
        const auto index = parse_index(n.substr(prefix.size()), 1 << 20);
        if (!index)
          throw Error(ErrorCode::InvalidArgument,
                      fmt::format("tensor '{}' in '{}': expected a shard name '{}<index>' with index 0..{}", detail::excerpt(n),
                                  f.source(), prefix, 1 << 20));
        shards.push_back({*index, {&f, n}});
      }
  if (shards.empty()) return std::nullopt;
  std::sort(shards.begin(), shards.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  for (size_t i = 1; i < shards.size(); ++i)
    if (shards[i].first == shards[i - 1].first)
      throw Error(ErrorCode::InvalidArgument, fmt::format("{}: shard '{}' appears twice ('{}' and '{}')", name,
                                                          detail::excerpt(shards[i].second.second),
                                                          shards[i - 1].second.first->source(), shards[i].second.first->source()));
  std::vector<uint16_t> out;
  int64_t next = 0, width = cols, index = 0;
  for (const auto& [i, where] : shards) {
    if (i != index)
      throw Error(ErrorCode::InvalidArgument,
                  fmt::format("{}: shards are not contiguous: expected shard '{}{}', got '{}' in '{}'", name, prefix, index,
                              detail::excerpt(where.second), where.first->source()));
    int64_t r = 0, c = 0;
    auto part = where.first->matrix16(where.second, DType::BF16, -1, width, &r, &c);
    width = c;
    out.insert(out.end(), part.begin(), part.end());
    next += r;
    ++index;
  }
  if (rows >= 0 && next != rows)
    throw Error(ErrorCode::InvalidArgument, fmt::format("{}: expected {} rows in its shards, got {}", name, rows, next));
  if (rows_out) *rows_out = next;
  if (cols_out) *cols_out = width;
  return out;
}

std::vector<uint16_t> random_weight(int64_t count, int64_t fan_in, uint32_t seed) {
  std::mt19937 rng(seed);
  const float bound = 1.0f / std::sqrt(static_cast<float>(fan_in));
  std::uniform_real_distribution<float> dist(-bound, bound);
  std::vector<uint16_t> w(count);
  for (auto& v : w) v = float_to_bf16(dist(rng));
  return w;
}

}  // namespace

std::vector<int> layers_in(const std::vector<SafeTensors>& files) {
  std::set<int> layers;
  for (const auto& f : files)
    for (const auto& n : f.names())
      if (n.rfind("layers.", 0) == 0) {
        const size_t dot = n.find('.', 7);
        if (const auto num = parse_index(n.substr(7, dot - 7), 1 << 30)) layers.insert(static_cast<int>(*num));
      }
  return {layers.begin(), layers.end()};
}

LayerData load_layer(const std::vector<SafeTensors>& files, std::optional<int> layer, bool random_up_down_if_missing) {
  const std::vector<int> present = layers_in(files);
  LayerData d;
  if (!layer) {
    if (present.size() != 1)
      throw Error(ErrorCode::InvalidArgument,
                  fmt::format("--layer: the files ({}) hold layers [{}]; expected exactly one or --layer N", file_list(files),
                              detail::short_list(present)));
    d.layer = present[0];
  } else {
    if (std::find(present.begin(), present.end(), *layer) == present.end())
      throw Error(ErrorCode::NotFound, fmt::format("--layer {}: not in {} (layers present: [{}])", *layer, file_list(files),
                                                   detail::short_list(present)));
    d.layer = *layer;
  }
  for (const auto& f : files) d.sources.push_back(f.source());
  const std::string base = fmt::format("layers.{}.", d.layer);
  auto require = [&](std::optional<std::vector<uint16_t>> m, const std::string& name) {
    if (!m) throw Error(ErrorCode::NotFound, fmt::format("tensor '{}' not found in {}", name, file_list(files)));
    return std::move(*m);
  };
  d.x = require(find_matrix(files, base + "x", -1, -1, &d.tokens, &d.d_model), base + "x");
  d.w_gate = require(find_matrix(files, base + "gate.weight", -1, d.d_model, &d.d_ff, nullptr), base + "gate.weight");
  if (d.tokens == 0 || d.d_model == 0 || d.d_ff == 0)
    throw Error(ErrorCode::InvalidArgument,
                fmt::format("layer {}: expected at least one token, d_model >= 1 and d_ff >= 1, got x [{}, {}] and gate [{}, {}]",
                            d.layer, d.tokens, d.d_model, d.d_ff, d.d_model));
  auto up = find_matrix(files, base + "up.weight", d.d_ff, d.d_model, nullptr, nullptr);
  auto down = find_matrix(files, base + "down.weight", d.d_model, d.d_ff, nullptr, nullptr);
  if ((!up || !down) && random_up_down_if_missing) {
    d.random_up_down = true;
    d.w_up = up ? std::move(*up) : random_weight(d.d_ff * d.d_model, d.d_model, 1234);
    d.w_down = down ? std::move(*down) : random_weight(d.d_model * d.d_ff, d.d_ff, 5678);
  } else {
    d.w_up = require(std::move(up), base + "up.weight");
    d.w_down = require(std::move(down), base + "down.weight");
  }
  return d;
}

}  // namespace twell
