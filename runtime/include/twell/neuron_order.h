// Hot and cold neurons: the split of d_ff between the dense path and TwELL (PlanOptions::dense_neurons).
//
// Real sparsity-trained layers are far from uniform (../shared/data/README.md): a few hundred neurons
// of d_ff fire for most tokens while the rest fire rarely. On paper layer 3 (3.2% density) the 2048
// most active of 5632 neurons hold 94% of the nonzeros. A per-token gather moves one Wu row and one Wd
// row (2 x d_model x 2 bytes) per nonzero, so a hot neuron costs as much as it would in a dense GEMM
// many times over; the dense path (cuBLASLt) computes it at tensor-core rate instead. The FFN is a sum
// over neurons, y = sum_j h_j Wd(:, j), so it is invariant under a permutation of d_ff: order the
// weights hot-first once (as a model loader does with any layout change), then let a plan compute the
// first `dense_neurons` densely and the rest through TwELL, and add the two.
//
//   1. activity = neuron_activity(plan.download_twell(stream))   // calibration tokens, Dispatch::Sparse
//   2. order    = hot_first_order(activity)
//   3. permute_neurons(spec, order, w_gate, w_up, w_down)        // host copies, once
//   4. options.dense_neurons = choose_dense_neurons(spec, tokens, in_order(activity, order), calibration rows)
//   (3'. or on the device: permute_neurons(context, stream, spec, order, device weights, new device weights))
#pragma once
#include <cstdint>
#include <span>
#include <vector>

#include "twell/format.h"
#include "twell/plan.h"
#include "twell/spec.h"

