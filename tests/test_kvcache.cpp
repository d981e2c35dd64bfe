// The forward's KV cache on the host paths (issue 17): paged and contiguous caches, cache seqlens,
// left padding, cache batch indices, rows appended in place, the rotary embedding, and paged varlen
// prefill. Each random case is checked three ways:
//   * the call is rebuilt independently as a plain varlen problem (the test gathers each
//     sequence's keys from the cache it expects after the append, rotates q and the new keys
//     itself in fp64) and the fp64 oracle runs on that: the cpu backend must pass the usual rule
//     (2x standard attention's error + atol) and the reference backend must equal the oracle to
//     the output's rounding;
//   * the cache after the call: appended rows hold the rotated new rows, every other byte is
//     unchanged (rows outside each sequence are NaN, so reading them would also poison O);
//   * validation: each bad field is refused by name.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "common/split_kv.h"
#include "cpu/combine.h"
#include "flashattn/flashattn.h"
#include "kv_test_util.h"
#include "test_util.h"

namespace flashattn::test {
namespace {

// One case on the cpu and reference backends, each on its own copy of the cache.
void run_case(const KvCase& kc, uint64_t seed) {
  KvProblem base(kc, seed);
  SCOPED_TRACE(kc.str() + " seed " + std::to_string(seed));
  Problem g = base.gathered(base.k_cache, base.v_cache);
  const Oracle exact = run_oracle(g, Rounding::kExact, false);
  const Oracle standard = run_oracle(g, Rounding::kInputPrecision, false);
  for (flashattn_backend backend : {FLASHATTN_BACKEND_CPU, FLASHATTN_BACKEND_REFERENCE}) {
    SCOPED_TRACE(flashattn_backend_name(backend));
    KvProblem p = base;
    flashattn_fwd_params params = p.params(backend);
    ASSERT_EQ(flashattn_fwd(&params, nullptr, 0, nullptr), FLASHATTN_SUCCESS) << flashattn_last_error();
    EXPECT_TRUE(check_cache(p, base.k_cache, p.k_cache, p.k_new, true));
    EXPECT_TRUE(check_cache(p, base.v_cache, p.v_cache, p.v_new, false));
    g.poison_outputs();
    p.export_outputs(g);
    // The reference computes exactly, then rounds the output once (fp32 LSE): 1 ulp of the dtype
    // (fp32's at least) and nothing of the standard error.
    const Rule rule = backend == FLASHATTN_BACKEND_REFERENCE ? Rule{0.0, 1.0} : Rule();
    EXPECT_TRUE(check_fwd(g, exact, standard, rule));
  }
}

TEST(KvCache, DecodeGridMatchesGatheredOracle) {
  std::mt19937_64 master(fresh_seed());
  KvGrid grid;
  grid.dtypes = {FLASHATTN_DTYPE_FP16, FLASHATTN_DTYPE_BF16, FLASHATTN_DTYPE_FP32, FLASHATTN_DTYPE_FP64};
  grid.headdims = {64, 40};
  grid.cache_lens = {0, 1, 7, 113};
  for (int trial = 0; trial < 40; ++trial) {
    const KvCase c = random_kv_case(master, grid);
    run_case(c, master());
    if (HasFatalFailure()) return;
  }
}

TEST(KvCache, PagedPrefillVarlen) {
  std::mt19937_64 master(fresh_seed());
  for (int page_size : {1, 5, 16}) {
    KvCase c;
    c.varlen = true;
    c.dtype = FLASHATTN_DTYPE_BF16;
    c.page_size = page_size;
    c.batch = 3;
    c.sq = 7;
    c.hq = 4;
    c.hkv = 1;
    c.capacity = 120;
    c.cache_lens = {7, 113, 50};
    c.causal = true;
    run_case(c, master());
    c.causal = false;
    c.leftpad = {0, 4, 9};
    run_case(c, master());
  }
}

// The same data in pages and contiguous gives bitwise the same output on the cpu backend.
TEST(KvCache, PagedEqualsContiguousBitwise) {
  KvCase c;
  c.dtype = FLASHATTN_DTYPE_BF16;
  c.batch = 2;
  c.sq = 3;
  c.capacity = 80;
  c.cache_lens = {33, 70};
  c.seqlen_new = 3;
  c.rotary_dim = 32;
  c.causal = true;
  KvProblem contiguous(c, fresh_seed());
  c.page_size = 16;
  KvProblem paged(c, contiguous.seed);
  // Copy the contiguous cache's rows into the paged problem's pages.
  for (int i = 0; i < c.batch; ++i)
    for (int r = 0; r < c.capacity; ++r)
      for (int h = 0; h < c.hkv; ++h)
        for (int x = 0; x < c.d; ++x) {
          paged.set_cache(paged.k_cache, i, r, h, x, contiguous.get_cache(contiguous.k_cache, i, r, h, x));
          paged.set_cache(paged.v_cache, i, r, h, x, contiguous.get_cache(contiguous.v_cache, i, r, h, x));
        }
  paged.q = contiguous.q;
  paged.k_new = contiguous.k_new;
  paged.v_new = contiguous.v_new;
  for (KvProblem* p : {&contiguous, &paged}) {
    flashattn_fwd_params params = p->params(FLASHATTN_BACKEND_CPU);
    ASSERT_EQ(flashattn_fwd(&params, nullptr, 0, nullptr), FLASHATTN_SUCCESS) << flashattn_last_error();
  }
  EXPECT_TRUE(bitwise_equal(contiguous.out, paged.out));
  EXPECT_EQ(contiguous.out.count_nan(), 0);
}

// A caller built against the header before kv_cache/num_splits (struct_size 424) still runs.
TEST(KvCache, EarlierStructSizeIsAccepted) {
  Problem p(Case{});
  flashattn_fwd_params params = p.c_fwd_params(FLASHATTN_BACKEND_CPU);
  params.struct_size = offsetof(flashattn_fwd_params, kv_cache);
  params.kv_cache.max_pages = 99;  // past the caller's struct: must not be read
  ASSERT_EQ(flashattn_fwd(&params, nullptr, 0, nullptr), FLASHATTN_SUCCESS) << flashattn_last_error();
}

// ---- validation ------------------------------------------------------------------------------

struct Refusal {
  const char* what;
  void (*mutate)(KvProblem&, flashattn_fwd_params&);
  const char* field;  // must appear in flashattn_last_error()
};

TEST(KvCache, BadFieldsAreRefusedByName) {
  KvCase base;
  base.batch = 2;
  base.page_size = 4;
  base.capacity = 32;
  base.cache_lens = {5, 9};
  base.seqlen_new = 2;
  base.rotary_dim = 16;
  base.causal = true;
  const Refusal cases[] = {
      {"page out of range", [](KvProblem& p, flashattn_fwd_params&) { p.block_table[1] = 1000; },
       "kv_cache.block_table[0][1]"},
      {"negative page", [](KvProblem& p, flashattn_fwd_params&) { p.block_table[p.table_stride + 2] = -1; },
       "kv_cache.block_table[1][2]"},
      {"seqlens beyond capacity", [](KvProblem& p, flashattn_fwd_params&) { p.seqlens[1] = 31; }, "kv_cache.seqlens[1]"},
      {"negative seqlens", [](KvProblem& p, flashattn_fwd_params&) { p.seqlens[0] = -1; }, "kv_cache.seqlens[0]"},
      {"leftpad past end", [](KvProblem& p, flashattn_fwd_params& f) {
         p.leftpad = {0, 12};
         f.kv_cache.leftpad = p.leftpad.data();
       }, "kv_cache.leftpad[1]"},
      {"batch_idx with a block table", [](KvProblem& p, flashattn_fwd_params& f) {
         p.batch_idx = {0, 1};
         f.kv_cache.batch_idx = p.batch_idx.data();
       }, "kv_cache.batch_idx"},
      {"max_pages 0", [](KvProblem&, flashattn_fwd_params& f) { f.kv_cache.max_pages = 0; }, "kv_cache.max_pages"},
      {"short block_table_stride", [](KvProblem&, flashattn_fwd_params& f) { f.kv_cache.block_table_stride = 3; },
       "kv_cache.block_table_stride"},
      {"max_pages without a table", [](KvProblem&, flashattn_fwd_params& f) { f.kv_cache.block_table = nullptr; },
       "kv_cache.max_pages"},
      {"k_new without v_new", [](KvProblem&, flashattn_fwd_params& f) { f.kv_cache.v_new.data = nullptr; },
       "kv_cache.v_new"},
      {"k_new without seqlens", [](KvProblem&, flashattn_fwd_params& f) { f.kv_cache.seqlens = nullptr; },
       "kv_cache.seqlens"},
      {"k_new with other heads", [](KvProblem&, flashattn_fwd_params& f) { f.kv_cache.k_new.shape[2] = 1; },
       "kv_cache.k_new.shape[2]"},
      {"too many new rows", [](KvProblem&, flashattn_fwd_params& f) {
         f.kv_cache.k_new.shape[1] = f.kv_cache.v_new.shape[1] = 33;
       }, "kv_cache.k_new.shape[1]"},
      {"odd rotary_dim", [](KvProblem&, flashattn_fwd_params& f) { f.kv_cache.rotary_dim = 7; }, "kv_cache.rotary_dim"},
      {"rotary_dim > headdim", [](KvProblem&, flashattn_fwd_params& f) { f.kv_cache.rotary_dim = 64; },
       "kv_cache.rotary_dim"},
      {"rotary table too short", [](KvProblem&, flashattn_fwd_params& f) { f.kv_cache.rotary_seqlen = 10; },
       "kv_cache.rotary_seqlen"},
      {"rotary_sin missing", [](KvProblem&, flashattn_fwd_params& f) { f.kv_cache.rotary_sin = nullptr; },
       "kv_cache.rotary_sin"},
      {"rotary without new rows", [](KvProblem&, flashattn_fwd_params& f) {
         f.kv_cache.k_new.data = f.kv_cache.v_new.data = nullptr;
       }, "kv_cache.rotary_cos"},
      {"bad interleaved flag", [](KvProblem&, flashattn_fwd_params& f) { f.kv_cache.rotary_interleaved = 2; },
       "kv_cache.rotary_interleaved"},
      {"negative num_splits", [](KvProblem&, flashattn_fwd_params& f) { f.num_splits = -1; }, "num_splits"},
      {"page size 0", [](KvProblem&, flashattn_fwd_params& f) { f.k.shape[1] = f.v.shape[1] = 0; }, "k.shape[1]"},
  };
  for (const Refusal& r : cases) {
    SCOPED_TRACE(r.what);
    KvProblem p(base, fresh_seed());
    flashattn_fwd_params params = p.params(FLASHATTN_BACKEND_CPU);
    r.mutate(p, params);
    const KvProblem before = p;
    EXPECT_EQ(flashattn_fwd(&params, nullptr, 0, nullptr), FLASHATTN_ERROR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(flashattn_last_error()).find(r.field), std::string::npos) << flashattn_last_error();
    // Refused before anything is written: the caches are as they were.
    EXPECT_EQ(std::memcmp(before.k_cache.data(), p.k_cache.data(), p.k_cache.size_bytes()), 0);
    EXPECT_EQ(p.out.count_nan(), p.out.numel());
  }
}

TEST(KvCache, ContiguousRefusals) {
  KvCase c;
  c.batch = 2;
  c.capacity = 16;
  c.cache_lens = {3, 4};
  c.batch_idx = true;
  KvProblem p(c, fresh_seed());
  flashattn_fwd_params params = p.params(FLASHATTN_BACKEND_CPU);
  p.batch_idx[1] = 4;  // the cache has batch + 2 = 4 batches
  EXPECT_EQ(flashattn_fwd(&params, nullptr, 0, nullptr), FLASHATTN_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(flashattn_last_error()).find("kv_cache.batch_idx[1]"), std::string::npos)
      << flashattn_last_error();
  // Without batch_idx the cache's batch must be q's.
  params.kv_cache.batch_idx = nullptr;
  EXPECT_EQ(flashattn_fwd(&params, nullptr, 0, nullptr), FLASHATTN_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(flashattn_last_error()).find("k.shape[0]"), std::string::npos) << flashattn_last_error();
}

// The backward has no KV cache: the forward's cache fields never reach it, and a varlen call
// over a paged cache can't be differentiated (checked in Python); here the CUDA-less build's AUTO
// must pick a host path for a KV-cache forward.
TEST(KvCache, AutoRunsOnTheHost) {
  KvCase c;
  c.batch = 1;
  c.capacity = 40;
  c.cache_lens = {17};
  c.seqlen_new = 1;
  KvProblem p(c, fresh_seed());
  flashattn_fwd_params params = p.params(FLASHATTN_BACKEND_AUTO);
  ASSERT_EQ(flashattn_fwd(&params, nullptr, 0, nullptr), FLASHATTN_SUCCESS) << flashattn_last_error();
  EXPECT_EQ(p.out.count_nan(), 0);
}

}  // namespace
}  // namespace flashattn::test

