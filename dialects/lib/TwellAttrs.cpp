// Verifiers, parsers and printers of the twell attributes. Every illegal parameter combination is
// rejected with a message naming the parameter, what is expected and what was given.
#include "twell/Dialect/TwellAttrs.h"

#include <charconv>
#include <string>

#include "llvm/ADT/STLExtras.h"
#include "llvm/ADT/SmallString.h"
#include "llvm/ADT/StringExtras.h"
#include "llvm/ADT/TypeSwitch.h"
#include "llvm/Support/MathExtras.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/BuiltinTypes.h"
#include "mlir/IR/DialectImplementation.h"
#include "twell/kernels/constraints.h"
#include "twell/spec.h"
#include "twell/Dialect/TwellDialect.h"

namespace mlir::twell {

// The kernels' contracts (kernels/include/twell/kernels/constraints.h).
using namespace ::twell::kernels;

// Parameter syntax used by the generated parsers and printers (TwellAttrs.td).
static FailureOr<llvm::APFloat> parseF32Parameter(AsmParser& parser);
static void printF32Parameter(AsmPrinter& printer, const llvm::APFloat& value);
static FailureOr<llvm::SmallVector<Feature>> parseFeatureList(AsmParser& parser);
static void printFeatureList(AsmPrinter& printer, llvm::ArrayRef<Feature> features);
static FailureOr<Mainloop> parseMainloop(AsmParser& parser);
static FailureOr<ConsumerVariant> parseConsumerVariant(AsmParser& parser);

}  // namespace mlir::twell

#include "twell/Dialect/TwellEnums.cpp.inc"
#define GET_ATTRDEF_CLASSES
#include "twell/Dialect/TwellAttrs.cpp.inc"

