// RUN: twell-opt %s -twell-split-gated-ffn | FileCheck %s
// Splitting then fusing gives the input back.
// RUN: twell-opt %s -twell-split-gated-ffn -twell-fuse-gated-ffn | FileCheck %s --check-prefix=ROUNDTRIP

#L = #twell.layout<tile_n = 256, slots = 31, value = bf16, index = i16, activation = relu, threshold = 0.0>

// CHECK-LABEL: func.func @split
// CHECK-SAME: (%[[X:.*]]: tensor<?x2048xbf16>, %[[WG:.*]]: tensor<5632x2048xbf16>, %[[WU:.*]]: tensor<5632x2048xbf16>, %[[WD:.*]]: tensor<2048x5632xbf16>)
// CHECK: %[[H:.*]] = twell.gate_matmul %[[X]], %[[WG]] : (tensor<?x2048xbf16>, tensor<5632x2048xbf16>) -> tensor<?x5632xbf16, #twell.layout<tile_n = 256, slots = 31, value = bf16, index = i16, activation = relu, threshold = 0.0>>
// CHECK: %[[Y:.*]] = twell.gated_down %[[X]], %[[H]], %[[WU]], %[[WD]] : (tensor<?x2048xbf16>, tensor<?x5632xbf16, #twell.layout<tile_n = 256, slots = 31, value = bf16, index = i16, activation = relu, threshold = 0.0>>, tensor<5632x2048xbf16>, tensor<2048x5632xbf16>) -> tensor<?x2048xbf16>
// CHECK: return %[[Y]]
// ROUNDTRIP-LABEL: func.func @split
// ROUNDTRIP: twell.gated_ffn %arg0, %arg1, %arg2, %arg3 {layout = #twell.layout<tile_n = 256, slots = 31, value = bf16, index = i16, activation = relu, threshold = 0.0>}
func.func @split(%x: tensor<?x2048xbf16>, %wg: tensor<5632x2048xbf16>, %wu: tensor<5632x2048xbf16>,
                 %wd: tensor<2048x5632xbf16>) -> tensor<?x2048xbf16> {
  %y = twell.gated_ffn %x, %wg, %wu, %wd {layout = #L}
      : (tensor<?x2048xbf16>, tensor<5632x2048xbf16>, tensor<5632x2048xbf16>, tensor<2048x5632xbf16>)
      -> tensor<?x2048xbf16>
  return %y : tensor<?x2048xbf16>
}

// A static token count, f16, SiLU and the in_out down layout carry over.
// CHECK-LABEL: func.func @split_static_in_out
// CHECK: %[[H:.*]] = twell.gate_matmul %arg0, %arg1 : (tensor<8x512xf16>, tensor<1000x512xf16>) -> tensor<8x1000xf16, #twell.layout<tile_n = 128, slots = 7, value = f16, index = i16, activation = silu, threshold = 0.125>>
// CHECK: twell.gated_down %arg0, %[[H]], %arg2, %arg3 {down_layout = #twell.down_layout<in_out>} : (tensor<8x512xf16>, tensor<8x1000xf16, #twell.layout<{{.*}}>>, tensor<1000x512xf16>, tensor<1000x512xf16>) -> tensor<8x512xf16>
// ROUNDTRIP-LABEL: func.func @split_static_in_out
// ROUNDTRIP: twell.gated_ffn %arg0, %arg1, %arg2, %arg3 {down_layout = #twell.down_layout<in_out>, layout = #twell.layout<tile_n = 128, slots = 7, value = f16, index = i16, activation = silu, threshold = 0.125>}
func.func @split_static_in_out(%x: tensor<8x512xf16>, %wg: tensor<1000x512xf16>,
                               %wu: tensor<1000x512xf16>, %wd: tensor<1000x512xf16>) -> tensor<8x512xf16> {
  %y = twell.gated_ffn %x, %wg, %wu, %wd {
      layout = #twell.layout<tile_n = 128, slots = 7, value = f16, index = i16, activation = silu, threshold = 0.125>,
      down_layout = #twell.down_layout<in_out>}
      : (tensor<8x512xf16>, tensor<1000x512xf16>, tensor<1000x512xf16>, tensor<1000x512xf16>)
      -> tensor<8x512xf16>
  return %y : tensor<8x512xf16>
}

// The non-gated layer: the same gate kernel feeding twell.down (x stays an operand: the consumer
// recomputes the overflowing tile-rows the backup lacks).
// CHECK-LABEL: func.func @split_non_gated
// CHECK: %[[H:.*]] = twell.gate_matmul %arg0, %arg1 : (tensor<?x2048xbf16>, tensor<5632x2048xbf16>) -> tensor<?x5632xbf16, #twell.layout<{{.*}}>>
// CHECK: %[[Y:.*]] = twell.down %arg0, %[[H]], %arg2 : (tensor<?x2048xbf16>, tensor<?x5632xbf16, #twell.layout<{{.*}}>>, tensor<2048x5632xbf16>) -> tensor<?x2048xbf16>
// CHECK-NOT: twell.gated_down
// ROUNDTRIP-LABEL: func.func @split_non_gated
// ROUNDTRIP: twell.ffn %arg0, %arg1, %arg2 {layout = #twell.layout<tile_n = 256, slots = 31, value = bf16, index = i16, activation = relu, threshold = 0.0>}
func.func @split_non_gated(%x: tensor<?x2048xbf16>, %wg: tensor<5632x2048xbf16>, %wd: tensor<2048x5632xbf16>)
    -> tensor<?x2048xbf16> {
  %y = twell.ffn %x, %wg, %wd {layout = #L}
      : (tensor<?x2048xbf16>, tensor<5632x2048xbf16>, tensor<2048x5632xbf16>) -> tensor<?x2048xbf16>
  return %y : tensor<?x2048xbf16>
}
