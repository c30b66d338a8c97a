// FfnPlan: generated + compiled kernels of one gated FFN, its workspace, and the launch sequence
//   memset(overflow counter) -> gate_twell (D2T) -> gated_down [-> dense neurons, y += (cuBLASLt)]
// all on the caller's stream, with no host synchronization.
#include <algorithm>
#include <bit>
#include <map>

#include <fmt/format.h>

#include "context_impl.h"
#include "twell/Dialect/KernelConstraints.h"
#include "twell/dense.h"
#include "twell/device/params.h"
#include "twell/device_memory.h"
#include "twell/error.h"
#include "twell/reference.h"
#include "tma_map.h"

namespace twell {

struct FfnPlan::Impl {
  std::shared_ptr<Context::Impl> context;
  FfnSpec spec;         // as the user gave it: what run() checks the tensors against
  // The TwELL part: spec with d_ff - dense_neurons neurons (all of them without a split). The kernels,
  // the TwELL matrix and the transposed Wd cover these neurons only.
  FfnSpec sparse_spec;
  int64_t dense_neurons = 0;
  std::unique_ptr<DenseFfn> hot;  // the first dense_neurons neurons (PlanOptions::dense_neurons), y +=
  TwellLayout layout;
  Target target;
  int64_t max_tokens = 0;
  std::string ir;
  std::vector<std::shared_ptr<LoadedKernel>> kernels;
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
  std::unique_ptr<DenseFfn> dense;          // with Dispatch::Auto or Dense
  // The token-block consumer, when spec.consumer is unset and the shape allows it: run() times it
  // against the row consumer (kernels) per token bucket.
  std::shared_ptr<LoadedKernel> block_consumer;
  enum class Path { Rows, Block, Dense };
  std::map<int, Path> bucket_path;          // per bucket 2 bit_width(tokens - 1) + decode, after calibration
  // The decode kernels (PlanOptions::decode_max_tokens; null when off or not made for this shape),
  // generated for the user's down layout, and their workspace (device::DecodeBuffers).
  std::shared_ptr<LoadedKernel> decode_gate, decode_up, decode_down, decode_gate_small;
  int64_t decode_max_tokens = 0;
  int64_t decode_act_ld = 0;
  std::unique_ptr<detail::DeviceBuffer> decode_act, decode_arrivals, decode_entries;
  bool use_block = false;                   // the consumer the next launch() runs
  std::string last_path;

