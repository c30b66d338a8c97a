// Text from a user's file quoted in an error message, bounded: a safetensors header may hold megabytes
// of names and numbers, and a message must stay a line or two.
#pragma once
#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace twell::detail {

// Bytes of one piece of text a message quotes.
inline constexpr size_t kMaxQuoted = 200;
// Items of a list a message names.
inline constexpr size_t kMaxListed = 20;

// `text` if it is at most kMaxQuoted bytes, else its first kMaxQuoted bytes (cut between UTF-8
// characters: the message stays valid UTF-8 for the C API's callers) and how many there were.
inline std::string excerpt(std::string_view text) {
  if (text.size() <= kMaxQuoted) return std::string(text);
  size_t cut = kMaxQuoted;
  while (cut > 0 && (static_cast<unsigned char>(text[cut]) & 0xC0) == 0x80) --cut;
  return fmt::format("{}... ({} bytes in all)", text.substr(0, cut), text.size());
}

// The first kMaxListed items, each an excerpt, joined by ", ", then " and N more" if there are more.
template <typename T>
std::string short_list(const std::vector<T>& items) {
  std::vector<std::string> shown;
  for (size_t i = 0; i < items.size() && i < kMaxListed; ++i) shown.push_back(excerpt(fmt::format("{}", items[i])));
  std::string list = fmt::format("{}", fmt::join(shown, ", "));
  if (items.size() > kMaxListed) list += fmt::format(" and {} more", items.size() - kMaxListed);
  return list;
}

}  // namespace twell::detail
