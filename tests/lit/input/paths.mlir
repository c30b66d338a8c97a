// A FILE argument that is a directory, missing, empty or not the right format is named as such
// (issue 16): twellc emit and compile say "a directory" where they said "expected one FFN, got 0";
// twell-opt says it through MLIR; twellc run checks its safetensors files the same way.
// RUN: rm -rf %t.dir && mkdir -p %t.dir
// RUN: not twellc emit %t.dir 2>&1 | FileCheck %s --check-prefix=DIR
// RUN: not twellc compile %t.dir -o %t.bundle 2>&1 | FileCheck %s --check-prefix=DIR
// RUN: not twell-opt %t.dir 2>&1 | FileCheck %s --check-prefix=OPTDIR
// RUN: not twellc emit %t.missing.mlir 2>&1 | FileCheck %s --check-prefix=MISSING
// RUN: not twellc compile %t.missing.mlir -o %t.bundle 2>&1 | FileCheck %s --check-prefix=MISSING
// RUN: not twell-opt %t.missing.mlir 2>&1 | FileCheck %s --check-prefix=OPTMISSING
// RUN: rm -f %t.empty && touch %t.empty
// RUN: not twellc emit %t.empty 2>&1 | FileCheck %s --check-prefix=EMPTY
// RUN: not twellc run %t.dir 2>&1 | FileCheck %s --check-prefix=RUNDIR
// RUN: not twellc run %t.missing.safetensors 2>&1 | FileCheck %s --check-prefix=RUNMISSING
// RUN: not twellc run %t.empty 2>&1 | FileCheck %s --check-prefix=RUNEMPTY
// RUN: not twellc run %s 2>&1 | FileCheck %s --check-prefix=RUNTEXT

// DIR: error: FILE.mlir: expected a file, got '{{.*}}paths.mlir.tmp.dir', a directory
// OPTDIR: cannot open input file '{{.*}}paths.mlir.tmp.dir': Is a directory
// MISSING: error: FILE.mlir: cannot open '{{.*}}paths.mlir.tmp.missing.mlir': No such file or directory
// OPTMISSING: cannot open input file '{{.*}}paths.mlir.tmp.missing.mlir': No such file or directory
// EMPTY: error: FILE.mlir: expected a module with one FFN, got '{{.*}}paths.mlir.tmp.empty', an empty file
// RUNDIR: error: safetensors file '{{.*}}paths.mlir.tmp.dir': expected a regular file, got a directory
// RUNMISSING: error: safetensors file '{{.*}}paths.mlir.tmp.missing.safetensors': cannot open (No such file or directory)
// RUNEMPTY: error: '{{.*}}paths.mlir.tmp.empty' is not a valid safetensors file: expected at least 8 bytes (header length), got 0
// RUNTEXT: error: '{{.*}}paths.mlir' is not a valid safetensors file: header length {{[0-9]+}} exceeds the {{[0-9]+}} bytes after it
