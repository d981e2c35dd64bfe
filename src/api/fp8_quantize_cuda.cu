// The CUDA FP8 (E4M3) block quantizer: flashattn_fp8_quantize on device tensors (the semantics are
// the host's, src/cpu/fp8_quantize.cpp, and flashattn.h's comment on flashattn_fp8_quantize).
// One CTA per (batch, head, scale block), grid-strided: two passes over the block's rows, as on the
// host (the amax, then the codes), recomputing the transform rather than keeping the block, so
// shared memory is one row per warp whatever block_size is. Each warp takes one row at a time:
// its lanes load the row into shared memory (applying the signs), run the Walsh-Hadamard
// butterflies stage by stage (__syncwarp between stages) and scale by 1/sqrt(n).
//
// Host/device differences (tests/gpu/test_gpu_fp8_quantize.cpp bounds them):
//  - Without the transform the values quantized are the inputs converted to fp32 exactly, as on
//    the host; amax / 448 and x / scale use IEEE division (__fdiv_rn, whatever --use_fast_math
//    does to '/'), and float_to_e4m3 (common/fp8.h) is integer-only: codes and scales are the
//    host's bit for bit.
//  - With the transform the host computes in fp64 and rounds once to fp32; here every butterfly
//    add and the 1/sqrt(n) product round in fp32 (the same butterfly order, so the same fp32
//    operations as hadamard_forward<float>). A transformed value may differ from the host's by a
//    few fp32 ulps: the block's amax, hence its scale, may differ in the last bits, and a code may
//    differ by one E4M3 step where x' / scale lies within those ulps of a rounding boundary
//    (E4M3 has 3 mantissa bits, so this is rare: about ulps * 2^-20 of the codes).
//  - The build flushes fp32 denormals (--use_fast_math), the host does not: blocks of tiny values
//    (fp32 or bf16 inputs in or near the denormal range, amax below about 448 * 2^-117) may get
//    other scales and codes. Inputs of normal magnitude are unaffected.
#include <cuda_runtime.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <atomic>
#include <cfloat>
#include <cmath>
#include <type_traits>

#include "api/cuda_util.h"
#include "common/error.h"
#include "common/fast_div.h"
#include "common/fp8.h"
#include "common/fp8_scales.h"
#include "common/hadamard.h"
#include "common/half_convert.h"
#include "cpu/fp8_quantize.h"

