// A bound on the bracket nesting of MLIR text, checked before the text reaches MLIR's parser. The
// parser (and later the verifier and printer) recurse once per nested region, attribute, type or
// parenthesis: a file nested a few thousand deep (`module {` 5000 times, `[[[...]]]` in an attribute)
// overflows the stack and kills the process instead of reporting an error. No MLIR headers.
#pragma once
#include <string>
#include <string_view>

namespace twell::compiler {

// The deepest bracket nesting accepted. Real twell files nest about 8 deep; at 256 levels the parser,
// verifier, passes and printer stay far inside an 8 MiB stack (tests/lit/input/nesting.mlir runs them).
inline constexpr int kMaxMlirNesting = 256;

// "" when the brackets of `text` ( ( [ { < and their closers; `->` and `>=` close nothing) nest at
// most `limit` deep outside string literals and `//` comments, else a diagnostic in MLIR's form,
// "FILE:LINE:COL: error: ...", naming the position of the first bracket past the limit, the limit and
// why it exists. MLIR bytecode (starting with "ML\xefR") is not text and is returned as "" unchecked.
// Linear in text.size(); thread-safe.
std::string checkMlirNesting(std::string_view text, std::string_view filename, int limit = kMaxMlirNesting);

}  // namespace twell::compiler
