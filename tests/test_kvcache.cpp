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

#include "common/half_convert.h"
#include "flashattn/flashattn.h"
#include "test_util.h"

namespace flashattn::test {
namespace {

struct KvCase {
  flashattn_dtype dtype = FLASHATTN_DTYPE_FP16;
  int batch = 2, sq = 1, hq = 4, hkv = 2, d = 32;
  int page_size = 0;             // 0: contiguous cache
  int capacity = 64;             // rows per sequence (paged: rounded up to whole pages)
  std::vector<int> cache_lens;   // rows before appending, per sequence
  std::vector<int> leftpad;      // empty: none
  int seqlen_new = 0;
  bool batch_idx = false;        // contiguous: sequences read a permutation of a larger cache
  int rotary_dim = 0;            // 0: none (needs seqlen_new > 0)
  bool interleaved = false;
  bool causal = false;
  int window_left = -1, window_right = -1;
  float softcap = 0.f;
  bool varlen = false;           // paged varlen prefill: q packed, cu_seqlens_k = each cache's rows
  bool alibi = false;

  int max_pages() const { return page_size ? (capacity + page_size - 1) / page_size : 0; }
  int room() const { return page_size ? max_pages() * page_size : capacity; }
  std::string str() const {
    std::string s = std::string(dtype_str(dtype)) + " b" + std::to_string(batch) + " sq" + std::to_string(sq) +
                    " h" + std::to_string(hq) + "/" + std::to_string(hkv) + " d" + std::to_string(d) +
                    (page_size ? " page" + std::to_string(page_size) : " contiguous") + " cap" +
                    std::to_string(capacity) + " lens";
    for (int l : cache_lens) s += " " + std::to_string(l);
    if (!leftpad.empty()) s += " leftpad";
    if (seqlen_new) s += " new" + std::to_string(seqlen_new);
    if (batch_idx) s += " batch_idx";
    if (rotary_dim) s += " rot" + std::to_string(rotary_dim) + (interleaved ? "i" : "h");
    if (causal) s += " causal";
    if (window_left >= 0 || window_right >= 0)
      s += " window(" + std::to_string(window_left) + "," + std::to_string(window_right) + ")";
    if (softcap > 0.f) s += " softcap";
    if (alibi) s += " alibi";
    if (varlen) s += " varlen";
    return s;
  }
};

// The tensors of one KV-cache call on the host, and what the test expects of it.
struct KvProblem {
  KvCase c;
  uint64_t seed;
  HostTensor q, k_cache, v_cache, k_new, v_new, cos, sin, out;
  std::vector<float> lse;
  std::vector<int32_t> seqlens, leftpad, batch_idx, block_table, cu_q, cu_k;
  std::vector<float> slopes;
  int64_t table_stride = 0;
  int cache_batches = 0;

