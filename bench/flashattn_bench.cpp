// flashattn-bench: TFLOP/s of the flashattn paths through the C ABI.
//
//   flashattn-bench [--backend sm80|sm90|auto|cpu] [--mode fwd|bwd|fwdbwd] [--hdim 128]
//                   [--seqlen 4096] [--batch B] [--nheads H] [--causal] [--dtype bf16|fp16|fp8]
//                   [--fp8-v rows|keys_permuted16] [--fp8-scales block|head] [--iters 10] [--sweep] [--json FILE]
//                   [--no-pingpong] [--no-overlap] [--ablation]
//
// FLOPs (FlashAttention's convention): fwd 4*b*h*sq*sk*d, halved when causal; bwd 2.5x fwd;
// fwdbwd 3.5x fwd. GPU timing: CUDA events around each call after warm-up, median of >= 10
// runs; inputs are random (never zeros) and much larger than L2 in the sweep, so no rotation.
// --sweep is the FlashAttention-3 paper's: 16k total tokens, hidden 2048 (nheads = 2048/hdim,
// batch = 16384/seqlen), hdim 64/128/256, seqlen 512..16k, causal and not.
// sm90 forward ablation (FA3 paper, Table 2): --no-pingpong / --no-overlap turn off the
// pingpong schedule between consumer warpgroups / the intra-warpgroup softmax-GEMM overlap;
// --ablation times all four combinations per shape (impl names say which is off). The kernels
// with one off exist only in a library configured with -DFLASHATTN_SM90_ABLATION=ON.
// --dtype fp8 (forward, GPU): q, k, v drawn in bf16 as for the other dtypes, quantized to E4M3 with
// 128-token block scales by flashattn_fp8_quantize (not timed), O in bf16; --fp8-v keys_permuted16
// passes V as V^T (fp8_v_layout; built on the host, not timed), impl "<impl>+fp8" or "+fp8vt";
// --fp8-scales head: one scale per (batch, head) instead (impl suffix "/head-scales").
// Without CUDA (or with --backend cpu) it times the CPU path on a couple of small shapes and
// checks it against the reference path (the "CPU demo").
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#if defined(FLASHATTN_BENCH_CUDA)
#include <cuda_runtime.h>
#endif

#include "flashattn/flashattn.h"
#include "flashattn/flashattn_experimental.h"

namespace {

struct Config {
  std::string backend = "auto", mode = "fwd", dtype = "bf16", json, fp8_v = "rows", fp8_scales = "block";
  int hdim = 128, seqlen = 4096, batch = 0, nheads = 0, iters = 10;
  bool causal = false, sweep = false;
  bool pingpong = true, overlap = true, ablation = false;  // sm90 forward switches
};

struct Row {
  std::string impl, mode, dtype;
  int hdim, seqlen, batch, nheads;
  bool causal;
  double tflops, ms;
};

[[noreturn]] void usage(const char* why) {
  std::fprintf(stderr,
               "%s\nusage: flashattn-bench [--backend sm80|sm90|auto|cpu] [--mode fwd|bwd|fwdbwd] [--hdim D]\n"
               "       [--seqlen S] [--batch B] [--nheads H] [--causal] [--dtype bf16|fp16|fp8] [--iters N]\n"
               "       [--fp8-v rows|keys_permuted16] [--fp8-scales block|head] [--sweep] [--json FILE] [--no-pingpong] [--no-overlap]\n"
               "       [--ablation]\n",
               why);
  std::exit(2);
}

Config parse(int argc, char** argv) {
  Config c;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto val = [&]() -> std::string {
      if (i + 1 >= argc) usage(("missing value for " + a).c_str());
      return argv[++i];
    };
    if (a == "--backend") c.backend = val();
    else if (a == "--mode") c.mode = val();
    else if (a == "--dtype") c.dtype = val();
    else if (a == "--json") c.json = val();
    else if (a == "--fp8-v") c.fp8_v = val();
    else if (a == "--fp8-scales") c.fp8_scales = val();
    else if (a == "--hdim") c.hdim = std::atoi(val().c_str());
    else if (a == "--seqlen") c.seqlen = std::atoi(val().c_str());
    else if (a == "--batch") c.batch = std::atoi(val().c_str());
    else if (a == "--nheads") c.nheads = std::atoi(val().c_str());
    else if (a == "--iters") c.iters = std::max(10, std::atoi(val().c_str()));
    else if (a == "--causal") c.causal = true;
    else if (a == "--sweep") c.sweep = true;
    else if (a == "--no-pingpong") c.pingpong = false;
    else if (a == "--no-overlap") c.overlap = false;
    else if (a == "--ablation") c.ablation = true;
    else if (a == "-h" || a == "--help") usage("flashattn-bench: TFLOP/s of flashattn");
    else usage(("unknown argument " + a).c_str());
  }
  if (c.mode != "fwd" && c.mode != "bwd" && c.mode != "fwdbwd") usage("--mode: fwd, bwd or fwdbwd");
  if ((c.ablation || !c.pingpong || !c.overlap) && (c.backend != "sm90" || c.mode != "fwd"))
    usage("--no-pingpong, --no-overlap and --ablation apply to --backend sm90 --mode fwd");
  if (c.dtype != "bf16" && c.dtype != "fp16" && c.dtype != "fp8") usage("--dtype: bf16, fp16 or fp8");
  if (c.fp8_v != "rows" && c.fp8_v != "keys_permuted16") usage("--fp8-v: rows or keys_permuted16");
  if (c.dtype == "fp8" && c.mode != "fwd") usage("--dtype fp8: forward only (--mode fwd)");
  if (c.dtype != "fp8" && c.fp8_v != "rows") usage("--fp8-v: only with --dtype fp8");
  if (c.fp8_scales != "block" && c.fp8_scales != "head") usage("--fp8-scales: block or head");
  if (c.dtype != "fp8" && c.fp8_scales != "block") usage("--fp8-scales: only with --dtype fp8");
  if (c.backend != "sm80" && c.backend != "sm90" && c.backend != "auto" && c.backend != "cpu")
    usage("--backend: sm80, sm90, auto or cpu");
  return c;
}

