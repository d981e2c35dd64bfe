// The tiled CPU path against the fp64 oracle (every option, fp16/bf16/fp32/fp64, ragged and
// unequal lengths, layouts), fully masked rows, determinism, the C ABI route to it, and the
// mask policy (src/common/mask.h) that it shares with the GPU kernels.
#include <gtest/gtest.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <random>
#include <string>
#include <vector>

#include "api/backend.h"
#include "common/headdim.h"
#include "common/mask.h"
#include "common/params.h"
#include "common/softmax.h"
#include "cpu/cpu_attention.h"
#include "common/parallel.h"
#include "test_util.h"

#if defined(__linux__) && defined(__GLIBC__)
#include <dlfcn.h>
#include <pthread.h>

#include <atomic>
#include <thread>
// Counts the threads this process starts, timing-free evidence of how many workers a call used:
// this executable's pthread_create interposes on libc's for libflashattn and libstdc++ too.
static std::atomic<int> g_threads_created{0};
extern "C" int pthread_create(pthread_t* t, const pthread_attr_t* attr, void* (*fn)(void*), void* arg) {
  using Fn = int (*)(pthread_t*, const pthread_attr_t*, void* (*)(void*), void*);
  static Fn real = reinterpret_cast<Fn>(dlsym(RTLD_NEXT, "pthread_create"));
  g_threads_created.fetch_add(1);
  return real(t, attr, fn, arg);
}
#define FA_COUNTS_THREADS 1
#endif

