// FfnPlan's state, shared by the files that implement it, one concern each:
//   plan_build.cpp     Context::plan: spec checks, kernels, workspace
//   run_arguments.cpp  the argument checks of run() and DenseFfn::run
//   plan_dispatch.cpp  run(): the path per token bucket (Dispatch::Auto's calibration)
//   plan_launch.cpp    the launch sequences (large-M kernels, decode kernels)
//   plan_matrix.cpp    the TwELL matrix: last_overflow, download_twell, upload_twell; accessors
#pragma once
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "context_impl.h"
#include "dense_kernels.h"
#include "run_arguments.h"
#include "twell/dense.h"
#include "twell/device_memory.h"
#include "twell/plan.h"

namespace twell {

struct FfnPlan::Impl {
  std::shared_ptr<Context::Impl> context;
  FfnSpec spec;  // as the user gave it: what run() checks the tensors against
  // The TwELL part: spec with d_ff - dense_neurons neurons (all of them without a split). The kernels,
  // the TwELL matrix and the transposed Wd cover these neurons only.
  FfnSpec sparse_spec;
  int64_t dense_neurons = 0;
  std::unique_ptr<DenseFfn> hot;  // the first dense_neurons neurons (PlanOptions::dense_neurons), y +=
  TwellLayout layout;
  Target target;
  int64_t max_tokens = 0;
  std::string ir;
  std::shared_ptr<LoadedKernel> gate;      // GateTwell (D2T)
  std::shared_ptr<LoadedKernel> consumer;  // GatedDown: the row consumer (one row per CTA or per warp)
  // The token-block consumer, when spec.consumer is unset and the shape allows it: run() times it
  // against the row consumer per token bucket.
  std::shared_ptr<LoadedKernel> block_consumer;
  std::vector<KernelReport> reports;
  std::unique_ptr<detail::DeviceBuffer> twell;     // [max_tokens, words_per_row] uint32
  std::unique_ptr<detail::DeviceBuffer> backup;    // [backup_capacity, tile_n] 16-bit
  std::unique_ptr<detail::DeviceBuffer> counter;   // uint32 overflow count, uint32 row counter (GatedDownParams)
  // Layout normalization: an nn.Linear (out_in) Wd is transposed on the stream into w_down_t
  // [d_ff, d_model] before the consumer, which then reads whole rows (coalesced) per active neuron.
  std::shared_ptr<LoadedKernel> transpose;
  std::unique_ptr<detail::DeviceBuffer> w_down_t;
  uint32_t backup_capacity = 0;
  // The capacity the current TwELL matrix was made with: backup_capacity after a run, the uploaded
  // matrix's own after upload_twell (what last_overflow and download_twell report).
  uint32_t matrix_capacity = 0;
  uint32_t wanted_capacity = 0;  // set by last_overflow(); the next run() grows the backup to it
  int64_t last_tokens = -1;
  Dispatch dispatch = Dispatch::Sparse;
  std::unique_ptr<DenseFfn> dense;  // with Dispatch::Auto or Dense
  enum class Path { Rows, Block, Dense };
  // Per (run()'s decision_key, bucket 3 bit_width(tokens - 1) + (2 fused decode | 1 decode | 0)), after calibration.
  std::map<std::pair<uint64_t, int>, Path> bucket_path;
  // The decode kernels (PlanOptions::decode_max_tokens; null when off or not made for this shape),
  // generated for the user's down layout, and their workspace (device::DecodeBuffers).
  std::shared_ptr<LoadedKernel> decode_gate, decode_up, decode_down, decode_gate_small;
  int64_t decode_max_tokens = 0;
  int64_t decode_act_ld = 0;
  std::unique_ptr<detail::DeviceBuffer> decode_act, decode_arrivals, decode_entries;
  // decode_fused (decode_fused.cuh): the whole FFN of a few rows in one cooperative kernel, which run()
  // takes for decode calls of at most decode_fused_max_tokens rows (null where PlanOptions turn it off
  // or its shared memory does not fit), and its workspace (device::DecodeFusedBuffers; the arrival
  // and publication counts zeroed once).
  std::shared_ptr<LoadedKernel> decode_fused;
  int64_t decode_fused_max_tokens = 0;
  std::unique_ptr<detail::DeviceBuffer> fused_pairs, fused_counts, fused_arrivals;
  bool use_block = false;  // the consumer the next launch() runs
  std::string last_path;
  std::string config_source = "heuristic";  // FfnPlan::config_source

  void allocate_backup(uint32_t capacity) {
    backup_capacity = capacity;
    backup = std::make_unique<detail::DeviceBuffer>(std::max<size_t>(1, size_t(capacity) * layout.tile_n * 2));
  }
};

// Where one forward's TwELL matrix goes: the plan's own buffers (FfnPlan::run) or a training state's
// (FfnTrainingPlan::forward, twell/training_plan.h).
struct TwellBuffers {
  uint32_t* twell;        // [tokens, words_per_row]
  uint16_t* backup;       // [backup_capacity, tile_n]
  CUdeviceptr counter;    // 2 uint32: the gate's overflow count, the warp-row consumer's row counter
  uint32_t backup_capacity;
  float* row_l1;          // null, or [tokens] (GatedDownParams::row_l1)
  // GatedDownParams::entry_u_after_words: u per entry into [tokens, words_per_row] fp32 after the words.
  bool entry_u_after_words = false;
};
enum class LaunchStages { All, GateOnly, ConsumerOnly };

// Whether a call of `tokens` rows that may take the decode kernels (run(), the row consumer) takes the
// fused one: both cut-offs (PlanOptions::decode_max_tokens, decode_fused_max_tokens) and the plan holds it.
inline bool takes_fused_decode(const FfnPlan::Impl& p, int64_t tokens) {
  return p.decode_gate && p.decode_fused && tokens > 0 && tokens <= p.decode_max_tokens && tokens <= p.decode_fused_max_tokens;
}

// The launch sequence over the TwELL neurons (t: their slices, checked): memset(overflow counter) ->
// [transpose Wd] -> gate_twell -> consumer (the row or token-block one, p.use_block), or the decode
// kernels where allow_decode and the call is small enough (decode_fused where takes_fused_decode: no
// TwELL matrix then). `who` names the caller in errors. (plan_launch.cpp)
void launch_twell(FfnPlan::Impl& p, const FfnTensors& t, int64_t tokens, LaunchStages stages, const TwellBuffers& m,
                  bool allow_decode, CUstream cu, const char* who);

// A default-constructed or moved-from plan has no Impl: every use is a clear error, not a crash.
FfnPlan::Impl& checked_plan(const std::unique_ptr<FfnPlan::Impl>& impl, const char* what);

// The two parts of a split FFN's tensors (PlanOptions::dense_neurons = k): the dense part's weights
// are the first k neurons, the TwELL part's the others; both keep the full row strides.
FfnTensors neuron_slice(const FfnSpec& s, const FfnTensors& t, int64_t first);

// The generated kernels' operand alignment (KernelSource::operand_alignment) for these tensors:
// Error(InvalidArgument) naming the first operand or stride that breaks it.
void check_operand_alignment(const FfnPlan::Impl& p, const FfnTensors& t, bool gate_only);

// Whether the token-block consumer may read these operands: 16-byte aligned rows of x, Wu, Wd^T and y
// (its cp.async chunks). An out_in Wd is read from the plan's transposed copy, which is aligned.
bool block_operands_aligned(const FfnSpec& s, const FfnTensors& t);

}  // namespace twell
