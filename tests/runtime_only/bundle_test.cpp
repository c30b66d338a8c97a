// A deployment's view: this program links twell::runtime alone (no JIT, no MLIR, no NVRTC) and takes
// every kernel from the bundles `twellc compile` wrote (ctest fixture `bundles`: the embedded sample's
// shape for sm_90a and sm_80, a non-gated layer for sm_90a). Bad bundles: each gets a clear error
// naming what was expected and what was found, and the context keeps working.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <tuple>

#include <unistd.h>

#include "twell/context.h"
#include "twell/error.h"
#include "twell/layer_data.h"
#include "twell/safetensors.h"
#include "twell/training_plan.h"

namespace fs = std::filesystem;
using namespace twell;

namespace {

// The bundles ctest's fixture made; $TWELL_TEST_BUNDLES and $TWELL_SOURCE_DIR override the build's
// paths (a build copied to a GPU machine).
const fs::path kBundles = std::getenv("TWELL_TEST_BUNDLES") ? std::getenv("TWELL_TEST_BUNDLES") : TWELL_TEST_BUNDLES;
const fs::path kSourceDir = std::getenv("TWELL_SOURCE_DIR") ? std::getenv("TWELL_SOURCE_DIR") : TWELL_SOURCE_DIR;

FfnSpec spec_of(int64_t d_model, int64_t d_ff, bool gated = true) {
  FfnSpec s;
  s.d_model = d_model;
  s.d_ff = d_ff;
  s.gated = gated;
  return s;
}

ContextOptions options_for(Target target) {
  ContextOptions o;
  o.target = target;
  o.device = ContextOptions::kNoDevice;  // bundle loading and plans need no GPU
  return o;
}

// The spec of the embedded sample (what `twellc compile --sample` compiles).
FfnSpec sample_spec() {
  const LayerData d = load_layer({SafeTensors::read(kSourceDir / "tests/data/tiny_l1.safetensors")},
                                 std::nullopt, false);
  return spec_of(d.d_model, d.d_ff);
}

std::string read(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}
void write(const fs::path& p, const std::string& text) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out << text;
}

// A private copy of the sample's sm_90a bundle to damage.
fs::path copy_bundle(const std::string& name) {
  const fs::path dir = fs::temp_directory_path() / ("twell-bundle-test-" + name + "-" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::copy(kBundles / "sample/sm_90a", dir, fs::copy_options::recursive);
  return dir;
}

fs::path first_with(const fs::path& dir, const std::string& ext) {
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().extension() == ext) return e.path();
  return {};
}

// Error code and message of what `f` throws (fails the test if it throws nothing).
template <class F>
std::pair<ErrorCode, std::string> error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return {e.code(), e.what()};
  }
  ADD_FAILURE() << "expected a twell::Error";
  return {ErrorCode::InvalidArgument, ""};
}

TEST(RuntimeOnly, HasNoJit) {
  Context ctx(options_for(Target{90, true}));
  EXPECT_FALSE(ctx.has_jit()) << "this test program links twell::runtime alone";
  kernels::GeneratedFfn g;
  kernels::KernelSource k;
  k.name = "k";
  k.source = "extern \"C\" __global__ void k() {}";
  g.kernels.push_back(k);
  const auto [code, what] = error_of([&] { ctx.compile(g); });
  EXPECT_EQ(code, ErrorCode::Unsupported) << what;
  EXPECT_NE(what.find("twell::jit is not linked"), std::string::npos) << what;
}

TEST(RuntimeOnly, PlanFromBundle) {
  for (Target target : {Target{90, true}, Target{80, false}}) {
    Context ctx(options_for(target));
    const BundleInfo info = ctx.load_bundle(kBundles / "sample" / target.arch());
    EXPECT_EQ(info.target.arch(), target.arch());
    EXPECT_GE(info.kernels, 8u);  // gate, consumers, decode x4, transpose, dense kernels, permute
    EXPECT_LT(info.load_ms, 5000.0);
    const FfnPlan plan = ctx.plan(sample_spec(), 4096);
    EXPECT_FALSE(plan.runnable());
    ASSERT_GE(plan.kernels().size(), 3u);
    for (const KernelReport& k : plan.kernels()) {
      EXPECT_EQ(k.cache, "bundle") << k.name;
      EXPECT_EQ(k.arch, target.arch()) << k.name;
      EXPECT_GT(k.cubin_bytes, 0u) << k.name;
      EXPECT_GT(k.ptx_bytes, 0u) << k.name;
    }
    EXPECT_NE(plan.ir().find("twell.gate_matmul"), std::string::npos);
    EXPECT_NE(plan.ptx(0).find(".entry " + plan.kernels()[1].name), std::string::npos) << "the gate's PTX";
  }
}

