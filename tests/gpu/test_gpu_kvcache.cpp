// The KV-cache forward on the GPU paths (issue 17) through the C ABI: the host tests' random
// problems (tests/kv_test_util.h: paged caches with page sizes 1..256, ragged cache lengths incl.
// 0, leftpad, batch_idx, appends, rotary, GQA, masks) run on device copies, with split-KV off,
// forced and chosen by the heuristic; outputs are checked against the fp64 oracle of the same
// attention rebuilt as a plain varlen problem, and the caches after the in-place append against
// what they must hold (every other byte unchanged). Also the CUDA combine kernel against the host
// combine. Skips without a GPU or without a compiled path.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "flashattn/flashattn.h"
#include "kv_test_util.h"
#include "test_util.h"

namespace flashattn::test {
namespace {

bool have_gpu_path(flashattn_backend backend, std::string* why) {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
    cudaGetLastError();
    *why = "no CUDA device";
    return false;
  }
  // AUTO is a dispatch choice, not a compiled path: with a GPU it always has somewhere to go.
  if (backend != FLASHATTN_BACKEND_AUTO && !(flashattn_compiled_backends() & (1u << backend))) {
    *why = std::string(flashattn_backend_name(backend)) + " is not compiled into this build";
    return false;
  }
  return true;
}

// Device copies of host buffers, found again by their host pointer.
class Mirror {
 public:
  ~Mirror() {
    for (auto& kv : map_) cudaFree(kv.second.first);
  }
  // The device copy of [host, host + bytes) (uploaded once).
  void* up(const void* host, size_t bytes) {
    if (host == nullptr || bytes == 0) return nullptr;
    auto it = map_.find(host);
    if (it != map_.end()) return it->second.first;
    void* d = nullptr;
    if (cudaMalloc(&d, bytes) != cudaSuccess || cudaMemcpy(d, host, bytes, cudaMemcpyHostToDevice) != cudaSuccess) {
      ok_ = false;
      return nullptr;
    }
    map_[host] = {d, bytes};
    return d;
  }
  void down(void* host) {
    auto it = map_.find(host);
    if (it == map_.end() || cudaMemcpy(host, it->second.first, it->second.second, cudaMemcpyDeviceToHost) != cudaSuccess)
      ok_ = false;
  }
  bool ok() const { return ok_; }