namespace flashattn::cuda {
namespace {

constexpr int kWarps = 4;
constexpr int kThreads = 32 * kWarps;

struct Fp8Args {
  cpu::Fp8QuantizeParams p;
  int64_t nblocks;
  float inv_sqrt_n;  // float(1 / sqrt(headdim)), as hadamard_forward<float> would be given
  // fp8_quantize_reg_kernel's index math (items < 2^31 there): item -> (batch x head, block), -> (batch, head); a
  // block's rows -> register slots.
  FastDiv by_blocks, by_heads, by_rows_per_pass;
};

// Calls f(c, v) for the columns c = lane + 32 k of row s of head h of batch b, v being the value
// the host quantizes (up to the fp32 rounding of the transform noted above). `row` (headdim
// floats of shared memory, this warp's) is used only with the transform (headdim <= 256 then;
// without it headdim is unbounded and the values come straight from x).
template <typename F>
__device__ void for_each_value(const Fp8Args& a, const int8_t* signs, float* row, int64_t b, int64_t s, int64_t h,
                               int lane, F&& f) {
  const cpu::Fp8QuantizeParams& p = a.p;
  const int64_t n = p.headdim;
  const int64_t base = b * p.x_stride[0] + s * p.x_stride[1] + h * p.x_stride[2];
  if (!p.hadamard) {
    for (int64_t c = lane; c < n; c += 32) f(c, load_float(p.x, p.dtype, base + c));
    return;
  }
  for (int c = lane; c < n; c += 32) {
    const float v = load_float(p.x, p.dtype, base + c);
    row[c] = signs[c] < 0 ? -v : v;
  }
  __syncwarp();
  const int half = int(n / 2);
  for (int hs = 1; hs < n; hs *= 2) {  // hadamard_forward's butterflies, one stage at a time
    for (int k = lane; k < half; k += 32) {
      const int i = (k / hs) * (2 * hs) + (k % hs);
      const float x0 = row[i], x1 = row[i + hs];
      row[i] = __fadd_rn(x0, x1);
      row[i + hs] = __fsub_rn(x0, x1);
    }
    __syncwarp();
  }
  for (int c = lane; c < n; c += 32) f(c, __fmul_rn(row[c], a.inv_sqrt_n));
  __syncwarp();  // the buffer is rewritten by this warp's next row
}

// The block's scale from each thread's amax of its finite values, written by thread 0
// (cpu::fp8_scale_from_amax: amax / 448 in fp32 (IEEE division), at least FLT_MIN, 1 for 0).
// warp_amax: kWarps floats of shared memory; the CTA's threads all call it.
template <int kWarps>
__device__ float block_scale(float amax, float* warp_amax, float* scale_out) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  for (int o = 16; o > 0; o /= 2) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
  if (lane == 0) warp_amax[warp] = amax;
  __syncthreads();
  amax = warp_amax[0];
  for (int w = 1; w < kWarps; ++w) amax = fmaxf(amax, warp_amax[w]);
  const float scale = amax > 0.f ? fmaxf(__fdiv_rn(amax, kE4M3Max), FLT_MIN) : 1.f;
  if (threadIdx.x == 0) *scale_out = scale;
  return scale;
}

__global__ void __launch_bounds__(kThreads) fp8_quantize_kernel(const Fp8Args a) {
  const cpu::Fp8QuantizeParams& p = a.p;
  __shared__ float rows[kWarps][kHadamardMaxDim];
  __shared__ int8_t signs[kHadamardMaxDim];
  __shared__ float warp_amax[kWarps];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (p.hadamard) {
    const int n = int(p.headdim);
    for (int c = threadIdx.x; c < n; c += kThreads) signs[c] = int8_t(hadamard_sign(p.hadamard_seed, c));
  }
  __syncthreads();
  float* row = rows[warp];
  const int64_t items = p.batch * p.nheads * a.nblocks;
  for (int64_t item = blockIdx.x; item < items; item += gridDim.x) {
    const int64_t blk = item % a.nblocks, bh = item / a.nblocks;
    const int64_t b = bh / p.nheads, h = bh % p.nheads;
    const int64_t s0 = blk * p.block_size;
    const int64_t s1 = s0 + p.block_size < p.seqlen ? s0 + p.block_size : p.seqlen;

    float amax = 0.f;
    for (int64_t s = s0 + warp; s < s1; s += kWarps) {
      for_each_value(a, signs, row, b, s, h, lane, [&](int64_t, float x) {
        const float v = fabsf(x);
        if (isfinite(v) && v > amax) amax = v;  // NaN/inf left out, as on the host
      });
    }
    const float scale = block_scale<kWarps>(amax, warp_amax, &p.scales[bh * a.nblocks + blk]);

    for (int64_t s = s0 + warp; s < s1; s += kWarps) {
      uint8_t* dst = p.x_fp8 + cpu::fp8_code_offset(p, b, s, h, 0);
      const int64_t cs = p.x_fp8_stride[3];
      for_each_value(a, signs, row, b, s, h, lane,
                     [&](int64_t c, float x) { dst[c * cs] = float_to_e4m3(__fdiv_rn(x, scale)); });
    }
    if (p.keys_permuted16 && blk == a.nblocks - 1) {  // 0 where no key sits (as on the host)
      const int64_t row_len = p.x_fp8_stride[3], first = p.seqlen / 16 * 16, n = row_len - first;
      uint8_t* row0 = p.x_fp8 + b * p.x_fp8_stride[0] + h * p.x_fp8_stride[2];
      for (int64_t i = threadIdx.x; i < n * p.headdim; i += kThreads) {
        const int64_t pos = first + i % n, c = i / n;
        if ((pos & ~int64_t(15)) + fp8_v_key_at_position(int(pos & 15)) >= p.seqlen) row0[c * row_len + pos] = 0;
      }
    }
    __syncthreads();  // warp_amax is rewritten by the next item
  }
}

// Without the transform, for 16-bit inputs whose rows are contiguous and 16-byte aligned (the
// usual [b, s, h, d] tensor, d a multiple of 8): the same values and the same per-value
// arithmetic as fp8_quantize_kernel (so the same bits), read 8 at a time with 16-byte loads and
// written 8 codes at a time, the block's rows spread over all threads (kVecUnroll chunks in
// flight per thread), instead of one 2-byte load and one 1-byte store per lane and a warp per row.
// The second pass re-reads the block, mostly from L2 (a 128-token block of one head is 32 KB at
// hdim 128). Measured before it (H100, bench/bench_fp8_quantize.py): 12-16% of the copy bandwidth.
constexpr int kVecThreads = 256;
constexpr int kVecUnroll = 4;

__device__ __forceinline__ void load8(const Fp8Args& a, const uint16_t* src, float (&v)[8]) {
  const uint4 raw = *reinterpret_cast<const uint4*>(src);
  const uint32_t w[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const uint16_t lo = uint16_t(w[k] & 0xffffu), hi = uint16_t(w[k] >> 16);
    v[2 * k] = a.p.dtype == FLASHATTN_DTYPE_BF16 ? bf16_to_float(lo) : half_to_float(lo);
    v[2 * k + 1] = a.p.dtype == FLASHATTN_DTYPE_BF16 ? bf16_to_float(hi) : half_to_float(hi);
  }
}

__global__ void __launch_bounds__(kVecThreads) fp8_quantize_vec_kernel(const Fp8Args a) {
  const cpu::Fp8QuantizeParams& p = a.p;
  __shared__ float warp_amax[kVecThreads / 32];
  const int64_t chunks_per_row = p.headdim / 8;
  const int64_t items = p.batch * p.nheads * a.nblocks;
  const uint16_t* x = static_cast<const uint16_t*>(p.x);
  for (int64_t item = blockIdx.x; item < items; item += gridDim.x) {
    const int64_t blk = item % a.nblocks, bh = item / a.nblocks;
    const int64_t b = bh / p.nheads, h = bh % p.nheads;
    const int64_t s0 = blk * p.block_size;
    const int64_t s1 = s0 + p.block_size < p.seqlen ? s0 + p.block_size : p.seqlen;
    const int64_t chunks = (s1 - s0) * chunks_per_row;
    const int64_t xbase = b * p.x_stride[0] + h * p.x_stride[2];
    auto src_of = [&](int64_t k) { return x + xbase + (s0 + k / chunks_per_row) * p.x_stride[1] + (k % chunks_per_row) * 8; };

    float amax = 0.f;
    for (int64_t k0 = threadIdx.x; k0 < chunks; k0 += int64_t(kVecThreads) * kVecUnroll) {
      float v[kVecUnroll][8];
#pragma unroll
      for (int u = 0; u < kVecUnroll; ++u) {
        const int64_t k = k0 + int64_t(u) * kVecThreads;
        if (k < chunks) {
          load8(a, src_of(k), v[u]);
        } else {
#pragma unroll
          for (int e = 0; e < 8; ++e) v[u][e] = 0.f;
        }
      }
#pragma unroll
      for (int u = 0; u < kVecUnroll; ++u)
#pragma unroll
        for (int e = 0; e < 8; ++e) {
          const float m = fabsf(v[u][e]);
          if (isfinite(m) && m > amax) amax = m;  // NaN/inf left out, as on the host
        }
    }
    const float scale = block_scale<kVecThreads / 32>(amax, warp_amax, &p.scales[bh * a.nblocks + blk]);

    const int64_t dbase = b * p.x_fp8_stride[0] + h * p.x_fp8_stride[2];
    for (int64_t k0 = threadIdx.x; k0 < chunks; k0 += int64_t(kVecThreads) * kVecUnroll) {
      float v[kVecUnroll][8];
#pragma unroll
      for (int u = 0; u < kVecUnroll; ++u) {
        const int64_t k = k0 + int64_t(u) * kVecThreads;
        if (k < chunks) load8(a, src_of(k), v[u]);
      }
#pragma unroll
      for (int u = 0; u < kVecUnroll; ++u) {
        const int64_t k = k0 + int64_t(u) * kVecThreads;
        if (k >= chunks) continue;
        uint32_t lo = 0, hi = 0;
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          lo |= uint32_t(float_to_e4m3(__fdiv_rn(v[u][e], scale))) << (8 * e);
          hi |= uint32_t(float_to_e4m3(__fdiv_rn(v[u][e + 4], scale))) << (8 * e);
        }
        uint8_t* dst = p.x_fp8 + dbase + (s0 + k / chunks_per_row) * p.x_fp8_stride[1] + (k % chunks_per_row) * 8;
        *reinterpret_cast<uint2*>(dst) = make_uint2(lo, hi);
      }
    }
    __syncthreads();  // warp_amax is rewritten by the next item
  }
}

