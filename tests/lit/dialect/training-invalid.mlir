// The training ops' verifiers: every illegal operand or result is an error naming it, what is
// expected and what was given.
// RUN: twell-opt %s -split-input-file -verify-diagnostics

#l = #twell.layout<tile_n = 256, slots = 31, value = bf16, index = i16, activation = relu, threshold = 0.0>
func.func @f(%x: tensor<?x512xbf16>, %dy: tensor<?x256xbf16>, %h: tensor<?x1408xbf16, #l>, %w: tensor<1408x512xbf16>) {
  // expected-error @+1 {{dy: expected shape [?, 512] (tokens x d_model), got [?, 256]}}
  %dx, %dg = twell.train_row_backward %x, %dy, %h, %w, %w
      : (tensor<?x512xbf16>, tensor<?x256xbf16>, tensor<?x1408xbf16, #l>, tensor<1408x512xbf16>, tensor<1408x512xbf16>)
      -> (tensor<?x512xbf16>, tensor<?x1408xf32>)
  return
}

// -----

#l = #twell.layout<tile_n = 256, slots = 31, value = bf16, index = i16, activation = relu, threshold = 0.0>
func.func @f(%x: tensor<?x512xbf16>, %h: tensor<?x1408xbf16, #l>, %w: tensor<1408x512xbf16>, %wd: tensor<512x1408xbf16>) {
  // expected-error @+1 {{w_down: expected shape [1408, 512] (d_ff x d_model: the in_out layout the row consumer reads), got [512, 1408]}}
  %dx, %dg = twell.train_row_backward %x, %x, %h, %w, %wd
      : (tensor<?x512xbf16>, tensor<?x512xbf16>, tensor<?x1408xbf16, #l>, tensor<1408x512xbf16>, tensor<512x1408xbf16>)
      -> (tensor<?x512xbf16>, tensor<?x1408xf32>)
  return
}

// -----

#l = #twell.layout<tile_n = 256, slots = 31, value = bf16, index = i16, activation = relu, threshold = 0.0>
func.func @f(%x: tensor<?x512xbf16>, %h: tensor<?x1408xbf16, #l>, %w: tensor<1408x512xbf16>) {
  // expected-error @+1 {{dg: expected element type f32 (gradients accumulate in fp32), got 'bf16'}}
  %dx, %dg = twell.train_row_backward %x, %x, %h, %w, %w
      : (tensor<?x512xbf16>, tensor<?x512xbf16>, tensor<?x1408xbf16, #l>, tensor<1408x512xbf16>, tensor<1408x512xbf16>)
      -> (tensor<?x512xbf16>, tensor<?x1408xbf16>)
  return
}

// -----

#l = #twell.layout<tile_n = 256, slots = 31, value = bf16, index = i16, activation = relu, threshold = 0.0>
func.func @f(%x: tensor<?x512xbf16>, %h: tensor<?x1408xbf16, #l>, %w: tensor<1408x512xbf16>) {
  // expected-error @+1 {{du: expected a du result exactly when w_up is given (a gated layer), got w_up without du}}
  %dx, %dg = twell.train_row_backward %x, %x, %h, %w, %w, %w
      : (tensor<?x512xbf16>, tensor<?x512xbf16>, tensor<?x1408xbf16, #l>, tensor<1408x512xbf16>, tensor<1408x512xbf16>,
         tensor<1408x512xbf16>) -> (tensor<?x512xbf16>, tensor<?x1408xf32>)
  return
}

// -----

func.func @f(%x: tensor<?x512xbf16>, %h: tensor<?x1408xbf16>, %w: tensor<1408x512xbf16>) {
  // expected-error @+1 {{h: expected a tensor with a #twell.layout encoding, got 'tensor<?x1408xbf16>'}}
  %dx, %dg = twell.train_row_backward %x, %x, %h, %w, %w
      : (tensor<?x512xbf16>, tensor<?x512xbf16>, tensor<?x1408xbf16>, tensor<1408x512xbf16>, tensor<1408x512xbf16>)
      -> (tensor<?x512xbf16>, tensor<?x1408xf32>)
  return
}

// -----

#l = #twell.layout<tile_n = 256, slots = 31, value = bf16, index = i16, activation = relu, threshold = 0.0>
func.func @f(%x: tensor<?x16392xbf16>, %h: tensor<?x512xbf16, #l>, %w: tensor<512x16392xbf16>) {
  // expected-error @+1 {{x: d_model at most 16384 (a row of dx lives in registers), got 16392}}
  %dx, %dg = twell.train_row_backward %x, %x, %h, %w, %w
      : (tensor<?x16392xbf16>, tensor<?x16392xbf16>, tensor<?x512xbf16, #l>, tensor<512x16392xbf16>, tensor<512x16392xbf16>)
      -> (tensor<?x16392xbf16>, tensor<?x512xf32>)
  return
}

// -----

#l = #twell.layout<tile_n = 256, slots = 31, value = bf16, index = i16, activation = relu, threshold = 0.0>
func.func @f(%x: tensor<8x512xbf16>, %h: tensor<8x1408xbf16, #l>, %dg: tensor<4x1408xf32>) {
  // expected-error @+1 {{dg: dimension 0 (tokens) is 4, but x has 8 tokens}}
  %dwg, %dwd = twell.train_weight_grad %x, %x, %h, %dg
      : (tensor<8x512xbf16>, tensor<8x512xbf16>, tensor<8x1408xbf16, #l>, tensor<4x1408xf32>)
      -> (tensor<1408x512xf32>, tensor<1408x512xf32>)
  return
}

// -----

#l = #twell.layout<tile_n = 256, slots = 31, value = bf16, index = i16, activation = relu, threshold = 0.0>
func.func @f(%x: tensor<?x512xbf16>, %h: tensor<?x1408xbf16, #l>, %dg: tensor<?x1408xf32>) {
  // expected-error @+1 {{dw_up: expected a dw_up result exactly when du is given (a gated layer), got du without dw_up}}
  %dwg, %dwd = twell.train_weight_grad %x, %x, %h, %dg, %dg
      : (tensor<?x512xbf16>, tensor<?x512xbf16>, tensor<?x1408xbf16, #l>, tensor<?x1408xf32>, tensor<?x1408xf32>)
      -> (tensor<1408x512xf32>, tensor<1408x512xf32>)
  return
}

// -----

#l = #twell.layout<tile_n = 256, slots = 31, value = bf16, index = i16, activation = relu, threshold = 0.0>
func.func @f(%x: tensor<?x512xbf16>, %h: tensor<?x1408xbf16, #l>, %dg: tensor<?x1408xf32>) {
  // expected-error @+1 {{dw_down_t: expected shape [1408, 512] (d_ff x d_model: dWd^T), got [512, 1408]}}
  %dwg, %dwd = twell.train_weight_grad %x, %x, %h, %dg
      : (tensor<?x512xbf16>, tensor<?x512xbf16>, tensor<?x1408xbf16, #l>, tensor<?x1408xf32>)
      -> (tensor<1408x512xf32>, tensor<512x1408xf32>)
  return
}

// -----

#l = #twell.layout<tile_n = 256, slots = 31, value = bf16, index = i16, activation = relu, threshold = 0.0>
func.func @f(%x: tensor<?x512xbf16>, %h: tensor<?x60000xbf16, #l>, %dg: tensor<?x60000xf32>) {
  // expected-error @+1 {{h: d_ff at most 53952 on #twell.target<"sm_90a", [wgmma, tma, multicast]> at tile_n 256 (a shared-memory counter per neuron), got 60000}}
  %dwg, %dwd = twell.train_weight_grad %x, %x, %h, %dg {target = #twell.target<"sm_90a", [wgmma, tma, multicast]>}
      : (tensor<?x512xbf16>, tensor<?x512xbf16>, tensor<?x60000xbf16, #l>, tensor<?x60000xf32>)
      -> (tensor<60000x512xf32>, tensor<60000x512xf32>)
  return
}

// -----

#l = #twell.layout<tile_n = 256, slots = 31, value = bf16, index = i16, activation = relu, threshold = 0.0>
func.func @f(%x: tensor<?x512xbf16>, %h: tensor<?x1408xbf16, #l>, %dg: tensor<?x1408xf32>) {
  // expected-error @+1 {{kernel_name: a specialized kernel must also carry its target}}
  %dwg, %dwd = twell.train_weight_grad %x, %x, %h, %dg {kernel_name = "k"}
      : (tensor<?x512xbf16>, tensor<?x512xbf16>, tensor<?x1408xbf16, #l>, tensor<?x1408xf32>)
      -> (tensor<1408x512xf32>, tensor<1408x512xf32>)
  return
}

// -----

#l = #twell.layout<tile_n = 256, slots = 31, value = bf16, index = i16, activation = relu, threshold = 0.0>
func.func @f(%x: tensor<?x512xbf16>, %dy: tensor<8x512xbf16>, %h: tensor<?x1408xbf16, #l>, %dg: tensor<4x1408xf32>) {
  // expected-error @+1 {{dg: dimension 0 (tokens) is 4, but dy has 8 tokens}}
  %dwg, %dwd = twell.train_weight_grad %x, %dy, %h, %dg
      : (tensor<?x512xbf16>, tensor<8x512xbf16>, tensor<?x1408xbf16, #l>, tensor<4x1408xf32>)
      -> (tensor<1408x512xf32>, tensor<1408x512xf32>)
  return
}
