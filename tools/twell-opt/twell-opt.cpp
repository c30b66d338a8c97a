// twell-opt: mlir-opt with the twell dialect and passes, for lit tests and for inspecting the
// pipeline.
#include "mlir/IR/DialectRegistry.h"
#include "mlir/Tools/mlir-opt/MlirOptMain.h"
#include "twell/compiler/Registration.h"

int main(int argc, char** argv) {
  mlir::DialectRegistry registry;
  mlir::twell::registerTwellDialectsAndPasses(registry);
  return mlir::asMainReturnCode(mlir::MlirOptMain(
      argc, argv, "twell optimizer: the twell dialect and its passes\n", registry));
}
