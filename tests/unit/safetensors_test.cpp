// safetensors reading and layer gathering: real files, and bad input with clear messages.
#include <gtest/gtest.h>

#include <fstream>

#include <fmt/format.h>

#include "test_data.h"
#include "twell/error.h"
#include "twell/layer_data.h"
#include "twell/safetensors.h"

using namespace twell;

namespace {

std::vector<uint8_t> make_file(const std::string& header, size_t data_bytes) {
  std::vector<uint8_t> b;
  b.reserve(8 + header.size() + data_bytes);
  const uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) b.push_back(static_cast<uint8_t>(n >> (8 * i)));
  for (char c : header) b.push_back(static_cast<uint8_t>(c));
  for (size_t i = 0; i < data_bytes; ++i) b.push_back(static_cast<uint8_t>(i * 7 + 1));
  return b;
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace

TEST(SafeTensors, ReadsTheSample) {
  const auto st = SafeTensors::read(twell::testing::sample_path());
  EXPECT_TRUE(st.contains("layers.1.x"));
  int64_t r = 0, c = 0;
  const auto x = st.matrix16("layers.1.x", DType::BF16, -1, 512, &r, &c);
  EXPECT_EQ(r, 1024);
  EXPECT_EQ(x.size(), 1024u * 512u);
}

TEST(SafeTensors, RejectsBadFilesWithClearMessages) {
  EXPECT_NE(error_of([] { SafeTensors::parse({1, 2, 3}, "tiny"); }).find("expected at least 8 bytes"), std::string::npos);
  EXPECT_NE(error_of([] { SafeTensors::parse(make_file("{not json", 0), "f"); }).find("header is not JSON"), std::string::npos);
  auto huge = make_file("{}", 0);
  huge[7] = 0x10;
  EXPECT_NE(error_of([&] { SafeTensors::parse(huge, "f"); }).find("header length"), std::string::npos);
  EXPECT_NE(error_of([] {
              SafeTensors::parse(make_file(R"({"a":{"dtype":"BF16","shape":[2,2],"data_offsets":[0,100]}})", 8), "f");
            }).find("outside the 8 data bytes"),
            std::string::npos);
  EXPECT_NE(error_of([] {
              SafeTensors::parse(make_file(R"({"a":{"dtype":"BF16","shape":[2,3],"data_offsets":[0,8]}})", 8), "f");
            }).find("needs 12 bytes"),
            std::string::npos);
  EXPECT_NE(error_of([] { SafeTensors::parse(make_file(R"({"a":{"dtype":"Q7","shape":[1],"data_offsets":[0,1]}})", 1), "f"); })
                .find("unknown dtype 'Q7'"),
            std::string::npos);
  EXPECT_NE(error_of([] { SafeTensors::read("/nonexistent/file.safetensors"); }).find("cannot open"), std::string::npos);
  // A file that is not safetensors at all (this source file).
  EXPECT_NE(error_of([] { SafeTensors::read(std::string(TWELL_SOURCE_DIR) + "/README.md"); }).find("not a valid safetensors file"),
            std::string::npos);
}

TEST(SafeTensors, WrongNameDtypeShapeAreNamed) {
  const auto st = SafeTensors::parse(make_file(R"({"w":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]}})", 16), "mem");
  EXPECT_NE(error_of([&] { st.at("v"); }).find("tensor 'v' not found in 'mem'; it has: w"), std::string::npos);
  EXPECT_NE(error_of([&] { st.matrix16("w", DType::BF16, 2, 2); }).find("expected dtype BF16, got F32"), std::string::npos);
  const auto st2 = SafeTensors::parse(make_file(R"({"w":{"dtype":"BF16","shape":[2,2],"data_offsets":[0,8]}})", 8), "mem");
  EXPECT_NE(error_of([&] { st2.matrix16("w", DType::BF16, 3, 2); }).find("expected shape [3, 2], got [2, 2]"), std::string::npos);
}

TEST(LayerData, MissingTensorsAndLayers) {
  const auto st = SafeTensors::read(twell::testing::sample_path());
  EXPECT_NE(error_of([&] { load_layer({st}, 4, false); }).find("--layer 4: not in"), std::string::npos);
  const auto only_x = SafeTensors::parse(
      make_file(R"({"layers.2.x":{"dtype":"BF16","shape":[1,4],"data_offsets":[0,8]},"layers.2.gate.weight":{"dtype":"BF16","shape":[2,4],"data_offsets":[8,24]}})", 24),
      "mem");
  EXPECT_NE(error_of([&] { load_layer({only_x}, std::nullopt, false); }).find("tensor 'layers.2.up.weight' not found"), std::string::npos);
  const LayerData d = load_layer({only_x}, std::nullopt, true);
  EXPECT_TRUE(d.random_up_down);
  EXPECT_EQ(d.w_down.size(), 8u);
}

TEST(LayerData, RowShardsAreConcatenated) {
  const auto a = SafeTensors::parse(make_file(R"({"layers.0.gate.weight.rows0":{"dtype":"BF16","shape":[1,2],"data_offsets":[0,4]}})", 4), "a");
  const auto b = SafeTensors::parse(
      make_file(R"({"layers.0.gate.weight.rows1":{"dtype":"BF16","shape":[2,2],"data_offsets":[0,8]},"layers.0.x":{"dtype":"BF16","shape":[3,2],"data_offsets":[8,20]}})", 20),
      "b");
  const LayerData d = load_layer({b, a}, 0, true);
  EXPECT_EQ(d.d_ff, 3);
  EXPECT_EQ(d.w_gate.size(), 6u);
  const auto gap = SafeTensors::parse(make_file(R"({"layers.0.gate.weight.rows3":{"dtype":"BF16","shape":[1,2],"data_offsets":[0,4]}})", 4), "gap");
  EXPECT_NE(error_of([&] { load_layer({a, gap, b}, 0, true); }).find("not contiguous"), std::string::npos);
}

TEST(LayerData, PaperShardsWhenPresent) {
  const auto dir = twell::testing::shared_data_dir();
  if (!std::filesystem::exists(dir / "paper_l1_gate_a.safetensors"))
    GTEST_SKIP() << "real data not found: " << (dir / "paper_l1_gate_a.safetensors").string();
  const LayerData d = load_layer({SafeTensors::read(dir / "paper_l1_gate_a.safetensors"), SafeTensors::read(dir / "paper_l1_gate_b.safetensors"),
                                  SafeTensors::read(dir / "paper_l1_x.safetensors")},
                                 1, true);
  EXPECT_EQ(d.d_model, 2048);
  EXPECT_EQ(d.d_ff, 5632);
  EXPECT_EQ(d.tokens, 1024);
}

TEST(SafeTensors, DirectoriesAndOverflowingShapesAreErrors) {
  EXPECT_NE(error_of([] { SafeTensors::read("/tmp"); }).find("expected a regular file, got a directory"), std::string::npos);
  // 2^32 x 2^32 elements wrap a 64-bit element count to 0: must not "match" 0 bytes.
  EXPECT_NE(error_of([] {
              SafeTensors::parse(make_file(R"({"a":{"dtype":"BF16","shape":[4294967296,4294967296],"data_offsets":[0,0]}})", 0), "f");
            }).find("overflows"),
            std::string::npos);
  EXPECT_NE(error_of([] {
              SafeTensors::parse(make_file(R"({"a":{"dtype":"BF16","shape":[18446744073709551615],"data_offsets":[0,2]}})", 2), "f");
            }).find("shape entries must be integers in 0..2^48"),
            std::string::npos);
}

TEST(LayerData, HugeNumbersInNamesAndDuplicates) {
  const auto big = SafeTensors::parse(make_file(R"({"layers.99999999999.x":{"dtype":"BF16","shape":[1,2],"data_offsets":[0,4]}})", 4), "big");
  EXPECT_TRUE(layers_in({big}).empty());
  const auto shard = SafeTensors::parse(
      make_file(R"({"layers.1.x":{"dtype":"BF16","shape":[1,2],"data_offsets":[0,4]},"layers.1.gate.weight.rows99999999999999999999":{"dtype":"BF16","shape":[1,2],"data_offsets":[4,8]}})", 8),
      "shard");
  EXPECT_NE(error_of([&] { load_layer({shard}, 1, true); }).find("expected a shard name"), std::string::npos);
  const auto st = SafeTensors::read(twell::testing::sample_path());
  EXPECT_NE(error_of([&] { load_layer({st, st}, 1, false); }).find("is in both"), std::string::npos);
  const auto empty_x = SafeTensors::parse(
      make_file(R"({"layers.0.x":{"dtype":"BF16","shape":[0,2],"data_offsets":[0,0]},"layers.0.gate.weight":{"dtype":"BF16","shape":[3,2],"data_offsets":[0,12]}})", 12),
      "empty");
  EXPECT_NE(error_of([&] { load_layer({empty_x}, 0, true); }).find("expected at least one token"), std::string::npos);
}

// Hostile headers (issue 16): nesting deep enough to overflow the stack in a recursive JSON walk, and
// text long enough to make a message of megabytes. Each is a Parse error with a short message.
TEST(SafeTensors, DeepAndHugeHeadersGiveShortErrors) {
  auto nested = [](const std::string& head, int depth, const std::string& tail) {
    return head + std::string(depth, '[') + std::string(depth, ']') + tail;
  };
  for (const int depth : {65, 50000, 70000}) {
    const std::string message = error_of([&] { SafeTensors::parse(make_file(nested(R"({"t": )", depth, "}"), 0), "deep"); });
    EXPECT_NE(message.find("'deep' is not a valid safetensors file: expected a header nested at most 64 levels deep"),
              std::string::npos) << message;
    EXPECT_LT(message.size(), 300u);
  }
  const std::string metadata =
      error_of([&] { SafeTensors::parse(make_file(nested(R"({"__metadata__": {"m": )", 70000, "}}"), 0), "meta"); });
  EXPECT_NE(metadata.find("nested at most 64 levels deep"), std::string::npos) << metadata;
  // 60 levels are within the bound: the entry is wrong, and quoted whole (120 bytes).
  const std::string shallow = error_of([&] { SafeTensors::parse(make_file(nested(R"({"t": )", 60, "}"), 0), "f"); });
  EXPECT_NE(shallow.find("tensor 't': expected {dtype, shape, data_offsets: [begin, end]}, got " + std::string(60, '[') +
                         std::string(60, ']')), std::string::npos) << shallow;

  // Wide instead of deep: an entry of 100000 numbers, a name and a dtype of 100000 bytes.
  std::string wide = "[0";
  for (int i = 1; i < 100000; ++i) wide += ",0";
  wide += "]";
  const std::string long_name(100000, 'n');
  for (const std::string& header :
       {R"({"t": )" + wide + "}", R"({")" + long_name + R"(": 1})",
        R"({"t": {"dtype": ")" + long_name + R"(", "shape": [1], "data_offsets": [0, 1]}})",
        R"({"t": {"dtype": "BF16", "shape": )" + wide + R"(, "data_offsets": [0, 2]}})",
        R"({"t": {"dtype": "BF16", "shape": [")" + long_name + R"("], "data_offsets": [0, 2]}})"}) {
    const std::string message = error_of([&] { SafeTensors::parse(make_file(header, 2), "wide"); });
    EXPECT_NE(message.find("'wide' is not a valid safetensors file: "), std::string::npos) << message.substr(0, 400);
    EXPECT_LT(message.size(), 600u) << message.substr(0, 400);
  }
  EXPECT_NE(error_of([&] { SafeTensors::parse(make_file(R"({"t": )" + wide + "}", 0), "f"); }).find(",0,0... (200001 bytes in all)"),
            std::string::npos);
  EXPECT_NE(error_of([&] { SafeTensors::parse(make_file(R"({"t": {"dtype": "BF16", "shape": )" + wide + R"(, "data_offsets": [0, 2]}})", 2), "f"); })
                .find("tensor 't': expected at most 64 dimensions, got a shape of 100000"),
            std::string::npos);
  // A JSON syntax error after a long string: nlohmann quotes the token, the message cuts it.
  const std::string syntax = error_of([&] { SafeTensors::parse(make_file(R"({"t": ")" + long_name + "\x01", 0), "f"); });
  EXPECT_NE(syntax.find("header is not JSON: "), std::string::npos) << syntax.substr(0, 400);
  EXPECT_LT(syntax.size(), 500u);

  // A missing tensor lists the first 20 names of a file with thousands.
  std::string many = "{";
  for (int i = 0; i < 5000; ++i)
    many += fmt::format(R"({}"t{}": {{"dtype": "BF16", "shape": [0], "data_offsets": [0, 0]}})", i ? "," : "", i);
  many += "}";
  const auto st = SafeTensors::parse(make_file(many, 0), "many");
  const std::string missing = error_of([&] { st.at(long_name); });
  EXPECT_NE(missing.find("tensor 'nnnn"), std::string::npos) << missing.substr(0, 400);
  EXPECT_NE(missing.find(" and 4980 more"), std::string::npos) << missing.substr(0, 400);
  EXPECT_LT(missing.size(), 800u);
}

TEST(LayerData, ManyLayersAndLongShardNamesGiveShortErrors) {
  std::string many = "{";
  for (int i = 0; i < 1000; ++i)
    many += fmt::format(R"({}"layers.{}.x": {{"dtype": "BF16", "shape": [0], "data_offsets": [0, 0]}})", i ? "," : "", i);
  many += "}";
  const auto st = SafeTensors::parse(make_file(many, 0), "many");
  const std::string which = error_of([&] { load_layer({st}, std::nullopt, true); });
  EXPECT_NE(which.find("hold layers [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19 and 980 more]"),
            std::string::npos) << which.substr(0, 400);
  const std::string absent = error_of([&] { load_layer({st}, 5000, true); });
  EXPECT_NE(absent.find("--layer 5000: not in many (layers present: [0, 1, "), std::string::npos) << absent.substr(0, 400);
  EXPECT_LT(absent.size(), 300u);

  const std::string shard_name = "layers.0.gate.weight.rows" + std::string(100000, '9');
  const auto shard = SafeTensors::parse(
      make_file(R"({"layers.0.x":{"dtype":"BF16","shape":[1,2],"data_offsets":[0,4]},")" + shard_name +
                    R"(":{"dtype":"BF16","shape":[1,2],"data_offsets":[4,8]}})", 8),
      "shard");
  const std::string message = error_of([&] { load_layer({shard}, 0, true); });
  EXPECT_NE(message.find("expected a shard name 'layers.0.gate.weight.rows<index>'"), std::string::npos) << message.substr(0, 400);
  EXPECT_NE(message.find("... (100025 bytes in all)"), std::string::npos) << message.substr(0, 400);
  EXPECT_LT(message.size(), 500u);
}
