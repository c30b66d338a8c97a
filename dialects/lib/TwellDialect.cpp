// Registration of the twell dialect's attributes and operations.
#include "twell/Dialect/TwellDialect.h"

#include "twell/Dialect/TwellAttrs.h"
#include "twell/Dialect/TwellOps.h"

#include "twell/Dialect/TwellDialect.cpp.inc"

namespace mlir::twell {

void TwellDialect::initialize() {
  registerAttributes();
  addOperations<
#define GET_OP_LIST
#include "twell/Dialect/TwellOps.cpp.inc"
      >();
}

}  // namespace mlir::twell
