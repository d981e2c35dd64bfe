/*
 * flashattn — exact, IO-aware attention (FlashAttention family). C ABI.
 *
 * Tensors are [batch, seqlen, nheads, headdim] with the last dimension contiguous and any
 * other strides (in elements). Every call validates its arguments; a failing call returns a
 * status and flashattn_last_error() names the offending argument. Nothing here depends on a
 * framework: kernels see only these POD structs.
 *
 * Semantics follow flash_attn 2.x:
 *   S = softmax_scale * Q K^T, optionally S = softcap * tanh(S / softcap),
 *   masked entries excluded, P = softmax(S) row-wise, O = P V,
 *   LSE[b, h, i] = log(sum_j exp(S_ij)) over the unmasked keys of row i (natural log).
 * Mask (bottom-right aligned, as flash_attn): query row i may see key j iff
 *   j >= i + (seqlen_k - seqlen_q) - window_left   (when window_left  >= 0)
 *   j <= i + (seqlen_k - seqlen_q) + window_right  (when window_right >= 0)
 * causal = 1 is window_right = 0. A row that sees no key gets O = 0 and LSE = -inf, and
 * contributes zero gradient.
 * GQA/MQA: nheads_q must be a multiple of nheads_kv; query head h reads kv head
 * h / (nheads_q / nheads_kv).
 * Varlen: with cu_seqlens_q/cu_seqlens_k set, tensors have shape [1, total, nheads, headdim],
 * sequence b occupies rows [cu_seqlens[b], cu_seqlens[b+1]), and LSE is [nheads_q, total_q].
 * Otherwise LSE is [batch, nheads_q, seqlen_q]. LSE is contiguous fp32 (`lse`), or, for
 * FLASHATTN_DTYPE_FP64 problems on the reference backend, contiguous fp64 (`lse_fp64`).
 *
 * ALiBi (alibi_slopes set): S_ij += -slope[b, h] * |i + seqlen_k - seqlen_q - j| after the
 *   softcap, before masking (flash_attn's bias, bottom-right aligned; kept exact under causal
 *   too, so the LSE includes the row term that flash_attn drops there).
 * Dropout (options.dropout_p = p > 0): P_ij is kept iff a 16-bit random number r_ij >= t,
 *   t = round(p * 65536) clamped to [1, 65535], and kept entries are scaled by 65536 / (65536 - t)
 *   (so the drop probability is p to within 2^-17, and the output is unbiased). The LSE is not
 *   affected. r_ij comes from Philox4x32-10 (Random123's and curand's generator), keyed by
 *   dropout_seed, with counter words 2-3 = dropout_offset + (b * nheads_q + h) and words 0-1 the
 *   element's 8-element unit {i0, i0+8} x {j0, j0+1, j0+8, j0+9} (src/common/dropout.h gives the
 *   exact map): the same numbers on every backend, forward and backward. A caller making several
 *   calls with one seed advances dropout_offset by batch * nheads_q per call.
 *
 * ABI growth: struct_size is sizeof() of the caller's header version. The library accepts the
 * current size and every earlier one, and reads only the fields an earlier size covers (the
 * ones added later read as zero/NULL): flashattn_fwd_params/flashattn_bwd_params ended after
 * `varlen` before `lse_fp64` was added, and after `lse_fp64` before the dropout/ALiBi fields;
 * flashattn_fwd_params ended after `alibi_batch_stride` before `kv_cache` and `num_splits`, and after
 * `num_splits` before `fp8`, and after `fp8` before `fp8_v_layout`.
 *
 * FP8 attention (dtype FLASHATTN_DTYPE_FP8_E4M3, forward only): q, k, v hold E4M3 codes (1 byte,
 * torch.float8_e4m3fn) and each row of each head has an fp32 scale (flashattn_fp8_scales below); the
 * attention is that of the dequantized inputs
 *   q[b, i, h, c] = e4m3(code) * q_scale[b, h, i / q_block_size]     (likewise k, v with k_block_size)
 * (the exact product: 4 + 24 significant bits), written as fp16 or bf16 (fp8.out_dtype), LSE fp32.
 * Host tensors run on the reference backend (AUTO picks it for FP8); CUDA tensors on the sm90 path
 * (Hopper). flashattn_bwd refuses FP8. v may also come transposed (fp8_v_layout below).
 */
