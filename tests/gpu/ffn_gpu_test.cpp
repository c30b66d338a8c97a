// The TwELL FFN on the GPU against the CPU reference (and the dense cuBLASLt path), on random data at
// several densities and shapes, edge rows, NaN, overflow paths, real data, and bad arguments.
// Without a GPU the whole binary reports SKIPPED (exit code 77, which ctest shows as "Not Run").
#include <cstdlib>
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>

#include <fmt/format.h>

#include "test_data.h"
#include "twell/context.h"
#include "twell/dense.h"
#include "twell/device_memory.h"
#include "twell/error.h"
#include "twell/kernels/constraints.h"
#include "twell/layer_data.h"
#include "twell/neuron_order.h"

using namespace twell;
using namespace twell::testing;

namespace {

Context& context() {
  static Context ctx;
  return ctx;
}

// The TwELL path, whatever Dispatch::Auto would pick: these tests check the TwELL kernels.
PlanOptions sparse() {
  PlanOptions o;
  o.dispatch = Dispatch::Sparse;
  return o;
}

struct DeviceFfn {
  bool gated;
  DeviceMemory x, wg, wu, wd, y;
  DeviceFfn(Context& c, const RandomFfn& f)
      : gated(f.spec.gated), x(c, f.x.size() * 2), wg(c, f.w_gate.size() * 2), wu(c, std::max<size_t>(2, f.w_up.size() * 2)),
        wd(c, f.w_down.size() * 2), y(c, std::max<size_t>(1, f.tokens * f.spec.d_model * 2)) {
    x.upload(f.x);
    wg.upload(f.w_gate);
    if (gated) wu.upload(f.w_up);
    wd.upload(f.w_down);
  }
  // A non-gated layer takes no up weight (w_up = nullptr).
  FfnTensors tensors() const { return {x.data(), wg.data(), gated ? wu.data() : nullptr, wd.data(), y.data()}; }
};

struct Outcome {
  double err_twell = 0, err_dense = 0;
  size_t unwritten = 0;
  bool deterministic = false;
  OverflowReport overflow;
  std::vector<uint16_t> y;  // the first run's output bits
  std::vector<float> ref;   // the CPU reference's y
};

// The gate kernel's TwELL matrix against the CPU reference's, value by value (each tile-row read from
// its entries or its backup row; tile-rows the consumer had to recompute are skipped). The tensor-core
// main loop sums K in another order than the CPU's fmaf chain: the fp32 sums differ by about
// K * 2^-24 * sum|x_k w_k| (absolute, so a value near zero may differ in several 16-bit ulps), and an
// activation that close to the threshold may be active on one side only (SiLU rounds twice: a one-ulp
// change of g can move silu(g) by two). Allowed: differences within 1e-4 + 2^-6 |value|, and such borderline flips. Anything else is a packing error: a wrong column, a
// lost or invented entry, a wrong value.
void expect_same_twell(const TwellMatrix& gpu, const TwellMatrix& cpu) {
  const TwellLayout& l = gpu.layout;
  const int64_t tiles = l.tiles(gpu.d_ff), wpr = l.words_per_row(gpu.d_ff);
  ASSERT_EQ(gpu.words.size(), cpu.words.size());
  auto dense_tile_row = [&](const TwellMatrix& m, int64_t r, int64_t t, std::vector<uint16_t>& out) {
    const uint32_t* w = &m.words[r * wpr + t * (l.slots + 1)];
    std::fill(out.begin(), out.end(), uint16_t{0});
    if (w[0] <= static_cast<uint32_t>(l.slots)) {
      for (uint32_t e = 0; e < w[0]; ++e) out[w[1 + e] & 0xFFFFu] = static_cast<uint16_t>(w[1 + e] >> 16);
      return true;
    }
    if (w[1] == kBackupMissing) return false;
    std::copy_n(m.backup.begin() + int64_t{w[1]} * l.tile_n, l.tile_n, out.begin());
    return true;
  };
  std::vector<uint16_t> g(l.tile_n), c(l.tile_n);
  int64_t compared = 0, ulp = 0, flips = 0, bad = 0;
  const float flip_band = l.threshold * (1.0f + 1.0f / 64) + 1e-4f;
  for (int64_t r = 0; r < gpu.rows; ++r)
    for (int64_t t = 0; t < tiles; ++t) {
      if (!dense_tile_row(gpu, r, t, g) || !dense_tile_row(cpu, r, t, c)) continue;
      for (int i = 0; i < l.tile_n; ++i) {
        ++compared;
        if (g[i] == c[i]) continue;
        const bool ga = is_active(l, g[i]), ca = is_active(l, c[i]);
        const float gv = to_float(l.value, g[i]), cv = to_float(l.value, c[i]);
        if (ga && ca && std::fabs(gv - cv) <= 1e-4f + std::fabs(cv) / 64) {
          ++ulp;
        } else if (ga != ca && std::fabs(ga ? gv : cv) <= flip_band) {
          ++flips;
        } else if (++bad <= (std::getenv("TWELL_TEST_VERBOSE") ? 60 : 5)) {
          ADD_FAILURE() << "TwELL (row " << r << ", tile " << t << ", column " << i << "): GPU " << gv << " (active " << ga
                        << "), CPU " << cv << " (active " << ca << ")";
        }
      }
    }
  EXPECT_EQ(bad, 0) << "of " << compared << " values compared";
  EXPECT_LE(ulp + flips, std::max<int64_t>(4, compared / 500)) << ulp << " rounding differences and " << flips
                                                                  << " borderline flips of " << compared << " values";
}

// Runs the plan twice (poisoned output each time) and the dense path, checks the TwELL matrix the
// gate kernel wrote, and compares with the CPU reference.
Outcome run_and_compare(const RandomFfn& f, PlanOptions options = sparse(), bool with_dense = true) {
  Context& ctx = context();
  StreamHandle stream(ctx);
  FfnPlan plan = ctx.plan(f.spec, std::max<int64_t>(1, f.tokens), options);
  DeviceFfn dev(ctx, f);
  const auto ref = reference_gated_ffn(f.spec, f.x, f.tokens, f.weights(), options.backup_capacity.value_or(UINT32_MAX));
  Outcome o;
  const size_t count = f.tokens * f.spec.d_model;
  dev.y.fill(0xFF);  // 0xFFFF: a NaN pattern no correct output has on these inputs
  plan.run(stream.get(), dev.tensors(), f.tokens);
  o.overflow = plan.last_overflow(stream.get());  // synchronizes the stream
  // A call the fused decode kernel took (PlanOptions::decode_fused_max_tokens) makes no TwELL matrix.
  if (plan.last_path() != "decode") {
    const TwellMatrix h = plan.download_twell(stream.get());
    EXPECT_NO_THROW(validate_twell(h));
    expect_same_twell(h, pack_twell(plan.layout(), reference_gate(f.spec, f.x, f.tokens, f.w_gate), f.tokens, f.spec.d_ff, UINT32_MAX));
  } else {
    EXPECT_THROW(plan.download_twell(stream.get()), Error);
  }
  const auto bits1 = dev.y.download_vector<uint16_t>(count);
  o.unwritten = std::count(bits1.begin(), bits1.end(), uint16_t{0xFFFF});
  o.err_twell = relative_error(to_float(f.spec.dtype, bits1), ref);
  dev.y.fill(0xFF);
  plan.run(stream.get(), dev.tensors(), f.tokens);
  stream.synchronize();
  o.deterministic = dev.y.download_vector<uint16_t>(count) == bits1;
  o.y = bits1;
  o.ref = ref;
  if (with_dense) {
    DenseFfn dense(ctx, f.spec, std::max<int64_t>(1, f.tokens));
    dev.y.fill(0xFF);
    dense.run(stream.get(), dev.tensors(), f.tokens);
    stream.synchronize();
    o.err_dense = relative_error(to_float(f.spec.dtype, dev.y.download_vector<uint16_t>(count)), ref);
  }
  return o;
}

void expect_good(const Outcome& o, const std::string& what) {
  EXPECT_LT(o.err_twell, 1e-2) << what;
  EXPECT_LT(o.err_dense, 1e-2) << what << " (dense)";
  EXPECT_EQ(o.unwritten, 0u) << what;
  EXPECT_TRUE(o.deterministic) << what;
}

FfnSpec odd_spec() {
  FfnSpec s;
  s.d_model = 520;  // not a multiple of any tile
  s.d_ff = 1408;    // 5.5 tiles of 256
  return s;
}

}  // namespace

TEST(GpuFfn, RandomDensitiesAndShapes) {
  for (int64_t m : {1, 7, 1000})
    for (double d : {0.005, 0.02, 0.10, 0.50}) {
      const auto f = make_random_ffn(odd_spec(), m, d, static_cast<uint32_t>(m * 100 + d * 1000));
      expect_good(run_and_compare(f), fmt::format("M={} density={}", m, d));
    }
}