  KvProblem(const KvCase& kc, uint64_t s) : c(kc), seed(s) {
    std::mt19937_64 rng(seed);
    const int b = c.batch;
    const int total_q = b * c.sq;
    q = c.varlen ? HostTensor(c.dtype, 1, total_q, c.hq, c.d) : HostTensor(c.dtype, b, c.sq, c.hq, c.d);
    q.fill_random(rng);
    out = HostTensor(c.dtype, q.shape[0], q.shape[1], c.hq, c.d);
    out.fill_nan();
    lse.assign(size_t(total_q) * c.hq, NAN);
    if (c.page_size) {
      // Each sequence's pages, in a random order, from a pool with spare pages never referenced.
      const int mp = c.max_pages(), num_pages = b * mp + 3;
      std::vector<int32_t> pool(static_cast<size_t>(num_pages));
      std::iota(pool.begin(), pool.end(), 0);
      std::shuffle(pool.begin(), pool.end(), rng);
      table_stride = mp + 2;  // a padded block table: entries past max_pages are never read
      block_table.assign(size_t(table_stride) * b, -7);
      for (int i = 0; i < b; ++i)
        for (int pg = 0; pg < mp; ++pg) block_table[size_t(i) * table_stride + pg] = pool[size_t(i) * mp + pg];
      k_cache = HostTensor(c.dtype, num_pages, c.page_size, c.hkv, c.d, Layout::kPadded);
      v_cache = HostTensor(c.dtype, num_pages, c.page_size, c.hkv, c.d);
    } else {
      cache_batches = c.batch_idx ? b + 2 : b;
      k_cache = HostTensor(c.dtype, cache_batches, c.capacity, c.hkv, c.d, Layout::kPadded);
      v_cache = HostTensor(c.dtype, cache_batches, c.capacity, c.hkv, c.d);
      if (c.batch_idx) {
        std::vector<int32_t> perm(static_cast<size_t>(cache_batches));
        std::iota(perm.begin(), perm.end(), 0);
        std::shuffle(perm.begin(), perm.end(), rng);
        batch_idx.assign(perm.begin(), perm.begin() + b);
      }
    }
    k_cache.fill_random(rng);
    v_cache.fill_random(rng);
    seqlens.assign(c.cache_lens.begin(), c.cache_lens.end());
    leftpad.assign(c.leftpad.begin(), c.leftpad.end());
    // Rows outside [leftpad, cache_len) are NaN: a path that reads them poisons its output.
    for (int i = 0; i < b; ++i)
      for (int r = 0; r < c.room(); ++r) {
        const bool live = r >= first_row(i) && r < seqlens[size_t(i)];
        if (!live)
          for (int h = 0; h < c.hkv; ++h)
            for (int x = 0; x < c.d; ++x) {
              set_cache(k_cache, i, r, h, x, NAN);
              set_cache(v_cache, i, r, h, x, NAN);
            }
      }
    if (c.seqlen_new) {
      k_new = HostTensor(c.dtype, b, c.seqlen_new, c.hkv, c.d, Layout::kHeadMajor);
      v_new = HostTensor(c.dtype, b, c.seqlen_new, c.hkv, c.d);
      k_new.fill_random(rng);
      v_new.fill_random(rng);
    }
    if (c.rotary_dim) {
      // Positions past every sequence's needs too (rows a path must not index are simply unused).
      const int rows = c.room() + c.sq + 1, half = c.rotary_dim / 2;
      cos = HostTensor(c.dtype, 1, rows, 1, half);
      sin = HostTensor(c.dtype, 1, rows, 1, half);
      for (int pos = 0; pos < rows; ++pos)
        for (int i = 0; i < half; ++i) {
          const double angle = pos * std::pow(10000.0, -2.0 * i / c.rotary_dim);
          cos.set(0, pos, 0, i, std::cos(angle));
          sin.set(0, pos, 0, i, std::sin(angle));
        }
    }
    if (c.varlen) {
      cu_q.resize(size_t(b) + 1);
      cu_k.resize(size_t(b) + 1);
      for (int i = 0; i <= b; ++i) cu_q[size_t(i)] = i * c.sq;
      for (int i = 0; i < b; ++i) cu_k[size_t(i) + 1] = cu_k[size_t(i)] + seqlens[size_t(i)];
    }
    if (c.alibi) slopes = alibi_standard_slopes(c.hq);
  }

  int first_row(int i) const { return leftpad.empty() ? 0 : leftpad[size_t(i)]; }
  int end_row(int i) const { return seqlens[size_t(i)] + c.seqlen_new; }
  // Storage index of cache row r of sequence i.
  int64_t cache_index(const HostTensor& t, int i, int r, int h, int x) const {
    if (c.page_size)
      return t.index(block_table[size_t(i) * table_stride + r / c.page_size], r % c.page_size, h, x);
    return t.index(batch_idx.empty() ? i : batch_idx[size_t(i)], r, h, x);
  }
  double get_cache(const HostTensor& t, int i, int r, int h, int x) const {
    return load_double(t.data(), t.dtype, cache_index(t, i, r, h, x));
  }
  void set_cache(HostTensor& t, int i, int r, int h, int x, double v) const {
    store_double(t.data(), t.dtype, cache_index(t, i, r, h, x), v);
  }
  bool per_row_positions() const { return c.causal || c.window_left >= 0 || c.window_right >= 0; }

