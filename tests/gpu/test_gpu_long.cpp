// One 128k-token sequence (hdim 128, 16 heads, bf16, causal) forward + backward on the GPU,
// checked on sampled rows against an fp64 row oracle written here: O/LSE/dQ rows exactly from
// q, k, v, dout; dK/dV rows from the exact per-key sums over every query row that sees the key,
// with the query rows' softmax statistics (LSE, D = rowsum(dO * O)) taken from the forward
// under test (themselves checked on the sampled rows), since exact ones for all 128k rows
// would cost O(N^2 d) on the CPU.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "common/half_convert.h"
#include "flashattn/flashattn.h"

namespace {

constexpr int kS = 131072, kH = 16, kD = 128;
constexpr int64_t kElems = int64_t(kS) * kH * kD;

double bf(uint16_t x) { return double(flashattn::bits_float(uint32_t(x) << 16)); }

uint64_t splitmix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// N(0,1) bf16 values from a counter-based hash (parallel and reproducible).
void fill_normal_bf16(std::vector<uint16_t>& v, uint64_t seed) {
  const unsigned nt = std::max(1u, std::min(32u, std::thread::hardware_concurrency()));
  std::vector<std::thread> ts;
  const int64_t n = int64_t(v.size());
  for (unsigned t = 0; t < nt; ++t)
    ts.emplace_back([&, t] {
      for (int64_t i = n * t / nt; i < n * (t + 1) / nt; ++i) {
        const uint64_t r = splitmix(seed * 0x100000001b3ull + uint64_t(i));
        const double u1 = (double((r >> 11) & 0x1fffff) + 1.0) / 2097153.0;
        const double u2 = double(r >> 43) / 2097152.0;
        const float x = float(std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2));
        v[size_t(i)] = flashattn::float_to_bf16(x);
      }
    });
  for (auto& th : ts) th.join();
}

int64_t count_nan_bf16(const std::vector<uint16_t>& v) {
  int64_t n = 0;
  for (uint16_t x : v) n += ((x & 0x7f80u) == 0x7f80u) && (x & 0x7fu);
  return n;
}

bool has_cc80_device() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
    cudaGetLastError();
    return false;
  }
  cudaDeviceProp p;
  return cudaGetDeviceProperties(&p, 0) == cudaSuccess && p.major >= 8;
}

struct Dev {
  void* p = nullptr;
  explicit Dev(size_t n) {
    if (cudaMalloc(&p, n) != cudaSuccess) {
      p = nullptr;
      cudaGetLastError();
    }
  }
  ~Dev() {
    if (p) cudaFree(p);
  }
};

struct Compare {
  double max_err = 0, max_abs = 0;
  int nans = 0;
  void add(double ours, double exact) {
    if (std::isnan(ours) || std::isnan(exact)) {
      ++nans;
      return;
    }
    max_err = std::max(max_err, std::fabs(ours - exact));
    max_abs = std::max(max_abs, std::fabs(exact));
  }
  // bf16 output: a few ulps of the row's largest value (a wrong mask or block is O(1) off).
  bool ok() const { return nans == 0 && max_err <= 0.02 * max_abs + 1e-6; }
};

class GpuLong : public ::testing::TestWithParam<flashattn_backend> {};