// A whole scale block in registers (16-bit inputs whose rows are contiguous and 16-byte aligned,
// headdim a multiple of 8 up to 256, at most kRegMaxRows rows per thread): a persistent grid whose
// CTAs take (batch, head, scale block) items in turn, the next item's raw chunks prefetched into
// shared memory while the current one is computed (+15-40% with the transform, +0-15% without,
// H200, perf-notes s23); thread t holds chunk t % cpr (8 values) of rows t / cpr + i * (256 / cpr), raw, so
// the block is read from DRAM once (fp8_quantize_vec_kernel's second pass re-reads it from L2),
// with 32-bit index math (the vec kernel divides 64-bit integers per 8 values). With the
// transform, the butterflies of distance < 8 run inside a thread's chunk and the others between
// the cpr lanes of a row (shuffles; cpr is a power of two dividing 32 there): the same fp32
// additions as fp8_quantize_kernel's shared-memory stages; each pass recomputes it from the raw
// values instead of keeping 8 floats per row. Codes by the E4M3 conversion instruction where the
// arch has it (sm89+: cvt.rn.satfinite, the bits of float_to_e4m3, common/fp8.h), NaN's sign kept.
constexpr int kRegThreads = 256;
constexpr int kRegMaxRows = 16;  // rows per thread at most: 64 registers of raw 16-bit values

template <bool kBf16>
__device__ __forceinline__ void unpack8(const uint4& raw, float (&v)[8]) {
  const uint32_t w[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const uint16_t lo = uint16_t(w[k] & 0xffffu), hi = uint16_t(w[k] >> 16);
    // fp16 by the conversion instruction (exact, like half_to_float's bit manipulation).
    v[2 * k] = kBf16 ? bf16_to_float(lo) : __half2float(__ushort_as_half(lo));
    v[2 * k + 1] = kBf16 ? bf16_to_float(hi) : __half2float(__ushort_as_half(hi));
  }
}

// float_to_e4m3(x / scale) of 8 values, little-endian in two words, by exact division and the
// integer path: out of line, for the rare call with an inf or NaN (inlined in every slot it
// tripled the kernel's code). The values come as arguments: an array would go through memory.
__device__ __noinline__ uint2 e4m3_codes8_exact(float x0, float x1, float x2, float x3, float x4, float x5, float x6,
                                                float x7, float scale) {
  const float x[8] = {x0, x1, x2, x3, x4, x5, x6, x7};
  uint32_t w0 = 0u, w1 = 0u;
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    w0 |= uint32_t(float_to_e4m3(__fdiv_rn(x[e], scale))) << (8 * e);
    w1 |= uint32_t(float_to_e4m3(__fdiv_rn(x[e + 4], scale))) << (8 * e);
  }
  return make_uint2(w0, w1);
}

// IEEE single operations with subnormals kept whatever the compile flags (--use_fast_math flushes
// them in plain float code; the host quantizer does not).
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 890  // their one user, e4m3_codes8, needs sm89+
__device__ __forceinline__ float mul_rn_keep_subnormals(float a, float b) {
  float r;
  asm("mul.rn.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
  return r;
}
__device__ __forceinline__ float fma_rn_keep_subnormals(float a, float b, float c) {
  float r;
  asm("fma.rn.f32 %0, %1, %2, %3;" : "=f"(r) : "f"(a), "f"(b), "f"(c));
  return r;
}
#endif

// Codes of x / scale, 8 of them, little-endian in two words (float_to_e4m3's bits). neg_scale
// is -scale and rcp __frcp_rn(scale), once per block. x / scale correctly rounded by Markstein's
// correction: q0 = RN(x rcp) is within an ulp, e = x - q0 scale is exact by FMA, and
// RN(q0 + e rcp) is RN(x / scale) (what __fdiv_rn's fast path does, less its per-value
// reciprocal refinement and range check: |x| <= amax keeps the quotient <= 448, and one below
// FLT_MIN codes to E4M3 zero either way). e == 0 keeps q0, which carries -0's sign. A non-finite x: __fdiv_rn and the integer path.
__device__ __forceinline__ uint2 e4m3_codes8(const float (&v)[8], float scale, float neg_scale, float rcp) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  float q[8];
  bool finite = true;
#pragma unroll
  for (int e = 0; e < 8; ++e) {
    finite &= fabsf(v[e]) < INFINITY;
    const float q0 = mul_rn_keep_subnormals(v[e], rcp);
    const float err = fma_rn_keep_subnormals(q0, neg_scale, v[e]);  // -scale: one instruction
    q[e] = err == 0.f ? q0 : fma_rn_keep_subnormals(err, rcp, q0);
  }
  if (finite) {
    uint32_t w0, w1;
    asm("{\n .reg .b16 lo, hi;\n cvt.rn.satfinite.e4m3x2.f32 lo, %2, %1;\n cvt.rn.satfinite.e4m3x2.f32 hi, %4, %3;\n"
        " mov.b32 %0, {lo, hi};\n}\n"
        : "=r"(w0)
        : "f"(q[0]), "f"(q[1]), "f"(q[2]), "f"(q[3]));
    asm("{\n .reg .b16 lo, hi;\n cvt.rn.satfinite.e4m3x2.f32 lo, %2, %1;\n cvt.rn.satfinite.e4m3x2.f32 hi, %4, %3;\n"
        " mov.b32 %0, {lo, hi};\n}\n"
        : "=r"(w1)
        : "f"(q[4]), "f"(q[5]), "f"(q[6]), "f"(q[7]));
    return make_uint2(w0, w1);
  }
#endif
  // No conversion instruction, or an inf/NaN (whose code keeps x's sign there).
  return e4m3_codes8_exact(v[0], v[1], v[2], v[3], v[4], v[5], v[6], v[7], scale);
}