TEST(GpuFfn, LayoutsDtypesActivations) {
  FfnSpec s = odd_spec();
  s.tile_n = 64;
  s.slots = 7;
  expect_good(run_and_compare(make_random_ffn(s, 200, 0.05, 1)), "tile_n 64 slots 7");
  s = odd_spec();
  s.tile_n = 1024;
  s.slots = 255;
  expect_good(run_and_compare(make_random_ffn(s, 100, 0.05, 2)), "tile_n 1024 slots 255");
  s = odd_spec();
  s.down_layout = WeightLayout::InOut;
  expect_good(run_and_compare(make_random_ffn(s, 100, 0.05, 3)), "in_out down weight");
  s = odd_spec();
  s.dtype = DType::FP16;
  expect_good(run_and_compare(make_random_ffn(s, 100, 0.05, 4)), "fp16");
  s.d_model = 512;
  expect_good(run_and_compare(make_random_ffn(s, 100, 0.05, 4)), "fp16 d_model 512");
  s.tile_n = 128;
  expect_good(run_and_compare(make_random_ffn(s, 100, 0.05, 4)), "fp16 d_model 512 tile_n 128");
  // d_model % 64 != 0 but % 32 == 0: the wgmma gate at cta_k 32 (64-byte swizzle rows) on sm_90a,
  // whole K steps (no TMA-filled K tail).
  s.d_model = 544;
  expect_good(run_and_compare(make_random_ffn(s, 300, 0.05, 8)), "fp16 d_model 544 tile_n 128");
  s = odd_spec();
  s.d_model = 544;
  expect_good(run_and_compare(make_random_ffn(s, 1000, 0.02, 9)), "d_model 544");
  s = odd_spec();
  s.d_model = 2568;  // > 2048: the CTA-per-row consumer after the tensor-core gate
  expect_good(run_and_compare(make_random_ffn(s, 60, 0.05, 7)), "d_model 2568");
  s = odd_spec();
  s.activation = Activation::SiLU;
  s.threshold = 0.1f;
  expect_good(run_and_compare(make_random_ffn(s, 100, 0.2, 5)), "silu |a| > 0.1");
  s = odd_spec();
  s.threshold = 0.05f;
  expect_good(run_and_compare(make_random_ffn(s, 100, 0.1, 6)), "relu threshold 0.05");
}

// The sm_90a gate in clusters of 2 CTAs multicasting the w_gate tile (the default there) against the
// same kernel without clusters: the same k16 chain, so the same bits of y and of the TwELL matrix,
// and both against the CPU reference. Odd numbers of 128-row blocks leave the last cluster's second
// CTA without rows (it still multicasts its half of the tile); d_model 544 takes cta_k 32.
TEST(GpuFfn, ClusteredGateMatchesUnclustered) {
  if (context().target().arch() != "sm_90a")
    GTEST_SKIP() << "the clustered wgmma gate needs sm_90a, this context targets " << context().target().arch();
  struct Case {
    int64_t d_model, m;
    int tile_n;
  };
  for (const Case& c : {Case{512, 1, 256}, Case{512, 129, 256}, Case{512, 1000, 256}, Case{2048, 3333, 256},
                        Case{544, 700, 128}, Case{512, 515, 64}}) {
    FfnSpec s = odd_spec();
    s.d_model = c.d_model;
    s.tile_n = c.tile_n;
    s.slots = c.tile_n / 8 - 1;
    const auto f = make_random_ffn(s, c.m, 0.02, static_cast<uint32_t>(c.m * 7 + c.d_model));
    std::vector<uint16_t> y[2];
    for (int cluster : {1, 2}) {
      RandomFfn g = f;
      g.spec.gate_cluster_m = cluster;
      int gate_cluster = 0;
      for (const KernelReport& k : context().plan(g.spec, c.m, sparse()).kernels())
        if (k.kind == "gate_twell") gate_cluster = k.cluster_m;
      EXPECT_EQ(gate_cluster, cluster);
      const std::string what = fmt::format("d_model {}, M {}, tile_n {}, cluster_m {}", c.d_model, c.m, c.tile_n, cluster);
      const Outcome o = run_and_compare(g, sparse(), false);
      EXPECT_LT(o.err_twell, 1e-2) << what;
      EXPECT_EQ(o.unwritten, 0u) << what;
      EXPECT_TRUE(o.deterministic) << what;
      y[cluster - 1] = o.y;
    }
    EXPECT_TRUE(y[0] == y[1]) << "d_model " << c.d_model << ", M " << c.m << ": y differs between cluster_m 1 and 2";
  }
}

TEST(GpuFfn, PortableFeatureSetOnThisDevice) {
  ContextOptions o;
  o.target = Target{80, false};  // sm_80 PTX, compiled for this device by the driver
  Context portable(o);
  const auto f = make_random_ffn(odd_spec(), 100, 0.05, 21);
  StreamHandle stream(portable);
  FfnPlan plan = portable.plan(f.spec, f.tokens, sparse());
  EXPECT_EQ(plan.kernels()[0].arch, "sm_80");
  DeviceMemory x(portable, f.x.size() * 2), wg(portable, f.w_gate.size() * 2), wu(portable, f.w_up.size() * 2),
      wd(portable, f.w_down.size() * 2), y(portable, f.tokens * f.spec.d_model * 2);
  x.upload(f.x);
  wg.upload(f.w_gate);
  wu.upload(f.w_up);
  wd.upload(f.w_down);
  y.fill(0xFF);
  plan.run(stream.get(), {x.data(), wg.data(), wu.data(), wd.data(), y.data()}, f.tokens);
  stream.synchronize();
  const auto out = to_float(DType::BF16, y.download_vector<uint16_t>(f.tokens * f.spec.d_model));
  EXPECT_LT(relative_error(out, reference_gated_ffn(f.spec, f.x, f.tokens, f.weights())), 1e-2);
}

// time_on_stream's before_each (Dispatch::Auto's L2 eviction) comes before every call, warm-up
// included, in the order the calls are enqueued; the times are one per timed call.
TEST(GpuFfn, TimeOnStreamRunsBeforeEachBeforeEveryCall) {
  Context& ctx = context();
  StreamHandle stream(ctx);
  DeviceMemory scratch(ctx, 1 << 20);
  std::string order;
  const auto ms = time_on_stream(stream.get(), [&] { order += 'f'; }, 2, 3, [&] {
    order += 'b';
    scratch.fill(0x5A);  // real device work between the calls
  });
  EXPECT_EQ(order, "bfbfbfbfbf");
  ASSERT_EQ(ms.size(), 3u);
  EXPECT_TRUE(std::is_sorted(ms.begin(), ms.end()));
  order.clear();
  time_on_stream(stream.get(), [&] { order += 'f'; }, 1, 2);  // without one: the calls alone
  EXPECT_EQ(order, "fff");
}

TEST(GpuFfn, DispatchAutoAndDenseComputeTheSameFunction) {
  const auto f = make_random_ffn(odd_spec(), 300, 0.02, 23);
  const auto ref = reference_gated_ffn(f.spec, f.x, f.tokens, f.weights());
  Context& ctx = context();
  StreamHandle stream(ctx);
  DeviceFfn dev(ctx, f);
  for (Dispatch d : {Dispatch::Auto, Dispatch::Dense}) {
    PlanOptions o;
    o.dispatch = d;
    FfnPlan plan = ctx.plan(f.spec, f.tokens, o);
    for (int call = 0; call < 3; ++call) {  // Auto: the first call calibrates, the second uses the choice,
      if (call == 2) plan.recalibrate();     // the third calibrates again
      dev.y.fill(0xFF);
      plan.run(stream.get(), dev.tensors(), f.tokens);
      stream.synchronize();
      const auto y = to_float(DType::BF16, dev.y.download_vector<uint16_t>(f.tokens * f.spec.d_model));
      EXPECT_LT(relative_error(y, ref), 1e-2) << "dispatch " << static_cast<int>(d) << ", call " << call;
    }
    EXPECT_TRUE(plan.last_path() == "twell" || plan.last_path() == "dense");
    if (d == Dispatch::Dense) {
      EXPECT_EQ(plan.last_path(), "dense");
      EXPECT_THROW(plan.download_twell(stream.get()), Error);
    }
    std::fprintf(stderr, "[ dispatch ] %s chose %s for 300 tokens at 2%% density\n", d == Dispatch::Auto ? "Auto" : "Dense",
                 plan.last_path().c_str());
  }
}

// A non-gated layer (twell.down: no up projection) through both consumers' paths: one row per warp
// after the tensor-core gate (d_model 520, 512; several rows per warp at M = 3300), one row per CTA
// (d_model 2568: wider than the warp's registers; 514: the fma gate), fp16 and in_out weights, with
// overflowing tile-rows from the backup or recomputed (the same y bit for bit), against the CPU
// reference and the dense cuBLASLt path (two GEMMs). A w_up given to it is refused by name.
TEST(GpuFfn, NonGatedLayer) {
  struct Case {
    int64_t d_model;
    int64_t m;
    double density;
    DType dtype;
    WeightLayout down;
  };
  const std::vector<Case> cases{
      {520, 1, 0.02, DType::BF16, WeightLayout::OutIn},   {520, 300, 0.02, DType::BF16, WeightLayout::OutIn},
      {512, 3300, 0.05, DType::BF16, WeightLayout::InOut}, {2568, 60, 0.05, DType::BF16, WeightLayout::OutIn},
      {514, 100, 0.05, DType::BF16, WeightLayout::OutIn},  {512, 200, 0.05, DType::FP16, WeightLayout::InOut},
  };
  for (const Case& c : cases) {
    FfnSpec s = odd_spec();
    s.gated = false;
    s.d_model = c.d_model;
    s.dtype = c.dtype;
    s.down_layout = c.down;
    const auto f = make_random_ffn(s, c.m, c.density, static_cast<uint32_t>(c.m + c.d_model));
    expect_good(run_and_compare(f), fmt::format("non-gated: d_model {}, M {}, {}, {}", c.d_model, c.m, to_string(c.dtype),
                                                c.down == WeightLayout::InOut ? "in_out" : "out_in"));
  }
  FfnSpec s = odd_spec();
  s.gated = false;
  s.d_model = 512;
  const auto f = make_random_ffn(s, 300, 0.2, 19);  // ~51 nnz per 256-wide tile-row > 31 slots
  std::vector<uint16_t> first;
  for (uint32_t cap : {0u, 100000u}) {
    PlanOptions o = sparse();
    o.backup_capacity = cap;
    const Outcome r = run_and_compare(f, o, false);
    const std::string what = fmt::format("non-gated, backup capacity {}", cap);
    expect_good(r, what);
    EXPECT_GT(r.overflow.overflowing_tile_rows, 0u) << what;
    if (first.empty()) first = r.y;
    else EXPECT_TRUE(r.y == first) << what << ": y differs from the run with backup capacity 0";
  }
  Context& ctx = context();
  StreamHandle stream(ctx);
  FfnPlan plan = ctx.plan(f.spec, f.tokens, sparse());
  DeviceFfn dev(ctx, f);
  FfnTensors t = dev.tensors();
  t.w_up = t.w_gate;
  try {
    plan.run(stream.get(), t, f.tokens);
    ADD_FAILURE() << "a non-gated plan accepted an up weight";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::InvalidArgument);
    EXPECT_NE(std::string(e.what()).find("w_up: a non-gated FFN (FfnSpec::gated = false) has no up projection"),
              std::string::npos)
        << e.what();
  }
}