[[maybe_unused]] flashattn_backend backend_id(const std::string& b) {
  if (b == "sm80") return FLASHATTN_BACKEND_SM80;
  if (b == "sm90") return FLASHATTN_BACKEND_SM90;
  if (b == "cpu") return FLASHATTN_BACKEND_CPU;
  return FLASHATTN_BACKEND_AUTO;
}

double flops(const std::string& mode, int b, int h, int s, int d, bool causal) {
  double f = 4.0 * b * h * double(s) * s * d * (causal ? 0.5 : 1.0);
  return mode == "fwd" ? f : mode == "bwd" ? 2.5 * f : 3.5 * f;
}

// Random N(0,1)-ish 16-bit values (sum of uniforms), never zeros.
uint16_t to_bits(float x, bool bf16) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  if (bf16) return uint16_t((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
  // fp16 via the compiler-independent path: normal range only (|x| < 8 here).
  const uint32_t sign = (u >> 16) & 0x8000u;
  const int e = int((u >> 23) & 0xff) - 127 + 15;
  if (e <= 0) return uint16_t(sign);
  uint32_t m = u & 0x7fffffu;
  uint32_t h = sign | (uint32_t(e) << 10) | (m >> 13);
  const uint32_t rest = m & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) ++h;
  return uint16_t(h);
}

void fill_random(std::vector<uint16_t>& v, uint64_t seed, bool bf16) {
  uint64_t x = seed * 0x9e3779b97f4a7c15ull + 1;
  for (auto& e : v) {
    float s = 0;
    for (int k = 0; k < 4; ++k) {
      x ^= x << 13, x ^= x >> 7, x ^= x << 17;
      s += float(x >> 40) / float(1 << 24);
    }
    e = to_bits((s - 2.f) * 1.7320508f, bf16);
  }
}