// float_to_e4m3(x / scale) of two values known finite (fp8_quantize_reg_kernel and the mma kernel check a whole
// block at once), little-endian in the low 16 bits: e4m3_codes8's quotient by three instructions a value. t = q0 scale
// - x is -e (exact, as e is), so RN(q0 - t rcp) = RN(q0 + e rcp); and a zero x keeps its sign without a select: -0
// gives q0 = -0, t = +0, -t rcp + q0 = -0.
__device__ __forceinline__ uint32_t e4m3_codes2_finite(float x0, float x1, float scale, float rcp) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  auto quotient = [&](float x) {
    const float q0 = mul_rn_keep_subnormals(x, rcp);
    const float t = fma_rn_keep_subnormals(q0, scale, -x);
    return fma_rn_keep_subnormals(-t, rcp, q0);
  };
  uint32_t w;
  asm("{\n .reg .b16 lo;\n cvt.rn.satfinite.e4m3x2.f32 lo, %2, %1;\n cvt.u32.u16 %0, lo;\n}\n"
      : "=r"(w)
      : "f"(quotient(x0)), "f"(quotient(x1)));
  return w;
#else
  return uint32_t(float_to_e4m3(__fdiv_rn(x0, scale))) | uint32_t(float_to_e4m3(__fdiv_rn(x1, scale))) << 8;
#endif
}
__device__ __forceinline__ uint2 e4m3_codes8_finite(const float (&v)[8], float scale, float rcp) {
  return make_uint2(e4m3_codes2_finite(v[0], v[1], scale, rcp) | e4m3_codes2_finite(v[2], v[3], scale, rcp) << 16,
                    e4m3_codes2_finite(v[4], v[5], scale, rcp) | e4m3_codes2_finite(v[6], v[7], scale, rcp) << 16);
}

// Per-halfword unsigned maximum (sm_90: one instruction).
__device__ __forceinline__ uint32_t max_u16x2(uint32_t a, uint32_t b) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  uint32_t d;
  asm("max.u16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
  return d;
#else
  return __vmaxu2(a, b);
#endif
}

// The CTA's largest x (every thread gets it); warp_max: kWarps words of shared memory, free on entry (the caller
// syncs before reusing them).
template <int kWarps>
__device__ uint32_t block_max_u32(uint32_t x, uint32_t* warp_max) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  for (int o = 16; o > 0; o /= 2) x = max(x, __shfl_xor_sync(0xffffffffu, x, o));
  if (lane == 0) warp_max[warp] = x;
  __syncthreads();
  x = warp_max[0];
#pragma unroll
  for (int w = 1; w < kWarps; ++w) x = max(x, warp_max[w]);
  return x;
}

// kSlots: rows per thread this instantiation holds (8 for block 128 at headdim <= 128: 32 registers
// of raw values, so more CTAs fit an SM). The transform and the input type are template
// arguments: with them as runtime branches in every slot's unrolled code the kernel was ~39 k
// instructions and stalled on instruction fetch (ncu: no_instruction 18 cycles per issue).
// kKeepTransformed: with the transform at 8 slots, the transformed values stay in registers
// from the amax pass to the code pass (64 floats: 2 CTAs per SM instead of 3) instead of being
// recomputed (the transform's shuffles are most of that kernel's instructions); at 16 slots
// they would not fit.
template <int kSlots, bool kHadamard>
constexpr bool kKeepTransformed = kHadamard && kSlots <= 8;

// kPermuted (no transform; a scale block a multiple of 16 keys or the whole sequence): x_fp8 in the
// keys_permuted16 layout. The item's codes go to shared memory in rows (kSlots x 2 KB, after the prefetch
// buffer; each 8-byte piece XOR-swizzled by its 16-key group so the column reads below hit distinct
// banks), then each thread gathers one 16-key group of one column, in the layout's key order, and
// stores it as 16 bytes (a column's groups are neighbouring threads: contiguous stores).
template <int kSlots, int kThreads = kRegThreads>
constexpr int kRegStageBytes = kSlots * kThreads * 8;

