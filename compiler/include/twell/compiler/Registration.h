// What a driver (twell-opt, twellc) needs to read twell IR and run its passes, behind one light
// header (BUILD_NOTES.md: drivers should not rebuild when a .td file changes).
#pragma once

namespace mlir {
class DialectRegistry;
}

namespace mlir::twell {

// Inserts the dialects of twell IR (twell, func) into `registry`, and registers the twell passes
// and the `twell-kernel-pipeline` pipeline with MLIR's global pass registry (once per process;
// thread-safe).
void registerTwellDialectsAndPasses(DialectRegistry& registry);

}  // namespace mlir::twell
