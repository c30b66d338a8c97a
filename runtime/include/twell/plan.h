// A compiled gated FFN: its kernels, their compile report, its device workspace, and run().
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "twell/format.h"
#include "twell/spec.h"

struct CUstream_st;

namespace twell {

using Stream = CUstream_st*;  // a CUstream / cudaStream_t; nullptr = the legacy default stream

// Which path FfnPlan::run takes. Both compute the same function (the dense path applies the same
// activation, threshold and roundings), so the choice only changes time.
enum class Dispatch {
  // Per token-count bucket (powers of two), the first run() times the TwELL path (with each consumer
  // variant the plan holds, FfnSpec::consumer) and the dense path (Dense below) on its inputs (a few calls
  // each, one stream synchronization; before each call a cuBLASLt GEMV reads a scratch of twice the L2
  // size, so that the weights come from DRAM as in a model whose weights exceed L2: the context makes the
  // scratch at its first calibration and keeps it, 120 MiB on the H200) and keeps
  // the fastest for later runs of that bucket: never slower than dense beyond the timing noise, on
  // inputs like the first. Later runs do not synchronize.
  Auto,
  // Always the TwELL kernels, with the consumer FfnSpec::consumer names (RowGather when unset).
  Sparse,
  Dense,   // always the dense path: DenseFfn with DenseKernels::FusedGatedUp (cuBLASLt GEMMs, the gate
           // and up GEMMs fused into one twell kernel where it applies; dense.h)
};

struct PlanOptions {
  // Tile-rows of the overflow backup area; unset: max_tokens * tiles / 16 (at least 256). Results are
  // exact whatever the capacity (a full backup makes the consumer recompute); it only costs time.
  std::optional<uint32_t> backup_capacity;
  Dispatch dispatch = Dispatch::Auto;
  // The hot/cold split (twell/neuron_order.h): the first `dense_neurons` neurons of d_ff (rows
  // 0..dense_neurons-1 of w_gate and w_up, the same columns of an out_in w_down, rows of an in_out one)
  // run on the dense path (DenseFfn, DenseKernels::FusedGatedUp), the others through TwELL, and run() adds the two parts
  // into y. Worth it where a few neurons hold most nonzeros (real layers; choose_dense_neurons predicts
  // it) once the weights are ordered hot-first (hot_first_order, permute_neurons). The TwELL matrix
  // (run_gate, run_consumer, download_twell, upload_twell, last_overflow) then covers neurons
  // dense_neurons..d_ff-1 only: its d_ff is d_ff - dense_neurons, and run_consumer() writes only their
  // part of y. y is rounded twice: the TwELL part's y (dtype), then that plus the dense neurons' fp32
  // sum (cuBLASLt, beta = 1). The dense part holds [max_tokens, dense_neurons] g and u workspaces
  // (dtype) besides Dispatch::Auto's [max_tokens, d_ff] ones. 0 (default): every neuron through TwELL.
  // Must be a multiple of 64 (the slices of the weights stay 128-byte aligned) and below d_ff, else
  // Context::plan throws Error(InvalidArgument) naming this field.
  int64_t dense_neurons = 0;
  // Calls of at most this many tokens run the decode kernels (kernels/device/twell/device/decode/decode.cuh):
  // the gate, up and down projections spread over every SM for a few rows, which read Wg and the
  // active rows of Wu and Wd once (autoregressive decoding; PERFORMANCE.md, "Small M"). The four
  // kernels give the same y, bit for bit, as the large-M kernels, and the same TwELL matrix (the fused
  // one, decode_fused_max_tokens below, does not); all read Wd in the layout given (no transpose). Used by run() on the TwELL path with the row consumer only (run_gate and
  // run_consumer take the large-M kernels, and so does a token bucket where Dispatch::Auto chose the
  // token-block consumer), where the generator made them: a tensor-core gate, d_model % 8 == 0, d_ff
  // <= 65536, tile_n >= 32, a target with more than 99 KiB of shared memory per CTA (not sm_86, sm_89,
  // sm_120, sm_121), and not for FfnSpec::consumer = TokenBlock (that consumer rounds h, the decode
  // kernels repeat the row consumers' sums). 0 turns them off (nor are they compiled then; a bundle's set
  // with them serves such a plan too); at most 64, else Context::plan throws
  // Error(InvalidArgument) naming this field. It is only the cut-off: any value above 0 compiles the
  // same five kernels (decode_gate for up to 64 rows, decode_gate_small for up to 8, decode_up,
  // decode_down; decode_fused below), and sizes their workspace: about min(max_tokens,
  // decode_max_tokens) x d_ff x 10 bytes, and up to 256 d_ff bytes plus 384 per SM for decode_fused (its
  // (row, h) pairs of up to 32 tokens).
  int64_t decode_max_tokens = 64;
  // Decode calls of at most this many tokens (0..32, and at most decode_max_tokens to matter) take
  // instead the fused decode kernel (decode/decode_fused.cuh): the whole FFN in one persistent,
  // cooperative kernel, one CTA per SM, which streams Wg once and writes no TwELL matrix (download_twell
  // and run_consumer refuse after such a call; last_path() says "decode"). Its gate dot and its down
  // sums (one chain per token over its active rows) run in other orders than the large-M kernels', so y is within 1e-2
  // (relative) of theirs, not their bits, and the same bits on every run. It is made where its shared memory holds x and the
  // staging of ceil(d_ff / SMs) rows (every paper shape on sm_80 and sm_90), for up to 32 tokens where
  // 32 rows of x fit, else 16 or 8. last_overflow() after such a call reports nothing recomputed. 32:
  // bench/README.md v67, v68. Outside 0..32, Context::plan throws Error(InvalidArgument) naming this field.
  int64_t decode_fused_max_tokens = 32;
  // The tuning database (twell/tuning.h): with Use, the layout fields the FfnSpec leaves unset (tile_n,
  // slots, gate_cluster_m; the consumer too unless Dispatch::Auto, which times both) come from the
  // tuned entry of this GPU and spec, if there is one, else from the entry a loaded bundle embeds for
  // this spec (twellc compile --tuning-dir: any GPU of the bundle's arch; also without a GPU): the best
  // TwELL configuration of the bucket holding max_tokens (else the largest bucket).
  // FfnPlan::config_source() says where they came from.
  enum class Tuning { Use, Ignore };
  Tuning tuning = Tuning::Use;
  // Which tuned workload ("density:0.5%", "pattern:<hex>"); empty: the most recently tuned one.
  std::string tuning_workload;
  // The database directory; empty: TuningDatabase::default_dir().
  std::string tuning_dir;
};

// How one kernel was obtained.
struct KernelReport {
  std::string name;
  std::string kind;       // "gate_twell" | "gated_down" | "down" (the non-gated consumer) | "transpose" |
                          // "decode_gate" | "decode_gate_small" | "decode_up" | "decode_down" | "decode_fused"
                          // (PlanOptions::decode_max_tokens, decode_fused_max_tokens)
  std::string cache;      // "memory" | "disk" | "miss" (compiled now by the JIT) | "miss (corrupt entry replaced)"
                          // (compiled now, a damaged disk entry was found) | "bundle" (ahead of time); an
                          // auxiliary kernel (transpose, training, dense helpers) is loaded once per Context:
                          // later plans report "memory"
  double compile_ms = 0;  // NVRTC time (0 on a cache hit)
  double load_ms = 0;     // cache lookup or module load time
  size_t ptx_bytes = 0;
  size_t cubin_bytes = 0;
  std::string arch;       // "sm_90a"
  std::string consumer;   // a gated_down / down kernel's variant: "cta_row" | "warp_row" | "token_block" ("" otherwise)
  int threads = 0, cta_m = 0;
  int grid_y = 0;         // the grid.y it launches with: 1 for a persistent kernel (its CTAs loop over `tiles`)
  int tiles = 0;          // the N tiles of a gate kernel (its grid.y unless persistent)
  bool persistent = false;
  int cluster_m = 1;      // CTAs per thread-block cluster (the sm_90a gate multicasting w_gate: 2)
};

// Device pointers of one FFN call. Element type spec.dtype; row strides in elements (0 = dense:
// the row length). Pointers must be device memory, non-null and 2-byte aligned; y must not overlap x.
struct FfnTensors {
  const void* x = nullptr;       // [tokens, d_model]
  const void* w_gate = nullptr;  // [d_ff, d_model]
  const void* w_up = nullptr;    // [d_ff, d_model]; nullptr (and ld_up 0) for a non-gated spec
  const void* w_down = nullptr;  // [d_model, d_ff] (OutIn) or [d_ff, d_model] (InOut)
  void* y = nullptr;             // [tokens, d_model]
  int64_t ld_x = 0, ld_gate = 0, ld_up = 0, ld_down = 0, ld_y = 0;
};

struct OverflowReport {
  uint32_t overflowing_tile_rows = 0;  // counted by the gate kernel in the last run
  uint32_t backup_capacity = 0;        // capacity used by that run
  bool recomputed = false;             // some tile-rows did not fit and were recomputed by the consumer
};

class FfnPlan {
 public:
  FfnPlan();
  ~FfnPlan();
  FfnPlan(FfnPlan&&) noexcept;
  FfnPlan& operator=(FfnPlan&&) noexcept;

