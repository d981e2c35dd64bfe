// flashattn_fp8_quantize on CUDA tensors (src/api/fp8_quantize_cuda.cu) against the host quantizer
// on the same input: fp16/bf16/fp32, ragged seqlens (1, 7, 113, 799), block sizes 1, 64, 128 and
// >= seqlen, the Hadamard transform on and off, strided input and output (padding poisoned and
// checked untouched), outliers, an all-zero head and a NaN and an inf (NaN codes match up to
// their sign, which IEEE leaves unspecified: the GPU makes +NaN, x86 -NaN for inf - inf).
// Without the transform the device must give the host's bits exactly (the same fp32 values, IEEE
// division, the same integer E4M3 encoder). With it the host transforms in fp64 and rounds once,
// the device in fp32 (each butterfly add rounds): x' may differ by a few fp32 ulps, so a scale may
// differ in its last bits (relative 1e-6 allowed) and a code by one E4M3 step where x' / scale
// sits that close to a rounding boundary. E4M3 steps are >= 2^-4 of the value while the fp32 error
// is ~2^-20 of the row's largest term, so such codes are rare: fewer than 0.1% are allowed (over
// all cases), and none may differ by more than one step.
// Skips without a CUDA device.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "common/half_convert.h"
#include "flashattn/flashattn.h"
#include "gpu_test_env.h"
#include "test_util.h"

