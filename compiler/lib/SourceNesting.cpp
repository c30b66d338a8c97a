// The bracket-nesting bound on MLIR text (twell/compiler/SourceNesting.h).
#include "twell/compiler/SourceNesting.h"

#include <cstddef>
#include <string>

namespace twell::compiler {

std::string checkMlirNesting(std::string_view text, std::string_view filename, int limit) {
  if (text.substr(0, 4) == std::string_view("ML\xefR", 4)) return "";  // bytecode
  int depth = 0;
  size_t line = 1, line_start = 0;
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (c == '\n') {
      ++line;
      line_start = i + 1;
      in_string = false;  // MLIR's lexer ends a string literal at a newline (with an error)
      continue;
    }
    if (in_string) {
      // Skips the escaped character (`\"` included), never the newline that ends the line.
      if (c == '\\' && i + 1 < text.size() && text[i + 1] != '\n') {
        ++i;
      } else if (c == '"') {
        in_string = false;
      }
      continue;
    }
    switch (c) {
      case '"':
        in_string = true;
        break;
      case '/':
        if (i + 1 < text.size() && text[i + 1] == '/')
          while (i + 1 < text.size() && text[i + 1] != '\n') ++i;  // to the end of the line
        break;
      case '(':
      case '[':
      case '{':
      case '<':
        if (++depth > limit)
          return std::string(filename) + ":" + std::to_string(line) + ":" + std::to_string(i - line_start + 1) +
                 ": error: brackets nested " + std::to_string(depth) + " deep here: expected at most " +
                 std::to_string(limit) +
                 " levels (twell's nesting limit: MLIR's parser recurses once per level "
                 "and would overflow the stack)";
        break;
      case '>':
        // `->` (function types, affine maps) and `>=` (integer sets) are operators, not closers.
        if ((i > 0 && text[i - 1] == '-') || (i + 1 < text.size() && text[i + 1] == '=')) break;
        [[fallthrough]];
      case ')':
      case ']':
      case '}':
        if (depth > 0) --depth;
        break;
      default:
        break;
    }
  }
  return "";
}

}  // namespace twell::compiler
