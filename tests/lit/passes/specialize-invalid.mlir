// twell-specialize names what is missing.
// RUN: twell-opt %s -split-input-file -twell-specialize -verify-diagnostics

#L = #twell.layout<tile_n = 256, slots = 31, value = bf16, index = i16, activation = relu, threshold = 0.0>
func.func @unsplit(%x: tensor<?x2048xbf16>, %wg: tensor<5632x2048xbf16>, %wu: tensor<5632x2048xbf16>,
                   %wd: tensor<2048x5632xbf16>) -> tensor<?x2048xbf16> {
  // expected-error @+1 {{'twell.gated_ffn' op is not a kernel: split it into twell.gate_matmul and twell.gated_down first (twell-split-gated-ffn)}}
  %y = twell.gated_ffn %x, %wg, %wu, %wd {layout = #L}
      : (tensor<?x2048xbf16>, tensor<5632x2048xbf16>, tensor<5632x2048xbf16>, tensor<2048x5632xbf16>)
      -> tensor<?x2048xbf16>
  return %y : tensor<?x2048xbf16>
}

// -----

#L = #twell.layout<tile_n = 256, slots = 31, value = bf16, index = i16, activation = relu, threshold = 0.0>
func.func @no_target(%x: tensor<?x2048xbf16>, %wg: tensor<5632x2048xbf16>) -> tensor<?x5632xbf16, #L> {
  // expected-error @+1 {{'twell.gate_matmul' op has no target: attach one with twell-select-config}}
  %h = twell.gate_matmul %x, %wg {config = #twell.config<cta_m = 64, cta_k = 16, threads = 256>}
      : (tensor<?x2048xbf16>, tensor<5632x2048xbf16>) -> tensor<?x5632xbf16, #L>
  return %h : tensor<?x5632xbf16, #L>
}

// -----

#L = #twell.layout<tile_n = 256, slots = 31, value = bf16, index = i16, activation = relu, threshold = 0.0>
func.func @no_config(%x: tensor<?x2048xbf16>, %h: tensor<?x5632xbf16, #L>, %wu: tensor<5632x2048xbf16>,
                     %wd: tensor<2048x5632xbf16>) -> tensor<?x2048xbf16> {
  // expected-error @+1 {{'twell.gated_down' op has no config: attach one with twell-select-config}}
  %y = twell.gated_down %x, %h, %wu, %wd {target = #twell.target<"sm_90a", []>}
      : (tensor<?x2048xbf16>, tensor<?x5632xbf16, #L>, tensor<5632x2048xbf16>, tensor<2048x5632xbf16>)
      -> tensor<?x2048xbf16>
  return %y : tensor<?x2048xbf16>
}

// -----

#L = #twell.layout<tile_n = 256, slots = 31, value = bf16, index = i16, activation = relu, threshold = 0.0>
func.func @too_wide(%x: tensor<?x4294967296xbf16>, %wg: tensor<5632x4294967296xbf16>) -> tensor<?x5632xbf16, #L> {
  // expected-error @+1 {{'twell.gate_matmul' op d_model = 4294967296 and d_ff = 5632 must fit the kernels' int constants (at most 2147483647)}}
  %h = twell.gate_matmul %x, %wg {target = #twell.target<"sm_90a", []>, config = #twell.config<cta_m = 64, cta_k = 16, threads = 256>}
      : (tensor<?x4294967296xbf16>, tensor<5632x4294967296xbf16>) -> tensor<?x5632xbf16, #L>
  return %h : tensor<?x5632xbf16, #L>
}

// -----

// The consumer's overflow recompute repeats the gate kernel's arithmetic: the main loops must agree.
#L = #twell.layout<tile_n = 256, slots = 31, value = bf16, index = i16, activation = relu, threshold = 0.0>
func.func @mainloop_mismatch(%x: tensor<?x2048xbf16>, %wg: tensor<5632x2048xbf16>, %wu: tensor<5632x2048xbf16>,
                             %wd: tensor<2048x5632xbf16>) -> tensor<?x2048xbf16> {
  %h = twell.gate_matmul %x, %wg {target = #twell.target<"sm_80", []>,
      config = #twell.config<cta_m = 128, cta_k = 32, threads = 512, mainloop = mma_sync, stages = 4>}
      : (tensor<?x2048xbf16>, tensor<5632x2048xbf16>) -> tensor<?x5632xbf16, #L>
  // expected-error @+1 {{'twell.gated_down' op config: mainloop fma differs from mainloop mma_sync of the twell.gate_matmul producing h: the consumer's overflow recompute must repeat the gate kernel's arithmetic, give both the same mainloop}}
  %y = twell.gated_down %x, %h, %wu, %wd {target = #twell.target<"sm_80", []>, config = #twell.config<cta_m = 1, threads = 256, consumer = cta_row>}
      : (tensor<?x2048xbf16>, tensor<?x5632xbf16, #L>, tensor<5632x2048xbf16>, tensor<2048x5632xbf16>)
      -> tensor<?x2048xbf16>
  return %y : tensor<?x2048xbf16>
}