namespace twell {

// activity[j] = the number of rows of `m` in which neuron j (0 <= j < m.d_ff) is active, counting
// stored entries and the active values of backup rows. Throws Error(InvalidArgument) for a matrix that
// fails validate_twell or holds a tile-row that overflowed a full backup (kBackupMissing: its
// nonzeros are unknown; grow the backup, FfnPlan::last_overflow, and run again).
std::vector<uint64_t> neuron_activity(const TwellMatrix& m);

// The neurons by descending activity, ties by ascending index (deterministic): order[i] is the old
// index of the neuron that moves to position i.
std::vector<int64_t> hot_first_order(std::span<const uint64_t> activity);

// The activity in that order (result[i] = activity[order[i]]): the sorted counts choose_dense_neurons
// and predict_split_ms take. Throws Error(InvalidArgument) when the sizes differ or an index is out
// of range.
std::vector<uint64_t> in_order(std::span<const uint64_t> activity, std::span<const int64_t> order);

// Reorders the neurons of host weights (dtype bits, dense row-major, spec's layouts): new neuron i is
// old neuron order[i] (rows of w_gate and w_up, columns of an OutIn w_down, rows of an InOut one). The
// FFN computes the same function afterwards (up to the fp32 summation order). w_up is empty for a
// non-gated spec. Throws Error(InvalidArgument) naming the argument when `order` is not a permutation
// of 0..d_ff-1 or a weight has the wrong size.
void permute_neurons(const FfnSpec& spec, std::span<const int64_t> order, std::vector<uint16_t>& w_gate,
                     std::vector<uint16_t>& w_up, std::vector<uint16_t>& w_down);

class Context;

// Device weights to write (permute_neurons on the device): dtype bits in spec's layouts, row strides in
// elements (0 = dense). w_up is null for a non-gated spec.
struct DeviceFfnWeights {
  void* w_gate = nullptr;
  void* w_up = nullptr;
  void* w_down = nullptr;
  int64_t ld_gate = 0, ld_up = 0, ld_down = 0;
};

// permute_neurons on device memory: writes the weights of `in` (its w_gate, w_up, w_down and their
// strides; x and y are not read) reordered to `out`, which must not overlap them. Stream-ordered, and
// synchronizes `stream` before returning (`order` travels in a temporary device buffer); a one-time
// step when a model is loaded. Throws Error(InvalidArgument) naming the argument for a bad order (as
// the host version), a null, misaligned or host pointer, a short stride or overlapping in/out;
// Error(NoDevice) without a GPU.
void permute_neurons(Context& context, Stream stream, const FfnSpec& spec, std::span<const int64_t> order,
                     const FfnTensors& in, const DeviceFfnWeights& out);

// Throughputs of the three parts of a split FFN, in TFLOP/s (dense) or TB/s (gather). The defaults were
// measured on the H200 at the paper's shape, M = 16384 (bench/README.md v23-v24): the dense path (the
// fused gate + up kernel and cuBLASLt's down GEMM) 1.56 ms for the whole layer (728 TFLOP/s), the D2T
// gate 0.64 ms (590 TFLOP/s), and the row-gather consumer streaming its Wu/Wd rows at 6.8-8.4 TB/s
// (7 used). Measure your own with ffn_bench where they differ.
struct SplitCostModel {
  double dense_tflops = 728;   // the dense path (gate, up and down GEMMs, 6 M d_model n FLOP) on dense neurons
  double gate_tflops = 590;    // the D2T gate GEMM over the sparse neurons
  double gather_tbps = 7.0;    // the consumer's weight rows per nonzero of the sparse neurons
  double dense_overhead_ms = 0.01;  // the dense part's 2 extra launches (the fused kernel, the down GEMM)
  int64_t granularity = 256;   // candidate splits: multiples of this (a multiple of 64; 256 = a TwELL tile)
};

// Predicted milliseconds of a `tokens`-row FFN whose first `dense_neurons` neurons run dense and the rest
// through TwELL, given `activity` over `rows` calibration rows sorted descending (hot_first order).
double predict_split_ms(const FfnSpec& spec, int64_t tokens, std::span<const uint64_t> sorted_activity, int64_t rows,
                        int64_t dense_neurons, const SplitCostModel& model = {});

// The split with the least predicted time among 0, granularity, 2 granularity, ... below d_ff (0 = all
// sparse). `tokens`: the batch size the plan will mostly run (the terms scale with it, all but the
// dense part's launch overhead, so the choice settles above ~1024 tokens). Throws
// Error(InvalidArgument), naming the argument, when sorted_activity's size is not spec.d_ff, it is not
// sorted descending or holds a count above rows, rows < 1, tokens < 1, a rate of the model is not
// positive and finite, or granularity is not a multiple of 64.
int64_t choose_dense_neurons(const FfnSpec& spec, int64_t tokens, std::span<const uint64_t> sorted_activity, int64_t rows,
                             const SplitCostModel& model = {});

// The training step's split (TrainingPlanOptions::dense_neurons: twell/training_plan.h): the terms of one
// forward + backward of FfnTrainingPlan. The defaults were fitted on the H200 at the paper's shape
// (bench/README.md v56-v60): the dense path's step 4.5-4.6 ms at M = 16384 (nine GEMMs of 2 M d_model d_ff
// FLOP: 740 TFLOP/s with its elementwise passes); the TwELL path 2.65 ms at 0.5% and 6.9 at 2% there, as a
// per-call 0.2 ms, a density-independent part as 2 M d_model n FLOP at 420 TFLOP/s (the gate GEMM, the
// transposes, the weight gradients' zeroing) and eight d_model-long 16-bit weight or activation rows per
// active entry at 9.75 TB/s (the consumer's Wu and Wd rows, the row backward's, the weight gradients' x and
// dy rows). bench/README.md v60 tabulates it against the measured steps: the splits within 5-15% (under the
// Python steps, host time included) with the candidates in the measured order; the TwELL path alone on
// layers with hot neurons under-predicted by 15-30% (their long per-neuron lists).
struct TrainingSplitCostModel {
  double dense_tflops = 740;        // the dense path's GEMMs (18 M d_model n FLOP gated, 12 non-gated) per dense neuron
  double twell_fixed_tflops = 420;  // the TwELL path's density-independent work, as 2 M d_model n FLOP
  double gather_tbps = 9.75;        // 8 (gated; 5 non-gated) rows of d_model 16-bit values per active entry
  double twell_overhead_ms = 0.2;   // the TwELL part's per-call cost (launches, the overflow count's wait)
  double dense_overhead_ms = 0.15;  // a split's dense part: its launches and cuBLASLt's fixed costs
  int64_t granularity = 256;        // candidate splits: multiples of this (a multiple of 64)
};

// Predicted milliseconds of one training step (forward + backward) of `tokens` rows whose first
// `dense_neurons` neurons run on the dense path's kernels and the rest on TwELL (0: the TwELL path alone;
// d_ff: the dense path, TrainingPath::Dense), given `sorted_activity` over `rows` calibration rows (as
// predict_split_ms; the same errors, and dense_neurons outside 0..d_ff).
double predict_training_step_ms(const FfnSpec& spec, int64_t tokens, std::span<const uint64_t> sorted_activity, int64_t rows,
                                int64_t dense_neurons, const TrainingSplitCostModel& model = {});

// The training split with the least predicted step time among 0, granularity, 2 granularity, ... below
// d_ff, and d_ff itself: the TwELL path alone (0), a split (TrainingPlanOptions::dense_neurons), or the
// dense path (d_ff: TrainingDispatch::Dense). Errors as choose_dense_neurons.
int64_t choose_training_dense_neurons(const FfnSpec& spec, int64_t tokens, std::span<const uint64_t> sorted_activity,
                                      int64_t rows, const TrainingSplitCostModel& model = {});

}  // namespace twell