// A plan that never decodes requests no decode kernels; the bundle's set (made by plans that decode)
// serves it with its gate and consumer, and the plan reports no decode kernel.
TEST(RuntimeOnly, PlanWithoutDecodeFromADecodingBundle) {
  Context ctx(options_for(Target{90, true}));
  ctx.load_bundle(kBundles / "sample/sm_90a");
  PlanOptions options;
  options.decode_max_tokens = 0;
  const FfnPlan plan = ctx.plan(sample_spec(), 4096, options);
  ASSERT_GE(plan.kernels().size(), 2u);
  for (const KernelReport& k : plan.kernels()) {
    EXPECT_EQ(k.cache, "bundle") << k.name;
    EXPECT_EQ(k.name.find("decode"), std::string::npos) << k.name;
  }
  // The decoding plan still finds its five decode kernels in the same bundle.
  int decode = 0;
  const FfnPlan decoding = ctx.plan(sample_spec(), 4096);
  for (const KernelReport& k : decoding.kernels()) decode += k.name.find("decode") != std::string::npos;
  EXPECT_EQ(decode, 5);
}

// `twellc compile --training --dense-neurons 256` bundles the training plans' kernels: a context without
// the JIT makes the Auto training plan, whole and split at 256, from it alone; a split the bundle lacks
// is NotFound, naming the request.
TEST(RuntimeOnly, TrainingPlansFromABundle) {
  Context ctx(options_for(Target{90, true}));
  ctx.load_bundle(kBundles / "training/sm_90a");
  for (const int64_t dense_neurons : {int64_t{0}, int64_t{256}}) {
    TrainingPlanOptions o;
    o.dispatch = TrainingDispatch::Auto;
    o.dense_neurons = dense_neurons;
    const FfnTrainingPlan plan = FfnTrainingPlan::create(ctx, sample_spec(), 4096, o);
    std::map<std::string, int> kinds;
    for (const KernelReport& k : plan.kernels()) {
      ++kinds[k.kind];
      EXPECT_TRUE(k.cache == "bundle" || k.cache == "memory") << k.name << ": " << k.cache;
    }
    for (const char* kind : {"gate_twell", "train_row_backward", "train_weight_grad", "train_dense_forward", "train_dense_backward"})
      EXPECT_GE(kinds[kind], 1) << kind << " (dense_neurons " << dense_neurons << ")";
  }
  TrainingPlanOptions other;
  other.dense_neurons = 512;
  const auto [code, what] = error_of([&] { FfnTrainingPlan::create(ctx, sample_spec(), 4096, other); });
  EXPECT_EQ(code, ErrorCode::NotFound) << what;
  EXPECT_NE(what.find("d_ff=896"), std::string::npos) << what;  // the split's TwELL part: 1408 - 512
}

TEST(RuntimeOnly, NonGatedBundle) {
  Context ctx(options_for(Target{90, true}));
  ctx.load_bundle(kBundles / "non_gated/sm_90a");
  const FfnSpec s = spec_of(512, 1408, false);
  const FfnPlan plan = ctx.plan(s, 1024);
  bool down = false;
  for (const KernelReport& k : plan.kernels()) down |= k.kind == "down";
  EXPECT_TRUE(down);
}

