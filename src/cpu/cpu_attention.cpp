#include "cpu/cpu_attention.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "common/alibi.h"
#include "common/dropout.h"
#include "common/error.h"
#include "common/half_convert.h"
#include "common/kv_append.h"
#include "common/mask.h"
#include "common/softmax.h"
#include "common/parallel.h"

// The hot functions are compiled for AVX-512 and AVX2+FMA as well as baseline x86-64, picked
// at load time (GCC ifunc), so a generic build still runs at full width on the host CPU.
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__linux__)
#define FA_CPU_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define FA_CPU_CLONES
#endif
#if defined(__GNUC__)
#define FA_INLINE inline __attribute__((always_inline))
#else
#define FA_INLINE inline
#endif

namespace flashattn::cpu {
namespace {

constexpr int kMR = 4;   // micro-kernel rows
constexpr int kNR = 16;  // micro-kernel columns (one zmm / two ymm)

int round_up(int x, int m) { return (x + m - 1) / m * m; }

// C[m x n] (+)= A[m x k] * B[k x n], row-major with leading dimensions; m % kMR == 0 and
// n % kNR == 0 (tiles are padded). An MR x (NV * 16) accumulator block stays in registers, one
// or two 16-float vectors per row (a zmm each, or two ymm / four xmm, whatever the clone's
// target has). Every C element sums over p in order whatever the block shape, so the shape
// never changes a result.
#if defined(__GNUC__)
typedef float VecN __attribute__((vector_size(kNR * sizeof(float))));
typedef float VecNu __attribute__((vector_size(kNR * sizeof(float)), aligned(4), may_alias));

template <int MR, int NV>
FA_INLINE void gemm_block(int k, const float* __restrict A, int lda, const float* __restrict B, int ldb,
                          float* __restrict C, int ldc, bool accumulate) {
  VecN acc[MR][NV];
  for (int r = 0; r < MR; ++r)
    for (int v = 0; v < NV; ++v)
      acc[r][v] = accumulate ? *reinterpret_cast<const VecNu*>(C + r * ldc + v * kNR) : VecN{};
  for (int p = 0; p < k; ++p) {
    VecN b[NV];
    for (int v = 0; v < NV; ++v) b[v] = *reinterpret_cast<const VecNu*>(B + p * ldb + v * kNR);
    for (int r = 0; r < MR; ++r) {
      const float a = A[r * lda + p];
      for (int v = 0; v < NV; ++v) acc[r][v] += a * b[v];
    }
  }
  for (int r = 0; r < MR; ++r)
    for (int v = 0; v < NV; ++v) *reinterpret_cast<VecNu*>(C + r * ldc + v * kNR) = acc[r][v];
}

// Whether the host runs the AVX-512 clone: 32 zmm registers hold an 8 x 32 block (16 FMA chains,
// enough to cover the FMA latency on two ports; 4 x 16 had 4). The other clones keep 4 x 16
// (8 ymm accumulators under AVX2). A wrong guess costs speed only: every clone runs either.
inline const bool kWideGemm = [] {
#if defined(__x86_64__) && !defined(__clang__)
  __builtin_cpu_init();
  return __builtin_cpu_supports("x86-64-v4") != 0;
#else
  return false;
#endif
}();

FA_INLINE void gemm(int m, int n, int k, const float* A, int lda, const float* B, int ldb, float* C, int ldc,
                    bool accumulate) {
  int i = 0;
  if (kWideGemm) {
    for (; i + 8 <= m; i += 8) {
      int j = 0;
      for (; j + 2 * kNR <= n; j += 2 * kNR)
        gemm_block<8, 2>(k, A + i * lda, lda, B + j, ldb, C + i * ldc + j, ldc, accumulate);
      for (; j < n; j += kNR) gemm_block<8, 1>(k, A + i * lda, lda, B + j, ldb, C + i * ldc + j, ldc, accumulate);
    }
  }
  for (; i < m; i += kMR)
    for (int j = 0; j < n; j += kNR)
      gemm_block<kMR, 1>(k, A + i * lda, lda, B + j, ldb, C + i * ldc + j, ldc, accumulate);
}
#else
FA_INLINE void gemm(int m, int n, int k, const float* A, int lda, const float* B, int ldb, float* C, int ldc,
                    bool accumulate) {
  for (int i = 0; i < m; ++i)
    for (int j = 0; j < n; ++j) {
      float acc = accumulate ? C[i * ldc + j] : 0.f;
      for (int p = 0; p < k; ++p) acc += A[i * lda + p] * B[p * ldb + j];
      C[i * ldc + j] = acc;
    }
}
#endif

// 2^x to ~1 ulp, branch-free so the loops around it vectorize (libm's exp2f does not).
// 2^x = 2^n * 2^f with n = round(x), |f| <= 1/2, 2^f by its degree-7 Taylor polynomial
// (truncation < 1e-8 relative). Underflows to 0 below 2^-126, so exp2(-inf) = 0; NaN stays NaN.
FA_INLINE float fast_exp2(float x) {
  float xc = x > -127.f ? x : -127.f;
  xc = xc < 127.f ? xc : 127.f;
  const float n = (xc + 12582912.f) - 12582912.f;  // round to nearest (1.5 * 2^23 trick)
  const float f = xc - n;
  float p = 1.525273380405984e-05f;
  p = p * f + 1.5403530393381608e-04f;
  p = p * f + 1.3333558146428443e-03f;
  p = p * f + 9.618129107628477e-03f;
  p = p * f + 5.550410866482158e-02f;
  p = p * f + 2.402265069591007e-01f;
  p = p * f + 6.931471805599453e-01f;
  p = p * f + 1.f;
  const float r = p * bits_float(uint32_t(int32_t(n) + 127) << 23);
  return x < -126.f ? 0.f : (x == x ? r : x);
}

// Loads `rows` rows of `d` elements (row r at base + off(r)) as fp32 into dst[r * ld + c].
template <typename Off>
FA_INLINE void load_rows(const void* base, flashattn_dtype dtype, int rows, int d, Off off, float* dst, int ld) {
  for (int r = 0; r < rows; ++r) {
    const int64_t o = off(r);
    float* out = dst + size_t(r) * ld;
    switch (dtype) {
      case FLASHATTN_DTYPE_FP16: {
        const uint16_t* s = static_cast<const uint16_t*>(base) + o;
        for (int c = 0; c < d; ++c) out[c] = half_to_float(s[c]);
        break;
      }
      case FLASHATTN_DTYPE_BF16: {
        const uint16_t* s = static_cast<const uint16_t*>(base) + o;
        for (int c = 0; c < d; ++c) out[c] = bf16_to_float(s[c]);
        break;
      }
      case FLASHATTN_DTYPE_FP32: std::memcpy(out, static_cast<const float*>(base) + o, sizeof(float) * d); break;
      default: {
        const double* s = static_cast<const double*>(base) + o;
        for (int c = 0; c < d; ++c) out[c] = float(s[c]);
      }
    }
  }
}

// Same, transposed: dst[c * ld + r] (rows <= kBlockN). Converts a row at a time into `tmp`
// (at least d floats) so the conversion vectorizes, then scatters it.
template <typename Off>
FA_INLINE void load_rows_t(const void* base, flashattn_dtype dtype, int rows, int d, Off off, float* dst, int ld,
                           float* tmp) {
  for (int r = 0; r < rows; ++r) {
    load_rows(base, dtype, 1, d, [&](int) { return off(r); }, tmp, d);
    for (int c = 0; c < d; ++c) dst[size_t(c) * ld + r] = tmp[c];
  }
}

// Stores src[r * ld + c] * row_scale[r] for r < rows, c < d.
template <typename Off>
FA_INLINE void store_rows(void* base, flashattn_dtype dtype, int rows, int d, Off off, const float* src, int ld,
                          const float* row_scale, float scale) {
  for (int r = 0; r < rows; ++r) {
    const int64_t o = off(r);
    const float* in = src + size_t(r) * ld;
    const float sc = (row_scale ? row_scale[r] : 1.f) * scale;
    switch (dtype) {
      case FLASHATTN_DTYPE_FP16: {
        uint16_t* dst = static_cast<uint16_t*>(base) + o;
        for (int c = 0; c < d; ++c) dst[c] = float_to_half(in[c] * sc);
        break;
      }
      case FLASHATTN_DTYPE_BF16: {
        uint16_t* dst = static_cast<uint16_t*>(base) + o;
        for (int c = 0; c < d; ++c) dst[c] = float_to_bf16(in[c] * sc);
        break;
      }
      case FLASHATTN_DTYPE_FP32: {
        float* dst = static_cast<float*>(base) + o;
        for (int c = 0; c < d; ++c) dst[c] = in[c] * sc;
        break;
      }
      default: {
        double* dst = static_cast<double*>(base) + o;
        for (int c = 0; c < d; ++c) dst[c] = double(in[c] * sc);
      }
    }
  }
}

// Zero-filled fp32 tile buffer.
std::vector<float> tile(int rows, int cols) { return std::vector<float>(size_t(rows) * cols, 0.f); }

// Work items: (sequence, block) pairs in reverse block order, so the long rows of a causal
// mask start first and the short ones fill the gaps.
std::vector<std::pair<int, int>> blocks(const Shape& sh, const int32_t* cu_q, const int32_t* cu_k, bool by_keys,
                                        int block) {
  std::vector<std::pair<int, int>> out;
  for (int b = 0; b < sh.batch; ++b) {
    const SeqBounds sb = seq_bounds(sh, cu_q, cu_k, b);
    const int len = by_keys ? sb.seqlen_k : sb.seqlen_q;
    for (int x = (len + block - 1) / block - 1; x >= 0; --x) out.emplace_back(b, x);
  }
  return out;
}

// ---- ALiBi and dropout ---------------------------------------------------------------------

// Whole 16 x 16 blocks per tile, so each 8-entry dropout unit lies in one tile (a tile starts at
// a multiple of 16 in both directions).
static_assert(kBlockM % 16 == 0 && kBlockN % 16 == 0, "tiles must hold whole dropout units");

// Seed and offset as the call sees them, read once per call (rng_state: a host pointer here).
using Rng = Dropout::SeedOffset;

// The score modifiers of one (sequence b, query head h). Off (both false) costs nothing per
// element: the tile loops test the flags once per row.
struct Mods {
  bool alibi = false;
  float slope = 0.f;   // ALiBi slope (natural-log units)
  float slope2 = 0.f;  // slope * log2(e): the bias in the exp2 domain of the tiles
  int diag = 0;        // seqlen_k - seqlen_q of the sequence
  bool dropout = false;
  float dscale = 1.f;  // 1 / keep probability
  uint32_t threshold = 0;  // kept iff the entry's 16-bit number >= threshold
  uint64_t seed = 0, stream = 0;
};

template <class P>
Mods make_mods(const P& p, const Rng& rng, const Mask& mask, int b, int h) {
  Mods m;
  if (p.alibi.enabled()) {
    m.alibi = true;
    m.slope = p.alibi.slope(b, h);
    m.slope2 = m.slope * kLog2e;
    m.diag = mask.diagonal_offset();
  }
  if (p.dropout.enabled()) {
    m.dropout = true;
    m.dscale = p.dropout.scale;
    m.threshold = p.dropout.threshold;
    m.seed = rng.seed;
    m.stream = Dropout::stream(rng.offset, b, p.shape.nheads_q, h);
  }
  return m;
}

// ALiBi in fp32 without large exponents: row i's bias -slope * |i + diag - j| is split into the
// row constant R_i = -slope * dmin_i (dmin_i: the distance of the row's nearest visible key) and
// the rest, -slope * (|i + diag - j| - dmin_i) <= 0, which the tiles add. Softmax ignores a row
// constant; the LSE gets R_i added in fp64 at the end (the backward takes it off in fp64). So
// no exponent is ever as large as the bias of a row far from the diagonal (|LSE| ~ slope * sq
// when sq > sk), whose fp32 rounding would cost P several units of 1e-5.
FA_INLINE int alibi_dmin(const Mask& mask, int i) {
  const int c = i + mask.diagonal_offset(), kb = mask.key_begin(i), ke = mask.key_end(i);
  if (ke <= kb) return 0;
  return c < kb ? kb - c : (c >= ke ? c - (ke - 1) : 0);
}
FA_INLINE double alibi_row_constant(const Mods& m, int dmin) { return -double(m.slope) * double(dmin); }

// Adds the ALiBi bias (exp2 domain, relative to row i's constant: see alibi_dmin) to s[0, bn),
// the scores of keys col0 + j already multiplied by exp2_scale.
FA_INLINE void add_alibi_row(const Mods& m, int i, int dmin, int col0, int bn, float* s) {
  const int d0 = i + m.diag - col0;  // |d0 - j| = |i + diag - (col0 + j)|
  for (int j = 0; j < bn; ++j) s[j] -= m.slope2 * float(std::abs(d0 - j) - dmin);
}

// Philox4x32-10 (common/philox.h) of the 16 counters {c0 + u, c1, c2, c3}, u < 16, under one key,
// lane-parallel: one vector op per step for the 16 lanes (the widening multiplies included), so
// each clone runs the rounds at its vector width. tests/test_dropout.cpp checks the masks built
// from it against Dropout::keep.
constexpr int kUnitsPerRow = kBlockN / 4;  // units across a tile row: 4 per 16 keys
#if defined(__GNUC__)
typedef uint32_t U32v __attribute__((vector_size(kUnitsPerRow * sizeof(uint32_t))));
typedef uint64_t U64v __attribute__((vector_size(kUnitsPerRow * sizeof(uint64_t))));
FA_INLINE void philox_lanes(uint32_t c0, uint32_t c1, uint32_t c2, uint32_t c3, uint32_t k0, uint32_t k1,
                            uint32_t (*out)[kUnitsPerRow]) {
  U32v x0, x1 = U32v{} + c1, x2 = U32v{} + c2, x3 = U32v{} + c3;
  for (int u = 0; u < kUnitsPerRow; ++u) x0[u] = c0 + uint32_t(u);
  for (int r = 0; r < 10; ++r) {
    const U64v p0 = __builtin_convertvector(x0, U64v) * uint64_t(0xD2511F53u);
    const U64v p1 = __builtin_convertvector(x2, U64v) * uint64_t(0xCD9E8D57u);
    x0 = __builtin_convertvector(p1 >> 32, U32v) ^ x1 ^ k0;
    x2 = __builtin_convertvector(p0 >> 32, U32v) ^ x3 ^ k1;
    x1 = __builtin_convertvector(p1, U32v);
    x3 = __builtin_convertvector(p0, U32v);
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  std::memcpy(out[0], &x0, sizeof(x0));
  std::memcpy(out[1], &x1, sizeof(x1));
  std::memcpy(out[2], &x2, sizeof(x2));
  std::memcpy(out[3], &x3, sizeof(x3));
}
#else
FA_INLINE void philox_lanes(uint32_t c0, uint32_t c1, uint32_t c2, uint32_t c3, uint32_t k0, uint32_t k1,
                            uint32_t (*out)[kUnitsPerRow]) {
  for (int u = 0; u < kUnitsPerRow; ++u) {
    const Philox4 r = philox4x32_10(c0 + uint32_t(u), c1, c2, c3, k0, k1);
    for (int w = 0; w < 4; ++w) out[w][u] = r.x[w];
  }
}
#endif

// Keep mask of the tile rows [row0, row0 + bm) x keys [col0, col0 + kBlockN) (both starts
// multiples of 16): keep[r * kBlockN + j] = 1 or 0, exactly Dropout::keep(seed, stream, row0 + r,
// col0 + j) (entries past the tile's last row or key are written too, and never read). One
// Philox per 8-entry unit: rows i0 and i0 + 8 (i0 % 16 < 8) share their units, whose unit
// columns are consecutive from unit_col(col0); Dropout::lane puts unit u's words 0/1 in row i0,
// words 2/3 in row i0 + 8, word 0/2 at keys j0, j0 + 1 (low, high half) and word 1/3 at j0 + 8,
// j0 + 9, with j0 = 16 * (u / 4) + 2 * (u % 4).
FA_CPU_CLONES void dropout_keep_tile(const Mods& m, int row0, int bm, int col0, uint8_t* keep) {
  const uint32_t t = m.threshold;
  uint32_t bits[4][kUnitsPerRow];
  for (int rg = 0; rg < bm; rg += 16)
    for (int r = rg; r < rg + 8 && r < bm; ++r) {
      philox_lanes(Dropout::unit_col(col0), Dropout::unit_row(row0 + r), uint32_t(m.stream),
                   uint32_t(m.stream >> 32), uint32_t(m.seed), uint32_t(m.seed >> 32), bits);
      uint8_t* k0 = keep + size_t(r) * kBlockN;  // row i0
      uint8_t* k8 = k0 + size_t(8) * kBlockN;    // row i0 + 8 (inside the buffer: r + 8 < kBlockM)
      for (int g = 0; g < kBlockN / 16; ++g)
        for (int c = 0; c < 8; ++c) {
          const int u = 4 * g + (c >> 1), sh = (c & 1) * 16;
          k0[16 * g + c] = ((bits[0][u] >> sh) & 0xffffu) >= t;
          k0[16 * g + 8 + c] = ((bits[1][u] >> sh) & 0xffffu) >= t;
          k8[16 * g + c] = ((bits[2][u] >> sh) & 0xffffu) >= t;
          k8[16 * g + 8 + c] = ((bits[3][u] >> sh) & 0xffffu) >= t;
        }
    }
}

// ---- forward -------------------------------------------------------------------------------

struct FwdScratch {
  int dp;  // headdim padded to kNR
  std::vector<float> q, kt, v, s, acc, inv, row;
  std::vector<OnlineSoftmaxRow> rows;
  std::vector<int> dmin;      // ALiBi: each row's alibi_dmin
  std::vector<uint8_t> keep;  // dropout keep mask of a tile
  explicit FwdScratch(int d)
      : dp(round_up(d, kNR)),
        q(tile(kBlockM, dp)),
        kt(tile(dp, kBlockN)),
        v(tile(kBlockN, dp)),
        s(tile(kBlockM, kBlockN)),
        acc(tile(kBlockM, dp)),
        inv(size_t(kBlockM)),
        row(size_t(dp)),
        rows(size_t(kBlockM)),
        dmin(size_t(kBlockM), 0),
        keep(size_t(kBlockM) * kBlockN, 0) {}
};

FA_CPU_CLONES void fwd_block(const FwdParams& p, const Rng& rng, int b, int h, int mb, FwdScratch& w) {
  const Shape& sh = p.shape;
  const int d = sh.headdim, dp = w.dp, kvh = sh.kv_head(h);
  const SeqBounds sb = seq_bounds(sh, p.cu_seqlens_q, p.cu_seqlens_k, p.kv, b);
  const Mask mask = make_mask(p.mask, sb);
  const ScoreTransform tr = ScoreTransform::make(p.mask.softmax_scale, p.mask.softcap);
  const int row0 = mb * kBlockM;
  const int bm = sb.seqlen_q - row0 < kBlockM ? sb.seqlen_q - row0 : kBlockM;
  const int bm4 = round_up(bm, kMR);
  const Mods mods = make_mods(p, rng, mask, b, h);
  // With ALiBi the scores are moved to the exp2 domain (and biased) before the max loop.
  const float mul = mods.alibi ? 1.f : tr.exp2_scale;

  load_rows(p.q, p.dtype, bm, d, [&](int r) { return row_offset(p.q_stride, b, sb.q_offset, row0 + r, h); },
            w.q.data(), dp);
  if (p.kv.rotary()) {  // the host paths' one rotation (common/kv_append.h), rounded to the dtype
    std::vector<double> x(static_cast<size_t>(d));
    for (int r = 0; r < bm; ++r) {
      float* row = w.q.data() + size_t(r) * dp;
      for (int c = 0; c < d; ++c) x[size_t(c)] = double(row[c]);
      rotate_row_fp64(p.kv, p.dtype, p.dtype, p.kv.q_position(b, row0 + r), x.data());
      for (int c = 0; c < d; ++c) row[c] = float(x[size_t(c)]);
    }
  }
  std::fill(w.q.begin() + size_t(bm) * dp, w.q.begin() + size_t(bm4) * dp, 0.f);
  std::fill(w.acc.begin(), w.acc.begin() + size_t(bm4) * dp, 0.f);
  for (int r = 0; r < bm; ++r) w.rows[r].init();
  if (mods.alibi)
    for (int r = 0; r < bm; ++r) w.dmin[r] = alibi_dmin(mask, row0 + r);

  int n_begin, n_end;
  mask.key_block_range(row0, bm, kBlockN, &n_begin, &n_end);
  for (int nb = n_begin; nb < n_end; ++nb) {
    const int col0 = nb * kBlockN;
    const int bn = sb.seqlen_k - col0 < kBlockN ? sb.seqlen_k - col0 : kBlockN;
    const int bn16 = round_up(bn, kNR);
    auto k_off = [&](int r) { return key_offset(p.k_stride, p.kv, b, sb, col0 + r, kvh); };
    auto v_off = [&](int r) { return key_offset(p.v_stride, p.kv, b, sb, col0 + r, kvh); };
    load_rows_t(p.k, p.dtype, bn, d, k_off, w.kt.data(), kBlockN, w.row.data());
    for (int c = 0; c < d; ++c)
      for (int j = bn; j < bn16; ++j) w.kt[size_t(c) * kBlockN + j] = 0.f;
    load_rows(p.v, p.dtype, bn, d, v_off, w.v.data(), dp);

    // S = Q K^T.
    gemm(bm4, bn16, d, w.q.data(), dp, w.kt.data(), kBlockN, w.s.data(), kBlockN, false);

    // Online softmax, row by row. Interior tiles skip the per-element mask.
    const bool need_mask = mask.tile_needs_mask(row0, bm, col0, bn);
    for (int r = 0; r < bm; ++r) {
      float* s = w.s.data() + size_t(r) * kBlockN;
      if (tr.softcap > 0.f)
        for (int j = 0; j < bn; ++j) s[j] = tr.apply(s[j]);
      if (mods.alibi) {  // after the softcap, before the mask
        for (int j = 0; j < bn; ++j) s[j] *= tr.exp2_scale;
        add_alibi_row(mods, row0 + r, w.dmin[r], col0, bn, s);
      }
      int jb = 0, je = bn;
      if (need_mask) {
        jb = mask.key_begin(row0 + r) - col0;
        je = mask.key_end(row0 + r) - col0;
        jb = jb < 0 ? 0 : (jb > bn ? bn : jb);
        je = je < jb ? jb : (je > bn ? bn : je);
      }
      float mx[kNR];
      for (int c = 0; c < kNR; ++c) mx[c] = -INFINITY;
      for (int j = 0; j < bn16; j += kNR)
        for (int c = 0; c < kNR; ++c) {
          const int jj = j + c;
          const float t = (jj >= jb && jj < je) ? s[jj] * mul : -INFINITY;
          s[jj] = t;
          mx[c] = t > mx[c] ? t : mx[c];
        }
      float tile_max = -INFINITY;
      for (int c = 0; c < kNR; ++c) tile_max = mx[c] > tile_max ? mx[c] : tile_max;
      OnlineSoftmaxRow& st = w.rows[r];
      const float factor = st.update_max(tile_max);
      const float off = st.exp_offset();
      float sum[kNR] = {};
      for (int j = 0; j < bn16; j += kNR)
        for (int c = 0; c < kNR; ++c) {
          const float e = fast_exp2(s[j + c] - off);
          s[j + c] = e;
          sum[c] += e;
        }
      float tile_sum = 0.f;
      for (int c = 0; c < kNR; ++c) tile_sum += sum[c];
      st.l += tile_sum;
      if (factor != 1.f) {
        float* a = w.acc.data() + size_t(r) * dp;
        for (int c = 0; c < dp; ++c) a[c] *= factor;
      }
    }
    for (int r = bm; r < bm4; ++r)
      for (int j = 0; j < bn16; ++j) w.s[size_t(r) * kBlockN + j] = 0.f;
    // Dropout: l above summed the undropped P (the LSE and the normalizer are of P); P V takes
    // the kept entries only, and their scale is applied once at the store.
    if (mods.dropout) {
      dropout_keep_tile(mods, row0, bm, col0, w.keep.data());
      for (int r = 0; r < bm; ++r) {
        float* s = w.s.data() + size_t(r) * kBlockN;
        const uint8_t* k = w.keep.data() + size_t(r) * kBlockN;
        for (int j = 0; j < bn; ++j) s[j] = k[j] ? s[j] : 0.f;
      }
    }

    // O += P V.
    gemm(bm4, dp, bn, w.s.data(), kBlockN, w.v.data(), dp, w.acc.data(), dp, true);
  }

  for (int r = 0; r < bm; ++r) w.inv[r] = w.rows[r].inv_sum();
  store_rows(p.o, p.dtype, bm, d, [&](int r) { return row_offset(p.o_stride, b, sb.q_offset, row0 + r, h); },
             w.acc.data(), dp, w.inv.data(), mods.dropout ? mods.dscale : 1.f);
  if (p.lse) {
    float* lse = p.lse + sb.lse_offset + int64_t(h) * sb.lse_head_stride + row0;
    for (int r = 0; r < bm; ++r)
      lse[r] = mods.alibi ? float(double(w.rows[r].lse()) + alibi_row_constant(mods, w.dmin[r])) : w.rows[r].lse();
  }
}

// ---- backward ------------------------------------------------------------------------------

struct BwdScratch {
  int dp;
  std::vector<float> q, dout, k, kt, vt, s, pr, dpr, t, acc_a, acc_b, lse2, D, row, x;
  std::vector<int> dmin;      // ALiBi: each row's alibi_dmin
  std::vector<uint8_t> keep;  // dropout keep mask of a tile
  explicit BwdScratch(int d)
      : dp(round_up(d, kNR)),
        q(tile(kBlockM, dp)),
        dout(tile(kBlockM, dp)),
        k(tile(kBlockN, dp)),
        kt(tile(dp, kBlockN)),
        vt(tile(dp, kBlockN)),
        s(tile(kBlockM, kBlockN)),
        pr(tile(kBlockM, kBlockN)),
        dpr(tile(kBlockM, kBlockN)),
        t(tile(kBlockN, kBlockM)),
        acc_a(tile(std::max(kBlockM, kBlockN), dp)),
        acc_b(tile(kBlockN, dp)),
        lse2(size_t(kBlockM)),
        D(size_t(kBlockM)),
        row(size_t(dp)),
        x(size_t(kBlockN)),
        dmin(size_t(kBlockM), 0),
        keep(size_t(kBlockM) * kBlockN, 0) {}
};

// Row index of (sequence b, row i) in the D buffer's per-head plane.
FA_INLINE int64_t q_row(const Shape& sh, const SeqBounds& sb, int b, int i, bool varlen) {
  return (varlen ? sb.q_offset : int64_t(b) * sh.seqlen_q) + i;
}

// Loads the query-side tile of (b, h, rows [row0, row0 + bm)): q, dout, lse (log2 domain), D.
// With ALiBi the LSE is taken relative to each row's constant (alibi_dmin), in fp64.
FA_INLINE void load_query_side(const BwdParams& p, const Mods& mods, const Mask& mask, const float* Dbuf, int b,
                               int h, const SeqBounds& sb, int row0, int bm, BwdScratch& w) {
  const Shape& sh = p.shape;
  const int d = sh.headdim, dp = w.dp, bm4 = round_up(bm, kMR);
  load_rows(p.q, p.dtype, bm, d, [&](int r) { return row_offset(p.q_stride, b, sb.q_offset, row0 + r, h); },
            w.q.data(), dp);
  load_rows(p.dout, p.dtype, bm, d,
            [&](int r) { return row_offset(p.dout_stride, b, sb.q_offset, row0 + r, h); }, w.dout.data(), dp);
  std::fill(w.q.begin() + size_t(bm) * dp, w.q.begin() + size_t(bm4) * dp, 0.f);
  std::fill(w.dout.begin() + size_t(bm) * dp, w.dout.begin() + size_t(bm4) * dp, 0.f);
  const float* lse = p.lse + sb.lse_offset + int64_t(h) * sb.lse_head_stride + row0;
  const float* D = Dbuf + int64_t(h) * sh.total_q + q_row(sh, sb, b, row0, p.cu_seqlens_q != nullptr);
  for (int r = 0; r < bm; ++r) {
    w.lse2[r] = lse[r] * kLog2e;
    w.D[r] = D[r];
  }
  if (mods.alibi)
    for (int r = 0; r < bm; ++r) {
      w.dmin[r] = alibi_dmin(mask, row0 + r);
      w.lse2[r] = float((double(lse[r]) - alibi_row_constant(mods, w.dmin[r])) * double(kLog2e));  // -inf stays
    }
}

// Loads the key-side tile of (b, kvh, keys [col0, col0 + bn)): K^T and V^T (zero-padded
// columns up to bn16) and, when `k_rows`, K row-major.
FA_INLINE void load_key_side(const BwdParams& p, int b, int kvh, const SeqBounds& sb, int col0, int bn, bool k_rows,
                             BwdScratch& w) {
  const int d = p.shape.headdim, bn16 = round_up(bn, kNR);
  auto k_off = [&](int r) { return row_offset(p.k_stride, b, sb.k_offset, col0 + r, kvh); };
  auto v_off = [&](int r) { return row_offset(p.v_stride, b, sb.k_offset, col0 + r, kvh); };
  load_rows_t(p.k, p.dtype, bn, d, k_off, w.kt.data(), kBlockN, w.row.data());
  load_rows_t(p.v, p.dtype, bn, d, v_off, w.vt.data(), kBlockN, w.row.data());
  for (int c = 0; c < d; ++c)
    for (int j = bn; j < bn16; ++j) w.kt[size_t(c) * kBlockN + j] = w.vt[size_t(c) * kBlockN + j] = 0.f;
  if (k_rows) load_rows(p.k, p.dtype, bn, d, k_off, w.k.data(), w.dp);
}

// The shared middle of both backward passes for one (query tile, key tile): S = Q K^T,
// P = exp2(S * exp2_scale [+ ALiBi bias] - LSE) (masked entries and padding 0), dP = dO V^T, and
// dS = P * (dP - D) * dtanh, left in w.dpr. P is left in w.pr. With dropout (keep mask Z),
// w.pr is P o Z (dV's operand; its scale is applied at the store) and dS = P * (Z * scale * dP - D).
FA_INLINE void tile_probs_and_ds(const Mask& mask, const ScoreTransform& tr, const Mods& mods, int row0, int bm,
                                 int col0, int bn, int d, BwdScratch& w) {
  const int bm4 = round_up(bm, kMR), bn16 = round_up(bn, kNR);
  gemm(bm4, bn16, d, w.q.data(), w.dp, w.kt.data(), kBlockN, w.s.data(), kBlockN, false);
  gemm(bm4, bn16, d, w.dout.data(), w.dp, w.vt.data(), kBlockN, w.dpr.data(), kBlockN, false);
  const bool need_mask = mask.tile_needs_mask(row0, bm, col0, bn);
  if (mods.dropout) dropout_keep_tile(mods, row0, bm, col0, w.keep.data());
  for (int r = 0; r < bm; ++r) {
    float* s = w.s.data() + size_t(r) * kBlockN;
    float* pr = w.pr.data() + size_t(r) * kBlockN;
    float* ds = w.dpr.data() + size_t(r) * kBlockN;
    int jb = 0, je = bn;
    if (need_mask) {
      jb = mask.key_begin(row0 + r) - col0;
      je = mask.key_end(row0 + r) - col0;
      jb = jb < 0 ? 0 : (jb > bn ? bn : jb);
      je = je < jb ? jb : (je > bn ? bn : je);
    }
    const float lse2 = w.lse2[r], Dr = w.D[r];
    if (lse2 == -INFINITY) jb = je = 0;  // the row sees no key: P = 0, never exp2(-inf + inf)
    if (tr.softcap > 0.f) {
      for (int j = 0; j < bn; ++j) {
        const float c = tr.apply(s[j]);
        s[j] = c;
      }
    }
    if (!mods.alibi && !mods.dropout) {
      for (int j = 0; j < bn16; ++j) {
        const float pv = (j >= jb && j < je) ? fast_exp2(s[j] * tr.exp2_scale - lse2) : 0.f;
        pr[j] = pv;
        ds[j] = pv * (ds[j] - Dr);
      }
    } else {
      // s keeps the capped score (softcap's derivative below is of it, without the bias).
      float* x = w.x.data();  // the row's exponents
      for (int j = 0; j < bn16; ++j) x[j] = s[j] * tr.exp2_scale;
      if (mods.alibi) add_alibi_row(mods, row0 + r, w.dmin[r], col0, bn, x);
      if (!mods.dropout) {
        for (int j = 0; j < bn16; ++j) {
          const float pv = (j >= jb && j < je) ? fast_exp2(x[j] - lse2) : 0.f;
          pr[j] = pv;
          ds[j] = pv * (ds[j] - Dr);
        }
      } else {  // branch-free in j, so it vectorizes like the loop above
        const uint8_t* keep = w.keep.data() + size_t(r) * kBlockN;
        for (int j = 0; j < bn16; ++j) {
          const float pv = (j >= jb && j < je) ? fast_exp2(x[j] - lse2) : 0.f;
          const float z = float(keep[j]);  // 1 kept, 0 dropped
          pr[j] = pv * z;
          ds[j] = pv * (ds[j] * (z * mods.dscale) - Dr);
        }
      }
    }
    if (tr.softcap > 0.f)
      for (int j = 0; j < bn; ++j) ds[j] *= tr.dtanh_factor(s[j]);
  }
  for (int r = bm; r < bm4; ++r)
    for (int j = 0; j < bn16; ++j) w.pr[size_t(r) * kBlockN + j] = w.dpr[size_t(r) * kBlockN + j] = 0.f;
}

// Pass 2: dK, dV of key block nb of (b, kvh), summed over the kv head's query-head group. With
// `dq` (the whole-head scheme, bwd_head), it also adds dS K into dq[(h - kvh * group) * dq_rows
// + row][c], so pass 3 need not recompute S and dP.
FA_CPU_CLONES void bwd_dkdv_block(const BwdParams& p, const Rng& rng, const float* Dbuf, int b, int kvh, int nb,
                                  BwdScratch& w, float* dq = nullptr, int dq_rows = 0) {
  const Shape& sh = p.shape;
  const int d = sh.headdim, dp = w.dp, group = sh.group_size();
  const SeqBounds sb = seq_bounds(sh, p.cu_seqlens_q, p.cu_seqlens_k, b);
  const Mask mask = make_mask(p.mask, sb);
  const ScoreTransform tr = ScoreTransform::make(p.mask.softmax_scale, p.mask.softcap);
  const int col0 = nb * kBlockN;
  const int bn = sb.seqlen_k - col0 < kBlockN ? sb.seqlen_k - col0 : kBlockN;
  const int bn4 = round_up(bn, kMR);
  float* dk = w.acc_a.data();
  float* dv = w.acc_b.data();
  std::fill(dk, dk + size_t(bn4) * dp, 0.f);
  std::fill(dv, dv + size_t(bn4) * dp, 0.f);
  load_key_side(p, b, kvh, sb, col0, bn, dq != nullptr, w);

  int m_begin, m_end;
  mask.query_block_range(col0, bn, kBlockM, &m_begin, &m_end);
  for (int h = kvh * group; h < (kvh + 1) * group; ++h) {
    const Mods mods = make_mods(p, rng, mask, b, h);
    for (int mb = m_begin; mb < m_end; ++mb) {
      const int row0 = mb * kBlockM;
      const int bm = sb.seqlen_q - row0 < kBlockM ? sb.seqlen_q - row0 : kBlockM;
      load_query_side(p, mods, mask, Dbuf, b, h, sb, row0, bm, w);
      tile_probs_and_ds(mask, tr, mods, row0, bm, col0, bn, d, w);
      // dV += P^T dO, dK += dS^T Q (transposes into w.t, rows >= bn zero).
      float* t = w.t.data();
      for (int j = 0; j < bn4; ++j)
        for (int r = 0; r < bm; ++r) t[size_t(j) * kBlockM + r] = j < bn ? w.pr[size_t(r) * kBlockN + j] : 0.f;
      gemm(bn4, dp, bm, t, kBlockM, w.dout.data(), dp, dv, dp, true);
      for (int j = 0; j < bn4; ++j)
        for (int r = 0; r < bm; ++r) t[size_t(j) * kBlockM + r] = j < bn ? w.dpr[size_t(r) * kBlockN + j] : 0.f;
      gemm(bn4, dp, bm, t, kBlockM, w.q.data(), dp, dk, dp, true);
      if (dq != nullptr)  // dQ += dS K, as bwd_dq_block (same operands, same key block order)
        gemm(round_up(bm, kMR), dp, bn, w.dpr.data(), kBlockN, w.k.data(), dp,
             dq + (size_t(h - kvh * group) * dq_rows + row0) * dp, dp, true);
    }
  }
  // dS was taken w.r.t. the natural-log score; d score / d qk = softmax_scale (dtanh applied).
  store_rows(p.dk, p.dtype, bn, d, [&](int r) { return row_offset(p.dk_stride, b, sb.k_offset, col0 + r, kvh); },
             dk, dp, nullptr, p.mask.softmax_scale);
  // dV summed (P o Z)^T dO: dropout's scale is applied here, once.
  store_rows(p.dv, p.dtype, bn, d, [&](int r) { return row_offset(p.dv_stride, b, sb.k_offset, col0 + r, kvh); },
             dv, dp, nullptr, p.dropout.enabled() ? p.dropout.scale : 1.f);
}

// Passes 2 and 3 in one for all of (b, kvh): key blocks in increasing order, dQ of the head
// group accumulated in `dq` (group * dq_rows * dp floats). Each dQ element gets the same adds in
// the same order as from bwd_dq_block (both take the key blocks in increasing order), so the two
// schemes agree bitwise (up to the sign of an exact zero, where one scheme adds a fully masked
// tile's +0 products that the other skips); 5 tile GEMMs per tile pair instead of 7.
FA_CPU_CLONES void bwd_head(const BwdParams& p, const Rng& rng, const float* Dbuf, int b, int kvh, BwdScratch& w,
                            std::vector<float>& dq, int dq_rows) {
  const Shape& sh = p.shape;
  const int d = sh.headdim, dp = w.dp, group = sh.group_size();
  const SeqBounds sb = seq_bounds(sh, p.cu_seqlens_q, p.cu_seqlens_k, b);
  std::fill(dq.begin(), dq.end(), 0.f);
  const int nk = (sb.seqlen_k + kBlockN - 1) / kBlockN;
  for (int nb = 0; nb < nk; ++nb) bwd_dkdv_block(p, rng, Dbuf, b, kvh, nb, w, dq.data(), dq_rows);
  for (int g = 0; g < group; ++g) {
    const int h = kvh * group + g;
    store_rows(p.dq, p.dtype, sb.seqlen_q, d,
               [&](int r) { return row_offset(p.dq_stride, b, sb.q_offset, r, h); },
               dq.data() + size_t(g) * dq_rows * dp, dp, nullptr, p.mask.softmax_scale);
  }
}

// Pass 3: dQ of query block mb of (b, h), by recomputation over its key blocks.
FA_CPU_CLONES void bwd_dq_block(const BwdParams& p, const Rng& rng, const float* Dbuf, int b, int h, int mb,
                                BwdScratch& w) {
  const Shape& sh = p.shape;
  const int d = sh.headdim, dp = w.dp, kvh = sh.kv_head(h);
  const SeqBounds sb = seq_bounds(sh, p.cu_seqlens_q, p.cu_seqlens_k, b);
  const Mask mask = make_mask(p.mask, sb);
  const ScoreTransform tr = ScoreTransform::make(p.mask.softmax_scale, p.mask.softcap);
  const int row0 = mb * kBlockM;
  const int bm = sb.seqlen_q - row0 < kBlockM ? sb.seqlen_q - row0 : kBlockM;
  const int bm4 = round_up(bm, kMR);
  const Mods mods = make_mods(p, rng, mask, b, h);
  float* dq = w.acc_a.data();
  std::fill(dq, dq + size_t(bm4) * dp, 0.f);
  load_query_side(p, mods, mask, Dbuf, b, h, sb, row0, bm, w);

  int n_begin, n_end;
  mask.key_block_range(row0, bm, kBlockN, &n_begin, &n_end);
  for (int nb = n_begin; nb < n_end; ++nb) {
    const int col0 = nb * kBlockN;
    const int bn = sb.seqlen_k - col0 < kBlockN ? sb.seqlen_k - col0 : kBlockN;
    load_key_side(p, b, kvh, sb, col0, bn, true, w);
    tile_probs_and_ds(mask, tr, mods, row0, bm, col0, bn, d, w);
    // dQ += dS K.
    gemm(bm4, dp, bn, w.dpr.data(), kBlockN, w.k.data(), dp, dq, dp, true);
  }
  store_rows(p.dq, p.dtype, bm, d, [&](int r) { return row_offset(p.dq_stride, b, sb.q_offset, row0 + r, h); }, dq,
             dp, nullptr, p.mask.softmax_scale);
}

// Pass 1: D = rowsum(dO * O) for the rows of query block mb of (b, h). Computed by the same
// gemm as dP (kMR rows at a time against their own O rows as columns; D is the diagonal), so
// D and dP round identically: a row with a single visible key (O = V) gets dP - D = 0 exactly,
// as its exact gradient is.
struct DScratch {
  int dp;
  std::vector<float> a, ot, c, row;
  explicit DScratch(int d)
      : dp(round_up(d, kNR)), a(tile(kMR, dp)), ot(tile(dp, kNR)), c(tile(kMR, kNR)), row(size_t(dp)) {}
};

FA_CPU_CLONES void bwd_d_block(const BwdParams& p, float* Dbuf, int b, int h, int mb, DScratch& w) {
  const Shape& sh = p.shape;
  const int d = sh.headdim;
  const SeqBounds sb = seq_bounds(sh, p.cu_seqlens_q, p.cu_seqlens_k, b);
  const int row0 = mb * kBlockM;
  const int bm = sb.seqlen_q - row0 < kBlockM ? sb.seqlen_q - row0 : kBlockM;
  float* D = Dbuf + int64_t(h) * sh.total_q + q_row(sh, sb, b, row0, p.cu_seqlens_q != nullptr);
  for (int r0 = 0; r0 < bm; r0 += kMR) {
    const int n = bm - r0 < kMR ? bm - r0 : kMR;
    load_rows(p.dout, p.dtype, n, d,
              [&](int r) { return row_offset(p.dout_stride, b, sb.q_offset, row0 + r0 + r, h); }, w.a.data(), w.dp);
    std::fill(w.a.begin() + size_t(n) * w.dp, w.a.end(), 0.f);
    load_rows_t(p.o, p.dtype, n, d, [&](int r) { return row_offset(p.o_stride, b, sb.q_offset, row0 + r0 + r, h); },
                w.ot.data(), kNR, w.row.data());
    for (int c = 0; c < d; ++c)
      for (int r = n; r < kMR; ++r) w.ot[size_t(c) * kNR + r] = 0.f;
    gemm(kMR, kNR, d, w.a.data(), w.dp, w.ot.data(), kNR, w.c.data(), kNR, false);
    for (int r = 0; r < n; ++r) D[r0 + r] = w.c[size_t(r) * kNR + r];
  }
}

const char* unsupported_dtype(flashattn_dtype dtype) {
  switch (dtype) {
    case FLASHATTN_DTYPE_FP16:
    case FLASHATTN_DTYPE_BF16:
    case FLASHATTN_DTYPE_FP32:
    case FLASHATTN_DTYPE_FP64: return nullptr;
    case FLASHATTN_DTYPE_FP8_E4M3:
      return "dtype: fp8_e4m3 is not supported by the cpu backend (backend reference, or auto, runs FP8 on the host)";
  }
  return "dtype: unknown value for the cpu backend";
}

flashattn_status fail(const char* what, const std::string& err) {
  return set_error(err.find("allocation") != std::string::npos ? FLASHATTN_ERROR_WORKSPACE : FLASHATTN_ERROR_INTERNAL,
                   "cpu %s: %s", what, err.c_str());
}

const char* fwd_unsupported(const FwdParams& p) { return unsupported_dtype(p.dtype); }
const char* bwd_unsupported(const BwdParams& p) { return unsupported_dtype(p.dtype); }
size_t fwd_ws(const FwdParams&) { return 0; }
flashattn_status fwd_entry(const FwdParams& p, void*, void*) { return fwd(p); }
flashattn_status bwd_entry(const BwdParams& p, void* ws, void*) { return bwd(p, ws); }

}  // namespace

size_t bwd_workspace_bytes(const BwdParams& p) {
  return size_t(p.shape.nheads_q) * size_t(p.shape.total_q) * sizeof(float);
}

flashattn_status fwd(const FwdParams& p) {
  if (const char* why = unsupported_dtype(p.dtype)) return set_error(FLASHATTN_ERROR_NOT_SUPPORTED, "%s", why);
  const auto items = blocks(p.shape, p.cu_seqlens_q, p.cu_seqlens_k, false, kBlockM);
  const int64_t n = int64_t(items.size());
  const Rng rng = p.dropout.resolved();
  if (p.kv.appends()) append_kv_rows(p, p.dtype);
  // Heads outermost: neighbouring items share K/V in cache.
  std::string err = parallel_for(
      n * p.shape.nheads_q, [&] { return FwdScratch(p.shape.headdim); },
      [&](int64_t item, FwdScratch& w) {
        const auto& bx = items[size_t(item % n)];
        fwd_block(p, rng, bx.first, int(item / n), bx.second, w);
      });
  return err.empty() ? FLASHATTN_SUCCESS : fail("forward", err);
}

flashattn_status bwd(const BwdParams& p, void* workspace) {
  if (const char* why = unsupported_dtype(p.dtype)) return set_error(FLASHATTN_ERROR_NOT_SUPPORTED, "%s", why);
  const Shape& sh = p.shape;
  std::vector<float> own;
  float* Dbuf = static_cast<float*>(workspace);
  try {
    if (Dbuf == nullptr) {
      own.resize(bwd_workspace_bytes(p) / sizeof(float));
      Dbuf = own.data();
    }
  } catch (const std::bad_alloc&) {
    return set_error(FLASHATTN_ERROR_WORKSPACE, "cpu backward: allocating %zu bytes failed", bwd_workspace_bytes(p));
  }
  const auto qblocks = blocks(sh, p.cu_seqlens_q, p.cu_seqlens_k, false, kBlockM);
  const auto kblocks = blocks(sh, p.cu_seqlens_q, p.cu_seqlens_k, true, kBlockN);
  const int64_t nq = int64_t(qblocks.size()), nk = int64_t(kblocks.size());
  const Rng rng = p.dropout.resolved();

  std::string err = parallel_for(
      nq * sh.nheads_q, [&] { return DScratch(sh.headdim); },
      [&](int64_t item, DScratch& w) {
        const auto& bx = qblocks[size_t(item % nq)];
        bwd_d_block(p, Dbuf, bx.first, int(item / nq), bx.second, w);
      });
  if (!err.empty()) return fail("backward", err);
  // Whole heads per work item when there are enough of them to keep every thread busy (and the
  // per-thread dQ accumulator stays small): 5 tile GEMMs per tile pair instead of 7.
  const int dq_rows = round_up(std::max(sh.seqlen_q, 1), kBlockM);
  const size_t dq_floats = size_t(sh.group_size()) * size_t(dq_rows) * size_t(round_up(sh.headdim, kNR));
  if (int64_t(sh.batch) * sh.nheads_kv >= 2 * int64_t(host_num_threads()) && dq_floats <= (size_t(64) << 20)) {
    struct HeadScratch {
      BwdScratch w;
      std::vector<float> dq;
    };
    err = parallel_for(
        int64_t(sh.batch) * sh.nheads_kv, [&] { return HeadScratch{BwdScratch(sh.headdim), std::vector<float>(dq_floats)}; },
        [&](int64_t item, HeadScratch& s) {
          bwd_head(p, rng, Dbuf, int(item / sh.nheads_kv), int(item % sh.nheads_kv), s.w, s.dq, dq_rows);
        });
    return err.empty() ? FLASHATTN_SUCCESS : fail("backward", err);
  }
  err = parallel_for(
      nk * sh.nheads_kv, [&] { return BwdScratch(sh.headdim); },
      [&](int64_t item, BwdScratch& w) {
        const auto& bx = kblocks[size_t(item % nk)];
        bwd_dkdv_block(p, rng, Dbuf, bx.first, int(item / nk), bx.second, w);
      });
  if (!err.empty()) return fail("backward", err);
  err = parallel_for(
      nq * sh.nheads_q, [&] { return BwdScratch(sh.headdim); },
      [&](int64_t item, BwdScratch& w) {
        const auto& bx = qblocks[size_t(item % nq)];
        bwd_dq_block(p, rng, Dbuf, bx.first, int(item / nq), bx.second, w);
      });
  if (!err.empty()) return fail("backward", err);
  return FLASHATTN_SUCCESS;
}

}  // namespace flashattn::cpu

namespace flashattn {

const Backend kCpuBackend = {
    FLASHATTN_BACKEND_CPU,
    /*on_device=*/false,
    /*min_cc=*/0,
    /*max_cc=*/0,
    cpu::fwd_unsupported,
    cpu::fwd_ws,
    cpu::fwd_entry,
    cpu::bwd_unsupported,
    [](const BwdParams& p) { return cpu::bwd_workspace_bytes(p); },
    cpu::bwd_entry,
};

}  // namespace flashattn