  // Row `x` of length d rotated at position pos, in fp64, rounded to the dtype (flashattn.h).
  std::vector<double> rotated(std::vector<double> x, int pos) const {
    if (!c.rotary_dim) return x;
    const int half = c.rotary_dim / 2;
    for (int i = 0; i < half; ++i) {
      const double cs = cos.get(0, pos, 0, i), sn = sin.get(0, pos, 0, i);
      const int a = c.interleaved ? 2 * i : i, b = c.interleaved ? 2 * i + 1 : i + half;
      const double x0 = x[size_t(a)], x1 = x[size_t(b)];
      x[size_t(a)] = round_to(c.dtype, x0 * cs - x1 * sn);
      x[size_t(b)] = round_to(c.dtype, x0 * sn + x1 * cs);
    }
    return x;
  }
  std::vector<double> row_of(const HostTensor& t, int64_t b, int64_t s, int h) const {
    std::vector<double> x(size_t(c.d));
    for (int i = 0; i < c.d; ++i) x[size_t(i)] = t.get(b, s, h, i);
    return x;
  }
  // The value cache row r of sequence i must hold after the call (NaN for rows never written).
  double expected_cache(const HostTensor& before, const HostTensor& fresh, bool keys, int i, int r, int h,
                        int x) const {
    const int s0 = seqlens[size_t(i)];
    if (r >= s0 && r < s0 + c.seqlen_new) {
      std::vector<double> row = row_of(fresh, i, r - s0, h);
      return (keys ? rotated(row, r) : row)[size_t(x)];
    }
    return get_cache(before, i, r, h, x);
  }

  flashattn_fwd_params params(flashattn_backend backend) {
    flashattn_fwd_params p = flashattn_fwd_params_init();
    p.dtype = c.dtype;
    p.q = q.view();
    p.k = k_cache.view();
    p.v = v_cache.view();
    p.out = out.view();
    p.lse = lse.data();
    p.options.backend = backend;
    p.options.causal = c.causal;
    p.options.window_left = c.window_left;
    p.options.window_right = c.window_right;
    p.options.softcap = c.softcap;
    if (c.varlen) {
      p.varlen.cu_seqlens_q = cu_q.data();
      p.varlen.cu_seqlens_k = cu_k.data();
      p.varlen.batch = c.batch;
      p.varlen.max_seqlen_q = c.sq;
      p.varlen.max_seqlen_k = *std::max_element(seqlens.begin(), seqlens.end());
    }
    if (!slopes.empty()) p.alibi_slopes = slopes.data();
    flashattn_kv_cache& kv = p.kv_cache;
    if (c.page_size) {
      kv.block_table = block_table.data();
      kv.block_table_stride = table_stride;
      kv.max_pages = c.max_pages();
    }
    if (!c.varlen) kv.seqlens = seqlens.data();
    if (!leftpad.empty()) kv.leftpad = leftpad.data();
    if (!batch_idx.empty()) kv.batch_idx = batch_idx.data();
    if (c.seqlen_new) {
      kv.k_new = k_new.view();
      kv.v_new = v_new.view();
    }
    if (c.rotary_dim) {
      kv.rotary_cos = cos.data();
      kv.rotary_sin = sin.data();
      kv.rotary_seqlen = cos.shape[1];
      kv.rotary_dim = c.rotary_dim;
      kv.rotary_interleaved = c.interleaved;
    }
    return p;
  }

  // The same attention as a plain varlen problem: q rotated, each sequence's keys gathered from
  // the cache as it must be after the call (`before`: the cache before it).
  Problem gathered(const HostTensor& k_before, const HostTensor& v_before) const {
    Case g;
    g.dtype = c.dtype;
    g.hq = c.hq;
    g.hkv = c.hkv;
    g.d = c.d;
    g.causal = c.causal;
    g.window_left = c.window_left;
    g.window_right = c.window_right;
    g.softcap = c.softcap;
    g.alibi_slopes = slopes;
    for (int i = 0; i < c.batch; ++i) {
      g.seqlens_q.push_back(c.sq);
      g.seqlens_k.push_back(end_row(i) - first_row(i));
    }
    Problem p(g, seed);
    for (int i = 0; i < c.batch; ++i) {
      for (int t = 0; t < c.sq; ++t)
        for (int h = 0; h < c.hq; ++h) {
          const int64_t qb = c.varlen ? 0 : i, qs = c.varlen ? int64_t(i) * c.sq + t : t;
          const int pos = c.rotary_dim ? seqlens[size_t(i)] + (per_row_positions() ? t : 0) : 0;
          const std::vector<double> row = rotated(row_of(q, qb, qs, h), pos);
          for (int x = 0; x < c.d; ++x) p.q.set(0, p.q_row(i, t), h, x, row[size_t(x)]);
        }
      for (int j = 0; j < end_row(i) - first_row(i); ++j)
        for (int h = 0; h < c.hkv; ++h)
          for (int x = 0; x < c.d; ++x) {
            const int r = first_row(i) + j;
            p.k.set(0, p.k_row(i, j), h, x, expected_cache(k_before, k_new, true, i, r, h, x));
            p.v.set(0, p.k_row(i, j), h, x, expected_cache(v_before, v_new, false, i, r, h, x));
          }
    }
    return p;
  }

