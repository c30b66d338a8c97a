// A deployment's view: this program links twell::runtime alone (no JIT, no MLIR, no NVRTC) and takes
// every kernel from the bundles `twellc compile` wrote (ctest fixture `bundles`: the embedded sample's
// shape for sm_90a and sm_80, a non-gated layer for sm_90a). Bad bundles: each gets a clear error
// naming what was expected and what was found, and the context keeps working.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <tuple>

#include <unistd.h>

#include "twell/context.h"
#include "twell/error.h"
#include "twell/layer_data.h"
#include "twell/safetensors.h"

namespace fs = std::filesystem;
using namespace twell;

namespace {

// The bundles ctest's fixture made; $TWELL_TEST_BUNDLES and $TWELL_SOURCE_DIR override the build's
// paths (a build copied to a GPU machine).
const fs::path kBundles = std::getenv("TWELL_TEST_BUNDLES") ? std::getenv("TWELL_TEST_BUNDLES") : TWELL_TEST_BUNDLES;
const fs::path kSourceDir = std::getenv("TWELL_SOURCE_DIR") ? std::getenv("TWELL_SOURCE_DIR") : TWELL_SOURCE_DIR;

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
  return FfnSpec{.d_model = d.d_model, .d_ff = d.d_ff};
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
  g.kernels.push_back(kernels::KernelSource{.name = "k", .source = "extern \"C\" __global__ void k() {}"});
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

TEST(RuntimeOnly, NonGatedBundle) {
  Context ctx(options_for(Target{90, true}));
  ctx.load_bundle(kBundles / "non_gated/sm_90a");
  FfnSpec s{.d_model = 512, .d_ff = 1408, .gated = false};
  const FfnPlan plan = ctx.plan(s, 1024);
  bool down = false;
  for (const KernelReport& k : plan.kernels()) down |= k.kind == "down";
  EXPECT_TRUE(down);
}

TEST(RuntimeOnly, MissingKernelSetNamesTheRequest) {
  Context ctx(options_for(Target{90, true}));
  ctx.load_bundle(kBundles / "sample/sm_90a");
  FfnSpec other{.d_model = 1024, .d_ff = 4096};
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