namespace mlir::twell {

void TwellDialect::registerAttributes() {
  addAttributes<
#define GET_ATTRDEF_LIST
#include "twell/Dialect/TwellAttrs.cpp.inc"
      >();
}

static FailureOr<llvm::APFloat> parseF32Parameter(AsmParser& parser) {
  llvm::APFloat value(0.0f);
  if (parser.parseFloat(llvm::APFloat::IEEEsingle(), value)) return failure();
  // -0.0 reads as 0.0: both give the same predicate, and one layer must get one kernel name (the
  // runtime canonicalizes FfnSpec::threshold the same way, twell/kernels/validate.h).
  if (value.isZero()) value = llvm::APFloat(0.0f);
  return value;
}

// Shortest decimal that reads back as the same f32, with the '.' that MLIR's float literals require
// (`0.0`, `0.25`, `1.0e-05`). Non-finite values (rejected by the verifier) read "nan", "inf".
static std::string formatF32(const llvm::APFloat& value) {
  if (!value.isFinite()) {
    llvm::SmallString<16> text;
    value.toString(text);
    return std::string(text);
  }
  char buffer[64];
  auto result = std::to_chars(buffer, buffer + sizeof(buffer), value.convertToFloat());
  std::string text(buffer, result.ptr);
  size_t exponent = text.find('e');
  std::string mantissa = text.substr(0, exponent);
  if (mantissa.find('.') == std::string::npos) mantissa += ".0";
  return mantissa + (exponent == std::string::npos ? "" : text.substr(exponent));
}

static void printF32Parameter(AsmPrinter& printer, const llvm::APFloat& value) {
  // MLIR's own form (hexadecimal bits) round-trips the values the decimal form cannot.
  if (&value.getSemantics() != &llvm::APFloat::IEEEsingle() || !value.isFinite())
    printer.printFloat(value);
  else
    printer.getStream() << formatF32(value);
}

static FailureOr<llvm::SmallVector<Feature>> parseFeatureList(AsmParser& parser) {
  llvm::SmallVector<Feature> features;
  auto parseOne = [&]() -> ParseResult {
    SMLoc loc = parser.getCurrentLocation();
    StringRef keyword;
    if (parser.parseKeyword(&keyword)) return failure();
    std::optional<Feature> feature = symbolizeFeature(keyword);
    if (!feature)
      return parser.emitError(loc, "unknown feature '")
             << keyword << "', expected one of wgmma, tma, multicast, mma_sync, cp_async";
    features.push_back(*feature);
    return success();
  };
  if (parser.parseCommaSeparatedList(AsmParser::Delimiter::Square, parseOne)) return failure();
  return features;
}

static FailureOr<Mainloop> parseMainloop(AsmParser& parser) {
  SMLoc loc = parser.getCurrentLocation();
  StringRef keyword;
  if (parser.parseKeyword(&keyword)) return failure();
  std::optional<Mainloop> mainloop = symbolizeMainloop(keyword);
  if (!mainloop)
    return parser.emitError(loc, "unknown mainloop '") << keyword << "', expected fma, mma_sync or wgmma";
  return *mainloop;
}

static FailureOr<ConsumerVariant> parseConsumerVariant(AsmParser& parser) {
  SMLoc loc = parser.getCurrentLocation();
  StringRef keyword;
  if (parser.parseKeyword(&keyword)) return failure();
  std::optional<ConsumerVariant> consumer = symbolizeConsumerVariant(keyword);
  if (!consumer)
    return parser.emitError(loc, "unknown consumer '") << keyword << "', expected cta_row, warp_row or token_block";
  return *consumer;
}

static void printFeatureList(AsmPrinter& printer, llvm::ArrayRef<Feature> features) {
  printer << '[';
  llvm::interleaveComma(features, printer, [&](Feature f) { printer << stringifyFeature(f); });
  printer << ']';
}

//===----------------------------------------------------------------------===//
// #twell.layout
//===----------------------------------------------------------------------===//

static bool isTwellValueType(Type type) { return type.isBF16() || type.isF16(); }

LogicalResult LayoutAttr::verify(llvm::function_ref<InFlightDiagnostic()> emitError, int64_t tile_n,
                                 int64_t slots, Type value, Type index, Activation activation,
                                 llvm::APFloat threshold) {
  if (tile_n < 32 || tile_n > 1024 || !llvm::isPowerOf2_64(tile_n))
    return emitError() << "tile_n must be a power of two between 32 and 1024, got " << tile_n;
  if (slots < 1 || slots > tile_n)
    return emitError() << "slots must be between 1 and tile_n (" << tile_n << "), got " << slots;
  if (!value || !isTwellValueType(value))
    return emitError() << "value must be bf16 or f16, got " << value;
  auto indexType = llvm::dyn_cast_if_present<IntegerType>(index);
  if (!indexType || !indexType.isSignless())
    return emitError() << "index must be a signless integer type, got " << index;
  unsigned valueBits = value.getIntOrFloatBitWidth();
  unsigned indexBits = indexType.getWidth();
  if (valueBits + indexBits != 32)
    return emitError() << "index must be i" << 32 - valueBits << " so that an entry (value "
                       << value << ", " << valueBits
                       << " bits, and its column) fills one 32-bit word, got " << index;
  if (indexBits < 63 && (int64_t{1} << indexBits) < tile_n)
    return emitError() << "index " << index << " cannot address tile_n = " << tile_n
                       << " columns (2^" << indexBits << " < " << tile_n << ")";
  if (&threshold.getSemantics() != &llvm::APFloat::IEEEsingle())
    return emitError() << "threshold must be an f32";
  if (!threshold.isFinite())
    return emitError() << "threshold must be finite, got " << formatF32(threshold);
  // The gate's output is rounded to `value`: a larger threshold would keep no activation.
  const ::twell::DType dtype = value.isF16() ? ::twell::DType::FP16 : ::twell::DType::BF16;
  if (threshold.convertToFloat() > ::twell::max_finite(dtype))
    return emitError() << "threshold must be at most " << formatF32(llvm::APFloat(::twell::max_finite(dtype)))
                       << ", the largest finite " << ::twell::to_string(dtype) << " (no activation could pass it), got "
                       << formatF32(threshold);
  switch (activation) {
    case Activation::ReLU:
      if (threshold.isNegative() && !threshold.isZero())
        return emitError() << "threshold must be >= 0 for activation relu (active iff relu(g) > "
                              "threshold), got "
                           << formatF32(threshold);
      break;
    case Activation::SiLU:
      if (threshold.isNegative() || threshold.isZero())
        return emitError() << "threshold must be > 0 for activation silu (active iff |silu(g)| > "
                              "threshold), got "
                           << formatF32(threshold);
      break;
  }
  return success();
}

LogicalResult LayoutAttr::verifyEncoding(llvm::ArrayRef<int64_t> shape, Type elementType,
                                         llvm::function_ref<InFlightDiagnostic()> emitError) const {
  if (shape.size() != 2)
    return emitError() << "#twell.layout encodes a rank-2 tensor [M, d_ff], got rank "
                       << shape.size();
  if (elementType != getValue())
    return emitError() << "#twell.layout: the tensor's element type " << elementType
                       << " differs from the layout's value type " << getValue();
  return success();
}

unsigned LayoutAttr::getIndexBits() const { return llvm::cast<IntegerType>(getIndex()).getWidth(); }

//===----------------------------------------------------------------------===//
// #twell.target
//===----------------------------------------------------------------------===//

// "sm_<digits>[a]" -> compute capability major*10 + minor, or -1 (also for a non-canonical spelling
// such as "sm_090" or "sm_+90": the arch string is part of a kernel's identity).
static int parseComputeCapability(StringRef arch, bool& archSpecific) {
  StringRef digits = arch;
  if (!digits.consume_front("sm_")) return -1;
  archSpecific = digits.consume_back("a");
  int cc = 0;
  if (digits.size() < 2 || !llvm::all_of(digits, llvm::isDigit) || digits.getAsInteger(10, cc) ||
      digits.front() == '0')
    return -1;
  return cc;
}

static bool isHopperOnly(Feature feature) {
  return feature == Feature::Wgmma || feature == Feature::Tma || feature == Feature::Multicast;
}

LogicalResult TargetAttr::verify(llvm::function_ref<InFlightDiagnostic()> emitError, StringRef arch,
                                 llvm::ArrayRef<Feature> features) {
  bool archSpecific = false;
  int cc = parseComputeCapability(arch, archSpecific);
  if (cc < 0)
    return emitError() << "arch must be of the form sm_<major><minor>[a] (e.g. \"sm_90a\"), got \""
                       << arch << "\"";
  if (cc < 80)
    return emitError() << "arch must be sm_80 or newer (bf16 tensor cores), got \"" << arch << "\"";
  if (!SupportedArchs::isSupported(cc, archSpecific))
    return emitError() << "arch must be one NVRTC 13.0 builds for (" << SupportedArchs::list()
                       << "), got \"" << arch << "\"";
  for (auto [i, feature] : llvm::enumerate(features)) {
    if (llvm::is_contained(features.take_front(i), feature))
      return emitError() << "feature '" << stringifyFeature(feature) << "' is listed twice";
    if (isHopperOnly(feature) && arch != "sm_90a")
      return emitError() << "feature '" << stringifyFeature(feature)
                         << "' requires arch \"sm_90a\", got \"" << arch << "\"";
  }
  return success();
}

int TargetAttr::getComputeCapability() const {
  bool archSpecific = false;
  return parseComputeCapability(getArch(), archSpecific);
}

llvm::SmallVector<Feature> TargetAttr::defaultFeatures(StringRef arch) {
  if (arch == "sm_90a") return {Feature::Wgmma, Feature::Tma, Feature::Multicast};
  return {Feature::MmaSync, Feature::CpAsync};
}

//===----------------------------------------------------------------------===//
// #twell.config
//===----------------------------------------------------------------------===//

LogicalResult ConfigAttr::verify(llvm::function_ref<InFlightDiagnostic()> emitError, int64_t cta_m,
                                 int64_t cta_k, int64_t threads, Mainloop mainloop, int64_t stages,
                                 int64_t cluster_m, ConsumerVariant consumer) {
  using Limits = ConfigLimits;
  if (cta_m < 1 || cta_m > Limits::kMaxCtaM)
    return emitError() << "cta_m must be between 1 and " << Limits::kMaxCtaM << ", got " << cta_m;
  if (cta_k < 0 || cta_k > Limits::kMaxCtaK)
    return emitError() << "cta_k must be between 1 and " << Limits::kMaxCtaK
                       << " (or omitted: no K loop), got " << cta_k;
  if (threads < Limits::kMinThreads || threads > Limits::kMaxThreads || threads % 32 != 0)
    return emitError() << "threads must be a multiple of 32 between " << Limits::kMinThreads
                       << " and " << Limits::kMaxThreads << ", got " << threads;
  if (stages < 0 || stages > Limits::kMaxStages)
    return emitError() << "stages must be between 0 and " << Limits::kMaxStages
                       << " (0 or omitted: no pipeline), got " << stages;
  // The op verifiers check the rest against the layout and shapes (KernelConstraints.h).
  if (mainloop == Mainloop::Fma && stages != 0)
    return emitError() << "stages: mainloop fma has no cp.async pipeline, stages must be 0 (omitted), got "
                       << stages;
  if (cluster_m < 1 || cluster_m > Limits::kMaxClusterM)
    return emitError() << "cluster_m must be between 1 and " << Limits::kMaxClusterM << " (1 or omitted: no cluster), got "
                       << cluster_m;
  // The variant is named; its CTA tile must agree (GatedDownKernelConstraints).
  using Down = GatedDownKernelConstraints;
  if (consumer == ConsumerVariant::CtaRow && cta_m != Down::kCtaM)
    return emitError() << "consumer cta_row takes one token row per CTA: cta_m must be " << Down::kCtaM << ", got " << cta_m;
  if (consumer == ConsumerVariant::WarpRow && (cta_m != threads / 32 || cta_m == Down::kCtaM))
    return emitError() << "consumer warp_row takes one token row per warp: cta_m must be threads / 32 = " << threads / 32
                       << " (more than one warp), got " << cta_m;
  if (consumer == ConsumerVariant::TokenBlock && (cta_m != Down::kBlockCtaM || threads != Down::kBlockThreads))
    return emitError() << "consumer token_block takes " << Down::kBlockCtaM << " token rows on " << Down::kBlockThreads
                       << " threads: cta_m must be " << Down::kBlockCtaM << " and threads " << Down::kBlockThreads << ", got "
                       << cta_m << " and " << threads;
  return success();
}

}  // namespace mlir::twell