 private:
  std::map<const void*, std::pair<void*, size_t>> map_;
  bool ok_ = true;
};

template <typename T>
size_t bytes_of(const std::vector<T>& v) {
  return v.size() * sizeof(T);
}

// Runs p on `backend` with its buffers on the device; outputs and caches come back into p.
flashattn_status run_on_device(KvProblem& p, flashattn_backend backend, int num_splits, std::string* msg) {
  Mirror m;
  flashattn_fwd_params f = p.params(backend);
  f.options.device = 0;
  f.num_splits = num_splits;
  auto tensor = [&](flashattn_tensor& t, HostTensor& h) {
    if (t.data) t.data = m.up(h.data(), h.size_bytes());
  };
  tensor(f.q, p.q);
  tensor(f.k, p.k_cache);
  tensor(f.v, p.v_cache);
  tensor(f.out, p.out);
  tensor(f.kv_cache.k_new, p.k_new);
  tensor(f.kv_cache.v_new, p.v_new);
  f.lse = static_cast<float*>(m.up(p.lse.data(), bytes_of(p.lse)));
  f.kv_cache.rotary_cos = m.up(p.cos.data(), f.kv_cache.rotary_cos ? p.cos.size_bytes() : 0);
  f.kv_cache.rotary_sin = m.up(p.sin.data(), f.kv_cache.rotary_sin ? p.sin.size_bytes() : 0);
  f.kv_cache.block_table = static_cast<const int32_t*>(m.up(p.block_table.data(), bytes_of(p.block_table)));
  if (f.kv_cache.seqlens) f.kv_cache.seqlens = static_cast<const int32_t*>(m.up(p.seqlens.data(), bytes_of(p.seqlens)));
  f.kv_cache.leftpad = static_cast<const int32_t*>(m.up(p.leftpad.data(), bytes_of(p.leftpad)));
  f.kv_cache.batch_idx = static_cast<const int32_t*>(m.up(p.batch_idx.data(), bytes_of(p.batch_idx)));
  f.varlen.cu_seqlens_q = static_cast<const int32_t*>(m.up(p.cu_q.data(), bytes_of(p.cu_q)));
  f.varlen.cu_seqlens_k = static_cast<const int32_t*>(m.up(p.cu_k.data(), bytes_of(p.cu_k)));
  f.alibi_slopes = static_cast<const float*>(m.up(p.slopes.data(), bytes_of(p.slopes)));
  if (!m.ok()) {
    *msg = "device allocation or upload failed";
    return FLASHATTN_ERROR_CUDA;
  }
  const flashattn_status s = flashattn_fwd(&f, nullptr, 0, nullptr);
  *msg = flashattn_last_error();
  if (cudaDeviceSynchronize() != cudaSuccess) {
    *msg = "kernel failed: " + std::string(cudaGetErrorString(cudaGetLastError()));
    return FLASHATTN_ERROR_CUDA;
  }
  for (void* h : {p.out.data(), static_cast<void*>(p.lse.data()), p.k_cache.data(), p.v_cache.data()}) m.down(h);
  if (!m.ok()) *msg = "download failed";
  return m.ok() ? s : FLASHATTN_ERROR_CUDA;
}

// One case on a GPU backend for each split setting, each on a fresh copy of the cache.
void run_gpu_case(const KvCase& kc, uint64_t seed, flashattn_backend backend) {
  KvProblem base(kc, seed);
  SCOPED_TRACE(kc.str() + " seed " + std::to_string(seed));
  Problem g = base.gathered(base.k_cache, base.v_cache);
  const Oracle exact = run_oracle(g, Rounding::kExact, false);
  const Oracle standard = run_oracle(g, Rounding::kInputPrecision, false);
  for (int splits : {1, 3, 0}) {
    SCOPED_TRACE("num_splits " + std::to_string(splits));
    KvProblem p = base;
    std::string msg;
    ASSERT_EQ(run_on_device(p, backend, splits, &msg), FLASHATTN_SUCCESS) << msg;
    EXPECT_TRUE(check_cache(p, base.k_cache, p.k_cache, p.k_new, true));
    EXPECT_TRUE(check_cache(p, base.v_cache, p.v_cache, p.v_new, false));
    g.poison_outputs();
    p.export_outputs(g);
    EXPECT_TRUE(check_fwd(g, exact, standard));
  }
}

class GpuKvCache : public ::testing::TestWithParam<flashattn_backend> {};

// The GPU grids' options: both 16-bit dtypes, caches up to ~1k rows, windows, softcap, partial rotary.
KvGrid gpu_grid(std::vector<int> headdims, std::vector<int> cache_lens, int max_group, int capacity_min) {
  KvGrid grid;
  grid.dtypes = {FLASHATTN_DTYPE_FP16, FLASHATTN_DTYPE_BF16};
  grid.headdims = std::move(headdims);
  grid.cache_lens = std::move(cache_lens);
  grid.max_group = max_group;
  grid.capacity_min = capacity_min;
  grid.capacity_span = 1064 - capacity_min;
  grid.capacity_256 = 1100;
  grid.window_left = 37;
  grid.softcap = 20.f;
  grid.partial_rotary_dim = 32;
  return grid;
}

TEST_P(GpuKvCache, DecodeGridMatchesGatheredOracle) {
  std::string why;
  if (!have_gpu_path(GetParam(), &why)) GTEST_SKIP() << why;
  std::mt19937_64 master(fresh_seed());
  const KvGrid grid = gpu_grid({128, 80}, {0, 1, 7, 113, 799}, 8, 64);
  for (int trial = 0; trial < 24; ++trial) {
    const KvCase c = random_kv_case(master, grid);
    run_gpu_case(c, master(), GetParam());
    if (HasFatalFailure()) return;
  }
}

// GQA-packed tiles (common/gqa_pack.h) over several queries: a kv head's query heads as the
// rows of one tile, with tile boundaries inside a query's group (group 3), more rows than one
// tile (13 x 8), causal and windowed rows each masked by their own query index, split or not.
TEST_P(GpuKvCache, PackedGqaGridMatchesGatheredOracle) {
  std::string why;
  if (!have_gpu_path(GetParam(), &why)) GTEST_SKIP() << why;
  std::mt19937_64 master(fresh_seed());
  const KvGrid grid = gpu_grid({128, 64}, {0, 1, 7, 113, 799}, 8, 64);
  const int rows[] = {2, 7, 13, 20}, groups[] = {3, 4, 8};
  for (int trial = 0; trial < 16; ++trial) {
    KvCase c = random_kv_case(master, grid);
    c.sq = rows[trial % 4];
    c.hq = c.hkv * groups[trial % 3];
    c.alibi = false;  // per-head slopes: such calls run unpacked
    if (trial % 4 == 1) c.causal = true, c.window_left = -1, c.window_right = -1, c.softcap = 0.f;
    run_gpu_case(c, master(), GetParam());
    if (HasFatalFailure()) return;
  }
}

// Prefill-sized q over a cache (more than 64 query rows: the CUDA path's prefill tile), fixed
// length, with every option of the decode grid: appends (fused, or rotated by the prepass),
// leftpad, batch_idx, pages of 1..256 rows, windows, softcap, ALiBi, GQA.
TEST_P(GpuKvCache, PrefillGridMatchesGatheredOracle) {
  std::string why;
  if (!have_gpu_path(GetParam(), &why)) GTEST_SKIP() << why;
  std::mt19937_64 master(fresh_seed());
  const KvGrid grid = gpu_grid({128, 64, 80}, {0, 7, 113, 799}, 4, 200);
  const int rows[] = {65, 100, 130};
  for (int trial = 0; trial < 12; ++trial) {
    KvCase c = random_kv_case(master, grid);
    c.sq = rows[trial % 3];
    run_gpu_case(c, master(), GetParam());
    if (HasFatalFailure()) return;
  }
}

TEST_P(GpuKvCache, PagedPrefillVarlen) {
  std::string why;
  if (!have_gpu_path(GetParam(), &why)) GTEST_SKIP() << why;
  std::mt19937_64 master(fresh_seed());
  for (int page_size : {1, 16, 256}) {
    KvCase c;
    c.varlen = true;
    c.dtype = FLASHATTN_DTYPE_BF16;
    c.page_size = page_size;
    c.batch = 3;
    c.sq = 70;
    c.hq = 8;
    c.hkv = 2;
    c.d = 128;
    c.capacity = 900;
    c.cache_lens = {70, 799, 300};
    c.causal = true;
    run_gpu_case(c, master(), GetParam());
  }
}

// A few small cases (compute-sanitizer runs the *Small* tests): paged with odd pages and an
// append with rotary, contiguous with batch_idx and leftpad, paged varlen, paged prefill.
TEST_P(GpuKvCache, SmallCases) {
  std::string why;
  if (!have_gpu_path(GetParam(), &why)) GTEST_SKIP() << why;
  KvCase a;
  a.dtype = FLASHATTN_DTYPE_BF16;
  a.page_size = 3;
  a.batch = 2;
  a.hq = 8;
  a.hkv = 2;
  a.d = 64;
  a.capacity = 150;
  a.cache_lens = {0, 130};
  a.seqlen_new = 2;
  a.rotary_dim = 64;
  a.causal = true;
  run_gpu_case(a, fresh_seed(), GetParam());
  KvCase b;
  b.dtype = FLASHATTN_DTYPE_FP16;
  b.batch = 3;
  b.sq = 4;
  b.hq = 4;
  b.hkv = 4;
  b.d = 128;
  b.capacity = 200;
  b.cache_lens = {7, 113, 1};
  b.leftpad = {2, 50, 0};
  b.batch_idx = true;
  b.seqlen_new = 3;
  b.softcap = 10.f;
  run_gpu_case(b, fresh_seed(), GetParam());
  KvCase c;
  c.varlen = true;
  c.dtype = FLASHATTN_DTYPE_BF16;
  c.page_size = 16;
  c.batch = 2;
  c.sq = 5;
  c.hq = 4;
  c.hkv = 1;
  c.d = 128;
  c.capacity = 100;
  c.cache_lens = {5, 90};
  c.causal = true;
  run_gpu_case(c, fresh_seed(), GetParam());
  KvCase d;  // the prefill tile's paged lookahead (page indices one key block ahead in smem)
  d.dtype = FLASHATTN_DTYPE_BF16;
  d.page_size = 3;
  d.batch = 2;
  d.sq = 66;
  d.hq = 4;
  d.hkv = 2;
  d.d = 64;
  d.capacity = 240;
  d.cache_lens = {0, 170};
  d.seqlen_new = 66;
  d.causal = true;
  run_gpu_case(d, fresh_seed(), GetParam());
}

// Long caches, one query, GQA: the decode shape split-KV exists for (the heuristic splits here).
TEST_P(GpuKvCache, LongDecodeSplits) {
  std::string why;
  if (!have_gpu_path(GetParam(), &why)) GTEST_SKIP() << why;
  KvCase c;
  c.dtype = FLASHATTN_DTYPE_BF16;
  c.page_size = 16;
  c.batch = 2;
  c.hq = 32;
  c.hkv = 8;
  c.d = 128;
  c.capacity = 8192;
  c.cache_lens = {8000, 4097};
  c.seqlen_new = 1;
  c.rotary_dim = 128;
  c.causal = true;
  run_gpu_case(c, fresh_seed(), GetParam());
}

// A batch of GQA decode steps with 33-64 (sequence, kv head) pairs: over a contiguous hdim-128 cache
// the sm80 path's 16-row tile with its 4-stage ring (launch_impl.cuh, kv_decode16), paged the 32-row
// tile; ragged lengths (an empty cache, 1, 7, ..., past one key block), appends, causal and not.
TEST_P(GpuKvCache, BatchedGqaDecodeWideTile) {
  std::string why;
  if (!have_gpu_path(GetParam(), &why)) GTEST_SKIP() << why;
  for (int page_size : {0, 16}) {
    for (int sq : {1, 4}) {
      KvCase c;
      c.dtype = sq == 1 ? FLASHATTN_DTYPE_BF16 : FLASHATTN_DTYPE_FP16;
      c.page_size = page_size;
      c.batch = 7;  // 56 pairs
      c.sq = sq;
      c.hq = 32;
      c.hkv = 8;
      c.d = 128;
      c.capacity = 4200;
      c.cache_lens = {0, 1, 7, 113, 799, 4097 - sq, 2500};
      c.seqlen_new = sq;
      c.causal = sq > 1;
      run_gpu_case(c, fresh_seed(), GetParam());
      if (HasFatalFailure()) return;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, GpuKvCache,
                         ::testing::Values(FLASHATTN_BACKEND_AUTO, FLASHATTN_BACKEND_SM80),
                         [](const ::testing::TestParamInfo<flashattn_backend>& i) {
                           return std::string(flashattn_backend_name(i.param));
                         });

// The CUDA combine kernels equal the host combine (to fp32 rounding) on random partial results
// with empty splits (-inf LSEs, NaN partial outputs that must not be read): S splits of
// [b, s, h, d] rows. Up to 8 splits over fp32 partials with d % 4 == 0 and d <= 256 take the
// float4 warp-per-row kernel; otherwise >= 8 splits (d <= 256) the CTA-per-row one (float4 loads
// where d % 4 == 0, else scalar), fewer the scalar warp-per-row one.
// S >= 2 (splits 0 and 1 hold the empty rows of batch 0).
void check_combine_matches_host(int S, int b, int s, int h, int d) {
  SCOPED_TRACE("splits " + std::to_string(S) + " headdim " + std::to_string(d));
  std::mt19937_64 rng(fresh_seed());
  std::vector<float> parts(size_t(S) * b * s * h * d), lses(size_t(S) * b * h * s);
  std::normal_distribution<float> n01;
  for (float& x : parts) x = n01(rng);
  for (size_t i = 0; i < lses.size(); ++i) {
    lses[i] = 3.f * n01(rng);
    if (i % 4 == 1) {  // an empty split: its partial row must not be read
      lses[i] = -INFINITY;
      const size_t split = i / (size_t(b) * h * s), rest = i % (size_t(b) * h * s);
      const size_t bb = rest / (size_t(h) * s), hh = rest / s % h, ii = rest % s;
      for (int c = 0; c < d; ++c) parts[(((split * b + bb) * s + ii) * h + hh) * d + c] = NAN;
    }
  }
  for (int i = 0; i < h * s; ++i) lses[size_t(i)] = lses[size_t(b) * h * s + i] = -INFINITY;  // rows of batch 0 empty in splits 0, 1
  for (int split = 0; split < S; ++split)  // the last batch's row 0 of head 0: empty in every split (O = 0, LSE = -inf)
    lses[size_t(split) * b * h * s + size_t(b - 1) * h * s] = -INFINITY;
  auto params = [&](const void* op, const float* lp, void* out, float* lse, int device) {
    flashattn_combine_params c = flashattn_combine_params_init();
    c.dtype = FLASHATTN_DTYPE_FP32;
    c.num_splits = S;
    c.out_partial = op;
    const int64_t shape[5] = {S, b, s, h, d};
    std::memcpy(c.out_partial_shape, shape, sizeof(shape));
    const int64_t pst[5] = {int64_t(b) * s * h * d, int64_t(s) * h * d, int64_t(h) * d, d, 1};
    std::memcpy(c.out_partial_stride, pst, sizeof(pst));
    c.lse_partial = lp;
    const int64_t lst[4] = {int64_t(b) * h * s, int64_t(h) * s, s, 1};
    std::memcpy(c.lse_partial_stride, lst, sizeof(lst));
    c.out.data = out;
    const int64_t osh[4] = {b, s, h, d}, ost[4] = {int64_t(s) * h * d, int64_t(h) * d, d, 1};
    std::memcpy(c.out.shape, osh, sizeof(osh));
    std::memcpy(c.out.stride, ost, sizeof(ost));
    c.lse = lse;
    c.options.device = device;
    return c;
  };
  std::vector<float> host_out(size_t(b) * s * h * d, NAN), host_lse(size_t(b) * h * s, NAN);
  flashattn_combine_params hc = params(parts.data(), lses.data(), host_out.data(), host_lse.data(), -1);
  ASSERT_EQ(flashattn_combine(&hc, nullptr), FLASHATTN_SUCCESS) << flashattn_last_error();
  Mirror m;
  std::vector<float> dev_out(host_out.size(), NAN), dev_lse(host_lse.size(), NAN);
  flashattn_combine_params dc =
      params(m.up(parts.data(), bytes_of(parts)), static_cast<const float*>(m.up(lses.data(), bytes_of(lses))),
             m.up(dev_out.data(), bytes_of(dev_out)), static_cast<float*>(m.up(dev_lse.data(), bytes_of(dev_lse))), 0);
  ASSERT_TRUE(m.ok());
  ASSERT_EQ(flashattn_combine(&dc, nullptr), FLASHATTN_SUCCESS) << flashattn_last_error();
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  m.down(dev_out.data());
  m.down(dev_lse.data());
  ASSERT_TRUE(m.ok());
  for (size_t i = 0; i < host_out.size(); ++i)
    ASSERT_NEAR(dev_out[i], host_out[i], 1e-5f * (1.f + std::fabs(host_out[i]))) << "out[" << i << "]";
  for (size_t i = 0; i < host_lse.size(); ++i) {
    if (std::isinf(host_lse[i])) {
      EXPECT_EQ(dev_lse[i], host_lse[i]) << "lse[" << i << "]";
    } else {
      EXPECT_NEAR(dev_lse[i], host_lse[i], 1e-5f * (1.f + std::fabs(host_lse[i]))) << "lse[" << i << "]";
    }
  }
}

TEST(GpuCombine, MatchesHostCombine) {
  std::string why;
  if (!have_gpu_path(FLASHATTN_BACKEND_SM80, &why)) GTEST_SKIP() << why;
  check_combine_matches_host(5, 2, 7, 3, 40);    // warp per row, 4 columns a lane (lanes past d idle)
  if (HasFatalFailure()) return;
  check_combine_matches_host(2, 8, 3, 5, 128);   // 2 splits over many rows (a batch's decode step)
  if (HasFatalFailure()) return;
  check_combine_matches_host(7, 1, 2, 3, 256);   // the vector warp kernel's two passes, its most splits
  if (HasFatalFailure()) return;
  check_combine_matches_host(3, 1, 2, 2, 42);    // warp per row, scalar (d % 4 != 0)
  if (HasFatalFailure()) return;
  check_combine_matches_host(8, 1, 3, 2, 64);    // the vector warp kernel's most splits
  if (HasFatalFailure()) return;
  check_combine_matches_host(9, 1, 3, 2, 64);    // CTA per row from 9 splits (float4)
  if (HasFatalFailure()) return;
  check_combine_matches_host(16, 1, 2, 3, 128);  // CTA per row, block reductions: its most splits at d <= 128
  if (HasFatalFailure()) return;
  check_combine_matches_host(17, 1, 2, 3, 128);  // CTA per row with an LSE reduction per warp: its fewest splits
  if (HasFatalFailure()) return;
  check_combine_matches_host(29, 1, 1, 32, 128);  // a batch-1 decode step's split-KV (29 splits, 32 GQA rows)
  if (HasFatalFailure()) return;
  check_combine_matches_host(32, 2, 2, 3, 100);   // the per-warp LSE kernel's most splits; lanes past d idle
  if (HasFatalFailure()) return;
  check_combine_matches_host(8, 1, 3, 2, 42);    // CTA per row from 8 splits (scalar: d % 4 != 0)
  if (HasFatalFailure()) return;
  check_combine_matches_host(57, 1, 1, 32, 128);  // a decode step's split-KV
  if (HasFatalFailure()) return;
  check_combine_matches_host(12, 2, 3, 2, 42);  // CTA per row, scalar loads (d % 4 != 0), threads left idle
  if (HasFatalFailure()) return;
  check_combine_matches_host(33, 1, 2, 4, 200);  // float4 loads, 5 split groups (not a power of two)
  if (HasFatalFailure()) return;
  check_combine_matches_host(300, 2, 2, 3, 256);  // more splits than threads, widest head
  if (HasFatalFailure()) return;
  check_combine_matches_host(20, 1, 2, 2, 264);  // head dim past the CTA kernel's: warp per row
}

}  // namespace
}  // namespace flashattn::test