namespace flashattn::test {
namespace {

bool have_gpu(std::string* why) { return cuda_path_available(why); }

constexpr uint8_t kPoison = 0x5A;

size_t elem_size(flashattn_dtype t) { return t == FLASHATTN_DTYPE_FP32 ? 4 : 2; }

// A strided [b, s, h, d] buffer of `esize`-byte elements (padding after each head, row and batch;
// pad < 0: contiguous, the layout the CUDA quantizer's vectorized path takes).
struct Strided {
  int64_t shape[4], stride[4];
  size_t esize;
  std::vector<uint8_t> bytes;
  Strided(int64_t b, int64_t s, int64_t h, int64_t d, size_t es, int pad) : esize(es) {
    const int64_t sh[4] = {b, s, h, d};
    std::memcpy(shape, sh, sizeof(shape));
    stride[3] = 1;
    stride[2] = d + (pad < 0 ? 0 : pad);
    stride[1] = h * stride[2] + (pad < 0 ? 0 : 2 * pad + 1);
    stride[0] = s * stride[1] + (pad < 0 ? 0 : 3);
    bytes.assign(size_t(std::max<int64_t>(1, b * stride[0])) * es, kPoison);
  }
  int64_t index(int64_t b, int64_t s, int64_t h, int64_t c) const {
    return b * stride[0] + s * stride[1] + h * stride[2] + c;
  }
  flashattn_tensor view(void* data) const {
    flashattn_tensor t;
    t.data = data;
    std::memcpy(t.shape, shape, sizeof(shape));
    std::memcpy(t.stride, stride, sizeof(stride));
    return t;
  }
};

void store(Strided& x, flashattn_dtype t, int64_t i, float v) {
  uint8_t* p = x.bytes.data() + size_t(i) * x.esize;
  if (t == FLASHATTN_DTYPE_FP32) {
    std::memcpy(p, &v, 4);
  } else {
    const uint16_t u = t == FLASHATTN_DTYPE_FP16 ? float_to_half(v) : float_to_bf16(v);
    std::memcpy(p, &u, 2);
  }
}

// x [b, s, h, d]: normal values, heads of different magnitudes (2^-3, 2^0, 2^3, ...), ~0.2% outliers (x50-550);
// padded strides unless dense.
Strided random_input(flashattn_dtype dtype, int64_t b, int64_t s, int64_t h, int64_t d, bool dense, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.f, 1.f);
  std::uniform_real_distribution<float> unif(0.f, 1.f);
  Strided x(b, s, h, d, elem_size(dtype), dense ? -1 : 8);
  for (int64_t ib = 0; ib < b; ++ib)
    for (int64_t is = 0; is < s; ++is)
      for (int64_t ih = 0; ih < h; ++ih) {
        const float mag = std::ldexp(1.f, int(ih) * 3 - 3);
        for (int64_t c = 0; c < d; ++c) {
          float v = normal(rng) * mag;
          if (unif(rng) < 2e-3f) v *= 50.f + 500.f * unif(rng);
          store(x, dtype, x.index(ib, is, ih, c), v);
        }
      }
  return x;
}

// Signed position of a code on the E4M3 number line (+-0 both 0; codes are monotone in magnitude).
int position(uint8_t code) { return (code & 0x80) ? -int(code & 0x7F) : int(code & 0x7F); }
bool is_nan_code(uint8_t code) { return (code & 0x7F) == 0x7F; }

struct Totals {
  int64_t elems = 0, off_by_one = 0;
};

// The device's scales and bytes (codes and padding, over the whole buffer) against the host's: bit for bit without
// the transform; with it a scale within 1e-6 relative and a code within one E4M3 step (counted into *tot).
void expect_device_matches_host(const std::vector<float>& sc_dev, const std::vector<float>& sc_host,
                                const std::vector<uint8_t>& q_dev, const std::vector<uint8_t>& q_host, bool hadamard,
                                int64_t elems, Totals* tot) {
  ASSERT_EQ(sc_dev.size(), sc_host.size());
  ASSERT_EQ(q_dev.size(), q_host.size());
  for (size_t i = 0; i < sc_dev.size(); ++i) {
    if (hadamard) {
      ASSERT_LE(std::fabs(sc_dev[i] - sc_host[i]), 1e-6f * sc_host[i]) << "scale " << i << ": device " << sc_dev[i]
                                                                       << ", host " << sc_host[i];
    } else {
      ASSERT_EQ(sc_dev[i], sc_host[i]) << "scale " << i;
    }
  }
  int64_t off = 0;
  for (size_t i = 0; i < q_dev.size(); ++i) {
    const uint8_t a = q_dev[i], e = q_host[i];
    if (a == e || (is_nan_code(a) && is_nan_code(e))) continue;  // a NaN's sign is unspecified (GPUs
                                                                    // make canonical +NaN)
    ASSERT_TRUE(hadamard) << "byte " << i << ": device " << int(a) << ", host " << int(e)
                          << " (no transform: must be equal)";
    ASSERT_FALSE(is_nan_code(a) || is_nan_code(e)) << "byte " << i << ": device " << int(a) << ", host " << int(e);
    ASSERT_LE(std::abs(position(a) - position(e)), 1) << "byte " << i << ": device " << int(a) << ", host " << int(e);
    ++off;
  }
  tot->elems += elems;
  tot->off_by_one += off;
}

void run_case(flashattn_dtype dtype, int64_t s, int64_t d, int block, bool hadamard, uint64_t seed, Totals* tot,
              bool dense = false) {
  const int64_t b = 2, h = 3;
  const std::string what = std::string(dtype == FLASHATTN_DTYPE_FP16 ? "fp16" : dtype == FLASHATTN_DTYPE_BF16 ? "bf16" : "fp32") +
                           " s=" + std::to_string(s) + " d=" + std::to_string(d) + " block=" + std::to_string(block) +
                           " hadamard=" + std::to_string(hadamard) + " seed=" + std::to_string(seed) +
                           (dense ? " dense" : " strided");
  SCOPED_TRACE(what);
  Strided x = random_input(dtype, b, s, h, d, dense, seed);
  for (int64_t is = 0; is < s; ++is)  // an all-zero head: scale 1
    for (int64_t c = 0; c < d; ++c) store(x, dtype, x.index(0, is, 0, c), 0.f);
  if (s > 5) {  // not finite: left out of the amax (a NaN row stays NaN through the transform)
    store(x, dtype, x.index(1, 3, 1, d / 2), std::numeric_limits<float>::quiet_NaN());
    store(x, dtype, x.index(1, 5, 2, 1), std::numeric_limits<float>::infinity());
  }
  Strided q_host(b, s, h, d, 1, dense ? -1 : 5), q_dev(b, s, h, d, 1, dense ? -1 : 5);
  const int64_t nblocks = (s + block - 1) / block;
  const size_t nscales = size_t(b * h * nblocks);
  std::vector<float> sc_host(nscales, -1.f), sc_dev(nscales, -1.f);

  // Host quantizer.
  flashattn_fp8_quantize_params p = flashattn_fp8_quantize_params_init();
  p.dtype = dtype;
  p.x = x.view(x.bytes.data());
  p.x_fp8 = q_host.view(q_host.bytes.data());
  p.scales = sc_host.data();
  p.block_size = block;
  p.hadamard = hadamard;
  p.hadamard_seed = seed ^ 0x9E3779B97F4A7C15ull;
  ASSERT_EQ(flashattn_fp8_quantize(&p, nullptr), FLASHATTN_SUCCESS) << flashattn_last_error();

  // Device quantizer on copies, on a non-default stream.
  void *dx = nullptr, *dq = nullptr, *ds = nullptr;
  ASSERT_EQ(cudaMalloc(&dx, x.bytes.size()), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&dq, q_dev.bytes.size()), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&ds, nscales * 4), cudaSuccess);
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(dx, x.bytes.data(), x.bytes.size(), cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(dq, q_dev.bytes.data(), q_dev.bytes.size(), cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(ds, sc_dev.data(), nscales * 4, cudaMemcpyHostToDevice), cudaSuccess);
  p.x.data = dx;
  p.x_fp8.data = dq;
  p.scales = static_cast<float*>(ds);
  p.options.device = 0;
  ASSERT_EQ(flashattn_fp8_quantize(&p, stream), FLASHATTN_SUCCESS) << flashattn_last_error();
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess) << cudaGetErrorString(cudaGetLastError());
  ASSERT_EQ(cudaMemcpy(q_dev.bytes.data(), dq, q_dev.bytes.size(), cudaMemcpyDeviceToHost), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(sc_dev.data(), ds, nscales * 4, cudaMemcpyDeviceToHost), cudaSuccess);
  cudaStreamDestroy(stream);
  cudaFree(dx);
  cudaFree(dq);
  cudaFree(ds);

  expect_device_matches_host(sc_dev, sc_host, q_dev.bytes, q_host.bytes, hadamard, b * s * h * d, tot);
}