TEST_P(GpuLong, Causal128kTokensSampledRows) {
  const flashattn_backend backend = GetParam();
  if (!has_cc80_device()) GTEST_SKIP() << "no CUDA device of compute capability 8.0+";
  if (!(flashattn_compiled_backends() & (1u << backend)))
    GTEST_SKIP() << flashattn_backend_name(backend) << " is not compiled into this build";
  cudaDeviceProp prop;
  ASSERT_EQ(cudaGetDeviceProperties(&prop, 0), cudaSuccess);
  if (backend == FLASHATTN_BACKEND_SM90 && prop.major * 10 + prop.minor != 90) GTEST_SKIP() << "sm90 needs cc 9.0";
  if (prop.totalGlobalMem < (size_t(8) << 30)) GTEST_SKIP() << "needs 8 GB of device memory";

  const size_t bytes = size_t(kElems) * 2;
  std::vector<uint16_t> q(kElems), k(kElems), v(kElems), dout(kElems);
  fill_normal_bf16(q, 1);
  fill_normal_bf16(k, 2);
  fill_normal_bf16(v, 3);
  fill_normal_bf16(dout, 4);

  Dev dq_(bytes), dk_(bytes), dv_(bytes), q_(bytes), k_(bytes), v_(bytes), o_(bytes), do_(bytes),
      lse_(size_t(kH) * kS * 4);
  for (Dev* d : {&dq_, &dk_, &dv_, &q_, &k_, &v_, &o_, &do_, &lse_}) ASSERT_NE(d->p, nullptr) << "cudaMalloc";
  ASSERT_EQ(cudaMemcpy(q_.p, q.data(), bytes, cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(k_.p, k.data(), bytes, cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(v_.p, v.data(), bytes, cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(do_.p, dout.data(), bytes, cudaMemcpyHostToDevice), cudaSuccess);
  // Poison the outputs: 0xFFFF is a bf16 NaN; 0xFF bytes are a float NaN.
  for (Dev* d : {&o_, &dq_, &dk_, &dv_}) ASSERT_EQ(cudaMemset(d->p, 0xff, bytes), cudaSuccess);
  ASSERT_EQ(cudaMemset(lse_.p, 0xff, size_t(kH) * kS * 4), cudaSuccess);

  auto tensor = [](void* p) {
    flashattn_tensor t;
    t.data = p;
    t.shape[0] = 1, t.shape[1] = kS, t.shape[2] = kH, t.shape[3] = kD;
    t.stride[3] = 1, t.stride[2] = kD, t.stride[1] = int64_t(kH) * kD, t.stride[0] = kElems;
    return t;
  };
  flashattn_options opt = flashattn_default_options();
  opt.causal = 1;
  opt.backend = backend;
  opt.device = 0;
  flashattn_fwd_params f = flashattn_fwd_params_init();
  f.dtype = FLASHATTN_DTYPE_BF16;
  f.q = tensor(q_.p), f.k = tensor(k_.p), f.v = tensor(v_.p), f.out = tensor(o_.p);
  f.lse = static_cast<float*>(lse_.p);
  f.options = opt;
  flashattn_status s = flashattn_fwd(&f, nullptr, 0, nullptr);
  if (s == FLASHATTN_ERROR_NOT_SUPPORTED && backend == FLASHATTN_BACKEND_SM90)
    GTEST_SKIP() << flashattn_last_error();
  ASSERT_EQ(s, FLASHATTN_SUCCESS) << flashattn_last_error();
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);

  flashattn_bwd_params b = flashattn_bwd_params_init();
  b.dtype = FLASHATTN_DTYPE_BF16;
  b.q = tensor(q_.p), b.k = tensor(k_.p), b.v = tensor(v_.p), b.out = tensor(o_.p), b.dout = tensor(do_.p);
  b.dq = tensor(dq_.p), b.dk = tensor(dk_.p), b.dv = tensor(dv_.p);
  b.lse = static_cast<const float*>(lse_.p);
  b.options = opt;
  s = flashattn_bwd(&b, nullptr, 0, nullptr);
  const bool bwd_ran = s == FLASHATTN_SUCCESS;
  if (!bwd_ran && !(s == FLASHATTN_ERROR_NOT_SUPPORTED && backend == FLASHATTN_BACKEND_SM90))
    ADD_FAILURE() << "backward: " << flashattn_last_error();
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);

  std::vector<uint16_t> o(kElems), dq, dk, dv;
  std::vector<float> lse(size_t(kH) * kS);
  ASSERT_EQ(cudaMemcpy(o.data(), o_.p, bytes, cudaMemcpyDeviceToHost), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(lse.data(), lse_.p, lse.size() * 4, cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(count_nan_bf16(o), 0) << "NaN in out";
  if (bwd_ran) {
    for (auto* h : {&dq, &dk, &dv}) h->resize(size_t(kElems));
    ASSERT_EQ(cudaMemcpy(dq.data(), dq_.p, bytes, cudaMemcpyDeviceToHost), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(dk.data(), dk_.p, bytes, cudaMemcpyDeviceToHost), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(dv.data(), dv_.p, bytes, cudaMemcpyDeviceToHost), cudaSuccess);
    EXPECT_EQ(count_nan_bf16(dq), 0) << "NaN in dq";
    EXPECT_EQ(count_nan_bf16(dk), 0) << "NaN in dk";
    EXPECT_EQ(count_nan_bf16(dv), 0) << "NaN in dv";
  }

  const double scale = 1.0 / std::sqrt(double(kD));
  auto at = [](int64_t row, int h) { return (row * kH + h) * kD; };
  auto dot = [&](const std::vector<uint16_t>& a, int64_t ia, const std::vector<uint16_t>& b, int64_t ib) {
    double acc = 0;
    for (int c = 0; c < kD; ++c) acc += bf(a[size_t(ia + c)]) * bf(b[size_t(ib + c)]);
    return acc;
  };

  // Query rows: first, last, block edges and a spread; heads vary.
  const int rows[] = {0, 1, 63, 64, 127, 4095, 4096, 20011, 65535, 65536, 99999, 111111, 123457, 131000, 131070, 131071};
  std::vector<double> p(kS), dp(kS);
  for (int r = 0; r < 16; ++r) {
    const int i = rows[r], h = (r * 5) % kH;
    // causal, seqlen_q == seqlen_k: row i sees keys [0, i].
    double m = -INFINITY;
    for (int j = 0; j <= i; ++j) m = std::max(m, p[j] = scale * dot(q, at(i, h), k, at(j, h)));
    double l = 0;
    for (int j = 0; j <= i; ++j) l += (p[j] = std::exp(p[j] - m));
    std::vector<double> oe(kD, 0.0), dqe(kD, 0.0);
    for (int j = 0; j <= i; ++j) {
      p[j] /= l;
      for (int c = 0; c < kD; ++c) oe[c] += p[j] * bf(v[size_t(at(j, h) + c)]);
    }
    Compare co;
    for (int c = 0; c < kD; ++c) co.add(bf(o[size_t(at(i, h) + c)]), oe[c]);
    EXPECT_TRUE(co.ok()) << "out row " << i << " head " << h << ": max err " << co.max_err << " vs max|o| "
                         << co.max_abs << ", " << co.nans << " NaN";
    const double lse_exact = m + std::log(l);
    const float lse_ours = lse[size_t(h) * kS + i];
    EXPECT_NEAR(lse_ours, lse_exact, 1e-4 * std::max(1.0, std::fabs(lse_exact))) << "lse row " << i << " head " << h;
    if (!bwd_ran) continue;
    double d_exact = 0;
    for (int j = 0; j <= i; ++j) d_exact += p[j] * (dp[j] = dot(dout, at(i, h), v, at(j, h)));
    for (int j = 0; j <= i; ++j) {
      const double ds = p[j] * (dp[j] - d_exact);
      for (int c = 0; c < kD; ++c) dqe[c] += scale * ds * bf(k[size_t(at(j, h) + c)]);
    }
    Compare cq;
    for (int c = 0; c < kD; ++c) cq.add(bf(dq[size_t(at(i, h) + c)]), dqe[c]);
    EXPECT_TRUE(cq.ok()) << "dq row " << i << " head " << h << ": max err " << cq.max_err << " vs max|dq| "
                         << cq.max_abs << ", " << cq.nans << " NaN";
  }
  if (!bwd_ran) return;

  // Key rows: sums over every query row i >= j with that row's LSE and D from the forward.
  const int keys[] = {0, 777, 65600, 131071};
  for (int r = 0; r < 4; ++r) {
    const int j = keys[r], h = (r * 7 + 3) % kH;
    std::vector<double> dke(kD, 0.0), dve(kD, 0.0);
    for (int i = j; i < kS; ++i) {
      const double pij = std::exp(scale * dot(q, at(i, h), k, at(j, h)) - double(lse[size_t(h) * kS + i]));
      const double di = dot(dout, at(i, h), o, at(i, h));
      const double ds = pij * (dot(dout, at(i, h), v, at(j, h)) - di);
      for (int c = 0; c < kD; ++c) {
        dve[c] += pij * bf(dout[size_t(at(i, h) + c)]);
        dke[c] += scale * ds * bf(q[size_t(at(i, h) + c)]);
      }
    }
    Compare ck, cv;
    for (int c = 0; c < kD; ++c) {
      ck.add(bf(dk[size_t(at(j, h) + c)]), dke[c]);
      cv.add(bf(dv[size_t(at(j, h) + c)]), dve[c]);
    }
    EXPECT_TRUE(ck.ok()) << "dk row " << j << " head " << h << ": max err " << ck.max_err << " vs max|dk| "
                         << ck.max_abs << ", " << ck.nans << " NaN";
    EXPECT_TRUE(cv.ok()) << "dv row " << j << " head " << h << ": max err " << cv.max_err << " vs max|dv| "
                         << cv.max_abs << ", " << cv.nans << " NaN";
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, GpuLong, ::testing::Values(FLASHATTN_BACKEND_SM80, FLASHATTN_BACKEND_SM90),
                         [](const ::testing::TestParamInfo<flashattn_backend>& i) {
                           return std::string(flashattn_backend_name(i.param));
                         });

}  // namespace
