// The attention mask as one policy object: causal (bottom-right), sliding window and the
// sequence bounds of a (possibly ragged) sequence, with the block trip counts derived from it.
// One runtime-parameterised type instead of bool template flags: the hot loop only asks
// "does this block need per-element masking?", and the answer is a couple of compares.
// Shared by the reference, the cpu tiled path and the GPU kernels (forward and backward).
#pragma once

#include "common/hd.h"
#include "common/params.h"

namespace flashattn {

struct Mask {
  int seqlen_q = 0;
  int seqlen_k = 0;
  int window_left = -1;   // -1 = unbounded
  int window_right = -1;  // -1 = unbounded

  Mask() = default;
  // A window at least as wide as the sequence is unbounded; normalizing it here keeps the
  // int arithmetic below from overflowing for huge windows (e.g. INT_MAX).
  FA_HD Mask(int sq, int sk, int left, int right)
      : seqlen_q(sq),
        seqlen_k(sk),
        window_left(left >= sk ? -1 : left),
        window_right(right >= sq ? -1 : right) {}
  FA_HD Mask(const MaskOptions& o, int sq, int sk) : Mask(sq, sk, o.window_left, o.window_right) {}

  // Bottom-right alignment: the last query row lines up with the last key.
  FA_HD int diagonal_offset() const { return seqlen_k - seqlen_q; }

  // Keys row `i` may see: [key_begin(i), key_end(i)), possibly empty.
  FA_HD int key_begin(int i) const {
    if (window_left < 0) return 0;
    int b = i + diagonal_offset() - window_left;
    return b < 0 ? 0 : (b > seqlen_k ? seqlen_k : b);
  }
  FA_HD int key_end(int i) const {
    if (window_right < 0) return seqlen_k;
    int e = i + diagonal_offset() + window_right + 1;
    return e < 0 ? 0 : (e > seqlen_k ? seqlen_k : e);
  }
  FA_HD bool allowed(int i, int j) const {
    return i >= 0 && i < seqlen_q && j >= key_begin(i) && j < key_end(i);
  }
  FA_HD bool row_empty(int i) const { return key_end(i) <= key_begin(i); }

  // Queries key `j` is seen by: [query_begin(j), query_end(j)). Used by the backward,
  // which iterates over key blocks and needs the query rows that reach them.
  FA_HD int query_begin(int j) const {
    if (window_right < 0) return 0;
    int b = j - diagonal_offset() - window_right;
    return b < 0 ? 0 : (b > seqlen_q ? seqlen_q : b);
  }
  FA_HD int query_end(int j) const {
    if (window_left < 0) return seqlen_q;
    int e = j - diagonal_offset() + window_left + 1;
    return e < 0 ? 0 : (e > seqlen_q ? seqlen_q : e);
  }

  // Key blocks (size block_n) that rows [row0, row0 + block_m) touch: [n_begin, n_end).
  // key_begin/key_end are monotone non-decreasing in i, so the block's first and last rows
  // bound the range. Empty (n_begin >= n_end) when every row of the block is fully masked.
  FA_HD void key_block_range(int row0, int block_m, int block_n, int* n_begin, int* n_end) const {
    int last = row0 + block_m - 1;
    if (last > seqlen_q - 1) last = seqlen_q - 1;
    int kb = key_begin(row0);
    int ke = key_end(last);
    *n_begin = kb / block_n;
    *n_end = ke > kb ? (ke + block_n - 1) / block_n : *n_begin;
  }

  // Query blocks (size block_m) that touch keys [col0, col0 + block_n): [m_begin, m_end).
  FA_HD void query_block_range(int col0, int block_n, int block_m, int* m_begin,
                               int* m_end) const {
    int last = col0 + block_n - 1;
    if (last > seqlen_k - 1) last = seqlen_k - 1;
    int qb = query_begin(col0);
    int qe = query_end(last);
    *m_begin = qb / block_m;
    *m_end = qe > qb ? (qe + block_m - 1) / block_m : *m_begin;
  }

  // True when some element of the tile rows [row0, row0+bm) x cols [col0, col0+bn) is masked
  // or out of bounds. Interior tiles skip per-element masking entirely.
  FA_HD bool tile_needs_mask(int row0, int bm, int col0, int bn) const {
    return row0 + bm > seqlen_q || tile_needs_key_mask(row0, bm, col0, bn);
  }
  // The same, counting only the rows below seqlen_q: for kernels whose rows past the end hold
  // finite scores and are never stored (the sm90 forward), a partial last query tile then
  // takes the unmasked path on its interior key blocks instead of masking every block.
  FA_HD bool tile_needs_key_mask(int row0, int bm, int col0, int bn) const {
    const int rows = seqlen_q - row0 < bm ? seqlen_q - row0 : bm;
    if (rows <= 0) return false;  // no row is kept
    if (col0 + bn > seqlen_k) return true;
    // Every row must see every column of the tile. key_begin and key_end are monotone in the
    // row, so the last row's begin and the first row's end are the binding constraints.
    if (window_left >= 0 && key_begin(row0 + rows - 1) > col0) return true;
    if (window_right >= 0 && key_end(row0) < col0 + bn) return true;
    return false;
  }
};

// Deterministic backward: the key blocks that add into query block m_block's dQ do so in
// decreasing order, the order in which they reach it (a key block starts at its first query
// block, which moves down with the block under causal/local masks). The key blocks reaching a
// query block are contiguous (the bounds are monotone), so those before n_block (which reaches
// m_block) are the ones after it up to the last whose query range starts at or before m_block.
// tests/test_cpu.cpp (DeterministicDqOrder) checks this against a count by brute force.
FA_HD int dq_adds_before(const Mask& mask, int n_block, int m_block, int block_m, int block_n) {
  int lo = n_block, hi = (mask.seqlen_k + block_n - 1) / block_n - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    int mb, me;
    mask.query_block_range(mid * block_n, block_n, block_m, &mb, &me);
    if (mb <= m_block) lo = mid; else hi = mid - 1;
  }
  return lo - n_block;
}

// Mask of batch entry b from the shared params (varlen-aware).
FA_HD Mask make_mask(const MaskOptions& o, const SeqBounds& sb) {
  return Mask(o, sb.seqlen_q, sb.seqlen_k);
}

}  // namespace flashattn