// `twellc compile FILE.mlir`: the hand-written configuration (the wgmma gate without clusters) is what
// a plan of the printed FfnSpec gets; the same shape with the default spec is not in that bundle.
TEST(RuntimeOnly, BundleFromMlir) {
  Context ctx(options_for(Target{90, true}));
  ctx.load_bundle(kBundles / "mlir/sm_90a");
  FfnSpec s = spec_of(512, 1408);
  s.down_layout = WeightLayout::InOut;
  s.tile_n = 256;
  s.slots = 31;
  s.consumer = ConsumerVariant::RowGather;
  s.gate_cluster_m = 1;
  const FfnPlan plan = ctx.plan(s, 1024);
  bool gate = false;
  for (const KernelReport& k : plan.kernels())
    if (k.kind == "gate_twell") {
      gate = true;
      EXPECT_EQ(k.cluster_m, 1) << "the .mlir's gate config";
      EXPECT_EQ(k.cache, "bundle");
    }
  EXPECT_TRUE(gate);
  EXPECT_EQ(error_of([&] { ctx.plan(spec_of(512, 1408), 64); }).first, ErrorCode::NotFound);
  // `--training`: the training plan's forward takes the .mlir's gate and consumer (a plan without decode
  // kernels, served by the .mlir's set), its own kernels from the bundle too.
  const FfnTrainingPlan training = FfnTrainingPlan::create(ctx, s, 1024);
  std::string plan_gate, training_gate;
  for (const KernelReport& k : plan.kernels())
    if (k.kind == "gate_twell") plan_gate = k.name;
  int train_kernels = 0;
  for (const KernelReport& k : training.kernels()) {
    if (k.kind == "gate_twell") training_gate = k.name;
    train_kernels += k.kind.rfind("train_", 0) == 0;
  }
  EXPECT_EQ(training_gate, plan_gate);
  EXPECT_GE(train_kernels, 2);
}

// `twellc compile --tuning-dir` (tests/data/tuning_512x1408.json.in beside a damaged file): the bundle
// embeds the entry and the tuned layouts' kernels; plans take them (no database is consulted without a
// GPU: the embedded entry applies to any device of the bundle's arch).
TEST(RuntimeOnly, TunedBundle) {
  Context ctx(options_for(Target{90, true}));
  EXPECT_EQ(ctx.load_bundle(kBundles / "tuned/sm_90a").tuning_entries, 1u);
  const std::string from = "bundle " + (kBundles / "tuned/sm_90a").string() + " workload ";
  PlanOptions o;
  const FfnPlan big = ctx.plan(spec_of(512, 1408), 131072, o);  // the dense path won: its TwELL runner-up
  EXPECT_EQ(big.config_source(), from + "density:0.5% bucket 131072: tile_n 128 slots 15 cluster_m 1");
  EXPECT_EQ(big.layout().tile_n, 128);
  EXPECT_EQ(big.layout().slots, 15);
  for (const KernelReport& k : big.kernels()) EXPECT_EQ(k.cache, "bundle") << k.name;
  EXPECT_EQ(ctx.plan(spec_of(512, 1408), 16, o).config_source(),
            from + "density:0.5% bucket 16: tile_n 256 slots 31 cluster_m 1");
  // Another dispatch fixes the tuned consumer: twellc compile put those kernel sets in the bundle too.
  o.dispatch = Dispatch::Sparse;
  const FfnPlan fixed = ctx.plan(spec_of(512, 1408), 131072, o);
  EXPECT_EQ(fixed.config_source(),
            from + "density:0.5% bucket 131072: tile_n 128 slots 15 cluster_m 1 consumer token_block");
  bool block = false;
  for (const KernelReport& k : fixed.kernels()) block |= k.consumer == "token_block";
  EXPECT_TRUE(block);
  o.dispatch = Dispatch::Auto;
  o.tuning_workload = "pattern:00000000000000aa";
  EXPECT_EQ(ctx.plan(spec_of(512, 1408), 131072, o).config_source(),
            "heuristic (" + from + "pattern:00000000000000aa bucket 131072: the untuned plan was fastest)");
  o.tuning_workload = "density:9%";  // not tuned
  EXPECT_EQ(ctx.plan(spec_of(512, 1408), 131072, o).config_source(), "heuristic");
  o.tuning_workload = "";
  o.tuning = PlanOptions::Tuning::Ignore;
  EXPECT_EQ(ctx.plan(spec_of(512, 1408), 131072, o).config_source(), "heuristic");
  // Without --tuning-dir a bundle embeds none.
  Context plain(options_for(Target{90, true}));
  EXPECT_EQ(plain.load_bundle(kBundles / "sample/sm_90a").tuning_entries, 0u);
}