flashattn_tensor tensor(void* p, int b, int s, int h, int d) {
  flashattn_tensor t;
  t.data = p;
  t.shape[0] = b, t.shape[1] = s, t.shape[2] = h, t.shape[3] = d;
  t.stride[3] = 1, t.stride[2] = d, t.stride[1] = int64_t(h) * d, t.stride[0] = int64_t(s) * h * d;
  return t;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

#if defined(FLASHATTN_BENCH_CUDA)
#define CK(x)                                                                       \
  do {                                                                              \
    cudaError_t e_ = (x);                                                           \
    if (e_ != cudaSuccess) {                                                        \
      std::fprintf(stderr, "%s: %s\n", #x, cudaGetErrorString(e_));                 \
      return false;                                                                 \
    }                                                                               \
  } while (0)

// FP8 inputs for bench_gpu: q, k, v (bf16, on the device) quantized to E4M3 with 128-token block
// scales (--fp8-scales head: one per (batch, head), FA3's descales) into fp8_buf (3 x n bytes) and
// scale_buf (3 x b h blocks floats); with keys_permuted16, V
// rewritten on the host as V^T, keys permuted in groups of 16 (flashattn.h), into vt (b h d L bytes).
bool prepare_fp8(const Config& c, int b, int h, int s, int d, void* const (&x)[3], uint8_t* fp8_buf,
                 float* scale_buf, uint8_t** vt, flashattn_fwd_params* f) {
  const size_t n = size_t(b) * s * h * d;
  const int block = c.fp8_scales == "head" ? s : 128;
  const int blocks = (s + block - 1) / block;
  const size_t nscale = size_t(b) * h * blocks;
  for (int i = 0; i < 3; ++i) {
    flashattn_fp8_quantize_params qp = flashattn_fp8_quantize_params_init();
    qp.dtype = FLASHATTN_DTYPE_BF16;
    qp.x = tensor(x[i], b, s, h, d);
    qp.x_fp8 = tensor(fp8_buf + i * n, b, s, h, d);
    qp.scales = scale_buf + i * nscale;
    qp.block_size = block;
    qp.options.device = 0;
    if (flashattn_fp8_quantize(&qp, nullptr) != FLASHATTN_SUCCESS) {
      std::fprintf(stderr, "  fp8 quantize: %s\n", flashattn_last_error());
      return false;
    }
  }
  f->dtype = FLASHATTN_DTYPE_FP8_E4M3;
  f->q = tensor(fp8_buf, b, s, h, d), f->k = tensor(fp8_buf + n, b, s, h, d), f->v = tensor(fp8_buf + 2 * n, b, s, h, d);
  f->fp8.q_scale = scale_buf, f->fp8.k_scale = scale_buf + nscale, f->fp8.v_scale = scale_buf + 2 * nscale;
  f->fp8.q_block_size = f->fp8.k_block_size = block;
  f->fp8.out_dtype = FLASHATTN_DTYPE_BF16;
  if (c.fp8_v == "keys_permuted16") {
    const int64_t len = (int64_t(s) + 15) / 16 * 16;
    std::vector<uint8_t> rows(n), t(size_t(b) * h * d * len, 0);
    if (cudaMemcpy(rows.data(), fp8_buf + 2 * n, n, cudaMemcpyDeviceToHost) != cudaSuccess) return false;
    for (int bi = 0; bi < b; ++bi)
      for (int j = 0; j < s; ++j) {
        const int k = j & 15, pos = (j & ~15) | ((k & 6) << 1) | ((k & 8) >> 2) | (k & 1);
        for (int hi = 0; hi < h; ++hi)
          for (int ci = 0; ci < d; ++ci)
            t[((size_t(bi) * h + hi) * d + ci) * len + pos] = rows[((size_t(bi) * s + j) * h + hi) * d + ci];
      }
    if (cudaMalloc(vt, t.size()) != cudaSuccess ||
        cudaMemcpy(*vt, t.data(), t.size(), cudaMemcpyHostToDevice) != cudaSuccess)
      return false;
    f->v.data = *vt;
    f->v.stride[0] = int64_t(h) * d * len, f->v.stride[1] = 1, f->v.stride[2] = int64_t(d) * len, f->v.stride[3] = len;
    f->fp8_v_layout = FLASHATTN_FP8_V_KEYS_PERMUTED16;
  }
  return cudaDeviceSynchronize() == cudaSuccess;
}

bool bench_gpu(const Config& c, int b, int h, int s, int d, bool causal, Row* row) {
  const bool fp8 = c.dtype == "fp8";
  const bool bf16 = c.dtype != "fp16";  // fp8: quantized from bf16
  const size_t n = size_t(b) * s * h * d, bytes = n * 2;
  std::vector<uint16_t> host(n);
  void *q, *k, *v, *o, *dout, *dq, *dk, *dv;
  float* lse;
  void** bufs[] = {&q, &k, &v, &o, &dout, &dq, &dk, &dv};
  for (void** p : bufs) CK(cudaMalloc(p, bytes));
  CK(cudaMalloc(&lse, size_t(b) * h * s * 4));
  for (int i = 0; i < 4; ++i) {
    fill_random(host, 17 + i, bf16);
    CK(cudaMemcpy(i == 0 ? q : i == 1 ? k : i == 2 ? v : dout, host.data(), bytes, cudaMemcpyHostToDevice));
  }
  flashattn_options opt = flashattn_default_options();
  opt.causal = causal;
  opt.backend = backend_id(c.backend);
  opt.device = 0;
  flashattn_fwd_params f = flashattn_fwd_params_init();
  f.dtype = bf16 ? FLASHATTN_DTYPE_BF16 : FLASHATTN_DTYPE_FP16;
  f.q = tensor(q, b, s, h, d), f.k = tensor(k, b, s, h, d), f.v = tensor(v, b, s, h, d);
  f.out = tensor(o, b, s, h, d);
  f.lse = lse;
  f.options = opt;
  uint8_t* fp8_buf = nullptr;
  uint8_t* vt = nullptr;
  float* scale_buf = nullptr;
  if (fp8) {
    CK(cudaMalloc(&fp8_buf, 3 * n));
    CK(cudaMalloc(&scale_buf, 3 * size_t(b) * h * ((s + 127) / 128) * sizeof(float)));
    if (!prepare_fp8(c, b, h, s, d, {q, k, v}, fp8_buf, scale_buf, &vt, &f)) {
      for (void* p : {(void*)fp8_buf, (void*)scale_buf, (void*)vt}) cudaFree(p);
      for (void** p : bufs) cudaFree(*p);
      cudaFree(lse);
      return false;
    }
  }
  flashattn_bwd_params g = flashattn_bwd_params_init();
  g.dtype = f.dtype;
  g.q = f.q, g.k = f.k, g.v = f.v, g.out = f.out, g.dout = tensor(dout, b, s, h, d);
  g.dq = tensor(dq, b, s, h, d), g.dk = tensor(dk, b, s, h, d), g.dv = tensor(dv, b, s, h, d);
  g.lse = lse;
  g.options = opt;
  size_t ws_f = 0, ws_b = 0;
  bool ok = flashattn_fwd_workspace_size(&f, &ws_f) == FLASHATTN_SUCCESS;
  if (ok && c.mode != "fwd") ok = flashattn_bwd_workspace_size(&g, &ws_b) == FLASHATTN_SUCCESS;
  if (!ok) {
    std::fprintf(stderr, "  skipped: %s\n", flashattn_last_error());
    for (void** p : bufs) cudaFree(*p);
    cudaFree(lse);
    return false;
  }
  void* ws = nullptr;
  const size_t ws_bytes = std::max(ws_f, ws_b);
  if (ws_bytes) CK(cudaMalloc(&ws, ws_bytes));
  auto run = [&](bool fwd) {
    return fwd ? flashattn_fwd(&f, ws, ws_bytes, nullptr) : flashattn_bwd(&g, ws, ws_bytes, nullptr);
  };
  auto step = [&]() -> flashattn_status {
    flashattn_status st = FLASHATTN_SUCCESS;
    if (c.mode != "bwd") st = run(true);
    if (st == FLASHATTN_SUCCESS && c.mode != "fwd") st = run(false);
    return st;
  };
  flashattn_status st = run(true);  // bwd needs out/lse
  for (int i = 0; i < 3 && st == FLASHATTN_SUCCESS; ++i) st = step();
  std::vector<double> ms;
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  for (int i = 0; i < c.iters && st == FLASHATTN_SUCCESS; ++i) {
    CK(cudaEventRecord(e0));
    st = step();
    CK(cudaEventRecord(e1));
    CK(cudaEventSynchronize(e1));
    float t = 0;
    CK(cudaEventElapsedTime(&t, e0, e1));
    ms.push_back(t);
  }
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  const cudaError_t sync = cudaDeviceSynchronize();
  for (void** p : bufs) cudaFree(*p);
  for (void* p : {(void*)fp8_buf, (void*)scale_buf, (void*)vt}) cudaFree(p);
  cudaFree(lse);
  if (ws) cudaFree(ws);
  if (st != FLASHATTN_SUCCESS || sync != cudaSuccess) {
    std::fprintf(stderr, "  failed: %s\n", st != FLASHATTN_SUCCESS ? flashattn_last_error() : cudaGetErrorString(sync));
    return false;
  }
  row->ms = median(ms);
  row->tflops = flops(c.mode, b, h, s, d, causal) / (row->ms * 1e-3) / 1e12;
  return true;
}
#endif

// CPU demo: time the tiled CPU path, check it against the reference path (fp32 on the host).
bool bench_cpu(const Config& c, int b, int h, int s, int d, bool causal, Row* row) {
  const size_t n = size_t(b) * s * h * d;
  std::vector<float> q(n), k(n), v(n), o(n, NAN), oref(n, NAN), lse(size_t(b) * h * s), lref(lse.size());
  std::vector<uint16_t> tmp(n);
  auto fill = [&](std::vector<float>& t, uint64_t seed) {
    fill_random(tmp, seed, true);
    for (size_t i = 0; i < n; ++i) {
      uint32_t u = uint32_t(tmp[i]) << 16;
      std::memcpy(&t[i], &u, 4);
    }
  };
  fill(q, 1), fill(k, 2), fill(v, 3);
  flashattn_fwd_params f = flashattn_fwd_params_init();
  f.dtype = FLASHATTN_DTYPE_FP32;
  f.q = tensor(q.data(), b, s, h, d), f.k = tensor(k.data(), b, s, h, d), f.v = tensor(v.data(), b, s, h, d);
  f.out = tensor(o.data(), b, s, h, d);
  f.lse = lse.data();
  f.options = flashattn_default_options();
  f.options.causal = causal;
  f.options.backend = FLASHATTN_BACKEND_CPU;
  if (flashattn_fwd(&f, nullptr, 0, nullptr) != FLASHATTN_SUCCESS) {  // warm-up
    std::fprintf(stderr, "  cpu failed: %s\n", flashattn_last_error());
    return false;
  }
  std::vector<double> ms;
  for (int i = 0; i < std::max(3, c.iters / 3); ++i) {
    auto t0 = std::chrono::steady_clock::now();
    flashattn_fwd(&f, nullptr, 0, nullptr);
    ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  flashattn_fwd_params r = f;
  r.out = tensor(oref.data(), b, s, h, d);
  r.lse = lref.data();
  r.options.backend = FLASHATTN_BACKEND_REFERENCE;
  if (flashattn_fwd(&r, nullptr, 0, nullptr) != FLASHATTN_SUCCESS) {
    std::fprintf(stderr, "  reference failed: %s\n", flashattn_last_error());
    return false;
  }
  double err = 0, mx = 0;
  for (size_t i = 0; i < n; ++i) {
    err = std::max(err, double(std::fabs(o[i] - oref[i])));
    mx = std::max(mx, double(std::fabs(oref[i])));
  }
  const bool ok = err <= 1e-4 * std::max(1.0, mx);
  std::printf("  cpu vs reference: max|err| %.3g (max|o| %.3g) %s\n", err, mx, ok ? "OK" : "MISMATCH");
  row->ms = median(ms);
  row->tflops = flops("fwd", b, h, s, d, causal) / (row->ms * 1e-3) / 1e12;
  return ok;
}

std::string impl_name(const std::string& backend) {
  if (backend == "cpu") return "flashattn-cpu";
  if (backend != "auto") return "flashattn-" + backend;
#if defined(FLASHATTN_BENCH_CUDA)
  flashattn_device_info info;
  if (flashattn_device_capability(0, &info) == FLASHATTN_SUCCESS)
    return std::string("flashattn-") + flashattn_backend_name(info.fwd_backend);
#endif
  return "flashattn-auto";
}

}  // namespace

int main(int argc, char** argv) {
  Config c = parse(argc, argv);
  bool gpu = false;
#if defined(FLASHATTN_BENCH_CUDA)
  int ndev = 0;
  gpu = cudaGetDeviceCount(&ndev) == cudaSuccess && ndev > 0 && c.backend != "cpu";
#endif
  if (!gpu && (c.ablation || !c.pingpong || !c.overlap)) {
    std::fprintf(stderr, "--no-pingpong, --no-overlap and --ablation need a GPU with the sm90 path\n");
    return 2;
  }
  if (!gpu && c.backend != "cpu") {
    std::printf("no CUDA device (or a build without CUDA): running the CPU demo\n");
    c.backend = "cpu";
  }
  if (c.backend == "cpu" && c.dtype == "fp8") {
    std::fprintf(stderr, "--dtype fp8 needs a GPU with the sm90 path (the CPU demo times fp32)\n");
    return 2;
  }
  struct Shape {
    int b, h, s, d;
    bool causal;
  };
  std::vector<Shape> shapes;
  if (c.backend == "cpu") {
    c.mode = "fwd";
    shapes = {{1, 4, 512, 64, false}, {1, 4, 1024, 128, true}};
    if (!c.sweep && (c.seqlen != 4096 || c.hdim != 128)) shapes = {{1, 4, std::min(c.seqlen, 2048), c.hdim, c.causal}};
  } else if (c.sweep) {
    for (int d : {64, 128, 256})
      for (int s : {512, 1024, 2048, 4096, 8192, 16384})
        for (bool causal : {false, true}) shapes.push_back({16384 / s, 2048 / d, s, d, causal});
  } else {
    const int h = c.nheads > 0 ? c.nheads : 2048 / c.hdim;
    const int b = c.batch > 0 ? c.batch : std::max(1, 16384 / c.seqlen);
    shapes.push_back({b, h, c.seqlen, c.hdim, c.causal});
  }
  const std::string impl =
      impl_name(c.backend) + (c.dtype != "fp8" ? "" : c.fp8_v == "rows" ? "+fp8" : "+fp8vt") +
      (c.dtype == "fp8" && c.fp8_scales == "head" ? "/head-scales" : "");
  struct Variant {
    bool pingpong, overlap;
  };
  std::vector<Variant> variants = {{c.pingpong, c.overlap}};
  if (c.ablation) variants = {{true, true}, {false, true}, {true, false}, {false, false}};
  auto variant_name = [&](const Variant& v) {
    return impl + (v.pingpong ? "" : "-no-pingpong") + (v.overlap ? "" : "-no-overlap");
  };
  std::vector<Row> rows;
  bool all_ok = true;
  std::printf("%-40s %-7s %-5s %5s %7s %6s %6s %6s %10s %9s\n", "impl", "mode", "dtype", "hdim", "seqlen", "batch",
              "nheads", "causal", "ms", "TFLOP/s");
  for (const Shape& sh : shapes) {
    for (const Variant& var : variants) {
      Row r{variant_name(var), c.mode, c.backend == "cpu" ? "fp32" : c.dtype, sh.d, sh.s, sh.b, sh.h, sh.causal, 0, 0};
      if (c.backend == "sm90" && flashattn_sm90_set_ablation(var.pingpong, var.overlap) != FLASHATTN_SUCCESS) {
        std::fprintf(stderr, "  %s\n", flashattn_last_error());
        all_ok = false;
        continue;
      }
      bool ok = false;
#if defined(FLASHATTN_BENCH_CUDA)
      if (c.backend != "cpu") ok = bench_gpu(c, sh.b, sh.h, sh.s, sh.d, sh.causal, &r);
#endif
      if (c.backend == "cpu") ok = bench_cpu(c, sh.b, sh.h, sh.s, sh.d, sh.causal, &r);
      all_ok = all_ok && ok;
      if (!ok) continue;
      std::printf("%-40s %-7s %-5s %5d %7d %6d %6d %6d %10.3f %9.3f\n", r.impl.c_str(), r.mode.c_str(), r.dtype.c_str(),
                  r.hdim, r.seqlen, r.batch, r.nheads, int(r.causal), r.ms, r.tflops);
      std::fflush(stdout);
      rows.push_back(r);
    }
  }
  if (!c.json.empty()) {
    FILE* fp = std::fopen(c.json.c_str(), "w");
    if (!fp) {
      std::perror(c.json.c_str());
      return 1;
    }
    std::fprintf(fp, "[\n");
    for (size_t i = 0; i < rows.size(); ++i) {
      const Row& r = rows[i];
      std::fprintf(fp,
                   "  {\"impl\": \"%s\", \"mode\": \"%s\", \"dtype\": \"%s\", \"hdim\": %d, \"seqlen\": %d, "
                   "\"batch\": %d, \"nheads\": %d, \"causal\": %s, \"tflops\": %.3f, \"ms\": %.4f}%s\n",
                   r.impl.c_str(), r.mode.c_str(), r.dtype.c_str(), r.hdim, r.seqlen, r.batch, r.nheads,
                   r.causal ? "true" : "false", r.tflops, r.ms, i + 1 < rows.size() ? "," : "");
    }
    std::fprintf(fp, "]\n");
    std::fclose(fp);
  }
  return all_ok ? 0 : 1;
}