  const FfnSpec& spec() const;
  const TwellLayout& layout() const;
  const Target& target() const;
  int64_t max_tokens() const;
  const std::vector<KernelReport>& kernels() const;
  const std::string& ir() const;            // the twell dialect after the pipeline
  const std::string& ptx(size_t kernel) const;
  const std::string& cuda_source(size_t kernel) const;
  bool runnable() const;                    // false without a GPU

  // y = FFN(x) for `tokens` rows (0 <= tokens <= max_tokens), stream-ordered, no host synchronization.
  // Throws Error(InvalidArgument) naming the argument for a null/misaligned/non-device pointer, bad
  // stride or token count; Error(NoDevice) when the plan was made without a GPU; Error(Cuda).
  // Calls on one plan must be ordered (one stream, or synchronized): they share the workspace.
  // decision_key: Dispatch::Auto keeps one decision per (decision_key, token bucket). Layers of one
  // shape may share a plan (and its workspace) but differ in density: each passes its own key (e.g. its
  // layer index) so that each gets its own path. Ignored by Dispatch::Sparse and Dense.
  void run(Stream stream, const FfnTensors& t, int64_t tokens, uint64_t decision_key = 0);

  // The path the last run() took: "twell" (with the dense neurons of PlanOptions::dense_neurons, if
  // any), "decode" (the fused decode kernel, PlanOptions::decode_fused_max_tokens: no TwELL matrix) or
  // "dense" ("" before the first run).
  std::string last_path() const;