TEST(RuntimeOnly, MissingKernelSetNamesTheRequest) {
  Context ctx(options_for(Target{90, true}));
  ctx.load_bundle(kBundles / "sample/sm_90a");
  const FfnSpec other = spec_of(1024, 4096);
  const auto [code, what] = error_of([&] { ctx.plan(other, 128); });
  EXPECT_EQ(code, ErrorCode::NotFound);
  EXPECT_NE(what.find("d_model=1024 d_ff=4096"), std::string::npos) << what;
  EXPECT_NE(what.find("sample/sm_90a"), std::string::npos) << what;
  EXPECT_NE(what.find("twellc compile"), std::string::npos) << what;
  // Without any bundle: the same error, saying none is loaded.
  Context empty(options_for(Target{90, true}));
  const auto [code2, what2] = error_of([&] { empty.plan(sample_spec(), 128); });
  EXPECT_EQ(code2, ErrorCode::NotFound);
  EXPECT_NE(what2.find("no bundle is loaded"), std::string::npos) << what2;
}

TEST(RuntimeOnly, WrongArchIsRefused) {
  Context ctx(options_for(Target{80, false}));
  const auto [code, what] = error_of([&] { ctx.load_bundle(kBundles / "sample/sm_90a"); });
  EXPECT_EQ(code, ErrorCode::InvalidArgument);
  EXPECT_NE(what.find("expected a bundle for this context's target sm_80, found one for sm_90a"), std::string::npos) << what;
  // The context is unchanged: its own target's bundle still loads and plans.
  ctx.load_bundle(kBundles / "sample/sm_80");
  EXPECT_NO_THROW(ctx.plan(sample_spec(), 64));
}

TEST(RuntimeOnly, TruncatedCubin) {
  const fs::path dir = copy_bundle("truncated");
  const fs::path cubin = first_with(dir, ".cubin");
  ASSERT_FALSE(cubin.empty());
  const std::string bytes = read(cubin);
  write(cubin, bytes.substr(0, bytes.size() / 2));
  Context ctx(options_for(Target{90, true}));
  const auto [code, what] = error_of([&] { ctx.load_bundle(dir); });
  EXPECT_EQ(code, ErrorCode::Parse);
  EXPECT_NE(what.find(cubin.stem().string()), std::string::npos) << "names the kernel: " << what;
  EXPECT_NE(what.find("expected " + std::to_string(bytes.size()) + " bytes"), std::string::npos) << what;
  EXPECT_NE(what.find("truncated"), std::string::npos) << what;
  // Nothing was loaded: a plan finds no kernels, and a good bundle still loads.
  EXPECT_EQ(error_of([&] { ctx.plan(sample_spec(), 64); }).first, ErrorCode::NotFound);
  ctx.load_bundle(kBundles / "sample/sm_90a");
  EXPECT_NO_THROW(ctx.plan(sample_spec(), 64));
  fs::remove_all(dir);
}

TEST(RuntimeOnly, ChangedCubinSameSize) {
  const fs::path dir = copy_bundle("changed");
  const fs::path cubin = first_with(dir, ".cubin");
  std::string bytes = read(cubin);
  bytes[bytes.size() / 2] ^= 0x5a;
  write(cubin, bytes);
  Context ctx(options_for(Target{90, true}));
  const auto [code, what] = error_of([&] { ctx.load_bundle(dir); });
  EXPECT_EQ(code, ErrorCode::Parse);
  EXPECT_NE(what.find("expected XXH64"), std::string::npos) << what;
  fs::remove_all(dir);
}

TEST(RuntimeOnly, EditedManifest) {
  const fs::path dir = copy_bundle("edited");
  std::string m = read(dir / "manifest.json");
  const size_t at = m.find("\"smem_bytes\": ");
  ASSERT_NE(at, std::string::npos);
  m.insert(at + 14, "1");  // e.g. 216144 -> 1216144
  write(dir / "manifest.json", m);
  Context ctx(options_for(Target{90, true}));
  const auto [code, what] = error_of([&] { ctx.load_bundle(dir); });
  EXPECT_EQ(code, ErrorCode::Parse);
  EXPECT_NE(what.find("manifest.json was edited"), std::string::npos) << what;
  fs::remove_all(dir);
}