// kThreads: 256, or 512 for the transform's blocks that need more than 8 rows a thread at 256 (headdim 256, or 128
// with blocks over 128 rows): one CTA of 16 warps per SM, so that the transformed values stay in registers (8
// slots) instead of being recomputed for the codes.
template <int kSlots, bool kHadamard, bool kBf16, bool kPermuted = false, int kThreads = kRegThreads>
__global__ void __launch_bounds__(kThreads, kThreads > kRegThreads ? 1 : kSlots <= 8 && !kKeepTransformed<kSlots, kHadamard> ? 3 : 2)
    fp8_quantize_reg_kernel(const Fp8Args a) {
  static_assert(!(kPermuted && kHadamard), "the keys_permuted16 output is built for V (no transform)");
  constexpr bool kKeep = kKeepTransformed<kSlots, kHadamard>;
  const cpu::Fp8QuantizeParams& p = a.p;
  __shared__ float warp_amax[kThreads / 32];
  const int cpr = int(p.headdim / 8);            // chunks per row, <= 32
  const int rows_per_pass = kThreads / cpr;      // rows the CTA holds per register slot
  const int chunk = threadIdx.x % cpr, r0 = threadIdx.x / cpr;
  const bool active = r0 < rows_per_pass;        // cpr * rows_per_pass may be < kThreads (cpr 5, 12, ...)
  // The transform's signs of this chunk's 8 columns, as the sign bits of the raw 16-bit values they flip (an exact
  // negation, one XOR per two values).
  uint4 negate = make_uint4(0, 0, 0, 0);
  if (kHadamard) {
    uint32_t w[4] = {0, 0, 0, 0};
    for (int e = 0; e < 8; ++e) w[e / 2] |= uint32_t(hadamard_sign(p.hadamard_seed, chunk * 8 + e) < 0) << (16 * (e % 2) + 15);
    negate = make_uint4(w[0], w[1], w[2], w[3]);
  }
  const uint16_t* x = static_cast<const uint16_t*>(p.x);
  const int64_t items = p.batch * p.nheads * a.nblocks;
  // The grid is persistent (at most the resident CTAs): the next item's raw values are copied
  // into shared memory (cp.async) while this one is computed, so a CTA's loads, math and stores
  // overlap instead of each item paying a DRAM round trip with the SM's other work in the same
  // phase. Each thread copies only the 16-byte chunks it reads itself: [slot][thread], no barrier.
  extern __shared__ uint4 prefetched[];  // [kSlots][kThreads], then (kPermuted) the item's codes
  uint8_t* const stage = reinterpret_cast<uint8_t*>(prefetched + kSlots * kThreads);
  const int d = int(p.headdim);
  // The swizzle of an 8-byte piece: its index XOR the group's low bits, within a power-of-two row of pieces.
  const int swz = (cpr & (cpr - 1)) == 0 ? (cpr < 8 ? cpr - 1 : 7) : 0;
  struct Item {
    int64_t b, h, s0, bh, blk;
    int nrows, slots;
  };
  auto item_at = [&](int64_t item) {
    Item it;
    uint32_t bh, blk, b, h;
    a.by_blocks.divmod(uint32_t(item), &bh, &blk);
    a.by_heads.divmod(bh, &b, &h);
    it.blk = blk;
    it.bh = bh;
    it.b = b;
    it.h = h;
    it.s0 = it.blk * p.block_size;
    it.nrows = int((it.s0 + p.block_size < p.seqlen ? it.s0 + p.block_size : p.seqlen) - it.s0);
    it.slots = int(a.by_rows_per_pass.div(uint32_t(it.nrows + rows_per_pass - 1)));  // <= kSlots (reg_slots)
    return it;
  };
  const int64_t slot_stride = int64_t(rows_per_pass) * p.x_stride[1];
  auto prefetch = [&](const Item& it) {  // one commit group per item
    const uint16_t* src = x + it.b * p.x_stride[0] + it.h * p.x_stride[2] + (it.s0 + r0) * p.x_stride[1] + chunk * 8;
#pragma unroll
    for (int i = 0; i < kSlots; ++i) {
      const bool ok = active && i < it.slots && r0 + i * rows_per_pass < it.nrows;
      const uint32_t dst = static_cast<uint32_t>(__cvta_generic_to_shared(&prefetched[i * kThreads + threadIdx.x]));
      asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(ok ? src + i * slot_stride : x),
                   "r"(ok ? 16 : 0)
                   : "memory");
    }
    asm volatile("cp.async.commit_group;\n" ::: "memory");
  };
  if (int64_t(blockIdx.x) < items) prefetch(item_at(blockIdx.x));
  for (int64_t item = blockIdx.x; item < items; item += gridDim.x) {
    const Item it = item_at(item);
    const int64_t b = it.b, h = it.h, s0 = it.s0, bh = it.bh, blk = it.blk;
    const int nrows = it.nrows, slots = it.slots;
    auto valid = [&](int i) { return active && r0 + i * rows_per_pass < nrows; };

    asm volatile("cp.async.wait_group 0;\n" ::: "memory");
    uint4 raw[kSlots];
#pragma unroll
    for (int i = 0; i < kSlots; ++i) raw[i] = prefetched[i * kThreads + threadIdx.x];  // zeros where invalid
    if (item + gridDim.x < items) prefetch(item_at(item + gridDim.x));
    // The values the host quantizes, of slot i (every lane of a warp calls it for the same i:
    // the transform's shuffles).
    auto values = [&](int i, float (&v)[8]) {
      if constexpr (kHadamard) {
        const uint4 r = raw[i];
        unpack8<kBf16>(make_uint4(r.x ^ negate.x, r.y ^ negate.y, r.z ^ negate.z, r.w ^ negate.w), v);
#pragma unroll
        for (int hs = 1; hs < 8; hs *= 2)
#pragma unroll
          for (int e = 0; e < 8; ++e)
            if (!(e & hs)) {
              const float x0 = v[e], x1 = v[e + hs];
              v[e] = __fadd_rn(x0, x1);
              v[e + hs] = __fsub_rn(x0, x1);
            }
        for (int m = 1; m < cpr; m *= 2) {  // distance 8 m: the partner chunk is lane ^ m
          // This chunk holds x1 of the pair where chunk & m (x0 - x1 = partner - own): one FMA by +-1
          // gives RN(own + partner) or RN(partner - own), the bits of the add / subtract.
          const float sign = chunk & m ? -1.f : 1.f;
#pragma unroll
          for (int e = 0; e < 8; ++e) v[e] = __fmaf_rn(v[e], sign, __shfl_xor_sync(0xffffffffu, v[e], m));
        }
#pragma unroll
        for (int e = 0; e < 8; ++e) v[e] = __fmul_rn(v[e], a.inv_sqrt_n);
      } else {
        unpack8<kBf16>(raw[i], v);
      }
    };

    // The block's amax from the largest magnitude's bits (non-negative floats order as their bits; the slots past
    // the block hold zeros): 16-bit inputs without the transform two at a time on the raw halves, else the fp32
    // bits. NaN and inf have larger bits than any finite value, so a block holding one is seen here and takes the
    // exact path (the amax of the finite values below, and codes with per-value checks); the others skip every
    // per-value finiteness test.
    float kept[kKeep ? kSlots : 1][8];
    // Slot i's values after the amax pass: kept from it, or recomputed.
    auto slot_values = [&](int i, float (&v)[8]) {
      if constexpr (kKeep) {
#pragma unroll
        for (int e = 0; e < 8; ++e) v[e] = kept[i][e];
      } else {
        values(i, v);
      }
    };
    uint32_t mbits = 0;
#pragma unroll
    for (int i = 0; i < kSlots; ++i) {
      if (i >= slots) break;
      if constexpr (kHadamard) {
        float v[8];
        values(i, v);
#pragma unroll
        for (int e = 0; e < 8; ++e) {
          if constexpr (kKeep) kept[i][e] = v[e];
          mbits = max(mbits, __float_as_uint(v[e]) & 0x7fffffffu);
        }
      } else {
        const uint4 r = raw[i];
        mbits = max_u16x2(mbits, max_u16x2(max_u16x2(r.x & 0x7fff7fffu, r.y & 0x7fff7fffu),
                                           max_u16x2(r.z & 0x7fff7fffu, r.w & 0x7fff7fffu)));
      }
    }
    if constexpr (!kHadamard) mbits = max(mbits & 0xffffu, mbits >> 16);
    mbits = block_max_u32<kThreads / 32>(mbits, reinterpret_cast<uint32_t*>(warp_amax));
    constexpr uint32_t kNonFinite = kHadamard ? 0x7f800000u : kBf16 ? 0x7f80u : 0x7c00u;
    const bool all_finite = mbits < kNonFinite;
    float scale;
    if (all_finite) {
      const float amax = kHadamard ? __uint_as_float(mbits)
                         : kBf16   ? __uint_as_float(mbits << 16)
                                   : __half2float(__ushort_as_half(uint16_t(mbits)));
      scale = amax > 0.f ? fmaxf(__fdiv_rn(amax, kE4M3Max), FLT_MIN) : 1.f;  // block_scale's
      if (threadIdx.x == 0) p.scales[bh * a.nblocks + blk] = scale;
    } else {
      __syncthreads();  // every thread has read warp_amax
      float amax = 0.f;
#pragma unroll
      for (int i = 0; i < kSlots; ++i) {
        if (i >= slots) break;
        float v[8];
        slot_values(i, v);
#pragma unroll
        for (int e = 0; e < 8; ++e) {
          const float m = fabsf(v[e]);
          if (isfinite(m) && m > amax) amax = m;  // NaN/inf left out, as on the host
        }
      }
      scale = block_scale<kThreads / 32>(amax, warp_amax, &p.scales[bh * a.nblocks + blk]);
    }
    const float rcp = __frcp_rn(scale);

    uint8_t* dst = p.x_fp8 + b * p.x_fp8_stride[0] + h * p.x_fp8_stride[2];
    if constexpr (!kPermuted) dst += (s0 + r0) * p.x_fp8_stride[1] + chunk * 8;
    const int64_t dst_slot_stride = kPermuted ? 0 : int64_t(rows_per_pass) * p.x_fp8_stride[1];
    // The codes, with the per-value finiteness test only where the block needs it (two copies of the loop, so
    // that the common one carries no branch per slot).
    auto write_codes = [&](auto finite) {
#pragma unroll
      for (int i = 0; i < kSlots; ++i) {
        if (i >= slots) break;
        float v[8];
        slot_values(i, v);
        if (valid(i)) {
          const uint2 codes = decltype(finite)::value ? e4m3_codes8_finite(v, scale, rcp)
                                                      : e4m3_codes8(v, scale, -scale, rcp);
          if constexpr (kPermuted) {
            const int key = r0 + i * rows_per_pass;  // in the item
            *reinterpret_cast<uint2*>(stage + key * d + ((chunk ^ ((key >> 4) & swz)) << 3)) = codes;
          } else {
            *reinterpret_cast<uint2*>(dst + i * dst_slot_stride) = codes;
          }
        }
      }
    };
    if (all_finite) {
      write_codes(std::true_type{});
    } else {
      write_codes(std::false_type{});
    }
    if constexpr (kPermuted) {
      __syncthreads();  // the item's codes staged
      const int groups = (nrows + 15) / 16;
      const int64_t row_len = p.x_fp8_stride[3];
      // q / groups as umulhi(q, ceil(2^32 / groups)) (one division per item, not two per q): the product's excess
      // over q / groups is below q / 2^32, far under the 1 / groups a floor could cross.
      const uint32_t inv = 0xffffffffu / uint32_t(groups) + 1u;  // ceil(2^32 / groups); 0 (unused) for 1
      for (int q = threadIdx.x; q < d * groups; q += kThreads) {
        const int c = groups == 1 ? q : int(__umulhi(uint32_t(q), inv)), g = q - c * groups;
        const uint8_t* col = stage + g * 16 * d + ((((c >> 3) ^ (g & swz)) << 3) | (c & 7));
        const int keys = nrows - 16 * g;  // keys of this group in the item (>= 16: all)
        auto code = [&](int k) { return k < keys ? uint32_t(col[k * d]) : 0u; };
        uint32_t w[4];
#pragma unroll
        for (int j = 0; j < 4; ++j)  // positions 4j..4j+3 hold keys 2j, 2j+1, 2j+8, 2j+9 (fp8_v_key_position)
          w[j] = code(2 * j) | code(2 * j + 1) << 8 | code(2 * j + 8) << 16 | code(2 * j + 9) << 24;
        *reinterpret_cast<uint4*>(dst + c * row_len + s0 + 16 * g) = make_uint4(w[0], w[1], w[2], w[3]);
      }
      if (blk == a.nblocks - 1) {  // the groups past the last key, up to L: 0
        const int64_t first = (p.seqlen + 15) / 16 * 16, extra = (row_len - first) / 16;
        for (int64_t q = threadIdx.x; q < d * extra; q += kThreads)
          *reinterpret_cast<uint4*>(dst + (q / extra) * row_len + first + 16 * (q % extra)) = make_uint4(0, 0, 0, 0);
      }
    }
    __syncthreads();  // warp_amax (and the staged codes) are rewritten by the next item
  }
}