  void allocate_backup(uint32_t capacity) {
    backup_capacity = capacity;
    backup = std::make_unique<detail::DeviceBuffer>(std::max<size_t>(1, size_t(capacity) * layout.tile_n * 2));
  }
};

namespace {

void check_spec(const FfnSpec& s, int64_t max_tokens, const PlanOptions& options) {
  auto bad = [](const std::string& m) { throw Error(ErrorCode::InvalidArgument, m); };
  if (s.d_model <= 0 || s.d_model > 65536) bad(fmt::format("FfnSpec::d_model: expected 1..65536, got {}", s.d_model));
  if (s.d_ff <= 0 || s.d_ff > (int64_t{1} << 24)) bad(fmt::format("FfnSpec::d_ff: expected 1..16777216, got {}", s.d_ff));
  if (max_tokens < 1 || max_tokens > (int64_t{1} << 31) - 1)
    bad(fmt::format("max_tokens: expected 1..2147483647 (one CTA row per token in the grid), got {}", max_tokens));
  const int64_t k = options.dense_neurons;
  if (k < 0 || k % 64 != 0 || k >= s.d_ff)
    bad(fmt::format("PlanOptions::dense_neurons: expected a multiple of 64 in 0..{} (below d_ff = {}: at least one neuron "
                    "stays on TwELL), got {}", (s.d_ff - 1) / 64 * 64, s.d_ff, k));
  if (options.decode_max_tokens < 0 || options.decode_max_tokens > mlir::twell::DecodeKernelConstraints::kMaxTokens)
    bad(fmt::format("PlanOptions::decode_max_tokens: expected 0..{} (0: no decode kernels), got {}",
                    mlir::twell::DecodeKernelConstraints::kMaxTokens, options.decode_max_tokens));
}

// The two parts of a split FFN's tensors (PlanOptions::dense_neurons = k): the dense part's weights
// are the first k neurons, the TwELL part's the others; both keep the full row strides.
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

void check_run_arguments(const char* who, const FfnSpec& spec, const FfnTensors& t, int64_t tokens, int64_t max_tokens,
                         bool needs_output) {
  auto bad = [&](const std::string& m) { throw Error(ErrorCode::InvalidArgument, fmt::format("{}: {}", who, m)); };
  if (tokens < 0 || tokens > max_tokens) bad(fmt::format("tokens: expected 0..{} (the plan's max_tokens), got {}", max_tokens, tokens));
  const detail::Driver& d = detail::Driver::get();
  auto check_ptr = [&](const char* name, const void* p) {
    if (p == nullptr) bad(fmt::format("{}: expected a device pointer, got null", name));
    if (reinterpret_cast<uintptr_t>(p) % 2 != 0) bad(fmt::format("{}: expected a 2-byte aligned device pointer, got {}", name, p));
    unsigned int memory_type = 0;
    const CUresult r = d.cuPointerGetAttribute(&memory_type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, reinterpret_cast<CUdeviceptr>(p));
    if (r != CUDA_SUCCESS || (memory_type != CU_MEMORYTYPE_DEVICE && memory_type != CU_MEMORYTYPE_UNIFIED))
      bad(fmt::format("{}: expected device memory (cuMemAlloc/cudaMalloc), got {} which is {}", name, p,
                      r != CUDA_SUCCESS ? "not known to CUDA (host memory?)" : "host memory"));
  };
  auto check_ld = [&](const char* name, int64_t ld, int64_t row) {
    if (ld != 0 && ld < row) bad(fmt::format("{}: expected a row stride >= {} elements (or 0 = dense), got {}", name, row, ld));
  };
  // Strides beyond 2^36 elements cannot address real memory (and would overflow offset arithmetic).
  for (const auto& [name, ld] : {std::pair{"ld_x", t.ld_x}, std::pair{"ld_gate", t.ld_gate}, std::pair{"ld_up", t.ld_up},
                                 std::pair{"ld_down", t.ld_down}, std::pair{"ld_y", t.ld_y}})
    if (ld < 0 || ld > (int64_t{1} << 36))
      bad(fmt::format("{}: expected a row stride in 0..2^36 elements (0 = dense), got {}", name, ld));
  check_ptr("x", t.x);
  check_ptr("w_gate", t.w_gate);
  check_ld("ld_x", t.ld_x, spec.d_model);
  check_ld("ld_gate", t.ld_gate, spec.d_model);
  if (!needs_output) return;
  if (spec.gated && t.w_up == nullptr)
    bad("w_up: expected a device pointer (the up weight of a gated layer; a layer without one is "
        "FfnSpec::gated = false), got null");
  if (spec.gated) check_ptr("w_up", t.w_up);
  else if (t.w_up != nullptr || t.ld_up != 0)
    bad(fmt::format("w_up: a non-gated FFN (FfnSpec::gated = false) has no up projection; expected w_up = nullptr and "
                    "ld_up = 0, got {} and {}", t.w_up, t.ld_up));
  check_ptr("w_down", t.w_down);
  check_ptr("y", t.y);
  const bool in_out = spec.down_layout == WeightLayout::InOut;
  check_ld("ld_up", t.ld_up, spec.d_model);
  check_ld("ld_down", t.ld_down, in_out ? spec.d_model : spec.d_ff);
  check_ld("ld_y", t.ld_y, spec.d_model);
  const int64_t ldx = t.ld_x ? t.ld_x : spec.d_model, ldy = t.ld_y ? t.ld_y : spec.d_model;
  const auto xb = reinterpret_cast<uintptr_t>(t.x), yb = reinterpret_cast<uintptr_t>(t.y);
  const uintptr_t xe = xb + uintptr_t(std::max<int64_t>(tokens, 1) * ldx * 2), ye = yb + uintptr_t(std::max<int64_t>(tokens, 1) * ldy * 2);
  if (tokens > 0 && xb < ye && yb < xe) bad("y: must not overlap x (the consumer reads x while writing y)");
}

FfnPlan Context::plan(const FfnSpec& spec, int64_t max_tokens, const PlanOptions& options) {
  const std::shared_ptr<Context::Impl> ctx = context_impl(*this);  // throws for a moved-from context
  check_spec(spec, max_tokens, options);
  FfnPlan plan;
  plan.impl_ = std::make_unique<FfnPlan::Impl>();
  FfnPlan::Impl& p = *plan.impl_;
  p.context = ctx;
  p.spec = spec;
  p.dense_neurons = options.dense_neurons;
  p.sparse_spec = spec;
  p.sparse_spec.d_ff = spec.d_ff - options.dense_neurons;
  p.max_tokens = max_tokens;
  const bool transpose_down = spec.down_layout == WeightLayout::OutIn;
  FfnSpec kernel_spec = p.sparse_spec;
  kernel_spec.down_layout = WeightLayout::InOut;  // what the consumer reads after normalization
  // The decode kernels read Wd in the user's layout (at a few rows cheaper than a transposed copy).
  compiler::GeneratedFfn generated = compiler::generateFfn(kernel_spec, ctx->target, spec.down_layout);
  p.layout = generated.layout;
  check_tiles(p.layout, p.sparse_spec.d_ff, max_tokens);
  p.target = generated.target;
  p.ir = (transpose_down ? std::string("// FfnPlan: w_down (out_in, nn.Linear) is transposed on the stream to in_out "
                                       "before the consumer.\n")
                         : std::string()) +
         (p.dense_neurons > 0 ? fmt::format("// FfnPlan: neurons 0..{} run dense (cuBLASLt, y +=); the kernels below take "
                                            "neurons {}..{} (d_ff {}).\n", p.dense_neurons - 1, p.dense_neurons, spec.d_ff - 1,
                                            p.sparse_spec.d_ff)
                              : std::string()) +
         std::move(generated.ir);
  if (transpose_down) {
    compiler::KernelSource t;
    t.kind = compiler::KernelKind::WeightTranspose;
    t.name = "twell_transpose16";
    t.source = "// Generated by twell's runtime (plan.cpp): layout normalization of the down weight.\n"
               "#include \"twell/device/transpose.cuh\"\n"
               "extern \"C\" __global__ void __launch_bounds__(256) twell_transpose16(const twell::device::TransposeParams p) {\n"
               "  twell::device::transpose16(p);\n}\n";
    t.threads = 256;
    t.cta_m = 32;
    p.transpose = ctx->load(t);
    p.reports.push_back(p.transpose->report);
  }
  for (const auto& k : generated.kernels) {
    p.kernels.push_back(ctx->load(k));
    p.reports.push_back(p.kernels.back()->report);
  }
  if (!spec.consumer && spec.gated) {  // the token block is a gated kernel
    kernel_spec.consumer = ConsumerVariant::TokenBlock;
    compiler::GeneratedFfn block = compiler::generateFfn(kernel_spec, ctx->target);
    for (const auto& k : block.kernels)
      if (k.kind == compiler::KernelKind::GatedDown && k.cta_m == 16) {  // else the shape fell back to rows
        p.block_consumer = ctx->load(k);
        p.reports.push_back(p.block_consumer->report);
      }
  }
  if (options.decode_max_tokens > 0) {
    std::vector<compiler::KernelSource>& decode = generated.decode;
    if (decode.size() == 4) {
      p.decode_gate = ctx->load(decode[0]);
      p.decode_up = ctx->load(decode[1]);
      p.decode_down = ctx->load(decode[2]);
      p.decode_gate_small = ctx->load(decode[3]);
      for (const auto* k : {&p.decode_gate, &p.decode_up, &p.decode_down, &p.decode_gate_small})
        p.reports.push_back((*k)->report);
      p.decode_max_tokens = options.decode_max_tokens;
      p.ir = fmt::format("// FfnPlan: run() calls of at most {} tokens take the decode kernels {}, {}, {} and {} "
                         "(decode.cuh: the same arithmetic as the kernels below, spread over the GPU for a few rows).\n",
                         p.decode_max_tokens, decode[0].name, decode[3].name, decode[1].name, decode[2].name) +
             p.ir;
    }
  }
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
    p.counter = std::make_unique<detail::DeviceBuffer>(8);  // the overflow count, the consumer's row counter
    if (transpose_down) p.w_down_t = std::make_unique<detail::DeviceBuffer>(size_t(sparse_d_ff) * spec.d_model * 2);
    const int64_t tile_rows = max_tokens * p.layout.tiles(sparse_d_ff);
    p.dispatch = options.dispatch;
    // The dense path and the dense neurons: cuBLASLt, with the fused gated-up kernel where it applies.
    if (p.dispatch != Dispatch::Sparse) p.dense = std::make_unique<DenseFfn>(*this, spec, max_tokens, DenseKernels::FusedGatedUp);
    if (p.dense_neurons > 0 && p.dispatch != Dispatch::Dense) {
      FfnSpec hot = spec;
      hot.d_ff = p.dense_neurons;
      p.hot = std::make_unique<DenseFfn>(*this, hot, max_tokens, DenseKernels::FusedGatedUp);
    }
    p.allocate_backup(options.backup_capacity.value_or(
        static_cast<uint32_t>(std::clamp<int64_t>(tile_rows / 16, 256, int64_t{1} << 24))));
  }
  return plan;
}

namespace {
// The tensor-core main loop moves 16-byte chunks of x and Wg rows (cp.async), and its consumer reads
// x, Wu and Wd^T rows 16 bytes at a time: the generated kernels say how aligned (in elements) those
// operands and their row strides must be.
void check_operand_alignment(const FfnPlan::Impl& p, const FfnTensors& t, bool gate_only) {
  int need = 1;
  for (const auto& k : p.kernels) need = std::max(need, k->source.operand_alignment);
  if (need == 1) return;
  const FfnSpec& s = p.spec;
  auto check = [&](const char* name, const void* ptr, const char* ld_name, int64_t ld) {
    if (operand_aligned(ptr, ld, need)) return;
    if (reinterpret_cast<uintptr_t>(ptr) % (2 * need) != 0)
      throw Error(ErrorCode::InvalidArgument, fmt::format("FfnPlan::run: {}: expected a {}-byte aligned device pointer (the "
                                                          "generated kernels load {}-element chunks), got {}", name, 2 * need, need, ptr));
    if (ld % need != 0)
      throw Error(ErrorCode::InvalidArgument, fmt::format("FfnPlan::run: {}: expected a row stride that is a multiple of {} elements, "
                                                          "got {}", ld_name, need, ld));
  };
  check("x", t.x, "ld_x", t.ld_x ? t.ld_x : s.d_model);
  check("w_gate", t.w_gate, "ld_gate", t.ld_gate ? t.ld_gate : s.d_model);
  if (gate_only || need < 8) return;
  // The consumer then reads rows of Wu and Wd^T with 16-byte loads too (gated_down.cuh); one row per
  // warp (operand alignment 8) also writes rows of y 16 bytes at a time.
  if (s.gated) check("w_up", t.w_up, "ld_up", t.ld_up ? t.ld_up : s.d_model);
  if (s.down_layout == WeightLayout::InOut) check("w_down", t.w_down, "ld_down", t.ld_down ? t.ld_down : s.d_model);
  for (const auto& k : p.kernels)
    if (k->source.kind == compiler::KernelKind::GatedDown && k->source.operand_alignment >= 8)
      check("y", t.y, "ld_y", t.ld_y ? t.ld_y : s.d_model);
}

// A default-constructed or moved-from plan has no Impl: every use is a clear error, not a crash.
FfnPlan::Impl& checked(const std::unique_ptr<FfnPlan::Impl>& impl, const char* what) {
  if (!impl) throw Error(ErrorCode::InvalidArgument, fmt::format("FfnPlan::{}: this plan is empty (default-constructed or moved "
                                                                  "from); make one with Context::plan", what));
  return *impl;
}
}  // namespace

FfnPlan::FfnPlan() = default;
FfnPlan::~FfnPlan() = default;
FfnPlan::FfnPlan(FfnPlan&&) noexcept = default;
FfnPlan& FfnPlan::operator=(FfnPlan&&) noexcept = default;
const FfnSpec& FfnPlan::spec() const { return checked(impl_, "spec").spec; }
const TwellLayout& FfnPlan::layout() const { return checked(impl_, "layout").layout; }
const Target& FfnPlan::target() const { return checked(impl_, "target").target; }
int64_t FfnPlan::max_tokens() const { return checked(impl_, "max_tokens").max_tokens; }
int64_t FfnPlan::dense_neurons() const { return checked(impl_, "dense_neurons").dense_neurons; }
const std::vector<KernelReport>& FfnPlan::kernels() const { return checked(impl_, "kernels").reports; }
const std::string& FfnPlan::ir() const { return checked(impl_, "ir").ir; }
namespace {
const LoadedKernel& kernel_at(const std::unique_ptr<FfnPlan::Impl>& impl, size_t i, const char* what) {
  const auto& kernels = checked(impl, what).kernels;
  if (i >= kernels.size())
    throw Error(ErrorCode::InvalidArgument, fmt::format("FfnPlan::{}: kernel: expected 0..{}, got {}", what, kernels.size() - 1, i));
  return *kernels[i];
}
}  // namespace
const std::string& FfnPlan::ptx(size_t i) const { return kernel_at(impl_, i, "ptx").binary->ptx; }
const std::string& FfnPlan::cuda_source(size_t i) const { return kernel_at(impl_, i, "cuda_source").source.source; }
bool FfnPlan::runnable() const { return checked(impl_, "runnable").context->gpu; }

namespace {
// Whether the token-block consumer may read these operands: 16-byte aligned rows of x, Wu, Wd^T and y
// (its cp.async chunks). An out_in Wd is read from the plan's transposed copy, which is aligned.
bool block_operands_aligned(const FfnSpec& s, const FfnTensors& t) {
  auto ok = [](const void* ptr, int64_t ld) { return operand_aligned(ptr, ld, 8); };
  return ok(t.x, t.ld_x ? t.ld_x : s.d_model) && ok(t.w_up, t.ld_up ? t.ld_up : s.d_model) &&
         ok(t.y, t.ld_y ? t.ld_y : s.d_model) &&
         (s.down_layout == WeightLayout::OutIn || ok(t.w_down, t.ld_down ? t.ld_down : s.d_model));
}
}  // namespace

void FfnPlan::run(Stream stream, const FfnTensors& t, int64_t tokens) {
  Impl& p = checked(impl_, "run");
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
    // Per power-of-two bucket, and apart for calls the decode kernels take (decode_max_tokens need
    // not be a power of two): one decision never covers two different TwELL paths.
    const bool decode = p.decode_gate && tokens <= p.decode_max_tokens;
    const int bucket = 2 * std::bit_width(static_cast<uint64_t>(tokens - 1)) + (decode ? 1 : 0);
    auto it = p.bucket_path.find(bucket);
    if (it == p.bucket_path.end()) {
      // Calibrate on these inputs: median of 3 timed calls of each path after one warm-up.
      double best = 0;
      Path fastest = Path::Rows;
      for (Path c : candidates) {
        p.use_block = c == Path::Block;
        const auto ms = c == Path::Dense ? time_on_stream(stream, [&] { p.dense->run(stream, t, tokens); }, 1, 3)
                                         : time_on_stream(stream, run_twell, 1, 3);
        if (c == Path::Rows || ms[1] < best) {
          best = ms[1];
          fastest = c;
        }
      }
      it = p.bucket_path.emplace(bucket, fastest).first;
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

std::string FfnPlan::last_path() const { return checked(impl_, "last_path").last_path; }

void FfnPlan::recalibrate() { checked(impl_, "recalibrate").bucket_path.clear(); }

void FfnPlan::run_gate(Stream stream, const FfnTensors& t, int64_t tokens) { launch(stream, t, tokens, Stages::GateOnly); }

void FfnPlan::run_consumer(Stream stream, const FfnTensors& t, int64_t tokens) {
  Impl& p = checked(impl_, "run_consumer");
  if (p.last_path != "twell")
    throw Error(ErrorCode::InvalidArgument, "FfnPlan::run_consumer: the plan holds no TwELL matrix (run_gate(), a sparse run() "
                                            "or upload_twell() first)");
  if (tokens != p.last_tokens)
    throw Error(ErrorCode::InvalidArgument, fmt::format("FfnPlan::run_consumer: tokens: expected {} (the rows of the plan's TwELL "
                                                        "matrix), got {}", p.last_tokens, tokens));
  launch(stream, t, tokens, Stages::ConsumerOnly);
}

void FfnPlan::upload_twell(Stream stream, const TwellMatrix& m) {
  Impl& p = checked(impl_, "upload_twell");
  if (!p.context->gpu) throw Error(ErrorCode::NoDevice, "FfnPlan::upload_twell: this plan was made without a GPU");
  auto bad = [](const std::string& what) { throw Error(ErrorCode::InvalidArgument, "FfnPlan::upload_twell: " + what); };
  validate_twell(m);
  const TwellLayout& l = p.layout;
  if (m.layout.tile_n != l.tile_n || m.layout.slots != l.slots || m.layout.value != l.value ||
      m.layout.activation != l.activation || m.layout.threshold != l.threshold)
    bad(fmt::format("m.layout: expected the plan's (tile_n {}, slots {}), got tile_n {}, slots {} (or another value type, "
                    "activation or threshold)", l.tile_n, l.slots, m.layout.tile_n, m.layout.slots));
  if (m.d_ff != p.sparse_spec.d_ff)
    bad(fmt::format("m.d_ff: expected {} (the plan's TwELL neurons{}), got {}", p.sparse_spec.d_ff,
                    p.dense_neurons > 0 ? fmt::format(": d_ff {} minus dense_neurons {}", p.spec.d_ff, p.dense_neurons) : "", m.d_ff));
  if (m.rows < 0 || m.rows > p.max_tokens) bad(fmt::format("m.rows: expected 0..{} (max_tokens), got {}", p.max_tokens, m.rows));
  p.context->make_current();
  const detail::Driver& d = detail::Driver::get();
  detail::check(d.cuStreamSynchronize(reinterpret_cast<CUstream>(stream)), "FfnPlan::upload_twell: cuStreamSynchronize");
  const uint32_t stored = static_cast<uint32_t>(m.backup.size() / std::max(1, l.tile_n));
  if (stored > p.backup_capacity) p.allocate_backup(stored);
  if (!m.words.empty()) detail::check(d.cuMemcpyHtoD(p.twell->get(), m.words.data(), m.words.size() * 4), "cuMemcpyHtoD(twell)");
  if (!m.backup.empty()) detail::check(d.cuMemcpyHtoD(p.backup->get(), m.backup.data(), m.backup.size() * 2), "cuMemcpyHtoD(backup)");
  detail::check(d.cuMemcpyHtoD(p.counter->get(), &m.overflow_count, 4), "cuMemcpyHtoD(overflow count)");
  p.last_tokens = m.rows;
  p.last_path = "twell";
  p.matrix_capacity = m.backup_capacity;
}

namespace {
// The decode kernels (decode.cuh) on `tokens` <= decode_max_tokens rows: decode_gate (one CTA per 32
// columns of d_ff; the last CTA of each tile packs it), decode_up (one CTA per row and tile),
// decode_down (one warp per row and 64 outputs). The overflow counter is zeroed before, as for the D2T.
void launch_decode(FfnPlan::Impl& p, device::GateParams& gate, device::GatedDownParams& down, int64_t tokens, CUstream cu) {
  const detail::Driver& d = detail::Driver::get();
  device::DecodeBuffers buffers{};
  buffers.act = reinterpret_cast<uint16_t*>(p.decode_act->get());
  buffers.tile_arrivals = reinterpret_cast<uint32_t*>(p.decode_arrivals->get());
  buffers.entries = reinterpret_cast<uint32_t*>(p.decode_entries->get());
  buffers.act_ld = p.decode_act_ld;
  buffers.w_up = down.w_up;
  buffers.w_down = down.w_down;
  buffers.ldwu = down.ldwu;
  buffers.ldwd = down.ldwd;
  const int64_t tiles = p.layout.tiles(p.sparse_spec.d_ff);
  const auto slices = static_cast<unsigned>(tiles * (p.layout.tile_n / mlir::twell::DecodeKernelConstraints::kSliceN));
  const int64_t columns = mlir::twell::DecodeKernelConstraints::downColumns(p.spec.down_layout == WeightLayout::InOut);
  const auto chunks = (p.spec.d_model + columns - 1) / columns;
  // decode_up and decode_down wait for the kernel before them with griddepcontrol.wait (sm_90 and
  // later: programmatic dependent launch), so they may launch while it runs: the launch latency
  // overlaps the previous kernel instead of following it.
  const bool dependent_launch = p.target.sm >= 90;
  auto run = [&](const LoadedKernel& k, unsigned grid, void* params, int64_t smem, bool overlap) {
    void* args[2] = {params, &buffers};
    CUlaunchAttribute attribute{};
    attribute.id = CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
    attribute.value.programmaticStreamSerializationAllowed = 1;
    CUlaunchConfig config{};
    config.gridDimX = grid;
    config.gridDimY = config.gridDimZ = 1;
    config.blockDimX = static_cast<unsigned>(k.source.threads);
    config.blockDimY = config.blockDimZ = 1;
    config.sharedMemBytes = static_cast<unsigned>(smem);
    config.hStream = cu;
    config.attrs = &attribute;
    config.numAttrs = overlap && dependent_launch ? 1 : 0;
    detail::check(d.cuLaunchKernelEx(&config, k.function, args, nullptr),
                  fmt::format("FfnPlan::run: launching {}", k.source.name).c_str());
  };
  // Up to 8 rows: decode_gate_small (no ring); else decode_gate, whose ring is sized by the rows it
  // holds (16 or 64): two CTAs per SM.
  if (tokens <= p.decode_gate_small->source.cta_m)
    run(*p.decode_gate_small, static_cast<unsigned>(tiles * (p.layout.tile_n / mlir::twell::DecodeKernelConstraints::kGateSmallSliceN)),
        &gate, p.decode_gate_small->source.smem_bytes, false);
  else
    run(*p.decode_gate, slices, &gate, mlir::twell::DecodeKernelConstraints::gateSharedBytes(p.layout.tile_n, tokens), false);
  run(*p.decode_up, static_cast<unsigned>(tokens * tiles), &down, 0, true);
  run(*p.decode_down, static_cast<unsigned>(tokens * chunks), &down, 0, true);
}
}  // namespace

void FfnPlan::launch(Stream stream, const FfnTensors& user_tensors, int64_t tokens, Stages stages) {
  const bool gate_only = stages == Stages::GateOnly;
  const bool consumer_only = stages == Stages::ConsumerOnly;
  const char* who = gate_only ? "FfnPlan::run_gate" : consumer_only ? "FfnPlan::run_consumer" : "FfnPlan::run";
  Impl& p = checked(impl_, gate_only ? "run_gate" : "run");
  if (!p.context->gpu)
    throw Error(ErrorCode::NoDevice, fmt::format("{}: this plan was made without a GPU ({})", who, p.context->no_gpu_reason));
  p.context->make_current();
  check_run_arguments(who, p.spec, user_tensors, tokens, p.max_tokens, !gate_only);
  // From here on the TwELL part: its neurons' slices of the weights, its spec.
  // (The slices start 128-byte multiples past the user's pointers: the same alignment, so the
  // user's pointers are checked, and named in the errors.)
  check_operand_alignment(p, user_tensors, gate_only);
  // The dense neurons' part (run() adds it after these kernels): what can fail there (its arguments,
  // cuBLASLt's algorithms for its operands) fails now, before y is written.
  if (stages == Stages::All && p.hot && tokens > 0) p.hot->prepare(neuron_slice(p.spec, user_tensors, 0), tokens);
  const FfnTensors t = p.dense_neurons > 0 ? neuron_slice(p.spec, user_tensors, p.dense_neurons) : user_tensors;
  const detail::Driver& d = detail::Driver::get();
  const FfnSpec& s = p.sparse_spec;
  const bool in_out = s.down_layout == WeightLayout::InOut;
  auto u16 = [](const void* ptr) { return static_cast<const uint16_t*>(ptr); };
  auto cu = reinterpret_cast<CUstream>(stream);
  if (p.wanted_capacity > p.backup_capacity && !consumer_only) {
    // last_overflow() synchronized the stream after the run that filled the old backup, and calls on
    // a plan are ordered, so no kernel still reads it.
    p.allocate_backup(p.wanted_capacity);
  }
  if (!consumer_only) {
    detail::check(d.cuMemsetD32Async(p.counter->get(), 0, 1, cu), "FfnPlan::run: cuMemsetD32Async(overflow counter)");
    p.matrix_capacity = p.backup_capacity;
  }
  p.last_tokens = tokens;
  p.last_path = "twell";
  if (tokens == 0) return;

  device::GateParams gate{};
  gate.x = u16(t.x);
  gate.w_gate = u16(t.w_gate);
  gate.twell = reinterpret_cast<uint32_t*>(p.twell->get());
  gate.backup = reinterpret_cast<uint16_t*>(p.backup->get());
  gate.overflow_count = reinterpret_cast<uint32_t*>(p.counter->get());
  gate.m = tokens;
  gate.ldx = t.ld_x ? t.ld_x : s.d_model;
  gate.ldw = t.ld_gate ? t.ld_gate : s.d_model;
  gate.backup_capacity = p.backup_capacity;

  device::GatedDownParams down{};
  down.x = gate.x;
  down.w_gate = gate.w_gate;
  down.w_up = u16(t.w_up);
  down.w_down = u16(t.w_down);
  down.twell = gate.twell;
  down.backup = gate.backup;
  down.y = static_cast<uint16_t*>(t.y);
  down.row_counter = reinterpret_cast<uint32_t*>(p.counter->get() + 4);
  down.m = tokens;
  down.ldx = gate.ldx;
  down.ldwg = gate.ldw;
  down.ldwu = t.ld_up ? t.ld_up : s.d_model;
  down.ldwd = t.ld_down ? t.ld_down : (in_out ? s.d_model : s.d_ff);
  down.ldy = t.ld_y ? t.ld_y : s.d_model;
  down.backup_capacity = p.backup_capacity;
  if (stages == Stages::All && !p.use_block && p.decode_gate && tokens <= p.decode_max_tokens) {
    launch_decode(p, gate, down, tokens, cu);  // reads w_down as given: no transpose
    return;
  }
  if (p.transpose && !gate_only) {
    device::TransposeParams tp{u16(t.w_down), reinterpret_cast<uint16_t*>(p.w_down_t->get()), s.d_model, s.d_ff, down.ldwd, s.d_model};
    void* args[1] = {&tp};
    detail::check(d.cuLaunchKernel(p.transpose->function, static_cast<unsigned>((s.d_ff + 31) / 32),
                                   static_cast<unsigned>((s.d_model + 31) / 32), 1, 32, 8, 1, 0, cu, args, nullptr),
                  "FfnPlan::run: launching the down-weight transpose");
    down.w_down = reinterpret_cast<const uint16_t*>(p.w_down_t->get());
    down.ldwd = s.d_model;
  }

  for (const auto& kernel : p.kernels) {
    // The token-block consumer in place of the row consumer when run() chose it.
    const LoadedKernel* k =
        kernel->source.kind == compiler::KernelKind::GatedDown && p.use_block ? p.block_consumer.get() : kernel.get();
    const compiler::KernelSource& src = k->source;
    if (gate_only && src.kind != compiler::KernelKind::GateTwell) continue;
    if (consumer_only && src.kind == compiler::KernelKind::GateTwell) continue;
    void* args[1] = {src.kind == compiler::KernelKind::GateTwell ? static_cast<void*>(&gate) : static_cast<void*>(&down)};
    unsigned grid_x = static_cast<unsigned>((tokens + src.cta_m - 1) / src.cta_m);
    unsigned grid_y = static_cast<unsigned>(src.grid_y);
    if (src.tma_persistent) {
      detail::encode_tma_map(gate.x_map, s.dtype, gate.x, tokens, s.d_model, gate.ldx, src.cta_m, src.cta_k, "FfnPlan::run: cuTensorMapEncodeTiled(x)");
      // A cluster's CTAs each load tile_n / cluster_m rows of the w_gate tile and multicast them.
      detail::encode_tma_map(gate.w_map, s.dtype, gate.w_gate, s.d_ff, s.d_model, gate.ldw, p.layout.tile_n / src.cluster_m, src.cta_k,
                     "FfnPlan::run: cuTensorMapEncodeTiled(w_gate)");
    }
    if (src.kind == compiler::KernelKind::GatedDown && src.persistent)  // the warps claim rows from 0
      detail::check(d.cuMemsetD32Async(p.counter->get() + 4, 0, 1, cu), "FfnPlan::run: cuMemsetD32Async(row counter)");
    if (src.persistent) {
      grid_x = persistent_grid_x(*k, tokens, p.context->sm_count);
      grid_y = 1;
    }
    detail::check(d.cuLaunchKernel(k->function, grid_x, grid_y, 1, static_cast<unsigned>(src.threads), 1, 1,
                                   static_cast<unsigned>(src.smem_bytes), cu, args, nullptr),
                  fmt::format("FfnPlan::run: launching {}", src.name).c_str());
  }
}

OverflowReport FfnPlan::last_overflow(Stream stream) {
  Impl& p = checked(impl_, "last_overflow");
  if (p.last_path == "dense")
    throw Error(ErrorCode::InvalidArgument, "FfnPlan::last_overflow: the last run() took the dense path (Dispatch::Auto or "
                                            "Dense), which makes no TwELL matrix; use PlanOptions::dispatch = Sparse");
  if (!p.context->gpu) throw Error(ErrorCode::NoDevice, "FfnPlan::last_overflow: this plan was made without a GPU");
  p.context->make_current();
  const detail::Driver& d = detail::Driver::get();
  detail::check(d.cuStreamSynchronize(reinterpret_cast<CUstream>(stream)), "FfnPlan::last_overflow: cuStreamSynchronize");
  uint32_t count = 0;
  detail::check(d.cuMemcpyDtoH(&count, p.counter->get(), 4), "FfnPlan::last_overflow: cuMemcpyDtoH");
  OverflowReport r{count, p.matrix_capacity, count > p.matrix_capacity};
  // The next run() grows the backup (not now: download_twell() may still read this run's backup).
  if (r.recomputed) p.wanted_capacity = static_cast<uint32_t>(std::min<uint64_t>(uint64_t(count) + count / 4, uint64_t{1} << 24));
  return r;
}

TwellMatrix FfnPlan::download_twell(Stream stream) const {
  const Impl& p = checked(impl_, "download_twell");
  if (p.last_path == "dense")
    throw Error(ErrorCode::InvalidArgument, "FfnPlan::download_twell: the last run() took the dense path (Dispatch::Auto or "
                                            "Dense), which makes no TwELL matrix; use PlanOptions::dispatch = Sparse");
  if (!p.context->gpu) throw Error(ErrorCode::NoDevice, "FfnPlan::download_twell: this plan was made without a GPU");
  if (p.last_tokens < 0) throw Error(ErrorCode::InvalidArgument, "FfnPlan::download_twell: run() has not been called");
  p.context->make_current();
  const detail::Driver& d = detail::Driver::get();
  detail::check(d.cuStreamSynchronize(reinterpret_cast<CUstream>(stream)), "FfnPlan::download_twell: cuStreamSynchronize");
  TwellMatrix m;
  m.layout = p.layout;
  m.rows = p.last_tokens;
  m.d_ff = p.sparse_spec.d_ff;
  m.backup_capacity = p.matrix_capacity;
  m.words.resize(size_t(m.rows) * p.layout.words_per_row(m.d_ff));
  if (!m.words.empty()) detail::check(d.cuMemcpyDtoH(m.words.data(), p.twell->get(), m.words.size() * 4), "cuMemcpyDtoH(twell)");
  detail::check(d.cuMemcpyDtoH(&m.overflow_count, p.counter->get(), 4), "cuMemcpyDtoH(overflow count)");
  m.backup.resize(size_t(std::min(m.overflow_count, m.backup_capacity)) * p.layout.tile_n);
  if (!m.backup.empty()) detail::check(d.cuMemcpyDtoH(m.backup.data(), p.backup->get(), m.backup.size() * 2), "cuMemcpyDtoH(backup)");
  return m;
}

}  // namespace twell
