// The generator (Generate.h): spec or MLIR text -> twell IR -> kernel pipeline -> CUDA C++.
//
// Each call owns its MLIRContext (threading disabled: the pipeline is small, and a context per call
// makes concurrent calls independent without locks).
#include "twell/compiler/Generate.h"

#include <algorithm>
#include <optional>
#include <string>

#include "llvm/Support/MemoryBuffer.h"
#include "llvm/Support/SourceMgr.h"
#include "llvm/Support/raw_ostream.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/Diagnostics.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/IR/Verifier.h"
#include "mlir/Parser/Parser.h"
#include "mlir/Pass/PassManager.h"
#include "EmitTraining.h"
#include "TrainingOps.h"
#include "twell/kernels/constraints.h"
#include "twell/kernels/validate.h"
#include "twell/Dialect/TwellOps.h"
#include "twell/compiler/EmitCuda.h"
#include "twell/compiler/Passes.h"
#include "twell/compiler/SourceNesting.h"
#include "twell/error.h"

namespace twell::compiler {
namespace {

namespace tw = mlir::twell;

std::unique_ptr<mlir::MLIRContext> makeContext() {
  mlir::DialectRegistry registry;
  registry.insert<tw::TwellDialect, mlir::func::FuncDialect>();
  auto context =
      std::make_unique<mlir::MLIRContext>(registry, mlir::MLIRContext::Threading::DISABLED);
  context->loadAllAvailableDialects();
  // Messages name the operand and what is wrong; a dump of the op would bury them.
  context->printOpOnDiagnostic(false);
  return context;
}

// The caller's target: an architecture NVRTC builds for (isSupportedTarget), then checked like the IR's
// #twell.target with its default features.
void checkTarget(mlir::MLIRContext* context, const Target& target, const char* function) {
  if (!isSupportedTarget(target))
    throw Error(ErrorCode::InvalidArgument,
                std::string(function) + ": target: expected one of the architectures NVRTC 13.0 builds for (" +
                    supportedTargets() + "), got " + target.arch() + " (Target{sm = " +
                    std::to_string(target.sm) + ", arch_specific = " + (target.arch_specific ? "true" : "false") +
                    "})");
  std::string arch = target.arch();
  std::string message;
  mlir::ScopedDiagnosticHandler handler(context, [&](mlir::Diagnostic& diagnostic) {
    message = diagnostic.str();
    return mlir::success();
  });
  auto emitError = [&] { return mlir::emitError(mlir::UnknownLoc::get(context)); };
  if (!tw::TargetAttr::getChecked(
          llvm::function_ref<mlir::InFlightDiagnostic()>(emitError), context, llvm::StringRef(arch),
          llvm::ArrayRef<tw::Feature>(tw::TargetAttr::defaultFeatures(arch))))
    throw Error(ErrorCode::InvalidArgument, std::string(function) + ": target: " + message);
}

mlir::Type elementOf(mlir::OpBuilder& b, const FfnSpec& spec) {
  return spec.dtype == DType::BF16 ? mlir::Type(b.getBF16Type()) : b.getF16Type();
}

// The #twell.layout of `spec` (the generator's tile_n and slots where unset); null with a diagnostic
// at `loc` where the layout's rules refuse it.
tw::LayoutAttr layoutOf(mlir::OpBuilder& b, const FfnSpec& spec, mlir::Location loc) {
  auto activation = spec.activation == Activation::ReLU ? tw::Activation::ReLU : tw::Activation::SiLU;
  auto emitLayoutError = [&] { return mlir::emitError(loc); };
  return tw::LayoutAttr::getChecked(llvm::function_ref<mlir::InFlightDiagnostic()>(emitLayoutError), b.getContext(),
                                    int64_t{spec.tile_n.value_or(::twell::kernels::kDefaultTileN)},
                                    int64_t{spec.slots.value_or(::twell::kernels::kDefaultSlots)}, elementOf(b, spec),
                                    mlir::Type(b.getIntegerType(16)), activation, llvm::APFloat(spec.threshold));
}

// SourceMgrDiagnosticHandler ends every diagnostic with a newline.
std::string trimmed(std::string text) {
  while (!text.empty() && text.back() == '\n') text.pop_back();
  return text;
}

// Collects diagnostics as "message" lines (the spec path, where locations say nothing useful).
class MessageCollector {
 public:
  explicit MessageCollector(mlir::MLIRContext* context)
      : handler_(context, [this](mlir::Diagnostic& diagnostic) {
          append(diagnostic);
          return mlir::success();
        }) {}

