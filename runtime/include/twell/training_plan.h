// FfnTrainingPlan: one FFN layer shape's training step on the GPU, forward then backward (issue 15;
// ../shared/design/TRAINING.md), built from the inference kernels and the two training kernels (twell/training.h):
//
//   forward:  gate_twell (the GEMM with the TwELL epilogue) -> the row consumer, which writes y and each
//             row's sum |h_j| (the L1 term: sum over rows / tokens). The TwELL matrix of a = act(g) stays
//             in an FfnTrainingState for the backward (not the dense g, u or h a dense autograd keeps).
//   backward: [transpose an nn.Linear Wd] -> train_row_backward (dh, u, du, dg per active entry, dx)
//             -> train_weight_grad (dWg, dWu, dWd^T, sorted by neuron, fp32 sums in token order)
//             [-> transpose dWd^T into an nn.Linear Wd's layout: TrainingPlanOptions::dw_down_as_weight].
//
// Exact on every input: tile-rows that overflow their slots go to the state's backup or, where that is
// full, are recomputed from x and Wg by the consumer and by the backward; the backward's per-entry
// storage is sized from the forward's measured overflow count (copied to pinned host memory on the
// forward's stream right after its gate: by the time of the backward that copy has long finished, so the
// read does not stall the stream). A forward that overflowed its state's backup makes later forwards' backups
// larger (the capacity grows on demand; nothing is ever dropped).
//
// Numerics: y is FfnPlan::run's on the TwELL path with the row consumer (the same kernels, bit for bit);
// the gradients are train_row_backward's and train_weight_grad's (twell/training.h: within 1e-2 of the
// CPU reference, bitwise deterministic run to run). Not CUDA-graph capturable (the backward reads the
// forward's overflow count on the host).
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "twell/plan.h"
#include "twell/spec.h"

