// twell-opt: mlir-opt with the twell dialect and passes, for lit tests and for inspecting the
// pipeline. It reads the input once before MLIR does: text whose brackets nest deeper than twell's
// limit (twell/compiler/SourceNesting.h) is an error here, not a stack overflow in MLIR's parser.
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <optional>
#include <string>

#include "llvm/Support/raw_ostream.h"
#include "mlir/IR/DialectRegistry.h"
#include "mlir/Tools/mlir-opt/MlirOptMain.h"
#include "twell/compiler/Registration.h"
#include "twell/compiler/SourceNesting.h"

namespace {

std::string readStream(std::FILE* stream) {
  std::string text;
  char chunk[1 << 16];
  for (size_t n; (n = std::fread(chunk, 1, sizeof chunk, stream)) > 0;) text.append(chunk, n);
  return text;
}

// Puts `text` back where MLIR reads "-" from: standard input, now a temporary file holding it.
bool restoreStdin(const std::string& text) {
  std::FILE* copy = std::tmpfile();
  if (copy == nullptr || std::fwrite(text.data(), 1, text.size(), copy) != text.size() || std::fflush(copy) != 0 ||
      lseek(fileno(copy), 0, SEEK_SET) != 0 || dup2(fileno(copy), STDIN_FILENO) < 0)
    return false;
  std::fclose(copy);  // standard input keeps its own descriptor
  return true;
}

// The input MLIR should read: `input` itself for a file, "-" for a stream (standard input, a pipe, a
// device: it can be read once, so it is read here and put back on standard input); nullopt after
// reporting why it cannot be processed. Missing files and directories are left to MLIR, which says
// "No such file or directory" and "Is a directory".
std::optional<std::string> checkedInput(const std::string& input) {
  std::error_code ec;
  const auto status = std::filesystem::status(input, ec);
  const bool file = input != "-" && std::filesystem::is_regular_file(status);
  const bool stream =
      input == "-" || (!file && std::filesystem::exists(status) && !std::filesystem::is_directory(status));
  if (!file && !stream) return input;
  std::string text;
  if (file) {
    std::ifstream in(input, std::ios::binary);
    if (!in) return input;  // unreadable: MLIR says why
    text.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  } else {
    std::FILE* from = input == "-" ? stdin : std::fopen(input.c_str(), "rb");
    if (from == nullptr) return input;
    text = readStream(from);
    if (from != stdin) std::fclose(from);
    if (!restoreStdin(text)) {
      llvm::errs() << "twell-opt: error: cannot hand on the input read from '" << input << "' (temporary file)\n";
      return std::nullopt;
    }
  }
  if (const std::string deep = twell::compiler::checkMlirNesting(text, input == "-" ? "<stdin>" : input);
      !deep.empty()) {
    llvm::errs() << deep << "\n";
    return std::nullopt;
  }
  return file ? input : std::string("-");
}

}  // namespace

int main(int argc, char** argv) {
  mlir::DialectRegistry registry;
  mlir::twell::registerTwellDialectsAndPasses(registry);
  const auto [input, output] =
      mlir::registerAndParseCLIOptions(argc, argv, "twell optimizer: the twell dialect and its passes\n", registry);
  const mlir::MlirOptMainConfig config = mlir::MlirOptMainConfig::createFromCLOptions();
  std::string checked = input;
  if (!config.shouldShowDialects() && !config.shouldListPasses()) {  // those read no input
    const std::optional<std::string> ok = checkedInput(input);
    if (!ok) return 1;
    checked = *ok;
  }
  return mlir::asMainReturnCode(mlir::MlirOptMain(argc, argv, checked, output, registry));
}