  std::string take() {
    std::string text = std::move(text_);
    text_.clear();
    return text;
  }

 private:
  void append(mlir::Diagnostic& diagnostic) {
    if (!text_.empty()) text_ += "\n";
    text_ += diagnostic.str();
    for (mlir::Diagnostic& note : diagnostic.getNotes()) text_ += "\n  note: " + note.str();
  }

  std::string text_;
  mlir::ScopedDiagnosticHandler handler_;
};

TwellLayout layoutOf(tw::LayoutAttr layout) {
  TwellLayout result;
  result.tile_n = static_cast<int>(layout.getTileN());
  result.slots = static_cast<int>(layout.getSlots());
  result.value = layout.getValue().isBF16() ? DType::BF16 : DType::FP16;
  result.index_bits = static_cast<int>(layout.getIndexBits());
  result.activation =
      layout.getActivation() == tw::Activation::ReLU ? Activation::ReLU : Activation::SiLU;
  result.threshold = layout.getThresholdValue();
  return result;
}

// Runs the kernel pipeline and the emitter on `module`. Failures are reported through the context's
// diagnostic handler; returns nullopt then.
// `clusterM` 0: the heuristic's cluster for the wgmma gate. `decode`: twell-select-config's option, the
// Wd layout the decode kernels read ("auto": the consumer's).
std::optional<GeneratedFfn> runPipeline(mlir::ModuleOp module, const Target& target,
                                       ConsumerVariant variant = ConsumerVariant::RowGather, int clusterM = 0,
                                       tw::DecodeChoice decode = tw::DecodeChoice::Auto) {
  mlir::PassManager pm(module.getContext());
  tw::TwellSelectConfigOptions options;
  options.target = target.arch();
  options.consumer = variant == ConsumerVariant::TokenBlock ? tw::ConsumerChoice::Block : tw::ConsumerChoice::Rows;
  options.clusterM = clusterM;
  options.decode = decode;
  tw::buildTwellKernelPipeline(pm, options);
  if (mlir::failed(pm.run(module))) return std::nullopt;

  // One gate kernel feeding one consumer (the shape Generate.h documents).
  llvm::SmallVector<tw::GateMatmulOp> gates;
  llvm::SmallVector<mlir::Operation*> consumers;  // twell.gated_down or twell.down; h is operand 1
  module.walk([&](tw::GateMatmulOp op) { gates.push_back(op); });
  module.walk([&](mlir::Operation* op) {
    if (llvm::isa<tw::GatedDownOp, tw::DownOp>(op)) consumers.push_back(op);
  });
  if (gates.size() != 1 || consumers.size() != 1 ||
      consumers.front()->getOperand(1) != gates.front().getH()) {
    mlir::emitError(module.getLoc())
        << "expected one FFN: a twell.gated_ffn or twell.ffn, or one twell.gate_matmul feeding one "
           "twell.gated_down or twell.down; got "
        << gates.size() << " twell.gate_matmul and " << consumers.size() << " consumers";
    return std::nullopt;
  }
  tw::GateMatmulOp gate = gates.front();
  mlir::Operation* consumer = consumers.front();
  if (consumer->getOperand(0) != gate.getX()) {
    consumer->emitOpError() << "x (operand 0) must be the x of the twell.gate_matmul producing h: the consumer "
                               "recomputes the overflowing tile-rows the backup lacks from it";
    return std::nullopt;
  }
  for (mlir::Operation* kernel : {gate.getOperation(), consumer}) {
    auto kernelTarget = kernel->getAttrOfType<tw::TargetAttr>("target");
    if (kernelTarget.getArch() != target.arch()) {
      kernel->emitOpError() << "targets \"" << kernelTarget.getArch() << "\" but \""
                            << target.arch() << "\" was requested";
      return std::nullopt;
    }
  }

  mlir::FailureOr<std::vector<KernelSource>> kernels = tw::emitCudaKernels(module);
  if (mlir::failed(kernels)) return std::nullopt;
  std::stable_partition(kernels->begin(), kernels->end(), [](const KernelSource& kernel) {
    return kernel.kind == KernelKind::GateTwell;
  });

  GeneratedFfn result;
  llvm::raw_string_ostream ir(result.ir);
  module.print(ir);
  result.layout = layoutOf(gate.getLayout());
  result.target = target;
  result.kernels = std::move(*kernels);
  mlir::FailureOr<std::vector<KernelSource>> decodeKernels = tw::emitDecodeKernels(consumer);
  if (mlir::failed(decodeKernels)) return std::nullopt;
  result.decode = std::move(*decodeKernels);
  return result;
}

}  // namespace

bool isSupportedTarget(const Target& target) {
  return ::twell::kernels::SupportedArchs::isSupported(target.sm, target.arch_specific);
}

std::string supportedTargets() { return ::twell::kernels::SupportedArchs::list(); }

GeneratedFfn generateFfn(const FfnSpec& user_spec, const Target& target, std::optional<WeightLayout> decode_down_layout) {
  // Threshold -0.0 as +0.0: the same kernels, with the same names, as the runtime's request keys.
  const FfnSpec spec = ::twell::kernels::canonical_spec(user_spec);
  auto fail = [](const std::string& message) {
    throw Error(ErrorCode::InvalidArgument, "generateFfn: " + message);
  };
  if (spec.d_model < 1)
    fail("spec.d_model: expected a positive integer, got " + std::to_string(spec.d_model));
  if (spec.d_ff < 1)
    fail("spec.d_ff: expected a positive integer, got " + std::to_string(spec.d_ff));
  // Enum fields set from outside the enum (a cast, a bad deserialization) would otherwise pick a
  // branch silently; the layout's rules too: the contract's one check (validate.h).
  if (const std::string wrong = ::twell::kernels::validate_spec(spec, "spec."); !wrong.empty()) fail(wrong);
  // Only the wgmma gate on a target with multicast runs in clusters: the rule twell-select-config
  // applies to the target's default features (TargetAttr::defaultFeatures), checked here so that the
  // error names the spec's field.
  const llvm::SmallVector<tw::Feature> features = tw::TargetAttr::defaultFeatures(target.arch());
  const bool clusterable = llvm::is_contained(features, tw::Feature::Wgmma) &&
                           llvm::is_contained(features, tw::Feature::Tma) &&
                           llvm::is_contained(features, tw::Feature::Multicast) &&
                           ::twell::kernels::WgmmaGateConstraints::allowed(spec.d_model, spec.tile_n.value_or(::twell::kernels::kDefaultTileN));
  if (spec.gate_cluster_m == 2 && !clusterable)
    fail("spec.gate_cluster_m: 2 CTAs per cluster needs the wgmma gate (target sm_90a, d_model % 32 == 0, tile_n 64, "
         "128 or 256); target " + target.arch() + ", d_model " + std::to_string(spec.d_model) + " and tile_n " +
         std::to_string(spec.tile_n.value_or(::twell::kernels::kDefaultTileN)) + " give a gate without clusters (leave it unset or 1)");

  std::unique_ptr<mlir::MLIRContext> context = makeContext();
  checkTarget(context.get(), target, "generateFfn");
  MessageCollector messages(context.get());
  mlir::OpBuilder b(context.get());
  mlir::Location loc = mlir::NameLoc::get(b.getStringAttr("twell::FfnSpec"));

  mlir::Type element = elementOf(b, spec);
  tw::LayoutAttr layout = layoutOf(b, spec, loc);
  if (!layout) fail(messages.take());

  constexpr int64_t kDynamic = mlir::ShapedType::kDynamic;
  auto tensor = [&](int64_t rows, int64_t columns) {
    return mlir::RankedTensorType::get({rows, columns}, element);
  };
  auto xType = tensor(kDynamic, spec.d_model);
  auto weightType = tensor(spec.d_ff, spec.d_model);
  auto downType = spec.down_layout == WeightLayout::OutIn ? tensor(spec.d_model, spec.d_ff)
                                                          : tensor(spec.d_ff, spec.d_model);
  auto downLayout = tw::DownLayoutAttr::get(context.get(), spec.down_layout == WeightLayout::OutIn
                                                               ? tw::DownLayout::OutIn
                                                               : tw::DownLayout::InOut);

  mlir::OwningOpRef<mlir::ModuleOp> module = mlir::ModuleOp::create(loc);
  b.setInsertionPointToEnd(module->getBody());
  // func @ffn(x, w_gate, w_up, w_down) -> y with twell.gated_ffn, or (x, w_gate, w_down) with twell.ffn.
  llvm::SmallVector<mlir::Type> arguments{xType, weightType};
  if (spec.gated) arguments.push_back(weightType);
  arguments.push_back(downType);
  auto function = mlir::func::FuncOp::create(b, loc, "ffn", b.getFunctionType(arguments, {xType}));
  mlir::Block* entry = function.addEntryBlock();
  b.setInsertionPointToStart(entry);
  mlir::Value y =
      spec.gated ? tw::GatedFfnOp::create(b, loc, xType, entry->getArgument(0), entry->getArgument(1),
                                          entry->getArgument(2), entry->getArgument(3), layout, downLayout)
                       .getY()
                 : tw::FfnOp::create(b, loc, xType, entry->getArgument(0), entry->getArgument(1),
                                     entry->getArgument(2), layout, downLayout)
                       .getY();
  mlir::func::ReturnOp::create(b, loc, y);
  if (mlir::failed(mlir::verify(*module))) fail(messages.take());

  tw::DecodeChoice decode = tw::DecodeChoice::Auto;
  if (decode_down_layout) {
    if (*decode_down_layout != WeightLayout::OutIn && *decode_down_layout != WeightLayout::InOut)
      fail("decode_down_layout: expected WeightLayout::OutIn or InOut, got " +
           std::to_string(static_cast<int>(*decode_down_layout)));
    decode = *decode_down_layout == WeightLayout::OutIn ? tw::DecodeChoice::OutIn : tw::DecodeChoice::InOut;
  }
  std::optional<GeneratedFfn> result = runPipeline(*module, target, spec.consumer.value_or(ConsumerVariant::RowGather),
                                                   spec.gate_cluster_m.value_or(0), decode);
  if (!result)
    throw Error(ErrorCode::Compile, "generateFfn: the twell pipeline failed: " + messages.take());
  return std::move(*result);
}

GeneratedFfn generateFromMlir(std::string_view mlir_text, std::string_view filename,
                              const Target& target) {
  std::unique_ptr<mlir::MLIRContext> context = makeContext();
  checkTarget(context.get(), target, "generateFromMlir");
  if (std::string deep = checkMlirNesting(mlir_text, filename); !deep.empty()) throw Error(ErrorCode::Parse, deep);
  llvm::SourceMgr sourceMgr;
  sourceMgr.AddNewSourceBuffer(
      llvm::MemoryBuffer::getMemBufferCopy(llvm::StringRef(mlir_text.data(), mlir_text.size()),
                                           llvm::StringRef(filename.data(), filename.size())),
      llvm::SMLoc());
  std::string diagnostics;
  llvm::raw_string_ostream os(diagnostics);
  // Prints "file:line:col: error: message" with the source line, as mlir-opt does.
  mlir::SourceMgrDiagnosticHandler handler(sourceMgr, context.get(), os);

  mlir::OwningOpRef<mlir::ModuleOp> module =
      mlir::parseSourceFile<mlir::ModuleOp>(sourceMgr, mlir::ParserConfig(context.get()));
  if (!module) throw Error(ErrorCode::Parse, trimmed(diagnostics));

  // The training ops describe kernels of another kind: twell-opt -twell-emit-cuda prints them, and
  // `twellc compile --training` bundles them from a shape.
  mlir::Operation* training = nullptr;
  module->walk([&](mlir::Operation* op) {
    if (!training && llvm::isa<tw::TrainRowBackwardOp, tw::TrainWeightGradOp>(op)) training = op;
  });
  if (training)
    throw Error(ErrorCode::InvalidArgument,
                std::string(filename) + ": " + training->getName().getStringRef().str() +
                    ": expected a file of one FFN (twell.gated_ffn / twell.ffn or its kernels), got a training op (its "
                    "kernels: twell-opt -twell-kernel-pipeline -twell-emit-cuda; bundles: twellc compile --d-model D --d-ff F "
                    "--training)");
  std::optional<GeneratedFfn> result = runPipeline(*module, target);
  if (!result) throw Error(ErrorCode::InvalidArgument, trimmed(diagnostics));
  return std::move(*result);
}

KernelSource generateTrainingKernel(KernelKind kind, const FfnSpec& user_spec, const Target& target) {
  const bool rowBackward = kind == KernelKind::TrainRowBackward;
  const FfnSpec spec = ::twell::kernels::canonical_spec(user_spec);
  // The spec's own rules first: their messages name its fields.
  if (rowBackward)
    checkTrainRowBackward(spec);
  else
    checkTrainWeightGrad(spec, target);
  const std::string who = std::string("generateAuxiliary: kind ") + ::twell::kernels::to_string(kind);
  auto fail = [&](const std::string& message) { throw Error(ErrorCode::InvalidArgument, who + ": " + message); };

  std::unique_ptr<mlir::MLIRContext> context = makeContext();
  checkTarget(context.get(), target, who.c_str());
  MessageCollector messages(context.get());
  mlir::OpBuilder b(context.get());
  mlir::Location loc = mlir::NameLoc::get(b.getStringAttr("twell::FfnSpec"));
  tw::LayoutAttr layout = layoutOf(b, spec, loc);
  if (!layout) fail(messages.take());
  constexpr int64_t kDynamic = mlir::ShapedType::kDynamic;
  mlir::Type element = elementOf(b, spec);
  auto rows = mlir::RankedTensorType::get({kDynamic, spec.d_model}, element);
  auto h = mlir::RankedTensorType::get({kDynamic, spec.d_ff}, element, layout);
  auto weight = mlir::RankedTensorType::get({spec.d_ff, spec.d_model}, element);
  auto entries = mlir::RankedTensorType::get({kDynamic, spec.d_ff}, b.getF32Type());
  auto weightGrad = mlir::RankedTensorType::get({spec.d_ff, spec.d_model}, b.getF32Type());

  // func @train_row_backward(x, dy, h, w_gate, w_down[, w_up]) -> (dx, dg[, du]), or
  // func @train_weight_grad(x, dy, h, dg[, du]) -> (dw_gate, dw_down_t[, dw_up]).
  llvm::SmallVector<mlir::Type> arguments{rows, rows, h}, results;
  if (rowBackward) {
    arguments.append({weight, weight});
    if (spec.gated) arguments.push_back(weight);
    results = {rows, entries};
    if (spec.gated) results.push_back(entries);
  } else {
    arguments.push_back(entries);
    if (spec.gated) arguments.push_back(entries);
    results = {weightGrad, weightGrad};
    if (spec.gated) results.push_back(weightGrad);
  }
  mlir::OwningOpRef<mlir::ModuleOp> module = mlir::ModuleOp::create(loc);
  b.setInsertionPointToEnd(module->getBody());
  auto function = mlir::func::FuncOp::create(b, loc, ::twell::kernels::to_string(kind),
                                             b.getFunctionType(arguments, results));
  mlir::Block* entry = function.addEntryBlock();
  b.setInsertionPointToStart(entry);
  const mlir::ValueRange operands = entry->getArguments();
  mlir::Operation* op = rowBackward ? tw::TrainRowBackwardOp::create(b, loc, results, operands).getOperation()
                                    : tw::TrainWeightGradOp::create(b, loc, results, operands).getOperation();
  mlir::func::ReturnOp::create(b, loc, op->getResults());
  if (mlir::failed(mlir::verify(*module))) fail(messages.take());
  mlir::PassManager pm(context.get());
  tw::TwellSelectConfigOptions options;
  options.target = target.arch();
  tw::buildTwellKernelPipeline(pm, options);
  if (mlir::failed(pm.run(*module))) fail(messages.take());

  return emitTrainingOp(op);
}

}  // namespace twell::compiler