// The row-gather consumer is persistent (as many CTAs as fit on the GPU, each warp claiming rows from
// a counter): more rows than resident warps (1056 on an H200: one CTA of 8 warps per SM), so warps walk
// several rows each. Tiles of 64 with 15 slots at 20% density: tile-rows below, at and over their slots;
// d_ff 2600 (41 tiles: a full 32-tile window and a partial one), 2048 and 4096 (exactly one and two
// windows), gated and not. Each row is checked on its own (a row computed from the wrong x, skipped or
// written twice would hide in the whole output's error).
TEST(GpuFfn, RowConsumerWalksManyRowsPerWarp) {
  struct Case {
    int64_t d_ff, m;
    bool gated;
  };
  for (const Case& c : {Case{2600, 3 * 132 * 8 + 77, true}, Case{2600, 1500, false}, Case{2048, 1200, true},
                        Case{4096, 1200, true}, Case{4096, 1200, false}}) {
    FfnSpec s = odd_spec();
    s.d_model = 512;
    s.d_ff = c.d_ff;
    s.tile_n = 64;
    s.slots = 15;
    s.gated = c.gated;
    if (c.gated) s.consumer = ConsumerVariant::RowGather;
    const std::string what = fmt::format("d_ff {}, M {}, {}", c.d_ff, c.m, c.gated ? "gated" : "non-gated");
    const auto f = make_random_ffn(s, c.m, 0.2, static_cast<uint32_t>(c.d_ff + c.m));
    FfnPlan plan = context().plan(f.spec, f.tokens, sparse());
    bool rows = false;
    for (const KernelReport& k : plan.kernels()) rows |= (k.kind == "gated_down" || k.kind == "down") && k.cta_m == 8;
    ASSERT_TRUE(rows) << what << ": the plan holds no warp-per-row consumer";
    const Outcome o = run_and_compare(f, sparse(), false);
    expect_good(o, what);
    EXPECT_GT(o.overflow.overflowing_tile_rows, 0u) << what;
    const auto y = to_float(s.dtype, o.y);
    int64_t bad_rows = 0;
    for (int64_t r = 0; r < c.m; ++r) {
      double diff = 0, norm = 0;
      for (int64_t k = 0; k < s.d_model; ++k) {
        const double d = y[r * s.d_model + k] - o.ref[r * s.d_model + k];
        diff += d * d;
        norm += double{o.ref[r * s.d_model + k]} * o.ref[r * s.d_model + k];
      }
      if (std::sqrt(diff) > 1e-2 * std::sqrt(norm) + 1e-6 && ++bad_rows <= 5)
        ADD_FAILURE() << what << ", row " << r << ": relative error " << std::sqrt(diff / norm);
    }
    EXPECT_EQ(bad_rows, 0) << what << ": of " << c.m << " rows";
  }
}

// Overflowing tile-rows read from the backup or recomputed by the consumer give the same y, bit for
// bit: the recompute repeats the gate kernel's arithmetic. d_model 520: the mma_sync gate (a K tail);
// 512: on sm_90a the wgmma gate.
TEST(GpuFfn, OverflowBackupAndRecompute) {
  for (auto [d_model, consumer] : {std::pair{520, ConsumerVariant::RowGather}, std::pair{512, ConsumerVariant::RowGather},
                                   std::pair{512, ConsumerVariant::TokenBlock}}) {
    FfnSpec s = odd_spec();
    s.d_model = d_model;
    s.consumer = consumer;  // fixed: the variants round h differently, and y is compared across plans
    const auto f = make_random_ffn(s, 300, 0.2, 9);  // ~51 nnz per 256-wide tile-row > 31 slots
    std::vector<uint16_t> first;
    for (uint32_t cap : {0u, 17u, 100000u}) {
      PlanOptions o = sparse();
      o.backup_capacity = cap;
      const Outcome r = run_and_compare(f, o, false);
      const std::string what = fmt::format("d_model {}, {}, backup capacity {}", d_model, to_string(consumer), cap);
      expect_good(r, what);
      EXPECT_GT(r.overflow.overflowing_tile_rows, 0u) << what;
      EXPECT_EQ(r.overflow.recomputed, r.overflow.overflowing_tile_rows > cap) << what;
      if (first.empty()) first = r.y;
      else EXPECT_TRUE(r.y == first) << what << ": y differs from the run with backup capacity 0";
    }
  }
}

// The token-block consumer (16 rows per CTA on tensor cores) on its own: both stage shapes (d_model
// 512: 16 Wd^T rows per stage; 2048: 8), tail blocks (M % 16), tail tiles (d_ff 1408), sparse to dense
// unions and overflowing tile-rows, narrower tiles, fp16.
TEST(GpuFfn, TokenBlockConsumer) {
  auto block_spec = [](int64_t d_model, int tile_n, int slots, DType dtype) {
    FfnSpec s = odd_spec();
    s.d_model = d_model;
    s.tile_n = tile_n;
    s.slots = slots;
    s.dtype = dtype;
    s.consumer = ConsumerVariant::TokenBlock;
    return s;
  };
  struct Case {
    FfnSpec spec;
    int64_t m;
    double density;
  };
  const std::vector<Case> cases{
      {block_spec(512, 256, 31, DType::BF16), 1, 0.05},     {block_spec(512, 256, 31, DType::BF16), 37, 0.005},
      {block_spec(512, 256, 31, DType::BF16), 1000, 0.02},  {block_spec(512, 256, 31, DType::BF16), 300, 0.3},
      {block_spec(2048, 256, 31, DType::BF16), 100, 0.05},  {block_spec(2048, 256, 31, DType::BF16), 45, 0.25},
      {block_spec(512, 64, 7, DType::BF16), 200, 0.05},     {block_spec(512, 128, 15, DType::FP16), 200, 0.05},
      {block_spec(1024, 256, 31, DType::FP16), 64, 0.10},
  };
  for (const Case& c : cases) {
    const std::string what = fmt::format("token block: d_model {}, tile_n {}, {}, M {}, density {}", c.spec.d_model,
                                         *c.spec.tile_n, to_string(c.spec.dtype), c.m, c.density);
    const auto f = make_random_ffn(c.spec, c.m, c.density, static_cast<uint32_t>(c.m * 31 + c.spec.d_model));
    FfnPlan plan = context().plan(f.spec, f.tokens, sparse());
    bool block = false;
    for (const KernelReport& k : plan.kernels()) block |= k.kind == "gated_down" && k.consumer == "token_block";
    EXPECT_TRUE(block) << what << ": the plan holds no token-block consumer";
    expect_good(run_and_compare(f), what);
  }
}

TEST(GpuFfn, BackupGrowsAfterOverflow) {
  Context& ctx = context();
  const auto f = make_random_ffn(odd_spec(), 64, 0.3, 12);
  PlanOptions o = sparse();
  o.backup_capacity = 1;
  FfnPlan plan = ctx.plan(f.spec, f.tokens, o);
  StreamHandle stream(ctx);
  DeviceFfn dev(ctx, f);
  plan.run(stream.get(), dev.tensors(), f.tokens);
  const auto first = plan.last_overflow(stream.get());
  ASSERT_TRUE(first.recomputed);
  plan.run(stream.get(), dev.tensors(), f.tokens);
  const auto second = plan.last_overflow(stream.get());
  EXPECT_FALSE(second.recomputed);
  EXPECT_GE(second.backup_capacity, first.overflowing_tile_rows);
}

TEST(GpuFfn, AllZeroAndAllActiveRows) {
  auto f = make_random_ffn(odd_spec(), 16, 0.02, 13);
  const int64_t K = f.spec.d_model;
  for (int64_t k = 0; k < K; ++k) f.x[3 * K + k] = 0;                 // row 3: g = 0, nothing active, y = 0
  f.x[5 * K] = float_to_bf16(-100.0f);  // row 5: column 0 of Wg holds -shift < 0, so every neuron is active
  for (int64_t k = 1; k < K; ++k) f.x[5 * K + k] = float_to_bf16(0.001f);
  // The TwELL path (16 rows would take the fused decode kernel, which makes no TwELL matrix): the
  // saturated row overflows its tile-rows' slots.
  PlanOptions twell_path = sparse();
  twell_path.decode_fused_max_tokens = 0;
  twell_path.decode_max_tokens = 0;
  const Outcome o = run_and_compare(f, twell_path);
  expect_good(o, "zero and saturated rows, TwELL path");
  EXPECT_GT(o.overflow.overflowing_tile_rows, 5u);
  // The fused decode kernel on the same rows: every neuron of row 5 is one of its pairs.
  expect_good(run_and_compare(f), "zero and saturated rows, fused decode kernel");
}

