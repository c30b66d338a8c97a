# lit configuration of the twell tests: every .mlir file under this directory is a test whose RUN lines
# call twell-opt, FileCheck and not (found through PATH: twell-opt's directory, then LLVM's tools).
import os

import lit.formats

config.name = "twell"
config.test_format = lit.formats.ShTest(execute_external=False)
config.suffixes = [".mlir"]
config.test_source_root = os.path.dirname(__file__)
config.test_exec_root = config.twell_lit_binary_dir

config.environment["PATH"] = os.pathsep.join(
    [os.path.dirname(config.twell_opt), config.llvm_tools_dir, config.environment.get("PATH", "")]
)