TEST(RuntimeOnly, WrongSchemaVersion) {
  const fs::path dir = copy_bundle("schema");
  std::string m = read(dir / "manifest.json");
  const size_t at = m.find("\"schema_version\": 1");
  ASSERT_NE(at, std::string::npos);
  m.replace(at, 19, "\"schema_version\": 7");
  write(dir / "manifest.json", m);
  Context ctx(options_for(Target{90, true}));
  const auto [code, what] = error_of([&] { ctx.load_bundle(dir); });
  EXPECT_EQ(code, ErrorCode::Parse);
  EXPECT_NE(what.find("schema_version: expected 1, found 7"), std::string::npos) << what;
  fs::remove_all(dir);
}

TEST(RuntimeOnly, MissingKernelFileAndManifest) {
  const fs::path dir = copy_bundle("missing");
  const fs::path ptx = first_with(dir, ".ptx");
  fs::remove(ptx);
  Context ctx(options_for(Target{90, true}));
  auto [code, what] = error_of([&] { ctx.load_bundle(dir); });
  EXPECT_EQ(code, ErrorCode::NotFound);
  EXPECT_NE(what.find(ptx.stem().string()), std::string::npos) << what;
  fs::remove(dir / "manifest.json");
  std::tie(code, what) = error_of([&] { ctx.load_bundle(dir); });
  EXPECT_EQ(code, ErrorCode::NotFound);
  EXPECT_NE(what.find("expected manifest.json"), std::string::npos) << what;
  std::tie(code, what) = error_of([&] { ctx.load_bundle(dir / "nope"); });
  EXPECT_EQ(code, ErrorCode::NotFound);
  write(dir / "manifest.json", "{ not json");
  std::tie(code, what) = error_of([&] { ctx.load_bundle(dir); });
  EXPECT_EQ(code, ErrorCode::Parse);
  EXPECT_NE(what.find("expected JSON"), std::string::npos) << what;
  fs::remove_all(dir);
}

TEST(RuntimeOnly, SaveBundleReportsWriteFailures) {
  Context ctx(options_for(Target{90, true}));
  ctx.load_bundle(kBundles / "sample/sm_90a");
  ctx.plan(sample_spec(), 64);
  // Re-saving what came from a bundle (no JIT needed) into a fresh directory round-trips.
  const fs::path dir = fs::temp_directory_path() / ("twell-bundle-resave-" + std::to_string(::getpid()));
  fs::remove_all(dir);
  ctx.save_bundle(dir);
  Context again(options_for(Target{90, true}));
  again.load_bundle(dir);
  EXPECT_NO_THROW(again.plan(sample_spec(), 64));
  // A directory that cannot be written (a regular file in the way) is an Io error naming the path.
  const fs::path blocked = dir / "blocked";
  write(blocked, "x");
  const auto [code, what] = error_of([&] { ctx.save_bundle(blocked / "sub"); });
  EXPECT_EQ(code, ErrorCode::Io) << what;
  EXPECT_NE(what.find("blocked"), std::string::npos) << what;
  fs::remove_all(dir);
}

}  // namespace

// Manifests edited by a tool that recomputes the checksum (or nested, or replaced by a FIFO): every
// field is still checked against the contracts, so none makes the runtime launch a wrong kernel.
#include <sys/stat.h>
#include <xxhash.h>

#include <nlohmann/json.hpp>