// The rows per thread fp8_quantize_reg_kernel needs for p, or 0 where it cannot take p: it takes
// 16-bit input, headdim a multiple of 8 up to 256, contiguous 16-byte aligned input rows and
// 8-byte aligned output rows, a scale block of at most kRegMaxRows rows per thread (block_size
// 128 up to headdim 256; the transform needs a power-of-two headdim, already checked).
int reg_slots(const cpu::Fp8QuantizeParams& p) {
  if (p.dtype != FLASHATTN_DTYPE_FP16 && p.dtype != FLASHATTN_DTYPE_BF16) return 0;
  if (p.headdim < 8 || p.headdim % 8 != 0 || p.headdim > 256 || p.x_stride[3] != 1) return 0;
  if (reinterpret_cast<uintptr_t>(p.x) % 16 != 0) return 0;
  for (int i = 0; i < 3; ++i)
    if (p.x_stride[i] % 8 != 0) return 0;
  if (p.keys_permuted16) {
    // Items start on a 16-key group; 16-byte stores (L is a multiple of 16).
    if (p.hadamard || (p.block_size % 16 != 0 && p.block_size < p.seqlen)) return 0;
    if (reinterpret_cast<uintptr_t>(p.x_fp8) % 16 != 0 || p.x_fp8_stride[0] % 16 != 0 || p.x_fp8_stride[2] % 16 != 0)
      return 0;
  } else {
    if (p.x_fp8_stride[3] != 1 || reinterpret_cast<uintptr_t>(p.x_fp8) % 8 != 0) return 0;
    for (int i = 0; i < 3; ++i)
      if (p.x_fp8_stride[i] % 8 != 0) return 0;
  }
  if (p.batch * p.nheads * cpu::fp8_num_blocks(p.seqlen, p.block_size) >= (int64_t(1) << 31)) return 0;  // FastDiv
  const int64_t rows = p.block_size < p.seqlen ? p.block_size : p.seqlen;
  const int64_t rows_per_pass = kRegThreads / (p.headdim / 8);
  const int64_t slots = (rows + rows_per_pass - 1) / rows_per_pass;
  return slots > kRegMaxRows ? 0 : slots <= 8 ? 8 : kRegMaxRows;
}