namespace flashattn::test {
namespace {

constexpr flashattn_dtype kF16 = FLASHATTN_DTYPE_FP16;
constexpr flashattn_dtype kBF16 = FLASHATTN_DTYPE_BF16;
constexpr flashattn_dtype kF32 = FLASHATTN_DTYPE_FP32;
constexpr flashattn_dtype kF64 = FLASHATTN_DTYPE_FP64;

// ---- the mask policy -----------------------------------------------------------------------

// The rule exactly as include/flashattn/flashattn.h states it.
bool header_allows(int i, int j, int sq, int sk, int wl, int wr) {
  if (i < 0 || i >= sq || j < 0 || j >= sk) return false;
  if (wl >= 0 && int64_t(j) < int64_t(i) + (sk - sq) - wl) return false;
  if (wr >= 0 && int64_t(j) > int64_t(i) + (sk - sq) + wr) return false;
  return true;
}

struct MaskCase {
  int sq, sk, wl, wr;
};

std::vector<MaskCase> random_mask_cases(int n) {
  std::mt19937_64 rng(fresh_seed());
  std::vector<MaskCase> out;
  auto window = [&]() -> int {
    switch (rng() % 5) {
      case 0: return -1;
      case 1: return 0;
      case 2: return INT_MAX;  // huge windows behave as unbounded
      default: return int(rng() % 40);
    }
  };
  for (int t = 0; t < n; ++t) out.push_back({int(rng() % 90), int(rng() % 90), window(), window()});
  out.push_back({0, 5, 2, 0});
  out.push_back({5, 0, -1, 0});
  out.push_back({1, 1, 0, 0});
  return out;
}

std::string str(const MaskCase& m) {
  return "sq=" + std::to_string(m.sq) + " sk=" + std::to_string(m.sk) + " window=(" + std::to_string(m.wl) + "," +
         std::to_string(m.wr) + ")";
}

TEST(MaskPolicy, MatchesHeaderRule) {
  for (const MaskCase& mc : random_mask_cases(300)) {
    const Mask m(mc.sq, mc.sk, mc.wl, mc.wr);
    for (int i = 0; i < mc.sq; ++i) {
      int n = 0;
      for (int j = 0; j < mc.sk; ++j) {
        const bool want = header_allows(i, j, mc.sq, mc.sk, mc.wl, mc.wr);
        ASSERT_EQ(m.allowed(i, j), want) << str(mc) << " i=" << i << " j=" << j;
        ASSERT_EQ(j >= m.key_begin(i) && j < m.key_end(i), want) << str(mc) << " i=" << i << " j=" << j;
        ASSERT_EQ(i >= m.query_begin(j) && i < m.query_end(j), want) << str(mc) << " i=" << i << " j=" << j;
        n += want;
      }
      ASSERT_EQ(m.row_empty(i), n == 0) << str(mc) << " i=" << i;
    }
  }
}

// Block trip counts: the key blocks a row block visits are exactly those holding a key some
// row of the block may see (coverage: nothing skipped; tightness: no wasted block).
TEST(MaskPolicy, KeyBlockRangeIsExact) {
  for (const MaskCase& mc : random_mask_cases(300)) {
    const Mask m(mc.sq, mc.sk, mc.wl, mc.wr);
    for (int bm : {1, 3, 16, 64, 128})
      for (int bn : {1, 5, 16, 64, 128})
        for (int row0 = 0; row0 < mc.sq; row0 += bm) {
          int nb, ne;
          m.key_block_range(row0, bm, bn, &nb, &ne);
          const int rows_end = std::min(row0 + bm, mc.sq);
          std::vector<char> needed(size_t((mc.sk + bn - 1) / bn), 0);
          for (int i = row0; i < rows_end; ++i)
            for (int j = 0; j < mc.sk; ++j)
              if (header_allows(i, j, mc.sq, mc.sk, mc.wl, mc.wr)) needed[size_t(j / bn)] = 1;
          for (int n = 0; n < int(needed.size()); ++n) {
            const bool visited = n >= nb && n < ne;
            ASSERT_EQ(visited, bool(needed[size_t(n)]))
                << str(mc) << " bm=" << bm << " bn=" << bn << " row0=" << row0 << " block " << n << " range [" << nb
                << "," << ne << ")";
          }
          if (ne > nb) {
            ASSERT_GE(nb, 0);
            ASSERT_LE(ne, int(needed.size()));
          }
        }
  }
}

TEST(MaskPolicy, QueryBlockRangeIsExact) {
  for (const MaskCase& mc : random_mask_cases(300)) {
    const Mask m(mc.sq, mc.sk, mc.wl, mc.wr);
    for (int bn : {1, 3, 16, 64, 128})
      for (int bm : {1, 5, 16, 64, 128})
        for (int col0 = 0; col0 < mc.sk; col0 += bn) {
          int mb, me;
          m.query_block_range(col0, bn, bm, &mb, &me);
          const int cols_end = std::min(col0 + bn, mc.sk);
          std::vector<char> needed(size_t((mc.sq + bm - 1) / bm), 0);
          for (int j = col0; j < cols_end; ++j)
            for (int i = 0; i < mc.sq; ++i)
              if (header_allows(i, j, mc.sq, mc.sk, mc.wl, mc.wr)) needed[size_t(i / bm)] = 1;
          for (int x = 0; x < int(needed.size()); ++x) {
            const bool visited = x >= mb && x < me;
            ASSERT_EQ(visited, bool(needed[size_t(x)]))
                << str(mc) << " bn=" << bn << " bm=" << bm << " col0=" << col0 << " block " << x << " range [" << mb
                << "," << me << ")";
          }
        }
  }
}

// By brute force: some element of rows [row0, rows_end) x cols [col0, col0 + bn) is masked or
// out of bounds.
bool tile_has_masked(const MaskCase& mc, int row0, int rows_end, int col0, int bn) {
  for (int i = row0; i < rows_end; ++i)
    for (int j = col0; j < col0 + bn; ++j)
      if (!header_allows(i, j, mc.sq, mc.sk, mc.wl, mc.wr)) return true;
  return false;
}

// tile_needs_mask may say true for a clean tile (a missed optimisation) but never false for a
// tile with a masked or out-of-bounds element (a wrong answer). Tiles of any size and offset.
TEST(MaskPolicy, TileNeedsMaskIsConservative) {
  std::mt19937_64 rng(fresh_seed());
  for (const MaskCase& mc : random_mask_cases(300)) {
    const Mask m(mc.sq, mc.sk, mc.wl, mc.wr);
    for (int t = 0; t < 60; ++t) {
      const int bm = 1 + int(rng() % 70), bn = 1 + int(rng() % 70);
      const int row0 = int(rng() % (mc.sq + 1)), col0 = int(rng() % (mc.sk + 1));
      const bool masked = tile_has_masked(mc, row0, row0 + bm, col0, bn);
      if (masked) {
        ASSERT_TRUE(m.tile_needs_mask(row0, bm, col0, bn))
            << str(mc) << " tile rows [" << row0 << "," << row0 + bm << ") cols [" << col0 << "," << col0 + bn << ")";
      } else {
        EXPECT_FALSE(m.tile_needs_mask(row0, bm, col0, bn)) << "a clean tile is masked: " << str(mc);
      }
    }
  }
}

// tile_needs_key_mask counts only the rows below seqlen_q (the sm90 forward leaves rows past the
// end unmasked and never stores them): true exactly when a kept row has a masked or
// out-of-bounds key in the tile, so a partial last query tile's interior blocks run unmasked.
TEST(MaskPolicy, TileNeedsKeyMaskIsExactOverKeptRows) {
  std::mt19937_64 rng(fresh_seed());
  int partial_clean = 0;
  for (const MaskCase& mc : random_mask_cases(300)) {
    const Mask m(mc.sq, mc.sk, mc.wl, mc.wr);
    for (int t = 0; t < 60; ++t) {
      const int bm = 1 + int(rng() % 70), bn = 1 + int(rng() % 70);
      const int row0 = int(rng() % (mc.sq + 1)), col0 = int(rng() % (mc.sk + 1));
      const bool masked = tile_has_masked(mc, row0, std::min(row0 + bm, mc.sq), col0, bn);  // kept rows only
      ASSERT_EQ(m.tile_needs_key_mask(row0, bm, col0, bn), masked)
          << str(mc) << " tile rows [" << row0 << "," << row0 + bm << ") cols [" << col0 << "," << col0 + bn << ")";
      // Never more than tile_needs_mask, which also counts the rows past the end.
      if (masked) ASSERT_TRUE(m.tile_needs_mask(row0, bm, col0, bn));
      partial_clean += row0 < mc.sq && row0 + bm > mc.sq && !masked;
    }
  }
  EXPECT_GT(partial_clean, 0) << "no partial tile with a clean kept part was drawn";
  // The case that motivated it: seqlen 4096 in 192-row tiles ends with 64 kept rows.
  const Mask none(4096, 4096, -1, -1);
  EXPECT_FALSE(none.tile_needs_key_mask(21 * 192, 192, 0, 128));
  EXPECT_TRUE(none.tile_needs_mask(21 * 192, 192, 0, 128));
}

// The GPU paths' head-dim rounding (common/headdim.h): a head dim runs on the smallest compiled
// kernel at least as wide; not a multiple of 8, or wider than every kernel: none.
TEST(KernelHeadDim, NextCompiledKernelOrNone) {
  static constexpr int kSm90[] = {64, 96, 128, 192, 256, 0};
  static constexpr int kSm80[] = {32, 64, 96, 128, 192, 256, 0};
  static constexpr int kNone[] = {0};
  const int want90[][2] = {{8, 64}, {16, 64}, {40, 64}, {64, 64}, {72, 96}, {80, 96}, {96, 96}, {104, 128},
                           {112, 128}, {128, 128}, {136, 192}, {160, 192}, {192, 192}, {200, 256}, {224, 256},
                           {256, 256}, {264, 0}, {59, 0}, {111, 0}, {0, 0}, {-8, 0}};
  for (const auto& w : want90) EXPECT_EQ(kernel_headdim_for(w[0], kSm90), w[1]) << "headdim " << w[0];
  EXPECT_EQ(kernel_headdim_for(16, kSm80), 32);
  EXPECT_EQ(kernel_headdim_for(40, kSm80), 64);
  EXPECT_EQ(kernel_headdim_for(64, kNone), 0);
  static_assert(kernel_headdim_for(80, kSm90) == 96, "usable in constant expressions");
}

TEST(MaskPolicy, InteriorTilesSkipMasking) {
  // No mask: every in-bounds tile is clean. Causal 256 x 256 with 64-tiles: the 6 tiles
  // strictly below the diagonal are clean, the 4 on it are not.
  const Mask none(256, 256, -1, -1);
  const Mask causal(256, 256, -1, 0);
  int clean = 0;
  for (int r = 0; r < 4; ++r)
    for (int c = 0; c < 4; ++c) {
      EXPECT_FALSE(none.tile_needs_mask(r * 64, 64, c * 64, 64));
      if (c < r) {
        EXPECT_FALSE(causal.tile_needs_mask(r * 64, 64, c * 64, 64));
      }
      if (c == r) {
        EXPECT_TRUE(causal.tile_needs_mask(r * 64, 64, c * 64, 64));
      }
      clean += c <= r && !causal.tile_needs_mask(r * 64, 64, c * 64, 64);
    }
  EXPECT_EQ(clean, 6);
}

// The backward's dQ accumulator tiles (dq_tile_index, common/params.h) as the sm80 kernels place
// them: every tile inside the first dq_accum_rows(total_q, batch, 128) rows for any cu_seqlens
// the kernels may see (seq_bounds clamps unchecked device values), and no tile shared by two
// sequences when the cu_seqlens are valid. Fixed length: qrow0 = b * seqlen_q.
TEST(DqAccumTiles, InsideTheWorkspaceAndDisjointAcrossSequences) {
  const uint64_t seed = fresh_seed();
  std::mt19937_64 rng(seed);
  const int lens[] = {0, 1, 7, 63, 64, 65, 113, 127, 128, 129, 203, 799, 1023, 4097};
  const int n_lens = int(sizeof(lens) / sizeof(lens[0]));
  int tiles_checked = 0;
  for (int trial = 0; trial < 3000; ++trial) {
    const int batch = 1 + int(rng() % 9);
    const bool varlen = trial % 3 != 0;
    const bool corrupt = varlen && trial % 3 == 2;  // unchecked device cu_seqlens
    std::vector<int32_t> cu(size_t(batch) + 1, 0);
    const int fixed_len = lens[rng() % n_lens];
    int max_len = 0;
    for (int b = 0; b < batch; ++b) {
      const int len = varlen ? lens[rng() % n_lens] : fixed_len;
      cu[size_t(b) + 1] = cu[size_t(b)] + len;
      max_len = std::max(max_len, len);
    }
    flashattn::Shape shape;
    shape.batch = batch;
    shape.seqlen_q = shape.seqlen_k = max_len;
    shape.total_q = shape.total_k = cu[size_t(batch)];
    shape.nheads_q = shape.nheads_kv = 1;
    shape.headdim = 64;
    if (corrupt)
      for (int k = 0; k < 3; ++k) cu[rng() % cu.size()] = int32_t(rng() % (shape.total_q + 300)) - 150;
    const int64_t rows = flashattn::dq_accum_rows(shape.total_q, batch, 128);
    for (int block_m : {64, 128}) {
      int64_t prev_last = -1;
      for (int b = 0; b < batch; ++b) {
        const flashattn::SeqBounds sb =
            flashattn::seq_bounds(shape, varlen ? cu.data() : nullptr, varlen ? cu.data() : nullptr, b);
        const int64_t qrow0 = varlen ? sb.q_offset : int64_t(b) * shape.seqlen_q;
        const int n_blocks = (sb.seqlen_q + block_m - 1) / block_m;
        if (n_blocks == 0) continue;
        const int64_t first = flashattn::dq_tile_index(qrow0, b, 0, block_m);
        const int64_t last = flashattn::dq_tile_index(qrow0, b, n_blocks - 1, block_m);
        const std::string where = "seed " + std::to_string(seed) + " trial " + std::to_string(trial) + " b " +
                                  std::to_string(b) + " block_m " + std::to_string(block_m);
        ASSERT_EQ(last - first, n_blocks - 1) << where;
        ASSERT_GE(first, 0) << where;
        ASSERT_LE((last + 1) * block_m, rows) << where;
        // The sm90 backward reserves its own block's rows only (sm90/bwd_workspace.h).
        ASSERT_LE((last + 1) * block_m, flashattn::dq_accum_rows(shape.total_q, batch, block_m) + block_m - 1)
            << where;
        if (!corrupt) ASSERT_GT(first, prev_last) << where;
        prev_last = last;
        tiles_checked += n_blocks;
      }
    }
  }
  EXPECT_GT(tiles_checked, 10000);
}

// The lazy max (sm90 forward) against the eager one over rows of blocks with masked (-inf)
// starts, outlier jumps (forcing an update) and drift within the slack: same output and LSE,
// every exp2 term <= 2^slack, and far fewer rescales.
// ---- online softmax (src/common/softmax.h) ---------------------------------------------------

TEST(OnlineSoftmax, LazyMaxMatchesEagerAndBoundsTerms) {
  std::mt19937_64 rng(20261123);
  std::normal_distribution<double> nd(0.0, 3.0);
  const float slack = 8.f;
  int eager_rescales = 0, lazy_rescales = 0;
  for (int row = 0; row < 200; ++row) {
    const int blocks = 1 + int(rng() % 40), bn = 16;
    OnlineSoftmaxRow eager, lazy;
    eager.init();
    lazy.init();
    double oe = 0, ol = 0;  // sum of p * value
    for (int b = 0; b < blocks; ++b) {
      float s[bn], val[bn];
      const bool masked = b < int(row % 3);  // leading fully masked blocks
      const double shift = (rng() % 7 == 0) ? 6.0 * double(rng() % 5) : 0.0;  // jumps of 0..24
      float mx = -INFINITY;
      for (int j = 0; j < bn; ++j) {
        s[j] = masked ? -INFINITY : float(nd(rng) + shift + 0.05 * b);
        val[j] = float(nd(rng));
        mx = std::max(mx, s[j]);
      }
      const bool started = eager.m != -INFINITY;  // both see their first finite max together
      const float fe = eager.update_max(mx), fl = lazy.update_max_lazy(mx, slack);
      eager_rescales += started && fe != 1.f;
      lazy_rescales += started && fl != 1.f;
      oe *= fe;
      ol *= fl;
      for (int j = 0; j < bn; ++j) {
        const float pe = exp2f(s[j] - eager.exp_offset()), pl = exp2f(s[j] - lazy.exp_offset());
        EXPECT_LE(pl, exp2f(slack)) << "row " << row << " block " << b;
        eager.l += pe;
        lazy.l += pl;
        oe += double(pe) * val[j];
        ol += double(pl) * val[j];
      }
    }
    if (eager.l == 0.f) {
      EXPECT_EQ(lazy.l, 0.f);
      EXPECT_EQ(lazy.lse(), -INFINITY);
      continue;
    }
    EXPECT_NEAR(ol * lazy.inv_sum(), oe * eager.inv_sum(), 1e-5 * (1 + std::fabs(oe * eager.inv_sum())));
    EXPECT_NEAR(lazy.lse(), eager.lse(), 1e-5f * (1.f + std::fabs(eager.lse())));
  }
  EXPECT_LT(lazy_rescales * 3, eager_rescales) << lazy_rescales << " vs " << eager_rescales;
}

// ---- the CPU path against the oracle -------------------------------------------------------

struct GridCase {
  std::string name;
  Case c;
  bool backward = true;
  int sampled_rows = 0;  // > 0: forward only, checked on this many sampled rows (long sequences)
};

// gtest prints parameters of failing/listed tests with this (instead of a byte dump).
void PrintTo(const GridCase& g, std::ostream* os) { *os << g.name << " [" << g.c.str() << "]"; }

Case make(int sq, int sk, int hq, int hkv, int d, flashattn_dtype dt) {
  Case c;
  c.sq = sq, c.sk = sk, c.hq = hq, c.hkv = hkv, c.d = d;
  c.dtype = dt;
  return c;
}

std::vector<GridCase> grid() {
  std::vector<GridCase> g;
  auto add = [&](const std::string& name, Case c, bool bwd = true, int sampled = 0) {
    g.push_back({name, c, bwd, sampled});
  };
  Case c;
  add("Fp16Plain", make(113, 203, 4, 2, 64, kF16));
  c = make(203, 113, 2, 1, 128, kBF16), c.causal = true;  // sq > sk: empty rows
  add("Bf16CausalSqGtSk", c);
  c = make(113, 799, 2, 2, 32, kF32), c.causal = true;
  add("Fp32CausalSqLtSk", c);
  c = make(799, 799, 2, 1, 64, kF16), c.window_left = 32, c.causal = true;
  add("Fp16LocalCausal", c);
  c = make(203, 1023, 2, 2, 64, kBF16), c.window_left = 7, c.window_right = 13;
  add("Bf16WindowSkGtSq", c);
  c = make(1023, 203, 2, 2, 64, kF16), c.window_left = 100, c.window_right = 3;
  add("Fp16WindowSqGtSk", c);
  c = make(113, 113, 4, 1, 96, kF16), c.softcap = 30.f;
  add("Fp16SoftcapMqa", c);
  c = make(203, 203, 6, 2, 64, kBF16), c.softcap = 5.f, c.causal = true, c.input_std = 2.0;
  add("Bf16SoftcapCausalGqa", c);
  c = make(0, 0, 4, 2, 64, kF16), c.seqlens_q = {1, 7, 113, 0, 203}, c.seqlens_k = {7, 1, 203, 5, 113};
  c.causal = true;
  add("Fp16VarlenCausal", c);
  c = make(0, 0, 2, 1, 128, kBF16), c.seqlens_q = {799, 1, 7}, c.seqlens_k = {1023, 113, 0};
  c.window_left = 16, c.window_right = 16;
  add("Bf16VarlenWindow", c);
  c = make(0, 0, 3, 3, 40, kF32), c.seqlens_q = {113, 203}, c.seqlens_k = {203, 113}, c.softcap = 20.f;
  add("Fp32VarlenSoftcapD40", c);
  add("Fp16DecodeD256", make(1, 1023, 8, 1, 256, kF16));
  add("Bf16SingleKey", make(1023, 1, 2, 2, 64, kBF16));
  add("Fp16Tiny", make(7, 7, 1, 1, 8, kF16));
  c = make(1, 1, 1, 1, 3, kBF16), c.causal = true;
  add("Bf16OneByOne", c);
  c = make(203, 203, 2, 2, 64, kF16), c.causal = true, c.layout = Layout::kPadded;
  add("Fp16PaddedCausal", c);
  c = make(113, 799, 4, 2, 64, kBF16), c.window_left = 64, c.layout = Layout::kHeadMajor;
  add("Bf16HeadMajorWindow", c);
  c = make(113, 203, 2, 1, 64, kF64), c.causal = true, c.softcap = 10.f;
  add("Fp64CausalSoftcap", c);
  c = make(203, 203, 2, 2, 64, kF16), c.softmax_scale = 0.3f, c.input_std = 3.0;  // peaky softmax
  add("Fp16LargeLogits", c);
  c = make(113, 203, 2, 2, 64, kF16), c.batch = 3, c.window_left = 0, c.window_right = 0;
  add("Fp16BatchDiagonalOnly", c);
  c = make(203, 113, 2, 2, 64, kBF16), c.lse = false;
  add("Bf16NoLse", c, false);
  c = make(0, 0, 2, 1, 64, kF32), c.seqlens_q = {7, 1023, 1}, c.seqlens_k = {1023, 7, 1}, c.causal = true;
  add("Fp32VarlenCrossLengths", c);
  c = make(1023, 1023, 4, 2, 128, kBF16), c.causal = true, c.softcap = 30.f;
  add("Bf16Full1023GqaSoftcap", c);
  c = make(0, 0, 4, 4, 64, kF16), c.seqlens_q = {799, 203, 1023, 7}, c.seqlens_k = {1023, 799, 203, 113};
  c.window_left = 128, c.window_right = 0, c.layout = Layout::kPadded;
  add("Fp16VarlenLocalPadded", c);
  // Long sequences: the oracle on sampled rows for the forward; the backward at reduced width.
  c = make(4097, 4097, 4, 1, 128, kBF16), c.softcap = 50.f;
  add("Bf16Long4097MqaSoftcap", c, false, 24);
  c = make(4097, 4097, 2, 1, 64, kF16), c.causal = true;
  add("Fp16Long4097Causal", c, false, 48);
  c = make(1023, 4097, 2, 2, 64, kBF16), c.window_left = 300, c.window_right = 50;
  add("Bf16Long1023x4097Window", c, false, 48);
  c = make(4097, 1023, 1, 1, 32, kBF16), c.causal = true;
  add("Bf16Long4097x1023CausalBwd", c);
  return g;
}

class CpuGrid : public ::testing::TestWithParam<GridCase> {};

TEST_P(CpuGrid, MatchesOracle) {
  const GridCase& gc = GetParam();
  Problem p(gc.c);
  SCOPED_TRACE(p.describe());
  ASSERT_EQ(kCpuBackend.fwd(p.fwd_params(), nullptr, nullptr), FLASHATTN_SUCCESS);
  if (gc.sampled_rows > 0) {
    std::mt19937_64 rng(p.seed);
    EXPECT_TRUE(check_fwd_sampled(p, gc.sampled_rows, rng));
    return;
  }
  const Oracle exact = run_oracle(p, Rounding::kExact, gc.backward);
  const Oracle standard = run_oracle(p, Rounding::kInputPrecision, gc.backward);
  EXPECT_TRUE(check_fwd(p, exact, standard));
  if (!gc.c.lse) {
    for (float x : p.lse) EXPECT_TRUE(std::isnan(x)) << "lse written although the case passed none";
    return;
  }
  if (!gc.backward) return;
  ASSERT_EQ(kCpuBackend.bwd(p.bwd_params(), nullptr, nullptr), FLASHATTN_SUCCESS);
  EXPECT_TRUE(check_bwd(p, exact, standard));
}

INSTANTIATE_TEST_SUITE_P(Cpu, CpuGrid, ::testing::ValuesIn(grid()),
                         [](const ::testing::TestParamInfo<GridCase>& pi) { return pi.param.name; });

// Random small problems over every option at once, fresh each run.
TEST(CpuRandom, SmallProblemsAllOptions) {
  const uint64_t master = fresh_seed();
  SCOPED_TRACE("FLASHATTN_TEST_SEED=" + std::to_string(master) + " reproduces this test");
  std::mt19937_64 rng(master);
  const int lens[] = {1, 2, 7, 31, 64, 65, 113, 150};
  const int dims[] = {8, 16, 32, 40, 64, 128};
  const flashattn_dtype dts[] = {kF16, kBF16, kF32};
  for (int t = 0; t < 24; ++t) {
    Case c;
    c.dtype = dts[rng() % 3];
    c.d = dims[rng() % 6];
    c.hkv = 1 + int(rng() % 2);
    c.hq = c.hkv * (1 + int(rng() % 3));
    if (rng() % 3 == 0) {
      const int n = 1 + int(rng() % 3);
      for (int s = 0; s < n; ++s) {
        c.seqlens_q.push_back(rng() % 5 == 0 ? 0 : lens[rng() % 8]);
        c.seqlens_k.push_back(rng() % 5 == 0 ? 0 : lens[rng() % 8]);
      }
    } else {
      c.batch = 1 + int(rng() % 2);
      c.sq = lens[rng() % 8];
      c.sk = lens[rng() % 8];
    }
    c.causal = rng() % 2;
    c.window_left = rng() % 3 ? -1 : int(rng() % 40);
    c.window_right = c.causal || rng() % 3 ? -1 : int(rng() % 40);
    c.softcap = rng() % 3 ? 0.f : 8.f;
    c.layout = Layout(rng() % 3);
    Problem p(c, rng());
    SCOPED_TRACE(p.describe());
    ASSERT_EQ(kCpuBackend.fwd(p.fwd_params(), nullptr, nullptr), FLASHATTN_SUCCESS);
    ASSERT_EQ(kCpuBackend.bwd(p.bwd_params(), nullptr, nullptr), FLASHATTN_SUCCESS);
    const Oracle exact = run_oracle(p, Rounding::kExact, true);
    const Oracle standard = run_oracle(p, Rounding::kInputPrecision, true);
    EXPECT_TRUE(check_fwd(p, exact, standard));
    EXPECT_TRUE(check_bwd(p, exact, standard));
  }
}

// ---- fully masked rows and unseen keys -----------------------------------------------------

void expect_exact_zero_rows(const Problem& p, const HostTensor& t, const std::vector<int>& rows, bool key_side) {
  for (int r : rows)
    for (int64_t h = 0; h < t.shape[2]; ++h)
      for (int64_t x = 0; x < t.shape[3]; ++x)
        ASSERT_EQ(t.get(0, key_side ? p.k_row(0, r) : p.q_row(0, r), h, x), 0.0) << "row " << r << " head " << h;
}

TEST(CpuMasked, EmptyRowsAndUnseenKeysAreZero) {
  for (flashattn_dtype dt : {kF16, kBF16, kF32}) {
    // Causal with sq > sk: the first sq - sk rows see nothing.
    Case c = make(300, 100, 2, 1, 64, dt);
    c.causal = true;
    Problem p(c);
    SCOPED_TRACE(p.describe());
    ASSERT_EQ(kCpuBackend.fwd(p.fwd_params(), nullptr, nullptr), FLASHATTN_SUCCESS);
    ASSERT_EQ(kCpuBackend.bwd(p.bwd_params(), nullptr, nullptr), FLASHATTN_SUCCESS);
    EXPECT_EQ(p.out.count_nan() + p.dq.count_nan() + p.dk.count_nan() + p.dv.count_nan(), 0);
    std::vector<int> empty;
    for (int i = 0; i < 200; ++i) empty.push_back(i);
    expect_exact_zero_rows(p, p.out, empty, false);
    expect_exact_zero_rows(p, p.dq, empty, false);
    for (int h = 0; h < 2; ++h)
      for (int i = 0; i < 300; ++i) EXPECT_EQ(p.lse[size_t(p.lse_index(0, h, i))] == -INFINITY, i < 200) << i;

    // Diagonal-only window with sk > sq: keys 0..sk-sq-1 are seen by no row.
    Case w = make(100, 300, 2, 2, 32, dt);
    w.window_left = 0, w.window_right = 0;
    Problem q(w);
    ASSERT_EQ(kCpuBackend.fwd(q.fwd_params(), nullptr, nullptr), FLASHATTN_SUCCESS);
    ASSERT_EQ(kCpuBackend.bwd(q.bwd_params(), nullptr, nullptr), FLASHATTN_SUCCESS);
    EXPECT_EQ(q.out.count_nan() + q.dq.count_nan() + q.dk.count_nan() + q.dv.count_nan(), 0);
    std::vector<int> unseen;
    for (int j = 0; j < 200; ++j) unseen.push_back(j);
    expect_exact_zero_rows(q, q.dk, unseen, true);
    expect_exact_zero_rows(q, q.dv, unseen, true);
    // Each row sees exactly its diagonal key: O = V of that key (up to rounding to the dtype).
    for (int i = 0; i < 100; ++i)
      for (int x = 0; x < 32; ++x) EXPECT_EQ(q.out.get(0, i, 1, x), q.v.get(0, 200 + i, 1, x));
  }
}

TEST(CpuMasked, VarlenEmptySequences) {
  Case c = make(0, 0, 2, 1, 64, kF16);
  c.seqlens_q = {0, 5, 0, 3};
  c.seqlens_k = {4, 0, 0, 6};
  Problem p(c);
  ASSERT_EQ(kCpuBackend.fwd(p.fwd_params(), nullptr, nullptr), FLASHATTN_SUCCESS);
  ASSERT_EQ(kCpuBackend.bwd(p.bwd_params(), nullptr, nullptr), FLASHATTN_SUCCESS);
  // Sequence 1 (packed q rows 0-4) has queries but no keys; sequence 0 (packed k rows 0-3)
  // has keys but no queries. expect_exact_zero_rows indexes packed rows via sequence 0.
  expect_exact_zero_rows(p, p.out, {0, 1, 2, 3, 4}, false);
  expect_exact_zero_rows(p, p.dq, {0, 1, 2, 3, 4}, false);
  expect_exact_zero_rows(p, p.dk, {0, 1, 2, 3}, true);
  expect_exact_zero_rows(p, p.dv, {0, 1, 2, 3}, true);
  const Oracle exact = run_oracle(p, Rounding::kExact, true);
  const Oracle standard = run_oracle(p, Rounding::kInputPrecision, true);
  EXPECT_TRUE(check_fwd(p, exact, standard));
  EXPECT_TRUE(check_bwd(p, exact, standard));
}

TEST(CpuMasked, NoKeysFixedLength) {
  Case c = make(9, 0, 2, 1, 16, kBF16);
  Problem p(c);
  ASSERT_EQ(kCpuBackend.fwd(p.fwd_params(), nullptr, nullptr), FLASHATTN_SUCCESS);
  EXPECT_EQ(p.out.count_nan(), 0);
  for (float x : p.lse) EXPECT_EQ(x, -INFINITY);
  ASSERT_EQ(kCpuBackend.bwd(p.bwd_params(), nullptr, nullptr), FLASHATTN_SUCCESS);
  for (int i = 0; i < 9; ++i)
    for (int h = 0; h < 2; ++h)
      for (int x = 0; x < 16; ++x) {
        EXPECT_EQ(p.out.get(0, i, h, x), 0.0);
        EXPECT_EQ(p.dq.get(0, i, h, x), 0.0);
      }
}

// ---- determinism ---------------------------------------------------------------------------

class ThreadsEnv {
 public:
  explicit ThreadsEnv(int n) {
    const char* old = std::getenv("FLASHATTN_NUM_THREADS");
    had_ = old != nullptr;
    if (had_) old_ = old;
    setenv("FLASHATTN_NUM_THREADS", std::to_string(n).c_str(), 1);
  }
  ~ThreadsEnv() {
    if (had_)
      setenv("FLASHATTN_NUM_THREADS", old_.c_str(), 1);
    else
      unsetenv("FLASHATTN_NUM_THREADS");
  }