TEST(GpuFfn, NaNInXPropagatesLikeDense) {
  auto f = make_random_ffn(odd_spec(), 8, 0.02, 14);
  f.x[2 * f.spec.d_model + 7] = 0x7FC0;  // NaN in row 2
  Context& ctx = context();
  StreamHandle stream(ctx);
  FfnPlan plan = ctx.plan(f.spec, f.tokens, sparse());
  DeviceFfn dev(ctx, f);
  plan.run(stream.get(), dev.tensors(), f.tokens);
  stream.synchronize();
  const auto y = to_float(f.spec.dtype, dev.y.download_vector<uint16_t>(f.tokens * f.spec.d_model));
  const auto ref = reference_gated_ffn(f.spec, f.x, f.tokens, f.weights());
  const int64_t K = f.spec.d_model;
  for (int64_t i = 0; i < K; ++i) ASSERT_TRUE(std::isnan(y[2 * K + i]) && std::isnan(ref[2 * K + i])) << i;
  EXPECT_LT(relative_error(y, ref), 1e-2);  // rows other than 2 match; NaN positions agree
}

// The consumer alone over an uploaded TwELL matrix (the one a full run wrote, through the host) gives
// that run's y bit for bit; run_consumer checks its token count.
TEST(GpuFfn, ConsumerAloneOverAnUploadedMatrix) {
  Context& ctx = context();
  const auto f = make_random_ffn(odd_spec(), 300, 0.02, 31);
  StreamHandle stream(ctx);
  FfnPlan plan = ctx.plan(f.spec, f.tokens, sparse());
  DeviceFfn dev(ctx, f);
  const size_t count = f.tokens * f.spec.d_model;
  dev.y.fill(0xFF);
  plan.run(stream.get(), dev.tensors(), f.tokens);
  const TwellMatrix h = plan.download_twell(stream.get());
  const auto y_full = dev.y.download_vector<uint16_t>(count);

  FfnPlan other = ctx.plan(f.spec, f.tokens, sparse());
  EXPECT_THROW(other.run_consumer(stream.get(), dev.tensors(), f.tokens), Error);  // no matrix yet
  other.upload_twell(stream.get(), h);
  EXPECT_THROW(other.run_consumer(stream.get(), dev.tensors(), f.tokens - 1), Error);
  dev.y.fill(0xFF);
  other.run_consumer(stream.get(), dev.tensors(), f.tokens);
  stream.synchronize();
  EXPECT_EQ(dev.y.download_vector<uint16_t>(count), y_full);
  TwellMatrix wrong = h;
  wrong.d_ff += 1;
  EXPECT_THROW(other.upload_twell(stream.get(), wrong), Error);
}

TEST(GpuFfn, StridedTensors) {
  const auto f = make_random_ffn(odd_spec(), 50, 0.05, 15);
  Context& ctx = context();
  StreamHandle stream(ctx);
  FfnPlan plan = ctx.plan(f.spec, f.tokens, sparse());
  const int64_t K = f.spec.d_model, ld = K + 8;
  std::vector<uint16_t> xs(f.tokens * ld, float_to_bf16(1e30f));
  for (int64_t r = 0; r < f.tokens; ++r) std::copy_n(&f.x[r * K], K, &xs[r * ld]);
  DeviceFfn dev(ctx, f);
  DeviceMemory xd(ctx, xs.size() * 2), yd(ctx, f.tokens * ld * 2);
  xd.upload(xs);
  yd.fill(0xFF);
  FfnTensors t = dev.tensors();
  t.x = xd.data();
  t.ld_x = ld;
  t.y = yd.data();
  t.ld_y = ld;
  plan.run(stream.get(), t, f.tokens);
  stream.synchronize();
  const auto ys = yd.download_vector<uint16_t>(f.tokens * ld);
  std::vector<uint16_t> y(f.tokens * K);
  for (int64_t r = 0; r < f.tokens; ++r) {
    std::copy_n(&ys[r * ld], K, &y[r * K]);
    for (int64_t i = K; i < ld; ++i) EXPECT_EQ(ys[r * ld + i], 0xFFFF) << "wrote outside the row";
  }
  EXPECT_LT(relative_error(to_float(DType::BF16, y), reference_gated_ffn(f.spec, f.x, f.tokens, f.weights())), 1e-2);
}

// The split with every operand strided and offset 16 bytes into its allocation (cuBLASLt must be told
// the alignment: its default assumption is 256 bytes), inputs' padding poisoned with NaN, y's padding
// checked untouched; zero tokens; the TwELL part alone (run_gate + run_consumer: y is the TwELL
// neurons' part, checked against the CPU reference of those neurons); a matrix of the wrong d_ff.
TEST(GpuFfn, DenseNeuronsSplitStridedAndPartial) {
  FfnSpec s;
  s.d_model = 512;
  s.d_ff = 1408;
  RandomFfn f = make_random_ffn(s, 300, 0.02, 41);
  const RandomFfn hot = make_random_ffn(s, 300, 0.4, 41);
  for (int64_t j = 0; j < 256; ++j) f.w_gate[j * s.d_model] = hot.w_gate[j * s.d_model];  // neurons 0..255 hot
  const int64_t k = 256, K = s.d_model, N = s.d_ff, off = 8;  // 8 elements = 16 bytes
  Context& ctx = context();
  StreamHandle stream(ctx);
  const uint16_t nan = 0x7FC0;
  auto strided = [&](const std::vector<uint16_t>& v, int64_t rows, int64_t cols, int64_t ld) {
    std::vector<uint16_t> out(off + rows * ld, nan);
    for (int64_t r = 0; r < rows; ++r) std::copy_n(&v[r * cols], cols, &out[off + r * ld]);
    DeviceMemory m(ctx, out.size() * 2);
    m.upload(out);
    return m;
  };
  const int64_t ldx = K + 8, ldg = K + 16, ldu = K + 24, ldd = N + 8, ldy = K + 32;
  DeviceMemory x = strided(f.x, f.tokens, K, ldx), wg = strided(f.w_gate, N, K, ldg), wu = strided(f.w_up, N, K, ldu),
               wd = strided(f.w_down, K, N, ldd), y(ctx, (off + f.tokens * ldy) * 2);
  auto at = [&](const DeviceMemory& m) { return static_cast<uint16_t*>(m.data()) + off; };
  const FfnTensors t{at(x), at(wg), at(wu), at(wd), at(y), ldx, ldg, ldu, ldd, ldy};
  auto read_y = [&] {
    const auto all = y.download_vector<uint16_t>(off + f.tokens * ldy);
    std::vector<uint16_t> out(f.tokens * K);
    int64_t outside = 0;
    for (int64_t i = 0; i < off; ++i) outside += all[i] != 0xFFFF;
    for (int64_t r = 0; r < f.tokens; ++r) {
      std::copy_n(&all[off + r * ldy], K, &out[r * K]);
      for (int64_t i = K; i < ldy; ++i) outside += all[off + r * ldy + i] != 0xFFFF;
    }
    EXPECT_EQ(outside, 0) << "wrote outside the rows of y";
    return to_float(DType::BF16, out);
  };
  for (Dispatch d : {Dispatch::Sparse, Dispatch::Auto}) {
    PlanOptions o;
    o.dispatch = d;
    o.dense_neurons = k;
    FfnPlan plan = ctx.plan(s, f.tokens, o);
    y.fill(0xFF);
    plan.run(stream.get(), t, f.tokens);
    plan.run(stream.get(), t, 0);  // zero tokens: a no-op
    stream.synchronize();
    EXPECT_LT(relative_error(read_y(), reference_gated_ffn(s, f.x, f.tokens, f.weights())), 1e-2) << static_cast<int>(d);
    if (d != Dispatch::Sparse) continue;
    // The TwELL part alone: neurons k..N-1.
    FfnSpec cold = s;
    cold.d_ff = N - k;
    std::vector<uint16_t> cg(f.w_gate.begin() + k * K, f.w_gate.end()), cu(f.w_up.begin() + k * K, f.w_up.end()), cd(K * (N - k));
    for (int64_t r = 0; r < K; ++r) std::copy_n(&f.w_down[r * N + k], N - k, &cd[r * (N - k)]);
    y.fill(0xFF);
    plan.run_gate(stream.get(), t, f.tokens);
    plan.run_consumer(stream.get(), t, f.tokens);
    stream.synchronize();
    EXPECT_LT(relative_error(read_y(), reference_gated_ffn(cold, f.x, f.tokens, HostFfnWeights{cg, cu, cd})), 1e-2);
    TwellMatrix m = plan.download_twell(stream.get());
    EXPECT_EQ(m.d_ff, N - k);
    m.d_ff = N;  // a valid matrix (every tile-row empty) over all the neurons
    m.words.assign(f.tokens * m.layout.words_per_row(N), 0u);
    m.backup.clear();
    m.overflow_count = 0;
    try {
      plan.upload_twell(stream.get(), m);
      ADD_FAILURE() << "accepted a TwELL matrix over all d_ff neurons";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("m.d_ff: expected 1152 (the plan's TwELL neurons: d_ff 1408 minus dense_neurons 256)"),
                std::string::npos) << e.what();
    }
  }
}

