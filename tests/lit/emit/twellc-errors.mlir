// twellc emit's bad command lines: each error names the option, what was expected and what was given,
// and the notes say what was not emitted. (This file is a valid FFN for the last RUN lines.)
// RUN: not twellc emit --d-model 2048 2>&1 | FileCheck %s --check-prefix=MISSING
// RUN: not twellc emit --d-ff 2>&1 | FileCheck %s --check-prefix=NOVALUE
// RUN: not twellc emit %t.does-not-exist.mlir 2>&1 | FileCheck %s --check-prefix=NOFILE
// RUN: not twellc emit --d-model 64 --d-ff 64 --threshold 1e400 2>&1 | FileCheck %s --check-prefix=RANGE
// RUN: not twellc emit --d-model 64 --d-ff 64 --threshold 1e39 2>&1 | FileCheck %s --check-prefix=F32
// RUN: not twellc emit --d-model 64 --d-ff 64 --tile-n 100 2>&1 | FileCheck %s --check-prefix=TILE
// RUN: not twellc emit --d-model 64 --d-ff 64 --tile-n 64 --slots 65 2>&1 | FileCheck %s --check-prefix=SLOTS
// RUN: not twellc emit --d-model 64 --d-ff 64 --activation silu 2>&1 | FileCheck %s --check-prefix=SILU
// RUN: not twellc 2>&1 | FileCheck %s --check-prefix=NOCMD
// RUN: twellc emit --d-model 2047 --d-ff 64 --emit cuda 2>&1 >/dev/null | FileCheck %s --check-prefix=NODECODE
// RUN: twellc emit --d-model 2048 --d-ff 5632 --consumer block --emit cuda 2>&1 >/dev/null | FileCheck %s --check-prefix=BLOCK
// twellc compile: the output directory, the targets, and a bundle that cannot be written.
// RUN: not twellc compile --d-model 64 --d-ff 64 2>&1 | FileCheck %s --check-prefix=NOOUT
// RUN: not twellc compile --d-model 64 --d-ff 64 --target sm_90a,sm_90a -o %t.bundle 2>&1 | FileCheck %s --check-prefix=TWICE
// RUN: not twellc compile --d-model 64 --d-ff 64 --target sm_75 -o %t.bundle 2>&1 | FileCheck %s --check-prefix=OLD
// RUN: not twellc compile --sample --d-model 64 -o %t.bundle 2>&1 | FileCheck %s --check-prefix=SAMPLE
// RUN: not twellc compile --d-model 64 --d-ff 64 --target sm_90a, -o %t.bundle 2>&1 | FileCheck %s --check-prefix=COMMA
// RUN: not twellc compile --d-model 64 --d-ff 64 --target sm_90a,sm_999 -o %t.bundle 2>&1 | FileCheck %s --check-prefix=BADARCH
// RUN: not twellc compile --d-model 64 --d-ff 64 --non-gated --consumer block -o %t.bundle 2>&1 | FileCheck %s --check-prefix=NGBLOCK
// RUN: not twellc compile --d-model 64 --d-ff 64 --threshold -0.5 -o %t.bundle 2>&1 | FileCheck %s --check-prefix=NEGRELU
// RUN: rm -rf %t.file && touch %t.file && not twellc compile --d-model 64 --d-ff 64 -o %t.file 2>&1 | FileCheck %s --check-prefix=BLOCKED
// twellc compile --tuning-dir: a database directory, a shape that leaves the layout to it.
// RUN: not twellc compile --d-model 64 --d-ff 64 --tuning-workload density:1% -o %t.bundle 2>&1 | FileCheck %s --check-prefix=TWALONE
// RUN: not twellc compile --d-model 64 --d-ff 64 --tuning-dir %t.no-such-dir -o %t.bundle 2>&1 | FileCheck %s --check-prefix=TWDIR
// RUN: not twellc compile --d-model 64 --d-ff 64 --tile-n 64 --tuning-dir %S -o %t.bundle 2>&1 | FileCheck %s --check-prefix=TWTILE
// RUN: not twellc compile %s --tuning-dir %S -o %t.bundle 2>&1 | FileCheck %s --check-prefix=TWMLIR

// MISSING: --d-ff: expected it beside --d-model (a shape needs both d_model and d_ff), got only --d-model
// NOVALUE: --d-ff: expected a value after it, got the end of the command line
// NOFILE: FILE.mlir: cannot open '{{.*}}does-not-exist.mlir': No such file or directory
// RANGE: --threshold: expected a finite number, got '1e400' (out of range)
// F32: --threshold: expected a finite f32 (|t| <= 3.4e38), got 1e+39
// TILE: --tile-n: expected a power of two in 32..1024, got 100
// SLOTS: --slots: expected 1..tile_n (64), got 65
// SILU: --threshold: expected a value > 0 with --activation silu (a neuron is active iff |silu(g)| > threshold), got 0
// NOCMD: twellc: expected a command (run, emit, compile, tune or cache), got none
// NODECODE: note: no decode kernels for this layer
// NOOUT: -o DIR: expected the output directory, got none
// TWICE: --target: sm_90a given twice
// OLD: --target: twell needs sm_80 or newer (bf16 cvt), got 'sm_75'
// SAMPLE: --d-model: --sample gives the shape, got both
// COMMA: --target: expected a comma-separated list like sm_90a,sm_80, got 'sm_90a,'
// BADARCH: --target: expected one of sm_80, {{.*}}, got 'sm_999'
// NGBLOCK: --consumer: the token block is a gated kernel; with --non-gated expected rows, got 'block'
// NEGRELU: --threshold: expected a value >= 0 with --activation relu, got -0.5
// BLOCKED: twellc compile: error: writing the bundle {{.*}}.file/sm_90a: cannot create the directory
// TWALONE: --tuning-workload: expected with --tuning-dir, got it alone
// TWDIR: --tuning-dir: expected a tuning database directory (twellc tune's), got '{{.*}}no-such-dir' (nothing there)
// TWTILE: --tuning-dir: expected a spec that leaves tile_n, slots and the cluster to the tuned entry, got --tile-n (plans of it take no tuned layout: config_source "option")
// TWMLIR: --tuning-dir: expected a shape (--d-model/--d-ff or --sample), got '{{.*}}twellc-errors.mlir', whose kernels carry their own configuration
// BLOCK: note: --consumer block needs --down-layout in_out, {{.*}} emitted the row consumer twell_gated_down_{{.*}}_out_in_{{[0-9a-f]+}} instead

func.func @unused() {
  return
}
