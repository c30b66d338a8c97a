// One gated FFN layer of the paper's shape in the twell dialect: the input of
//   twellc emit examples/ffn.mlir --emit mlir|cuda|ptx
// Hidden activation H = relu(x Wg^T) in TwELL: 256-wide tiles, 31 slots per tile-row, bf16 values.
// Weights in nn.Linear layouts: Wg, Wu [d_ff, d_model]; Wd [d_model, d_ff].
#L = #twell.layout<tile_n = 256, slots = 31, value = bf16, index = i16, activation = relu, threshold = 0.0>

func.func @ffn(%x: tensor<?x2048xbf16>, %wg: tensor<5632x2048xbf16>, %wu: tensor<5632x2048xbf16>,
               %wd: tensor<2048x5632xbf16>) -> tensor<?x2048xbf16> {
  %y = twell.gated_ffn %x, %wg, %wu, %wd {layout = #L}
      : (tensor<?x2048xbf16>, tensor<5632x2048xbf16>, tensor<5632x2048xbf16>, tensor<2048x5632xbf16>)
      -> tensor<?x2048xbf16>
  return %y : tensor<?x2048xbf16>
}