TEST(GpuFp8Quantize, MatchesHost) {
  std::string why;
  if (!have_gpu(&why)) GTEST_SKIP() << why;
  const uint64_t seed0 = fresh_seed();
  Totals tot_had;
  int n = 0;
  for (flashattn_dtype dtype : {FLASHATTN_DTYPE_FP16, FLASHATTN_DTYPE_BF16, FLASHATTN_DTYPE_FP32})
    for (int64_t s : {1, 7, 113, 799})
      for (int block : {1, 64, 128, -1})
        for (bool had : {false, true}) {
          // n / 2: had alternates, so n % 4 would give each of them only two of the four dims.
          const int64_t d_had[] = {16, 64, 128, 256}, d_plain[] = {16, 40, 128, 320};  // plain: any headdim
          const int64_t d = had ? d_had[(n / 2) % 4] : d_plain[(n / 2) % 4];
          Totals tot;
          run_case(dtype, s, d, block > 0 ? block : int(s) + 3, had, seed0 + uint64_t(n), had ? &tot_had : &tot);
          if (HasFatalFailure()) return;
          // Contiguous 16-bit tensors, d % 8 == 0: the register kernel (a block of <= 16 rows per
          // thread, with or without the transform) or else, without it, the vectorized one.
          if (dtype != FLASHATTN_DTYPE_FP32 && d % 8 == 0)
            run_case(dtype, s, d, block > 0 ? block : int(s) + 3, had, seed0 + uint64_t(n), had ? &tot_had : &tot, true);
          ++n;
          if (HasFatalFailure()) return;
        }
  RecordProperty("hadamard_off_by_one", std::to_string(tot_had.off_by_one) + " / " + std::to_string(tot_had.elems));
  EXPECT_LT(double(tot_had.off_by_one), 1e-3 * double(tot_had.elems))
      << tot_had.off_by_one << " of " << tot_had.elems << " codes differ by one step with the transform";
}

