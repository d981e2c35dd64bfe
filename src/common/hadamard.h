// Incoherent processing for FP8 attention (FlashAttention-3): Q and K rows are multiplied by the
// same random orthogonal matrix M = H D / sqrt(n) along the head dimension, where H is the n x n
// Sylvester-Hadamard matrix (H[i][j] = (-1)^popcount(i & j), symmetric, H H = n I) and D =
// diag(signs) a random +-1 diagonal. M is orthogonal, so (M q) . (M k) = q . k: the scores are
// unchanged, while an outlier entry of magnitude a becomes n entries of magnitude a / sqrt(n),
// which a per-block FP8 scale represents far better.
//   forward:  x' = H (signs * x) / sqrt(n)
//   inverse:  x  = signs * (H x' / sqrt(n))
// Sign c (one per head-dim column, the same for every row, head and batch) is bit c % 32 of word
// (c / 32) % 4 of Philox4x32-10 with key {seed low 32 bits, seed high 32 bits} and counter
// {c / 128, 0, 0, kHadamardStream}; a set bit means -1. The constant counter word keeps these
// numbers apart from dropout's (whose word 3 counts batch * heads) when a caller reuses a seed.
#pragma once

#include <cstdint>

#include "common/hd.h"
#include "common/philox.h"

namespace flashattn {

constexpr int kHadamardMinDim = 16;
constexpr int kHadamardMaxDim = 256;
constexpr uint32_t kHadamardStream = 0x48414441u;  // "HADA"

// The head dims the transform supports: powers of two in [16, 256] (the FP8 kernels' head dims).
FA_HD bool hadamard_dim_supported(int64_t n) {
  return n >= kHadamardMinDim && n <= kHadamardMaxDim && (n & (n - 1)) == 0;
}

// +1 or -1 for head-dim column `c`.
FA_HD int hadamard_sign(uint64_t seed, int c) {
  const Philox4 r = philox4x32_10(uint32_t(c / 128), 0u, 0u, kHadamardStream, uint32_t(seed),
                                  uint32_t(seed >> 32));
  const uint32_t word = r.x[(c / 32) % 4];
  return ((word >> (c % 32)) & 1u) ? -1 : 1;
}

// In place: x <- H x (unnormalized Walsh-Hadamard transform, n a power of two). Butterflies in a
// fixed order, so a given T gives the same bits on every path.
template <typename T>
FA_HD void walsh_hadamard_unnormalized(T* x, int n) {
  for (int h = 1; h < n; h *= 2) {
    for (int i = 0; i < n; i += 2 * h) {
      for (int j = i; j < i + h; ++j) {
        const T a = x[j], b = x[j + h];
        x[j] = a + b;
        x[j + h] = a - b;
      }
    }
  }
}

// In place: x <- H (signs * x) / sqrt(n), signs[c] = hadamard_sign(seed, c) (precomputed by the
// caller: they are the same for every row).
template <typename T>
FA_HD void hadamard_forward(T* x, const int8_t* signs, int n, T inv_sqrt_n) {
  for (int c = 0; c < n; ++c) x[c] = signs[c] < 0 ? -x[c] : x[c];
  walsh_hadamard_unnormalized(x, n);
  for (int c = 0; c < n; ++c) x[c] *= inv_sqrt_n;
}

// In place: the inverse of hadamard_forward, x <- signs * (H x / sqrt(n)).
template <typename T>
FA_HD void hadamard_inverse(T* x, const int8_t* signs, int n, T inv_sqrt_n) {
  walsh_hadamard_unnormalized(x, n);
  for (int c = 0; c < n; ++c) x[c] = signs[c] < 0 ? -(x[c] * inv_sqrt_n) : x[c] * inv_sqrt_n;
}

}  // namespace flashattn
