// CPU reference of TwELL pack/unpack and the format's validity rules (twell/format.h).
#include <cmath>

#include <fmt/format.h>

#include "twell/error.h"
#include "twell/format.h"
#include "twell/half.h"

namespace twell {

void validate_layout(const TwellLayout& l) {
  auto bad = [](const std::string& what) { throw Error(ErrorCode::InvalidArgument, "TwELL layout: " + what); };
  if (l.tile_n < 32 || l.tile_n > 1024 || (l.tile_n & (l.tile_n - 1)) != 0)
    bad(fmt::format("tile_n must be a power of two between 32 and 1024, got {}", l.tile_n));
  if (l.slots < 1 || l.slots > l.tile_n)
    bad(fmt::format("slots must be between 1 and tile_n ({}), got {}", l.tile_n, l.slots));
  if (l.index_bits != 16)
    bad(fmt::format("index_bits must be 16 (16-bit value + 16-bit index = one 32-bit word), got {}", l.index_bits));
  if (!std::isfinite(l.threshold))
    bad(fmt::format("threshold must be finite, got {}", l.threshold));
  if (l.activation == Activation::ReLU && l.threshold < 0.0f)
    bad(fmt::format("threshold for relu must be >= 0, got {}", l.threshold));
  if (l.activation == Activation::SiLU && l.threshold <= 0.0f)
    bad(fmt::format("threshold for silu must be > 0 (|silu(g)| > threshold), got {}", l.threshold));
}

uint16_t activate(const TwellLayout& l, uint16_t g_bits) {
  const float g = to_float(l.value, g_bits);
  if (l.activation == Activation::ReLU) return (g > 0.0f || std::isnan(g)) ? g_bits : from_float(l.value, 0.0f);
  return from_float(l.value, g / (1.0f + std::exp(-g)));
}

bool is_active(const TwellLayout& l, uint16_t a_bits) {
  const float a = to_float(l.value, a_bits);
  return l.activation == Activation::ReLU ? !(a <= l.threshold) : !(std::fabs(a) <= l.threshold);
}

TwellMatrix pack_twell(const TwellLayout& layout, const std::vector<uint16_t>& a, int64_t rows, int64_t d_ff,
                       uint32_t backup_capacity) {
  validate_layout(layout);
  int64_t count = 0;
  if (rows < 0 || d_ff <= 0 || __builtin_mul_overflow(rows, d_ff, &count) || static_cast<int64_t>(a.size()) != count)
    throw Error(ErrorCode::InvalidArgument,
                fmt::format("pack_twell: a: expected {} x {} = {} values, got {}", rows, d_ff, rows * d_ff, a.size()));
  TwellMatrix m;
  m.layout = layout;
  m.rows = rows;
  m.d_ff = d_ff;
  m.backup_capacity = backup_capacity;
  const int64_t tiles = layout.tiles(d_ff), wpr = layout.words_per_row(d_ff);
  m.words.assign(rows * wpr, 0u);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t t = 0; t < tiles; ++t) {
      uint32_t* out = &m.words[r * wpr + t * (layout.slots + 1)];
      const int64_t n0 = t * layout.tile_n, valid = std::min<int64_t>(layout.tile_n, d_ff - n0);
      uint32_t nnz = 0;
      for (int64_t c = 0; c < valid; ++c) nnz += is_active(layout, a[r * d_ff + n0 + c]);
      out[0] = nnz;
      if (nnz <= static_cast<uint32_t>(layout.slots)) {
        uint32_t e = 0;
        for (int64_t c = 0; c < valid; ++c) {
          const uint16_t v = a[r * d_ff + n0 + c];
          if (is_active(layout, v)) out[1 + e++] = (static_cast<uint32_t>(v) << 16) | static_cast<uint32_t>(c);
        }
        continue;
      }
      const uint32_t slot = m.overflow_count++;
      if (slot >= backup_capacity) {
        out[1] = kBackupMissing;
        continue;
      }
      out[1] = slot;
      m.backup.resize(static_cast<size_t>(slot + 1) * layout.tile_n, 0);
      for (int64_t c = 0; c < valid; ++c) {
        const uint16_t v = a[r * d_ff + n0 + c];
        m.backup[static_cast<size_t>(slot) * layout.tile_n + c] = is_active(layout, v) ? v : 0;
      }
    }
  }
  m.backup.resize(static_cast<size_t>(std::min(m.overflow_count, backup_capacity)) * layout.tile_n, 0);
  return m;
}