  // This call's out/lse in the gathered problem's layout.
  void export_outputs(Problem& g) const {
    for (int i = 0; i < c.batch; ++i)
      for (int t = 0; t < c.sq; ++t)
        for (int h = 0; h < c.hq; ++h) {
          const int64_t qb = c.varlen ? 0 : i, qs = c.varlen ? int64_t(i) * c.sq + t : t;
          for (int x = 0; x < c.d; ++x) g.out.set(0, g.q_row(i, t), h, x, out.get(qb, qs, h, x));
          const size_t li = c.varlen ? size_t(h) * c.batch * c.sq + size_t(i) * c.sq + t
                                     : (size_t(i) * c.hq + h) * c.sq + t;
          g.lse[size_t(g.lse_index(i, h, t))] = lse[li];
        }
  }
};

// Cache contents after a call vs what it must hold (1 ulp for rotated rows: paths may rotate in
// fp32), every other element bitwise unchanged (NaN included).
::testing::AssertionResult check_cache(const KvProblem& p, const HostTensor& before, const HostTensor& after,
                                       const HostTensor& fresh, bool keys) {
  // Bytes outside every sequence's rows (other pages, other cache batches, padding) untouched:
  // compare the whole storage after patching in the rows the call may write.
  HostTensor expect = before;
  for (int i = 0; i < p.c.batch; ++i)
    for (int r = p.seqlens[size_t(i)]; r < p.end_row(i); ++r)
      for (int h = 0; h < p.c.hkv; ++h)
        for (int x = 0; x < p.c.d; ++x) {
          const double want = p.expected_cache(before, fresh, keys, i, r, h, x);
          const double got = p.get_cache(after, i, r, h, x);
          const double tol = 2 * unit_roundoff(p.c.dtype) * std::fabs(want);
          if (!(std::fabs(got - want) <= tol))
            return ::testing::AssertionFailure() << (keys ? "k" : "v") << "_cache row " << r << " of sequence " << i
                                                 << " head " << h << " col " << x << ": " << got << ", expected "
                                                 << want;
          p.set_cache(expect, i, r, h, x, got);
        }
  if (std::memcmp(expect.data(), after.data(), expect.size_bytes()) != 0)
    return ::testing::AssertionFailure() << (keys ? "k" : "v") << "_cache: bytes outside the appended rows changed";
  return ::testing::AssertionSuccess();
}

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
  const flashattn_dtype dtypes[] = {FLASHATTN_DTYPE_FP16, FLASHATTN_DTYPE_BF16, FLASHATTN_DTYPE_FP32,
                                    FLASHATTN_DTYPE_FP64};
  const int page_sizes[] = {0, 1, 3, 16, 256};
  for (int trial = 0; trial < 40; ++trial) {
    std::uniform_int_distribution<int> pick(0, 1 << 20);
    KvCase c;
    c.dtype = dtypes[pick(master) % 4];
    c.page_size = page_sizes[pick(master) % 5];
    c.batch = 1 + pick(master) % 3;
    c.hkv = 1 + pick(master) % 2;
    c.hq = c.hkv * (1 + pick(master) % 4);
    c.d = (pick(master) % 2) ? 64 : 40;
    c.sq = (pick(master) % 3 == 0) ? 4 : 1;
    c.seqlen_new = (pick(master) % 4 == 0) ? 0 : 1 + pick(master) % 5;
    c.capacity = c.page_size == 256 ? 300 : 20 + pick(master) % 200;
    const int lens[] = {0, 1, 7, 113};
    for (int i = 0; i < c.batch; ++i)
      c.cache_lens.push_back(std::min(lens[pick(master) % 4] + pick(master) % 3, c.room() - c.seqlen_new));
    if (pick(master) % 3 == 0)
      for (int i = 0; i < c.batch; ++i)
        c.leftpad.push_back(std::min(c.cache_lens[size_t(i)], pick(master) % 5));
    c.batch_idx = c.page_size == 0 && pick(master) % 2;
    if (c.seqlen_new && pick(master) % 2) {
      c.rotary_dim = (pick(master) % 2) ? c.d : c.d / 2;
      c.interleaved = pick(master) % 2;
    }
    switch (pick(master) % 4) {
      case 0: c.causal = true; break;
      case 1: c.window_left = 5; c.window_right = 0; break;
      case 2: c.softcap = 8.f; break;
      default: break;
    }
    c.alibi = pick(master) % 5 == 0;
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
