// KV-cache test problems shared by the host tests (test_kvcache.cpp) and the GPU tests
// (gpu/test_gpu_kvcache.cpp): a random cache (paged or contiguous, rows outside each sequence
// NaN), the call's params, the same attention rebuilt as a plain varlen Problem from the cache the
// call must leave (the oracle runs on that), and the check of the cache contents after the call.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
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
inline ::testing::AssertionResult check_cache(const KvProblem& p, const HostTensor& before, const HostTensor& after,
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

// The ranges a random decode grid draws its cases from (host and GPU tests differ in dtypes,
// head dims, cache sizes).
struct KvGrid {
  std::vector<flashattn_dtype> dtypes;
  std::vector<int> headdims;
  std::vector<int> cache_lens;  // each sequence's: one of these plus 0..2 (within the capacity)
  int max_group = 4;            // query heads per kv head: 1..max_group
  int capacity_min = 20, capacity_span = 200;  // contiguous and small pages; page 256: capacity_256
  int capacity_256 = 300;
  int window_left = 5;
  float softcap = 8.f;
  int partial_rotary_dim = 0;   // rotary on part of the head: this many columns (0: half the head)
};

inline KvCase random_kv_case(std::mt19937_64& rng, const KvGrid& g) {
  std::uniform_int_distribution<int> pick(0, 1 << 20);
  auto one_of = [&](const auto& v) { return v[size_t(pick(rng)) % v.size()]; };
  const int page_sizes[] = {0, 1, 3, 16, 256};
  KvCase c;
  c.dtype = one_of(g.dtypes);
  c.page_size = page_sizes[pick(rng) % 5];
  c.batch = 1 + pick(rng) % 3;
  c.hkv = 1 + pick(rng) % 2;
  c.hq = c.hkv * (1 + pick(rng) % g.max_group);
  c.d = one_of(g.headdims);
  c.sq = (pick(rng) % 3 == 0) ? 4 : 1;
  c.seqlen_new = (pick(rng) % 4 == 0) ? 0 : 1 + pick(rng) % 4;
  c.capacity = c.page_size == 256 ? g.capacity_256 : g.capacity_min + pick(rng) % g.capacity_span;
  for (int i = 0; i < c.batch; ++i)
    c.cache_lens.push_back(std::min(one_of(g.cache_lens) + pick(rng) % 3, c.room() - c.seqlen_new));
  if (pick(rng) % 3 == 0)
    for (int i = 0; i < c.batch; ++i) c.leftpad.push_back(std::min(c.cache_lens[size_t(i)], pick(rng) % 5));
  c.batch_idx = c.page_size == 0 && pick(rng) % 2;
  if (c.seqlen_new && pick(rng) % 2) {
    c.rotary_dim = (pick(rng) % 2) ? c.d : (g.partial_rotary_dim ? g.partial_rotary_dim : c.d / 2);
    c.interleaved = pick(rng) % 2;
  }
  switch (pick(rng) % 4) {
    case 0: c.causal = true; break;
    case 1: c.window_left = g.window_left; c.window_right = 0; break;
    case 2: c.softcap = g.softcap; break;
    default: break;
  }
  c.alibi = pick(rng) % 5 == 0;
  return c;
}

}  // namespace flashattn::test
