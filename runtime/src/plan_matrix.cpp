// The plan's TwELL matrix (last_overflow, download_twell, upload_twell) and its accessors.
#include <algorithm>

#include <fmt/format.h>

#include "driver.h"
#include "plan_impl.h"
#include "twell/error.h"
#include "twell/format.h"

namespace twell {

FfnPlan::Impl& checked_plan(const std::unique_ptr<FfnPlan::Impl>& impl, const char* what) {
  if (!impl) throw Error(ErrorCode::InvalidArgument, fmt::format("FfnPlan::{}: this plan is empty (default-constructed or moved "
                                                                  "from); make one with Context::plan", what));
  return *impl;
}

FfnPlan::FfnPlan() = default;
FfnPlan::~FfnPlan() = default;
FfnPlan::FfnPlan(FfnPlan&&) noexcept = default;
FfnPlan& FfnPlan::operator=(FfnPlan&&) noexcept = default;
const FfnSpec& FfnPlan::spec() const { return checked_plan(impl_, "spec").spec; }
const TwellLayout& FfnPlan::layout() const { return checked_plan(impl_, "layout").layout; }
const Target& FfnPlan::target() const { return checked_plan(impl_, "target").target; }
int64_t FfnPlan::max_tokens() const { return checked_plan(impl_, "max_tokens").max_tokens; }
int64_t FfnPlan::dense_neurons() const { return checked_plan(impl_, "dense_neurons").dense_neurons; }
const std::vector<KernelReport>& FfnPlan::kernels() const { return checked_plan(impl_, "kernels").reports; }
const std::string& FfnPlan::ir() const { return checked_plan(impl_, "ir").ir; }
namespace {
// Kernel i of the plan's FFN: 0 the gate, 1 the row consumer (the order of FfnPlan::kernels() after
// a transpose).
const LoadedKernel& kernel_at(const std::unique_ptr<FfnPlan::Impl>& impl, size_t i, const char* what) {
  const FfnPlan::Impl& p = checked_plan(impl, what);
  const std::vector<const LoadedKernel*> kernels{p.gate.get(), p.consumer.get()};
  if (i >= kernels.size())
    throw Error(ErrorCode::InvalidArgument, fmt::format("FfnPlan::{}: kernel: expected 0..{}, got {}", what, kernels.size() - 1, i));
  return *kernels[i];
}
}  // namespace
const std::string& FfnPlan::ptx(size_t i) const { return kernel_at(impl_, i, "ptx").binary->ptx; }
const std::string& FfnPlan::cuda_source(size_t i) const { return kernel_at(impl_, i, "cuda_source").source.source; }
bool FfnPlan::runnable() const { return checked_plan(impl_, "runnable").context->gpu; }

void FfnPlan::upload_twell(Stream stream, const TwellMatrix& m) {
  Impl& p = checked_plan(impl_, "upload_twell");
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
  // Pageable copies may return before their DMA lands, ordered on the legacy stream only: the next run()
  // on a non-blocking stream must read the uploaded matrix.
  detail::check(d.cuStreamSynchronize(nullptr), "FfnPlan::upload_twell: cuStreamSynchronize(the copies)");
  p.last_tokens = m.rows;
  p.last_path = "twell";
  p.matrix_capacity = m.backup_capacity;
}

OverflowReport FfnPlan::last_overflow(Stream stream) {
  Impl& p = checked_plan(impl_, "last_overflow");
  if (p.last_path == "dense")
    throw Error(ErrorCode::InvalidArgument, "FfnPlan::last_overflow: the last run() took the dense path (Dispatch::Auto or "
                                            "Dense), which makes no TwELL matrix; use PlanOptions::dispatch = Sparse");
  if (!p.context->gpu) throw Error(ErrorCode::NoDevice, "FfnPlan::last_overflow: this plan was made without a GPU");
  p.context->make_current();
  const detail::Driver& d = detail::Driver::get();
  detail::check(d.cuStreamSynchronize(reinterpret_cast<CUstream>(stream)), "FfnPlan::last_overflow: cuStreamSynchronize");
  // The fused decode kernel makes no TwELL matrix: nothing overflowed, nothing was recomputed.
  if (p.last_path == "decode") return OverflowReport{0, p.matrix_capacity, false};
  uint32_t count = 0;
  detail::check(d.cuMemcpyDtoH(&count, p.counter->get(), 4), "FfnPlan::last_overflow: cuMemcpyDtoH");
  OverflowReport r{count, p.matrix_capacity, count > p.matrix_capacity};
  // The next run() grows the backup (not now: download_twell() may still read this run's backup).
  if (r.recomputed) p.wanted_capacity = static_cast<uint32_t>(std::min<uint64_t>(uint64_t(count) + count / 4, uint64_t{1} << 24));
  return r;
}

TwellMatrix FfnPlan::download_twell(Stream stream) const {
  const Impl& p = checked_plan(impl_, "download_twell");
  if (p.last_path == "dense")
    throw Error(ErrorCode::InvalidArgument, "FfnPlan::download_twell: the last run() took the dense path (Dispatch::Auto or "
                                            "Dense), which makes no TwELL matrix; use PlanOptions::dispatch = Sparse");
  if (p.last_path == "decode")
    throw Error(ErrorCode::InvalidArgument, "FfnPlan::download_twell: the last run() took the fused decode kernel, which makes no "
                                            "TwELL matrix; run_gate() makes one (or PlanOptions::decode_fused_max_tokens = 0)");
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
