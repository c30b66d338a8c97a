// The TwELL format on the host: the CPU reference of pack and unpack (README.md, "The TwELL format").
//
// Bit layout (TwellLayout in spec.h): H [m, d_ff] is cut into tiles of tile_n columns; tile-row
// (r, t) owns words [r * words_per_row + t * (slots + 1), ... + slots]:
//   word 0      nnz of the tile-row (its true count, also when it exceeds slots)
//   nnz <= slots: words 1..nnz = (value bits << 16) | (column - t * tile_n), ascending column order;
//                 words after nnz are unspecified (never read)
//   nnz >  slots: overflow; word 1 = index b of the tile-row in the backup area, whose row b holds the
//                 tile-row densely (tile_n values, inactive ones +0), or kBackupMissing when the
//                 backup was full (consumers then recompute the tile-row from x and Wg)
// The producer counts overflowing tile-rows in `overflow_count` (it may exceed the backup capacity;
// the host grows the backup from it). Backup indices are claimed in any order; the result does not
// depend on which index a tile-row got.
#pragma once
#include <cstdint>
#include <vector>

#include "twell/device/params.h"
#include "twell/spec.h"

namespace twell {

using device::kBackupMissing;

struct TwellMatrix {
  TwellLayout layout;
  int64_t rows = 0;
  int64_t d_ff = 0;
  std::vector<uint32_t> words;    // [rows, layout.words_per_row(d_ff)]
  std::vector<uint16_t> backup;   // [backup_capacity, tile_n]
  uint32_t backup_capacity = 0;
  uint32_t overflow_count = 0;
};

// Activated values a = act(g) of a dense pre-activation matrix g [rows, d_ff] (bits of layout.value).
uint16_t activate(const TwellLayout& layout, uint16_t g_bits);
bool is_active(const TwellLayout& layout, uint16_t a_bits);

// Packs the activated matrix a [rows, d_ff] (row stride d_ff). Overflowing tile-rows take backup rows
// in row-major (row, tile) order until `backup_capacity` is used up, then get kBackupMissing.
// Throws Error(InvalidArgument) if a.size() != rows * d_ff or the layout is illegal.
TwellMatrix pack_twell(const TwellLayout& layout, const std::vector<uint16_t>& a, int64_t rows, int64_t d_ff,
                       uint32_t backup_capacity);

// Unpacks to dense [rows, d_ff] activated values (inactive = +0). Validates first (validate_twell).
// A tile-row marked kBackupMissing cannot be unpacked from the matrix alone: throws
// Error(InvalidArgument) naming the row and tile.
std::vector<uint16_t> unpack_twell(const TwellMatrix& m);

// Checks a TwELL matrix (e.g. written by a kernel): sizes of words and backup against rows, d_ff,
// layout and counts; headers, column order and ranges, values active, backup indices.
// Throws Error(InvalidArgument) describing the first violation (row, tile, word).
void validate_twell(const TwellMatrix& m);

// Checks the layout's parameters (the same rules as the dialect's verifier); throws
// Error(InvalidArgument) naming the parameter, the expected range and the given value.
void validate_layout(const TwellLayout& layout);

}  // namespace twell