// ---- split-KV's host-side pieces (common/split_kv.h), which the GPU paths rely on -------------

namespace flashattn::test {
namespace {

TEST(SplitKv, ChoosesSplitsThatFillTheGpu) {
  // A grid that already fills 80% of the slots is not split.
  EXPECT_EQ(choose_num_splits(/*ctas=*/120, /*slots=*/132, /*n_blocks=*/1000, 128), 1);
  EXPECT_EQ(choose_num_splits(8, 528, 1, 128), 1);  // one key block: nothing to split
  for (int64_t ctas : {1, 2, 8, 16, 40, 100}) {
    for (int n_blocks : {2, 7, 64, 1000, 5000}) {
      for (int slots : {132, 264, 528}) {
        const int s = choose_num_splits(ctas, slots, n_blocks, 128);
        SCOPED_TRACE("ctas " + std::to_string(ctas) + " blocks " + std::to_string(n_blocks) + " slots " +
                     std::to_string(slots) + " -> " + std::to_string(s));
        EXPECT_GE(s, 1);
        EXPECT_LE(s, std::min(n_blocks, 128));
        // Small grids over long caches (fine-grained splits) get enough CTAs to cover most of the
        // slots (or of what 128 splits can give).
        const int64_t reachable = std::min<int64_t>(slots, ctas * std::min(n_blocks, 128));
        if (ctas * 10 < int64_t(slots) * 8 && n_blocks >= 64) EXPECT_GE(ctas * s * 10, reachable * 7);
      }
    }
  }
}

// The splits' interleaved key blocks cover every block of [n_begin, n_end) exactly once, none outside,
// each split's first block the highest it visits (the only one that can be partial is n_end - 1).
TEST(SplitKv, SplitsPartitionTheKeyBlocks) {
  for (int splits = 1; splits <= 9; ++splits)
    for (int n_begin = 0; n_begin <= 3; ++n_begin)
      for (int n_end = n_begin; n_end <= 40; ++n_end) {
        SplitKv s;
        s.num_splits = splits;
        std::vector<int> seen(size_t(n_end + splits), 0);
        for (int i = 0; i < splits; ++i) {
          int prev = INT32_MAX;
          for (int nb = s.first_block(n_end, i); nb >= n_begin; nb -= s.block_step()) {
            ASSERT_LT(nb, n_end);
            ASSERT_LT(nb, prev);
            prev = nb;
            ++seen[size_t(nb)];
          }
        }
        for (int nb = 0; nb < int(seen.size()); ++nb)
          EXPECT_EQ(seen[size_t(nb)], nb >= n_begin && nb < n_end ? 1 : 0)
              << splits << " splits, blocks [" << n_begin << ", " << n_end << "), block " << nb;
        if (n_end > n_begin) EXPECT_EQ(s.first_block(n_end, 0), n_end - 1);
      }
}

// The partial layout and combine_into: attention computed per key range by the oracle, stored
// where a GPU split would store it, and merged by the host combine equals attention over all keys.
TEST(SplitKv, PartialLayoutCombinesToTheFullAttention) {
  Case c;
  c.dtype = FLASHATTN_DTYPE_FP32;
  c.batch = 2;
  c.sq = 3;
  c.sk = 150;
  c.hq = 4;
  c.hkv = 2;
  c.d = 32;
  c.causal = true;
  Problem p(c);
  const Oracle exact = run_oracle(p, Rounding::kExact, false);
  SplitKv split;
  split.num_splits = 4;
  split.batch = c.batch;
  split.seqlen_q = c.sq;
  split.nheads = c.hq;
  split.headdim = c.d;
  std::vector<float> o_part(size_t(SplitKv::o_floats(4, c.batch, c.sq, c.hq, c.d)), NAN);
  std::vector<float> lse_part(size_t(SplitKv::lse_floats(4, c.batch, c.sq, c.hq)), NAN);
  split.o_partial = o_part.data();
  split.lse_partial = lse_part.data();
  // Small blocks, so that the 150 keys make 10 blocks and every split several interleaved ones.
  const int block = 16, n_blocks = (c.sk + block - 1) / block;
  for (int s = 0; s < 4; ++s) {
    // Split s's keys (its blocks' keys) of the whole causal problem, from the definition in fp64.
    std::vector<int> keys;
    for (int nb = split.first_block(n_blocks, s); nb >= 0; nb -= split.block_step())
      for (int j = nb * block; j < std::min(c.sk, (nb + 1) * block); ++j) keys.push_back(j);
    const double scale = 1.0 / std::sqrt(double(c.d));
    for (int b = 0; b < c.batch; ++b)
      for (int h = 0; h < c.hq; ++h)
        for (int i = 0; i < c.sq; ++i) {
          const int last = i + c.sk - c.sq + 1;  // causal, bottom-right: keys below it
          std::vector<double> sc;
          std::vector<int> seen;
          double m = -INFINITY;
          for (int j : keys) {
            if (j >= last) continue;
            double dot = 0;
            for (int x = 0; x < c.d; ++x) dot += p.q.get(b, i, h, x) * p.k.get(b, j, h / 2, x);
            sc.push_back(dot * scale);
            seen.push_back(j);
            m = std::max(m, sc.back());
          }
          double l = 0;
          std::vector<double> o(size_t(c.d), 0.0);
          for (size_t t = 0; t < seen.size(); ++t) {
            const double e = std::exp(sc[t] - m);
            l += e;
            for (int x = 0; x < c.d; ++x) o[size_t(x)] += e * p.v.get(b, seen[t], h / 2, x);
          }
          for (int x = 0; x < c.d; ++x)
            o_part[size_t(split.o_index(s, b, i, h) + x)] = l > 0 ? float(o[size_t(x)] / l) : 0.f;
          lse_part[size_t(split.lse_index(s, b, h, i))] = l > 0 ? float(m + std::log(l)) : -INFINITY;
        }
  }
  HostTensor out(FLASHATTN_DTYPE_FP32, c.batch, c.sq, c.hq, c.d);
  out.fill_nan();
  std::vector<float> lse(size_t(c.batch) * c.hq * c.sq, NAN);
  const int64_t ost[3] = {out.stride[0], out.stride[1], out.stride[2]};
  const int64_t lst[3] = {int64_t(c.hq) * c.sq, c.sq, 1};
  ASSERT_EQ(cpu::combine(split.combine_into(out.data(), FLASHATTN_DTYPE_FP32, ost, lse.data(), lst)),
            FLASHATTN_SUCCESS);
  double err = 0;
  for (int b = 0; b < c.batch; ++b)
    for (int i = 0; i < c.sq; ++i)
      for (int h = 0; h < c.hq; ++h) {
        for (int x = 0; x < c.d; ++x) err = std::max(err, std::fabs(out.get(b, i, h, x) - exact.out.get(b, i, h, x)));
        err = std::max(err, double(std::fabs(lse[size_t((b * c.hq + h) * c.sq + i)] -
                                             exact.lse[size_t(p.lse_index(b, h, i))])));
      }
  EXPECT_LT(err, 1e-5);
}

}  // namespace
}  // namespace flashattn::test
