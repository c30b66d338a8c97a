// Input nested deeper than twell's limit (256 levels of brackets, twell/compiler/SourceNesting.h) is an
// error naming the position and the limit, not a stack overflow in MLIR's parser (issue 16): twell-opt
// (file and standard input) and twellc emit / compile check before parsing.
// RUN: python3 -c "print('module {' * 5000 + '}' * 5000)" > %t.modules.mlir
// RUN: not twell-opt %t.modules.mlir 2>&1 | FileCheck %s --check-prefix=MODULES
// RUN: not twell-opt < %t.modules.mlir 2>&1 | FileCheck %s --check-prefix=STDIN
// RUN: not twellc emit %t.modules.mlir 2>&1 | FileCheck %s --check-prefix=MODULES
// RUN: not twellc compile %t.modules.mlir -o %t.bundle 2>&1 | FileCheck %s --check-prefix=MODULES
// RUN: python3 -c "print('module attributes {test.a = ' + '[' * 5000 + ']' * 5000 + '} {}')" > %t.attr.mlir
// RUN: not twell-opt %t.attr.mlir 2>&1 | FileCheck %s --check-prefix=ATTR
// RUN: not twellc emit %t.attr.mlir 2>&1 | FileCheck %s --check-prefix=ATTR
// RUN: python3 -c "print('func.func private @f() -> ' + 'tuple<' * 5000 + 'i32' + '>' * 5000)" > %t.tuple.mlir
// RUN: not twell-opt %t.tuple.mlir 2>&1 | FileCheck %s --check-prefix=TUPLE
// `->` and `>=` close nothing: 128 + 129 levels are 257.
// RUN: python3 -c "print('[' * 128 + '() -> ' * 200 + '(d0 >= 0)' * 200 + '[' * 129)" > %t.arrows.mlir
// RUN: not twell-opt %t.arrows.mlir 2>&1 | FileCheck %s --check-prefix=ARROWS
// A safetensors header nested 70000 deep, in the tensor or in __metadata__ (twellc run): a short error.
// RUN: python3 -c "import struct, sys; q = chr(34); h = ('{' + q + 't' + q + ': ' + '[' * 70000 + ']' * 70000 + '}').encode(); sys.stdout.buffer.write(struct.pack('<Q', len(h)) + h)" > %t.deep.safetensors
// RUN: not twellc run %t.deep.safetensors 2>&1 | FileCheck %s --check-prefix=SAFETENSORS
// RUN: python3 -c "import struct, sys; q = chr(34); h = ('{' + q + '__metadata__' + q + ': {' + q + 'm' + q + ': ' + ('{' + q + 'a' + q + ': ') * 70000 + '0' + '}' * 70000 + '}}').encode(); sys.stdout.buffer.write(struct.pack('<Q', len(h)) + h)" > %t.meta.safetensors
// RUN: not twellc run %t.meta.safetensors 2>&1 | FileCheck %s --check-prefix=SAFETENSORS
// At the limit, and brackets in strings and comments (this file has 300 of each) do not count.
// RUN: python3 -c "print('module {' * 256 + '}' * 256)" | twell-opt | FileCheck %s --check-prefix=LIMIT
// RUN: twell-opt %s | FileCheck %s --check-prefix=SELF

// MODULES: modules.mlir:1:2056: error: brackets nested 257 deep here: expected at most 256 levels (twell's nesting limit: MLIR's parser recurses once per level and would overflow the stack)
// STDIN: <stdin>:1:2056: error: brackets nested 257 deep here: expected at most 256 levels
// ATTR: attr.mlir:1:284: error: brackets nested 257 deep here
// TUPLE: tuple.mlir:1:1568: error: brackets nested 257 deep here
// ARROWS: arrows.mlir:1:3257: error: brackets nested 257 deep here
// SAFETENSORS: twellc run: error: '{{.*}}.safetensors' is not a valid safetensors file: expected a header nested at most 64 levels deep (safetensors nests 3), got one nested deeper
// LIMIT-COUNT-256: module {
// SELF: func.func private @f(i32) -> i32

// (((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((( [[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[ {{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{
module attributes {test.s = "[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[ \" {{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{", test.set = affine_set<(d0) : (d0 >= 0)>} {
  func.func private @f(i32) -> i32
}