// The dense path's fused gated-up kernel (DenseKernels::FusedGatedUp) against the CPU reference and the
// cuBLASLt path: token counts that leave partial 128-row blocks and odd cluster pairs, d_ff that is not
// a multiple of its 128-column tile, both dtypes, SiLU with a threshold, accumulate onto y, bit-identical
// runs, poisoned outputs; unaligned operands and calls of at most 64 tokens take the cuBLASLt kernels.
TEST(GpuFfn, DenseFusedGatedUp) {
  struct Case {
    int64_t d_model, d_ff, m;
    DType dtype;
    Activation act;
  };
  Context& ctx = context();
  StreamHandle stream(ctx);
  for (const Case c : {Case{512, 1408, 1, DType::BF16, Activation::ReLU}, Case{512, 1408, 65, DType::BF16, Activation::ReLU},
                       Case{512, 1400, 300, DType::BF16, Activation::ReLU},
                       Case{2048, 5632, 1000, DType::BF16, Activation::ReLU}, Case{512, 1408, 777, DType::FP16, Activation::ReLU},
                       Case{1024, 2816, 513, DType::BF16, Activation::SiLU},
                       // d_ff 192: the second half-box of each 128-column weight tile (rank 1's) lies
                       // wholly past d_ff in the last tile (TMA zero fill)
                       Case{512, 192, 300, DType::BF16, Activation::ReLU}}) {
    FfnSpec s;
    s.d_model = c.d_model;
    s.d_ff = c.d_ff;
    s.dtype = c.dtype;
    s.activation = c.act;
    s.threshold = c.act == Activation::SiLU ? 0.02f : 0.0f;
    const RandomFfn f = make_random_ffn(s, c.m, 0.3, 51);  // dense-ish: every part of h matters
    const std::string what = fmt::format("d_model {} d_ff {} M {} {} {}", c.d_model, c.d_ff, c.m, to_string(c.dtype), to_string(c.act));
    const auto ref = reference_gated_ffn(s, f.x, f.tokens, f.weights());
    DeviceFfn dev(ctx, f);
    DenseFfn fused(ctx, s, c.m, DenseKernels::FusedGatedUp), plain(ctx, s, c.m);
    EXPECT_TRUE(fused.fused()) << what;
    EXPECT_FALSE(plain.fused()) << what;
    const size_t count = c.m * c.d_model;
    dev.y.fill(0xFF);
    fused.run(stream.get(), dev.tensors(), c.m);
    stream.synchronize();
    const auto bits = dev.y.download_vector<uint16_t>(count);
    EXPECT_EQ(std::count(bits.begin(), bits.end(), uint16_t{0xFFFF}), 0) << what;
    const auto y_fused = to_float(c.dtype, bits);
    EXPECT_LT(relative_error(y_fused, ref), 1e-2) << what;
    dev.y.fill(0xFF);
    fused.run(stream.get(), dev.tensors(), c.m);
    stream.synchronize();
    EXPECT_EQ(dev.y.download_vector<uint16_t>(count), bits) << what << ": not bit-identical across runs";
    dev.y.fill(0xFF);
    plain.run(stream.get(), dev.tensors(), c.m);
    stream.synchronize();
    const auto y_plain = to_float(c.dtype, dev.y.download_vector<uint16_t>(count));
    EXPECT_LT(relative_error(y_plain, ref), 1e-2) << what;
    // The two paths agree about as closely as each agrees with the reference.
    EXPECT_LT(relative_error(y_fused, y_plain), 2e-2) << what;
    // The baseline's cuBLAS GEMMs (DenseKernels::CuBlas, as PyTorch calls them): the same function.
    DenseFfn blas(ctx, s, c.m, DenseKernels::CuBlas);
    dev.y.fill(0xFF);
    blas.run(stream.get(), dev.tensors(), c.m);
    stream.synchronize();
    const auto blas_bits = dev.y.download_vector<uint16_t>(count);
    EXPECT_EQ(std::count(blas_bits.begin(), blas_bits.end(), uint16_t{0xFFFF}), 0) << what << " (cuBLAS)";
    EXPECT_LT(relative_error(to_float(c.dtype, blas_bits), ref), 1e-2) << what << " (cuBLAS)";
    // cuBLASLt with its candidates timed at the first run (scratch C: y is written once, by the run).
    DenseFfn tuned(ctx, s, c.m, DenseKernels::CuBlasLtTuned);
    for (int run = 0; run < 2; ++run) {  // the first run times the candidates, the second reuses the choice
      dev.y.fill(0xFF);
      tuned.run(stream.get(), dev.tensors(), c.m);
      stream.synchronize();
      const auto tuned_bits = dev.y.download_vector<uint16_t>(count);
      EXPECT_EQ(std::count(tuned_bits.begin(), tuned_bits.end(), uint16_t{0xFFFF}), 0) << what << " (cuBLASLt tuned)";
      EXPECT_LT(relative_error(to_float(c.dtype, tuned_bits), ref), 1e-2) << what << " (cuBLASLt tuned, run " << run << ")";
    }
    // accumulate: y += FFN(x) on top of the y just written (2 FFN(x) up to the rounding).
    fused.run(stream.get(), dev.tensors(), c.m, /*accumulate=*/true);
    stream.synchronize();
    std::vector<float> twice(ref.size());
    for (size_t i = 0; i < ref.size(); ++i) twice[i] = 2 * ref[i];
    EXPECT_LT(relative_error(to_float(c.dtype, dev.y.download_vector<uint16_t>(count)), twice), 1e-2) << what;
    std::fprintf(stderr, "[ fused ] %s: rel. error fused %.3e, cuBLASLt %.3e\n", what.c_str(), relative_error(y_fused, ref),
                 relative_error(y_plain, ref));
  }
  // x 2-byte aligned only: the cuBLASLt kernels take it (the fused one needs 16 bytes), same function;
  // 96 tokens, past the 64 that take cuBLASLt anyway.
  FfnSpec s;
  s.d_model = 512;
  s.d_ff = 1408;
  const RandomFfn f = make_random_ffn(s, 96, 0.3, 53);
  std::vector<uint16_t> shifted(f.x.size() + 1);
  std::copy(f.x.begin(), f.x.end(), shifted.begin() + 1);
  DeviceMemory xs(ctx, shifted.size() * 2);
  xs.upload(shifted);
  DeviceFfn dev(ctx, f);
  FfnTensors t = dev.tensors();
  t.x = static_cast<const uint16_t*>(xs.data()) + 1;
  DenseFfn fused(ctx, s, 96, DenseKernels::FusedGatedUp);
  dev.y.fill(0xFF);
  fused.run(stream.get(), t, 96);
  stream.synchronize();
  EXPECT_LT(relative_error(to_float(DType::BF16, dev.y.download_vector<uint16_t>(96 * 512)),
                           reference_gated_ffn(s, f.x, f.tokens, f.weights())), 1e-2);
}

// permute_neurons on the device against the host version, bit for bit: gated out_in with strided
// inputs, gated in_out, non-gated; bad arguments named (overlap, host memory, a bad order).
TEST(GpuFfn, PermuteNeuronsOnDevice) {
  Context& ctx = context();
  StreamHandle stream(ctx);
  struct Case {
    WeightLayout down;
    bool gated;
  };
  for (const Case c : {Case{WeightLayout::OutIn, true}, Case{WeightLayout::InOut, true}, Case{WeightLayout::OutIn, false}}) {
    FfnSpec s;
    s.d_model = 72;
    s.d_ff = 200;
    s.down_layout = c.down;
    s.gated = c.gated;
    const RandomFfn f = make_random_ffn(s, 1, 0.1, 61);
    std::vector<int64_t> order(s.d_ff);
    for (int64_t i = 0; i < s.d_ff; ++i) order[i] = (i * 37 + 11) % s.d_ff;  // 37 is coprime to 200
    std::vector<uint16_t> g = f.w_gate, u = f.w_up, d = f.w_down;
    permute_neurons(s, order, g, u, d);  // the host version: the expected result
    const int64_t pad = 8;               // the inputs strided: rows of the stored length + 8
    const bool in_out = c.down == WeightLayout::InOut;
    auto strided = [&](const std::vector<uint16_t>& v, int64_t rows, int64_t cols) {
      std::vector<uint16_t> out(rows * (cols + pad), 0x7FC0);
      for (int64_t r = 0; r < rows; ++r) std::copy_n(&v[r * cols], cols, &out[r * (cols + pad)]);
      DeviceMemory m(ctx, out.size() * 2);
      m.upload(out);
      return m;
    };
    const int64_t n = s.d_ff, k = s.d_model, down_rows = in_out ? n : k, down_cols = in_out ? k : n;
    DeviceMemory ig = strided(f.w_gate, n, k), iu = strided(c.gated ? f.w_up : std::vector<uint16_t>(n * k), n, k),
                 id = strided(f.w_down, down_rows, down_cols);
    DeviceMemory og(ctx, n * k * 2), ou(ctx, n * k * 2), od(ctx, n * k * 2);
    og.fill(0xFF);
    ou.fill(0xFF);
    od.fill(0xFF);
    FfnTensors in{};
    in.w_gate = ig.data();
    in.w_up = c.gated ? iu.data() : nullptr;
    in.w_down = id.data();
    in.ld_gate = in.ld_up = k + pad;
    in.ld_down = down_cols + pad;
    DeviceFfnWeights out{og.data(), c.gated ? ou.data() : nullptr, od.data()};
    permute_neurons(ctx, stream.get(), s, order, in, out);
    EXPECT_EQ(og.download_vector<uint16_t>(n * k), g);
    if (c.gated) {
      EXPECT_EQ(ou.download_vector<uint16_t>(n * k), u);
    }
    EXPECT_EQ(od.download_vector<uint16_t>(n * k), d) << to_string(c.down);
    if (c.down != WeightLayout::OutIn || !c.gated) continue;
    auto message = [&](auto&& call) {
      try {
        call();
      } catch (const Error& e) {
        return std::string(e.what());
      }
      return std::string("no error");
    };
    DeviceFfnWeights overlap = out;
    overlap.w_gate = ig.data();
    EXPECT_NE(message([&] { permute_neurons(ctx, stream.get(), s, order, in, overlap); }).find("out.w_gate: must not overlap in.w_gate"),
              std::string::npos);
    std::vector<uint16_t> host(n * k);
    DeviceFfnWeights on_host = out;
    on_host.w_up = host.data();
    EXPECT_NE(message([&] { permute_neurons(ctx, stream.get(), s, order, in, on_host); }).find("out.w_up: expected device memory"),
              std::string::npos);
    auto twice = order;
    twice[3] = twice[4];
    EXPECT_NE(message([&] { permute_neurons(ctx, stream.get(), s, twice, in, out); }).find("appears twice"), std::string::npos);
  }
}