namespace twell {

class Context;

// Which computation a training step takes. Both compute the same function (../shared/design/TRAINING.md, "The
// gradients"; the same activation, threshold and L1 term), within training.h's tolerance of each other.
enum class TrainingPath : uint8_t {
  // The TwELL kernels (the gate's TwELL epilogue, the row consumer, train_row_backward,
  // train_weight_grad): the time grows with the active entries (bench/README.md v53: faster than dense
  // below ~1.5% density at the paper's shape, slower above). With TrainingPlanOptions::dense_neurons, over
  // the neurons from there on, the first ones on the dense path's kernels (the split).
  Sparse,
  // cuBLASLt GEMMs (fp32 accumulation) and two elementwise kernels (train/dense_elementwise.cuh), as a
  // dense framework computes the step: 9 GEMMs of the layer's size whatever the density. The state keeps
  // g and u ([tokens, d_ff] spec.dtype each; dense_state_bytes), which its backward overwrites with dg and
  // du: one backward per dense forward. g, u, dh and h are rounded to spec.dtype between the steps (as in
  // PyTorch's autograd), dx once per GEMM (dg Wg, then + du Wu where gated).
  Dense,
};

// How FfnTrainingPlan::forward picks the path (TrainingPlanOptions::dispatch); the backward takes its
// forward's (FfnTrainingState::path).
enum class TrainingDispatch : uint8_t {
  Sparse,  // always TrainingPath::Sparse
  Dense,   // always TrainingPath::Dense
  // Per (decision key, power-of-two token bucket), the first forward times a whole step (forward and
  // backward) of each path on its own operands (its first kCalibrationRows rows; one warm-up and the median
  // of three steps each, host launch time included, with scratch outputs, dy and state allocated for it
  // and a stream synchronization per step; the dense path first, and the sparse path's timing stops after
  // two timed steps where both take over twice the dense median, so its median would too: at a dense
  // phase's density, a model's first steps, the TwELL path runs 10-50x the dense step) and keeps the faster (ties: Sparse) for later forwards of that
  // bucket (decisions()). The plan then holds both paths' scratch; a state whose forward changes path frees
  // the other path's buffers after a stream synchronization (give layers that decide apart their own
  // states). The density moves during training: recalibrate() forgets the decisions (not the scratch).
  // Nothing is timed during stream capture: a decided bucket keeps its path, an undecided one takes Sparse
  // without deciding, and a state changing path keeps both paths' buffers (no synchronization).
  Auto,
};

struct TrainingPlanOptions {
  // Tile-rows of each state's overflow backup at first; unset: max_tokens * tiles / 16 (at least 256),
  // as PlanOptions. Results are exact at any capacity; a forward that overflowed it grows the next ones'.
  std::optional<uint32_t> backup_capacity;
  // The weight gradients' type: fp32 (false), or spec.dtype, each rounded once from its fp32 sum (true).
  bool gradients_in_dtype = false;
  // Keep each entry's u = x . Wu_j from the forward in the state (4 bytes per TwELL word, where the spec is
  // gated and both the consumer and the row backward are the warp-per-row forms), so the backward reads
  // no Wu row to recompute it (bench/README.md v48). false: recompute (less memory). Same bits either way.
  bool keep_u = true;
  // dWd in Wd's own layout (spec.down_layout): for an out_in (nn.Linear) Wd, FfnGradients::dw_down is then
  // [K, N] like the weight, not the rows of dWd^T. The weight gradients write dWd^T into the plan's Wd^T
  // buffer (free once the row backward has read it) and a 16-bit transpose puts it in place: a framework
  // that accumulates into the weight's .grad then adds contiguous rows instead of a transposed view
  // (0.08 ms strided against 0.03 + 0.02 at the paper shape, bench/README.md v54). An out_in spec needs
  // gradients_in_dtype with it (the transpose moves 16-bit values); an in_out spec's dWd^T is its layout.
  bool dw_down_as_weight = false;
  // Where the layout (tile_n, slots, gate cluster) comes from: PlanOptions::tuning and its fields (a tuned
  // layout the training kernels refuse gives way to the heuristic one).
  PlanOptions::Tuning tuning = PlanOptions::Tuning::Use;
  std::string tuning_workload;
  std::string tuning_dir;
  // Sparse (the default: the TwELL kernels, whose bits the inference plan's TwELL path shares), Dense or
  // Auto (TrainingDispatch). Dense and Auto also make the dense path's kernels at create().
  TrainingDispatch dispatch = TrainingDispatch::Sparse;
  // The hot/cold split of TrainingPath::Sparse (PlanOptions::dense_neurons' rule: a multiple of 64 below
  // d_ff; 0: none): neurons 0..dense_neurons-1 (rows of Wg and Wu, the same rows of an in_out Wd or
  // columns of an out_in one) run on the dense path's GEMMs and elementwise kernels, the others on the
  // TwELL kernels; y, row_l1 and dx are the two parts' sums (the TwELL part first, the dense one added:
  // y and dx rounded twice), the weight gradients' rows (dWd as the weight: columns) are each part's own.
  // For weights ordered hot-first (hot_first_order, permute_neurons: twell/neuron_order.h), so that the
  // neurons active on many tokens, whose long lists make the TwELL backward slow (bench/README.md v53),
  // take tensor cores. In training the order is a reparametrization of the layer: permute the weights
  // and their optimizer state together, now and then, not every step. The state then also keeps the dense
  // neurons' g and u (dense_state_bytes' share of dense_neurons of d_ff), which its backward overwrites:
  // one backward per forward, as on the dense path.
  int64_t dense_neurons = 0;
};

// One decision of TrainingDispatch::Auto: the calls of `decision_key` with tokens in
// (max_tokens / 2, max_tokens] take `path`; the step times (ms) it was chosen by, each the median of
// *_steps timed steps (sparse_steps 2: its timing stopped early, both steps over twice dense_ms).
struct TrainingDecision {
  uint64_t decision_key = 0;
  int64_t max_tokens = 0;
  TrainingPath path = TrainingPath::Sparse;
  double sparse_ms = 0, dense_ms = 0;
  int sparse_steps = 0, dense_steps = 0;
};

// What one forward keeps for its backward. On TrainingPath::Dense: g and u ([tokens, d_ff] spec.dtype
// each), which the backward overwrites. On TrainingPath::Sparse: the TwELL matrix of a = act(g) ([tokens, words_per_row]
// uint32 words, and the backup [capacity, tile_n] of spec.dtype), for a gated spec whose consumer and row
// backward are the warp-per-row forms also each entry's u = x . Wu_j ([tokens, words_per_row] fp32: the
// backward then reads no Wu row for it), the gate's overflow count, and the pinned host word and event
// the backward reads it through. Made by FfnTrainingPlan::make_state; each
// forward overwrites it (its device memory grows to the call's tokens and backup capacity), each
// backward reads it. One per layer and micro-batch in flight. Movable, not copyable.
class FfnTrainingState {
 public:
  FfnTrainingState();
  ~FfnTrainingState();
  FfnTrainingState(FfnTrainingState&&) noexcept;
  FfnTrainingState& operator=(FfnTrainingState&&) noexcept;
  int64_t tokens() const;       // rows of the last forward (-1 before any)
  size_t device_bytes() const;  // the device memory it holds now
  TrainingPath path() const;    // the path the last forward took (its backward takes the same)
  struct Impl;

