// RUN: twell-opt %s -twell-fuse-gated-ffn | FileCheck %s

#L = #twell.layout<tile_n = 256, slots = 31, value = bf16, index = i16, activation = relu, threshold = 0.0>

// The kernel form becomes one gated_ffn carrying the layout of H and the down layout; kernel
// attributes are dropped.
// CHECK-LABEL: func.func @fuse
// CHECK-SAME: (%[[X:.*]]: tensor<?x2048xbf16>, %[[WG:.*]]: tensor<5632x2048xbf16>, %[[WU:.*]]: tensor<5632x2048xbf16>, %[[WD:.*]]: tensor<5632x2048xbf16>)
// CHECK-NOT: twell.gate_matmul
// CHECK: %[[Y:.*]] = twell.gated_ffn %[[X]], %[[WG]], %[[WU]], %[[WD]] {down_layout = #twell.down_layout<in_out>, layout = #twell.layout<tile_n = 256, slots = 31, value = bf16, index = i16, activation = relu, threshold = 0.0>} : (tensor<?x2048xbf16>, tensor<5632x2048xbf16>, tensor<5632x2048xbf16>, tensor<5632x2048xbf16>) -> tensor<?x2048xbf16>
// CHECK-NOT: twell.gated_down
// CHECK: return %[[Y]]
func.func @fuse(%x: tensor<?x2048xbf16>, %wg: tensor<5632x2048xbf16>, %wu: tensor<5632x2048xbf16>,
                %wd: tensor<5632x2048xbf16>) -> tensor<?x2048xbf16> {
  %h = twell.gate_matmul %x, %wg {target = #twell.target<"sm_90a", [wgmma]>}
      : (tensor<?x2048xbf16>, tensor<5632x2048xbf16>) -> tensor<?x5632xbf16, #L>
  %y = twell.gated_down %x, %h, %wu, %wd {down_layout = #twell.down_layout<in_out>}
      : (tensor<?x2048xbf16>, tensor<?x5632xbf16, #L>, tensor<5632x2048xbf16>, tensor<5632x2048xbf16>)
      -> tensor<?x2048xbf16>
  return %y : tensor<?x2048xbf16>
}

// H is also returned: the fused op would not produce it, so nothing changes.
// CHECK-LABEL: func.func @h_has_another_use
// CHECK: twell.gate_matmul
// CHECK: twell.gated_down
// CHECK-NOT: twell.gated_ffn
func.func @h_has_another_use(%x: tensor<?x2048xbf16>, %wg: tensor<5632x2048xbf16>,
                             %wu: tensor<5632x2048xbf16>, %wd: tensor<2048x5632xbf16>)
    -> (tensor<?x2048xbf16>, tensor<?x5632xbf16, #L>) {
  %h = twell.gate_matmul %x, %wg
      : (tensor<?x2048xbf16>, tensor<5632x2048xbf16>) -> tensor<?x5632xbf16, #L>
  %y = twell.gated_down %x, %h, %wu, %wd
      : (tensor<?x2048xbf16>, tensor<?x5632xbf16, #L>, tensor<5632x2048xbf16>, tensor<2048x5632xbf16>)
      -> tensor<?x2048xbf16>
  return %y, %h : tensor<?x2048xbf16>, tensor<?x5632xbf16, #L>
}

// The consumer reads another x than the gate: not one FFN layer.
// CHECK-LABEL: func.func @different_x
// CHECK: twell.gate_matmul
// CHECK: twell.gated_down
// CHECK-NOT: twell.gated_ffn
func.func @different_x(%x: tensor<?x2048xbf16>, %x2: tensor<?x2048xbf16>, %wg: tensor<5632x2048xbf16>,
                       %wu: tensor<5632x2048xbf16>, %wd: tensor<2048x5632xbf16>) -> tensor<?x2048xbf16> {
  %h = twell.gate_matmul %x, %wg
      : (tensor<?x2048xbf16>, tensor<5632x2048xbf16>) -> tensor<?x5632xbf16, #L>
  %y = twell.gated_down %x2, %h, %wu, %wd
      : (tensor<?x2048xbf16>, tensor<?x5632xbf16, #L>, tensor<5632x2048xbf16>, tensor<2048x5632xbf16>)
      -> tensor<?x2048xbf16>
  return %y : tensor<?x2048xbf16>
}

// H comes in as an argument: there is no gate to fuse.
// CHECK-LABEL: func.func @h_from_argument
// CHECK: twell.gated_down
// CHECK-NOT: twell.gated_ffn
func.func @h_from_argument(%x: tensor<?x2048xbf16>, %h: tensor<?x5632xbf16, #L>,
                           %wu: tensor<5632x2048xbf16>, %wd: tensor<2048x5632xbf16>) -> tensor<?x2048xbf16> {
  %y = twell.gated_down %x, %h, %wu, %wd
      : (tensor<?x2048xbf16>, tensor<?x5632xbf16, #L>, tensor<5632x2048xbf16>, tensor<2048x5632xbf16>)
      -> tensor<?x2048xbf16>
  return %y : tensor<?x2048xbf16>
}