TEST(GpuFfn, BadArgumentsAreNamedAndHarmless) {
  const auto f = make_random_ffn(odd_spec(), 10, 0.05, 16);
  Context& ctx = context();
  StreamHandle stream(ctx);
  FfnPlan plan = ctx.plan(f.spec, f.tokens, sparse());
  DeviceFfn dev(ctx, f);
  auto message = [&](FfnTensors t, int64_t tokens) {
    try {
      plan.run(stream.get(), t, tokens);
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::InvalidArgument);
      return std::string(e.what());
    }
    return std::string("(no error)");
  };
  FfnTensors t = dev.tensors();
  t.x = nullptr;
  EXPECT_NE(message(t, 10).find("x: expected a device pointer, got null"), std::string::npos);
  t = dev.tensors();
  t.w_up = nullptr;
  EXPECT_NE(message(t, 10).find("w_up: expected a device pointer (the up weight of a gated layer; a layer without one is "
                                "FfnSpec::gated = false), got null"),
            std::string::npos);
  t = dev.tensors();
  t.w_up = static_cast<const char*>(t.w_up) + 1;
  EXPECT_NE(message(t, 10).find("w_up: expected a 2-byte aligned device pointer"), std::string::npos);
  std::vector<uint16_t> host(f.x);
  t = dev.tensors();
  t.x = host.data();
  EXPECT_NE(message(t, 10).find("x: expected device memory"), std::string::npos);
  t = dev.tensors();
  EXPECT_NE(message(t, 11).find("tokens: expected 0..10"), std::string::npos);
  EXPECT_NE(message(t, -1).find("tokens: expected 0..10"), std::string::npos);
  t.ld_down = 5;
  EXPECT_NE(message(t, 10).find("ld_down: expected a row stride >= 1408"), std::string::npos);
  t = dev.tensors();
  t.x = static_cast<const char*>(t.x) + 4;  // 2-byte aligned, not 16: the tensor-core gate needs 16
  EXPECT_NE(message(t, 9).find("x: expected a 16-byte aligned device pointer"), std::string::npos) << message(t, 9);
  t = dev.tensors();
  t.ld_x = 521;  // >= d_model but not a multiple of 8
  EXPECT_NE(message(t, 9).find("ld_x: expected a row stride that is a multiple of 8"), std::string::npos) << message(t, 9);
  t = dev.tensors();
  t.y = const_cast<void*>(t.x);
  EXPECT_NE(message(t, 10).find("y: must not overlap x"), std::string::npos);
  // The plan still works after the errors.
  dev.y.fill(0xFF);
  plan.run(stream.get(), dev.tensors(), 10);
  plan.run(stream.get(), dev.tensors(), 0);  // zero tokens: a no-op
  stream.synchronize();
  const auto y = to_float(DType::BF16, dev.y.download_vector<uint16_t>(10 * 520));
  EXPECT_LT(relative_error(y, reference_gated_ffn(f.spec, f.x, f.tokens, f.weights())), 1e-2);
}


namespace {
// The hot/cold split (PlanOptions::dense_neurons) end to end: calibrate the activity with a TwELL run,
// order the weights hot-first on the host, then for several splits (and the cost model's choice) run
// the split plan on the permuted weights and compare y with the CPU reference of the ORIGINAL weights
// (the permutation must not change the function), the TwELL part's matrix with the CPU packing of the
// sparse neurons' columns, y bit for bit across two runs, and no poisoned element left.
void check_split(const RandomFfn& original, std::vector<int64_t> splits, const std::string& what) {
  Context& ctx = context();
  StreamHandle stream(ctx);
  const FfnSpec& s = original.spec;
  const int64_t tokens = original.tokens, count = tokens * s.d_model;
  const auto ref = reference_gated_ffn(s, original.x, tokens, original.weights());
  std::vector<uint64_t> activity;
  {
    DeviceFfn dev(ctx, original);
    FfnPlan calibration = ctx.plan(s, tokens, sparse());
    calibration.run(stream.get(), dev.tensors(), tokens);
    calibration.last_overflow(stream.get());
    calibration.run(stream.get(), dev.tensors(), tokens);  // with the backup grown to fit: every count known
    activity = neuron_activity(calibration.download_twell(stream.get()));
  }
  const std::vector<int64_t> order = hot_first_order(activity);
  const std::vector<uint64_t> sorted = in_order(activity, order);
  RandomFfn f = original;
  permute_neurons(s, order, f.w_gate, f.w_up, f.w_down);
  SplitCostModel model;
  model.granularity = 64;
  const int64_t chosen = choose_dense_neurons(s, tokens, sorted, tokens, model);
  splits.push_back(chosen);
  const std::vector<uint16_t> gate = reference_gate(s, f.x, tokens, f.w_gate);  // permuted: hot first
  DeviceFfn dev(ctx, f);
  for (int64_t k : splits) {
    for (Dispatch d : {Dispatch::Sparse, Dispatch::Auto}) {
      PlanOptions o;
      o.dispatch = d;
      o.dense_neurons = k;
      FfnPlan plan = ctx.plan(s, tokens, o);
      const std::string label = fmt::format("{}, dense_neurons {}{}, {}", what, k, k == chosen ? " (the cost model's)" : "",
                                            d == Dispatch::Sparse ? "Sparse" : "Auto");
      dev.y.fill(0xFF);
      plan.run(stream.get(), dev.tensors(), tokens);
      stream.synchronize();
      const auto bits = dev.y.download_vector<uint16_t>(count);
      EXPECT_EQ(std::count(bits.begin(), bits.end(), uint16_t{0xFFFF}), 0) << label;
      const double err = relative_error(to_float(s.dtype, bits), ref);
      EXPECT_LT(err, 1e-2) << label;
      dev.y.fill(0xFF);
      plan.run(stream.get(), dev.tensors(), tokens);
      stream.synchronize();
      EXPECT_EQ(dev.y.download_vector<uint16_t>(count), bits) << label << ": not bit-identical across runs";
      if (d == Dispatch::Sparse) {
        plan.last_overflow(stream.get());
        const TwellMatrix h = plan.download_twell(stream.get());
        EXPECT_EQ(h.d_ff, s.d_ff - k) << label;
        EXPECT_NO_THROW(validate_twell(h)) << label;
        std::vector<uint16_t> cold(tokens * (s.d_ff - k));
        for (int64_t r = 0; r < tokens; ++r)
          std::copy_n(gate.begin() + r * s.d_ff + k, s.d_ff - k, cold.begin() + r * (s.d_ff - k));
        expect_same_twell(h, pack_twell(plan.layout(), cold, tokens, s.d_ff - k, UINT32_MAX));
      }
      std::fprintf(stderr, "[ split ] %s: rel. error %.3e, path %s\n", label.c_str(), err, plan.last_path().c_str());
    }
  }
}
}  // namespace

// A layer whose every sixth neuron fires for about half the tokens and the rest for 1%: the split moves
// the hot ones to cuBLASLt. bf16 out_in, fp16 in_out, and a non-gated layer.
TEST(GpuFfn, DenseNeuronsSplit) {
  struct Case {
    DType dtype;
    WeightLayout down;
    bool gated;
  };
  for (const Case c : {Case{DType::BF16, WeightLayout::OutIn, true}, Case{DType::FP16, WeightLayout::InOut, true},
                       Case{DType::BF16, WeightLayout::OutIn, false}}) {
    FfnSpec s;
    s.d_model = 512;
    s.d_ff = 1408;
    s.dtype = c.dtype;
    s.down_layout = c.down;
    s.gated = c.gated;
    RandomFfn f = make_random_ffn(s, 777, 0.01, 31);
    const RandomFfn hot = make_random_ffn(s, 777, 0.5, 31);  // the same weights but for the shift column
    for (int64_t j = 0; j < s.d_ff; j += 6) f.w_gate[j * s.d_model] = hot.w_gate[j * s.d_model];  // (an in_out w_down
    // holds the same random values read as [d_ff, d_model]: any values do)
    check_split(f, {64, 256, 1344}, fmt::format("{} {} {}", to_string(c.dtype), to_string(c.down), c.gated ? "gated" : "non-gated"));
  }
}

namespace {
void check_real_layer(const std::vector<SafeTensors>& files, int layer, bool random_up_down, int64_t max_rows, int slots,
                      ConsumerVariant consumer = ConsumerVariant::RowGather) {
  const LayerData d = load_layer(files, layer, random_up_down);
  RandomFfn f;
  f.spec.d_model = d.d_model;
  f.spec.d_ff = d.d_ff;
  f.spec.slots = slots;
  f.spec.consumer = consumer;
  f.tokens = std::min(d.tokens, max_rows);
  f.x.assign(d.x.begin(), d.x.begin() + f.tokens * d.d_model);
  f.w_gate = d.w_gate;
  f.w_up = d.w_up;
  f.w_down = d.w_down;
  const Outcome o = run_and_compare(f);
  expect_good(o, fmt::format("real layer {} slots {} {}", layer, slots, to_string(consumer)));
  std::fprintf(stderr, "[ real ] layer %d, %lld tokens, slots %d, %s: TwELL rel. error %.3e, dense %.3e, %u overflowing tile-rows\n",
               layer, static_cast<long long>(f.tokens), slots, to_string(consumer), o.err_twell, o.err_dense,
               o.overflow.overflowing_tile_rows);
}
}  // namespace

TEST(GpuFfnRealData, EmbeddedSample) {
  const std::vector<SafeTensors> files{SafeTensors::read(sample_path())};
  check_real_layer(files, 1, false, 1024, 31);
  check_real_layer(files, 1, false, 1024, 63);
  check_real_layer(files, 1, false, 1024, 31, ConsumerVariant::TokenBlock);
}