  // Where the layout came from: "option" (the FfnSpec set tile_n / slots / cluster), "heuristic"
  // (twell-select-config's defaults: no tuned entry, or PlanOptions::Tuning::Ignore; "heuristic (...)"
  // says why a tuned entry was not taken), or "database <file> workload <w> bucket <tokens>: tile_n T
  // slots S cluster_m C[ consumer V]" ("bundle <dir> workload ..." for an entry a bundle embeds).
  std::string config_source() const;

  // Dispatch::Auto decides once per (decision key, token bucket), on the inputs of its first run(). This
  // forgets every decision: the next run() of each bucket times the paths again. Call it when the
  // layer's activation density has moved (new data, a fine-tuned model) so that the choice follows.
  void recalibrate();

  // PlanOptions::dense_neurons of this plan (0: none).
  int64_t dense_neurons() const;

  // Only the D2T kernel (gate GEMM + TwELL epilogue): fills the plan's TwELL matrix (see
  // download_twell) without the consumer; y is not written and may be null. Same checks as run().
  // With PlanOptions::dense_neurons, over the TwELL neurons only.
  void run_gate(Stream stream, const FfnTensors& t, int64_t tokens);

  // Only the consumer (gated up + down projection; the variant the last run() chose, else RowGather)
  // over the plan's current TwELL matrix: the one the
  // last run()/run_gate() wrote, or upload_twell() set. `tokens` must equal that matrix's row count
  // (Error(InvalidArgument) otherwise, or when there is none); x and w_gate are still read for the
  // overflow recompute. For benchmarks of the consumer alone and for TwELL inputs made elsewhere.
  // With PlanOptions::dense_neurons, y is the TwELL neurons' part alone (the dense ones not added).
  void run_consumer(Stream stream, const FfnTensors& t, int64_t tokens);

  // Makes `m` the plan's TwELL matrix (synchronous copies; the backup grows to hold m's). m must pass
  // validate_twell, have the plan's layout and d_ff, and at most max_tokens rows; else
  // Error(InvalidArgument) naming what differs. Then run_consumer(stream, t, m.rows).
  void upload_twell(Stream stream, const TwellMatrix& m);

  // Synchronizes `stream` and reads the overflow counter of the last run (Error(InvalidArgument) if
  // it took the dense path: there is no TwELL matrix then). If the backup was too small
  // the next run() first grows it to fit (no result was ever wrong: the consumer recomputed the
  // tile-rows that did not fit).
  OverflowReport last_overflow(Stream stream);

  // Downloads the TwELL matrix of the last run (rows = its token count); synchronizes `stream`.
  TwellMatrix download_twell(Stream stream) const;

  struct Impl;

 private:
  enum class Stages { All, GateOnly, ConsumerOnly };
  void launch(Stream stream, const FfnTensors& t, int64_t tokens, Stages stages);
  friend class Context;
  friend class FfnTrainingPlan;  // runs the plan's kernels into its training states (twell/training_plan.h)
  std::unique_ptr<Impl> impl_;
};

}  // namespace twell