void validate_twell(const TwellMatrix& m) {
  const TwellLayout& l = m.layout;
  validate_layout(l);
  if (m.rows < 0 || m.d_ff < 1 || m.d_ff > (int64_t{1} << 40))
    throw Error(ErrorCode::InvalidArgument,
                fmt::format("TwELL matrix: expected rows >= 0 and 1 <= d_ff <= 2^40, got rows {}, d_ff {}", m.rows, m.d_ff));
  const int64_t tiles = l.tiles(m.d_ff), wpr = l.words_per_row(m.d_ff);
  int64_t words = 0;
  if (__builtin_mul_overflow(m.rows, wpr, &words) || static_cast<int64_t>(m.words.size()) != words)
    throw Error(ErrorCode::InvalidArgument,
                fmt::format("TwELL matrix: expected {} rows x {} words, got {} words", m.rows, wpr, m.words.size()));
  const size_t backup_rows = std::min(m.overflow_count, m.backup_capacity);
  if (m.backup.size() != backup_rows * static_cast<size_t>(l.tile_n))
    throw Error(ErrorCode::InvalidArgument,
                fmt::format("TwELL matrix: expected a backup of min(overflow count {}, capacity {}) x tile_n {} values, got {}",
                            m.overflow_count, m.backup_capacity, l.tile_n, m.backup.size()));
  uint32_t overflows = 0;
  for (int64_t r = 0; r < m.rows; ++r) {
    for (int64_t t = 0; t < tiles; ++t) {
      const uint32_t* w = &m.words[r * wpr + t * (l.slots + 1)];
      const int64_t valid = std::min<int64_t>(l.tile_n, m.d_ff - t * l.tile_n);
      auto fail = [&](const std::string& what) {
        throw Error(ErrorCode::InvalidArgument, fmt::format("TwELL matrix: row {}, tile {}: {}", r, t, what));
      };
      if (w[0] > static_cast<uint32_t>(valid)) fail(fmt::format("nnz {} exceeds the tile's {} columns", w[0], valid));
      if (w[0] > static_cast<uint32_t>(l.slots)) {
        ++overflows;
        if (w[1] != kBackupMissing && w[1] >= std::min(m.overflow_count, m.backup_capacity))
          fail(fmt::format("backup index {} out of range (capacity {}, overflow count {})", w[1], m.backup_capacity,
                           m.overflow_count));
        continue;
      }
      int64_t prev = -1;
      for (uint32_t e = 0; e < w[0]; ++e) {
        const int64_t c = w[1 + e] & 0xFFFFu;
        if (c <= prev || c >= valid) fail(fmt::format("entry {}: column {} not ascending or out of range", e, c));
        if (!is_active(l, static_cast<uint16_t>(w[1 + e] >> 16))) fail(fmt::format("entry {}: value is not active", e));
        prev = c;
      }
    }
  }
  if (overflows != m.overflow_count)
    throw Error(ErrorCode::InvalidArgument, fmt::format("TwELL matrix: {} overflowing tile-rows, overflow count says {}",
                                                        overflows, m.overflow_count));
}

std::vector<uint16_t> unpack_twell(const TwellMatrix& m) {
  validate_twell(m);  // every index below is then in range
  const TwellLayout& l = m.layout;
  const int64_t tiles = l.tiles(m.d_ff), wpr = l.words_per_row(m.d_ff);
  std::vector<uint16_t> a(m.rows * m.d_ff, 0);
  for (int64_t r = 0; r < m.rows; ++r) {
    for (int64_t t = 0; t < tiles; ++t) {
      const uint32_t* w = &m.words[r * wpr + t * (l.slots + 1)];
      const int64_t n0 = t * l.tile_n, valid = std::min<int64_t>(l.tile_n, m.d_ff - n0);
      if (w[0] <= static_cast<uint32_t>(l.slots)) {
        for (uint32_t e = 0; e < w[0]; ++e) a[r * m.d_ff + n0 + (w[1 + e] & 0xFFFFu)] = static_cast<uint16_t>(w[1 + e] >> 16);
      } else if (w[1] == kBackupMissing) {
        throw Error(ErrorCode::InvalidArgument,
                    fmt::format("unpack_twell: row {}, tile {} overflowed a full backup; it must be recomputed from x", r, t));
      } else {
        for (int64_t c = 0; c < valid; ++c) a[r * m.d_ff + n0 + c] = m.backup[static_cast<size_t>(w[1]) * l.tile_n + c];
      }
    }
  }
  return a;
}

}  // namespace twell
