// Operations of the twell dialect: gate_matmul, gated_down, gated_ffn (TwellOps.td).
#pragma once

#include "mlir/Bytecode/BytecodeOpInterface.h"
#include "mlir/IR/BuiltinTypes.h"
#include "mlir/IR/OpDefinition.h"
#include "mlir/IR/OpImplementation.h"
#include "mlir/Interfaces/SideEffectInterfaces.h"

#include "twell/Dialect/TwellAttrs.h"
#include "twell/Dialect/TwellDialect.h"

#define GET_OP_CLASSES
#include "twell/Dialect/TwellOps.h.inc"