TEST(GpuFfnRealData, TinyBothLayers) {
  const auto file = shared_data_dir() / "tiny_l01.safetensors";
  if (!std::filesystem::exists(file)) GTEST_SKIP() << "real data not found: " << file.string();
  const std::vector<SafeTensors> files{SafeTensors::read(file)};
  check_real_layer(files, 0, false, 1024, 31);
  check_real_layer(files, 1, false, 1024, 31);
  check_real_layer(files, 0, false, 1024, 31, ConsumerVariant::TokenBlock);
  check_real_layer(files, 1, false, 1024, 31, ConsumerVariant::TokenBlock);
}

TEST(GpuFfnRealData, PaperLayer1) {
  const auto dir = shared_data_dir();
  for (const char* n : {"paper_l1_gate_a.safetensors", "paper_l1_gate_b.safetensors", "paper_l1_x.safetensors"})
    if (!std::filesystem::exists(dir / n)) GTEST_SKIP() << "real data not found: " << (dir / n).string();
  const std::vector<SafeTensors> files{SafeTensors::read(dir / "paper_l1_gate_a.safetensors"),
                                       SafeTensors::read(dir / "paper_l1_gate_b.safetensors"),
                                       SafeTensors::read(dir / "paper_l1_x.safetensors")};
  check_real_layer(files, 1, true, 1024, 31);
  check_real_layer(files, 1, true, 1024, 31, ConsumerVariant::TokenBlock);
}

// The split on real layers: the activity of real x and Wg picks the dense neurons.
TEST(GpuFfnRealData, DenseNeuronsSplitOnRealLayers) {
  const auto split = [](const std::vector<SafeTensors>& files, int layer, bool random_up_down, std::vector<int64_t> splits) {
    const LayerData d = load_layer(files, layer, random_up_down);
    RandomFfn f;
    f.spec.d_model = d.d_model;
    f.spec.d_ff = d.d_ff;
    f.tokens = std::min<int64_t>(d.tokens, 512);
    f.x.assign(d.x.begin(), d.x.begin() + f.tokens * d.d_model);
    f.w_gate = d.w_gate;
    f.w_up = d.w_up;
    f.w_down = d.w_down;
    check_split(f, std::move(splits), fmt::format("real layer {} ({}, {} tokens)", layer, d.sources.front(), f.tokens));
  };
  split({SafeTensors::read(sample_path())}, 1, false, {128, 640});
  const auto dir = shared_data_dir();
  for (const char* n : {"paper_l1_gate_a.safetensors", "paper_l1_gate_b.safetensors", "paper_l1_x.safetensors"})
    if (!std::filesystem::exists(dir / n)) GTEST_SKIP() << "real data not found: " << (dir / n).string();
  split({SafeTensors::read(dir / "paper_l1_gate_a.safetensors"), SafeTensors::read(dir / "paper_l1_gate_b.safetensors"),
         SafeTensors::read(dir / "paper_l1_x.safetensors")},
        1, true, {1024, 4096});
}

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  if (!context().has_gpu()) {
    std::fprintf(stderr,
                 "\n*** SKIPPED: twell_gpu_tests need a GPU: %s ***\n*** None of the GPU tests ran. ***\n\n",
                 context().no_gpu_reason().c_str());
    return 77;
  }
  return RUN_ALL_TESTS();
}

namespace {
// The values of a TwELL matrix, densely: each tile-row from its entries or its backup row; a
// tile-row that overflowed a full backup (to be recomputed by the consumer) reads 0xFFFF throughout.
// (Backup slots are claimed with an atomic, so their order may differ between runs: compare these.)
std::vector<uint16_t> twell_values(const TwellMatrix& m) {
  const TwellLayout& l = m.layout;
  const int64_t tiles = l.tiles(m.d_ff), wpr = l.words_per_row(m.d_ff);
  std::vector<uint16_t> out(m.rows * tiles * l.tile_n, 0);
  for (int64_t r = 0; r < m.rows; ++r)
    for (int64_t t = 0; t < tiles; ++t) {
      const uint32_t* w = &m.words[r * wpr + t * (l.slots + 1)];
      uint16_t* o = &out[(r * tiles + t) * l.tile_n];
      if (w[0] <= static_cast<uint32_t>(l.slots)) {
        for (uint32_t e = 0; e < w[0]; ++e) o[w[1 + e] & 0xFFFFu] = static_cast<uint16_t>(w[1 + e] >> 16);
      } else if (w[1] == kBackupMissing) {
        std::fill_n(o, l.tile_n, uint16_t{0xFFFF});
      } else {
        std::copy_n(m.backup.begin() + int64_t{w[1]} * l.tile_n, l.tile_n, o);
      }
    }
  return out;
}

// One decode-vs-large-M comparison: the same inputs through a plan whose runs of <= 64 tokens take the
// decode kernels and one without them (decode_max_tokens = 0): the TwELL matrices must hold the same
// values and y the same bits (the four decode kernels repeat the gate's k16 chain and the row
// consumer's sums; the fused kernel, which sums the gate in another order, within 1e-2 and its own bits
// run to run), both near the CPU reference, no output element left poisoned. Rows sit in a strided x and y
// whose padding is poisoned (NaN in x, 0xFFFF in y) and checked untouched.
void check_decode(const RandomFfn& f, PlanOptions options, const std::string& what, Context& ctx = context()) {
  StreamHandle stream(ctx);
  const int64_t K = f.spec.d_model, ld = K + 8;
  PlanOptions large = options;
  large.decode_max_tokens = 0;
  // The four decode kernels alone (no fused kernel) beside the plan as asked.
  PlanOptions four = options;
  four.decode_fused_max_tokens = 0;
  FfnPlan decode_plan = ctx.plan(f.spec, 64, options);
  FfnPlan large_plan = ctx.plan(f.spec, 64, large);
  FfnPlan four_plan = ctx.plan(f.spec, 64, four);
  const auto& reports = decode_plan.kernels();
  ASSERT_TRUE(std::any_of(reports.begin(), reports.end(), [](const KernelReport& k) { return k.kind == "decode_gate"; }))
      << what << ": the plan made no decode kernels";
  // Where the fused kernel fits (every shape here on an H200) it takes the calls of at most
  // decode_fused_max_tokens rows, and of at most the rows whose x tiles fit this GPU (fusedMaxTokens:
  // 16 at the paper's shape on an A100), and writes no TwELL matrix: y is compared, and the matrix
  // calls must refuse with a clear error.
  const int64_t fused_fits = kernels::DecodeKernelConstraints::fusedMaxTokens(
      f.spec.d_model, f.spec.d_ff - options.dense_neurons, ctx.sm_count(), ctx.target().sm);
  const bool fused = f.tokens <= std::min(options.decode_fused_max_tokens, fused_fits) &&
                     std::any_of(reports.begin(), reports.end(), [](const KernelReport& k) { return k.kind == "decode_fused"; });
  DeviceFfn dev(ctx, f);
  std::vector<uint16_t> xs(f.tokens * ld, from_float(f.spec.dtype, std::nanf("")));
  for (int64_t r = 0; r < f.tokens; ++r) std::copy_n(&f.x[r * K], K, &xs[r * ld]);
  DeviceMemory xd(ctx, xs.size() * 2), yd(ctx, f.tokens * ld * 2);
  xd.upload(xs);
  FfnTensors t = dev.tensors();
  t.x = xd.data();
  t.ld_x = ld;
  t.y = yd.data();
  t.ld_y = ld;
  auto run = [&](FfnPlan& plan, std::vector<uint16_t>& y, std::vector<uint16_t>& h) {
    yd.fill(0xFF);
    plan.run(stream.get(), t, f.tokens);
    if (plan.last_path() == "decode") {
      stream.synchronize();
      EXPECT_THROW(plan.download_twell(stream.get()), Error) << what;
      EXPECT_THROW(plan.run_consumer(stream.get(), t, f.tokens), Error) << what;
      h.clear();
    } else {
      h = twell_values(plan.download_twell(stream.get()));
    }
    const auto ys = yd.download_vector<uint16_t>(f.tokens * ld);
    y.assign(f.tokens * K, 0);
    for (int64_t r = 0; r < f.tokens; ++r) {
      std::copy_n(&ys[r * ld], K, &y[r * K]);
      for (int64_t i = K; i < ld; ++i) ASSERT_EQ(ys[r * ld + i], 0xFFFF) << what << ": wrote outside row " << r;
    }
  };
  std::vector<uint16_t> y_decode, h_decode, y_large, h_large, y_again, h_again, y_four, h_four;
  run(decode_plan, y_decode, h_decode);
  run(large_plan, y_large, h_large);
  run(four_plan, y_four, h_four);
  EXPECT_EQ(four_plan.last_path(), "twell") << what;
  run(decode_plan, y_again, h_again);  // the tiles' arrival counters were left at 0 by the first run
  // The large-M consumer over the decode run's matrix (run_consumer always takes it): the same y
  // (a split plan's run_consumer writes the TwELL neurons' part alone: not compared).
  EXPECT_EQ(decode_plan.last_path(), fused ? "decode" : "twell") << what;
  if (options.dense_neurons == 0 && !fused) {
    yd.fill(0xFF);
    decode_plan.run_consumer(stream.get(), t, f.tokens);
    stream.synchronize();
    std::vector<uint16_t> y_consumer(f.tokens * K);
    const auto ys = yd.download_vector<uint16_t>(f.tokens * ld);
    for (int64_t r = 0; r < f.tokens; ++r) std::copy_n(&ys[r * ld], K, &y_consumer[r * K]);
    EXPECT_TRUE(y_consumer == y_again) << what << ": run_consumer over the decode run's matrix gives another y";
  }
  const auto ref = reference_gated_ffn(f.spec, f.x, f.tokens, f.weights());
  EXPECT_LT(relative_error(to_float(f.spec.dtype, y_decode), ref), 1e-2) << what;
  EXPECT_EQ(std::count(y_decode.begin(), y_decode.end(), uint16_t{0xFFFF}), 0) << what << ": unwritten outputs";
  // A tile-row that overflowed a full backup in one run may have had a slot in the other (slots go
  // to the first tile-rows to claim them): its values are compared only where both runs kept them.
  auto first_difference = [&](const std::vector<uint16_t>& a, const std::vector<uint16_t>& b) {
    if (a.size() != b.size()) return std::string(" (sizes differ)");
    const int tile_n = decode_plan.layout().tile_n;
    for (size_t t = 0; t < a.size(); t += tile_n) {
      if (a[t] == 0xFFFF && std::all_of(&a[t], &a[t] + tile_n, [](uint16_t v) { return v == 0xFFFF; })) continue;
      if (b[t] == 0xFFFF && std::all_of(&b[t], &b[t] + tile_n, [](uint16_t v) { return v == 0xFFFF; })) continue;
      for (size_t i = t; i < t + tile_n; ++i)
        if (a[i] != b[i]) return fmt::format(" (first at value {}: {:#06x} vs {:#06x})", i, a[i], b[i]);
    }
    return std::string();
  };
  if (!fused) {
    EXPECT_EQ(first_difference(h_decode, h_large), "") << what << ": the decode gate's TwELL matrix differs from the large-M gate's";
  }
  EXPECT_EQ(first_difference(h_four, h_large), "") << what << ": the four decode kernels' TwELL matrix differs from the large-M gate's";
  EXPECT_TRUE(y_four == y_large) << what << ": the four decode kernels' y differs from the large-M kernels' bits";
  if (fused) {
    // decode_fused sums the gate in another order (decode_fused.cuh): its documented tolerance, 1e-2
    // relative to the large-M kernels' y, and its own bits on every run (below).
    EXPECT_LT(relative_error(to_float(f.spec.dtype, y_decode), to_float(f.spec.dtype, y_large)), 1e-2)
        << what << ": the fused decode kernel's y is outside its tolerance of the large-M kernels'";
  } else {
    EXPECT_TRUE(y_decode == y_large) << what << ": y differs from the large-M kernels' bits";
  }
  EXPECT_EQ(first_difference(h_decode, h_again), "") << what << ": a second decode run's TwELL matrix differs";
  EXPECT_TRUE(y_again == y_decode) << what << ": a second decode run's y differs";
  // The fused kernel's shared-memory atomics and the hand-over of counts and pairs between its CTAs (no grid
  // barrier): the same bits over more runs, so that an intermittent race has more chances to show.
  if (fused) {
    for (int i = 0; i < 8; ++i) {
      std::vector<uint16_t> y_more, h_more;
      run(decode_plan, y_more, h_more);
      if (y_more != y_decode) {
        ADD_FAILURE() << what << ": decode run " << i + 3 << "'s y differs from the first";
        break;
      }
    }
  }
}
}  // namespace

