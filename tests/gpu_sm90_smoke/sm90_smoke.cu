// Smoke test of the sm90 forward path: correctness of a handful of shapes against a naive fp32
// CUDA reference, then TFLOP/s of hdim-128 16k bf16 (non-causal, causal) and the ablations.
// Usage: sm90_smoke [--no-perf]. Exit status 0 iff every case passes.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "flashattn/flashattn.h"
#include "flashattn/flashattn_experimental.h"

#define CK(x)                                                                               \
  do {                                                                                      \
    cudaError_t e_ = (x);                                                                   \
    if (e_ != cudaSuccess) {                                                                \
      std::printf("CUDA error %s at %s:%d\n", cudaGetErrorString(e_), __FILE__, __LINE__); \
      std::exit(2);                                                                         \
    }                                                                                       \
  } while (0)

template <class T> __host__ __device__ float to_f(T x);
template <> __host__ __device__ float to_f<__half>(__half x) { return __half2float(x); }
template <> __host__ __device__ float to_f<__nv_bfloat16>(__nv_bfloat16 x) { return __bfloat162float(x); }
template <class T> T from_f(float x);
template <> __half from_f<__half>(float x) { return __float2half_rn(x); }
template <> __nv_bfloat16 from_f<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }

// One CTA per (query row, head, batch). Mask semantics written out from flashattn.h.
template <class T>
__global__ void reference_kernel(const T* q, const T* k, const T* v, float* o, float* lse, const int* cu_q,
                                 const int* cu_k, int sq_fixed, int sk_fixed, int hq, int hkv, int d, float scale,
                                 float softcap, int wl, int wr) {
  extern __shared__ float sc[];
  const int i = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
  int q0 = b * sq_fixed, k0 = b * sk_fixed, sq = sq_fixed, sk = sk_fixed;
  if (cu_q) { q0 = cu_q[b]; k0 = cu_k[b]; sq = cu_q[b + 1] - q0; sk = cu_k[b + 1] - k0; }
  if (i >= sq) return;
  const int hk = h / (hq / hkv);
  const T* qr = q + ((int64_t)(q0 + i) * hq + h) * d;
  const int off = sk - sq;
  float mx = -INFINITY;
  for (int j = threadIdx.x; j < sk; j += blockDim.x) {
    bool ok = (wl < 0 || j >= i + off - wl) && (wr < 0 || j <= i + off + wr);
    float s = -INFINITY;
    if (ok) {
      const T* kr = k + ((int64_t)(k0 + j) * hkv + hk) * d;
      float acc = 0.f;
      for (int t = 0; t < d; ++t) acc += to_f(qr[t]) * to_f(kr[t]);
      s = acc * scale;
      if (softcap > 0.f) s = softcap * tanhf(s / softcap);
    }
    sc[j] = s;
    mx = fmaxf(mx, s);
  }
  __shared__ float red[32];
  for (int w = 16; w; w >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, w));
  if (threadIdx.x % 32 == 0) red[threadIdx.x / 32] = mx;
  __syncthreads();
  mx = -INFINITY;
  for (int w = 0; w < blockDim.x / 32; ++w) mx = fmaxf(mx, red[w]);
  __syncthreads();
  float sum = 0.f;
  for (int j = threadIdx.x; j < sk; j += blockDim.x) {
    float p = mx == -INFINITY ? 0.f : expf(sc[j] - mx);
    sc[j] = p;
    sum += p;
  }
  for (int w = 16; w; w >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, w);
  if (threadIdx.x % 32 == 0) red[threadIdx.x / 32] = sum;
  __syncthreads();
  sum = 0.f;
  for (int w = 0; w < blockDim.x / 32; ++w) sum += red[w];
  for (int t = threadIdx.x; t < d; t += blockDim.x) {
    float acc = 0.f;
    for (int j = 0; j < sk; ++j)
      if (sc[j] != 0.f) acc += sc[j] * to_f(v[((int64_t)(k0 + j) * hkv + hk) * d + t]);
    o[((int64_t)(q0 + i) * hq + h) * d + t] = sum > 0.f ? acc / sum : 0.f;
  }
  if (threadIdx.x == 0) {
    int64_t li = cu_q ? (int64_t)h * cu_q[gridDim.z] + q0 + i
                      : ((int64_t)b * hq + h) * sq_fixed + i;
    lse[li] = sum > 0.f ? mx + logf(sum) : -INFINITY;
  }
}

struct Case {
  std::string name;
  int d;
  flashattn_dtype dtype;
  int batch, sq, sk, hq, hkv;
  int causal, wl, wr;
  float softcap;
  std::vector<int> lens_q, lens_k;  // varlen when non-empty
};

