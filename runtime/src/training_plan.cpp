// FfnTrainingPlan (twell/training_plan.h): the inference plan's gate and row consumer writing into a
// training state, then train_row_backward and train_weight_grad over it with the plan's scratch.
#include "twell/training_plan.h"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cmath>
#include <future>
#include <iterator>
#include <limits>
#include <map>

#include "driver.h"
#include "launcher.h"
#include "plan_impl.h"
#include "run_arguments.h"
#include "training_dense.h"
#include "training_impl.h"
#include "twell/context.h"
#include "twell/error.h"
#include "twell/kernels/constraints.h"
#include "twell/kernels/validate.h"

namespace twell {

namespace {
[[noreturn]] void fail(const char* who, const std::string& message) {
  throw Error(ErrorCode::InvalidArgument, fmt::format("{}: {}", who, message));
}

void ensure(detail::DeviceBuffer& b, size_t bytes, CUstream cu, const char* who) { detail::ensure_bytes(b, bytes, cu, who); }

// A state's `twell` buffer: the TwELL words of `tokens` rows (4 bytes each), then, with u kept, one fp32 u
// per word (GatedDownParams::entry_u_after_words: it starts where the words end).
size_t words_bytes(const TwellLayout& l, int64_t d_ff, int64_t tokens) {
  return size_t(std::max<int64_t>(tokens, 0)) * size_t(l.words_per_row(d_ff)) * 4;
}
size_t twell_buffer_bytes(const TwellLayout& l, int64_t d_ff, int64_t tokens, bool with_u) {
  return words_bytes(l, d_ff, tokens) * (with_u ? 2 : 1);
}

// The weight gradients of neurons first.. (neuron_slice's counterpart for a split plan's two parts): rows
// of dWg, dWu and dWd^T, or columns of dWd as an out_in weight ([K, N]: dw_down_is_weight); explicit
// strides, as the slices' d_ff is not the spec's. out_bytes: 4 (fp32) or 2 (gradients_in_dtype). dx is
// both parts' (the dense one adds to it).
FfnGradients gradient_slice(const FfnSpec& s, const FfnGradients& g, int64_t first, int out_bytes, bool dw_down_is_weight) {
  FfnGradients c = g;
  auto at = [&](void* p, int64_t elements) { return p ? static_cast<char*>(p) + elements * out_bytes : nullptr; };
  c.ld_dw_gate = g.ld_dw_gate ? g.ld_dw_gate : s.d_model;
  c.dw_gate = at(g.dw_gate, first * c.ld_dw_gate);
  if (g.dw_up != nullptr) {
    c.ld_dw_up = g.ld_dw_up ? g.ld_dw_up : s.d_model;
    c.dw_up = at(g.dw_up, first * c.ld_dw_up);
  }
  c.ld_dw_down = g.ld_dw_down ? g.ld_dw_down : dw_down_is_weight ? s.d_ff : s.d_model;
  c.dw_down = at(g.dw_down, dw_down_is_weight ? first : first * c.ld_dw_down);
  return c;
}
}  // namespace

struct FfnTrainingState::Impl {
  std::shared_ptr<Context::Impl> context;
  detail::DeviceBuffer twell, backup, counter;
  // Whether the last forward left u per entry after the TwELL words in `twell` (GatedDownParams::
  // entry_u_after_words: where the plan keeps it, keep_u, and the forward ran the consumer).
  bool has_u = false;
  uint32_t* pinned = nullptr;  // the forward's overflow count, copied on its stream
  CUevent event = nullptr;     // recorded after that copy
  int64_t tokens = -1;
  uint32_t capacity = 0;  // the backup's tile-rows in the last forward
  uint64_t plan_id = 0;   // the FfnTrainingPlan that made it (ids are never reused, unlike addresses)
  uint64_t forward_number = 0;  // the plan's count of forwards at its last forward (FfnTrainingPlan::Impl)
  TrainingPath path = TrainingPath::Sparse;  // the last forward's
  detail::DeviceBuffer dense_g, dense_u;     // TrainingPath::Dense: g and u, then dg and du
  // A backward has read it since its forward: on the dense path it turned dense_g, dense_u into dg, du,
  // so a second backward is refused there (and under dispatch Auto on either path: one contract).
  bool consumed = false;

  ~Impl() {
    if (!context || !context->gpu) return;
    context->make_current();
    const detail::Driver& d = detail::Driver::get();
    // The forward's copy into the pinned word may still be queued: it lands before the word is freed.
    if (event && tokens >= 0) d.cuEventSynchronize(event);
    if (event) d.cuEventDestroy(event);
    if (pinned) d.cuMemFreeHost(pinned);
  }
};

FfnTrainingState::FfnTrainingState() = default;
FfnTrainingState::~FfnTrainingState() = default;
FfnTrainingState::FfnTrainingState(FfnTrainingState&&) noexcept = default;
FfnTrainingState& FfnTrainingState::operator=(FfnTrainingState&&) noexcept = default;
int64_t FfnTrainingState::tokens() const { return impl_ ? impl_->tokens : -1; }
size_t FfnTrainingState::device_bytes() const {
  return impl_ ? impl_->twell.bytes() + impl_->backup.bytes() + impl_->counter.bytes() + impl_->dense_g.bytes() +
                     impl_->dense_u.bytes()
               : 0;
}
TrainingPath FfnTrainingState::path() const { return impl_ ? impl_->path : TrainingPath::Sparse; }

struct FfnTrainingPlan::Impl {
  std::shared_ptr<Context::Impl> context;
  uint64_t id = 0;          // unique in the process: a state names its plan by it
  FfnPlan forward;          // its kernels (gate, row consumer, Wd transpose); its own matrix is not used
  FfnSpec kernel_spec;      // the training kernels' spec: the plan's layout, in_out Wd
  TrainingPlanOptions options;
  int64_t max_tokens = 0;
  uint32_t capacity = 0;    // the next states' backup tile-rows (grows after an overflow)
  // Whether forwards keep u per entry for the backward (a gated spec whose forward consumer and row
  // backward are both the warp-per-row forms: the consumer writes it, the entries pass reads it; 4 bytes
  // per TwELL word of state for half the entries pass's weight bytes).
  bool keep_u = false;
  std::vector<KernelReport> reports;
  // The backward's scratch, shared by every state of the plan (calls are stream-ordered).
  detail::DeviceBuffer entry_grad, backup_grad, workspace, entry_list, grad_overflow;
  // An out_in Wd's transpose in the forward plan's Wd^T buffer: forward number `w_down_t_forward` (0: none
  // a backward may use) made it from (w_down_t_source, w_down_t_ld). A backward of that forward's state
  // with the same Wd reads it as it is instead of transposing again (the weights are unchanged between a
  // forward and its backward: training_plan.h); a later forward's consumer, another state's backward
  // transpose, or dWd^T written there replaces it (a gate-only forward writes nothing there).
  uint64_t forwards = 0, w_down_t_forward = 0;
  const void* w_down_t_source = nullptr;
  int64_t w_down_t_ld = 0;
  // The dense path (options.dispatch Dense or Auto), and Auto's decisions by (decision key, bucket).
  std::unique_ptr<detail::DenseTraining> dense;
  // A split plan's dense neurons (options.dense_neurons > 0; their spec's d_ff is dense_neurons): the
  // TwELL path's forward adds them to y and row_l1, its backward to dx (`forward` is the TwELL part's
  // plan: FfnPlan's split, whose sparse_spec holds the other neurons).
  std::unique_ptr<detail::DenseTraining> hot;
  std::map<std::pair<uint64_t, int>, TrainingDecision> decisions;

