// FfnPlan::run: which path a call takes (Dispatch, and Dispatch::Auto's per-bucket calibration), and
// run_gate / run_consumer.
#include <bit>

#include <fmt/format.h>

#include "l2_eviction.h"
#include "plan_impl.h"
#include "twell/error.h"

namespace twell {

FfnTensors neuron_slice(const FfnSpec& s, const FfnTensors& t, int64_t first) {
  FfnTensors c = t;
  // A null pointer stays null, for the argument checks to name.
  auto at = [](const void* p, int64_t elements) { return p ? static_cast<const uint16_t*>(p) + elements : nullptr; };
  c.ld_gate = t.ld_gate ? t.ld_gate : s.d_model;
  c.w_gate = at(t.w_gate, first * c.ld_gate);
  if (t.w_up != nullptr) {
    c.ld_up = t.ld_up ? t.ld_up : s.d_model;
    c.w_up = at(t.w_up, first * c.ld_up);
  }
  if (s.down_layout == WeightLayout::InOut) {
    c.ld_down = t.ld_down ? t.ld_down : s.d_model;
    c.w_down = at(t.w_down, first * c.ld_down);
  } else {
    c.ld_down = t.ld_down ? t.ld_down : s.d_ff;
    c.w_down = at(t.w_down, first);
  }
  return c;
}

void FfnPlan::run(Stream stream, const FfnTensors& t, int64_t tokens, uint64_t decision_key) {
  Impl& p = checked_plan(impl_, "run");
  using Path = Impl::Path;
  p.use_block = false;
  if (p.dispatch == Dispatch::Dense && tokens > 0 && p.context->gpu) {
    p.dense->run(stream, t, tokens);
    p.last_path = "dense";
    return;
  }
  // The TwELL path: the kernels over the TwELL neurons, then the dense neurons added onto y.
  auto run_twell = [&] {
    launch(stream, t, tokens, Stages::All);  // prepares the dense neurons' part before its first launch
    if (p.hot && tokens > 0) p.hot->run(stream, neuron_slice(p.spec, t, 0), tokens, /*accumulate=*/true);
  };
  std::vector<Path> candidates{Path::Rows};
  // Only Auto chooses among consumers (the variants round h differently: Sparse stays reproducible).
  if (p.dispatch == Dispatch::Auto && p.block_consumer && tokens > 0 && p.context->gpu &&
      block_operands_aligned(p.sparse_spec, neuron_slice(p.spec, t, p.dense_neurons)))
    candidates.push_back(Path::Block);
  if (p.dispatch == Dispatch::Auto && tokens > 0 && p.context->gpu) candidates.push_back(Path::Dense);
  Path path = Path::Rows;
  if (candidates.size() > 1) {
    // Per power-of-two bucket, and apart for calls the decode kernels or the fused one take (the two
    // cut-offs need not be powers of two): one decision never covers two different TwELL paths.
    const bool decode = p.decode_gate && tokens <= p.decode_max_tokens;
    const bool fused = takes_fused_decode(p, tokens);
    const int bucket = 3 * std::bit_width(static_cast<uint64_t>(tokens - 1)) + (fused ? 2 : decode ? 1 : 0);
    const std::pair<uint64_t, int> key{decision_key, bucket};
    auto it = p.bucket_path.find(key);
    if (it == p.bucket_path.end()) {
      // Calibrate on these inputs: median of 3 timed calls of each path after one warm-up, each call
      // after L2 was filled with other data (l2_eviction.h, untimed). A layer of a model meets its weights
      // in DRAM: the other layers' weights went through L2 since its last call. Timed back to back
      // instead, the weights (69 MB at the paper's shape against the H200's 60 MB L2) stay partly in L2,
      // and at 16 tokens the fused decode kernel tied with dense there while it was 1.25x slower from DRAM
      // (bench/README.md v71). Without memory or cuBLASLt for the eviction, the calls are timed back to back.
      detail::L2Eviction* eviction = detail::context_l2_eviction(*p.context, reinterpret_cast<CUstream>(stream));
      const auto evict_l2 = [&] {
        if (eviction == nullptr) return;
        try {
          eviction->enqueue(reinterpret_cast<CUstream>(stream));
        } catch (const Error&) {
          eviction = nullptr;  // the rest of this calibration back to back
        }
      };
      double best = 0;
      Path fastest = Path::Rows;
      for (Path c : candidates) {
        p.use_block = c == Path::Block;
        const auto ms = c == Path::Dense ? time_on_stream(stream, [&] { p.dense->run(stream, t, tokens); }, 1, 3, evict_l2)
                                         : time_on_stream(stream, run_twell, 1, 3, evict_l2);
        if (c == Path::Rows || ms[1] < best) {
          best = ms[1];
          fastest = c;
        }
      }
      it = p.bucket_path.emplace(key, fastest).first;
    }
    path = it->second;
    // A bucket calibrated with aligned operands may now see unaligned ones: the row consumer takes any.
    if (path == Path::Block && candidates[1] != Path::Block) path = Path::Rows;
  }
  if (path == Path::Dense) {
    p.dense->run(stream, t, tokens);
    p.last_path = "dense";
    return;
  }
  p.use_block = path == Path::Block;
  run_twell();
}

std::string FfnPlan::last_path() const { return checked_plan(impl_, "last_path").last_path; }

std::string FfnPlan::config_source() const { return checked_plan(impl_, "config_source").config_source; }

void FfnPlan::recalibrate() { checked_plan(impl_, "recalibrate").bucket_path.clear(); }

void FfnPlan::run_gate(Stream stream, const FfnTensors& t, int64_t tokens) { launch(stream, t, tokens, Stages::GateOnly); }

void FfnPlan::run_consumer(Stream stream, const FfnTensors& t, int64_t tokens) {
  Impl& p = checked_plan(impl_, "run_consumer");
  if (p.last_path != "twell")
    throw Error(ErrorCode::InvalidArgument, "FfnPlan::run_consumer: the plan holds no TwELL matrix (run_gate(), a sparse run() "
                                            "or upload_twell() first)");
  if (tokens != p.last_tokens)
    throw Error(ErrorCode::InvalidArgument, fmt::format("FfnPlan::run_consumer: tokens: expected {} (the rows of the plan's TwELL "
                                                        "matrix), got {}", p.last_tokens, tokens));
  launch(stream, t, tokens, Stages::ConsumerOnly);
}

}  // namespace twell