static std::mt19937 rng(1234);

template <class T>
static bool run_case(const Case& c) {
  const bool varlen = !c.lens_q.empty();
  const int batch = varlen ? (int)c.lens_q.size() : c.batch;
  std::vector<int> cu_q(1, 0), cu_k(1, 0);
  int max_q = c.sq, max_k = c.sk;
  if (varlen) {
    max_q = max_k = 0;
    for (int b = 0; b < batch; ++b) {
      cu_q.push_back(cu_q.back() + c.lens_q[b]);
      cu_k.push_back(cu_k.back() + c.lens_k[b]);
      max_q = std::max(max_q, c.lens_q[b]);
      max_k = std::max(max_k, c.lens_k[b]);
    }
  }
  const int64_t tq = varlen ? cu_q.back() : (int64_t)batch * c.sq;
  const int64_t tk = varlen ? cu_k.back() : (int64_t)batch * c.sk;
  const int64_t nq = tq * c.hq * c.d, nk = tk * c.hkv * c.d;
  std::normal_distribution<float> nd(0.f, 1.f);
  std::uniform_real_distribution<float> ud(0.f, 1.f);
  auto fill = [&](std::vector<T>& x, int64_t n) {
    x.resize(n);
    for (auto& e : x) {
      float f = nd(rng);
      if (ud(rng) < 0.001f) f *= 8.f;  // outliers
      e = from_f<T>(f);
    }
  };
  std::vector<T> hq_, hk_, hv_;
  fill(hq_, nq);
  fill(hk_, nk);
  fill(hv_, nk);
  const int64_t pad = 4096;  // sentinel after O: rows past the end must never be written
  T *dq, *dk, *dv, *dout;
  float *dlse, *dref, *dref_lse;
  int *dcq = nullptr, *dck = nullptr;
  const int64_t nlse = (int64_t)c.hq * tq;
  CK(cudaMalloc(&dq, nq * sizeof(T)));
  CK(cudaMalloc(&dk, nk * sizeof(T)));
  CK(cudaMalloc(&dv, nk * sizeof(T)));
  CK(cudaMalloc(&dout, (nq + pad) * sizeof(T)));
  CK(cudaMalloc(&dlse, (nlse + pad) * sizeof(float)));
  CK(cudaMalloc(&dref, nq * sizeof(float)));
  CK(cudaMalloc(&dref_lse, nlse * sizeof(float)));
  CK(cudaMemcpy(dq, hq_.data(), nq * sizeof(T), cudaMemcpyHostToDevice));
  CK(cudaMemcpy(dk, hk_.data(), nk * sizeof(T), cudaMemcpyHostToDevice));
  CK(cudaMemcpy(dv, hv_.data(), nk * sizeof(T), cudaMemcpyHostToDevice));
  CK(cudaMemset(dout, 0xff, (nq + pad) * sizeof(T)));  // NaN poison
  CK(cudaMemset(dlse, 0xff, (nlse + pad) * sizeof(float)));
  if (varlen) {
    CK(cudaMalloc(&dcq, cu_q.size() * sizeof(int)));
    CK(cudaMalloc(&dck, cu_k.size() * sizeof(int)));
    CK(cudaMemcpy(dcq, cu_q.data(), cu_q.size() * sizeof(int), cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dck, cu_k.data(), cu_k.size() * sizeof(int), cudaMemcpyHostToDevice));
  }
  auto tensor = [&](void* p, int64_t b, int64_t s, int64_t h) {
    flashattn_tensor t;
    t.data = p;
    t.shape[0] = b; t.shape[1] = s; t.shape[2] = h; t.shape[3] = c.d;
    t.stride[3] = 1; t.stride[2] = c.d; t.stride[1] = h * c.d; t.stride[0] = s * h * c.d;
    return t;
  };
  flashattn_fwd_params p = flashattn_fwd_params_init();
  p.dtype = c.dtype;
  p.q = tensor(dq, varlen ? 1 : batch, varlen ? tq : c.sq, c.hq);
  p.k = tensor(dk, varlen ? 1 : batch, varlen ? tk : c.sk, c.hkv);
  p.v = tensor(dv, varlen ? 1 : batch, varlen ? tk : c.sk, c.hkv);
  p.out = tensor(dout, varlen ? 1 : batch, varlen ? tq : c.sq, c.hq);
  p.lse = dlse;
  p.options.causal = c.causal;
  p.options.window_left = c.wl;
  p.options.window_right = c.causal ? 0 : c.wr;
  p.options.softcap = c.softcap;
  p.options.backend = FLASHATTN_BACKEND_SM90;
  p.options.device = 0;
  if (varlen) {
    p.varlen.cu_seqlens_q = dcq;
    p.varlen.cu_seqlens_k = dck;
    p.varlen.batch = batch;
    p.varlen.max_seqlen_q = max_q;
    p.varlen.max_seqlen_k = max_k;
  }
  flashattn_status st = flashattn_fwd(&p, nullptr, 0, nullptr);
  bool pass = true;
  if (st == FLASHATTN_ERROR_NOT_SUPPORTED) {
    std::printf("%-44s SKIP (%s)\n", c.name.c_str(), flashattn_last_error());
  } else if (st != FLASHATTN_SUCCESS) {
    std::printf("%-44s FAIL status %d: %s\n", c.name.c_str(), (int)st, flashattn_last_error());
    pass = false;
  } else {
    cudaError_t e = cudaDeviceSynchronize();
    if (e != cudaSuccess) {
      std::printf("%-44s FAIL kernel error: %s\n", c.name.c_str(), cudaGetErrorString(e));
      std::exit(3);  // the context is gone
    }
    const float scale = 1.f / std::sqrt((float)c.d);
    dim3 grid(varlen ? max_q : c.sq, c.hq, batch);
    const size_t smem = (varlen ? max_k : c.sk) * sizeof(float);
    CK(cudaFuncSetAttribute(reference_kernel<T>, cudaFuncAttributeMaxDynamicSharedMemorySize, 200 * 1024));
    reference_kernel<T><<<grid, 128, smem>>>(dq, dk, dv, dref, dref_lse, dcq, dck, c.sq, c.sk, c.hq, c.hkv, c.d, scale,
                                             c.softcap, c.wl, c.causal ? 0 : c.wr);
    CK(cudaGetLastError());
    CK(cudaDeviceSynchronize());
    std::vector<T> out(nq + pad);
    std::vector<float> ref(nq), lse(nlse + pad), ref_lse(nlse);
    CK(cudaMemcpy(out.data(), dout, (nq + pad) * sizeof(T), cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(ref.data(), dref, nq * sizeof(float), cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(lse.data(), dlse, (nlse + pad) * sizeof(float), cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(ref_lse.data(), dref_lse, nlse * sizeof(float), cudaMemcpyDeviceToHost));
    double max_err = 0, max_ref = 0, max_lse_err = 0;
    int64_t bad = 0;
    for (int64_t i = 0; i < nq; ++i) {
      float x = to_f(out[i]);
      if (!std::isfinite(x)) { ++bad; continue; }
      max_err = std::max(max_err, (double)std::fabs(x - ref[i]));
      max_ref = std::max(max_ref, (double)std::fabs(ref[i]));
    }
    for (int64_t i = 0; i < nlse; ++i) {
      if (std::isinf(ref_lse[i]) || std::isinf(lse[i])) {
        if (lse[i] != ref_lse[i]) ++bad;
        continue;
      }
      if (std::isnan(lse[i])) { ++bad; continue; }
      max_lse_err = std::max(max_lse_err, (double)std::fabs(lse[i] - ref_lse[i]));
    }
    int64_t clobbered = 0;
    const uint16_t* raw = reinterpret_cast<const uint16_t*>(out.data());
    for (int64_t i = nq; i < nq + pad; ++i) clobbered += raw[i] != 0xffff;
    for (int64_t i = nlse; i < nlse + pad; ++i) {
      uint32_t u;
      std::memcpy(&u, &lse[i], 4);
      clobbered += u != 0xffffffffu;
    }
    // Output rounding of the input precision, plus P rounded to 16 bits before P V.
    const double tol = (c.dtype == FLASHATTN_DTYPE_BF16 ? 1.6e-2 : 2.5e-3) * std::max(1.0, max_ref);
    pass = bad == 0 && clobbered == 0 && max_err <= tol && max_lse_err <= 2e-3 * std::max(1.0, std::log((double)max_k));
    std::printf("%-44s %s  max|dO| %.3e (tol %.1e, max|O| %.2f)  max|dLSE| %.3e  nonfinite/mismatch %lld  clobbered %lld\n",
                c.name.c_str(), pass ? "PASS" : "FAIL", max_err, tol, max_ref, max_lse_err, (long long)bad,
                (long long)clobbered);
  }
  cudaFree(dq); cudaFree(dk); cudaFree(dv); cudaFree(dout); cudaFree(dlse); cudaFree(dref); cudaFree(dref_lse);
  if (dcq) { cudaFree(dcq); cudaFree(dck); }
  return pass;
}

static bool run(const Case& c) {
  return c.dtype == FLASHATTN_DTYPE_BF16 ? run_case<__nv_bfloat16>(c) : run_case<__half>(c);
}

// TFLOP/s of a [batch, seqlen, heads, d] forward with CUDA events.
static void time_fwd(int d, int seqlen, int batch, int heads, int causal, const char* label) {
  const int64_t n = (int64_t)batch * seqlen * heads * d;
  __nv_bfloat16 *q, *k, *v, *o;
  CK(cudaMalloc(&q, n * 2)); CK(cudaMalloc(&k, n * 2)); CK(cudaMalloc(&v, n * 2)); CK(cudaMalloc(&o, n * 2));
  std::vector<__nv_bfloat16> h(n);
  std::normal_distribution<float> nd(0.f, 1.f);
  for (auto& x : h) x = __float2bfloat16_rn(nd(rng));
  CK(cudaMemcpy(q, h.data(), n * 2, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(k, h.data(), n * 2, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(v, h.data(), n * 2, cudaMemcpyHostToDevice));
  float* lse;
  CK(cudaMalloc(&lse, (int64_t)batch * heads * seqlen * 4));
  flashattn_fwd_params p = flashattn_fwd_params_init();
  p.dtype = FLASHATTN_DTYPE_BF16;
  auto t = [&](void* ptr) {
    flashattn_tensor x;
    x.data = ptr;
    x.shape[0] = batch; x.shape[1] = seqlen; x.shape[2] = heads; x.shape[3] = d;
    x.stride[3] = 1; x.stride[2] = d; x.stride[1] = (int64_t)heads * d; x.stride[0] = (int64_t)seqlen * heads * d;
    return x;
  };
  p.q = t(q); p.k = t(k); p.v = t(v); p.out = t(o);
  p.lse = lse;
  p.options.causal = causal;
  p.options.backend = FLASHATTN_BACKEND_SM90;
  p.options.device = 0;
  if (flashattn_fwd(&p, nullptr, 0, nullptr) != FLASHATTN_SUCCESS) {
    std::printf("perf %-40s SKIP (%s)\n", label, flashattn_last_error());
  } else {
    CK(cudaDeviceSynchronize());
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a)); CK(cudaEventCreate(&b));
    const int iters = 10;
    CK(cudaEventRecord(a));
    for (int i = 0; i < iters; ++i) flashattn_fwd(&p, nullptr, 0, nullptr);
    CK(cudaEventRecord(b));
    CK(cudaEventSynchronize(b));
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, a, b));
    ms /= iters;
    double flops = 4.0 * batch * heads * (double)seqlen * seqlen * d / (causal ? 2.0 : 1.0);
    std::printf("perf %-40s %8.3f ms  %7.1f TFLOP/s\n", label, ms, flops / (ms * 1e-3) / 1e12);
    cudaEventDestroy(a); cudaEventDestroy(b);
  }
  cudaFree(q); cudaFree(k); cudaFree(v); cudaFree(o); cudaFree(lse);
}

int main(int argc, char** argv) {
  bool perf = !(argc > 1 && std::strcmp(argv[1], "--no-perf") == 0);
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  std::printf("device: %s (cc %d.%d, %d SMs)\n", prop.name, prop.major, prop.minor, prop.multiProcessorCount);
  const auto BF = FLASHATTN_DTYPE_BF16, FP = FLASHATTN_DTYPE_FP16;
  std::vector<Case> cases = {
      {"d128 bf16 b2 h4/2 1024x1024", 128, BF, 2, 1024, 1024, 4, 2, 0, -1, -1, 0.f, {}, {}},
      {"d128 fp16 b2 h4/4 1024x1024 causal", 128, FP, 2, 1024, 1024, 4, 4, 1, -1, -1, 0.f, {}, {}},
      {"d128 fp16 b1 h3/1 203x799 causal", 128, FP, 1, 203, 799, 3, 1, 1, -1, -1, 0.f, {}, {}},
      {"d128 bf16 b1 h2/2 799x203 causal (empty rows)", 128, BF, 1, 799, 203, 2, 2, 1, -1, -1, 0.f, {}, {}},
      {"d128 bf16 b2 h2/1 1x4097", 128, BF, 2, 1, 4097, 2, 1, 0, -1, -1, 0.f, {}, {}},
      {"d128 bf16 b1 h2/2 1023x1023 window(100,7) softcap", 128, BF, 1, 1023, 1023, 2, 2, 0, 100, 7, 30.f, {}, {}},
      {"d64 bf16 b2 h4/2 1023x1023 causal", 64, BF, 2, 1023, 1023, 4, 2, 1, -1, -1, 0.f, {}, {}},
      {"d64 fp16 b1 h2/2 113x1023", 64, FP, 1, 113, 1023, 2, 2, 0, -1, -1, 0.f, {}, {}},
      {"d256 fp16 b1 h2/2 1023x799", 256, FP, 1, 1023, 799, 2, 2, 0, -1, -1, 0.f, {}, {}},
      {"d256 bf16 b1 h2/1 799x799 causal", 256, BF, 1, 799, 799, 2, 1, 1, -1, -1, 0.f, {}, {}},
      {"d96 bf16 b1 h2/2 203x1023 window(64,-1)", 96, BF, 1, 203, 1023, 2, 2, 0, 64, -1, 0.f, {}, {}},
      {"d192 fp16 b1 h2/2 799x1023 causal softcap", 192, FP, 1, 799, 1023, 2, 2, 1, -1, -1, 20.f, {}, {}},
      {"d128 bf16 varlen q(1,203,799) k(7,1023,113) causal", 128, BF, 0, 0, 0, 4, 2, 1, -1, -1, 0.f,
       {1, 203, 799}, {7, 1023, 113}},
      {"d64 fp16 varlen q(113,0,1023) k(1023,5,0)", 64, FP, 0, 0, 0, 2, 2, 0, -1, -1, 0.f, {113, 0, 1023}, {1023, 5, 0}},
      // More tiles than SMs: CTAs run several tiles, so the O staging buffer is reused (and, at
      // hdim 192/256 where it shares V's bytes, the producer waits for each O store).
      {"d256 bf16 b4 h8/2 1100x1100 (persistent)", 256, BF, 4, 1100, 1100, 8, 2, 0, -1, -1, 0.f, {}, {}},
      {"d192 bf16 b3 h8/4 1500x1500 causal (dynamic)", 192, BF, 3, 1500, 1500, 8, 4, 1, -1, -1, 0.f, {}, {}},
      {"d256 fp16 varlen q(700,129,1000,333) k(900,129,64,333) causal", 256, FP, 0, 0, 0, 8, 8, 1, -1, -1, 0.f,
       {700, 129, 1000, 333}, {900, 129, 64, 333}},
      {"d128 bf16 varlen q(1000,65,700,1) k(300,65,1300,9) h32/8", 128, BF, 0, 0, 0, 32, 8, 0, -1, -1, 0.f,
       {1000, 65, 700, 1}, {300, 65, 1300, 9}},
      {"d64 bf16 b8 h16/16 777x777 window(200,0)", 64, BF, 8, 777, 777, 16, 16, 0, 200, 0, 0.f, {}, {}},
      // Many tiles per CTA with two Q buffers (hdim 64/96/128 below 8k keys), with keyless
      // tiles (causal sq > sk) between tiles that have keys.
      {"d128 bf16 b2 h16/4 1100x700 (persistent)", 128, BF, 2, 1100, 700, 16, 4, 0, -1, -1, 0.f, {}, {}},
      {"d64 fp16 b3 h16/16 700x300 causal (dynamic, keyless tiles)", 64, FP, 3, 700, 300, 16, 16, 1, -1, -1, 0.f, {}, {}},
      {"d96 bf16 b2 h16/8 1300x1300 window(300,300) (dynamic)", 96, BF, 2, 1300, 1300, 16, 8, 0, 300, 300, 0.f, {}, {}},
  };
  int failed = 0;
  for (const Case& c : cases) failed += run(c) ? 0 : 1;
  std::printf("%s: %d of %zu cases failed\n", failed ? "FAIL" : "PASS", failed, cases.size());
  if (perf) {
    time_fwd(128, 16384, 1, 16, 0, "d128 bf16 16k non-causal (b1 h16)");
    time_fwd(128, 16384, 1, 16, 1, "d128 bf16 16k causal");
    time_fwd(64, 16384, 1, 32, 0, "d64 bf16 16k non-causal (b1 h32)");
    time_fwd(256, 16384, 1, 8, 0, "d256 bf16 16k non-causal (b1 h8)");
    const int ab[3][2] = {{0, 1}, {1, 0}, {0, 0}};
    for (auto& x : ab) {
      if (flashattn_sm90_set_ablation(x[0], x[1]) != FLASHATTN_SUCCESS) {  // a build without the ablation kernels
        std::printf("ablation timings skipped: %s\n", flashattn_last_error());
        break;
      }
      char label[96];
      std::snprintf(label, sizeof(label), "d128 16k non-causal pingpong=%d overlap=%d", x[0], x[1]);
      time_fwd(128, 16384, 1, 16, 0, label);
    }
    flashattn_sm90_set_ablation(1, 1);
  }
  return failed ? 1 : 0;
}
