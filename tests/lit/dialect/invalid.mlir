// Every illegal combination is a verifier error naming the parameter or operand, what is expected and
// what was given.
// RUN: twell-opt %s -split-input-file -verify-diagnostics

//===----------------------------------------------------------------------===//
// #twell.layout
//===----------------------------------------------------------------------===//

// expected-error @+1 {{tile_n must be a power of two between 32 and 1024, got 300}}
func.func private @f(tensor<?x600xbf16, #twell.layout<tile_n = 300, slots = 31, value = bf16, index = i16, activation = relu, threshold = 0.0>>)

// -----

// expected-error @+1 {{tile_n must be a power of two between 32 and 1024, got 16}}
func.func private @f(tensor<?x600xbf16, #twell.layout<tile_n = 16, slots = 15, value = bf16, index = i16, activation = relu, threshold = 0.0>>)

// -----

// expected-error @+1 {{tile_n must be a power of two between 32 and 1024, got 2048}}
func.func private @f(tensor<?x600xbf16, #twell.layout<tile_n = 2048, slots = 31, value = bf16, index = i16, activation = relu, threshold = 0.0>>)

// -----

// expected-error @+1 {{slots must be between 1 and tile_n (256), got 0}}
func.func private @f(tensor<?x600xbf16, #twell.layout<tile_n = 256, slots = 0, value = bf16, index = i16, activation = relu, threshold = 0.0>>)

// -----

// expected-error @+1 {{slots must be between 1 and tile_n (256), got 257}}
func.func private @f(tensor<?x600xbf16, #twell.layout<tile_n = 256, slots = 257, value = bf16, index = i16, activation = relu, threshold = 0.0>>)

// -----

// expected-error @+1 {{value must be bf16 or f16, got 'f32'}}
func.func private @f(tensor<?x600xf32, #twell.layout<tile_n = 256, slots = 31, value = f32, index = i16, activation = relu, threshold = 0.0>>)

// -----

// expected-error @+1 {{index must be a signless integer type, got 'f16'}}
func.func private @f(tensor<?x600xbf16, #twell.layout<tile_n = 256, slots = 31, value = bf16, index = f16, activation = relu, threshold = 0.0>>)

// -----

// expected-error @+1 {{index must be a signless integer type, got 'ui16'}}
func.func private @f(tensor<?x600xbf16, #twell.layout<tile_n = 256, slots = 31, value = bf16, index = ui16, activation = relu, threshold = 0.0>>)

// -----

// expected-error @+1 {{index must be i16 so that an entry (value 'bf16', 16 bits, and its column) fills one 32-bit word, got 'i8'}}
func.func private @f(tensor<?x600xbf16, #twell.layout<tile_n = 256, slots = 31, value = bf16, index = i8, activation = relu, threshold = 0.0>>)

// -----

// expected-error @+1 {{index must be i16 so that an entry (value 'f16', 16 bits, and its column) fills one 32-bit word, got 'i32'}}
func.func private @f(tensor<?x600xf16, #twell.layout<tile_n = 256, slots = 31, value = f16, index = i32, activation = relu, threshold = 0.0>>)

// -----

// expected-error @+1 {{threshold must be >= 0 for activation relu (active iff relu(g) > threshold), got -0.5}}
func.func private @f(tensor<?x600xbf16, #twell.layout<tile_n = 256, slots = 31, value = bf16, index = i16, activation = relu, threshold = -0.5>>)

// -----

// expected-error @+1 {{threshold must be > 0 for activation silu (active iff |silu(g)| > threshold), got 0.0}}
func.func private @f(tensor<?x600xbf16, #twell.layout<tile_n = 256, slots = 31, value = bf16, index = i16, activation = silu, threshold = 0.0>>)

// -----

// expected-error @+1 {{threshold must be > 0 for activation silu (active iff |silu(g)| > threshold), got -1.0}}
func.func private @f(tensor<?x600xbf16, #twell.layout<tile_n = 256, slots = 31, value = bf16, index = i16, activation = silu, threshold = -1.0>>)

// -----

// The bits of an f32 NaN.
// expected-error @+1 {{threshold must be finite, got NaN}}
func.func private @f(tensor<?x600xbf16, #twell.layout<tile_n = 256, slots = 31, value = bf16, index = i16, activation = relu, threshold = 0x7FC00000>>)

// -----

// The bits of +inf.
// expected-error @+1 {{threshold must be finite, got +Inf}}
func.func private @f(tensor<?x600xbf16, #twell.layout<tile_n = 256, slots = 31, value = bf16, index = i16, activation = silu, threshold = 0x7F800000>>)

// -----

// The gate's output is rounded to the value type: a threshold above its largest finite value keeps nothing.
// expected-error @+1 {{threshold must be at most 65504.0, the largest finite f16 (no activation could pass it), got 3.0e+38}}
func.func private @f(tensor<?x600xf16, #twell.layout<tile_n = 256, slots = 31, value = f16, index = i16, activation = silu, threshold = 3.0e+38>>)

// -----

// expected-error @+1 {{threshold must be at most 65504.0, the largest finite f16 (no activation could pass it), got 65505.0}}
func.func private @f(tensor<?x600xf16, #twell.layout<tile_n = 256, slots = 31, value = f16, index = i16, activation = relu, threshold = 65505.0>>)

// -----

// expected-error @+1 {{threshold must be at most 3.3895314e+38, the largest finite bf16 (no activation could pass it), got 3.4028235e+38}}
func.func private @f(tensor<?x600xbf16, #twell.layout<tile_n = 256, slots = 31, value = bf16, index = i16, activation = relu, threshold = 0x7F7FFFFF>>)

// -----

// expected-error @+1 {{#twell.layout encodes a rank-2 tensor [M, d_ff], got rank 3}}
func.func private @f(tensor<2x?x600xbf16, #twell.layout<tile_n = 256, slots = 31, value = bf16, index = i16, activation = relu, threshold = 0.0>>)

// -----

// expected-error @+1 {{#twell.layout: the tensor's element type 'f16' differs from the layout's value type 'bf16'}}
func.func private @f(tensor<?x600xf16, #twell.layout<tile_n = 256, slots = 31, value = bf16, index = i16, activation = relu, threshold = 0.0>>)

// -----

// expected-error @+2 {{expected ::mlir::twell::Activation to be one of: relu, silu}}
// expected-error @+1 {{failed to parse Twell_LayoutAttr parameter 'activation'}}
func.func private @f(tensor<?x600xbf16, #twell.layout<tile_n = 256, slots = 31, value = bf16, index = i16, activation = gelu, threshold = 0.0>>)

// -----

//===----------------------------------------------------------------------===//
// #twell.target
//===----------------------------------------------------------------------===//

// expected-error @+1 {{arch must be of the form sm_<major><minor>[a] (e.g. "sm_90a"), got "hopper"}}
func.func private @f() attributes {target = #twell.target<"hopper", []>}

// -----

// expected-error @+1 {{arch must be sm_80 or newer (bf16 tensor cores), got "sm_75"}}
func.func private @f() attributes {target = #twell.target<"sm_75", [mma_sync]>}

// -----

// expected-error @+1 {{arch must be one NVRTC 13.0 builds for (sm_80, sm_86, sm_87, sm_88, sm_89, sm_90, sm_100, sm_103, sm_110, sm_120, sm_121, sm_90a, sm_100a, sm_103a, sm_110a, sm_120a, sm_121a), got "sm_80a"}}
func.func private @f() attributes {target = #twell.target<"sm_80a", []>}

// -----

// expected-error @+1 {{sm_120a, sm_121a), got "sm_1000"}}
func.func private @f() attributes {target = #twell.target<"sm_1000", []>}

// -----

// expected-error @+1 {{sm_120a, sm_121a), got "sm_2147483647"}}
func.func private @f() attributes {target = #twell.target<"sm_2147483647", []>}

// -----

// expected-error @+1 {{sm_120a, sm_121a), got "sm_101"}}
func.func private @f() attributes {target = #twell.target<"sm_101", []>}

// -----

// expected-error @+1 {{arch must be of the form sm_<major><minor>[a] (e.g. "sm_90a"), got "sm_99999999999"}}
func.func private @f() attributes {target = #twell.target<"sm_99999999999", []>}

// -----

// expected-error @+1 {{arch must be of the form sm_<major><minor>[a] (e.g. "sm_90a"), got "sm_090"}}
func.func private @f() attributes {target = #twell.target<"sm_090", []>}

// -----

// expected-error @+1 {{feature 'wgmma' requires arch "sm_90a", got "sm_90"}}
func.func private @f() attributes {target = #twell.target<"sm_90", [mma_sync, wgmma]>}

// -----

// expected-error @+1 {{feature 'tma' requires arch "sm_90a", got "sm_100a"}}
func.func private @f() attributes {target = #twell.target<"sm_100a", [tma]>}

// -----

// expected-error @+1 {{feature 'tma' is listed twice}}
func.func private @f() attributes {target = #twell.target<"sm_90a", [tma, wgmma, tma]>}

// -----

// expected-error @+2 {{unknown feature 'tcgen05', expected one of wgmma, tma, multicast, mma_sync, cp_async}}
// expected-error @+1 {{failed to parse Twell_TargetAttr parameter 'features'}}
func.func private @f() attributes {target = #twell.target<"sm_100a", [tcgen05]>}

// -----

//===----------------------------------------------------------------------===//
// #twell.config
//===----------------------------------------------------------------------===//

// expected-error @+1 {{cta_m must be between 1 and 4096, got 0}}
func.func private @f() attributes {config = #twell.config<cta_m = 0, cta_k = 16, threads = 256>}

// -----

// expected-error @+1 {{cta_m must be between 1 and 4096, got 4097}}
func.func private @f() attributes {config = #twell.config<cta_m = 4097, cta_k = 16, threads = 256>}

// -----

// cta_m * tile_n would wrap around to 16384 in int64 arithmetic.
// expected-error @+1 {{cta_m must be between 1 and 4096, got 72057594037927936}}
func.func private @f() attributes {config = #twell.config<cta_m = 72057594037927936, cta_k = 16, threads = 256>}

// -----

// expected-error @+1 {{cta_m must be between 1 and 4096, got -9223372036854775808}}
func.func private @f() attributes {config = #twell.config<cta_m = -9223372036854775808, cta_k = 16, threads = 256>}

// -----

// expected-error @+1 {{cta_k must be between 1 and 1024 (or omitted: no K loop), got -16}}
func.func private @f() attributes {config = #twell.config<cta_m = 64, cta_k = -16, threads = 256>}

// -----

// cta_k * (cta_m + tile_n) * 4 would overflow int64 in the shared-memory check.
// expected-error @+1 {{cta_k must be between 1 and 1024 (or omitted: no K loop), got 9223372036854775807}}
func.func private @f() attributes {config = #twell.config<cta_m = 64, cta_k = 9223372036854775807, threads = 256>}

// -----

// expected-error @+1 {{cta_k must be between 1 and 1024 (or omitted: no K loop), got 1025}}
func.func private @f() attributes {config = #twell.config<cta_m = 64, cta_k = 1025, threads = 256>}

// -----

// expected-error @+1 {{threads must be a multiple of 32 between 32 and 1024, got 100}}
func.func private @f() attributes {config = #twell.config<cta_m = 64, cta_k = 16, threads = 100>}

// -----

// expected-error @+1 {{threads must be a multiple of 32 between 32 and 1024, got 2048}}
func.func private @f() attributes {config = #twell.config<cta_m = 1, threads = 2048>}

// -----

// expected-error @+1 {{threads must be a multiple of 32 between 32 and 1024, got 9223372036854775807}}
func.func private @f() attributes {config = #twell.config<cta_m = 1, threads = 9223372036854775807>}

// -----

// expected-error @+1 {{threads must be a multiple of 32 between 32 and 1024, got 0}}
func.func private @f() attributes {config = #twell.config<cta_m = 1, threads = 0>}

// -----

// expected-error @+2 {{unknown mainloop 'hgmma', expected fma, mma_sync or wgmma}}
// expected-error @+1 {{failed to parse Twell_ConfigAttr parameter 'mainloop'}}
func.func private @f() attributes {config = #twell.config<cta_m = 1, threads = 256, mainloop = hgmma>}

// -----

// expected-error @+1 {{stages must be between 0 and 8 (0 or omitted: no pipeline), got -1}}
func.func private @f() attributes {config = #twell.config<cta_m = 128, cta_k = 32, threads = 512, mainloop = mma_sync, stages = -1>}

// -----

// expected-error @+1 {{stages must be between 0 and 8 (0 or omitted: no pipeline), got 9223372036854775807}}
func.func private @f() attributes {config = #twell.config<cta_m = 128, cta_k = 32, threads = 512, mainloop = mma_sync, stages = 9223372036854775807>}

// -----

// expected-error @+1 {{stages: mainloop fma has no cp.async pipeline, stages must be 0 (omitted), got 4}}
func.func private @f() attributes {config = #twell.config<cta_m = 64, cta_k = 16, threads = 256, stages = 4>}

// -----

//===----------------------------------------------------------------------===//
// twell.gate_matmul
//===----------------------------------------------------------------------===//

#L = #twell.layout<tile_n = 256, slots = 31, value = bf16, index = i16, activation = relu, threshold = 0.0>
func.func @f(%x: tensor<?x2048xf32>, %wg: tensor<5632x2048xf32>) {
  // expected-error @+1 {{'twell.gate_matmul' op x: expected element type bf16 or f16, got 'f32'}}
  %h = twell.gate_matmul %x, %wg : (tensor<?x2048xf32>, tensor<5632x2048xf32>) -> tensor<?x5632xbf16, #L>
  return
}

// -----

#L = #twell.layout<tile_n = 256, slots = 31, value = bf16, index = i16, activation = relu, threshold = 0.0>
func.func @f(%x: tensor<*xbf16>, %wg: tensor<5632x2048xbf16>) {
  // expected-error @+1 {{'twell.gate_matmul' op x: expected a ranked tensor, got 'tensor<*xbf16>'}}
  %h = twell.gate_matmul %x, %wg : (tensor<*xbf16>, tensor<5632x2048xbf16>) -> tensor<?x5632xbf16, #L>
  return
}

// -----

#L = #twell.layout<tile_n = 256, slots = 31, value = bf16, index = i16, activation = relu, threshold = 0.0>
func.func @f(%x: tensor<2x?x2048xbf16>, %wg: tensor<5632x2048xbf16>) {
  // expected-error @+1 {{'twell.gate_matmul' op x: expected a rank-2 tensor, got rank 3 ('tensor<2x?x2048xbf16>')}}
  %h = twell.gate_matmul %x, %wg : (tensor<2x?x2048xbf16>, tensor<5632x2048xbf16>) -> tensor<?x5632xbf16, #L>
  return
}

// -----

#L = #twell.layout<tile_n = 256, slots = 31, value = bf16, index = i16, activation = relu, threshold = 0.0>
func.func @f(%x: tensor<?x?xbf16>, %wg: tensor<5632x2048xbf16>) {
  // expected-error @+1 {{'twell.gate_matmul' op x: d_model (dimension 1) must be static, got 'tensor<?x?xbf16>'}}
  %h = twell.gate_matmul %x, %wg : (tensor<?x?xbf16>, tensor<5632x2048xbf16>) -> tensor<?x5632xbf16, #L>
  return
}

// -----

#L = #twell.layout<tile_n = 256, slots = 31, value = bf16, index = i16, activation = relu, threshold = 0.0>
func.func @f(%x: tensor<?x0xbf16>, %wg: tensor<5632x0xbf16>) {
  // expected-error @+1 {{'twell.gate_matmul' op x: d_model (dimension 1) must be positive, got 0}}
  %h = twell.gate_matmul %x, %wg : (tensor<?x0xbf16>, tensor<5632x0xbf16>) -> tensor<?x5632xbf16, #L>
  return
}

// -----

#L = #twell.layout<tile_n = 256, slots = 31, value = bf16, index = i16, activation = relu, threshold = 0.0>
func.func @f(%x: tensor<?x2048xbf16, #L>, %wg: tensor<5632x2048xbf16>) {
  // expected-error @+1 {{'twell.gate_matmul' op x: expected a tensor without encoding, got 'tensor<?x2048xbf16, #twell.layout<}}
  %h = twell.gate_matmul %x, %wg : (tensor<?x2048xbf16, #L>, tensor<5632x2048xbf16>) -> tensor<?x5632xbf16, #L>
  return
}

// -----

#L = #twell.layout<tile_n = 256, slots = 31, value = bf16, index = i16, activation = relu, threshold = 0.0>
func.func @f(%x: tensor<?x2048xbf16>, %wg: tensor<5632x2048xf16>) {
  // expected-error @+1 {{'twell.gate_matmul' op w_gate: expected element type 'bf16' (the element type of x), got 'f16'}}
  %h = twell.gate_matmul %x, %wg : (tensor<?x2048xbf16>, tensor<5632x2048xf16>) -> tensor<?x5632xbf16, #L>
  return
}

// -----

#L = #twell.layout<tile_n = 256, slots = 31, value = bf16, index = i16, activation = relu, threshold = 0.0>
func.func @f(%x: tensor<?x2048xbf16>, %wg: tensor<5632x1024xbf16>) {
  // expected-error @+1 {{'twell.gate_matmul' op w_gate: expected shape [5632, 2048] (d_ff x d_model, nn.Linear layout), got [5632, 1024]}}
  %h = twell.gate_matmul %x, %wg : (tensor<?x2048xbf16>, tensor<5632x1024xbf16>) -> tensor<?x5632xbf16, #L>
  return
}

// -----

#L = #twell.layout<tile_n = 256, slots = 31, value = bf16, index = i16, activation = relu, threshold = 0.0>
func.func @f(%x: tensor<?x2048xbf16>, %wg: tensor<2048x5632xbf16>) {
  // expected-error @+1 {{'twell.gate_matmul' op w_gate: expected shape [5632, 2048] (d_ff x d_model, nn.Linear layout), got [2048, 5632]}}
  %h = twell.gate_matmul %x, %wg : (tensor<?x2048xbf16>, tensor<2048x5632xbf16>) -> tensor<?x5632xbf16, #L>
  return
}

// -----

#L = #twell.layout<tile_n = 256, slots = 31, value = bf16, index = i16, activation = relu, threshold = 0.0>
func.func @f(%x: tensor<?x2048xbf16>, %wg: tensor<?x2048xbf16>) {
  // expected-error @+1 {{'twell.gate_matmul' op w_gate: expected shape [5632, 2048] (d_ff x d_model, nn.Linear layout), got [?, 2048]}}
  %h = twell.gate_matmul %x, %wg : (tensor<?x2048xbf16>, tensor<?x2048xbf16>) -> tensor<?x5632xbf16, #L>
  return
}

// -----

func.func @f(%x: tensor<?x2048xbf16>, %wg: tensor<5632x2048xbf16>) {
  // expected-error @+1 {{'twell.gate_matmul' op h: expected a tensor with a #twell.layout encoding, got 'tensor<?x5632xbf16>'}}
  %h = twell.gate_matmul %x, %wg : (tensor<?x2048xbf16>, tensor<5632x2048xbf16>) -> tensor<?x5632xbf16>
  return
}

// -----

#L = #twell.layout<tile_n = 256, slots = 31, value = bf16, index = i16, activation = relu, threshold = 0.0>
func.func @f(%x: tensor<?x2048xbf16>, %wg: tensor<5632x2048xbf16>) {
  // expected-error @+1 {{'twell.gate_matmul' op h: d_ff (dimension 1) must be static, got 'tensor<?x?xbf16, #twell.layout<}}
  %h = twell.gate_matmul %x, %wg : (tensor<?x2048xbf16>, tensor<5632x2048xbf16>) -> tensor<?x?xbf16, #L>
  return
}

// -----

#L = #twell.layout<tile_n = 256, slots = 31, value = f16, index = i16, activation = relu, threshold = 0.0>
func.func @f(%x: tensor<?x2048xbf16>, %wg: tensor<5632x2048xbf16>) {
  // expected-error @+1 {{'twell.gate_matmul' op h: expected element type 'bf16' (the element type of x), got 'f16'}}
  %h = twell.gate_matmul %x, %wg : (tensor<?x2048xbf16>, tensor<5632x2048xbf16>) -> tensor<?x5632xf16, #L>
  return
}

// -----

#L = #twell.layout<tile_n = 256, slots = 31, value = bf16, index = i16, activation = relu, threshold = 0.0>
func.func @f(%x: tensor<16x2048xbf16>, %wg: tensor<5632x2048xbf16>) {
  // expected-error @+1 {{'twell.gate_matmul' op h: dimension 0 (tokens) is 8, but x has 16 tokens}}
  %h = twell.gate_matmul %x, %wg : (tensor<16x2048xbf16>, tensor<5632x2048xbf16>) -> tensor<8x5632xbf16, #L>
  return
}

// -----

#L = #twell.layout<tile_n = 256, slots = 31, value = bf16, index = i16, activation = relu, threshold = 0.0>
func.func @f(%x: tensor<?x2048xbf16>, %wg: tensor<5632x2048xbf16>) {
  // expected-error @+1 {{'twell.gate_matmul' op config: cta_m * tile_n must be 16384 for the gate kernel (cta_m = 64 at tile_n = 256), got cta_m = 32}}
  %h = twell.gate_matmul %x, %wg {config = #twell.config<cta_m = 32, cta_k = 16, threads = 256>}
      : (tensor<?x2048xbf16>, tensor<5632x2048xbf16>) -> tensor<?x5632xbf16, #L>
  return
}

// -----

#L = #twell.layout<tile_n = 256, slots = 31, value = bf16, index = i16, activation = relu, threshold = 0.0>
func.func @f(%x: tensor<?x2048xbf16>, %wg: tensor<5632x2048xbf16>) {
  // expected-error @+1 {{'twell.gate_matmul' op config: the gate kernel needs a K step, cta_k must be positive, got #twell.config<cta_m = 64, threads = 256>}}
  %h = twell.gate_matmul %x, %wg {config = #twell.config<cta_m = 64, threads = 256>}
      : (tensor<?x2048xbf16>, tensor<5632x2048xbf16>) -> tensor<?x5632xbf16, #L>
  return
}

// -----

#L = #twell.layout<tile_n = 256, slots = 31, value = bf16, index = i16, activation = relu, threshold = 0.0>
func.func @f(%x: tensor<?x2048xbf16>, %wg: tensor<5632x2048xbf16>) {
  // expected-error @+1 {{'twell.gate_matmul' op config: the gate kernel lays its threads out 16 x 16, threads must be 256, got 128}}
  %h = twell.gate_matmul %x, %wg {config = #twell.config<cta_m = 64, cta_k = 16, threads = 128>}
      : (tensor<?x2048xbf16>, tensor<5632x2048xbf16>) -> tensor<?x5632xbf16, #L>
  return
}

// -----

#L = #twell.layout<tile_n = 1024, slots = 31, value = bf16, index = i16, activation = relu, threshold = 0.0>
func.func @f(%x: tensor<?x2048xbf16>, %wg: tensor<5632x2048xbf16>) {
  // expected-error @+1 {{'twell.gate_matmul' op config: the gate kernel would need 66560 bytes of static shared memory (cta_k * (cta_m + tile_n) * 4 at cta_k = 16), more than 49152: lower cta_k}}
  %h = twell.gate_matmul %x, %wg {config = #twell.config<cta_m = 16, cta_k = 16, threads = 256>}
      : (tensor<?x2048xbf16>, tensor<5632x2048xbf16>) -> tensor<?x5632xbf16, #L>
  return
}

// -----

// The largest cta_k: the shared-memory size is computed exactly.
#L = #twell.layout<tile_n = 256, slots = 31, value = bf16, index = i16, activation = relu, threshold = 0.0>
func.func @f(%x: tensor<?x2048xbf16>, %wg: tensor<5632x2048xbf16>) {
  // expected-error @+1 {{'twell.gate_matmul' op config: the gate kernel would need 1310720 bytes of static shared memory (cta_k * (cta_m + tile_n) * 4 at cta_k = 1024), more than 49152: lower cta_k}}
  %h = twell.gate_matmul %x, %wg {config = #twell.config<cta_m = 64, cta_k = 1024, threads = 256>}
      : (tensor<?x2048xbf16>, tensor<5632x2048xbf16>) -> tensor<?x5632xbf16, #L>
  return
}

// -----

// expected-error @+1 {{cluster_m must be between 1 and 8 (1 or omitted: no cluster), got 0}}
func.func private @f() attributes {config = #twell.config<cta_m = 128, cta_k = 64, threads = 384, mainloop = wgmma, stages = 3, cluster_m = 0>}

// -----

// Clusters: the wgmma gate shares its w_gate tile across 1 or 2 CTAs.
#L = #twell.layout<tile_n = 256, slots = 31, value = bf16, index = i16, activation = relu, threshold = 0.0>
func.func @f(%x: tensor<?x2048xbf16>, %wg: tensor<5632x2048xbf16>) {
  // expected-error @+1 {{'twell.gate_matmul' op config: mainloop wgmma shares the w_gate tile across cluster_m = 1 or 2 CTAs, got cluster_m = 4}}
  %h = twell.gate_matmul %x, %wg {config = #twell.config<cta_m = 128, cta_k = 64, threads = 384, mainloop = wgmma, stages = 3, cluster_m = 4>}
      : (tensor<?x2048xbf16>, tensor<5632x2048xbf16>) -> tensor<?x5632xbf16, #L>
  return
}

// -----

// Clusters multicast: only on a target with the multicast feature.
#L = #twell.layout<tile_n = 256, slots = 31, value = bf16, index = i16, activation = relu, threshold = 0.0>
func.func @f(%x: tensor<?x2048xbf16>, %wg: tensor<5632x2048xbf16>) {
  // expected-error @+1 {{'twell.gate_matmul' op config: cluster_m = 2 multicasts the w_gate tile: it needs a target with feature multicast, got #twell.target<"sm_90a", [wgmma, tma]>}}
  %h = twell.gate_matmul %x, %wg {config = #twell.config<cta_m = 128, cta_k = 64, threads = 384, mainloop = wgmma, stages = 3, cluster_m = 2>,
                                  target = #twell.target<"sm_90a", [wgmma, tma]>}
      : (tensor<?x2048xbf16>, tensor<5632x2048xbf16>) -> tensor<?x5632xbf16, #L>
  return
}

// -----

// Clusters: the wgmma gate only.
#L = #twell.layout<tile_n = 256, slots = 31, value = bf16, index = i16, activation = relu, threshold = 0.0>
func.func @f(%x: tensor<?x2048xbf16>, %wg: tensor<5632x2048xbf16>) {
  // expected-error @+1 {{'twell.gate_matmul' op config: only mainloop wgmma runs in clusters (TMA multicast), cluster_m must be 1 (omitted), got #twell.config<cta_m = 128, cta_k = 32, threads = 512, mainloop = mma_sync, stages = 4, cluster_m = 2>}}
  %h = twell.gate_matmul %x, %wg {config = #twell.config<cta_m = 128, cta_k = 32, threads = 512, mainloop = mma_sync, stages = 4, cluster_m = 2>}
      : (tensor<?x2048xbf16>, tensor<5632x2048xbf16>) -> tensor<?x5632xbf16, #L>
  return
}

// -----

// Clusters: not the consumers.
#L = #twell.layout<tile_n = 256, slots = 31, value = bf16, index = i16, activation = relu, threshold = 0.0>
func.func @f(%x: tensor<?x2048xbf16>, %h: tensor<?x5632xbf16, #L>, %wu: tensor<5632x2048xbf16>,
             %wd: tensor<2048x5632xbf16>) {
  // expected-error @+1 {{'twell.gated_down' op config: the gated_down kernel runs no clusters, cluster_m must be omitted, got #twell.config<cta_m = 1, threads = 256, mainloop = wgmma, cluster_m = 2, consumer = cta_row>}}
  %y = twell.gated_down %x, %h, %wu, %wd {config = #twell.config<cta_m = 1, threads = 256, mainloop = wgmma, cluster_m = 2, consumer = cta_row>}
      : (tensor<?x2048xbf16>, tensor<?x5632xbf16, #L>, tensor<5632x2048xbf16>, tensor<2048x5632xbf16>) -> tensor<?x2048xbf16>
  return
}

// -----

// mainloop wgmma: only on a target with the wgmma and tma features.
#L = #twell.layout<tile_n = 256, slots = 31, value = bf16, index = i16, activation = relu, threshold = 0.0>
func.func @f(%x: tensor<?x2048xbf16>, %wg: tensor<5632x2048xbf16>) {
  // expected-error @+1 {{'twell.gate_matmul' op config: mainloop wgmma needs a target with features wgmma and tma (sm_90a), got #twell.target<"sm_80", [mma_sync, cp_async]>}}
  %h = twell.gate_matmul %x, %wg {config = #twell.config<cta_m = 128, cta_k = 64, threads = 384, mainloop = wgmma, stages = 4>,
                                  target = #twell.target<"sm_80", [mma_sync, cp_async]>}
      : (tensor<?x2048xbf16>, tensor<5632x2048xbf16>) -> tensor<?x5632xbf16, #L>
  return
}

// -----

// mainloop wgmma: the tile width is the wgmma N.
#L = #twell.layout<tile_n = 512, slots = 31, value = bf16, index = i16, activation = relu, threshold = 0.0>
func.func @f(%x: tensor<?x2048xbf16>, %wg: tensor<5632x2048xbf16>) {
  // expected-error @+1 {{'twell.gate_matmul' op config: mainloop wgmma takes the tile width as the wgmma N: tile_n must be 64, 128 or 256, got 512}}
  %h = twell.gate_matmul %x, %wg {config = #twell.config<cta_m = 128, cta_k = 64, threads = 384, mainloop = wgmma, stages = 2>}
      : (tensor<?x2048xbf16>, tensor<5632x2048xbf16>) -> tensor<?x5632xbf16, #L>
  return
}

// -----

// mainloop wgmma: whole K steps.
#L = #twell.layout<tile_n = 256, slots = 31, value = bf16, index = i16, activation = relu, threshold = 0.0>
func.func @f(%x: tensor<?x514xbf16>, %wg: tensor<5632x514xbf16>) {
  // expected-error @+1 {{'twell.gate_matmul' op config: mainloop wgmma needs d_model % cta_k == 0 (whole K steps of 64; cta_k 32 takes d_model % 32 == 0), got d_model 514}}
  %h = twell.gate_matmul %x, %wg {config = #twell.config<cta_m = 128, cta_k = 64, threads = 384, mainloop = wgmma, stages = 4>}
      : (tensor<?x514xbf16>, tensor<5632x514xbf16>) -> tensor<?x5632xbf16, #L>
  return
}

// -----

// mainloop wgmma: fixed CTA shape.
#L = #twell.layout<tile_n = 256, slots = 31, value = bf16, index = i16, activation = relu, threshold = 0.0>
func.func @f(%x: tensor<?x2048xbf16>, %wg: tensor<5632x2048xbf16>) {
  // expected-error @+1 {{'twell.gate_matmul' op config: mainloop wgmma needs cta_m = 128, cta_k = 32 or 64 (one 64- or 128-byte swizzle row), threads = 384 (a producer and two consumer warpgroups), got #twell.config<cta_m = 64, cta_k = 64, threads = 384, mainloop = wgmma, stages = 4>}}
  %h = twell.gate_matmul %x, %wg {config = #twell.config<cta_m = 64, cta_k = 64, threads = 384, mainloop = wgmma, stages = 4>}
      : (tensor<?x2048xbf16>, tensor<5632x2048xbf16>) -> tensor<?x5632xbf16, #L>
  return
}

// -----

// mainloop wgmma: the ring must fit shared memory (3 stages of 48 KiB and 66 KiB of staging at tile_n 256).
#L = #twell.layout<tile_n = 256, slots = 31, value = bf16, index = i16, activation = relu, threshold = 0.0>
func.func @f(%x: tensor<?x2048xbf16>, %wg: tensor<5632x2048xbf16>) {
  // expected-error @+1 {{'twell.gate_matmul' op config: mainloop wgmma needs a TMA ring of 2 to 3 stages at tile_n = 256, cta_k = 64 (at most 6, and at most 232448 bytes of shared memory), got stages = 4}}
  %h = twell.gate_matmul %x, %wg {config = #twell.config<cta_m = 128, cta_k = 64, threads = 384, mainloop = wgmma, stages = 4>}
      : (tensor<?x2048xbf16>, tensor<5632x2048xbf16>) -> tensor<?x5632xbf16, #L>
  return
}

// -----

// mainloop wgmma at cta_k 32 (64-byte swizzle rows): 24 KiB stages, at most 6 at tile_n 256.
#L = #twell.layout<tile_n = 256, slots = 31, value = bf16, index = i16, activation = relu, threshold = 0.0>
func.func @f(%x: tensor<?x2048xbf16>, %wg: tensor<5632x2048xbf16>) {
  // expected-error @+1 {{'twell.gate_matmul' op config: mainloop wgmma needs a TMA ring of 2 to 6 stages at tile_n = 256, cta_k = 32 (at most 6, and at most 232448 bytes of shared memory), got stages = 7}}
  %h = twell.gate_matmul %x, %wg {config = #twell.config<cta_m = 128, cta_k = 32, threads = 384, mainloop = wgmma, stages = 7>}
      : (tensor<?x2048xbf16>, tensor<5632x2048xbf16>) -> tensor<?x5632xbf16, #L>
  return
}

// -----

// mainloop wgmma: only the 64- and 128-byte swizzle rows.
#L = #twell.layout<tile_n = 256, slots = 31, value = bf16, index = i16, activation = relu, threshold = 0.0>
func.func @f(%x: tensor<?x2048xbf16>, %wg: tensor<5632x2048xbf16>) {
  // expected-error @+1 {{'twell.gate_matmul' op config: mainloop wgmma needs cta_m = 128, cta_k = 32 or 64 (one 64- or 128-byte swizzle row), threads = 384 (a producer and two consumer warpgroups), got #twell.config<cta_m = 128, cta_k = 16, threads = 384, mainloop = wgmma, stages = 4>}}
  %h = twell.gate_matmul %x, %wg {config = #twell.config<cta_m = 128, cta_k = 16, threads = 384, mainloop = wgmma, stages = 4>}
      : (tensor<?x2048xbf16>, tensor<5632x2048xbf16>) -> tensor<?x5632xbf16, #L>
  return
}

// -----

// mainloop mma_sync: rows of x and w_gate are read in 16-byte chunks.
#L = #twell.layout<tile_n = 256, slots = 31, value = bf16, index = i16, activation = relu, threshold = 0.0>
func.func @f(%x: tensor<?x514xbf16>, %wg: tensor<5632x514xbf16>) {
  // expected-error @+1 {{'twell.gate_matmul' op config: mainloop mma_sync needs d_model % 8 == 0 (16-byte cp.async chunks), got d_model 514}}
  %h = twell.gate_matmul %x, %wg {config = #twell.config<cta_m = 128, cta_k = 32, threads = 512, mainloop = mma_sync, stages = 4>}
      : (tensor<?x514xbf16>, tensor<5632x514xbf16>) -> tensor<?x5632xbf16, #L>
  return
}

// -----

#L = #twell.layout<tile_n = 32, slots = 31, value = bf16, index = i16, activation = relu, threshold = 0.0>
func.func @f(%x: tensor<?x2048xbf16>, %wg: tensor<5632x2048xbf16>) {
  // expected-error @+1 {{'twell.gate_matmul' op config: mainloop mma_sync needs 64 <= tile_n <= 1024, got tile_n 32}}
  %h = twell.gate_matmul %x, %wg {config = #twell.config<cta_m = 128, cta_k = 32, threads = 512, mainloop = mma_sync, stages = 4>}
      : (tensor<?x2048xbf16>, tensor<5632x2048xbf16>) -> tensor<?x5632xbf16, #L>
  return
}

// -----

#L = #twell.layout<tile_n = 256, slots = 31, value = bf16, index = i16, activation = relu, threshold = 0.0>
func.func @f(%x: tensor<?x2048xbf16>, %wg: tensor<5632x2048xbf16>) {
  // expected-error @+1 {{'twell.gate_matmul' op config: mainloop mma_sync steps K by 32, cta_k must be 32, got 16}}
  %h = twell.gate_matmul %x, %wg {config = #twell.config<cta_m = 128, cta_k = 16, threads = 512, mainloop = mma_sync, stages = 4>}
      : (tensor<?x2048xbf16>, tensor<5632x2048xbf16>) -> tensor<?x5632xbf16, #L>
  return
}

// -----

#L = #twell.layout<tile_n = 256, slots = 31, value = bf16, index = i16, activation = relu, threshold = 0.0>
func.func @f(%x: tensor<?x2048xbf16>, %wg: tensor<5632x2048xbf16>) {
  // expected-error @+1 {{'twell.gate_matmul' op config: mainloop mma_sync runs 512 threads (16 warps), threads must be 512, got 128}}
  %h = twell.gate_matmul %x, %wg {config = #twell.config<cta_m = 128, cta_k = 32, threads = 128, mainloop = mma_sync, stages = 4>}
      : (tensor<?x2048xbf16>, tensor<5632x2048xbf16>) -> tensor<?x5632xbf16, #L>
  return
}

// -----

#L = #twell.layout<tile_n = 256, slots = 31, value = bf16, index = i16, activation = relu, threshold = 0.0>
func.func @f(%x: tensor<?x2048xbf16>, %wg: tensor<5632x2048xbf16>) {
  // expected-error @+1 {{'twell.gate_matmul' op config: mainloop mma_sync needs cta_m = min(128, 32768 / tile_n) = 128 at tile_n = 256, got cta_m = 64}}
  %h = twell.gate_matmul %x, %wg {config = #twell.config<cta_m = 64, cta_k = 32, threads = 512, mainloop = mma_sync, stages = 4>}
      : (tensor<?x2048xbf16>, tensor<5632x2048xbf16>) -> tensor<?x5632xbf16, #L>
  return
}

// -----

#L = #twell.layout<tile_n = 512, slots = 31, value = bf16, index = i16, activation = relu, threshold = 0.0>
func.func @f(%x: tensor<?x2048xbf16>, %wg: tensor<5632x2048xbf16>) {
  // expected-error @+1 {{'twell.gate_matmul' op config: mainloop mma_sync needs cta_m = min(128, 32768 / tile_n) = 64 at tile_n = 512, got cta_m = 128}}
  %h = twell.gate_matmul %x, %wg {config = #twell.config<cta_m = 128, cta_k = 32, threads = 512, mainloop = mma_sync, stages = 4>}
      : (tensor<?x2048xbf16>, tensor<5632x2048xbf16>) -> tensor<?x5632xbf16, #L>
  return
}

// -----

#L = #twell.layout<tile_n = 256, slots = 31, value = bf16, index = i16, activation = relu, threshold = 0.0>
func.func @f(%x: tensor<?x2048xbf16>, %wg: tensor<5632x2048xbf16>) {
  // expected-error @+1 {{'twell.gate_matmul' op config: mainloop mma_sync needs a cp.async pipeline of 2 to 4 stages, got stages = 0}}
  %h = twell.gate_matmul %x, %wg {config = #twell.config<cta_m = 128, cta_k = 32, threads = 512, mainloop = mma_sync>}
      : (tensor<?x2048xbf16>, tensor<5632x2048xbf16>) -> tensor<?x5632xbf16, #L>
  return
}

// -----

#L = #twell.layout<tile_n = 256, slots = 31, value = bf16, index = i16, activation = relu, threshold = 0.0>
func.func @f(%x: tensor<?x2048xbf16>, %wg: tensor<5632x2048xbf16>) {
  // expected-error @+1 {{'twell.gate_matmul' op config: mainloop mma_sync needs a cp.async pipeline of 2 to 4 stages, got stages = 5}}
  %h = twell.gate_matmul %x, %wg {config = #twell.config<cta_m = 128, cta_k = 32, threads = 512, mainloop = mma_sync, stages = 5>}
      : (tensor<?x2048xbf16>, tensor<5632x2048xbf16>) -> tensor<?x5632xbf16, #L>
  return
}

// -----

// tile_n = 1024: a stage is (32 + 1024) * 80 = 84480 bytes, 3 of them overflow 200 KiB.
#L = #twell.layout<tile_n = 1024, slots = 31, value = bf16, index = i16, activation = relu, threshold = 0.0>
func.func @f(%x: tensor<?x2048xbf16>, %wg: tensor<5632x2048xbf16>) {
  // expected-error @+1 {{'twell.gate_matmul' op config: mainloop mma_sync with stages = 3 would need 253440 bytes of shared memory (max(stages * (cta_m + tile_n) * 80, cta_m * tile_n * 2)), more than 204800: lower stages (at most 2 at tile_n = 1024)}}
  %h = twell.gate_matmul %x, %wg {config = #twell.config<cta_m = 32, cta_k = 32, threads = 512, mainloop = mma_sync, stages = 3>}
      : (tensor<?x2048xbf16>, tensor<5632x2048xbf16>) -> tensor<?x5632xbf16, #L>
  return
}

// -----

// The largest cta_m: cta_m * tile_n is compared without forming a product.
#L = #twell.layout<tile_n = 1024, slots = 31, value = bf16, index = i16, activation = relu, threshold = 0.0>
func.func @f(%x: tensor<?x2048xbf16>, %wg: tensor<5632x2048xbf16>) {
  // expected-error @+1 {{'twell.gate_matmul' op config: cta_m * tile_n must be 16384 for the gate kernel (cta_m = 16 at tile_n = 1024), got cta_m = 4096}}
  %h = twell.gate_matmul %x, %wg {config = #twell.config<cta_m = 4096, cta_k = 16, threads = 256>}
      : (tensor<?x2048xbf16>, tensor<5632x2048xbf16>) -> tensor<?x5632xbf16, #L>
  return
}

// -----

#L = #twell.layout<tile_n = 256, slots = 31, value = bf16, index = i16, activation = relu, threshold = 0.0>
func.func @f(%x: tensor<?x2048xbf16>, %wg: tensor<5632x2048xbf16>) {
  // expected-error @+1 {{'twell.gate_matmul' op kernel_name: expected a C identifier (the kernel's extern "C" symbol), got "9-lives"}}
  %h = twell.gate_matmul %x, %wg {kernel_name = "9-lives",
      target = #twell.target<"sm_90a", []>, config = #twell.config<cta_m = 64, cta_k = 16, threads = 256>}
      : (tensor<?x2048xbf16>, tensor<5632x2048xbf16>) -> tensor<?x5632xbf16, #L>
  return
}

// -----

#L = #twell.layout<tile_n = 256, slots = 31, value = bf16, index = i16, activation = relu, threshold = 0.0>
func.func @f(%x: tensor<?x2048xbf16>, %wg: tensor<5632x2048xbf16>) {
  // expected-error @+1 {{'twell.gate_matmul' op kernel_name: a specialized kernel must also carry its target and config}}
  %h = twell.gate_matmul %x, %wg {kernel_name = "gate", target = #twell.target<"sm_90a", []>}
      : (tensor<?x2048xbf16>, tensor<5632x2048xbf16>) -> tensor<?x5632xbf16, #L>
  return
}

// -----

//===----------------------------------------------------------------------===//
// twell.gated_down
//===----------------------------------------------------------------------===//

func.func @f(%x: tensor<?x2048xbf16>, %h: tensor<?x5632xbf16>, %wu: tensor<5632x2048xbf16>,
             %wd: tensor<2048x5632xbf16>) {
  // expected-error @+1 {{'twell.gated_down' op h: expected a tensor with a #twell.layout encoding, got 'tensor<?x5632xbf16>'}}
  %y = twell.gated_down %x, %h, %wu, %wd
      : (tensor<?x2048xbf16>, tensor<?x5632xbf16>, tensor<5632x2048xbf16>, tensor<2048x5632xbf16>) -> tensor<?x2048xbf16>
  return
}

// -----

#L = #twell.layout<tile_n = 256, slots = 31, value = bf16, index = i16, activation = relu, threshold = 0.0>
func.func @f(%x: tensor<?x2048xf16>, %h: tensor<?x5632xbf16, #L>, %wu: tensor<5632x2048xf16>,
             %wd: tensor<2048x5632xf16>) {
  // expected-error @+1 {{'twell.gated_down' op h: expected element type 'f16' (the element type of x), got 'bf16'}}
  %y = twell.gated_down %x, %h, %wu, %wd
      : (tensor<?x2048xf16>, tensor<?x5632xbf16, #L>, tensor<5632x2048xf16>, tensor<2048x5632xf16>) -> tensor<?x2048xf16>
  return
}

// -----

#L = #twell.layout<tile_n = 256, slots = 31, value = bf16, index = i16, activation = relu, threshold = 0.0>
func.func @f(%x: tensor<4x2048xbf16>, %h: tensor<5x5632xbf16, #L>, %wu: tensor<5632x2048xbf16>,
             %wd: tensor<2048x5632xbf16>) {
  // expected-error @+1 {{'twell.gated_down' op h: dimension 0 (tokens) is 5, but x has 4 tokens}}
  %y = twell.gated_down %x, %h, %wu, %wd
      : (tensor<4x2048xbf16>, tensor<5x5632xbf16, #L>, tensor<5632x2048xbf16>, tensor<2048x5632xbf16>) -> tensor<4x2048xbf16>
  return
}

// -----

#L = #twell.layout<tile_n = 256, slots = 31, value = bf16, index = i16, activation = relu, threshold = 0.0>
func.func @f(%x: tensor<?x2048xbf16>, %h: tensor<?x5632xbf16, #L>, %wu: tensor<5632x1024xbf16>,
             %wd: tensor<2048x5632xbf16>) {
  // expected-error @+1 {{'twell.gated_down' op w_up: expected shape [5632, 2048] (d_ff x d_model, nn.Linear layout), got [5632, 1024]}}
  %y = twell.gated_down %x, %h, %wu, %wd
      : (tensor<?x2048xbf16>, tensor<?x5632xbf16, #L>, tensor<5632x1024xbf16>, tensor<2048x5632xbf16>) -> tensor<?x2048xbf16>
  return
}

// -----

#L = #twell.layout<tile_n = 256, slots = 31, value = bf16, index = i16, activation = relu, threshold = 0.0>
func.func @f(%x: tensor<?x2048xbf16>, %h: tensor<?x5632xbf16, #L>, %wu: tensor<5632x2048xbf16>,
             %wd: tensor<5632x2048xbf16>) {
  // expected-error @+1 {{'twell.gated_down' op w_down: expected shape [2048, 5632] (d_model x d_ff, nn.Linear layout; declare down_layout = #twell.down_layout<in_out> for [d_ff, d_model]), got [5632, 2048]}}
  %y = twell.gated_down %x, %h, %wu, %wd
      : (tensor<?x2048xbf16>, tensor<?x5632xbf16, #L>, tensor<5632x2048xbf16>, tensor<5632x2048xbf16>) -> tensor<?x2048xbf16>
  return
}

// -----

#L = #twell.layout<tile_n = 256, slots = 31, value = bf16, index = i16, activation = relu, threshold = 0.0>
func.func @f(%x: tensor<?x2048xbf16>, %h: tensor<?x5632xbf16, #L>, %wu: tensor<5632x2048xbf16>,
             %wd: tensor<2048x5632xbf16>) {
  // expected-error @+1 {{'twell.gated_down' op w_down: expected shape [5632, 2048] (d_ff x d_model, down_layout = #twell.down_layout<in_out>), got [2048, 5632]}}
  %y = twell.gated_down %x, %h, %wu, %wd {down_layout = #twell.down_layout<in_out>}
      : (tensor<?x2048xbf16>, tensor<?x5632xbf16, #L>, tensor<5632x2048xbf16>, tensor<2048x5632xbf16>) -> tensor<?x2048xbf16>
  return
}

// -----

#L = #twell.layout<tile_n = 256, slots = 31, value = bf16, index = i16, activation = relu, threshold = 0.0>
func.func @f(%x: tensor<?x2048xbf16>, %h: tensor<?x5632xbf16, #L>, %wu: tensor<5632x2048xbf16>,
             %wd: tensor<2048x5632xbf16>) {
  // expected-error @+1 {{'twell.gated_down' op y: expected shape [?, 2048] (tokens x d_model), got [?, 5632]}}
  %y = twell.gated_down %x, %h, %wu, %wd
      : (tensor<?x2048xbf16>, tensor<?x5632xbf16, #L>, tensor<5632x2048xbf16>, tensor<2048x5632xbf16>) -> tensor<?x5632xbf16>
  return
}

// -----

#L = #twell.layout<tile_n = 256, slots = 31, value = bf16, index = i16, activation = relu, threshold = 0.0>
func.func @f(%x: tensor<?x2048xbf16>, %h: tensor<?x5632xbf16, #L>, %wu: tensor<5632x2048xbf16>,
             %wd: tensor<2048x5632xbf16>) {
  // expected-error @+1 {{'twell.gated_down' op y: expected element type 'bf16' (the element type of x), got 'f32'}}
  %y = twell.gated_down %x, %h, %wu, %wd
      : (tensor<?x2048xbf16>, tensor<?x5632xbf16, #L>, tensor<5632x2048xbf16>, tensor<2048x5632xbf16>) -> tensor<?x2048xf32>
  return
}

// -----

#L = #twell.layout<tile_n = 256, slots = 31, value = bf16, index = i16, activation = relu, threshold = 0.0>
func.func @f(%x: tensor<?x2048xbf16>, %h: tensor<?x5632xbf16, #L>, %wu: tensor<5632x2048xbf16>,
             %wd: tensor<2048x5632xbf16>) {
  // expected-error @+1 {{'twell.gated_down' op config: the gated_down kernel has no K loop, cta_k must be omitted, got #twell.config<cta_m = 1, cta_k = 16, threads = 256>}}
  %y = twell.gated_down %x, %h, %wu, %wd {config = #twell.config<cta_m = 1, cta_k = 16, threads = 256>}
      : (tensor<?x2048xbf16>, tensor<?x5632xbf16, #L>, tensor<5632x2048xbf16>, tensor<2048x5632xbf16>) -> tensor<?x2048xbf16>
  return
}

// -----

#L = #twell.layout<tile_n = 256, slots = 31, value = bf16, index = i16, activation = relu, threshold = 0.0>
func.func @f(%x: tensor<?x2048xbf16>, %h: tensor<?x5632xbf16, #L>, %wu: tensor<5632x2048xbf16>,
             %wd: tensor<2048x5632xbf16>) {
  // expected-error @+1 {{'twell.gated_down' op config: the gated_down kernel's variant must be named: consumer = cta_row (one token row per CTA, cta_m = 1), warp_row (one per warp, cta_m = threads / 32) or token_block (16 rows on 256 threads), got #twell.config<cta_m = 4, threads = 256>}}
  %y = twell.gated_down %x, %h, %wu, %wd {config = #twell.config<cta_m = 4, threads = 256>}
      : (tensor<?x2048xbf16>, tensor<?x5632xbf16, #L>, tensor<5632x2048xbf16>, tensor<2048x5632xbf16>) -> tensor<?x2048xbf16>
  return
}

// -----

// The variant is named and its CTA tile must agree with it.
// expected-error @+1 {{consumer warp_row takes one token row per warp: cta_m must be threads / 32 = 8 (more than one warp), got 4}}
func.func private @f() attributes {config = #twell.config<cta_m = 4, threads = 256, consumer = warp_row>}

// -----

// expected-error @+1 {{consumer token_block takes 16 token rows on 256 threads: cta_m must be 16 and threads 256, got 16 and 128}}
func.func private @f() attributes {config = #twell.config<cta_m = 16, threads = 128, consumer = token_block>}

// -----

// expected-error @+2 {{unknown consumer 'tiles', expected cta_row, warp_row or token_block}}
// expected-error @+1 {{failed to parse Twell_ConfigAttr parameter 'consumer'}}
func.func private @f() attributes {config = #twell.config<cta_m = 1, threads = 256, consumer = tiles>}

// -----

#L = #twell.layout<tile_n = 256, slots = 31, value = bf16, index = i16, activation = relu, threshold = 0.0>
func.func @f(%x: tensor<?x2048xbf16>, %wg: tensor<5632x2048xbf16>) {
  // expected-error @+1 {{'twell.gate_matmul' op config: consumer names a consumer kernel's variant; the gate kernel's config has none, got #twell.config<cta_m = 8, cta_k = 16, threads = 256, consumer = warp_row>}}
  %h = twell.gate_matmul %x, %wg {config = #twell.config<cta_m = 8, cta_k = 16, threads = 256, consumer = warp_row>}
      : (tensor<?x2048xbf16>, tensor<5632x2048xbf16>) -> tensor<?x5632xbf16, #L>
  return
}

// -----

// One row per warp keeps the row in registers: 16-byte rows of Wd^T (in_out), so not an nn.Linear Wd.
#L = #twell.layout<tile_n = 256, slots = 31, value = bf16, index = i16, activation = relu, threshold = 0.0>
func.func @f(%x: tensor<?x2048xbf16>, %h: tensor<?x5632xbf16, #L>, %wu: tensor<5632x2048xbf16>,
             %wd: tensor<2048x5632xbf16>) {
  // expected-error @+1 {{'twell.gated_down' op config: one token row per warp needs a tensor-core gate (mainloop mma_sync or wgmma), in_out down weights, d_model a multiple of 8 up to 2048 and 256 threads, got mainloop wgmma, out_in, d_model 2048, threads 256}}
  %y = twell.gated_down %x, %h, %wu, %wd {config = #twell.config<cta_m = 8, threads = 256, mainloop = wgmma, consumer = warp_row>}
      : (tensor<?x2048xbf16>, tensor<?x5632xbf16, #L>, tensor<5632x2048xbf16>, tensor<2048x5632xbf16>) -> tensor<?x2048xbf16>
  return
}

// -----

#L = #twell.layout<tile_n = 256, slots = 31, value = bf16, index = i16, activation = relu, threshold = 0.0>
func.func @f(%x: tensor<?x2048xbf16>, %h: tensor<?x5632xbf16, #L>, %wu: tensor<5632x2048xbf16>,
             %wd: tensor<2048x5632xbf16>) {
  // expected-error @+1 {{'twell.gated_down' op config: only the token-block gated_down kernel (cta_m = 16) has a cp.async pipeline, stages must be omitted, got #twell.config<cta_m = 1, threads = 256, mainloop = mma_sync, stages = 4, consumer = cta_row>}}
  %y = twell.gated_down %x, %h, %wu, %wd {config = #twell.config<cta_m = 1, threads = 256, mainloop = mma_sync, stages = 4, consumer = cta_row>}
      : (tensor<?x2048xbf16>, tensor<?x5632xbf16, #L>, tensor<5632x2048xbf16>, tensor<2048x5632xbf16>) -> tensor<?x2048xbf16>
  return
}

// -----

#L = #twell.layout<tile_n = 256, slots = 31, value = bf16, index = i16, activation = relu, threshold = 0.0>
func.func @f(%x: tensor<?x2048xbf16>, %h: tensor<?x5632xbf16, #L>, %wu: tensor<5632x2048xbf16>,
             %wd: tensor<2048x5632xbf16>) {
  // expected-error @+1 {{'twell.gated_down' op kernel_name: a specialized kernel must also carry its target and config}}
  %y = twell.gated_down %x, %h, %wu, %wd {kernel_name = "down", config = #twell.config<cta_m = 1, threads = 256, consumer = cta_row>}
      : (tensor<?x2048xbf16>, tensor<?x5632xbf16, #L>, tensor<5632x2048xbf16>, tensor<2048x5632xbf16>) -> tensor<?x2048xbf16>
  return
}

// -----

//===----------------------------------------------------------------------===//
// twell.gated_ffn
//===----------------------------------------------------------------------===//

#L = #twell.layout<tile_n = 256, slots = 31, value = f16, index = i16, activation = relu, threshold = 0.0>
func.func @f(%x: tensor<?x2048xbf16>, %wg: tensor<5632x2048xbf16>, %wu: tensor<5632x2048xbf16>,
             %wd: tensor<2048x5632xbf16>) {
  // expected-error @+1 {{'twell.gated_ffn' op layout: value type 'f16' differs from the element type 'bf16' of x}}
  %y = twell.gated_ffn %x, %wg, %wu, %wd {layout = #L}
      : (tensor<?x2048xbf16>, tensor<5632x2048xbf16>, tensor<5632x2048xbf16>, tensor<2048x5632xbf16>) -> tensor<?x2048xbf16>
  return
}

// -----

#L = #twell.layout<tile_n = 256, slots = 31, value = bf16, index = i16, activation = relu, threshold = 0.0>
func.func @f(%x: tensor<?x2048xbf16>, %wg: tensor<?x2048xbf16>, %wu: tensor<5632x2048xbf16>,
             %wd: tensor<2048x5632xbf16>) {
  // expected-error @+1 {{'twell.gated_ffn' op w_gate: d_ff (dimension 0) must be static, got [?, 2048]}}
  %y = twell.gated_ffn %x, %wg, %wu, %wd {layout = #L}
      : (tensor<?x2048xbf16>, tensor<?x2048xbf16>, tensor<5632x2048xbf16>, tensor<2048x5632xbf16>) -> tensor<?x2048xbf16>
  return
}

// -----

#L = #twell.layout<tile_n = 256, slots = 31, value = bf16, index = i16, activation = relu, threshold = 0.0>
func.func @f(%x: tensor<?x2048xbf16>, %wg: tensor<5632x1024xbf16>, %wu: tensor<5632x2048xbf16>,
             %wd: tensor<2048x5632xbf16>) {
  // expected-error @+1 {{'twell.gated_ffn' op w_gate: expected shape [5632, 2048] (d_ff x d_model, nn.Linear layout), got [5632, 1024]}}
  %y = twell.gated_ffn %x, %wg, %wu, %wd {layout = #L}
      : (tensor<?x2048xbf16>, tensor<5632x1024xbf16>, tensor<5632x2048xbf16>, tensor<2048x5632xbf16>) -> tensor<?x2048xbf16>
  return
}

// -----

#L = #twell.layout<tile_n = 256, slots = 31, value = bf16, index = i16, activation = relu, threshold = 0.0>
func.func @f(%x: tensor<?x2048xbf16>, %wg: tensor<5632x2048xbf16>, %wu: tensor<5632x1024xbf16>,
             %wd: tensor<2048x5632xbf16>) {
  // expected-error @+1 {{'twell.gated_ffn' op w_up: expected shape [5632, 2048] (d_ff x d_model, nn.Linear layout), got [5632, 1024]}}
  %y = twell.gated_ffn %x, %wg, %wu, %wd {layout = #L}
      : (tensor<?x2048xbf16>, tensor<5632x2048xbf16>, tensor<5632x1024xbf16>, tensor<2048x5632xbf16>) -> tensor<?x2048xbf16>
  return
}

// -----

#L = #twell.layout<tile_n = 256, slots = 31, value = bf16, index = i16, activation = relu, threshold = 0.0>
func.func @f(%x: tensor<?x2048xbf16>, %wg: tensor<5632x2048xbf16>, %wu: tensor<5632x2048xbf16>,
             %wd: tensor<5632x2048xbf16>) {
  // expected-error @+1 {{'twell.gated_ffn' op w_down: expected shape [2048, 5632] (d_model x d_ff, nn.Linear layout; declare down_layout = #twell.down_layout<in_out> for [d_ff, d_model]), got [5632, 2048]}}
  %y = twell.gated_ffn %x, %wg, %wu, %wd {layout = #L}
      : (tensor<?x2048xbf16>, tensor<5632x2048xbf16>, tensor<5632x2048xbf16>, tensor<5632x2048xbf16>) -> tensor<?x2048xbf16>
  return
}

// -----

#L = #twell.layout<tile_n = 256, slots = 31, value = bf16, index = i16, activation = relu, threshold = 0.0>
func.func @f(%x: tensor<?x2048xbf16>, %wg: tensor<5632x2048xbf16>, %wu: tensor<5632x2048xbf16>,
             %wd: tensor<2048x5632xbf16>) {
  // expected-error @+1 {{'twell.gated_ffn' op w_down: expected shape [5632, 2048] (d_ff x d_model, down_layout = #twell.down_layout<in_out>), got [2048, 5632]}}
  %y = twell.gated_ffn %x, %wg, %wu, %wd {layout = #L, down_layout = #twell.down_layout<in_out>}
      : (tensor<?x2048xbf16>, tensor<5632x2048xbf16>, tensor<5632x2048xbf16>, tensor<2048x5632xbf16>) -> tensor<?x2048xbf16>
  return
}

// -----

#L = #twell.layout<tile_n = 256, slots = 31, value = bf16, index = i16, activation = relu, threshold = 0.0>
func.func @f(%x: tensor<8x2048xbf16>, %wg: tensor<5632x2048xbf16>, %wu: tensor<5632x2048xbf16>,
             %wd: tensor<2048x5632xbf16>) {
  // expected-error @+1 {{'twell.gated_ffn' op y: dimension 0 (tokens) is 4, but x has 8 tokens}}
  %y = twell.gated_ffn %x, %wg, %wu, %wd {layout = #L}
      : (tensor<8x2048xbf16>, tensor<5632x2048xbf16>, tensor<5632x2048xbf16>, tensor<2048x5632xbf16>) -> tensor<4x2048xbf16>
  return
}

// -----

#L = #twell.layout<tile_n = 256, slots = 31, value = bf16, index = i16, activation = relu, threshold = 0.0>
func.func @f(%x: tensor<?x2048xbf16>, %wg: tensor<5632x2048xbf16>, %wu: tensor<5632x2048xbf16>,
             %wd: tensor<2048x5632xbf16>) {
  // expected-error @+1 {{'twell.gated_ffn' op y: expected a tensor without encoding, got 'tensor<?x2048xbf16, #twell.layout<}}
  %y = twell.gated_ffn %x, %wg, %wu, %wd {layout = #L}
      : (tensor<?x2048xbf16>, tensor<5632x2048xbf16>, tensor<5632x2048xbf16>, tensor<2048x5632xbf16>) -> tensor<?x2048xbf16, #L>
  return
}

// -----

func.func @f(%x: tensor<?x2048xbf16>, %wg: tensor<5632x2048xbf16>, %wu: tensor<5632x2048xbf16>,
             %wd: tensor<2048x5632xbf16>) {
  // expected-error @+1 {{'twell.gated_ffn' op requires attribute 'layout'}}
  %y = twell.gated_ffn %x, %wg, %wu, %wd
      : (tensor<?x2048xbf16>, tensor<5632x2048xbf16>, tensor<5632x2048xbf16>, tensor<2048x5632xbf16>) -> tensor<?x2048xbf16>
  return
}

// -----

// The warp-per-row consumer's shared memory (a tile-row per warp) and registers fit 256 threads only.
#L = #twell.layout<tile_n = 1024, slots = 127, value = bf16, index = i16, activation = relu, threshold = 0.0>
func.func @f(%x: tensor<?x2048xbf16>, %h: tensor<?x5632xbf16, #L>, %wu: tensor<5632x2048xbf16>,
             %wd: tensor<5632x2048xbf16>) {
  // expected-error @+1 {{'twell.gated_down' op config: one token row per warp needs a tensor-core gate (mainloop mma_sync or wgmma), in_out down weights, d_model a multiple of 8 up to 2048 and 256 threads, got mainloop mma_sync, in_out, d_model 2048, threads 1024}}
  %y = twell.gated_down %x, %h, %wu, %wd {config = #twell.config<cta_m = 32, threads = 1024, mainloop = mma_sync, consumer = warp_row>,
                                          down_layout = #twell.down_layout<in_out>}
      : (tensor<?x2048xbf16>, tensor<?x5632xbf16, #L>, tensor<5632x2048xbf16>, tensor<5632x2048xbf16>) -> tensor<?x2048xbf16>
  return
}

// -----

// The consumer's overflow recompute repeats an mma_sync gate: d_model % 8 == 0.
#L = #twell.layout<tile_n = 256, slots = 31, value = bf16, index = i16, activation = relu, threshold = 0.0>
func.func @f(%x: tensor<?x514xbf16>, %h: tensor<?x5632xbf16, #L>, %wu: tensor<5632x514xbf16>,
             %wd: tensor<514x5632xbf16>) {
  // expected-error @+1 {{'twell.gated_down' op config: mainloop mma_sync (the gate's, repeated by the overflow recompute) needs d_model % 8 == 0, got d_model 514}}
  %y = twell.gated_down %x, %h, %wu, %wd {config = #twell.config<cta_m = 1, threads = 256, mainloop = mma_sync, consumer = cta_row>}
      : (tensor<?x514xbf16>, tensor<?x5632xbf16, #L>, tensor<5632x514xbf16>, tensor<514x5632xbf16>) -> tensor<?x514xbf16>
  return
}

// -----

// A consumer of a wgmma gate: only where such a gate exists.
#L = #twell.layout<tile_n = 256, slots = 31, value = bf16, index = i16, activation = relu, threshold = 0.0>
func.func @f(%x: tensor<?x520xbf16>, %h: tensor<?x5632xbf16, #L>, %wu: tensor<5632x520xbf16>,
             %wd: tensor<520x5632xbf16>) {
  // expected-error @+1 {{'twell.gated_down' op config: mainloop wgmma (the gate's) needs d_model % 32 == 0 and tile_n 64, 128 or 256, got d_model 520, tile_n 256}}
  %y = twell.gated_down %x, %h, %wu, %wd {config = #twell.config<cta_m = 1, threads = 256, mainloop = wgmma, consumer = cta_row>}
      : (tensor<?x520xbf16>, tensor<?x5632xbf16, #L>, tensor<5632x520xbf16>, tensor<520x5632xbf16>) -> tensor<?x520xbf16>
  return
}

// -----

// The token block (cta_m = 16) keeps 16 x d_model / 8 outputs per warp in registers and loads whole
// in_out Wd^T rows per pass: d_model a power of two from 128 to 2048.
#L = #twell.layout<tile_n = 256, slots = 31, value = bf16, index = i16, activation = relu, threshold = 0.0>
func.func @f(%x: tensor<?x2056xbf16>, %h: tensor<?x5632xbf16, #L>, %wu: tensor<5632x2056xbf16>,
             %wd: tensor<5632x2056xbf16>) {
  // expected-error @+1 {{'twell.gated_down' op config: a token block (cta_m = 16) needs a tensor-core gate (mainloop mma_sync or wgmma), in_out down weights, d_model 128, 256, 512, 1024 or 2048 and tile_n <= 256, got mainloop mma_sync, in_out, d_model 2056, tile_n 256}}
  %y = twell.gated_down %x, %h, %wu, %wd {down_layout = #twell.down_layout<in_out>,
                                           config = #twell.config<cta_m = 16, threads = 256, mainloop = mma_sync, stages = 4, consumer = token_block>}
      : (tensor<?x2056xbf16>, tensor<?x5632xbf16, #L>, tensor<5632x2056xbf16>, tensor<5632x2056xbf16>) -> tensor<?x2056xbf16>
  return
}

// -----

#L = #twell.layout<tile_n = 256, slots = 31, value = bf16, index = i16, activation = relu, threshold = 0.0>
func.func @f(%x: tensor<?x2048xbf16>, %h: tensor<?x5632xbf16, #L>, %wu: tensor<5632x2048xbf16>,
             %wd: tensor<5632x2048xbf16>) {
  // expected-error @+1 {{'twell.gated_down' op config: a token block needs stages 3..6 (its cp.async ring), got 2}}
  %y = twell.gated_down %x, %h, %wu, %wd {down_layout = #twell.down_layout<in_out>,
                                           config = #twell.config<cta_m = 16, threads = 256, mainloop = mma_sync, stages = 2, consumer = token_block>}
      : (tensor<?x2048xbf16>, tensor<?x5632xbf16, #L>, tensor<5632x2048xbf16>, tensor<5632x2048xbf16>) -> tensor<?x2048xbf16>
  return
}

// -----

// 6 stages of 34816 bytes do not fit the 163 KiB an sm_80 CTA may use.
#L = #twell.layout<tile_n = 256, slots = 31, value = bf16, index = i16, activation = relu, threshold = 0.0>
func.func @f(%x: tensor<?x2048xbf16>, %h: tensor<?x5632xbf16, #L>, %wu: tensor<5632x2048xbf16>,
             %wd: tensor<5632x2048xbf16>) {
  // expected-error @+1 {{'twell.gated_down' op config: a token block with stages = 6 needs 224416 bytes of shared memory at d_model 2048, d_ff 5632, tile_n 256; the target allows 166912}}
  %y = twell.gated_down %x, %h, %wu, %wd {down_layout = #twell.down_layout<in_out>, target = #twell.target<"sm_80", [mma_sync, cp_async]>,
                                           config = #twell.config<cta_m = 16, threads = 256, mainloop = mma_sync, stages = 6, consumer = token_block>}
      : (tensor<?x2048xbf16>, tensor<?x5632xbf16, #L>, tensor<5632x2048xbf16>, tensor<5632x2048xbf16>) -> tensor<?x2048xbf16>
  return
}

// -----

//===----------------------------------------------------------------------===//
// twell.down and twell.ffn (non-gated)
//===----------------------------------------------------------------------===//

#L = #twell.layout<tile_n = 256, slots = 31, value = bf16, index = i16, activation = relu, threshold = 0.0>
func.func @down_w_down_shape(%x: tensor<?x2048xbf16>, %h: tensor<?x5632xbf16, #L>, %wd: tensor<5632x2048xbf16>) {
  // expected-error @+1 {{'twell.down' op w_down: expected shape [2048, 5632]}}
  %y = twell.down %x, %h, %wd : (tensor<?x2048xbf16>, tensor<?x5632xbf16, #L>, tensor<5632x2048xbf16>) -> tensor<?x2048xbf16>
  return
}

// -----

// The token block is a gated kernel: twell.down rejects it.
#L = #twell.layout<tile_n = 256, slots = 31, value = bf16, index = i16, activation = relu, threshold = 0.0>
func.func @down_token_block(%x: tensor<?x2048xbf16>, %h: tensor<?x5632xbf16, #L>, %wd: tensor<5632x2048xbf16>) {
  // expected-error @+1 {{'twell.down' op config: the token block (cta_m = 16) is a gated kernel; twell.down takes one token row per warp or per CTA}}
  %y = twell.down %x, %h, %wd {down_layout = #twell.down_layout<in_out>, target = #twell.target<"sm_90a", [wgmma, tma]>,
                               config = #twell.config<cta_m = 16, threads = 256, mainloop = wgmma, stages = 6, consumer = token_block>}
      : (tensor<?x2048xbf16>, tensor<?x5632xbf16, #L>, tensor<5632x2048xbf16>) -> tensor<?x2048xbf16>
  return
}

// -----

#L = #twell.layout<tile_n = 256, slots = 31, value = bf16, index = i16, activation = relu, threshold = 0.0>
func.func @down_cta_k(%x: tensor<?x2048xbf16>, %h: tensor<?x5632xbf16, #L>, %wd: tensor<2048x5632xbf16>) {
  // expected-error @+1 {{'twell.down' op config: the down kernel has no K loop, cta_k must be omitted}}
  %y = twell.down %x, %h, %wd {config = #twell.config<cta_m = 1, cta_k = 16, threads = 256>}
      : (tensor<?x2048xbf16>, tensor<?x5632xbf16, #L>, tensor<2048x5632xbf16>) -> tensor<?x2048xbf16>
  return
}

// -----

#L = #twell.layout<tile_n = 256, slots = 31, value = bf16, index = i16, activation = relu, threshold = 0.0>
func.func @ffn_w_gate_shape(%x: tensor<?x2048xbf16>, %wg: tensor<5632x1024xbf16>, %wd: tensor<2048x5632xbf16>) {
  // expected-error @+1 {{'twell.ffn' op w_gate: expected shape}}
  %y = twell.ffn %x, %wg, %wd {layout = #L} : (tensor<?x2048xbf16>, tensor<5632x1024xbf16>, tensor<2048x5632xbf16>) -> tensor<?x2048xbf16>
  return
}