// x_fp8_layout keys_permuted16 on the GPU gives the host's bytes over the whole output buffer (poisoned
// first: the codes where the layout puts them, 0 at the keyless positions up to L, the gaps between heads
// untouched) and the host's scales. The host's bytes are checked against flashattn_fp8_v_keys_permuted16 in
// tests/test_fp8.cpp. Cases: the register kernel's staged transpose (16-bit contiguous x, a 16-byte aligned
// output, blocks a multiple of 16 or the whole sequence: 8 and 16 rows per thread, head dims 40 (no swizzle),
// 64, 128, 256, ragged last groups, rows longer than needed), and the per-byte kernel for the rest (a block
// of 7, fp32 x, strided x, an unaligned head stride, the transform: one-step code differences allowed there,
// as in MatchesHost).
void run_permuted_case(flashattn_dtype dtype, int64_t s, int64_t d, int block, bool hadamard, bool dense, int extra,
                       int head_gap, uint64_t seed, Totals* tot) {
  const int64_t b = 2, h = 3;
  SCOPED_TRACE(std::string(dtype == FLASHATTN_DTYPE_FP32 ? "fp32" : dtype == FLASHATTN_DTYPE_FP16 ? "fp16" : "bf16") +
               " s=" + std::to_string(s) + " d=" + std::to_string(d) + " block=" + std::to_string(block) +
               " hadamard=" + std::to_string(hadamard) + (dense ? " dense" : " strided") + " extra=" +
               std::to_string(extra) + " head_gap=" + std::to_string(head_gap));
  Strided x = random_input(dtype, b, s, h, d, dense, seed);
  const int64_t L = (s + 15) / 16 * 16 + extra, head = d * L + head_gap;
  const int64_t stride[4] = {h * head, 1, head, L};
  std::vector<uint8_t> q_host(size_t(b * h * head), kPoison), q_dev = q_host;
  const int64_t nblocks = (s + block - 1) / block;
  const size_t nscales = size_t(b * h * nblocks);
  std::vector<float> sc_host(nscales, -1.f), sc_dev(nscales, -1.f);
  flashattn_fp8_quantize_params p = flashattn_fp8_quantize_params_init();
  p.dtype = dtype;
  p.x = x.view(x.bytes.data());
  p.x_fp8 = x.view(q_host.data());
  std::memcpy(p.x_fp8.stride, stride, sizeof(stride));
  p.x_fp8_layout = FLASHATTN_FP8_V_KEYS_PERMUTED16;
  p.scales = sc_host.data();
  p.block_size = block;
  p.hadamard = hadamard;
  p.hadamard_seed = seed;
  ASSERT_EQ(flashattn_fp8_quantize(&p, nullptr), FLASHATTN_SUCCESS) << flashattn_last_error();

  void *dx = nullptr, *dq = nullptr, *ds = nullptr;
  ASSERT_EQ(cudaMalloc(&dx, x.bytes.size()), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&dq, q_dev.size()), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&ds, nscales * 4), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(dx, x.bytes.data(), x.bytes.size(), cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(dq, q_dev.data(), q_dev.size(), cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(ds, sc_dev.data(), nscales * 4, cudaMemcpyHostToDevice), cudaSuccess);
  p.x.data = dx;
  p.x_fp8.data = dq;
  p.scales = static_cast<float*>(ds);
  p.options.device = 0;
  ASSERT_EQ(flashattn_fp8_quantize(&p, nullptr), FLASHATTN_SUCCESS) << flashattn_last_error();
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess) << cudaGetErrorString(cudaGetLastError());
  ASSERT_EQ(cudaMemcpy(q_dev.data(), dq, q_dev.size(), cudaMemcpyDeviceToHost), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(sc_dev.data(), ds, nscales * 4, cudaMemcpyDeviceToHost), cudaSuccess);
  cudaFree(dx);
  cudaFree(dq);
  cudaFree(ds);
  expect_device_matches_host(sc_dev, sc_host, q_dev, q_host, hadamard, b * s * h * d, tot);
}

TEST(GpuFp8Quantize, KeysPermuted16MatchesHost) {
  std::string why;
  if (!have_gpu(&why)) GTEST_SKIP() << why;
  const uint64_t seed0 = fresh_seed();
  struct Case {
    flashattn_dtype dtype;
    int64_t s, d;
    int block;
    bool hadamard, dense;
    int extra, head_gap;
  };
  const flashattn_dtype bf = FLASHATTN_DTYPE_BF16, fp = FLASHATTN_DTYPE_FP16, f32 = FLASHATTN_DTYPE_FP32;
  const Case cases[] = {
      {bf, 4097, 128, 128, false, true, 0, 0},   // register kernel, 8 rows per thread, one key in the last group
      {fp, 799, 64, 128, false, true, 0, 0},     // 4 rows per thread
      {bf, 113, 256, 64, false, true, 32, 16},   // 8 rows per thread at 256 columns, rows past the minimum
      {bf, 7, 128, 128, false, true, 48, 0},     // one partial group, then 3 keyless groups
      {bf, 1000, 128, 256, false, true, 0, 0},   // 16 rows per thread
      {fp, 300, 40, 16, false, true, 0, 0},      // 5 pieces a row: no swizzle; 16-key blocks
      {bf, 1, 64, 128, false, true, 0, 0},
      {bf, 113, 128, 7, false, true, 0, 0},      // blocks straddle the groups: the per-byte kernel
      {f32, 113, 64, 128, false, true, 0, 0},    // fp32 x
      {bf, 799, 128, 128, false, false, 0, 0},   // strided x
      {bf, 200, 64, 128, false, true, 0, 8},     // head stride not a multiple of 16
      {bf, 113, 64, 128, true, true, 16, 0},     // the transform (per-byte kernel)
  };
  Totals tot_had, tot;
  int n = 0;
  for (const Case& c : cases) {
    run_permuted_case(c.dtype, c.s, c.d, c.block, c.hadamard, c.dense, c.extra, c.head_gap, seed0 + uint64_t(n++),
                      c.hadamard ? &tot_had : &tot);
    if (HasFatalFailure()) return;
  }
  EXPECT_EQ(tot.off_by_one, 0);
  EXPECT_LT(double(tot_had.off_by_one), 1e-3 * double(tot_had.elems));
}

