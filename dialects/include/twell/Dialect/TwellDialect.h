// The twell MLIR dialect (TwellDialect.td).
#pragma once

#include "mlir/IR/Dialect.h"

#include "twell/Dialect/TwellDialect.h.inc"