// The decode kernels (runs of <= 64 tokens) against the large-M kernels and the CPU reference: 1 to 64
// rows (one, two and four m16 row tiles), the paper's shape at 0.5% and 5% and an out_in Wd (read as
// given), d_model 520 (the mma_sync gate, a K tail) with d_ff 1408 (a partial last tile) and
// overflowing tile-rows from the backup or recomputed (capacity 0), SiLU with a threshold in fp16 and
// tile_n 64 with in_out weights, a non-gated layer, the hot/cold split, and shapes for the fused
// kernel's K tail in fp16, several words and units per CTA and several column chunks.
TEST(GpuFfn, DecodeMatchesLargeBatchKernels) {
  FfnSpec paper;
  paper.d_model = 2048;
  paper.d_ff = 5632;
  for (int64_t tokens : {1, 7, 16, 17, 32, 40, 64})
    check_decode(make_random_ffn(paper, tokens, 0.005, 40 + tokens), sparse(), fmt::format("paper shape 0.5%, {} tokens", tokens));
  for (int64_t tokens : {32, 33})  // 32: the fused kernel's two m16 tiles and several pair batches
    check_decode(make_random_ffn(paper, tokens, 0.05, 50 + tokens), sparse(), fmt::format("paper shape 5%, {} tokens", tokens));
  for (uint32_t capacity : {0u, 100000u}) {
    PlanOptions o = sparse();
    o.backup_capacity = capacity;
    for (int64_t tokens : {3, 20, 64})
      check_decode(make_random_ffn(odd_spec(), tokens, 0.2, 60 + tokens), o,
                   fmt::format("d_model 520, d_ff 1408, 20% (overflowing tile-rows), backup capacity {}, {} tokens", capacity, tokens));
  }
  FfnSpec silu;
  silu.d_model = 512;
  silu.d_ff = 1400;
  silu.dtype = DType::FP16;
  silu.activation = Activation::SiLU;
  silu.threshold = 0.05f;
  silu.tile_n = 64;
  silu.slots = 7;
  silu.down_layout = WeightLayout::InOut;
  for (int64_t tokens : {2, 24, 50})
    check_decode(make_random_ffn(silu, tokens, 0.03, 70 + tokens), sparse(), fmt::format("SiLU fp16 tile_n 64 in_out, {} tokens", tokens));
  FfnSpec wide_tile;  // tile_n 1024 (the most packing staging), d_ff % 8 != 0 (act rows padded)
  wide_tile.d_model = 256;
  wide_tile.d_ff = 1404;
  wide_tile.tile_n = 1024;
  wide_tile.slots = 127;
  for (int64_t tokens : {5, 20}) check_decode(make_random_ffn(wide_tile, tokens, 0.05, 75 + tokens), sparse(), "tile_n 1024, d_ff 1404");
  FfnSpec plain = odd_spec();
  plain.d_model = 512;
  plain.gated = false;
  check_decode(make_random_ffn(plain, 9, 0.02, 80), sparse(), "non-gated, 9 tokens");
  // The portable feature set (sm_80 PTX: the fused kernel's cp.async form, the mma_sync gates), run on
  // this device through the driver's JIT: the same bits as its own large-M kernels.
  ContextOptions portable_options;
  portable_options.target = Target{80, false};
  Context portable(portable_options);
  for (int64_t tokens : {1, 4, 16})
    check_decode(make_random_ffn(paper, tokens, 0.005, 95 + tokens), sparse(), fmt::format("sm_80 code, paper shape 0.5%, {} tokens", tokens),
                 portable);
  check_decode(make_random_ffn(odd_spec(), 3, 0.2, 99), sparse(), "sm_80 code, d_model 520, 20%, 3 tokens", portable);
  PlanOptions split = sparse();
  split.dense_neurons = 256;
  check_decode(make_random_ffn(paper, 12, 0.01, 90), split, "paper shape with 256 dense neurons, 12 tokens");
  // The fused kernel's less travelled paths (on 132 SMs): fp16 with a K tail (d_model 520: its slices
  // end inside the last k32 block) at 8, 13 and 29 tokens (x tiles of 8, 16 and 32 rows); and d_model
  // 2304, d_ff 11264: 86 rows per CTA (three 32-row bit words each, 44 units for 24 warps; 207 KB of
  // shared memory at 32 tokens) and 144 column chunks for 132 CTAs.
  FfnSpec fp16_tail = odd_spec();
  fp16_tail.dtype = DType::FP16;
  for (int64_t tokens : {8, 13, 29})
    check_decode(make_random_ffn(fp16_tail, tokens, 0.05, 91 + tokens), sparse(), fmt::format("fp16 d_model 520, {} tokens", tokens));
  FfnSpec wide;
  wide.d_model = 2304;
  wide.d_ff = 11264;
  for (int64_t tokens : {1, 8, 16, 32})
    check_decode(make_random_ffn(wide, tokens, 0.01, 92 + tokens), sparse(), fmt::format("d_model 2304, d_ff 11264, {} tokens", tokens));
  // Fewer neurons than CTAs (d_ff 100 on 132 SMs): CTAs without a row still publish their (empty) counts
  // and reduce their column chunks; every reducer waits for all of them.
  FfnSpec few;
  few.d_model = 512;
  few.d_ff = 100;
  for (int64_t tokens : {1, 20})
    check_decode(make_random_ffn(few, tokens, 0.1, 93 + tokens), sparse(), fmt::format("d_model 512, d_ff 100, {} tokens", tokens));
}


// The decode kernels on real data: the embedded sample's layer 1 (13.7% dense, tile-rows over 31
// slots) and, where ../shared/data has it, the paper model's layer 1 on its real x and Wg, on their
// first rows.
TEST(GpuFfnRealData, DecodeOnRealLayers) {
  auto first_rows = [](const LayerData& d, int64_t tokens) {
    RandomFfn f;
    f.spec.d_model = d.d_model;
    f.spec.d_ff = d.d_ff;
    f.tokens = std::min(tokens, d.tokens);
    f.x.assign(d.x.begin(), d.x.begin() + f.tokens * d.d_model);
    f.w_gate = d.w_gate;
    f.w_up = d.w_up;
    f.w_down = d.w_down;
    return f;
  };
  const LayerData sample = load_layer({SafeTensors::read(sample_path())}, 1, false);
  for (int64_t tokens : {1, 8, 64}) check_decode(first_rows(sample, tokens), sparse(), fmt::format("embedded sample layer 1, {} rows", tokens));
  const auto dir = shared_data_dir();
  for (const char* n : {"paper_l1_gate_a.safetensors", "paper_l1_gate_b.safetensors", "paper_l1_x.safetensors"})
    if (!std::filesystem::exists(dir / n)) GTEST_SKIP() << "real data not found: " << (dir / n).string();
  const LayerData paper = load_layer({SafeTensors::read(dir / "paper_l1_gate_a.safetensors"),
                                      SafeTensors::read(dir / "paper_l1_gate_b.safetensors"),
                                      SafeTensors::read(dir / "paper_l1_x.safetensors")},
                                     1, true);
  for (int64_t tokens : {1, 16}) check_decode(first_rows(paper, tokens), sparse(), fmt::format("paper layer 1, {} rows", tokens));
}
