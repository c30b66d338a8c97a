// FfnPlan's launch sequences, all on the caller's stream with no host synchronization:
//   memset(overflow counter) -> [transpose Wd] -> gate_twell (D2T) -> gated_down
//   or, for a call of at most decode_max_tokens rows: decode_gate[_small] -> decode_up -> decode_down
//   or, for a call of at most decode_fused_max_tokens rows where it was made: decode_fused alone
// The dense neurons (PlanOptions::dense_neurons) are added by plan_dispatch.cpp after these.
#include <fmt/format.h>

#include "launcher.h"
#include "plan_impl.h"
#include "tma_map.h"
#include "twell/device/params.h"
#include "twell/error.h"

namespace twell {

namespace {
// The decode kernels (decode.cuh) on `tokens` <= decode_max_tokens rows. The overflow counter is
// zeroed before (not for decode_fused), as for the D2T. `fused`: the call takes decode_fused (no TwELL
// matrix then; launch_twell decides it). Else up to 8 rows: decode_gate_small (no ring); else
// decode_gate, whose ring is sized by the rows it holds (16 or 64; launch.h).
void launch_decode(FfnPlan::Impl& p, device::GateParams& gate, device::GatedDownParams& down, int64_t tokens, bool fused,
                   CUstream cu) {
  device::DecodeBuffers buffers{};
  buffers.act = reinterpret_cast<uint16_t*>(p.decode_act->get());
  buffers.tile_arrivals = reinterpret_cast<uint32_t*>(p.decode_arrivals->get());
  buffers.entries = reinterpret_cast<uint32_t*>(p.decode_entries->get());
  buffers.act_ld = p.decode_act_ld;
  buffers.w_up = down.w_up;
  buffers.w_down = down.w_down;
  buffers.ldwu = down.ldwu;
  buffers.ldwd = down.ldwd;
  const kernels::LaunchShape shape{tokens, 0, 0};
  void* gate_args[2] = {&gate, &buffers};
  void* down_args[2] = {&down, &buffers};
  if (fused) {  // one kernel; it writes no TwELL matrix
    device::DecodeFusedBuffers fused{reinterpret_cast<unsigned long long*>(p.fused_pairs->get()),
                                     reinterpret_cast<uint32_t*>(p.fused_counts->get()),
                                     reinterpret_cast<unsigned long long*>(p.fused_arrivals->get())};
    void* args[2] = {&down, &fused};
    detail::launch(*p.decode_fused, shape, args, cu, "FfnPlan::run");
    return;
  }
  const LoadedKernel& first = tokens <= p.decode_gate_small->source.cta_m ? *p.decode_gate_small : *p.decode_gate;
  detail::launch(first, shape, gate_args, cu, "FfnPlan::run");
  detail::launch(*p.decode_up, shape, down_args, cu, "FfnPlan::run");
  detail::launch(*p.decode_down, shape, down_args, cu, "FfnPlan::run");
}
}  // namespace

void FfnPlan::launch(Stream stream, const FfnTensors& user_tensors, int64_t tokens, Stages stages) {
  const bool gate_only = stages == Stages::GateOnly;
  const bool consumer_only = stages == Stages::ConsumerOnly;
  const char* who = gate_only ? "FfnPlan::run_gate" : consumer_only ? "FfnPlan::run_consumer" : "FfnPlan::run";
  Impl& p = checked_plan(impl_, gate_only ? "run_gate" : "run");
  if (!p.context->gpu)
    throw Error(ErrorCode::NoDevice, fmt::format("{}: this plan was made without a GPU ({})", who, p.context->no_gpu_reason));
  p.context->make_current();
  check_run_arguments(who, p.spec, user_tensors, tokens, p.max_tokens, gate_only ? RunOperands::Gate : RunOperands::All);
  // From here on the TwELL part: its neurons' slices of the weights, its spec.
  // (The slices start 128-byte multiples past the user's pointers: the same alignment, so the
  // user's pointers are checked, and named in the errors.)
  check_operand_alignment(p, user_tensors, gate_only);
  // The dense neurons' part (run() adds it after these kernels): what can fail there (its arguments,
  // cuBLASLt's algorithms for its operands) fails now, before y is written.
  if (stages == Stages::All && p.hot && tokens > 0) p.hot->prepare(neuron_slice(p.spec, user_tensors, 0), tokens);
  const FfnTensors t = p.dense_neurons > 0 ? neuron_slice(p.spec, user_tensors, p.dense_neurons) : user_tensors;
  auto cu = reinterpret_cast<CUstream>(stream);
  if (p.wanted_capacity > p.backup_capacity && !consumer_only) {
    // last_overflow() synchronized the stream after the run that filled the old backup, and calls on
    // a plan are ordered, so no kernel still reads it.
    p.allocate_backup(p.wanted_capacity);
  }
  if (!consumer_only) p.matrix_capacity = p.backup_capacity;
  p.last_tokens = tokens;
  // Set before the launches, so that a fused call that throws leaves "decode": last_overflow() then does
  // not read the counter whose memset that call skipped, and download_twell() / run_consumer() refuse.
  const bool allow_decode = stages == Stages::All;
  p.last_path = allow_decode && !p.use_block && takes_fused_decode(p, tokens) ? "decode" : "twell";
  const TwellBuffers matrix{reinterpret_cast<uint32_t*>(p.twell->get()), reinterpret_cast<uint16_t*>(p.backup->get()),
                            p.counter->get(), p.backup_capacity, nullptr};
  const LaunchStages ls = gate_only ? LaunchStages::GateOnly : consumer_only ? LaunchStages::ConsumerOnly : LaunchStages::All;
  launch_twell(p, t, tokens, ls, matrix, allow_decode, cu, who);
}

void launch_twell(FfnPlan::Impl& p, const FfnTensors& t, int64_t tokens, LaunchStages stages, const TwellBuffers& m,
                  bool allow_decode, CUstream cu, const char* who) {
  const bool gate_only = stages == LaunchStages::GateOnly;
  const bool consumer_only = stages == LaunchStages::ConsumerOnly;
  const detail::Driver& d = detail::Driver::get();
  const FfnSpec& s = p.sparse_spec;
  const bool in_out = s.down_layout == WeightLayout::InOut;
  auto u16 = [](const void* ptr) { return static_cast<const uint16_t*>(ptr); };
  // The failure messages format `who` only when a call fails (per-call host time matters at decode).
  auto check = [&](CUresult r, const char* what) {
    if (r != CUDA_SUCCESS) [[unlikely]]
      detail::throw_cuda_error(r, fmt::format("{}: {}", who, what).c_str());
  };
  const bool decode = allow_decode && !p.use_block && p.decode_gate && tokens > 0 && tokens <= p.decode_max_tokens;
  // The fused decode kernel makes no TwELL matrix and counts no overflow (last_overflow() reports none
  // after it without reading the counter): its calls skip the memset, a graph node of ~1.7 us (v64).
  const bool fused = decode && takes_fused_decode(p, tokens);
  if (!consumer_only && !fused) check(d.cuMemsetD32Async(m.counter, 0, 1, cu), "cuMemsetD32Async(overflow counter)");
  if (tokens == 0) return;

  device::GateParams gate{};
  gate.x = u16(t.x);
  gate.w_gate = u16(t.w_gate);
  gate.twell = m.twell;
  gate.backup = m.backup;
  gate.overflow_count = reinterpret_cast<uint32_t*>(m.counter);
  gate.m = tokens;
  gate.ldx = t.ld_x ? t.ld_x : s.d_model;
  gate.ldw = t.ld_gate ? t.ld_gate : s.d_model;
  gate.backup_capacity = m.backup_capacity;

  device::GatedDownParams down{};
  down.x = gate.x;
  down.w_gate = gate.w_gate;
  down.w_up = u16(t.w_up);
  down.w_down = u16(t.w_down);
  down.twell = gate.twell;
  down.backup = gate.backup;
  down.y = static_cast<uint16_t*>(t.y);
  down.row_counter = reinterpret_cast<uint32_t*>(m.counter + 4);
  down.m = tokens;
  down.ldx = gate.ldx;
  down.ldwg = gate.ldw;
  down.ldwu = t.ld_up ? t.ld_up : s.d_model;
  down.ldwd = t.ld_down ? t.ld_down : (in_out ? s.d_model : s.d_ff);
  down.ldy = t.ld_y ? t.ld_y : s.d_model;
  down.backup_capacity = m.backup_capacity;
  down.row_l1 = m.row_l1;
  down.entry_u_after_words = m.entry_u_after_words ? 1u : 0u;
  if (decode) {
    launch_decode(p, gate, down, tokens, fused, cu);  // reads w_down as given: no transpose
    return;
  }
  if (p.transpose && !gate_only) {
    detail::launch_transpose16(*p.transpose, t.w_down, s.d_model, s.d_ff, down.ldwd, reinterpret_cast<void*>(p.w_down_t->get()),
                               s.d_model, cu, who);
    down.w_down = reinterpret_cast<const uint16_t*>(p.w_down_t->get());
    down.ldwd = s.d_model;
  }
  if (!consumer_only) {
    const kernels::KernelSource& src = p.gate->source;
    if (src.tma_persistent) {
      detail::encode_tma_map(gate.x_map, s.dtype, gate.x, tokens, s.d_model, gate.ldx, src.cta_m, src.cta_k,
                             "cuTensorMapEncodeTiled(x)");
      // A cluster's CTAs each load tile_n / cluster_m rows of the w_gate tile and multicast them.
      detail::encode_tma_map(gate.w_map, s.dtype, gate.w_gate, s.d_ff, s.d_model, gate.ldw, p.layout.tile_n / src.cluster_m, src.cta_k,
                             "cuTensorMapEncodeTiled(w_gate)");
    }
    void* args[1] = {&gate};
    detail::launch(*p.gate, kernels::LaunchShape{tokens, 0, 0}, args, cu, who);
  }
  if (!gate_only) {
    // The token-block consumer in place of the row consumer when run() chose it.
    const LoadedKernel& k = p.use_block ? *p.block_consumer : *p.consumer;
    if (k.source.persistent)  // the warps claim rows from 0
      check(d.cuMemsetD32Async(m.counter + 4, 0, 1, cu), "cuMemsetD32Async(row counter)");
    void* args[1] = {&down};
    detail::launch(k, kernels::LaunchShape{tokens, 0, 0}, args, cu, who);
  }
}

}  // namespace twell