// The register kernel's instantiation for (slots, transform, dtype), launched on a persistent grid
// (its resident CTAs, from an occupancy query made once per device and instantiation) of at most
// `items` CTAs, with its prefetch buffer as dynamic shared memory.
template <int kSlots, bool kHadamard, bool kBf16, bool kPermuted = false, int kThreads = kRegThreads>
cudaError_t launch_reg_kernel(int64_t items, Fp8Args a, cudaStream_t stream) {
  auto kernel = fp8_quantize_reg_kernel<kSlots, kHadamard, kBf16, kPermuted, kThreads>;
  constexpr int kSmem = kSlots * kThreads * int(sizeof(uint4)) + (kPermuted ? kRegStageBytes<kSlots, kThreads> : 0);
  a.by_rows_per_pass = FastDiv::make(uint32_t(kThreads / (a.p.headdim / 8)));
  constexpr int kMaxDevices = 64;
  static std::atomic<int> resident[kMaxDevices];
  int dev = 0;
  cudaError_t e = cudaGetDevice(&dev);
  if (e != cudaSuccess) return e;
  int ctas = dev < kMaxDevices ? resident[dev].load(std::memory_order_relaxed) : 0;
  if (ctas == 0) {
    int sms = 0, per_sm = 0;
    // Always: dynamic + static shared memory over 48 KB needs it (the 8-slot keys_permuted16 kernel has 48 KB
    // dynamic alone), and below that it is harmless.
    if ((e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem)) != cudaSuccess) return e;
    if ((e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev)) != cudaSuccess) return e;
    if ((e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kThreads, kSmem)) != cudaSuccess)
      return e;
    ctas = std::max(1, sms * per_sm);
    if (dev < kMaxDevices) resident[dev].store(ctas, std::memory_order_relaxed);
  }
  const unsigned grid = unsigned(std::min<int64_t>(items, ctas));
  kernel<<<grid, kThreads, kSmem, stream>>>(a);
  return cudaGetLastError();
}
template <int kSlots, bool kHadamard>
cudaError_t launch_reg_kernel(bool bf16, int64_t items, const Fp8Args& a, cudaStream_t stream) {
  return bf16 ? launch_reg_kernel<kSlots, kHadamard, true>(items, a, stream)
              : launch_reg_kernel<kSlots, kHadamard, false>(items, a, stream);
}
cudaError_t launch_reg_kernel(int slots, bool hadamard, bool bf16, int64_t items, const Fp8Args& a,
                              cudaStream_t stream) {
  if (a.p.keys_permuted16) {  // reg_slots: no transform
    if (slots == 8)
      return bf16 ? launch_reg_kernel<8, false, true, true>(items, a, stream)
                  : launch_reg_kernel<8, false, false, true>(items, a, stream);
    return bf16 ? launch_reg_kernel<kRegMaxRows, false, true, true>(items, a, stream)
                : launch_reg_kernel<kRegMaxRows, false, false, true>(items, a, stream);
  }
  if (slots == 8)
    return hadamard ? launch_reg_kernel<8, true>(bf16, items, a, stream) : launch_reg_kernel<8, false>(bf16, items, a, stream);
  if (hadamard)  // 8 rows a thread at 512 threads (reg_slots: 16 at 256)
    return bf16 ? launch_reg_kernel<8, true, true, false, 2 * kRegThreads>(items, a, stream)
                : launch_reg_kernel<8, true, false, false, 2 * kRegThreads>(items, a, stream);
  return launch_reg_kernel<kRegMaxRows, false>(bf16, items, a, stream);
}

// Whether fp8_quantize_vec_kernel can take p: no transform, 16-bit input, contiguous 16-byte
// aligned input rows and 8-byte aligned output rows.
bool vec_path_ok(const cpu::Fp8QuantizeParams& p) {
  if (p.keys_permuted16) return false;
  if (p.hadamard || (p.dtype != FLASHATTN_DTYPE_FP16 && p.dtype != FLASHATTN_DTYPE_BF16)) return false;
  if (p.headdim % 8 != 0 || p.x_stride[3] != 1 || p.x_fp8_stride[3] != 1) return false;
  if (reinterpret_cast<uintptr_t>(p.x) % 16 != 0 || reinterpret_cast<uintptr_t>(p.x_fp8) % 8 != 0) return false;
  for (int i = 0; i < 3; ++i)
    if (p.x_stride[i] % 8 != 0 || p.x_fp8_stride[i] % 8 != 0) return false;
  return true;
}

// flashattn_fp8_v_keys_permuted16: a tiled transpose of bytes through shared memory. A tile is 64
// keys x 64 head-dim columns of one (batch, head): read as 64-byte row pieces (16-byte loads where v
// allows), written as 64-byte pieces of the columns' rows, keys already permuted (a tile starts on a
// multiple of 64 keys, so each group of 16 keys stays inside it). Positions from seqlen to L get 0.
// Measured before it: torch's scatter took 850 us at 16k tokens x 2048 columns (H200), more than the
// V^T kernel saves.
constexpr int kPermTile = 64;
constexpr int kPermThreads = 128;
constexpr int kPermRow = kPermTile + 16;  // a column's smem row: 16-byte aligned, padded

