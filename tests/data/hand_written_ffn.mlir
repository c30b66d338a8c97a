// A hand-written FFN for `twellc compile FILE.mlir` (ctest bundle_compile): the sample's shape with a
// gate configuration the heuristic would not choose (wgmma without clusters, 3 stages) and an in_out
// consumer. The bundle's kernels are these, found by plans of the FfnSpec twellc prints.
#L = #twell.layout<tile_n = 256, slots = 31, value = bf16, index = i16, activation = relu, threshold = 0.0>

func.func @ffn(%x: tensor<?x512xbf16>, %wg: tensor<1408x512xbf16>, %wu: tensor<1408x512xbf16>,
               %wd: tensor<1408x512xbf16>) -> tensor<?x512xbf16> {
  %h = twell.gate_matmul %x, %wg {config = #twell.config<cta_m = 128, cta_k = 64, threads = 384, mainloop = wgmma, stages = 3>}
      : (tensor<?x512xbf16>, tensor<1408x512xbf16>) -> tensor<?x1408xbf16, #L>
  %y = twell.gated_down %x, %h, %wu, %wd {down_layout = #twell.down_layout<in_out>}
      : (tensor<?x512xbf16>, tensor<?x1408xbf16, #L>, tensor<1408x512xbf16>, tensor<1408x512xbf16>) -> tensor<?x512xbf16>
  return %y : tensor<?x512xbf16>
}