namespace {

using nlohmann::json;

// Applies `edit` to the manifest of a fresh copy of the sample's sm_90a bundle and re-signs it.
template <class Edit>
fs::path forged(const std::string& name, Edit edit) {
  const fs::path dir = copy_bundle("forged-" + name);
  json m = json::parse(read(dir / "manifest.json"));
  edit(m, dir);
  m.erase("checksum");
  const std::string text = m.dump();
  char hex[17];
  std::snprintf(hex, sizeof(hex), "%016llx", static_cast<unsigned long long>(XXH64(text.data(), text.size(), 0)));
  m["checksum"] = hex;
  write(dir / "manifest.json", m.dump(2));
  return dir;
}

std::string first_of_kind(const json& m, const std::string& kind) {
  for (const auto& [name, k] : m["kernels"].items())
    if (k["kind"] == kind) return name;
  return "";
}

// Loading `dir` fails with a Parse error whose message holds every one of `parts`.
void expect_refused(const fs::path& dir, std::initializer_list<const char*> parts) {
  Context ctx(options_for(Target{90, true}));
  const auto [code, what] = error_of([&] { ctx.load_bundle(dir); });
  EXPECT_EQ(code, ErrorCode::Parse) << what;
  for (const char* p : parts) EXPECT_NE(what.find(p), std::string::npos) << "expected '" << p << "' in: " << what;
  // The context still works.
  ctx.load_bundle(kBundles / "sample/sm_90a");
  EXPECT_NO_THROW(ctx.plan(sample_spec(), 64));
  fs::remove_all(dir);
}

TEST(RuntimeOnlyForged, LaunchValuesAgainstTheContract) {
  expect_refused(forged("threads", [](json& m, const fs::path&) { m["kernels"][first_of_kind(m, "gate_twell")]["launch"]["threads"] = 33; }),
                 {"gate_twell", "threads: expected 384", "found 33"});
  expect_refused(forged("smem", [](json& m, const fs::path&) { m["kernels"][first_of_kind(m, "gated_down")]["smem_bytes"] = 4096; }),
                 {"smem_bytes: expected"});
  expect_refused(forged("cta_m", [](json& m, const fs::path&) { m["kernels"][first_of_kind(m, "decode_up")]["launch"]["cta_m"] = 0; }),
                 {"decode_up", "cta_m: expected 64 (decode_up), found 0"});
  expect_refused(forged("tile_n", [](json& m, const fs::path&) { m["kernels"][first_of_kind(m, "decode_gate")]["config"]["tile_n"] = 0; }),
                 {"tile_n: expected 32..1024, found 0"});
  expect_refused(forged("narrow", [](json& m, const fs::path&) {
                   m["kernels"][first_of_kind(m, "gate_twell")]["launch"]["threads"] = (uint64_t{1} << 32) + 384;
                 }),
                 {"threads", "expected an integer in"});
  expect_refused(forged("float", [](json& m, const fs::path&) { m["kernels"][first_of_kind(m, "transpose")]["smem_bytes"] = 0.5; }),
                 {"smem_bytes", "expected an integer"});
}

TEST(RuntimeOnlyForged, SetsAgainstTheirRequests) {
  auto ffn_set = [](json& m) -> json& {
    for (json& s : m["sets"])
      if (s["request"].get<std::string>().rfind("ffn ", 0) == 0 && s.contains("decode")) return s;
    throw std::runtime_error("no ffn set");
  };
  expect_refused(forged("slots", [&](json& m, const fs::path&) { ffn_set(m)["layout"]["slots"] = 1000; }), {"layout", "slots 1..tile_n"});
  // A layout the kernels were not built for (their names, held by their binaries, say which).
  expect_refused(forged("slots15", [&](json& m, const fs::path&) { ffn_set(m)["layout"]["slots"] = 15; }),
                 {"expected a kernel of the set's layout (_k512_n1408_t256_s15_relu_bf16_)"});
  expect_refused(forged("dtype", [&](json& m, const fs::path&) { ffn_set(m)["layout"]["value"] = "f16"; }),
                 {"expected a kernel of the set's layout"});
  // A cluster the binary was not compiled for.
  expect_refused(forged("cluster", [](json& m, const fs::path&) { m["kernels"][first_of_kind(m, "gate_twell")]["launch"]["cluster_m"] = 1; }),
                 {"cluster_m: expected the PTX's cluster dimensions"});
  // A kernel name that is not an identifier (it would become a path when saved).
  expect_refused(forged("name", [](json& m, const fs::path&) {
                   const std::string p = first_of_kind(m, "permute");
                   json k = m["kernels"][p];
                   m["kernels"].erase(p);
                   m["kernels"]["../../escape"] = k;
                 }),
                 {"expected kernel names that are C identifiers"});
  expect_refused(forged("decode-order", [&](json& m, const fs::path&) {
                   json& d = ffn_set(m)["decode"];
                   std::swap(d[0], d[3]);
                 }),
                 {"decode: expected the kinds [decode_gate, decode_up, decode_down, decode_gate_small, decode_fused]"});
  expect_refused(forged("consumer-is-gate", [&](json& m, const fs::path&) { ffn_set(m)["kernels"][1] = ffn_set(m)["kernels"][0]; }),
                 {"kernels: expected the kinds [gate_twell, gated_down]"});
  expect_refused(forged("aux-kind", [&](json& m, const fs::path&) {
                   for (json& s : m["sets"])
                     if (s["request"].get<std::string>().rfind("aux transpose", 0) == 0) s["kernels"][0] = first_of_kind(m, "gate_twell");
                 }),
                 {"expected one kernel of kind transpose"});
  expect_refused(forged("duplicate", [&](json& m, const fs::path&) { m["sets"].push_back(m["sets"][0]); }), {"twice"});
  // Another kernel's files, re-signed: the entry point is not in them.
  expect_refused(forged("swapped", [](json& m, const fs::path&) {
                   const std::string gate = first_of_kind(m, "gate_twell"), up = first_of_kind(m, "decode_up");
                   m["kernels"][gate]["files"]["cubin"] = m["kernels"][up]["files"]["cubin"];
                 }),
                 {"cubin: expected the entry"});
  expect_refused(forged("schema", [](json& m, const fs::path&) { m["schema_version"] = (uint64_t{1} << 32) + 1; }),
                 {"schema_version", "expected an integer in"});
}

TEST(RuntimeOnlyForged, NestingFifosAndOverlaps) {
  // A manifest nested 100000 deep is refused while parsing (no stack overflow).
  const fs::path deep = copy_bundle("deep");
  std::string m = read(deep / "manifest.json");
  m.insert(m.rfind('}'), ", \"x\": " + std::string(100000, '[') + std::string(100000, ']'));
  write(deep / "manifest.json", m);
  expect_refused(deep, {"nested deeper than"});
  // A FIFO in place of a kernel file is refused without opening it (no hang).
  const fs::path fifo = copy_bundle("fifo");
  const fs::path ptx = first_with(fifo, ".ptx");
  fs::remove(ptx);
  ASSERT_EQ(::mkfifo(ptx.c_str(), 0644), 0);
  expect_refused(fifo, {"expected a regular file, found a FIFO"});
  // A directory in place of manifest.json says so.
  const fs::path dirm = copy_bundle("dir-manifest");
  fs::remove(dirm / "manifest.json");
  fs::create_directory(dirm / "manifest.json");
  expect_refused(dirm, {"expected a regular file, found a directory"});
  // Bundles of several shapes load side by side (they share identical helper kernels: transpose,
  // permute, the gated multiply); a kernel set held with other kernels is refused, naming the holder.
  Context ctx(options_for(Target{90, true}));
  ctx.load_bundle(kBundles / "sample/sm_90a");
  EXPECT_NO_THROW(ctx.load_bundle(kBundles / "mlir/sm_90a"));
  EXPECT_NO_THROW(ctx.load_bundle(kBundles / "non_gated/sm_90a"));
  const fs::path other = forged("conflict", [](json& m, const fs::path& dir) {
    const std::string t = first_of_kind(m, "transpose");
    json& f = m["kernels"][t]["files"]["cubin"];
    std::string bytes = read(dir / f["path"].get<std::string>());
    bytes.push_back('\0');  // another binary of the same kernel
    write(dir / f["path"].get<std::string>(), bytes);
    char hex[17];
    std::snprintf(hex, sizeof(hex), "%016llx", static_cast<unsigned long long>(XXH64(bytes.data(), bytes.size(), 0)));
    f["bytes"] = bytes.size();
    f["xxh64"] = hex;
  });
  const auto [code, what] = error_of([&] { ctx.load_bundle(other); });
  EXPECT_EQ(code, ErrorCode::InvalidArgument);
  EXPECT_NE(what.find("holds with other kernels"), std::string::npos) << what;
  EXPECT_NO_THROW(ctx.plan(sample_spec(), 64));
  fs::remove_all(other);
}

// A tuning database entry for the sample's spec whose one bucket chose tile_n 64, slots 7.
json sample_tuning_entry() {
  const FfnSpec s = sample_spec();
  const json config = {{"path", "twell"},          {"tile_n", 64},           {"slots", 7}, {"cluster_m", 1},
                       {"consumer", "row_gather"}, {"decode_max_tokens", 0}, {"ms", 1.0}};
  return {{"schema", 1},
          {"hardware",
           {{"arch", "sm_90a"}, {"sm_count", 132}, {"driver", 13000}, {"twell", "0.1.0"}, {"device", "NVIDIA H200"}}},
          {"spec",
           {{"d_model", s.d_model},
            {"d_ff", s.d_ff},
            {"gated", true},
            {"activation", "relu"},
            {"threshold", 0.0},
            {"dtype", "bf16"},
            {"down_layout", "out_in"}}},
          {"workloads",
           {{"density:1%",
             {{"tuned_at", "2026-12-01T18:00:00Z"},
              {"unix_time", 1},
              {"buckets",
               {{{"tokens", 131072},
                 {"winner", config},
                 {"heuristic_ms", 2.0},
                 {"dense_ms", 3.0},
                 {"candidates", 9},
                 {"rejected", 0}}}}}}}}};
}

// Embedded tuned choices are checked like the rest of the manifest; an entry whose layout the bundle
// does not hold leaves the plan untuned, and says so.
TEST(RuntimeOnlyForged, EmbeddedTuning) {
  const fs::path lacking =
      forged("tuning-layout", [](json& m, const fs::path&) { m["tuning"] = json::array({sample_tuning_entry()}); });
  Context ctx(options_for(Target{90, true}));
  EXPECT_EQ(ctx.load_bundle(lacking).tuning_entries, 1u);
  const FfnPlan plan = ctx.plan(sample_spec(), 131072);
  EXPECT_EQ(plan.layout().tile_n, 256);
  EXPECT_EQ(plan.config_source().rfind(
                "heuristic (the tuned layout of bundle " + lacking.string() +
                    " workload density:1% bucket 131072: tile_n 64 slots 7 cluster_m 1 could not be used: ",
                0),
            0u)
      << plan.config_source();
  fs::remove_all(lacking);
  expect_refused(forged("tuning-arch",
                        [](json& m, const fs::path&) {
                          json e = sample_tuning_entry();
                          e["hardware"]["arch"] = "sm_80";
                          m["tuning"] = json::array({e});
                        }),
                 {"manifest: tuning[0]: hardware.arch: expected the bundle's target sm_90a, found sm_80"});
  expect_refused(forged("tuning-field",
                        [](json& m, const fs::path&) {
                          json e = sample_tuning_entry();
                          e["workloads"]["density:1%"]["buckets"][0]["tokens"] = 3;
                          m["tuning"] = json::array({e});
                        }),
                 {"manifest: tuning[0]: workloads.density:1%.buckets[0].tokens: expected a power of two, found 3"});
  expect_refused(forged("tuning-type", [](json& m, const fs::path&) { m["tuning"] = json::object(); }),
                 {"manifest: tuning: expected an array, found {}"});
}

// Embedded values no tune writes refuse the bundle, naming the field (cluster_m 7 loaded and left the
// plan untuned; decode_max_tokens -5 and a bucket given twice loaded silently).
TEST(RuntimeOnlyForged, EmbeddedTuningValuesNoTuneWrites) {
  auto tuned = [](const std::string& name, auto edit) {
    return forged(name, [&](json& m, const fs::path&) {
      json e = sample_tuning_entry();
      edit(e["workloads"]["density:1%"]["buckets"]);
      m["tuning"] = json::array({e});
    });
  };
  expect_refused(tuned("tuning-cluster", [](json& b) { b[0]["winner"]["cluster_m"] = 7; }),
                 {"manifest: tuning[0]: workloads.density:1%.buckets[0].winner.cluster_m: expected 1 or 2, found 7"});
  expect_refused(tuned("tuning-decode", [](json& b) { b[0]["winner"]["decode_max_tokens"] = -5; }),
                 {"manifest: tuning[0]: workloads.density:1%.buckets[0].winner.decode_max_tokens: expected 0..64"});
  expect_refused(tuned("tuning-twice", [](json& b) { b.push_back(b[0]); }),
                 {"manifest: tuning[0]: workloads.density:1%.buckets[1].tokens: expected each bucket once, found "
                  "131072 twice"});
}

}  // namespace
