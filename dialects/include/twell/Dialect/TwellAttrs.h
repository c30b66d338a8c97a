// Attributes of the twell dialect: #twell.layout (a tensor encoding), #twell.target, #twell.config,
// and the enums Activation, DownLayout, Feature, Mainloop and ConsumerVariant (TwellAttrs.td).
#pragma once

#include "mlir/IR/Attributes.h"
#include "mlir/IR/BuiltinAttributes.h"
#include "mlir/IR/DialectImplementation.h"
#include "mlir/IR/TensorEncoding.h"

#include "twell/Dialect/TwellEnums.h.inc"

#define GET_ATTRDEF_CLASSES
#include "twell/Dialect/TwellAttrs.h.inc"