 private:
  bool had_ = false;
  std::string old_;
};

TEST(CpuDeterminism, BackwardIsBitwiseReproducibleAcrossRunsAndThreadCounts) {
  Case c = make(0, 0, 4, 2, 64, kBF16);
  c.seqlens_q = {300, 77, 513};
  c.seqlens_k = {200, 513, 129};
  c.causal = true;
  c.softcap = 12.f;
  Problem p(c);
  ASSERT_EQ(kCpuBackend.fwd(p.fwd_params(), nullptr, nullptr), FLASHATTN_SUCCESS);
  HostTensor out0 = p.out;
  std::vector<float> lse0 = p.lse;
  ASSERT_EQ(kCpuBackend.bwd(p.bwd_params(), nullptr, nullptr), FLASHATTN_SUCCESS);
  const HostTensor dq0 = p.dq, dk0 = p.dk, dv0 = p.dv;
  for (int threads : {1, 3, 2, 7}) {
    ThreadsEnv env(threads);
    p.poison_outputs();
    ASSERT_EQ(kCpuBackend.fwd(p.fwd_params(), nullptr, nullptr), FLASHATTN_SUCCESS);
    EXPECT_TRUE(bitwise_equal(p.out, out0)) << threads << " threads";
    EXPECT_EQ(0, std::memcmp(p.lse.data(), lse0.data(), lse0.size() * sizeof(float))) << threads << " threads";
    ASSERT_EQ(kCpuBackend.bwd(p.bwd_params(), nullptr, nullptr), FLASHATTN_SUCCESS);
    EXPECT_TRUE(bitwise_equal(p.dq, dq0)) << threads << " threads";
    EXPECT_TRUE(bitwise_equal(p.dk, dk0)) << threads << " threads";
    EXPECT_TRUE(bitwise_equal(p.dv, dv0)) << threads << " threads";
  }
}

// ---- through the C ABI ---------------------------------------------------------------------

// options.num_threads reaches the host paths: each call starts num_threads - 1 workers (the
// calling thread is the last), whatever FLASHATTN_NUM_THREADS says; 0 falls back to the env.
TEST(CpuCAbi, NumThreadsOptionSetsTheWorkerCount) {
#if defined(FA_COUNTS_THREADS)
  {
    const int before = g_threads_created.load();
    std::thread([] {}).join();
    ASSERT_EQ(g_threads_created.load(), before + 1) << "pthread_create is not interposed: no evidence";
  }
  Case c = make(300, 300, 4, 2, 32, kBF16);  // 5 query blocks x 4 heads = 20 forward items
  c.causal = true;
  Problem p(c);
  ThreadsEnv env(3);
  {
    // One call before counting: in a CUDA build the first call may initialise the CUDA runtime
    // (a pointer query), which starts threads of its own that are not ours.
    flashattn_fwd_params fp = p.c_fwd_params(FLASHATTN_BACKEND_CPU);
    ASSERT_EQ(flashattn_fwd(&fp, nullptr, 0, nullptr), FLASHATTN_SUCCESS) << flashattn_last_error();
  }
  for (int n : {1, 2, 5, 0}) {
    const int want = n == 0 ? 3 : n;  // 0: the environment's 3
    auto started = [&](flashattn_backend b, bool fwd) {
      const int before = g_threads_created.load();
      flashattn_fwd_params fp = p.c_fwd_params(b);
      flashattn_bwd_params bp = p.c_bwd_params(b);
      fp.options.num_threads = bp.options.num_threads = n;
      EXPECT_EQ(fwd ? flashattn_fwd(&fp, nullptr, 0, nullptr) : flashattn_bwd(&bp, nullptr, 0, nullptr),
                FLASHATTN_SUCCESS)
          << flashattn_last_error();
      return g_threads_created.load() - before;
    };
    // cpu: >= 10 items per pass; the backward forks three times (D, dK/dV, dQ), or twice (D,
    // whole heads: its 2 items need >= 2 per thread, so only when want == 1).
    EXPECT_EQ(started(FLASHATTN_BACKEND_CPU, true), want - 1) << "cpu fwd, num_threads " << n;
    EXPECT_EQ(started(FLASHATTN_BACKEND_CPU, false), 3 * (want - 1)) << "cpu bwd, num_threads " << n;
    // reference: one item per (batch, head) forward, per (batch, kv head) backward.
    EXPECT_EQ(started(FLASHATTN_BACKEND_REFERENCE, true), std::min(want, 4) - 1) << "reference fwd, " << n;
    EXPECT_EQ(started(FLASHATTN_BACKEND_REFERENCE, false), std::min(want, 2) - 1) << "reference bwd, " << n;
  }
#else
  GTEST_SKIP() << "counting threads needs glibc (pthread_create interposition)";
#endif
}

TEST(CpuCAbi, NegativeNumThreadsIsRefusedByName) {
  Case c = make(16, 16, 2, 2, 32, kF32);
  Problem p(c);
  p.poison_outputs();
  flashattn_fwd_params fp = p.c_fwd_params(FLASHATTN_BACKEND_CPU);
  fp.options.num_threads = -1;
  EXPECT_EQ(flashattn_fwd(&fp, nullptr, 0, nullptr), FLASHATTN_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(flashattn_last_error()).find("options.num_threads"), std::string::npos)
      << flashattn_last_error();
  flashattn_bwd_params bp = p.c_bwd_params(FLASHATTN_BACKEND_AUTO);
  bp.options.num_threads = -7;
  EXPECT_EQ(flashattn_bwd(&bp, nullptr, 0, nullptr), FLASHATTN_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(flashattn_last_error()).find("options.num_threads: -7"), std::string::npos)
      << flashattn_last_error();
}

TEST(CpuCAbi, BackendsCpuAutoAndReferenceRunThroughTheAbi) {
  Case c = make(150, 97, 4, 2, 64, kF16);
  c.causal = true;
  c.window_left = 40;
  c.softcap = 20.f;
  c.layout = Layout::kPadded;
  Problem p(c);
  ASSERT_EQ(kCpuBackend.fwd(p.fwd_params(), nullptr, nullptr), FLASHATTN_SUCCESS);
  ASSERT_EQ(kCpuBackend.bwd(p.bwd_params(), nullptr, nullptr), FLASHATTN_SUCCESS);
  const HostTensor out0 = p.out, dq0 = p.dq, dk0 = p.dk, dv0 = p.dv;
  const std::vector<float> lse0 = p.lse;
  for (flashattn_backend b : {FLASHATTN_BACKEND_CPU, FLASHATTN_BACKEND_AUTO}) {
    p.poison_outputs();
    flashattn_fwd_params fp = p.c_fwd_params(b);
    ASSERT_EQ(flashattn_fwd(&fp, nullptr, 0, nullptr), FLASHATTN_SUCCESS) << flashattn_last_error();
    EXPECT_TRUE(bitwise_equal(p.out, out0));
    EXPECT_EQ(0, std::memcmp(p.lse.data(), lse0.data(), lse0.size() * sizeof(float)));
    flashattn_bwd_params bp = p.c_bwd_params(b);
    size_t ws = 0;
    ASSERT_EQ(flashattn_bwd_workspace_size(&bp, &ws), FLASHATTN_SUCCESS) << flashattn_last_error();
    EXPECT_EQ(ws, size_t(4) * 150 * 4);  // D: one fp32 per query row and head
    std::vector<unsigned char> workspace(ws + 16);
    // A caller's workspace must be 16-byte aligned: refused by name, dq/dk/dv left poisoned (from the loop's top).
    unsigned char* aligned = workspace.data() + (16 - reinterpret_cast<uintptr_t>(workspace.data()) % 16) % 16;
    EXPECT_EQ(flashattn_bwd(&bp, aligned + 4, ws, nullptr), FLASHATTN_ERROR_INVALID_ARGUMENT);
    EXPECT_EQ(std::string(flashattn_last_error()).rfind("workspace: ", 0), 0u) << flashattn_last_error();
    EXPECT_FALSE(bitwise_equal(p.dq, dq0));
    ASSERT_EQ(flashattn_bwd(&bp, aligned, ws, nullptr), FLASHATTN_SUCCESS) << flashattn_last_error();
    EXPECT_TRUE(bitwise_equal(p.dq, dq0));
    EXPECT_TRUE(bitwise_equal(p.dk, dk0));
    EXPECT_TRUE(bitwise_equal(p.dv, dv0));
  }
  // The reference backend through the ABI is the exact oracle, rounded to the output dtype.
  p.poison_outputs();
  flashattn_fwd_params fp = p.c_fwd_params(FLASHATTN_BACKEND_REFERENCE);
  ASSERT_EQ(flashattn_fwd(&fp, nullptr, 0, nullptr), FLASHATTN_SUCCESS) << flashattn_last_error();
  const Oracle exact = run_oracle(p, Rounding::kExact, false);
  for (int i = 0; i < 150; ++i)
    for (int h = 0; h < 4; ++h)
      for (int x = 0; x < 64; ++x)
        ASSERT_EQ(p.out.get(0, i, h, x), round_to(kF16, exact.out.get(0, i, h, x)));
  EXPECT_EQ(p.out.padding_writes(), 0);
}

// The sm90 backward's deterministic mode: key block n adds its dQ part to query block m only
// after dq_adds_before(...) other key blocks have, so for every query block the values over
// the key blocks reaching it must be exactly 0, 1, ..., count - 1 (each turn taken once: no
// key block waits forever, none adds out of turn), and each one must count the blocks after
// it that reach m (the order: decreasing key blocks).
TEST(DeterministicDqOrder, EachQueryBlockTakesEveryTurnOnceInDecreasingKeyOrder) {
  const uint64_t seed = fresh_seed();
  std::mt19937_64 rng(seed);
  const int lens[] = {1, 7, 63, 64, 65, 113, 128, 129, 300, 799, 1023};
  int checked = 0;
  for (int trial = 0; trial < 2000; ++trial) {
    const int sq = lens[rng() % 11], sk = lens[rng() % 11];
    int wl = -1, wr = -1;
    switch (trial % 4) {
      case 1: wr = 0; break;                                                      // causal
      case 2: wl = int(rng() % 300); wr = int(rng() % 300); break;                // sliding window
      case 3: wl = int(rng() % 40); wr = 0; break;                                // causal + window
      default: break;                                                             // none
    }
    const flashattn::Mask mask(sq, sk, wl, wr);
    for (int block_n : {64, 128}) {
      const int block_m = 64;
      const int num_n = (sk + block_n - 1) / block_n, num_m = (sq + block_m - 1) / block_m;
      std::vector<int> mb(static_cast<size_t>(num_n)), me(static_cast<size_t>(num_n));
      for (int n = 0; n < num_n; ++n) mask.query_block_range(n * block_n, block_n, block_m, &mb[n], &me[n]);
      for (int m = 0; m < num_m; ++m) {
        std::vector<int> turns;
        for (int n = 0; n < num_n; ++n) {
          if (!(mb[n] <= m && m < me[n])) continue;
          int after = 0;
          for (int n2 = n + 1; n2 < num_n; ++n2) after += mb[n2] <= m && m < me[n2];
          const int got = flashattn::dq_adds_before(mask, n, m, block_m, block_n);
          ASSERT_EQ(got, after) << "seed " << seed << " sq " << sq << " sk " << sk << " window " << wl << "," << wr
                                << " block_n " << block_n << " n " << n << " m " << m;
          turns.push_back(got);
          ++checked;
        }
        std::sort(turns.begin(), turns.end());
        for (size_t i = 0; i < turns.size(); ++i) ASSERT_EQ(turns[i], int(i)) << "seed " << seed << " m " << m;
      }
    }
  }
  EXPECT_GT(checked, 10000);
}

}  // namespace
}  // namespace flashattn::test
