// The CPU oracle: attention forward and backward straight from the definition (see the top
// comment of include/flashattn/flashattn.h), one query row at a time, fp64 accumulation, for
// every option (scale, softcap, window/causal, ALiBi, dropout, GQA, varlen, LSE, the forward's KV
// cache: paged/contiguous addressing, appending and the rotary embedding) and every host
// dtype, plus the FP8 forward (E4M3 codes dequantized exactly with their block scales, then the
// same fp64 attention; output in fp8.out_dtype; kExact only, no KV cache). It shares only the mask policy (src/common/mask.h), seq_bounds() and the dropout keep
// decision (Dropout::keep, common/dropout.h: the numbers must be the same on every path) with the
// other paths; the math (natural-log softmax, tanh softcap and its derivative, the ALiBi bias,
// dropout's scaling and its backward) is written out independently, in fp64.
//
// The forward writes the LSE as fp32 (`lse`) and/or fp64 (`lse_fp64`, unrounded).
// The backward recomputes everything from q, k, v and dout in fp64: it ignores the given fp32
// lse, and the given out except under kExactGivenOutput or with a given lse_fp64 (then P comes
// from that LSE and D from the given out, as on the other backends), and returns the gradient
// of the exact function. With dropout it regenerates the forward's keep mask from the same
// seed, offset (or rng_state) and returns the gradient for that fixed mask.
#pragma once

#include "api/backend.h"
#include "common/params.h"
#include "flashattn/flashattn.h"

namespace flashattn::reference {

enum class Rounding {
  // fp64 accumulation, nothing rounded before the output store: the oracle.
  kExact,
  // Standard (non-fused) attention at the input precision, as an unfused torch implementation
  // computes it: every matmul accumulates in fp32 (fp64 for FP64) and its result, and the
  // result of every elementwise step (scale, softcap's div/tanh/mul, softmax, and in the
  // backward dP, the softmax backward dS, softcap's chain, the scale) is rounded to
  // `precision`. Its error against kExact is the yardstick for the tolerance of fused paths.
  // One deliberate difference from torch's autograd: the backward's D = rowsum(dO * O) is
  // taken from the output rounded to `precision` (torch uses rowsum(dP * P)), because a fused
  // backward receives O in the input dtype and cannot do better; for short rows with an
  // outlier in dO . O that rounding is the largest error of any correct fused backward.
  kInputPrecision,
  // Backward only (the forward is kExact): exact, except that D = rowsum(dO * O) is taken
  // from the caller's O (BwdParams::o) instead of the exact output. That is what a perfect
  // fused backward computes from the O it is handed, so tests compare a fused backward with
  // this: the gap to kExact (O's rounding times dO, amplified by K or Q) is not an error of
  // the backward, and unfused attention does not have it, so the yardstick cannot cover it.
  kExactGivenOutput,
};

// Computes o (and lse when non-null) of `p`; intermediates rounded to p.dtype under
// kInputPrecision. Host pointers (cu_seqlens included). Multi-threaded over (batch, head).
flashattn_status fwd(const FwdParams& p, Rounding rounding);
flashattn_status bwd(const BwdParams& p, Rounding rounding);

// Same, with the intermediates of kInputPrecision rounded to `precision` instead of p.dtype:
// lets a test feed FP64 copies of fp16 inputs and get the fp16 standard-attention result
// back unrounded by the output store (FP64 output buffers).
flashattn_status fwd(const FwdParams& p, Rounding rounding, flashattn_dtype precision);
flashattn_status bwd(const BwdParams& p, Rounding rounding, flashattn_dtype precision);

// One output row in fp64, for sampled checks of long sequences: writes o[0, headdim) of row
// `i` (within sequence `b`) of query head `h` and returns its LSE (natural log, -inf for a
// row that sees no key). O(seqlen_k * headdim). With a KV cache it reads the cache as it is
// (it appends nothing: check a call that appended against the cache that call left).
double fwd_row(const FwdParams& p, Rounding rounding, flashattn_dtype precision, int b, int h, int i,
               double* o);

}  // namespace flashattn::reference