// The transform's blocks that need more than 8 rows a thread at 256 threads (headdim 256 with 128-row blocks, 128 with
// 256-row ones: the 512-thread kernel, 8 rows a thread), ragged last blocks and whole-sequence blocks, beside
// MatchesHost's grid (which reaches that kernel only at headdim 256 with one block per sequence).
TEST(GpuFp8Quantize, WideTransformBlocksMatchHost) {
  std::string why;
  if (!have_gpu(&why)) GTEST_SKIP() << why;
  const uint64_t seed0 = fresh_seed();
  Totals tot;
  int n = 0;
  struct Case {
    int64_t s, d;
    int block;
  };
  for (const Case c : {Case{300, 256, 128}, Case{799, 256, 96}, Case{113, 256, 128}, Case{300, 128, 256},
                       Case{799, 128, 200}, Case{250, 128, 250}})
    for (flashattn_dtype dtype : {FLASHATTN_DTYPE_BF16, FLASHATTN_DTYPE_FP16}) {
      run_case(dtype, c.s, c.d, c.block, true, seed0 + uint64_t(n++), &tot, true);
      if (HasFatalFailure()) return;
    }
  RecordProperty("hadamard_off_by_one", std::to_string(tot.off_by_one) + " / " + std::to_string(tot.elems));
  EXPECT_LT(double(tot.off_by_one), 1e-3 * double(tot.elems))
      << tot.off_by_one << " of " << tot.elems << " codes differ by one step with the transform";
}

TEST(GpuFp8Quantize, RefusalsOnDevice) {
  std::string why;
  if (!have_gpu(&why)) GTEST_SKIP() << why;
  const int64_t b = 1, s = 4, h = 1, d = 64;
  void *dx = nullptr, *dq = nullptr, *ds = nullptr;
  ASSERT_EQ(cudaMalloc(&dx, size_t(b * s * h * d) * 8), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&dq, size_t(b * s * h * d)), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&ds, 64), cudaSuccess);
  flashattn_fp8_quantize_params p = flashattn_fp8_quantize_params_init();
  const int64_t shape[4] = {b, s, h, d}, stride[4] = {s * h * d, h * d, d, 1};
  for (flashattn_tensor* t : {&p.x, &p.x_fp8}) {
    std::memcpy(t->shape, shape, sizeof(shape));
    std::memcpy(t->stride, stride, sizeof(stride));
  }
  p.x.data = dx;
  p.x_fp8.data = dq;
  p.scales = static_cast<float*>(ds);
  p.options.device = 0;
  p.dtype = FLASHATTN_DTYPE_BF16;
  EXPECT_EQ(flashattn_fp8_quantize(&p, nullptr), FLASHATTN_SUCCESS) << flashattn_last_error();
  EXPECT_EQ(flashattn_fp8_dequantize(&p, nullptr), FLASHATTN_ERROR_NOT_SUPPORTED);
  EXPECT_EQ(std::string(flashattn_last_error()).rfind("options.device", 0), 0u) << flashattn_last_error();
  p.dtype = FLASHATTN_DTYPE_FP64;
  EXPECT_EQ(flashattn_fp8_quantize(&p, nullptr), FLASHATTN_ERROR_NOT_SUPPORTED);
  EXPECT_EQ(std::string(flashattn_last_error()).rfind("dtype", 0), 0u) << flashattn_last_error();
  // Host memory passed as device memory is refused by name.
  std::vector<uint8_t> host(size_t(b * s * h * d) * 2);
  p.dtype = FLASHATTN_DTYPE_BF16;
  p.x.data = host.data();
  EXPECT_EQ(flashattn_fp8_quantize(&p, nullptr), FLASHATTN_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(std::string(flashattn_last_error()).rfind("x.data", 0), 0u) << flashattn_last_error();
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  cudaFree(dx);
  cudaFree(dq);
  cudaFree(ds);
}


