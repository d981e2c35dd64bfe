// Bad input through the C ABI: every invalid argument returns a clear status whose message
// names the argument, and nothing is written. Runs on host tensors (CI has no GPU); the
// device-only checks (alignment, device memory) run when a GPU is present.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "flashattn/flashattn.h"
#include "flashattn/flashattn.hpp"

namespace {

// A small valid fp32 host problem; each test breaks one thing.
struct Problem {
  int b = 2, sq = 5, sk = 7, hq = 4, hk = 2, d = 16;
  std::vector<float> q, k, v, o, lse, dout, dq, dk, dv;
  flashattn_fwd_params fwd;
  flashattn_bwd_params bwd;

  Problem() {
    q.assign(size_t(b) * sq * hq * d, 0.25f);
    k.assign(size_t(b) * sk * hk * d, -0.5f);
    v.assign(size_t(b) * sk * hk * d, 1.5f);
    for (size_t i = 0; i < q.size(); ++i) q[i] = std::sin(0.37f * float(i));
    for (size_t i = 0; i < k.size(); ++i) k[i] = std::cos(0.11f * float(i));
    for (size_t i = 0; i < v.size(); ++i) v[i] = std::sin(0.05f * float(i) + 1.f);
    o.assign(q.size(), NAN);
    dout = q;
    dq.assign(q.size(), NAN);
    dk.assign(k.size(), NAN);
    dv.assign(v.size(), NAN);
    lse.assign(size_t(b) * hq * sq, NAN);
    fwd = flashattn_fwd_params_init();
    fwd.dtype = FLASHATTN_DTYPE_FP32;
    fwd.q = flashattn::contiguous_tensor(q.data(), b, sq, hq, d);
    fwd.k = flashattn::contiguous_tensor(k.data(), b, sk, hk, d);
    fwd.v = flashattn::contiguous_tensor(v.data(), b, sk, hk, d);
    fwd.out = flashattn::contiguous_tensor(o.data(), b, sq, hq, d);
    fwd.lse = lse.data();
    bwd = flashattn_bwd_params_init();
    bwd.dtype = FLASHATTN_DTYPE_FP32;
    bwd.q = fwd.q;
    bwd.k = fwd.k;
    bwd.v = fwd.v;
    bwd.out = fwd.out;
    bwd.dout = flashattn::contiguous_tensor(dout.data(), b, sq, hq, d);
    bwd.lse = lse.data();
    bwd.dq = flashattn::contiguous_tensor(dq.data(), b, sq, hq, d);
    bwd.dk = flashattn::contiguous_tensor(dk.data(), b, sk, hk, d);
    bwd.dv = flashattn::contiguous_tensor(dv.data(), b, sk, hk, d);
  }
  bool outputs_untouched() const {
    for (float x : o)
      if (!std::isnan(x)) return false;
    for (float x : lse)
      if (!std::isnan(x)) return false;
    return true;
  }
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
  p.fwd.struct_size -= 8;
  expect_rejected(p, FLASHATTN_ERROR_INVALID_ARGUMENT, "struct_size");
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
  Problem p2;
  p2.fwd.dtype = FLASHATTN_DTYPE_FP8_E4M3;
  expect_rejected(p2, FLASHATTN_ERROR_NOT_SUPPORTED, "dtype");
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

TEST(Api, DropoutNotImplemented) {
  Problem p;
  p.fwd.options.dropout_p = 0.1f;
  expect_rejected(p, FLASHATTN_ERROR_NOT_SUPPORTED, "dropout_p");
  Problem p2;
  p2.fwd.options.dropout_p = 1.5f;
  expect_rejected(p2, FLASHATTN_ERROR_INVALID_ARGUMENT, "dropout_p");
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