 private:
  friend class FfnTrainingPlan;
  std::unique_ptr<Impl> impl_;
};

// The backward's outputs (device pointers; row strides in elements of the tensor's type, 0 = dense).
// M = tokens, K = d_model, N = d_ff.
struct FfnGradients {
  void* dx = nullptr;       // [M, K] spec.dtype; must not overlap x or dy
  void* dw_gate = nullptr;  // [N, K] dL/dWg (nn.Linear layout), fp32 or spec.dtype (gradients_in_dtype)
  void* dw_up = nullptr;    // [N, K] dL/dWu; nullptr for a non-gated spec
  // [N, K]: dL/dWd in the in_out layout, the rows of dWd^T, whatever spec.down_layout is (an nn.Linear
  // Wd's gradient is its transpose: PyTorch takes .t()); [K, N] like an out_in Wd where the plan's
  // TrainingPlanOptions::dw_down_as_weight is set.
  void* dw_down = nullptr;
  int64_t ld_dx = 0, ld_dw_gate = 0, ld_dw_up = 0, ld_dw_down = 0;
};

class FfnTrainingPlan {
 public:
  // The plan of `spec` (gated or not, relu or silu, bf16 or fp16, either Wd layout) for calls of up to
  // max_tokens rows: the inference plan's gate and row consumer (Context::plan's rules and errors) and the
  // training kernels (twell/training.h's limits: d_model <= TrainRowBackwardConstraints::kMaxDModel, d_ff
  // within train_weight_grad's shared memory). Throws Error(InvalidArgument) naming the spec field or
  // option (also spec.consumer other than unset or RowGather: the L1 term comes from the row consumer),
  // Error(Compile), Error(NotFound) with no bundle holding a kernel and no JIT. Needs no GPU (a plan made
  // without one reports its kernels; make_state, forward and backward then throw Error(NoDevice)).
  static FfnTrainingPlan create(Context& context, const FfnSpec& spec, int64_t max_tokens,
                                const TrainingPlanOptions& options = {});
  FfnTrainingPlan();
  ~FfnTrainingPlan();
  FfnTrainingPlan(FfnTrainingPlan&&) noexcept;
  FfnTrainingPlan& operator=(FfnTrainingPlan&&) noexcept;

  const FfnSpec& spec() const;
  const TwellLayout& layout() const;
  int64_t max_tokens() const;
  const TrainingPlanOptions& options() const;        // as given to create()
  const std::vector<KernelReport>& kernels() const;  // the forward's and the backward's
  bool runnable() const;                             // false without a GPU

  FfnTrainingState make_state() const;

  // y = FFN(x) for `tokens` rows (0..max_tokens; tensors as FfnPlan::run's), stream-ordered, no host
  // synchronization unless `state` must grow (its first use, more tokens, a larger backup: the stream is
  // synchronized before its old buffers are freed, then cuMemAlloc); the TwELL matrix (dense path: g and u) goes into `state`. row_l1:
  // nullptr, or [tokens] fp32 device memory, 4-byte aligned: row t's sum of |h_tj| over its active
  // entries in their order (fp32); the L1 term of TRAINING.md is their sum / tokens. t.y nullptr with
  // row_l1 nullptr: the gate alone (no consumer; what a backward that recomputes its forward needs). Throws as
  // FfnPlan::run (naming the argument), Error(InvalidArgument) for a misaligned or non-device row_l1 or a
  // state another plan made, Error(NoDevice) without a GPU.
  // The path: options().dispatch's (Auto: the decision of (decision_key, the tokens' power-of-two
  // bucket); its first forward times both paths, see TrainingDispatch::Auto). A state that changes path
  // frees the other path's buffers (after a stream synchronization; kept during capture). On the dense path row_l1 sums the
  // unrounded |h| of each row in a fixed order (not the sparse path's order: the two differ in the last
  // bits), and y is cuBLASLt's.
  void forward(Stream stream, const FfnTensors& t, int64_t tokens, FfnTrainingState& state, float* row_l1 = nullptr,
               uint64_t decision_key = 0);