// flashattn_fp8_v_keys_permuted16 on CUDA tensors gives the host's bytes over the whole output
// buffer (keys placed, keyless positions 0, the output poisoned with NaN codes first): ragged key
// counts, row lengths past the minimum, head dims 64/128/256 from contiguous v (16-byte loads), 4 and
// 40 (no multiple of 16: byte loads, a tile's columns past the head dim) and 80/128 from padded v (byte loads); host memory passed as
// device memory is refused by name.
TEST(GpuFp8VPermute, MatchesTheHostBytes) {
  std::string why;
  if (!have_gpu(&why)) GTEST_SKIP() << why;
  std::mt19937 rng(fresh_seed());
  struct Case { int b, s, h, d, pad, extra; };
  const Case cases[] = {{2, 1, 3, 64, -1, 0},  {1, 7, 2, 128, -1, 16}, {2, 113, 3, 80, 1, 0},
                        {1, 799, 4, 256, -1, 48}, {2, 4097, 2, 128, -1, 0}, {1, 200, 5, 128, 2, 32},
                        {3, 33, 2, 40, -1, 0},    {1, 50, 1, 4, -1, 16}};
  for (const Case& c : cases) {
    SCOPED_TRACE("b " + std::to_string(c.b) + " s " + std::to_string(c.s) + " h " + std::to_string(c.h) + " d " +
                 std::to_string(c.d) + " pad " + std::to_string(c.pad) + " extra " + std::to_string(c.extra));
    Strided v(c.b, c.s, c.h, c.d, 1, c.pad);
    for (auto& x : v.bytes) x = uint8_t(rng());
    const int64_t L = (c.s + 15) / 16 * 16 + c.extra;
    const size_t out_bytes = size_t(c.b) * c.h * c.d * L;
    std::vector<uint8_t> host(out_bytes, 0x7F), dev(out_bytes, 0x7F);
    flashattn_fp8_v_permute_params p = flashattn_fp8_v_permute_params_init();
    p.v = v.view(v.bytes.data());
    const int64_t os[4] = {int64_t(c.h) * c.d * L, 1, int64_t(c.d) * L, L};
    p.v_out = p.v;
    std::memcpy(p.v_out.stride, os, sizeof(os));
    p.v_out.data = host.data();
    ASSERT_EQ(flashattn_fp8_v_keys_permuted16(&p, nullptr), FLASHATTN_SUCCESS) << flashattn_last_error();
    void *dv = nullptr, *dout = nullptr;
    ASSERT_EQ(cudaMalloc(&dv, v.bytes.size()), cudaSuccess);
    ASSERT_EQ(cudaMalloc(&dout, out_bytes), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(dv, v.bytes.data(), v.bytes.size(), cudaMemcpyHostToDevice), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(dout, dev.data(), out_bytes, cudaMemcpyHostToDevice), cudaSuccess);
    p.v.data = dv;
    p.v_out.data = dout;
    p.options.device = 0;
    ASSERT_EQ(flashattn_fp8_v_keys_permuted16(&p, nullptr), FLASHATTN_SUCCESS) << flashattn_last_error();
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(dev.data(), dout, out_bytes, cudaMemcpyDeviceToHost), cudaSuccess);
    size_t first_diff = out_bytes;
    for (size_t i = 0; i < out_bytes && first_diff == out_bytes; ++i)
      if (dev[i] != host[i]) first_diff = i;
    EXPECT_EQ(first_diff, out_bytes) << "device byte " << int(dev[first_diff]) << " vs host " << int(host[first_diff]);
    p.v.data = v.bytes.data();  // host memory as device memory
    EXPECT_EQ(flashattn_fp8_v_keys_permuted16(&p, nullptr), FLASHATTN_ERROR_INVALID_ARGUMENT);
    EXPECT_EQ(std::string(flashattn_last_error()).rfind("v.data", 0), 0u) << flashattn_last_error();
    cudaFree(dv);
    cudaFree(dout);
  }
}

}  // namespace
}  // namespace flashattn::test
