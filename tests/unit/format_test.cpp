// TwELL pack/unpack on the CPU: round trips at several densities, ordering, the overflow protocol,
// and the layout rules.
#include <gtest/gtest.h>

#include "test_data.h"
#include "twell/error.h"
#include "twell/format.h"

using namespace twell;

namespace {

// A random activated matrix (relu semantics: about `density` of entries positive, the rest +0).
std::vector<uint16_t> random_activations(int64_t rows, int64_t cols, double density, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(0.0f, 1.0f);
  std::vector<uint16_t> a(rows * cols);
  for (auto& v : a) v = u(rng) < density ? float_to_bf16(0.01f + u(rng)) : 0;
  return a;
}

}  // namespace

TEST(TwellFormat, RoundTripAtManyDensities) {
  for (double density : {0.0, 0.005, 0.02, 0.1, 0.5, 1.0}) {
    for (int tile_n : {32, 256, 1024}) {
      TwellLayout l;
      l.tile_n = tile_n;
      l.slots = tile_n / 8 - 1;
      const int64_t rows = 37, cols = 1408;  // 1408 is not a multiple of 256 or 1024: a partial last tile
      const auto a = random_activations(rows, cols, density, 7);
      const TwellMatrix m = pack_twell(l, a, rows, cols, UINT32_MAX);
      ASSERT_NO_THROW(validate_twell(m));
      EXPECT_EQ(unpack_twell(m), a) << "density " << density << " tile_n " << tile_n;
      if (density >= 0.5) {
        EXPECT_GT(m.overflow_count, 0u);
      }
    }
  }
}

TEST(TwellFormat, EntriesAscendingWithCountHeader) {
  TwellLayout l;
  l.tile_n = 32;
  l.slots = 4;
  std::vector<uint16_t> a(64, 0);
  a[3] = float_to_bf16(1.0f);
  a[1] = float_to_bf16(2.0f);
  a[40] = float_to_bf16(3.0f);
  const TwellMatrix m = pack_twell(l, a, 1, 64, 0);
  ASSERT_EQ(m.words.size(), 10u);
  EXPECT_EQ(m.words[0], 2u);
  EXPECT_EQ(m.words[1], (uint32_t{float_to_bf16(2.0f)} << 16) | 1u);
  EXPECT_EQ(m.words[2], (uint32_t{float_to_bf16(1.0f)} << 16) | 3u);
  EXPECT_EQ(m.words[5], 1u);
  EXPECT_EQ(m.words[6], (uint32_t{float_to_bf16(3.0f)} << 16) | 8u);  // column inside its tile
}

TEST(TwellFormat, OverflowGoesToBackupThenMissing) {
  TwellLayout l;
  l.tile_n = 32;
  l.slots = 2;
  std::vector<uint16_t> a(3 * 32, 0);
  for (int r = 0; r < 3; ++r)
    for (int c = 0; c < 5; ++c) a[r * 32 + c * 3] = float_to_bf16(1.0f + r + c);
  const TwellMatrix m = pack_twell(l, a, 3, 32, 2);
  EXPECT_EQ(m.overflow_count, 3u);
  EXPECT_EQ(m.words[0 * 3 + 1], 0u);
  EXPECT_EQ(m.words[1 * 3 + 1], 1u);
  EXPECT_EQ(m.words[2 * 3 + 1], kBackupMissing);
  EXPECT_EQ(m.words[2 * 3 + 0], 5u) << "the header keeps the true count";
  EXPECT_NO_THROW(validate_twell(m));
  EXPECT_THROW(unpack_twell(m), Error);  // the third row must be recomputed from x
  const TwellMatrix full = pack_twell(l, a, 3, 32, 3);
  EXPECT_EQ(unpack_twell(full), a);
}

TEST(TwellFormat, ValidateCatchesCorruption) {
  TwellLayout l;
  l.tile_n = 32;
  l.slots = 8;
  auto a = random_activations(4, 64, 0.1, 3);
  TwellMatrix m = pack_twell(l, a, 4, 64, 8);
  ASSERT_NO_THROW(validate_twell(m));
  TwellMatrix bad = m;
  for (size_t i = 0; i < bad.words.size(); i += 9)
    if (bad.words[i] >= 2) {
      std::swap(bad.words[i + 1], bad.words[i + 2]);
      break;
    }
  EXPECT_THROW(validate_twell(bad), Error);
  bad = m;
  bad.words[0] = 33;
  EXPECT_THROW(validate_twell(bad), Error);
}

TEST(TwellFormat, LayoutRulesNameTheParameter) {
  auto message = [](TwellLayout l) {
    try {
      validate_layout(l);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  TwellLayout l;
  l.tile_n = 300;
  EXPECT_NE(message(l).find("tile_n must be a power of two between 32 and 1024, got 300"), std::string::npos);
  l = {};
  l.slots = 0;
  EXPECT_NE(message(l).find("slots must be between 1 and tile_n (256), got 0"), std::string::npos);
  l = {};
  l.threshold = -1;
  EXPECT_NE(message(l).find("threshold for relu must be >= 0, got -1"), std::string::npos);
  l = {};
  l.activation = Activation::SiLU;
  EXPECT_NE(message(l).find("threshold for silu must be > 0"), std::string::npos);
  l = {};
  l.index_bits = 8;
  EXPECT_NE(message(l).find("index_bits must be 16"), std::string::npos);
  EXPECT_THROW(pack_twell(TwellLayout{}, std::vector<uint16_t>(10), 2, 6, 0), Error);
}

TEST(TwellFormat, NaNIsActive) {
  TwellLayout l;
  l.tile_n = 32;
  l.slots = 4;
  std::vector<uint16_t> a(32, 0);
  a[5] = 0x7FC0;  // bf16 NaN
  const TwellMatrix m = pack_twell(l, a, 1, 32, 0);
  EXPECT_EQ(m.words[0], 1u);
  EXPECT_EQ(m.words[1] & 0xFFFFu, 5u);
}

TEST(TwellFormat, InconsistentMatricesAreRejectedNotRead) {
  TwellLayout l;
  l.tile_n = 32;
  l.slots = 1;
  std::vector<uint16_t> a(2 * 64, 0);
  for (int c = 0; c < 4; ++c) a[c] = float_to_bf16(1.0f);
  TwellMatrix m = pack_twell(l, a, 2, 64, 1);
  TwellMatrix bad = m;
  bad.backup.clear();  // the header points into a backup that is not there
  EXPECT_THROW(unpack_twell(bad), Error);
  bad = m;
  bad.words.clear();
  EXPECT_THROW(unpack_twell(bad), Error);
  bad = m;
  bad.words[2 * 2 + 0] = 1;  // row 0, tile 1: one entry ...
  bad.words[2 * 2 + 1] = 60000;  // ... whose column is outside the tile
  EXPECT_THROW(unpack_twell(bad), Error);
  bad = m;
  bad.rows = -1;
  EXPECT_THROW(validate_twell(bad), Error);
  bad = m;
  bad.layout.tile_n = 0;
  EXPECT_THROW(unpack_twell(bad), Error);
}