  // The gradients of L(y) + lambda * l1 for dy = dL/dy ([tokens, d_model] spec.dtype, row stride ld_dy,
  // 0 = dense) after forward(state) with the same t (x and the weights, unchanged; y is not read) and
  // tokens: dx (rounded to spec.dtype once; on the dense path once per GEMM), dWg, dWu, dWd^T (twell/training.h; dWd as the weight with
  // dw_down_as_weight). lambda: finite, >= 0;
  // the L1 term's coefficient is lambda / l1_tokens (l1_tokens 0: tokens; pass the whole batch's rows when
  // a batch is split into several calls), times *l1_weight where l1_weight (a device fp32) is given.
  // Gradients are written, not accumulated. A dense or split forward's state serves one backward (it becomes dg and
  // du: a second backward throws Error(InvalidArgument) naming `state`), and under dispatch Auto every
  // state does (whichever path its forward took); on the dense path nothing waits on the host. Stream-ordered; the sparse path waits on the host for the forward's overflow
  // count (an event recorded by forward() after its gate, long complete in a training step; the backward
  // does not make its stream wait for the forward's consumer, which writes u and Wd^T: run forward and backward on
  // one stream, or order them yourself). The plan's scratch
  // (backward_scratch_bytes) is allocated on the first call and grown as needed (cuMemAlloc). Calls on
  // one plan must run on the device in the order they are called (one stream, or events: they share the
  // scratch and, for an out_in Wd, the Wd^T buffer: every forward's consumer transposes Wd into it, a
  // backward too unless the buffer still holds the transpose its state's forward made from the same
  // t.w_down address and stride (no other forward's consumer, other state's backward or dWd^T written there
  // in between; the plan records this on the host, so Wd's contents must be what that forward read, as
  // above), and with dw_down_as_weight the backward then writes
  // dWd^T there). Throws Error(InvalidArgument) naming the argument
  // (a state without a forward or of another token count, a bad pointer or stride, an output overlapping x, dy, a
  // weight or another output: refused before any launch on either path), Error(NoDevice)
  // without a GPU, Error(Cuda).
  void backward(Stream stream, const FfnTensors& t, const void* dy, int64_t ld_dy, int64_t tokens,
                const FfnTrainingState& state, const FfnGradients& g, float lambda, int64_t l1_tokens = 0,
                const float* l1_weight = nullptr);

  // The backward's scratch for `tokens` rows and `grad_capacity` (the forward's overflow count: its
  // overflowing tile-rows) in bytes: the per-entry quads (16 bytes per TwELL word and backup_grad
  // element), train_weight_grad's workspace and entry list (8 bytes per TwELL word and backup element), and
  // a 4-byte counter; a split plan's dense neurons add [tokens, dense_neurons] spec.dtype (h, then dh) and
  // cuBLASLt's 32 MiB workspace.
  int64_t backward_scratch_bytes(int64_t tokens, uint32_t grad_capacity) const;
  // A state's device bytes after a forward of `tokens` rows with backup capacity `capacity` (with u per
  // entry where the plan keeps it: 8 bytes per TwELL word, else 4; a gate-only forward takes 4), plus the
  // dense neurons' g and u of a split plan (TrainingPlanOptions::dense_neurons).
  int64_t state_bytes(int64_t tokens, uint32_t capacity) const;
  // A state's device bytes after a dense forward of `tokens` rows: g and u, 2 bytes per token and neuron
  // each (u only where gated). The dense path's plan scratch: [tokens, d_ff] spec.dtype (h, then dh), and
  // cuBLASLt's 32 MiB workspace.
  int64_t dense_state_bytes(int64_t tokens) const;

  // TrainingDispatch::Auto's decisions so far, and forgetting them (the next forward of each bucket
  // times both paths again).
  std::vector<TrainingDecision> decisions() const;
  void recalibrate();
  static constexpr int64_t kCalibrationRows = 32768;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace twell