template <bool kVecLoads>
__global__ void __launch_bounds__(kPermThreads) fp8_v_permute_kernel(const cpu::Fp8VPermuteParams p,
                                                                     int64_t tiles_k, int64_t tiles_c) {
  __shared__ __align__(16) uint8_t tile[kPermTile][kPermRow];  // [column][position in the tile]
  constexpr int kChunks = kPermTile * kPermTile / 16;
  const int64_t items = p.batch * p.nheads * tiles_c * tiles_k;
  for (int64_t item = blockIdx.x; item < items; item += gridDim.x) {
    const int64_t tk = item % tiles_k, rest = item / tiles_k;
    const int64_t tc = rest % tiles_c, bh = rest / tiles_c;
    const int64_t b = bh / p.nheads, h = bh % p.nheads;
    const int64_t s0 = tk * kPermTile, c0 = tc * kPermTile;
    const uint8_t* src = p.v + b * p.v_stride[0] + h * p.v_stride[2] + c0;
    for (int chunk = threadIdx.x; chunk < kChunks; chunk += kPermThreads) {
      const int k = chunk / 4, cc = chunk % 4 * 16;  // the key in the tile, the chunk's first column
      const int64_t s = s0 + k;
      uint4 w = make_uint4(0, 0, 0, 0);
      uint8_t* v = reinterpret_cast<uint8_t*>(&w);
      if (s < p.seqlen) {
        const uint8_t* row = src + s * p.v_stride[1] + cc;
        if constexpr (kVecLoads) {
          if (c0 + cc < p.headdim) w = *reinterpret_cast<const uint4*>(row);
        } else {
#pragma unroll
          for (int i = 0; i < 16; ++i)
            if (c0 + cc + i < p.headdim) v[i] = row[i];
        }
      }
      const int pos = fp8_v_key_position(k);
#pragma unroll
      for (int i = 0; i < 16; ++i) tile[cc + i][pos] = v[i];
    }
    __syncthreads();
    uint8_t* dst = p.out + b * p.out_stride[0] + h * p.out_stride[1];
    for (int chunk = threadIdx.x; chunk < kChunks; chunk += kPermThreads) {
      const int c = chunk / 4, q = chunk % 4 * 16;
      if (c0 + c < p.headdim && s0 + q < p.row_len)
        *reinterpret_cast<uint4*>(dst + (c0 + c) * p.row_len + s0 + q) = *reinterpret_cast<const uint4*>(&tile[c][q]);
    }
    __syncthreads();  // the tile is rewritten by the next item
  }
}

}  // namespace

flashattn_status fp8_v_keys_permuted16(const cpu::Fp8VPermuteParams& p, void* stream) {
  const int64_t tiles_k = (p.row_len + kPermTile - 1) / kPermTile, tiles_c = (p.headdim + kPermTile - 1) / kPermTile;
  const int64_t items = p.batch * p.nheads * tiles_c * tiles_k;
  if (items == 0) return FLASHATTN_SUCCESS;
  const unsigned grid = unsigned(items < (int64_t(1) << 20) ? items : (int64_t(1) << 20));
  bool vec = p.headdim % 16 == 0 && reinterpret_cast<uintptr_t>(p.v) % 16 == 0;
  for (int i = 0; i < 3; ++i) vec = vec && p.v_stride[i] % 16 == 0;
  if (vec) {
    fp8_v_permute_kernel<true><<<grid, kPermThreads, 0, static_cast<cudaStream_t>(stream)>>>(p, tiles_k, tiles_c);
  } else {
    fp8_v_permute_kernel<false><<<grid, kPermThreads, 0, static_cast<cudaStream_t>(stream)>>>(p, tiles_k, tiles_c);
  }
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess)
    return set_error(FLASHATTN_ERROR_CUDA, "fp8_v_keys_permuted16 kernel launch: %s", cudaGetErrorString(e));
  return FLASHATTN_SUCCESS;
}

flashattn_status fp8_quantize(const cpu::Fp8QuantizeParams& p, void* stream) {
  if (p.dtype != FLASHATTN_DTYPE_FP16 && p.dtype != FLASHATTN_DTYPE_BF16 && p.dtype != FLASHATTN_DTYPE_FP32)
    return set_error(FLASHATTN_ERROR_NOT_SUPPORTED,
                     "dtype: FP8 quantization of CUDA tensors takes fp16, bf16 or fp32 (fp64: host tensors only)");
  if (p.hadamard && !hadamard_dim_supported(p.headdim))
    return set_error(FLASHATTN_ERROR_INVALID_ARGUMENT, "hadamard: headdim %lld unsupported", (long long)p.headdim);
  Fp8Args a;
  a.p = p;
  a.nblocks = cpu::fp8_num_blocks(p.seqlen, p.block_size);
  a.inv_sqrt_n = p.hadamard ? float(1.0 / std::sqrt(double(p.headdim))) : 1.f;
  const int64_t items = p.batch * p.nheads * a.nblocks;
  if (items == 0) return FLASHATTN_SUCCESS;
  const unsigned grid = unsigned(items < (int64_t(1) << 20) ? items : (int64_t(1) << 20));
  const int slots = reg_slots(p);
  if (slots != 0) {
    a.by_blocks = FastDiv::make(uint32_t(a.nblocks));
    a.by_heads = FastDiv::make(uint32_t(p.nheads));
    const cudaError_t e = launch_reg_kernel(slots, p.hadamard != 0, p.dtype == FLASHATTN_DTYPE_BF16, items, a,
                                            static_cast<cudaStream_t>(stream));
    if (e != cudaSuccess)
      return set_error(FLASHATTN_ERROR_CUDA, "fp8_quantize kernel launch: %s", cudaGetErrorString(e));
    return FLASHATTN_SUCCESS;
  } else if (vec_path_ok(p)) {
    fp8_quantize_vec_kernel<<<grid, kVecThreads, 0, static_cast<cudaStream_t>(stream)>>>(a);
  } else {
    fp8_quantize_kernel<<<grid, kThreads, 0, static_cast<cudaStream_t>(stream)>>>(a);
  }
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess)
    return set_error(FLASHATTN_ERROR_CUDA, "fp8_quantize kernel launch: %s", cudaGetErrorString(e));
  return FLASHATTN_SUCCESS;
}

}  // namespace flashattn::cuda
