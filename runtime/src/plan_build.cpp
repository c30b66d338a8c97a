// Context::plan: the spec's checks, its kernels (from a bundle or the JIT: kernel_loading.cpp) and the
// plan's device workspace.
#include <algorithm>

#include <fmt/format.h>

#include "driver.h"
#include "plan_impl.h"
#include "tuned_layout.h"
#include "twell/error.h"
#include "twell/kernels/constraints.h"
#include "twell/kernels/validate.h"
#include "twell/tuning.h"

namespace twell {

namespace {

void check_spec(const FfnSpec& s, int64_t max_tokens, const PlanOptions& options) {
  auto bad = [](const std::string& m) { throw Error(ErrorCode::InvalidArgument, m); };
  if (const std::string wrong = kernels::validate_spec(s, "FfnSpec::"); !wrong.empty()) bad(wrong);
  if (s.d_model <= 0 || s.d_model > 65536) bad(fmt::format("FfnSpec::d_model: expected 1..65536, got {}", s.d_model));
  if (s.d_ff <= 0 || s.d_ff > (int64_t{1} << 24)) bad(fmt::format("FfnSpec::d_ff: expected 1..16777216, got {}", s.d_ff));
  if (max_tokens < 1 || max_tokens > (int64_t{1} << 31) - 1)
    bad(fmt::format("max_tokens: expected 1..2147483647 (one CTA row per token in the grid), got {}", max_tokens));
  const int64_t k = options.dense_neurons;
  if (k < 0 || k % 64 != 0 || k >= s.d_ff)
    bad(fmt::format("PlanOptions::dense_neurons: expected a multiple of 64 in 0..{} (below d_ff = {}: at least one neuron "
                    "stays on TwELL), got {}", (s.d_ff - 1) / 64 * 64, s.d_ff, k));
  if (options.decode_fused_max_tokens < 0 || options.decode_fused_max_tokens > kernels::DecodeKernelConstraints::kFusedMaxTokens)
    bad(fmt::format("PlanOptions::decode_fused_max_tokens: expected 0..{} (0: not the fused decode kernel), got {}",
                    kernels::DecodeKernelConstraints::kFusedMaxTokens, options.decode_fused_max_tokens));
  if (options.decode_max_tokens < 0 || options.decode_max_tokens > kernels::DecodeKernelConstraints::kMaxTokens)
    bad(fmt::format("PlanOptions::decode_max_tokens: expected 0..{} (0: no decode kernels), got {}",
                    kernels::DecodeKernelConstraints::kMaxTokens, options.decode_max_tokens));
}

// Limits that depend on the generated layout.
void check_tiles(const TwellLayout& layout, int64_t d_ff, int64_t max_tokens) {
  auto bad = [](const std::string& m) { throw Error(ErrorCode::InvalidArgument, m); };
  const int64_t tiles = layout.tiles(d_ff);
  // The non-persistent gate kernels put the d_ff tiles on grid.y (at most 65535).
  if (tiles > 65535)
    bad(fmt::format("FfnSpec::d_ff: expected at most 65535 tiles of tile_n = {} (d_ff <= {}), got d_ff {} ({} tiles)",
                    layout.tile_n, int64_t{65535} * layout.tile_n, d_ff, tiles));
  // The gate kernels count overflowing tile-rows in one uint32: it must not wrap.
  if (max_tokens * tiles >= (int64_t{1} << 32))
    bad(fmt::format("max_tokens: expected max_tokens * d_ff tiles < 2^32 (the overflow counter is 32-bit), got {} * {}",
                    max_tokens, tiles));
}

}  // namespace

namespace {
// PlanOptions::tuning's candidates: this GPU's database entry (without a GPU there is no hardware key),
// and the entries the loaded bundles embed.
detail::TunedLayout plan_tuning(Context& context, const FfnSpec& spec, int64_t max_tokens, const PlanOptions& options) {
  std::optional<detail::TuningCandidate> database, embedded;
  if (options.tuning == PlanOptions::Tuning::Use && !detail::sets_tuned_fields(spec)) {
    if (context.has_gpu()) {
      const TuningDatabase db{std::filesystem::path(options.tuning_dir)};
      if (auto entry = db.lookup(tuning_hardware(context), spec, options.tuning_workload))
        database =
            detail::TuningCandidate{"database " + entry->file.string(), entry->workload, std::move(entry->buckets)};
    }
    embedded = detail::embedded_tuning(context_impl(context)->loaded_bundles(), spec, context.target().arch(),
                                       options.tuning_workload);
  }
  return detail::tuned_layout(spec, max_tokens, options.dispatch, database, embedded);
}
}  // namespace

FfnPlan Context::plan(const FfnSpec& user_spec, int64_t max_tokens, const PlanOptions& options) {
  return plan(user_spec, max_tokens, options, PlanUse::Inference);
}

FfnPlan Context::plan(const FfnSpec& user_spec, int64_t max_tokens, const PlanOptions& options, PlanUse use) {
  check_spec(user_spec, max_tokens, options);
  // Canonical (threshold -0.0 as +0.0) before any key is made from it: one layer, one kernel set.
  const FfnSpec canonical = kernels::canonical_spec(user_spec);
  const detail::TunedLayout tuned = plan_tuning(*this, canonical, max_tokens, options);
  if (!tuned.tuned) return make_plan(canonical, max_tokens, options, tuned.source, use);
  // A tuned layout this context cannot build (a bundle-only deployment without those kernels, a
  // workspace that does not fit, a layout the generator refuses here) is ignored, not an error.
  try {
    return make_plan(tuned.spec, max_tokens, options, tuned.source, use);
  } catch (const Error& e) {
    return make_plan(canonical, max_tokens, options,
                     fmt::format("heuristic (the tuned layout of {} could not be used: {})", tuned.source,
                                 std::string(e.what()).substr(0, 300)),
                     use);
  }
}

FfnPlan Context::make_plan(const FfnSpec& spec, int64_t max_tokens, const PlanOptions& options, std::string config_source,
                           PlanUse use) {
  const std::shared_ptr<Context::Impl> ctx = context_impl(*this);  // throws for a moved-from context
  FfnPlan plan;
  plan.impl_ = std::make_unique<FfnPlan::Impl>();
  FfnPlan::Impl& p = *plan.impl_;
  p.context = ctx;
  p.spec = spec;
  p.config_source = std::move(config_source);
  p.dense_neurons = options.dense_neurons;
  p.sparse_spec = spec;
  p.sparse_spec.d_ff = spec.d_ff - options.dense_neurons;
  p.max_tokens = max_tokens;
  p.target = ctx->target;
  const bool transpose_down = spec.down_layout == WeightLayout::OutIn;
  FfnSpec kernel_spec = p.sparse_spec;
  kernel_spec.down_layout = WeightLayout::InOut;  // what the consumer reads after normalization
  // The decode kernels read Wd in the user's layout (at a few rows cheaper than a transposed copy); a plan
  // that never decodes (decode_max_tokens 0: the training forward's, say) does not compile them.
  const std::optional<WeightLayout> decode_layout =
      options.decode_max_tokens > 0 ? std::optional<WeightLayout>(spec.down_layout) : std::nullopt;
  FfnKernels generated = ctx->ffn_kernels(kernel_spec, decode_layout, "Context::plan");
  p.layout = generated.layout;
  check_tiles(p.layout, p.sparse_spec.d_ff, max_tokens);
  p.ir = (transpose_down ? std::string("// FfnPlan: w_down (out_in, nn.Linear) is transposed on the stream to in_out "
                                       "before the consumer.\n")
                         : std::string()) +
         (p.dense_neurons > 0 ? fmt::format("// FfnPlan: neurons 0..{} run dense (cuBLASLt, y +=); the kernels below take "
                                            "neurons {}..{} (d_ff {}).\n", p.dense_neurons - 1, p.dense_neurons, spec.d_ff - 1,
                                            p.sparse_spec.d_ff)
                              : std::string()) +
         generated.ir;
  if (transpose_down) {
    KernelReport report;
    p.transpose = ctx->auxiliary(kernels::KernelKind::WeightTranspose, spec, "Context::plan", &report);
    p.reports.push_back(std::move(report));
  }
  if (generated.kernels.size() != 2 || generated.kernels[0]->source.kind != kernels::KernelKind::GateTwell ||
      generated.kernels[1]->source.kind != kernels::KernelKind::GatedDown)
    throw Error(ErrorCode::Parse, fmt::format("Context::plan: expected a gate kernel and a consumer kernel for this spec, "
                                              "got {} kernels", generated.kernels.size()));
  p.gate = generated.kernels[0];
  p.consumer = generated.kernels[1];
  p.reports.push_back(p.gate->report);
  p.reports.push_back(p.consumer->report);
  if (!spec.consumer && spec.gated) {  // the token block is a gated kernel
    kernel_spec.consumer = ConsumerVariant::TokenBlock;
    FfnKernels block = ctx->ffn_kernels(kernel_spec, std::nullopt, "Context::plan");
    for (const auto& k : block.kernels)
      if (k->source.consumer == kernels::ConsumerKind::TokenBlock) {  // else the shape fell back to rows
        p.block_consumer = k;
        p.reports.push_back(k->report);
      }
  }
  if (options.decode_max_tokens > 0 && generated.decode.size() == 5) {
    p.decode_gate = generated.decode[0];
    p.decode_up = generated.decode[1];
    p.decode_down = generated.decode[2];
    p.decode_gate_small = generated.decode[3];
    for (const auto* k : {&p.decode_gate, &p.decode_up, &p.decode_down, &p.decode_gate_small}) p.reports.push_back((*k)->report);
    // The fused kernel where its shared memory holds x and the staging of ceil(d_ff / SMs) rows (on a
    // GPU; a plan without one keeps the kernel for bundles only).
    using D = kernels::DecodeKernelConstraints;
    // On a GPU, at most the tokens whose x tiles fit its shared memory (32 rows, else 16 or 8 where only those fit).
    const int64_t fused_fits = ctx->gpu ? D::fusedMaxTokens(spec.d_model, p.sparse_spec.d_ff, ctx->sm_count, ctx->target.sm)
                                        : D::kFusedMaxTokens;
    if (options.decode_fused_max_tokens > 0 && fused_fits > 0) {
      p.decode_fused = generated.decode[4];
      p.decode_fused_max_tokens = std::min(options.decode_fused_max_tokens, fused_fits);
      p.reports.push_back(p.decode_fused->report);
    }
    p.decode_max_tokens = options.decode_max_tokens;
    if (p.decode_fused)
      p.ir = fmt::format("// FfnPlan: run() calls of at most {} tokens take {} (decode_fused.cuh).\n",
                         std::min(p.decode_fused_max_tokens, p.decode_max_tokens), p.decode_fused->source.name) + p.ir;
    p.ir = fmt::format("// FfnPlan: run() calls of at most {} tokens take the decode kernels {}, {}, {} and {} "
                       "(decode.cuh: the same arithmetic as the kernels below, spread over the GPU for a few rows).\n",
                       p.decode_max_tokens, p.decode_gate->source.name, p.decode_gate_small->source.name,
                       p.decode_up->source.name, p.decode_down->source.name) +
           p.ir;
  }
  p.dispatch = options.dispatch;
  // The dense path's kernels are obtained here, GPU or not, so that a bundle made from this plan
  // (Context::save_bundle) holds them.
  FfnSpec hot_spec = spec;
  hot_spec.d_ff = p.dense_neurons;
  // With a GPU the DenseFfn objects below obtain (and record) them; without, nothing else would.
  if (!ctx->gpu && p.dispatch != Dispatch::Sparse) detail::dense_kernels(*ctx, spec, DenseKernels::FusedGatedUp);
  const bool hot_part = p.dense_neurons > 0 && p.dispatch != Dispatch::Dense && use == PlanUse::Inference;
  if (!ctx->gpu && hot_part) detail::dense_kernels(*ctx, hot_spec, DenseKernels::FusedGatedUp);
  if (ctx->gpu) {
    ctx->make_current();
    const int64_t sparse_d_ff = p.sparse_spec.d_ff;
    p.twell = std::make_unique<detail::DeviceBuffer>(size_t(max_tokens) * p.layout.words_per_row(sparse_d_ff) * 4);
    if (p.decode_gate) {
      const int64_t rows = std::min(max_tokens, p.decode_max_tokens);
      p.decode_act_ld = (sparse_d_ff + 7) / 8 * 8;
      p.decode_act = std::make_unique<detail::DeviceBuffer>(size_t(rows * p.decode_act_ld) * 2);
      p.decode_entries = std::make_unique<detail::DeviceBuffer>(size_t(rows * sparse_d_ff) * 8);
      const int64_t tiles = p.layout.tiles(sparse_d_ff);
      p.decode_arrivals = std::make_unique<detail::DeviceBuffer>(size_t(tiles) * 4);
      // The arrival counters start at 0; each decode_gate launch leaves them at 0. The entry lists are
      // cleared once too: decode_down reads 32 slots ahead of the count (the values past it unused).
      const detail::Driver& d = detail::Driver::get();
      detail::check(d.cuMemsetD8(p.decode_arrivals->get(), 0, size_t(tiles) * 4), "Context::plan: cuMemsetD8(decode tile arrivals)");
      detail::check(d.cuMemsetD8(p.decode_entries->get(), 0, size_t(rows * sparse_d_ff) * 8), "Context::plan: cuMemsetD8(decode entries)");
      // So are the TwELL matrix's first `rows` rows, the ones decode calls write: decode_up reads a
      // tile-row's unused slots with its used ones (never their values).
      detail::check(d.cuMemsetD8(p.twell->get(), 0, size_t(rows * p.layout.words_per_row(sparse_d_ff)) * 4),
                    "Context::plan: cuMemsetD8(TwELL matrix rows of decode calls)");
    }
    if (p.decode_fused) {  // device::DecodeFusedBuffers: every call writes the counts and pairs it reads
      const int64_t ctas = kernels::DecodeKernelConstraints::fusedCtas(ctx->sm_count);
      namespace sm = device::shared_memory;
      p.fused_pairs = std::make_unique<detail::DeviceBuffer>(size_t(sm::decode_fused_pair_slots(sparse_d_ff, ctas)) * 8);
      p.fused_counts = std::make_unique<detail::DeviceBuffer>(size_t(sm::decode_fused_segments(ctas)) * 4);
      p.fused_arrivals = std::make_unique<detail::DeviceBuffer>(16);  // arrivals, publications
      detail::check(detail::Driver::get().cuMemsetD8(p.fused_arrivals->get(), 0, 16), "Context::plan: cuMemsetD8(decode_fused arrivals)");
    }
    // cuMemsetD8 runs on the legacy stream, asynchronously: the plan's first call, on any stream (a
    // non-blocking one does not wait for the legacy stream), must find the zeros in place.
    if (p.decode_gate || p.decode_fused)
      detail::check(detail::Driver::get().cuStreamSynchronize(nullptr), "Context::plan: cuStreamSynchronize(decode buffers' memsets)");
    p.counter = std::make_unique<detail::DeviceBuffer>(8);  // the overflow count, the consumer's row counter
    if (transpose_down) p.w_down_t = std::make_unique<detail::DeviceBuffer>(size_t(sparse_d_ff) * spec.d_model * 2);
    const int64_t tile_rows = max_tokens * p.layout.tiles(sparse_d_ff);
    // The dense path and the dense neurons: cuBLASLt, with the fused gated-up kernel where it applies.
    if (p.dispatch != Dispatch::Sparse) p.dense = std::make_unique<DenseFfn>(*this, spec, max_tokens, DenseKernels::FusedGatedUp);
    if (hot_part)
      p.hot = std::make_unique<DenseFfn>(*this, hot_spec, max_tokens, DenseKernels::FusedGatedUp);
    p.allocate_backup(options.backup_capacity.value_or(
        static_cast<uint32_t>(std::clamp<int64_t>(tile_rows / 16, 256, int64_t{1} << 24))));
  }
  return plan;
}

}  // namespace twell
