// Bad input through the C ABI: every invalid argument returns a clear status whose message
// names the argument, and nothing is written. Runs on host tensors (CI has no GPU); the
// device-only checks (alignment, device memory) run when a GPU is present.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <string>
#include <vector>

#include "flashattn/flashattn.h"
#include "flashattn/flashattn.hpp"

namespace {

// A small valid host problem of element type T (float: fp32, double: fp64, whose LSE then goes
// to lse_fp64) with its params built; each test breaks one thing. The inputs are smooth
// functions of the index (amp * sin/cos(f * i + phase)); the outputs start NaN-poisoned.
template <class T>
struct HostProblem {
  static constexpr bool kFp64 = sizeof(T) == 8;
  int b = 2, sq = 5, sk, hq = 4, hk = 2, d = 16;
  std::vector<T> q, k, v, o, lse, dout, dq, dk, dv;
  flashattn_fwd_params fwd;
  flashattn_bwd_params bwd;

  HostProblem(int seqlen_k, T amp_q, T phase_q, T amp_k, T phase_k) : sk(seqlen_k) {
    q.resize(size_t(b) * sq * hq * d);
    k.resize(size_t(b) * sk * hk * d);
    v.resize(k.size());
    for (size_t i = 0; i < q.size(); ++i) q[i] = amp_q * std::sin(T(0.37) * T(i) + phase_q);
    for (size_t i = 0; i < k.size(); ++i) k[i] = amp_k * std::cos(T(0.11) * T(i) + phase_k);
    for (size_t i = 0; i < v.size(); ++i) v[i] = std::sin(T(0.05) * T(i) + T(1));
    o.assign(q.size(), NAN);
    dout = q;
    dq.assign(q.size(), NAN);
    dk.assign(k.size(), NAN);
    dv.assign(v.size(), NAN);
    lse.assign(size_t(b) * hq * sq, NAN);
    const flashattn_dtype dtype = kFp64 ? FLASHATTN_DTYPE_FP64 : FLASHATTN_DTYPE_FP32;
    fwd = flashattn_fwd_params_init();
    fwd.dtype = dtype;
    fwd.q = flashattn::contiguous_tensor(q.data(), b, sq, hq, d);
    fwd.k = flashattn::contiguous_tensor(k.data(), b, sk, hk, d);
    fwd.v = flashattn::contiguous_tensor(v.data(), b, sk, hk, d);
    fwd.out = flashattn::contiguous_tensor(o.data(), b, sq, hq, d);
    bwd = flashattn_bwd_params_init();
    bwd.dtype = dtype;
    bwd.q = fwd.q;
    bwd.k = fwd.k;
    bwd.v = fwd.v;
    bwd.out = fwd.out;
    bwd.dout = flashattn::contiguous_tensor(dout.data(), b, sq, hq, d);
    bwd.dq = flashattn::contiguous_tensor(dq.data(), b, sq, hq, d);
    bwd.dk = flashattn::contiguous_tensor(dk.data(), b, sk, hk, d);
    bwd.dv = flashattn::contiguous_tensor(dv.data(), b, sk, hk, d);
    if constexpr (kFp64) {
      fwd.lse_fp64 = lse.data();
      bwd.lse_fp64 = lse.data();
    } else {
      fwd.lse = lse.data();
      bwd.lse = lse.data();
    }
  }
  bool outputs_untouched() const {
    for (T x : o)
      if (!std::isnan(x)) return false;
    for (T x : lse)
      if (!std::isnan(x)) return false;
    return true;
  }
};

// The fp32 problem most tests break one field of.
struct Problem : HostProblem<float> {
  Problem() : HostProblem<float>(7, 1.f, 0.f, 1.f, 0.f) {}
};

// Expects `status` with a message containing `field`, and the output still poisoned.
void expect_rejected(Problem& p, flashattn_status expected, const std::string& field) {
  flashattn_status s = flashattn_fwd(&p.fwd, nullptr, 0, nullptr);
  EXPECT_EQ(s, expected) << "message: " << flashattn_last_error();
  EXPECT_NE(std::string(flashattn_last_error()).find(field), std::string::npos)
      << "message '" << flashattn_last_error() << "' should name '" << field << "'";
  EXPECT_TRUE(p.outputs_untouched()) << "a rejected call wrote its output";
}

TEST(Api, ValidProblemRuns) {
  Problem p;
  ASSERT_EQ(flashattn_fwd(&p.fwd, nullptr, 0, nullptr), FLASHATTN_SUCCESS) << flashattn_last_error();
  for (float x : p.o) ASSERT_TRUE(std::isfinite(x));
  for (float x : p.lse) ASSERT_TRUE(std::isfinite(x));
  EXPECT_STREQ(flashattn_last_error(), "");
  ASSERT_EQ(flashattn_bwd(&p.bwd, nullptr, 0, nullptr), FLASHATTN_SUCCESS) << flashattn_last_error();
  for (float x : p.dk) ASSERT_TRUE(std::isfinite(x));
}

TEST(Api, NullParams) {
  EXPECT_EQ(flashattn_fwd(nullptr, nullptr, 0, nullptr), FLASHATTN_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(flashattn_last_error()).find("params"), std::string::npos);
  EXPECT_EQ(flashattn_bwd(nullptr, nullptr, 0, nullptr), FLASHATTN_ERROR_INVALID_ARGUMENT);
  size_t bytes = 1;
  EXPECT_EQ(flashattn_fwd_workspace_size(nullptr, &bytes), FLASHATTN_ERROR_INVALID_ARGUMENT);
  Problem p;
  EXPECT_EQ(flashattn_fwd_workspace_size(&p.fwd, nullptr), FLASHATTN_ERROR_INVALID_ARGUMENT);
}

TEST(Api, StructSizeMismatch) {
  Problem p;
  p.fwd.struct_size -= 4;  // neither the current size nor an earlier version's
  expect_rejected(p, FLASHATTN_ERROR_INVALID_ARGUMENT, "struct_size");
  Problem p2;
  p2.fwd.struct_size += 8;
  expect_rejected(p2, FLASHATTN_ERROR_INVALID_ARGUMENT, "struct_size");
}

// A caller built against the header before lse_fp64 passes the smaller struct_size; the library
// must not read past it (the bytes there are poisoned: read, they would be refused).
TEST(Api, StructSizeBeforeLseFp64StillWorks) {
  Problem p;
  p.fwd.struct_size = uint32_t(offsetof(flashattn_fwd_params, lse_fp64));
  p.bwd.struct_size = uint32_t(offsetof(flashattn_bwd_params, lse_fp64));
#if UINTPTR_MAX == UINT64_MAX
  EXPECT_EQ(p.fwd.struct_size, 376u);  // sizeof(flashattn_fwd_params) of the earlier header
  EXPECT_EQ(p.bwd.struct_size, 664u);
#endif
  std::memset(&p.fwd.lse_fp64, 0xA5, sizeof(p.fwd.lse_fp64));
  std::memset(&p.bwd.lse_fp64, 0xA5, sizeof(p.bwd.lse_fp64));
  size_t bytes = 0;
  ASSERT_EQ(flashattn_fwd_workspace_size(&p.fwd, &bytes), FLASHATTN_SUCCESS) << flashattn_last_error();
  ASSERT_EQ(flashattn_fwd(&p.fwd, nullptr, 0, nullptr), FLASHATTN_SUCCESS) << flashattn_last_error();
  for (float x : p.lse) ASSERT_TRUE(std::isfinite(x));
  ASSERT_EQ(flashattn_bwd(&p.bwd, nullptr, 0, nullptr), FLASHATTN_SUCCESS) << flashattn_last_error();
  for (float x : p.dq) ASSERT_TRUE(std::isfinite(x));
}

TEST(Api, NullPointers) {
  const char* names[] = {"q.data", "k.data", "v.data", "out.data"};
  for (int which = 0; which < 4; ++which) {
    Problem p;
    flashattn_tensor* t[] = {&p.fwd.q, &p.fwd.k, &p.fwd.v, &p.fwd.out};
    t[which]->data = nullptr;
    expect_rejected(p, FLASHATTN_ERROR_INVALID_ARGUMENT, names[which]);
  }
  Problem p;
  p.bwd.lse = nullptr;
  EXPECT_EQ(flashattn_bwd(&p.bwd, nullptr, 0, nullptr), FLASHATTN_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(flashattn_last_error()).find("lse"), std::string::npos);
  Problem p2;
  p2.bwd.dk.data = nullptr;
  EXPECT_EQ(flashattn_bwd(&p2.bwd, nullptr, 0, nullptr), FLASHATTN_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(flashattn_last_error()).find("dk.data"), std::string::npos);
}

TEST(Api, UnsupportedDtype) {
  Problem p;
  p.fwd.dtype = flashattn_dtype(99);
  expect_rejected(p, FLASHATTN_ERROR_INVALID_ARGUMENT, "dtype");
  // FP8 is a real forward dtype now: without its scales the call names the first missing fp8 field
  // (tests/test_fp8_attention.cpp covers the rest), and the backward refuses it by name.
  Problem p2;
  p2.fwd.dtype = FLASHATTN_DTYPE_FP8_E4M3;
  expect_rejected(p2, FLASHATTN_ERROR_INVALID_ARGUMENT, "fp8.out_dtype");
  p2.bwd.dtype = FLASHATTN_DTYPE_FP8_E4M3;
  EXPECT_EQ(flashattn_bwd(&p2.bwd, nullptr, 0, nullptr), FLASHATTN_ERROR_NOT_SUPPORTED);
  EXPECT_NE(std::string(flashattn_last_error()).find("dtype: fp8_e4m3 has no backward"), std::string::npos)
      << flashattn_last_error();
}

TEST(Api, UnsupportedHeaddim) {
  Problem p;
  for (auto* t : {&p.fwd.q, &p.fwd.k, &p.fwd.v, &p.fwd.out}) t->shape[3] = 512;
  expect_rejected(p, FLASHATTN_ERROR_NOT_SUPPORTED, "headdim");
}

TEST(Api, HeadsNotMultiple) {
  Problem p;
  p.fwd.k.shape[2] = 3;
  p.fwd.v.shape[2] = 3;
  expect_rejected(p, FLASHATTN_ERROR_INVALID_ARGUMENT, "nheads_kv");
}

TEST(Api, ShapeMismatch) {
  Problem p;
  p.fwd.v.shape[1] = 6;
  expect_rejected(p, FLASHATTN_ERROR_INVALID_ARGUMENT, "v.shape[1]");
  Problem p2;
  p2.fwd.out.shape[3] = 8;
  expect_rejected(p2, FLASHATTN_ERROR_INVALID_ARGUMENT, "out.shape[3]");
  Problem p3;
  p3.fwd.k.shape[0] = 1;
  p3.fwd.v.shape[0] = 1;
  expect_rejected(p3, FLASHATTN_ERROR_INVALID_ARGUMENT, "k.shape[0]");
}

TEST(Api, NonContiguousLastDim) {
  Problem p;
  p.fwd.k.stride[3] = 2;
  expect_rejected(p, FLASHATTN_ERROR_INVALID_ARGUMENT, "k.stride[3]");
}

TEST(Api, NegativeStride) {
  Problem p;
  p.fwd.q.stride[1] = -16;
  expect_rejected(p, FLASHATTN_ERROR_INVALID_ARGUMENT, "q.stride[1]");
}

TEST(Api, MisalignedPointer) {
  Problem p;
  p.fwd.q.data = reinterpret_cast<char*>(p.q.data()) + 1;
  expect_rejected(p, FLASHATTN_ERROR_INVALID_ARGUMENT, "q.data");
}

TEST(Api, NegativeSeqlen) {
  Problem p;
  p.fwd.q.shape[1] = -1;
  expect_rejected(p, FLASHATTN_ERROR_INVALID_ARGUMENT, "q.shape[1]");
}

TEST(Api, BadWindow) {
  Problem p;
  p.fwd.options.window_left = -5;
  expect_rejected(p, FLASHATTN_ERROR_INVALID_ARGUMENT, "window_left");
  Problem p2;
  p2.fwd.options.window_right = -2;
  expect_rejected(p2, FLASHATTN_ERROR_INVALID_ARGUMENT, "window_right");
  Problem p3;
  p3.fwd.options.causal = 1;
  p3.fwd.options.window_right = 3;
  expect_rejected(p3, FLASHATTN_ERROR_INVALID_ARGUMENT, "window_right");
}

TEST(Api, BadOptions) {
  Problem p;
  p.fwd.options.softmax_scale = -1.f;
  expect_rejected(p, FLASHATTN_ERROR_INVALID_ARGUMENT, "softmax_scale");
  Problem p1;
  p1.fwd.options.softmax_scale = NAN;
  expect_rejected(p1, FLASHATTN_ERROR_INVALID_ARGUMENT, "softmax_scale");
  Problem p2;
  p2.fwd.options.softcap = -1.f;
  expect_rejected(p2, FLASHATTN_ERROR_INVALID_ARGUMENT, "softcap");
  Problem p3;
  p3.fwd.options.causal = 2;
  expect_rejected(p3, FLASHATTN_ERROR_INVALID_ARGUMENT, "causal");
  Problem p4;
  p4.fwd.options.backend = flashattn_backend(42);
  expect_rejected(p4, FLASHATTN_ERROR_INVALID_ARGUMENT, "backend");
}

// dropout_p outside [0, 1) is refused by name (tests/test_dropout.cpp covers dropout itself).
TEST(Api, DropoutPOutOfRange) {
  for (float bad : {1.5f, 1.0f, -0.1f}) {
    Problem p;
    p.fwd.options.dropout_p = bad;
    expect_rejected(p, FLASHATTN_ERROR_INVALID_ARGUMENT, "dropout_p");
  }
}

TEST(Api, HostBackendWithDeviceIndex) {
  Problem p;
  p.fwd.options.backend = FLASHATTN_BACKEND_CPU;
  p.fwd.options.device = 0;
  expect_rejected(p, FLASHATTN_ERROR_INVALID_ARGUMENT, "options.device");
}

TEST(Api, DeviceBackendWithHostTensors) {
  Problem p;
  p.fwd.options.backend = FLASHATTN_BACKEND_SM80;
  p.fwd.options.device = -1;
  expect_rejected(p, FLASHATTN_ERROR_INVALID_ARGUMENT, "options.device");
}

TEST(Api, NoDeviceOfRequiredArch) {
  // Host fp32 tensors asked to run on a device: without a GPU this is NO_DEVICE; with one,
  // fp32 is refused by the device paths (or host memory is refused) — never a crash.
  Problem p;
  p.fwd.options.device = 0;
  p.fwd.dtype = FLASHATTN_DTYPE_BF16;
  flashattn_status s = flashattn_fwd(&p.fwd, nullptr, 0, nullptr);
  EXPECT_NE(s, FLASHATTN_SUCCESS);
  EXPECT_TRUE(p.outputs_untouched());
  flashattn_device_info info;
  flashattn_status cs = flashattn_device_capability(0, &info);
  if (cs != FLASHATTN_SUCCESS) {
    EXPECT_EQ(s, FLASHATTN_ERROR_NO_DEVICE) << flashattn_last_error();
    EXPECT_EQ(cs, FLASHATTN_ERROR_NO_DEVICE);
  }
  EXPECT_EQ(flashattn_device_capability(1000, &info), FLASHATTN_ERROR_NO_DEVICE);
}

TEST(Api, VarlenBadCuSeqlens) {
  // Two sequences packed: q rows 0..5, k rows 0..7.
  Problem p;
  std::vector<float> q(size_t(5) * p.hq * p.d, 0.3f), o(q.size(), NAN), k(size_t(7) * p.hk * p.d, 0.1f);
  std::vector<float> lse(size_t(p.hq) * 5, NAN);
  p.fwd.q = flashattn::contiguous_tensor(q.data(), 1, 5, p.hq, p.d);
  p.fwd.out = flashattn::contiguous_tensor(o.data(), 1, 5, p.hq, p.d);
  p.fwd.k = flashattn::contiguous_tensor(k.data(), 1, 7, p.hk, p.d);
  p.fwd.v = p.fwd.k;
  p.fwd.lse = lse.data();
  int32_t cu_q[3] = {0, 2, 5}, cu_k[3] = {0, 4, 7};
  p.fwd.varlen = flashattn_varlen{cu_q, cu_k, 2, 3, 4};
  ASSERT_EQ(flashattn_fwd(&p.fwd, nullptr, 0, nullptr), FLASHATTN_SUCCESS) << flashattn_last_error();

  auto rejected = [&](const char* field) {
    EXPECT_EQ(flashattn_fwd(&p.fwd, nullptr, 0, nullptr), FLASHATTN_ERROR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(flashattn_last_error()).find(field), std::string::npos) << flashattn_last_error();
  };
  int32_t not_monotone[3] = {0, 4, 3};
  p.fwd.varlen.cu_seqlens_k = not_monotone;
  rejected("cu_seqlens_k");
  p.fwd.varlen.cu_seqlens_k = cu_k;
  int32_t too_long[3] = {0, 2, 9};
  p.fwd.varlen.cu_seqlens_q = too_long;
  rejected("cu_seqlens_q");
  p.fwd.varlen.cu_seqlens_q = cu_q;
  p.fwd.varlen.max_seqlen_q = 2;  // sequence 1 has 3 rows
  rejected("max_seqlen_q");
  p.fwd.varlen.max_seqlen_q = 3;
  p.fwd.varlen.cu_seqlens_k = nullptr;
  rejected("cu_seqlens_k");
  p.fwd.varlen.cu_seqlens_k = cu_k;
  p.fwd.varlen.batch = 0;
  rejected("varlen.batch");
}

TEST(Api, WorkspaceTooSmall) {
  Problem p;
  size_t bytes = 0;
  ASSERT_EQ(flashattn_bwd_workspace_size(&p.bwd, &bytes), FLASHATTN_SUCCESS);
  // Host paths need no caller workspace; a too-small one is only an error when needed.
  if (bytes > 0) {
    std::vector<char> ws(bytes - 1);
    EXPECT_EQ(flashattn_bwd(&p.bwd, ws.data(), ws.size(), nullptr), FLASHATTN_ERROR_WORKSPACE);
    EXPECT_NE(std::string(flashattn_last_error()).find("workspace"), std::string::npos);
  }
}

TEST(Api, EmptyProblems) {
  // No keys: every row is empty, O = 0 and LSE = -inf.
  Problem p;
  p.fwd.k.shape[1] = 0;
  p.fwd.v.shape[1] = 0;
  ASSERT_EQ(flashattn_fwd(&p.fwd, nullptr, 0, nullptr), FLASHATTN_SUCCESS) << flashattn_last_error();
  for (float x : p.o) EXPECT_EQ(x, 0.f);
  for (float x : p.lse) EXPECT_TRUE(std::isinf(x) && x < 0);
  // No queries: dK = dV = 0.
  Problem p2;
  for (auto* t : {&p2.bwd.q, &p2.bwd.out, &p2.bwd.dout, &p2.bwd.dq}) t->shape[1] = 0;
  ASSERT_EQ(flashattn_bwd(&p2.bwd, nullptr, 0, nullptr), FLASHATTN_SUCCESS) << flashattn_last_error();
  for (float x : p2.dk) EXPECT_EQ(x, 0.f);
  for (float x : p2.dv) EXPECT_EQ(x, 0.f);
}

TEST(Api, ExplicitBackendNotCompiledOrWrongPlace) {
  Problem p;
  p.fwd.options.backend = FLASHATTN_BACKEND_SM90;
  p.fwd.options.device = 0;
  flashattn_status s = flashattn_fwd(&p.fwd, nullptr, 0, nullptr);
  EXPECT_NE(s, FLASHATTN_SUCCESS);
  EXPECT_TRUE(p.outputs_untouched());
}

// ---- lse_fp64: the exact LSE of fp64 problems ------------------------------------------------

// A small fp64 problem (GQA, causal with sq < sk so no row is empty) with the LSE in fp64.
// headdim 16: the default scale 1/4 is exact (options.softmax_scale is a float).
struct Fp64Problem : HostProblem<double> {
  Fp64Problem() : HostProblem<double>(9, 1.7, 0.1, 1.3, 0.2) {
    fwd.options.causal = 1;
    bwd.options = fwd.options;
  }
  // LSE[b, h, i] straight from the header's definition, in long double.
  long double expected_lse(int bi, int h, int i) const {
    const int kvh = h / (hq / hk);
    const int last = i + (sk - sq);  // causal, bottom-right aligned
    std::vector<long double> s;
    long double m = -INFINITY;
    for (int j = 0; j <= last; ++j) {
      long double dot = 0;
      for (int c = 0; c < d; ++c)
        dot += (long double)q[((size_t(bi) * sq + i) * hq + h) * d + c] *
               (long double)k[((size_t(bi) * sk + j) * hk + kvh) * d + c];
      s.push_back(dot * 0.25L);
      m = std::max(m, s.back());
    }
    long double l = 0;
    for (long double x : s) l += std::exp(x - m);
    return m + std::log(l);
  }
};

TEST(LseFp64, MatchesTheDefinitionBeyondFp32Resolution) {
  for (flashattn_backend backend : {FLASHATTN_BACKEND_AUTO, FLASHATTN_BACKEND_REFERENCE}) {
    Fp64Problem p;
    p.fwd.options.backend = backend;
    ASSERT_EQ(flashattn_fwd(&p.fwd, nullptr, 0, nullptr), FLASHATTN_SUCCESS) << flashattn_last_error();
    double worst = 0, worst_if_float = 0;
    for (int bi = 0; bi < p.b; ++bi)
      for (int h = 0; h < p.hq; ++h)
        for (int i = 0; i < p.sq; ++i) {
          const long double want = p.expected_lse(bi, h, i);
          const double got = p.lse[(size_t(bi) * p.hq + h) * p.sq + i];
          const double scale = std::max(1.0L, std::fabs(want));
          worst = std::max(worst, double(std::fabs(got - want) / scale));
          worst_if_float = std::max(worst_if_float, double(std::fabs(double(float(want)) - want) / scale));
        }
    EXPECT_LT(worst, 1e-14) << "lse_fp64 is not the fp64 LSE (backend " << flashattn_backend_name(backend) << ")";
    // The tolerance is far below fp32's resolution: an LSE rounded through float would fail it.
    EXPECT_GT(worst_if_float, 1e-10);
  }
}

TEST(LseFp64, SameAsFp32LseAndBackwardReadsIt) {
  Fp64Problem p;
  ASSERT_EQ(flashattn_fwd(&p.fwd, nullptr, 0, nullptr), FLASHATTN_SUCCESS) << flashattn_last_error();
  // The fp32 LSE of the same call is the fp64 one rounded.
  Fp64Problem p32;
  std::vector<float> lse32(p32.lse.size(), NAN);
  p32.fwd.lse_fp64 = nullptr;
  p32.fwd.lse = lse32.data();
  ASSERT_EQ(flashattn_fwd(&p32.fwd, nullptr, 0, nullptr), FLASHATTN_SUCCESS) << flashattn_last_error();
  for (size_t i = 0; i < lse32.size(); ++i) EXPECT_EQ(lse32[i], float(p.lse[i])) << i;
  // The backward takes the fp64 LSE in place of lse: P from the given LSE and D from the given O
  // agree with the recomputation (fp32 lse given) to fp64 rounding.
  ASSERT_EQ(flashattn_bwd(&p.bwd, nullptr, 0, nullptr), FLASHATTN_SUCCESS) << flashattn_last_error();
  p32.bwd.lse_fp64 = nullptr;
  p32.bwd.lse = lse32.data();
  ASSERT_EQ(flashattn_bwd(&p32.bwd, nullptr, 0, nullptr), FLASHATTN_SUCCESS) << flashattn_last_error();
  auto expect_near = [](const std::vector<double>& a, const std::vector<double>& b, double scale, const char* what) {
    ASSERT_EQ(a.size(), b.size());
    for (size_t i = 0; i < a.size(); ++i) ASSERT_NEAR(a[i], scale * b[i], 1e-12 * (1 + std::fabs(b[i]))) << what << i;
  };
  expect_near(p.dq, p32.dq, 1.0, "dq ");
  expect_near(p.dk, p32.dk, 1.0, "dk ");
  expect_near(p.dv, p32.dv, 1.0, "dv ");
  // It is the given LSE that is used (as ring attention needs for one key block at a time):
  // LSE + ln 2 halves every P, so dV halves.
  Fp64Problem ph;
  ASSERT_EQ(flashattn_fwd(&ph.fwd, nullptr, 0, nullptr), FLASHATTN_SUCCESS) << flashattn_last_error();
  for (double& x : ph.lse) x += std::log(2.0);
  ASSERT_EQ(flashattn_bwd(&ph.bwd, nullptr, 0, nullptr), FLASHATTN_SUCCESS) << flashattn_last_error();
  expect_near(ph.dv, p.dv, 0.5, "dv with LSE + ln 2 ");
  // Neither LSE given: the backward names lse.
  p.bwd.lse_fp64 = nullptr;
  EXPECT_EQ(flashattn_bwd(&p.bwd, nullptr, 0, nullptr), FLASHATTN_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(flashattn_last_error()).find("lse"), std::string::npos);
}

TEST(LseFp64, NoKeysGiveNegInf) {
  Fp64Problem p;
  p.fwd.options.causal = 0;
  p.fwd.k.shape[1] = 0;
  p.fwd.v.shape[1] = 0;
  ASSERT_EQ(flashattn_fwd(&p.fwd, nullptr, 0, nullptr), FLASHATTN_SUCCESS) << flashattn_last_error();
  for (double x : p.lse) EXPECT_TRUE(std::isinf(x) && x < 0);
}

void expect_lse_fp64_refused(flashattn_status got, flashattn_status expected, const std::string& also = "") {
  EXPECT_EQ(got, expected) << flashattn_last_error();
  const std::string msg = flashattn_last_error();
  EXPECT_NE(msg.find("lse_fp64"), std::string::npos) << "message '" << msg << "' should name lse_fp64";
  if (!also.empty()) EXPECT_NE(msg.find(also), std::string::npos) << "message '" << msg << "' should name " << also;
}

TEST(LseFp64, RefusalsNameTheField) {
  {  // not an fp64 problem
    Problem p;
    std::vector<double> l(p.lse.size());
    p.fwd.lse = nullptr;
    p.fwd.lse_fp64 = l.data();
    expect_lse_fp64_refused(flashattn_fwd(&p.fwd, nullptr, 0, nullptr), FLASHATTN_ERROR_INVALID_ARGUMENT, "fp32");
    EXPECT_TRUE(p.outputs_untouched());
    p.bwd.lse = nullptr;
    p.bwd.lse_fp64 = l.data();
    expect_lse_fp64_refused(flashattn_bwd(&p.bwd, nullptr, 0, nullptr), FLASHATTN_ERROR_INVALID_ARGUMENT, "fp32");
  }
  {  // both LSE buffers
    Fp64Problem p;
    std::vector<float> l(p.lse.size());
    p.fwd.lse = l.data();
    expect_lse_fp64_refused(flashattn_fwd(&p.fwd, nullptr, 0, nullptr), FLASHATTN_ERROR_INVALID_ARGUMENT);
    p.bwd.lse = l.data();
    expect_lse_fp64_refused(flashattn_bwd(&p.bwd, nullptr, 0, nullptr), FLASHATTN_ERROR_INVALID_ARGUMENT);
  }
  {  // the tiled cpu backend keeps an fp32 LSE
    Fp64Problem p;
    p.fwd.options.backend = p.bwd.options.backend = FLASHATTN_BACKEND_CPU;
    size_t bytes = 0;
    expect_lse_fp64_refused(flashattn_fwd_workspace_size(&p.fwd, &bytes), FLASHATTN_ERROR_NOT_SUPPORTED, "cpu");
    expect_lse_fp64_refused(flashattn_fwd(&p.fwd, nullptr, 0, nullptr), FLASHATTN_ERROR_NOT_SUPPORTED, "cpu");
    for (double x : p.lse) EXPECT_TRUE(std::isnan(x)) << "a refused call wrote the LSE";
    expect_lse_fp64_refused(flashattn_bwd(&p.bwd, nullptr, 0, nullptr), FLASHATTN_ERROR_NOT_SUPPORTED, "cpu");
  }
  {  // misaligned
    Fp64Problem p;
    std::vector<double> l(p.lse.size() + 1);
    p.fwd.lse_fp64 = reinterpret_cast<double*>(reinterpret_cast<char*>(l.data()) + 4);
    expect_lse_fp64_refused(flashattn_fwd(&p.fwd, nullptr, 0, nullptr), FLASHATTN_ERROR_INVALID_ARGUMENT, "aligned");
  }
}

TEST(Api, Introspection) {
  EXPECT_STREQ(flashattn_version(), "0.1.0");
  uint32_t mask = flashattn_compiled_backends();
  EXPECT_TRUE(mask & (1u << FLASHATTN_BACKEND_CPU));
  EXPECT_TRUE(mask & (1u << FLASHATTN_BACKEND_REFERENCE));
  EXPECT_STREQ(flashattn_backend_name(FLASHATTN_BACKEND_SM90), "sm90");
  EXPECT_STREQ(flashattn_status_string(FLASHATTN_ERROR_NOT_SUPPORTED), "not supported");
}

TEST(Api, CppWrapperThrowsWithMessage) {
  Problem p;
  p.fwd.q.stride[3] = 4;
  try {
    flashattn::forward(p.fwd);
    FAIL() << "expected flashattn::Error";
  } catch (const flashattn::Error& e) {
    EXPECT_EQ(e.status(), FLASHATTN_ERROR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(e.what()).find("q.stride[3]"), std::string::npos);
  }
}

}  // namespace