  std::unique_ptr<FfnTrainingState::Impl> new_state() const;
  void run_forward(TrainingPath path, CUstream cu, const FfnTensors& t, int64_t tokens, FfnTrainingState::Impl& s, float* row_l1);
  void run_backward(CUstream cu, const FfnTensors& t, const void* dy, int64_t ld_dy, int64_t tokens, FfnTrainingState::Impl& s,
                    const FfnGradients& g, float lambda, int64_t l1_tokens, const float* l1_weight);
  TrainingPath calibrate(CUstream cu, const FfnTensors& t, int64_t tokens, TrainingDecision& decision);
};

FfnTrainingPlan::FfnTrainingPlan() = default;
FfnTrainingPlan::~FfnTrainingPlan() = default;
FfnTrainingPlan::FfnTrainingPlan(FfnTrainingPlan&&) noexcept = default;
FfnTrainingPlan& FfnTrainingPlan::operator=(FfnTrainingPlan&&) noexcept = default;

namespace {
bool capturing(CUstream stream) {
  CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
  return detail::Driver::get().cuStreamIsCapturing(stream, &status) != CUDA_SUCCESS || status != CU_STREAM_CAPTURE_STATUS_NONE;
}

FfnTrainingPlan::Impl& checked(const std::unique_ptr<FfnTrainingPlan::Impl>& impl, const char* what) {
  if (!impl) fail(what, "this FfnTrainingPlan is empty (default-constructed or moved from): make one with FfnTrainingPlan::create");
  return *impl;
}
}  // namespace

FfnTrainingPlan FfnTrainingPlan::create(Context& context, const FfnSpec& user_spec, int64_t max_tokens,
                                        const TrainingPlanOptions& options) {
  constexpr const char* who = "FfnTrainingPlan::create";
  FfnSpec spec = kernels::canonical_spec(user_spec);
  if (spec.consumer && *spec.consumer != ConsumerVariant::RowGather)
    fail(who, "spec.consumer: expected unset or row_gather (the training forward's L1 term comes from the row "
              "consumers), got token_block");
  spec.consumer = ConsumerVariant::RowGather;  // the token-block consumer is not made
  if (spec.d_model > kernels::TrainRowBackwardConstraints::kMaxDModel)
    fail(who, fmt::format("spec.d_model: expected at most {} (train_row_backward keeps a row of dx in registers), got {}",
                          kernels::TrainRowBackwardConstraints::kMaxDModel, spec.d_model));
  if (options.dispatch != TrainingDispatch::Sparse && options.dispatch != TrainingDispatch::Dense &&
      options.dispatch != TrainingDispatch::Auto)
    fail(who, fmt::format("options.dispatch: expected Sparse, Dense or Auto, got {}", static_cast<int>(options.dispatch)));
  if (options.dense_neurons != 0 && options.dispatch == TrainingDispatch::Dense)
    fail(who, fmt::format("options.dense_neurons: a Dense plan has no TwELL part to split; expected 0 (or dispatch Sparse "
                          "or Auto), got {}", options.dense_neurons));
  if (options.dense_neurons < 0 || options.dense_neurons % 64 != 0 || options.dense_neurons >= spec.d_ff)
    fail(who, fmt::format("options.dense_neurons: expected a multiple of 64 in 0..{} (below d_ff = {}: at least one "
                          "neuron stays on TwELL), got {}", (spec.d_ff - 1) / 64 * 64, spec.d_ff, options.dense_neurons));
  if (options.dw_down_as_weight && spec.down_layout == WeightLayout::OutIn && !options.gradients_in_dtype)
    fail(who, "options.dw_down_as_weight: expected gradients_in_dtype with it for an out_in Wd (dWd is transposed "
              "into Wd's layout as 16-bit values), got fp32 gradients");
  PlanOptions plan_options;
  plan_options.dispatch = Dispatch::Sparse;
  plan_options.decode_max_tokens = 0;
  plan_options.decode_fused_max_tokens = 0;
  plan_options.backup_capacity = options.backup_capacity;
  plan_options.dense_neurons = options.dense_neurons;  // the TwELL part: neurons dense_neurons.. (sparse_spec)
  plan_options.tuning = options.tuning;
  plan_options.tuning_workload = options.tuning_workload;
  plan_options.tuning_dir = options.tuning_dir;

  FfnTrainingPlan plan;
  plan.impl_ = std::make_unique<Impl>();
  Impl& p = *plan.impl_;
  static std::atomic<uint64_t> next_id{1};
  p.id = next_id.fetch_add(1);
  p.context = context_impl(context);
  p.options = options;
  p.max_tokens = max_tokens;
  // The forward plan, then the training kernels of its layout (now, so that a spec they refuse fails here
  // and a bundle saved after has them). A layout from the tuning database or a bundle that the training
  // kernels refuse (a tile_n whose train_weight_grad counters do not fit, say) falls back to the
  // heuristic layout, as Context::plan does for a tuned layout the inference kernels cannot build.
  auto build = [&](const PlanOptions& o) {
    p.forward = context.plan(spec, max_tokens, o, Context::PlanUse::TrainingForward);
    const FfnPlan::Impl& f = *p.forward.impl_;
    p.kernel_spec = f.sparse_spec;
    p.kernel_spec.down_layout = WeightLayout::InOut;
    p.kernel_spec.tile_n = f.layout.tile_n;
    p.kernel_spec.slots = f.layout.slots;
    p.reports = f.reports;
    // The two training kernels compile in parallel (a JIT compile takes about a second each; where no
    // thread can be made, the deferred policy runs it here at wait()).
    KernelReport row_report, weight_report;
    constexpr auto policy = std::launch::async | std::launch::deferred;
    auto row_backward = std::async(policy, [&] {
      return p.context->auxiliary(kernels::KernelKind::TrainRowBackward, p.kernel_spec, who, &row_report);
    });
    auto weight_grad = std::async(policy, [&] {
      return p.context->auxiliary(kernels::KernelKind::TrainWeightGrad, p.kernel_spec, who, &weight_report);
    });
    weight_grad.wait();
    const std::shared_ptr<LoadedKernel> row = row_backward.get();
    weight_grad.get();
    p.reports.push_back(std::move(row_report));
    p.reports.push_back(std::move(weight_report));
    const bool warp_row_backward = row->source.consumer == kernels::ConsumerKind::WarpRow;
    p.keep_u = options.keep_u && p.kernel_spec.gated && warp_row_backward && f.consumer &&
               f.consumer->source.consumer == kernels::ConsumerKind::WarpRow;
  };
  try {
    build(plan_options);
  } catch (const Error& e) {
    const bool tuned = p.forward.impl_ && (p.forward.config_source().rfind("database", 0) == 0 ||
                                           p.forward.config_source().rfind("bundle", 0) == 0);
    if (!tuned || (e.code() != ErrorCode::InvalidArgument && e.code() != ErrorCode::Compile)) throw;
    plan_options.tuning = PlanOptions::Tuning::Ignore;
    build(plan_options);
  }
  FfnPlan::Impl& f = *p.forward.impl_;
  if (options.dispatch != TrainingDispatch::Sparse)
    p.dense = std::make_unique<detail::DenseTraining>(p.context, f.spec, p.reports, who);
  if (options.dense_neurons > 0) {
    FfnSpec hot_spec = f.spec;
    hot_spec.d_ff = options.dense_neurons;
    p.hot = std::make_unique<detail::DenseTraining>(p.context, hot_spec, p.reports, who);
  }
  p.capacity = f.backup_capacity;
  if (p.context->gpu) {
    // The plan's own TwELL matrix and backup are never used: the states hold them.
    p.context->make_current();
    f.twell = std::make_unique<detail::DeviceBuffer>(4);
    f.allocate_backup(0);
  }
  return plan;
}

const FfnSpec& FfnTrainingPlan::spec() const { return checked(impl_, "FfnTrainingPlan::spec").forward.spec(); }
const TwellLayout& FfnTrainingPlan::layout() const { return checked(impl_, "FfnTrainingPlan::layout").forward.layout(); }
int64_t FfnTrainingPlan::max_tokens() const { return checked(impl_, "FfnTrainingPlan::max_tokens").max_tokens; }
const TrainingPlanOptions& FfnTrainingPlan::options() const { return checked(impl_, "FfnTrainingPlan::options").options; }
const std::vector<KernelReport>& FfnTrainingPlan::kernels() const { return checked(impl_, "FfnTrainingPlan::kernels").reports; }
bool FfnTrainingPlan::runnable() const { return impl_ && impl_->context->gpu; }

FfnTrainingState FfnTrainingPlan::make_state() const {
  constexpr const char* who = "FfnTrainingPlan::make_state";
  const Impl& p = checked(impl_, who);
  if (!p.context->gpu) throw Error(ErrorCode::NoDevice, fmt::format("{}: needs a GPU ({})", who, p.context->no_gpu_reason));
  FfnTrainingState state;
  state.impl_ = p.new_state();
  return state;
}

std::unique_ptr<FfnTrainingState::Impl> FfnTrainingPlan::Impl::new_state() const {
  context->make_current();
  auto s = std::make_unique<FfnTrainingState::Impl>();
  s->context = context;
  s->plan_id = id;
  const detail::Driver& d = detail::Driver::get();
  void* host = nullptr;
  detail::check(d.cuMemAllocHost(&host, 4), "FfnTrainingPlan::make_state: cuMemAllocHost(overflow count)");
  s->pinned = static_cast<uint32_t*>(host);
  *s->pinned = 0;
  detail::check(d.cuEventCreate(&s->event, CU_EVENT_DISABLE_TIMING), "FfnTrainingPlan::make_state: cuEventCreate");
  s->counter = detail::DeviceBuffer(8);
  return s;
}

int64_t FfnTrainingPlan::dense_state_bytes(int64_t tokens) const {
  return int64_t(detail::DenseTraining::state_bytes(checked(impl_, "FfnTrainingPlan::dense_state_bytes").forward.spec(), tokens));
}

std::vector<TrainingDecision> FfnTrainingPlan::decisions() const {
  std::vector<TrainingDecision> out;
  for (const auto& [key, decision] : checked(impl_, "FfnTrainingPlan::decisions").decisions) out.push_back(decision);
  return out;
}

void FfnTrainingPlan::recalibrate() { checked(impl_, "FfnTrainingPlan::recalibrate").decisions.clear(); }

int64_t FfnTrainingPlan::state_bytes(int64_t tokens, uint32_t capacity) const {
  const Impl& p = checked(impl_, "FfnTrainingPlan::state_bytes");
  const TwellLayout& l = p.forward.layout();
  int64_t hot = 0;
  if (p.hot) {
    FfnSpec hot_spec = p.forward.spec();
    hot_spec.d_ff = p.options.dense_neurons;
    hot = int64_t(detail::DenseTraining::state_bytes(hot_spec, tokens));
  }
  return int64_t(twell_buffer_bytes(l, p.kernel_spec.d_ff, tokens, p.keep_u)) + int64_t{capacity} * l.tile_n * 2 + 8 + hot;
}

int64_t FfnTrainingPlan::backward_scratch_bytes(int64_t tokens, uint32_t grad_capacity) const {
  const Impl& p = checked(impl_, "FfnTrainingPlan::backward_scratch_bytes");
  const TwellLayout& l = p.forward.layout();
  tokens = std::max<int64_t>(tokens, 0);
  const int64_t hot = p.hot ? tokens * p.options.dense_neurons * 2 + (int64_t{32} << 20) : 0;
  return entry_grad_floats(l, p.kernel_spec.d_ff, tokens) * 4 + backup_grad_floats(l, grad_capacity) * 4 +
         train_weight_grad_workspace_bytes(p.kernel_spec) + train_weight_grad_list_bytes(p.kernel_spec, tokens, grad_capacity) + 4 + hot;
}

void FfnTrainingPlan::forward(Stream stream, const FfnTensors& t, int64_t tokens, FfnTrainingState& state, float* row_l1,
                              uint64_t decision_key) {
  constexpr const char* who = "FfnTrainingPlan::forward";
  Impl& p = checked(impl_, who);
  if (!p.context->gpu) throw Error(ErrorCode::NoDevice, fmt::format("{}: this plan was made without a GPU ({})", who, p.context->no_gpu_reason));
  if (!state.impl_ || state.impl_->plan_id != p.id) fail(who, "state: expected a state this plan made (FfnTrainingPlan::make_state)");
  p.context->make_current();
  FfnPlan::Impl& f = *p.forward.impl_;
  // Neither y nor row_l1 wanted: the gate alone, which makes everything the backward reads.
  const bool gate_only = t.y == nullptr && row_l1 == nullptr;
  // The dense path's gate-only forward also computes u (x and Wu), and Auto's timing runs whole steps: both
  // read the weights a TwELL gate-only forward does not.
  const bool may_be_dense = p.options.dispatch != TrainingDispatch::Sparse || p.hot;
  check_run_arguments(who, f.spec, t, tokens, p.max_tokens,
                      !gate_only ? RunOperands::All : may_be_dense ? RunOperands::GateAndWeights : RunOperands::Gate);
  check_operand_alignment(f, t, gate_only);
  if (row_l1 != nullptr) {
    if (std::string problem = pointer_problem("row_l1", row_l1, 4); !problem.empty()) fail(who, problem);
    if (!is_device_memory(row_l1)) fail(who, fmt::format("row_l1: expected device memory (cuMemAlloc/cudaMalloc), got {}", static_cast<void*>(row_l1)));
  }
  FfnTrainingState::Impl& s = *state.impl_;
  s.tokens = -1;  // not a forward's state until this one's launches are enqueued (a failure leaves it so)
  auto cu = reinterpret_cast<CUstream>(stream);
  TrainingPath path = p.options.dispatch == TrainingDispatch::Dense ? TrainingPath::Dense : TrainingPath::Sparse;
  if (p.options.dispatch == TrainingDispatch::Auto && tokens > 0) {
    const int bucket = std::bit_width(static_cast<uint64_t>(tokens - 1));  // tokens in (2^(bucket-1), 2^bucket]
    const auto decided = p.decisions.find({decision_key, bucket});
    // Under stream capture nothing can be timed: a decided bucket keeps its path, an undecided one takes
    // Sparse without deciding.
    const bool capture = decided == p.decisions.end() && capturing(cu);
    auto [it, fresh] = capture ? std::pair{decided, false} : p.decisions.try_emplace({decision_key, bucket});
    if (fresh) {
      try {
        it->second.decision_key = decision_key;
        it->second.max_tokens = int64_t{1} << bucket;
        p.calibrate(cu, t, tokens, it->second);
      } catch (...) {
        p.decisions.erase(it);
        throw;
      }
    }
    if (!capture) path = it->second.path;
  }
  p.run_forward(path, cu, t, tokens, s, row_l1);
}

void FfnTrainingPlan::Impl::run_forward(TrainingPath path, CUstream cu, const FfnTensors& t, int64_t tokens, FfnTrainingState::Impl& s,
                                        float* row_l1) {
  constexpr const char* who = "FfnTrainingPlan::forward";
  const detail::Driver& d = detail::Driver::get();
  s.tokens = -1;
  s.consumed = false;
  // A state that changes path gives the other path's buffers back (the stream may still read them; not
  // during stream capture, which a synchronization would end: they are kept then).
  const bool dense_path = path == TrainingPath::Dense;
  // (A split plan's TwELL path keeps g and u too: its dense neurons'.)
  if ((dense_path ? (s.twell || s.backup) : s.dense_g && !hot) && !capturing(cu)) {
    detail::check(d.cuStreamSynchronize(cu), "FfnTrainingPlan::forward: cuStreamSynchronize (a state changing path)");
    (dense_path ? s.twell : s.dense_g).reset();
    (dense_path ? s.backup : s.dense_u).reset();
  }
  s.forward_number = ++forwards;
  if (dense_path) {
    s.has_u = false;
    dense->forward(cu, t, tokens, s.dense_g, s.dense_u, row_l1);
    s.path = TrainingPath::Dense;
    s.tokens = tokens;
    s.capacity = capacity;
    return;
  }
  FfnPlan::Impl& f = *forward.impl_;
  const bool gate_only = t.y == nullptr && row_l1 == nullptr;
  const TwellLayout& l = f.layout;
  // The TwELL part's neurons (launch_twell takes the slices: FfnPlan::run makes them before it). The dense
  // neurons' buffers and cuBLASLt algorithms first: a refusal there must not leave y or row_l1 half written.
  const FfnTensors tc = hot ? neuron_slice(f.spec, t, options.dense_neurons) : t;
  const FfnTensors th = hot ? neuron_slice(f.spec, t, 0) : FfnTensors{};  // the dense neurons' (explicit strides)
  if (hot) hot->prepare_forward(cu, th, tokens, s.dense_g, s.dense_u, !gate_only);
  // The words, then (keep_u, and the consumer runs) u per entry: GatedDownParams::entry_u_after_words.
  s.has_u = keep_u && !gate_only;
  ensure(s.twell, twell_buffer_bytes(l, f.sparse_spec.d_ff, tokens, s.has_u), cu, who);
  ensure(s.backup, size_t(capacity) * l.tile_n * 2, cu, who);
  const TwellBuffers matrix{reinterpret_cast<uint32_t*>(s.twell.get()), reinterpret_cast<uint16_t*>(s.backup.get()),
                            s.counter.get(), capacity, row_l1, s.has_u};
  f.use_block = false;
  // The gate, the overflow count's copy and its event, then the consumer: a backward right behind this
  // forward (the operators' recompute) waits on the host for the gate only.
  launch_twell(f, tc, tokens, LaunchStages::GateOnly, matrix, /*allow_decode=*/false, cu, who);
  detail::check(d.cuMemcpyDtoHAsync(s.pinned, s.counter.get(), 4, cu), "FfnTrainingPlan::forward: cuMemcpyDtoHAsync(overflow count)");
  detail::check(d.cuEventRecord(s.event, cu), "FfnTrainingPlan::forward: cuEventRecord");
  if (!gate_only) {
    w_down_t_forward = 0;  // the consumer's stage transposes an out_in Wd into the buffer first
    launch_twell(f, tc, tokens, LaunchStages::ConsumerOnly, matrix, /*allow_decode=*/false, cu, who);
    if (f.transpose && tokens > 0) {
      w_down_t_forward = s.forward_number;
      w_down_t_source = t.w_down;
      w_down_t_ld = t.ld_down;
    }
  }
  // The dense neurons, added to the TwELL part's y and row_l1 (a gate-only forward: their g and u alone).
  if (hot) hot->forward(cu, th, tokens, s.dense_g, s.dense_u, row_l1, /*accumulate=*/true);
  s.path = TrainingPath::Sparse;
  s.tokens = tokens;
  s.capacity = capacity;
}

void FfnTrainingPlan::backward(Stream stream, const FfnTensors& t, const void* dy, int64_t ld_dy, int64_t tokens,
                               const FfnTrainingState& state, const FfnGradients& g, float lambda, int64_t l1_tokens,
                               const float* l1_weight) {
  constexpr const char* who = "FfnTrainingPlan::backward";
  Impl& p = checked(impl_, who);
  if (!p.context->gpu) throw Error(ErrorCode::NoDevice, fmt::format("{}: this plan was made without a GPU ({})", who, p.context->no_gpu_reason));
  if (!state.impl_ || state.impl_->plan_id != p.id) fail(who, "state: expected a state this plan made (FfnTrainingPlan::make_state)");
  FfnTrainingState::Impl& s = *state.impl_;
  if (s.tokens < 0) fail(who, "state: expected the state of a forward() call, got one no forward has filled");
  if (s.consumed && (s.path == TrainingPath::Dense || p.hot || p.options.dispatch == TrainingDispatch::Auto))
    fail(who, "state: expected a forward's state with no backward yet (a dense or split forward's g and u became dg and "
              "du in its backward; under dispatch Auto either path's state serves one backward: run forward() again), got "
              "one a backward has used");
  if (tokens != s.tokens)
    fail(who, fmt::format("tokens: expected the forward's token count {} (the state's), got {}", s.tokens, tokens));
  p.context->make_current();
  FfnPlan::Impl& f = *p.forward.impl_;
  // x and the weights (y is not read): Wd before the transpose reads it; the training kernels check the rest.
  check_run_arguments(who, f.spec, t, tokens, p.max_tokens, RunOperands::GateAndWeights);
  // Every output before the first launch (the kernels check them again): a bad dw_* must not leave dx
  // written. dx may not overlap a weight (read while dx is written) or a weight gradient.
  const int64_t K = f.spec.d_model, N = f.spec.d_ff;
  const int out_bytes = p.options.gradients_in_dtype ? 2 : 4;
  const bool out_in = f.spec.down_layout == WeightLayout::OutIn;
  // dWd as an out_in Wd ([K, N]): the weight gradients write dWd^T into w_down_t, then a transpose.
  const bool dw_down_transposed = p.options.dw_down_as_weight && out_in;
  const int64_t dw_down_rows = dw_down_transposed ? K : N, dw_down_cols = dw_down_transposed ? N : K;
  struct Out {
    const char* name;
    const void* ptr;
    const char* ld_name;
    int64_t ld, rows, cols;
    int bytes;
  };
  const Out outs[] = {{"g.dx", g.dx, "g.ld_dx", g.ld_dx, tokens, K, 2},
                      {"g.dw_gate", g.dw_gate, "g.ld_dw_gate", g.ld_dw_gate, N, K, out_bytes},
                      {"g.dw_up", g.dw_up, "g.ld_dw_up", g.ld_dw_up, f.spec.gated ? N : 0, K, out_bytes},
                      {"g.dw_down", g.dw_down, "g.ld_dw_down", g.ld_dw_down, dw_down_rows, dw_down_cols, out_bytes}};
  if (!f.spec.gated && (g.dw_up != nullptr || g.ld_dw_up != 0))
    fail(who, fmt::format("g.dw_up: a non-gated spec has no up weight; expected nullptr and ld_dw_up 0, got {} and {}",
                          g.dw_up, g.ld_dw_up));
  for (const Out& o : outs) {
    if (o.rows == 0 && o.ptr == nullptr) continue;
    if (std::string problem = pointer_problem(o.name, o.ptr, o.bytes); !problem.empty()) fail(who, problem);
    if (!is_device_memory(o.ptr)) fail(who, fmt::format("{}: expected device memory (cuMemAlloc/cudaMalloc), got {}", o.name, o.ptr));
    if (o.ld != 0 && (o.ld < o.cols || o.ld > (int64_t{1} << 36)))
      fail(who, fmt::format("{}: expected a row stride in {}..2^36 elements (0 = dense{}), got {}", o.ld_name, o.cols,
                            &o == &outs[3] && dw_down_transposed ? "; dw_down_as_weight: rows of d_ff" : "", o.ld));
  }
  // (run_arguments.h's saturating byte ranges; a null or rowless buffer spans nothing.)
  const auto matrix = [&](const char* name, const void* ptr, int64_t ld, int64_t rows, int64_t row_elements, int bytes) {
    return matrix_range(name, ptr, rows, ld ? ld : row_elements, row_elements, bytes);
  };
  const ByteRange dx_range = matrix("g.dx", g.dx, g.ld_dx, tokens, K, 2);
  const ByteRange dw_gate_range = matrix("g.dw_gate", g.dw_gate, g.ld_dw_gate, N, K, out_bytes),
                  dw_up_range = matrix("g.dw_up", g.dw_up, g.ld_dw_up, f.spec.gated ? N : 0, K, out_bytes),
                  dw_down_range = matrix("g.dw_down", g.dw_down, g.ld_dw_down, dw_down_rows, dw_down_cols, out_bytes);
  // Every output against everything the step reads and every other output, here for both paths (the
  // kernels check again): no output may overlap x, dy, a weight or another output, so a call is refused
  // before any launch and by the same rules whichever path Auto chose (the dense path writes the weight
  // gradients before its dx GEMMs read Wg and Wu).
  const ByteRange reads[] = {matrix("t.x", t.x, t.ld_x, tokens, K, 2), matrix("dy", dy, ld_dy, tokens, K, 2),
                             matrix("t.w_gate", t.w_gate, t.ld_gate, N, K, 2),
                             matrix("t.w_up", t.w_up, t.ld_up, f.spec.gated ? N : 0, K, 2),
                             matrix("t.w_down", t.w_down, t.ld_down, out_in ? K : N, out_in ? N : K, 2)};
  const ByteRange writes[] = {dx_range, dw_gate_range, dw_up_range, dw_down_range};
  for (size_t i = 0; i < std::size(writes); ++i) {
    for (const ByteRange& r : reads)
      if (std::string problem = overlap_problem(writes[i], r); !problem.empty()) fail(who, problem);
    for (size_t j = i + 1; j < std::size(writes); ++j)
      if (std::string problem = overlap_problem(writes[i], writes[j]); !problem.empty()) fail(who, problem);
  }
  // The upstream gradient and the L1 term's arguments (both paths read them).
  if (std::string problem = pointer_problem("dy", dy, 2); !problem.empty()) fail(who, problem);
  if (tokens > 0 && !is_device_memory(dy)) fail(who, fmt::format("dy: expected device memory (cuMemAlloc/cudaMalloc), got {}", dy));
  if (ld_dy != 0 && (ld_dy < K || ld_dy > (int64_t{1} << 36)))
    fail(who, fmt::format("ld_dy: expected a row stride in {}..2^36 elements (0 = dense), got {}", K, ld_dy));
  if (!std::isfinite(lambda) || lambda < 0.0f) fail(who, fmt::format("lambda: expected a finite value >= 0, got {}", lambda));
  if (l1_tokens < 0) fail(who, fmt::format("l1_tokens: expected >= 0 (0: tokens), got {}", l1_tokens));
  if (l1_weight != nullptr) {
    if (std::string problem = pointer_problem("l1_weight", l1_weight, 4); !problem.empty()) fail(who, problem);
    if (!is_device_memory(l1_weight))
      fail(who, fmt::format("l1_weight: expected device memory (cuMemAlloc/cudaMalloc), got {}", static_cast<const void*>(l1_weight)));
  }
  p.run_backward(reinterpret_cast<CUstream>(stream), t, dy, ld_dy, tokens, s, g, lambda, l1_tokens, l1_weight);
}

void FfnTrainingPlan::Impl::run_backward(CUstream cu, const FfnTensors& user_tensors, const void* dy, int64_t ld_dy, int64_t tokens,
                                         FfnTrainingState::Impl& s, const FfnGradients& user_grads, float lambda, int64_t l1_tokens,
                                         const float* l1_weight) {
  constexpr const char* who = "FfnTrainingPlan::backward";
  if (s.path == TrainingPath::Dense) {
    // Consumed from here on, whatever happens next: the backward overwrites g and u once its checks passed
    // (a failure after that must not let a retry read dg and du as g and u).
    dense->backward(cu, user_tensors, dy, ld_dy, tokens, s.dense_g, s.dense_u, user_grads, options.gradients_in_dtype,
                    options.dw_down_as_weight, lambda, l1_tokens, l1_weight, who, s.consumed);
    return;
  }
  Impl& p = *this;
  FfnPlan::Impl& f = *p.forward.impl_;
  const bool out_in = f.spec.down_layout == WeightLayout::OutIn;
  const bool dw_down_transposed = p.options.dw_down_as_weight && out_in;
  // The TwELL part: its neurons' slices of the weights and the weight gradients (all of them without a
  // split), N its neuron count; the dense neurons' part follows it below.
  const int64_t H = p.options.dense_neurons;
  const int out_bytes = p.options.gradients_in_dtype ? 2 : 4;
  const FfnTensors t = H > 0 ? neuron_slice(f.spec, user_tensors, H) : user_tensors;
  const FfnGradients g = H > 0 ? gradient_slice(f.spec, user_grads, H, out_bytes, dw_down_transposed) : user_grads;
  // The dense neurons' tensors and gradients (explicit strides).
  const FfnTensors th = H > 0 ? neuron_slice(f.spec, user_tensors, 0) : FfnTensors{};
  const FfnGradients gh = H > 0 ? gradient_slice(f.spec, user_grads, 0, out_bytes, dw_down_transposed) : FfnGradients{};
  const int64_t K = f.spec.d_model, N = f.sparse_spec.d_ff;
  const detail::Driver& d = detail::Driver::get();
  // The dense neurons' scratch and cuBLASLt algorithms before the first launch (the backward's rule: a
  // refusal leaves every output unwritten and the state unused).
  if (hot)
    hot->prepare_backward(cu, th, dy, ld_dy, tokens, s.dense_g, s.dense_u, gh, options.gradients_in_dtype,
                          options.dw_down_as_weight, who);
  // The forward's overflow count: its copy was enqueued before everything after the forward.
  detail::check(d.cuEventSynchronize(s.event), "FfnTrainingPlan::backward: cuEventSynchronize(forward)");
  const uint32_t overflow = *s.pinned;
  if (overflow > s.capacity) {
    // Some tile-rows were recomputed (exact, slower): later forwards get room for this many and a quarter.
    p.capacity = std::max<uint32_t>(p.capacity, static_cast<uint32_t>(std::min<uint64_t>(
                                                    uint64_t{overflow} + overflow / 4, (uint64_t{1} << 32) - 1)));
  }
  // The gate gave the overflowing tile-rows slots 0..overflow-1 and stored those below its capacity: the
  // kernels see a backup of min(capacity, overflow) rows (every stored slot is below it) and grad rows for
  // exactly the overflow, the missing tile-rows claiming those above the stored ones. Not the capacity: its
  // unused rows would cost 16 bytes per value of scratch and 8 of list for nothing.
  const uint32_t used_backup = std::min(s.capacity, overflow);
  const uint32_t grad_capacity = overflow;
  const TwellLayout& l = f.layout;
  const FfnSpec& ks = p.kernel_spec;
  ensure(p.entry_grad, size_t(entry_grad_floats(l, ks.d_ff, tokens)) * 4, cu, who);
  ensure(p.backup_grad, size_t(backup_grad_floats(l, grad_capacity)) * 4, cu, who);
  ensure(p.workspace, size_t(train_weight_grad_workspace_bytes(ks)), cu, who);
  ensure(p.entry_list, size_t(train_weight_grad_list_bytes(ks, tokens, grad_capacity)), cu, who);
  ensure(p.grad_overflow, 4, cu, who);

  // Wd as the rows of Wd^T: an nn.Linear Wd is transposed into the forward plan's buffer on the stream,
  // unless the buffer still holds this state's forward's transpose of the same Wd (a layer's backward
  // right after its forward: 0.03 ms of the step at the paper shape).
  const void* w_down = t.w_down;
  int64_t ld_down = t.ld_down;
  // (Recorded with the caller's Wd, as the forward was given it.)
  const bool w_down_t_current = p.w_down_t_forward != 0 && p.w_down_t_forward == s.forward_number &&
                                p.w_down_t_source == user_tensors.w_down && p.w_down_t_ld == user_tensors.ld_down;
  if (f.transpose && tokens > 0 && w_down_t_current) {
    w_down = reinterpret_cast<const void*>(f.w_down_t->get());
    ld_down = K;
  } else if (f.transpose && tokens > 0) {
    p.w_down_t_forward = 0;  // replaced: another forward's state finding its number there must not use it
    detail::launch_transpose16(*f.transpose, t.w_down, K, N, t.ld_down ? t.ld_down : N, reinterpret_cast<void*>(f.w_down_t->get()), K,
                               cu, who);
    p.w_down_t_forward = s.forward_number;  // now this state's forward's Wd^T
    p.w_down_t_source = user_tensors.w_down;
    p.w_down_t_ld = user_tensors.ld_down;
    w_down = reinterpret_cast<const void*>(f.w_down_t->get());
    ld_down = K;
  }
  // The kernels' own checks name their fields (t.dx, t.dy, ...): the messages say which call they are in.
  auto named = [&](auto&& call) {
    try {
      call();
    } catch (const Error& e) {
      throw Error(e.code(), fmt::format("{}: {}", who, e.what()));
    }
  };
  TrainRowBackwardTensors r;
  r.x = t.x;
  r.w_gate = t.w_gate;
  r.w_up = t.w_up;
  r.w_down = w_down;
  r.twell = reinterpret_cast<const uint32_t*>(s.twell.get());
  r.backup = reinterpret_cast<const void*>(s.backup.get());
  r.dy = dy;
  r.dx = g.dx;
  r.entry_grad = reinterpret_cast<float*>(p.entry_grad.get());
  r.backup_grad = reinterpret_cast<float*>(p.backup_grad.get());
  r.grad_overflow_count = reinterpret_cast<uint32_t*>(p.grad_overflow.get());
  r.l1_weight = l1_weight;
  r.entry_u = s.has_u ? reinterpret_cast<const float*>(s.twell.get() + words_bytes(l, ks.d_ff, tokens)) : nullptr;
  r.ld_x = t.ld_x;
  r.ld_gate = t.ld_gate;
  r.ld_up = t.ld_up;
  r.ld_down = ld_down;
  r.ld_dy = ld_dy;
  r.ld_dx = g.ld_dx;
  const auto stream = reinterpret_cast<Stream>(cu);
  named([&] { detail::train_row_backward(p.context, stream, ks, r, tokens, used_backup, grad_capacity, lambda, l1_tokens); });

  TrainWeightGradTensors w;
  w.x = t.x;
  w.dy = dy;
  w.twell = r.twell;
  w.entry_grad = r.entry_grad;
  w.backup_grad = r.backup_grad;
  w.dw_gate = g.dw_gate;
  w.dw_up = g.dw_up;
  // Wd^T's rows are read by now (the row backward runs first on the stream): its buffer takes dWd^T.
  w.dw_down = dw_down_transposed ? reinterpret_cast<void*>(f.w_down_t->get()) : g.dw_down;
  if (dw_down_transposed) p.w_down_t_forward = 0;
  w.output_dtype = p.options.gradients_in_dtype;
  w.workspace = reinterpret_cast<void*>(p.workspace.get());
  w.entry_list = reinterpret_cast<void*>(p.entry_list.get());
  w.ld_x = t.ld_x;
  w.ld_dy = ld_dy;
  w.ld_dw_gate = g.ld_dw_gate;
  w.ld_dw_up = g.ld_dw_up;
  w.ld_dw_down = dw_down_transposed ? K : g.ld_dw_down;
  named([&] { detail::train_weight_grad(p.context, stream, ks, w, tokens, grad_capacity); });
  if (dw_down_transposed) {  // dWd^T [N, K] -> dWd [K, N] (16-bit: create() required gradients_in_dtype)
    detail::launch_transpose16(*f.transpose, reinterpret_cast<const void*>(f.w_down_t->get()), N, K, K, g.dw_down,
                               g.ld_dw_down ? g.ld_dw_down : N, cu, who);
  }
  s.consumed = true;  // (enqueued: a call refused inside the kernels' checks left it unused)
  // The dense neurons: dx += their part; their weight gradients' rows (columns of dWd as the weight).
  if (hot)
    hot->backward(cu, th, dy, ld_dy, tokens, s.dense_g, s.dense_u, gh, options.gradients_in_dtype, options.dw_down_as_weight,
                  lambda, l1_tokens, l1_weight, who, s.consumed, /*accumulate_dx=*/true);
}

// TrainingDispatch::Auto's timing (training_plan.h): whole steps of both paths on the call's x and weights
// (its first kCalibrationRows rows), with scratch y, dy, dx and weight gradients and a scratch state, so
// nothing of the caller's is written. Host launch time is part of a step (as in the caller's steps).
TrainingPath FfnTrainingPlan::Impl::calibrate(CUstream cu, const FfnTensors& t, int64_t tokens, TrainingDecision& decision) {
  const FfnSpec& spec = forward.spec();
  const int64_t rows = std::min(tokens, FfnTrainingPlan::kCalibrationRows), K = spec.d_model, N = spec.d_ff;
  const size_t out_bytes = options.gradients_in_dtype ? 2 : 4;
  detail::DeviceBuffer y(size_t(rows) * K * 2), row_l1(size_t(rows) * 4), dy(size_t(rows) * K * 2), dx(size_t(rows) * K * 2),
      dw_gate(size_t(N) * K * out_bytes), dw_up(spec.gated ? size_t(N) * K * out_bytes : 0), dw_down(size_t(N) * K * out_bytes);
  const detail::Driver& d = detail::Driver::get();
  // dy: one small value everywhere (~0.0078 in either type); the kernels' time does not depend on it.
  detail::check(d.cuMemsetD16Async(dy.get(), spec.dtype == DType::BF16 ? 0x3C00 : 0x2000, size_t(rows) * K, cu),
                "FfnTrainingPlan::forward: cuMemsetD16Async(calibration dy)");
  FfnTensors c = t;
  c.y = reinterpret_cast<void*>(y.get());
  c.ld_y = 0;
  check_operand_alignment(*forward.impl_, c, /*gate_only=*/false);  // the whole step reads Wu and Wd too
  const FfnGradients g{reinterpret_cast<void*>(dx.get()), reinterpret_cast<void*>(dw_gate.get()),
                       spec.gated ? reinterpret_cast<void*>(dw_up.get()) : nullptr, reinterpret_cast<void*>(dw_down.get())};
  const std::unique_ptr<FfnTrainingState::Impl> state = new_state();
  struct Events {
    CUevent start = nullptr, stop = nullptr;
    ~Events() {
      if (start) detail::Driver::get().cuEventDestroy(start);
      if (stop) detail::Driver::get().cuEventDestroy(stop);
    }
  } e;
  detail::check(d.cuEventCreate(&e.start, CU_EVENT_DEFAULT), "FfnTrainingPlan::forward: cuEventCreate");
  detail::check(d.cuEventCreate(&e.stop, CU_EVENT_DEFAULT), "FfnTrainingPlan::forward: cuEventCreate");
  // give_up_ms: a path whose first two timed steps both take longer is not timed further (their median is
  // its time): the median of three is then over give_up_ms whatever the third. The TwELL path at a dense
  // phase's density (a model's first steps) runs 10-50x the dense step.
  auto step_ms = [&](TrainingPath path, double give_up_ms, int& steps) {
    std::vector<float> ms;
    for (int rep = 0; rep < 4; ++rep) {  // one warm-up (the first call's compilations, allocations), three timed
      detail::check(d.cuEventRecord(e.start, cu), "FfnTrainingPlan::forward: cuEventRecord");
      run_forward(path, cu, c, rows, *state, reinterpret_cast<float*>(row_l1.get()));
      run_backward(cu, c, reinterpret_cast<const void*>(dy.get()), 0, rows, *state, g, 1.0f, 0, nullptr);
      detail::check(d.cuEventRecord(e.stop, cu), "FfnTrainingPlan::forward: cuEventRecord");
      detail::check(d.cuEventSynchronize(e.stop), "FfnTrainingPlan::forward: cuEventSynchronize");
      float elapsed = 0;
      detail::check(d.cuEventElapsedTime(&elapsed, e.start, e.stop), "FfnTrainingPlan::forward: cuEventElapsedTime");
      if (rep > 0) ms.push_back(elapsed);
      steps = int(ms.size());
      if (rep == 2 && std::min(ms[0], ms[1]) > give_up_ms) return (double{ms[0]} + ms[1]) / 2;
    }
    std::sort(ms.begin(), ms.end());
    return double{ms[1]};
  };
  // The dense path first (its time does not depend on the density), then the TwELL path, given up after two
  // steps over twice the dense time (the decision is then the full timing's: Dense).
  decision.dense_ms = step_ms(TrainingPath::Dense, std::numeric_limits<double>::infinity(), decision.dense_steps);
  decision.sparse_ms = step_ms(TrainingPath::Sparse, 2 * decision.dense_ms, decision.sparse_steps);
  decision.path = decision.dense_ms < decision.sparse_ms ? TrainingPath::Dense : TrainingPath::Sparse;
  return decision.path;
}

}  // namespace twell