#ifndef FLASHATTN_FLASHATTN_H
#define FLASHATTN_FLASHATTN_H

#include <stddef.h>
#include <stdint.h>

#if defined(_WIN32)
#define FLASHATTN_API __declspec(dllexport)
#else
#define FLASHATTN_API __attribute__((visibility("default")))
#endif

#ifdef __cplusplus
extern "C" {
#endif

#define FLASHATTN_VERSION_MAJOR 0
#define FLASHATTN_VERSION_MINOR 1
#define FLASHATTN_VERSION_PATCH 0

typedef enum flashattn_status {
  FLASHATTN_SUCCESS = 0,
  FLASHATTN_ERROR_INVALID_ARGUMENT = 1, /* a field is wrong; the message names it */
  FLASHATTN_ERROR_NOT_SUPPORTED = 2,    /* valid, but no compiled path implements it */
  FLASHATTN_ERROR_NO_DEVICE = 3,        /* no CUDA device, or none of the required arch */
  FLASHATTN_ERROR_CUDA = 4,             /* a CUDA call or launch failed */
  FLASHATTN_ERROR_WORKSPACE = 5,        /* workspace too small or allocation failed */
  FLASHATTN_ERROR_INTERNAL = 6
} flashattn_status;

typedef enum flashattn_dtype {
  FLASHATTN_DTYPE_FP16 = 1,
  FLASHATTN_DTYPE_BF16 = 2,
  FLASHATTN_DTYPE_FP32 = 3,     /* host paths only (reference, cpu) */
  FLASHATTN_DTYPE_FP64 = 4,     /* host only, for gradient checks: AUTO runs it on the reference
                                   backend, in fp64 throughout (the cpu backend, if chosen, accumulates
                                   in fp32). The LSE is fp32 in `lse`, or exact fp64 in `lse_fp64`
                                   (reference backend, which AUTO picks for fp64) */
  FLASHATTN_DTYPE_FP8_E4M3 = 5  /* forward input only, with flashattn_fwd_params.fp8 (scales, block
                                   sizes, out_dtype); host tensors (reference backend) for now */
} flashattn_dtype;

typedef enum flashattn_backend {
  FLASHATTN_BACKEND_AUTO = 0,      /* host memory: cpu; device memory: fastest path for the GPU */
  FLASHATTN_BACKEND_REFERENCE = 1, /* host, fp64 accumulation, O(N^2) memory: the oracle */
  FLASHATTN_BACKEND_CPU = 2,       /* host, tiled online softmax, multi-threaded, O(N) memory */
  FLASHATTN_BACKEND_SM80 = 3,      /* CUDA, mma.sync + cp.async, any GPU from sm80 on */
  FLASHATTN_BACKEND_SM90 = 4       /* CUDA, Hopper TMA + WGMMA (sm90a) */
} flashattn_backend;

/* A view of a [batch, seqlen, nheads, headdim] tensor. stride[3] must be 1. */
typedef struct flashattn_tensor {
  void* data;
  int64_t shape[4];
  int64_t stride[4]; /* in elements */
} flashattn_tensor;

typedef struct flashattn_options {
  float softmax_scale;   /* > 0 and finite; flashattn_default_options() leaves 0 = 1/sqrt(headdim) */
  int32_t causal;        /* 0 or 1; bottom-right aligned */
  int32_t window_left;   /* -1 = unbounded */
  int32_t window_right;  /* -1 = unbounded; causal forces 0 */
  float softcap;         /* 0 = off; > 0 applies softcap * tanh(S / softcap) */
  float dropout_p;       /* in [0, 1): probability of dropping an entry of P (see Dropout above) */
  int32_t deterministic; /* backward: bitwise reproducible run to run */
  flashattn_backend backend;
  int32_t device;        /* -1: tensors in host memory; >= 0: CUDA device ordinal of the tensors */
  int32_t num_threads;   /* host paths' worker threads, >= 0; 0 = default: FLASHATTN_NUM_THREADS if
                            set, else the hardware's. A value > 0 wins over the environment variable.
                            Ignored for CUDA tensors. It fills what was padding after `options` in
                            flashattn_fwd_params/flashattn_bwd_params, so their size and layout (and
                            struct_size) are unchanged and params from *_params_init() read 0. */
} flashattn_options;

typedef struct flashattn_varlen {
  /* [batch + 1], in the tensors' memory space; NULL = fixed length. Host arrays are checked
   * (monotone, within the packed tensors, lengths <= max_seqlen). Device arrays are checked only
   * with FLASHATTN_CHECK_CU_SEQLENS=1 (it costs a stream sync); unchecked, a bad entry is clamped
   * to an empty or shorter sequence and never addresses memory outside the tensors. */
  const int32_t* cu_seqlens_q;
  const int32_t* cu_seqlens_k; /* set both or neither */
  int32_t batch;               /* number of sequences */
  int32_t max_seqlen_q;        /* upper bound of the per-sequence lengths */
  int32_t max_seqlen_k;
} flashattn_varlen;

/* The keys' and values' storage for inference (flash_attn_with_kvcache, paged KV); all zero/NULL
 * (what flashattn_fwd_params_init() leaves) = plain contiguous k/v. Forward only.
 *
 * Sequence b's keys are rows [leftpad[b], end_b) of its cache, where end_b is seqlens[b] (+ the
 * new rows, below), or without seqlens the cache's capacity (fixed length) / its cu_seqlens_k
 * length (varlen). Masks, ALiBi and the LSE see only those rows (seqlen_k = end_b - leftpad[b]),
 * bottom-right aligned with the queries as always. Row r of sequence b lives at:
 *   contiguous: k[batch_idx ? batch_idx[b] : b, r] (varlen: packed row cu_seqlens_k[b] + r);
 *   paged (block_table set): k is [num_pages, page_size, nheads_kv, headdim] with any
 *     page_size >= 1, and row r is k[block_table[b * block_table_stride + r / page_size],
 *     r % page_size]. Capacity: max_pages * page_size rows.
 * Index arrays are int32 [batch] in the tensors' memory space. Host arrays are checked (pages in
 * [0, num_pages) for every row read, seqlens within capacity, leftpad <= seqlens, batch_idx in
 * range); device arrays only with FLASHATTN_CHECK_CU_SEQLENS=1 (a stream sync), otherwise bad
 * entries are clamped into range and never address memory outside the tensors.
 *
 * Appending (k_new.data set; fixed length only; seqlens required): the call first writes k_new /
 * v_new [batch, seqlen_new, nheads_kv, headdim] into the cache at rows
 * [seqlens[b], seqlens[b] + seqlen_new) (flashattn_fwd_params.k/v are written: they must not
 * alias q or out), then attends over rows [leftpad[b], seqlens[b] + seqlen_new).
 * Rotary embedding (rotary_cos set; needs k_new): cos/sin are [rotary_seqlen, rotary_dim / 2]
 * contiguous in q's dtype, applied to the first rotary_dim columns of q and k_new (the stored
 * keys are the rotated ones; q itself is not written). Rotated values are rounded to the dtype,
 * as the cache stores them and kernels multiply them. New key j of sequence b sits at position
 * seqlens[b] + j; query row i at seqlens[b] + i when causal or windowed, otherwise every query
 * row at seqlens[b] (flash_attn's convention). Interleaved rotates column pairs (2c, 2c + 1)
 * (GPT-J); otherwise (c, c + rotary_dim / 2) (GPT-NeoX):
 *   x'[c0] = x[c0] cos[pos, c] - x[c1] sin[pos, c],  x'[c1] = x[c0] sin[pos, c] + x[c1] cos[pos, c]. */
typedef struct flashattn_kv_cache {
  const int32_t* block_table;  /* paged KV: [batch, block_table_stride] page indices; NULL = contiguous */
  int64_t block_table_stride;  /* elements between sequences' rows of block_table, >= max_pages */
  int32_t max_pages;           /* page entries per sequence, >= 1 with block_table */
  const int32_t* seqlens;      /* optional: end row of each sequence (flash_attn's cache_seqlens) */
  const int32_t* leftpad;      /* optional: first row of each sequence (cache_leftpad), default 0 */
  const int32_t* batch_idx;    /* optional, contiguous only: cache batch of each sequence */
  flashattn_tensor k_new, v_new; /* optional rows to append; data NULL = none */
  const void* rotary_cos;      /* optional, with k_new: [rotary_seqlen, rotary_dim / 2] */
  const void* rotary_sin;
  int64_t rotary_seqlen;       /* rows of rotary_cos / rotary_sin */
  int32_t rotary_dim;          /* even, in [2, headdim] */
  int32_t rotary_interleaved;  /* 0 or 1 */
} flashattn_kv_cache;

/* The scales of FP8 inputs (dtype FLASHATTN_DTYPE_FP8_E4M3); all zero/NULL for other dtypes (a field
 * set with another dtype is refused). One fp32 scale per (sequence, head, block of block_size rows),
 * blocks counted from each sequence's first row (row i of sequence b is in block i / block_size),
 * contiguous fp32, 4-byte aligned, in the tensors' memory space:
 *   q_scale [batch, nheads_q,  ceil(seqlen_q / q_block_size)]
 *   k_scale, v_scale [batch, nheads_kv, ceil(seqlen_k / k_block_size)]
 * what flashattn_fp8_quantize writes for each tensor. block_size >= the sequence length gives one
 * scale per (batch, head); a per-tensor scale is that with every entry equal (the arrays are
 * b * h * blocks floats: broadcasting by copying costs nothing, and dense arrays leave no stride for
 * a caller to forget). Varlen: batch = varlen.batch, seqlen = varlen.max_seqlen_q / _k (each
 * sequence uses the first ceil(len / block_size) entries of its row of blocks). */
typedef struct flashattn_fp8_scales {
  const float* q_scale;
  const float* k_scale;
  const float* v_scale;
  int32_t q_block_size;      /* rows per scale block of q, >= 1 */
  int32_t k_block_size;      /* rows per scale block of k and of v, >= 1 */
  flashattn_dtype out_dtype; /* of `out`: FLASHATTN_DTYPE_BF16 or FLASHATTN_DTYPE_FP16 */
} flashattn_fp8_scales;

/* The layout of v for FP8 attention (flashattn_fwd_params.fp8_v_layout).
 * FLASHATTN_FP8_V_ROWS: as q and k (v.stride[3] = 1); the sm90 kernel transposes V tiles in smem.
 * FLASHATTN_FP8_V_KEYS_PERMUTED16: V^T, keys contiguous, so the kernel needs no transpose (the FP8
 *   tensor cores read V with keys contiguous). v keeps its logical shape [batch, seqlen_k, nheads_kv,
 *   headdim], with v.stride[1] = 1 and v.stride[3] = L, the row length of one (batch, head, head-dim
 *   column): a multiple of 16, >= seqlen_k rounded up to 16. Within each group of 16 keys, key
 *   16 g + k sits at position 16 g + perm(k), perm(k) = 8 k2 + 4 k1 + 2 k3 + k0 for k = 8 k3 + 4 k2 +
 *   2 k1 + k0 (the key order of P in the kernel's registers). The positions of the last group that hold
 *   no key must hold finite codes (zeros: the kernel multiplies them by P = 0). Fixed-length
 *   batches only (no varlen). The Python helper flashattn.fp8.keys_permuted16() writes this layout.
 * FLASHATTN_FP8_V_ROWS_AUTO: v in rows as with FLASHATTN_FP8_V_ROWS; the sm90 path may first copy it
 *   into the workspace in the keys_permuted16 layout (flashattn_fp8_v_keys_permuted16's pass: one read
 *   and one write of v) and run without the transpose. It does so for a fixed-length call whose
 *   unmasked (query row, key) pairs per key and kv head (seqlen_q x the GQA group, less what causal or
 *   the window masks) are at least 1536, where the kernel's savings measured larger than the copy
 *   (docs/fp8.md); the workspace query then counts the copy (batch x nheads_kv x headdim x seqlen_k
 *   rounded up to 16 bytes). Elsewhere, and on the host paths, it is FLASHATTN_FP8_V_ROWS. */
typedef enum flashattn_fp8_v_layout {
  FLASHATTN_FP8_V_ROWS = 0,
  FLASHATTN_FP8_V_KEYS_PERMUTED16 = 1,
  FLASHATTN_FP8_V_ROWS_AUTO = 2
} flashattn_fp8_v_layout;

typedef struct flashattn_fwd_params {
  uint32_t struct_size; /* sizeof(flashattn_fwd_params): lets the ABI grow (see the top) */
  flashattn_dtype dtype;
  flashattn_tensor q, k, v; /* inputs */
  flashattn_tensor out;     /* output, same shape as q; in dtype (FP8: in fp8.out_dtype) */
  float* lse;               /* output, may be NULL (inference) */
  flashattn_options options;
  flashattn_varlen varlen;
  /* Appended (read only when struct_size covers it). Output, may be NULL: the LSE in fp64,
   * for dtype FLASHATTN_DTYPE_FP64 only, 8-byte aligned, same layout as `lse`. Set at most one
   * of `lse` and `lse_fp64`. Only the reference backend writes it (AUTO picks reference for
   * fp64); other backends refuse it (FLASHATTN_ERROR_NOT_SUPPORTED naming lse_fp64). */
  double* lse_fp64;
  /* Appended with dropout and ALiBi (read only when struct_size covers them). */
  uint64_t dropout_seed;   /* Philox key, when options.dropout_p > 0 */
  uint64_t dropout_offset; /* Philox counter offset (see Dropout above) */
  /* Optional: {seed, offset} as two uint64 in the tensors' memory space, read when the call
   * runs instead of the two values above; a device pointer lets a captured CUDA graph draw a
   * fresh seed per replay (the Python layer fills it with torch's generator). */
  const uint64_t* dropout_rng_state;
  /* Optional ALiBi slopes, fp32 in the tensors' memory space: [nheads_q] (batch stride 0) or
   * [batch, nheads_q] with alibi_batch_stride >= nheads_q elements between sequences. */
  const float* alibi_slopes;
  int64_t alibi_batch_stride;
  /* Appended for inference (read only when struct_size covers them). */
  flashattn_kv_cache kv_cache; /* KV cache / paged KV / append / rotary; zero = off */
  int32_t num_splits;          /* split-KV: 0 = the path's heuristic, 1 = never split, n > 1 = n key
                                  ranges (fewer if the keys have fewer blocks) merged as
                                  flashattn_combine does. CUDA paths, KV-cache calls; the host paths
                                  never split: the value changes no result, only rounding */
  /* Appended for FP8 attention (read only when struct_size covers it): the scales of dtype
   * FLASHATTN_DTYPE_FP8_E4M3 inputs (see flashattn_fp8_scales); zero for other dtypes. */
  flashattn_fp8_scales fp8;
  /* Appended (read only when struct_size covers it): v's layout for dtype fp8_e4m3
   * (flashattn_fp8_v_layout); 0 (rows, as q and k) for other dtypes. */
  int32_t fp8_v_layout;
} flashattn_fwd_params;

typedef struct flashattn_bwd_params {
  uint32_t struct_size; /* sizeof(flashattn_bwd_params) */
  flashattn_dtype dtype;
  flashattn_tensor q, k, v, out, dout; /* inputs (out from the forward) */
  const float* lse;                    /* input, from the forward */
  flashattn_tensor dq, dk, dv;         /* outputs */
  flashattn_options options;
  flashattn_varlen varlen;
  /* Appended (read only when struct_size covers it). Input: the forward's fp64 LSE, in place of
   * `lse` (set exactly one), under the same rules as flashattn_fwd_params.lse_fp64. */
  const double* lse_fp64;
  /* Appended with dropout and ALiBi (read only when struct_size covers them). */
  uint64_t dropout_seed;   /* Philox key, the forward's (the backward regenerates the same mask) */
  uint64_t dropout_offset; /* Philox counter offset (see Dropout above) */
  /* Optional: {seed, offset} as two uint64 in the tensors' memory space, read when the call
   * runs instead of the two values above; a device pointer lets a captured CUDA graph draw a
   * fresh seed per replay (the Python layer fills it with torch's generator). */
  const uint64_t* dropout_rng_state;
  /* Optional ALiBi slopes, fp32 in the tensors' memory space: [nheads_q] (batch stride 0) or
   * [batch, nheads_q] with alibi_batch_stride >= nheads_q elements between sequences. */
  const float* alibi_slopes;
  int64_t alibi_batch_stride;
} flashattn_bwd_params;

typedef struct flashattn_device_info {
  int32_t device;
  int32_t cc_major, cc_minor;
  int32_t multiprocessors;
  flashattn_backend fwd_backend; /* what AUTO picks for fp16/bf16 hdim 128 */
  flashattn_backend bwd_backend;
  char name[128];
} flashattn_device_info;

/* Defaults matching flash_attn_func: scale 1/sqrt(d), no mask, host tensors, backend AUTO. */
FLASHATTN_API flashattn_options flashattn_default_options(void);
FLASHATTN_API flashattn_fwd_params flashattn_fwd_params_init(void);
FLASHATTN_API flashattn_bwd_params flashattn_bwd_params_init(void);

/* Bytes of scratch a call needs; pass at least that to the call (16-byte aligned, in the tensors' memory
 * space), or NULL to let it allocate. */
FLASHATTN_API flashattn_status flashattn_fwd_workspace_size(const flashattn_fwd_params* params,
                                                            size_t* bytes);
FLASHATTN_API flashattn_status flashattn_bwd_workspace_size(const flashattn_bwd_params* params,
                                                            size_t* bytes);

/* stream: a cudaStream_t (NULL = legacy default stream); ignored for host tensors.
 * Device calls are asynchronous with respect to the host. */
FLASHATTN_API flashattn_status flashattn_fwd(const flashattn_fwd_params* params, void* workspace,
                                             size_t workspace_bytes, void* stream);
FLASHATTN_API flashattn_status flashattn_bwd(const flashattn_bwd_params* params, void* workspace,
                                             size_t workspace_bytes, void* stream);

/* Thread-local message of the last failing call on this thread ("" after success). */
FLASHATTN_API const char* flashattn_last_error(void);
FLASHATTN_API const char* flashattn_status_string(flashattn_status status);
FLASHATTN_API const char* flashattn_backend_name(flashattn_backend backend);

FLASHATTN_API const char* flashattn_version(void); /* "MAJOR.MINOR.PATCH" */
/* Which backends this build contains (bit 1 << backend). */
FLASHATTN_API uint32_t flashattn_compiled_backends(void);
/* Capability of CUDA device `device`; FLASHATTN_ERROR_NO_DEVICE without one. */
FLASHATTN_API flashattn_status flashattn_device_capability(int32_t device,
                                                           flashattn_device_info* info);

/* ---- Combining partial attention results (split-KV, cascade / prefix caching) ----------------
 * Attention over key ranges computed separately gives partial outputs O_s and their LSEs (as
 * flashattn_fwd returns them: natural log, -inf for a row that saw no key). flashattn_combine
 * merges them into the attention over the union of the ranges:
 *   LSE = log(sum_s exp(LSE_s)),  O = sum_s exp(LSE_s - LSE) O_s
 * A row whose every LSE_s is -inf gets O = 0 and LSE = -inf (never NaN); a split whose LSE_s is
 * -inf contributes nothing (its O_s is not read, so it may hold anything). A NaN LSE_s, or an
 * LSE_s of +inf, makes its row NaN. Host tensors: fp16/bf16/fp32 accumulate in fp32, fp64 in fp64.
 * CUDA tensors (options.device >= 0): fp16/bf16/fp32 with fp32 LSEs, one kernel on `stream`
 * (the one the GPU paths' split-KV uses), fp32 accumulation; fp64 stays on the host. Fixed-length
 * layout only (no varlen). */
typedef struct flashattn_combine_params {
  uint32_t struct_size; /* sizeof(flashattn_combine_params) */
  flashattn_dtype dtype; /* of out_partial and out */
  int32_t num_splits;    /* >= 1; must equal out_partial_shape[0] */
  /* Input: the partial outputs stacked, [num_splits, batch, seqlen_q, nheads, headdim], strides in
   * elements (>= 0, out_partial_stride[4] must be 1): what a split-KV kernel writes. */
  const void* out_partial;
  int64_t out_partial_shape[5];
  int64_t out_partial_stride[5];
  /* Input: the partial LSEs, [num_splits, batch, nheads, seqlen_q] (shape implied by
   * out_partial_shape), strides in elements (>= 0). fp32 in lse_partial, or, for dtype fp64 only,
   * fp64 in lse_partial_fp64 (set exactly one). */
  const float* lse_partial;
  const double* lse_partial_fp64;
  int64_t lse_partial_stride[4];
  /* Output: [batch, seqlen_q, nheads, headdim], the shape of one split. */
  flashattn_tensor out;
  /* Optional outputs: the combined LSE, contiguous [batch, nheads, seqlen_q]; fp32 in lse or (dtype
   * fp64 only) fp64 in lse_fp64; set at most one. */
  float* lse;
  double* lse_fp64;
  /* Only backend (AUTO, CPU or REFERENCE for host tensors: all run the same host code), device and
   * num_threads are read; the attention options are ignored. */
  flashattn_options options;
} flashattn_combine_params;

/* struct_size set, dtype bf16, num_splits 1, host tensors, backend AUTO, everything else 0/NULL. */
FLASHATTN_API flashattn_combine_params flashattn_combine_params_init(void);
/* stream: a cudaStream_t for device tensors; ignored for host tensors (the call is synchronous). */
FLASHATTN_API flashattn_status flashattn_combine(const flashattn_combine_params* params, void* stream);

/* ---- FP8 quantization (block scales, optional Hadamard transform) -----------------------------
 * Prepares Q, K or V for FP8 attention (FlashAttention-3): x [batch, seqlen, nheads, headdim] is
 * cut along seqlen into blocks of block_size tokens per (batch, head), each with one fp32 scale:
 *   x'     = x, or with hadamard = 1, H (signs * x) / sqrt(headdim) along headdim (an orthogonal
 *            map: pass the same seed for Q and K and their dot products are unchanged; H is the
 *            Sylvester-Hadamard matrix, signs[c] = +-1 from Philox keyed by hadamard_seed; see
 *            src/common/hadamard.h), computed in fp64 and rounded to fp32;
 *   amax   = max |x'| over the block's finite values;
 *   scale  = amax / 448 in fp32, at least FLT_MIN (2^-126); 1 for a block whose amax is 0;
 *   x_fp8  = E4M3(x' / scale) (fp32 division, round to nearest even, |.| > 448 saturates to 448,
 *            NaN stays NaN: an infinite x' becomes +-448, a NaN one NaN).
 * E4M3 is the "fn" encoding of torch.float8_e4m3fn / __nv_fp8_e4m3 (bias 7, max 448, no inf).
 * Scales are contiguous fp32 [batch, nheads, ceil(seqlen / block_size)]; the last block of a
 * sequence may be short; block_size >= seqlen gives one scale per (batch, head). The error of one
 * element, |scale * x_fp8 - x'|, is at most 2^-4 |x'| where |x'| >= 2^-6 scale, and at most
 * 2^-10 scale below that (half an E4M3 step), plus fp32 rounding (see docs/fp8.md).
 * flashattn_fp8_dequantize reads x_fp8 and scales and writes x = the inverse transform of
 * scale * x_fp8, rounded to dtype. CUDA tensors (options.device >= 0): flashattn_fp8_quantize
 * runs on the GPU for fp16, bf16 and fp32 x (fp64: NOT_SUPPORTED), asynchronously on `stream`; it
 * computes the transform in fp32 rather than fp64, so with hadamard = 1 a scale may differ from
 * the host's in its last bits and a code by one E4M3 step where x' / scale lies on a rounding
 * boundary (without the transform the results are the host's bit for bit, fp32 inputs in the
 * denormal range aside: the GPU flushes them to 0). flashattn_fp8_dequantize of CUDA tensors
 * returns FLASHATTN_ERROR_NOT_SUPPORTED.
 * x_fp8_layout FLASHATTN_FP8_V_KEYS_PERMUTED16 writes (and dequantize reads) x_fp8 in the layout the
 * FP8 attention takes for v (flashattn_fp8_v_layout: x_fp8.stride[1] = 1, x_fp8.stride[3] = L a
 * multiple of 16 >= seqlen rounded up to 16, rows that do not overlap), so a V quantized that way
 * needs no separate flashattn_fp8_v_keys_permuted16 pass; quantize writes 0 to every position of a
 * row that holds no key (seqlen >= 1). The codes and scales are those of the rows layout. */
typedef struct flashattn_fp8_quantize_params {
  uint32_t struct_size;  /* sizeof(flashattn_fp8_quantize_params) */
  flashattn_dtype dtype; /* of x: fp16, bf16, fp32 or fp64 */
  /* [batch, seqlen, nheads, headdim], strides in elements (>= 0, stride[3] = 1). Quantize: input;
   * dequantize: output. */
  flashattn_tensor x;
  /* E4M3 codes (1 byte each), the shape of x, strides in elements = bytes (>= 0, stride[3] = 1).
   * Quantize: output; dequantize: input. Must not overlap x or scales. */
  flashattn_tensor x_fp8;
  /* Contiguous fp32 [batch, nheads, ceil(seqlen / block_size)], 4-byte aligned. Quantize: output;
   * dequantize: input. */
  float* scales;
  int32_t block_size;     /* tokens per scale block, >= 1 */
  int32_t hadamard;       /* 0 or 1; 1 needs headdim a power of two in [16, 256] */
  uint64_t hadamard_seed; /* keys the random signs (with hadamard = 1) */
  /* Only backend (AUTO, CPU or REFERENCE for host tensors: all run the same host code), device
   * and num_threads are read; the attention options are ignored. */
  flashattn_options options;
  /* The layout of x_fp8: FLASHATTN_FP8_V_ROWS (0, x's layout: x_fp8.stride[3] = 1) or
   * FLASHATTN_FP8_V_KEYS_PERMUTED16 (1, above). */
  int32_t x_fp8_layout;
} flashattn_fp8_quantize_params;

/* struct_size set, dtype bf16, block_size 128, hadamard off, host tensors, backend AUTO, strides
 * [3] = 1, everything else 0/NULL. */
FLASHATTN_API flashattn_fp8_quantize_params flashattn_fp8_quantize_params_init(void);
/* stream: a cudaStream_t for device tensors; ignored for host tensors (the calls are synchronous). */
FLASHATTN_API flashattn_status flashattn_fp8_quantize(const flashattn_fp8_quantize_params* params, void* stream);
FLASHATTN_API flashattn_status flashattn_fp8_dequantize(const flashattn_fp8_quantize_params* params, void* stream);

/* ---- FP8 V into the keys_permuted16 layout -------------------------------------------------------
 * Copies the E4M3 codes of v [batch, seqlen, nheads, headdim] (rows: any strides >= 0, stride[3] = 1)
 * into v_out, the same shape in the layout FLASHATTN_FP8_V_KEYS_PERMUTED16 (above): v_out.stride[1] = 1,
 * v_out.stride[3] = L (a multiple of 16, >= seqlen rounded up to 16), and rows that do not overlap:
 * v_out.stride[2] >= headdim * L, v_out.stride[0] >= nheads * v_out.stride[2]. Every position of a row
 * that holds no key (from seqlen up to L) is written 0. v_out must not overlap v. Host tensors
 * (options.device = -1) or CUDA tensors (asynchronous on `stream`; 16-byte aligned v_out.data). */
typedef struct flashattn_fp8_v_permute_params {
  uint32_t struct_size; /* sizeof(flashattn_fp8_v_permute_params) */
  flashattn_tensor v;     /* input, E4M3 rows */
  flashattn_tensor v_out; /* output, keys_permuted16 */
  /* Only device and num_threads are read. */
  flashattn_options options;
} flashattn_fp8_v_permute_params;

/* struct_size set, host tensors, v.stride[3] = 1, everything else 0/NULL. */
FLASHATTN_API flashattn_fp8_v_permute_params flashattn_fp8_v_permute_params_init(void);
FLASHATTN_API flashattn_status flashattn_fp8_v_keys_permuted16(const flashattn_fp8_v_permute_params* params,
                                                              void* stream);

#ifdef __cplusplus
}
#endif
#endif /* FLASHATTN_FLASHATTN_H */
