// kSm90Backend: the Hopper (sm90a) path. The backward lives in bwd_launch.cu; a head dim
// without an sm90 backward falls back to the sm80 path in the dispatch. Forward head dims
// are instantiated by the generated fwd_hdim<D>_<dtype>.cu files (FLASHATTN_SM90_HDIM_<D>
// says which exist).
#include <algorithm>
#include <atomic>
#include <cstdio>

#include "api/backend.h"
#include "api/cuda_util.h"
#include "cpu/fp8_quantize.h"
#include "common/error.h"
#include "common/headdim.h"
#include "flashattn/flashattn_experimental.h"
#include "sm90/bwd_entry.h"
#include "sm90/launch.h"

namespace flashattn {
namespace sm90 {
namespace {

#if defined(FLASHATTN_SM90_ABLATION)
// The schedule of the next launches (flashattn_sm90_set_ablation); 1, 1 = the production one.
std::atomic<int> g_pingpong{1};
std::atomic<int> g_overlap{1};
#endif

#define FA_SM90_EXTERN(D, S)                                                                               \
  extern template flashattn_status launch_fwd<D, cutlass::half_t, S>(const FwdParams&, cudaStream_t,       \
                                                                     const LaunchOptions&);               \
  extern template flashattn_status launch_fwd<D, cutlass::bfloat16_t, S>(const FwdParams&, cudaStream_t,   \
                                                                         const LaunchOptions&);
#if defined(FLASHATTN_SM90_ABLATION)  // generated fwd_hdim<D>_<dtype>_<schedule>.cu files
#define FA_SM90_FOR_EACH_DTYPE(D)                                                                          \
  FA_SM90_EXTERN(D, Schedule<>)                                                                            \
  FA_SM90_EXTERN(D, SchedulePingpongOff)                                                                   \
  FA_SM90_EXTERN(D, ScheduleOverlapOff)                                                                    \
  FA_SM90_EXTERN(D, ScheduleBothOff)
#else
#define FA_SM90_FOR_EACH_DTYPE(D) FA_SM90_EXTERN(D, Schedule<>)
#endif

}  // namespace
#define FA_SM90_FP8_EXTERN(D)                                                                              \
  extern template flashattn_status launch_fwd_fp8<D, cutlass::half_t>(const FwdParams&, cudaStream_t,      \
                                                                      const LaunchOptions&);              \
  extern template flashattn_status launch_fwd_fp8<D, cutlass::bfloat16_t>(const FwdParams&, cudaStream_t,  \
                                                                          const LaunchOptions&);
#if defined(FLASHATTN_SM90_FP8_HDIM_64)
FA_SM90_FP8_EXTERN(64)
#endif
#if defined(FLASHATTN_SM90_FP8_HDIM_128)
FA_SM90_FP8_EXTERN(128)
#endif
#if defined(FLASHATTN_SM90_FP8_HDIM_256)
FA_SM90_FP8_EXTERN(256)
#endif
#if defined(FLASHATTN_SM90_HDIM_64)
FA_SM90_FOR_EACH_DTYPE(64)
#endif
#if defined(FLASHATTN_SM90_HDIM_96)
FA_SM90_FOR_EACH_DTYPE(96)
#endif
#if defined(FLASHATTN_SM90_HDIM_128)
FA_SM90_FOR_EACH_DTYPE(128)
#endif
#if defined(FLASHATTN_SM90_HDIM_192)
FA_SM90_FOR_EACH_DTYPE(192)
#endif
#if defined(FLASHATTN_SM90_HDIM_256)
FA_SM90_FOR_EACH_DTYPE(256)
#endif

namespace {

using LaunchFn = flashattn_status (*)(const FwdParams&, cudaStream_t, const LaunchOptions&);

template <int D, class S>
LaunchFn pick_dtype(flashattn_dtype dt) {
  return dt == FLASHATTN_DTYPE_FP16 ? &launch_fwd<D, cutlass::half_t, S> : &launch_fwd<D, cutlass::bfloat16_t, S>;
}

template <int D>
LaunchFn pick(flashattn_dtype dt) {
#if defined(FLASHATTN_SM90_ABLATION)
  const bool pingpong = g_pingpong.load(std::memory_order_relaxed) != 0;
  const bool overlap = g_overlap.load(std::memory_order_relaxed) != 0;
  if (!pingpong) return overlap ? pick_dtype<D, SchedulePingpongOff>(dt) : pick_dtype<D, ScheduleBothOff>(dt);
  if (!overlap) return pick_dtype<D, ScheduleOverlapOff>(dt);
#endif
  return pick_dtype<D, Schedule<>>(dt);
}

// The head dim of the kernel a problem runs on: its own, or the next larger compiled one (the
// TMA loads zero-fill the columns past the tensors' head dim and the stores clip them). 0 when
// none fits, or the head dim is not a multiple of 8 (TMA needs 16-byte rows; the Python layer
// pads those, as flash_attn does).
int kernel_headdim(int headdim) {
  static constexpr int kCompiled[] = {
#if defined(FLASHATTN_SM90_HDIM_64)
      64,
#endif
#if defined(FLASHATTN_SM90_HDIM_96)
      96,
#endif
#if defined(FLASHATTN_SM90_HDIM_128)
      128,
#endif
#if defined(FLASHATTN_SM90_HDIM_192)
      192,
#endif
#if defined(FLASHATTN_SM90_HDIM_256)
      256,
#endif
      0};
  return kernel_headdim_for(headdim, kCompiled);
}

// FP8: the head dims with an FP8 kernel (the same rounding up as kernel_headdim).
int kernel_headdim_fp8(int headdim) {
  static constexpr int kCompiled[] = {
#if defined(FLASHATTN_SM90_FP8_HDIM_64)
      64,
#endif
#if defined(FLASHATTN_SM90_FP8_HDIM_128)
      128,
#endif
#if defined(FLASHATTN_SM90_FP8_HDIM_256)
      256,
#endif
      0};
  return kernel_headdim_for(headdim, kCompiled);
}

template <int D>
LaunchFn pick_fp8(flashattn_dtype out) {
  return out == FLASHATTN_DTYPE_FP16 ? &launch_fwd_fp8<D, cutlass::half_t> : &launch_fwd_fp8<D, cutlass::bfloat16_t>;
}

LaunchFn find_launch_fp8(int headdim, flashattn_dtype out) {
  switch (kernel_headdim_fp8(headdim)) {
#if defined(FLASHATTN_SM90_FP8_HDIM_64)
    case 64: return pick_fp8<64>(out);
#endif
#if defined(FLASHATTN_SM90_FP8_HDIM_128)
    case 128: return pick_fp8<128>(out);
#endif
#if defined(FLASHATTN_SM90_FP8_HDIM_256)
    case 256: return pick_fp8<256>(out);
#endif
    default: return nullptr;
  }
}

LaunchFn find_launch(int headdim, flashattn_dtype dt) {
  switch (kernel_headdim(headdim)) {
#if defined(FLASHATTN_SM90_HDIM_64)
    case 64: return pick<64>(dt);
#endif
#if defined(FLASHATTN_SM90_HDIM_96)
    case 96: return pick<96>(dt);
#endif
#if defined(FLASHATTN_SM90_HDIM_128)
    case 128: return pick<128>(dt);
#endif
#if defined(FLASHATTN_SM90_HDIM_192)
    case 192: return pick<192>(dt);
#endif
#if defined(FLASHATTN_SM90_HDIM_256)
    case 256: return pick<256>(dt);
#endif
    default: return nullptr;
  }
}

// What the FP8 kernel cannot run: one scale per warpgroup of query rows (64) and per key tile
// (128), so the block sizes must be multiples of those unless one block covers the sequence.
const char* fp8_unsupported(const FwdParams& p) {
  static thread_local char msg[200];
  if (p.fp8.out_dtype != FLASHATTN_DTYPE_BF16 && p.fp8.out_dtype != FLASHATTN_DTYPE_FP16)
    return "fp8.out_dtype: sm90 FP8 writes bf16 or fp16";
  if (p.dropout.threshold != 0) return "dropout_p: dropout is not supported with dtype fp8_e4m3 (forward-only FP8)";
  if (find_launch_fp8(p.shape.headdim, p.fp8.out_dtype) == nullptr) {
    if (p.shape.headdim % 16 != 0)
      std::snprintf(msg, sizeof(msg), "headdim %d: sm90 FP8 needs a multiple of 16 (16-byte rows for TMA; pad the "
                    "head dim)", p.shape.headdim);
    else
      std::snprintf(msg, sizeof(msg), "headdim %d: no sm90 FP8 kernel for it in this build (FP8 kernels: 64, 128, "
                    "256 where compiled; compiled: %s; the reference backend runs any on host tensors)",
                    p.shape.headdim, FLASHATTN_SM90_HEADDIMS_STR);
    return msg;
  }
  constexpr int kRowsPerQScale = 64, kKeysPerKScale = 128;
  if (p.fp8.q_blocks > 1 && p.fp8.q_block_size % kRowsPerQScale != 0) {
    std::snprintf(msg, sizeof(msg), "fp8.q_block_size: %d: sm90 FP8 needs a multiple of %d (or one block per "
                  "sequence); the reference backend runs any on host tensors", p.fp8.q_block_size, kRowsPerQScale);
    return msg;
  }
  if (p.fp8.k_blocks > 1 && p.fp8.k_block_size % kKeysPerKScale != 0) {
    std::snprintf(msg, sizeof(msg), "fp8.k_block_size: %d: sm90 FP8 needs a multiple of %d (or one block per "
                  "sequence); the reference backend runs any on host tensors", p.fp8.k_block_size, kKeysPerKScale);
    return msg;
  }
  return nullptr;
}

const char* fwd_unsupported(const FwdParams& p) {
  static thread_local char msg[160];
  if (p.kv.enabled()) {
    std::snprintf(msg, sizeof(msg), "%s: the KV cache has no sm90 kernel yet; backend auto or sm80 runs it on the "
                  "sm80 kernels", p.kv.field_in_use());
    return msg;
  }
  if (p.dtype == FLASHATTN_DTYPE_FP8_E4M3) {
    if (const char* why = fp8_unsupported(p)) return why;
  } else if (p.dtype != FLASHATTN_DTYPE_FP16 && p.dtype != FLASHATTN_DTYPE_BF16)
    return "dtype: only fp16 and bf16 are supported by sm90";
  if (p.dtype != FLASHATTN_DTYPE_FP8_E4M3 && find_launch(p.shape.headdim, p.dtype) == nullptr) {
    if (p.shape.headdim % 8 != 0)
      std::snprintf(msg, sizeof(msg), "headdim %d: sm90 needs a multiple of 8 (16-byte rows for TMA; pad the head dim)",
                    p.shape.headdim);
    else
      std::snprintf(msg, sizeof(msg), "headdim %d is larger than every head dim compiled for sm90 (compiled: %s)",
                    p.shape.headdim, FLASHATTN_SM90_HEADDIMS_STR);
    return msg;
  }
  const flashattn::Shape& sh = p.shape;
  const TmaExtents e = TmaExtents::of(p);
  if (const char* name = tma_broadcast_operand({{"q", p.q_stride, e.rows_q, sh.nheads_q},
                                                {"k", p.k_stride, e.rows_k, sh.nheads_kv},
                                                {"v", p.v_stride, e.rows_k, sh.nheads_kv},
                                                {"out", p.o_stride, e.rows_q, sh.nheads_q}},
                                               e.batch)) {
    std::snprintf(msg, sizeof(msg), "%s.stride: zero strides (broadcast) are not supported by sm90 (TMA)", name);
    return msg;
  }
  return nullptr;
}

// fp8_v_layout rows_auto: copy v into the keys_permuted16 layout (one read and one write of v, the
// C API's flashattn_fp8_v_keys_permuted16) and run the V^T kernel, where the kernel's savings exceed
// the copy. The savings grow with the (query row, key) pairs a key of V meets, the copy with V's
// size, so the rule is on their ratio: unmasked pairs per key and kv head. Measured on an H200
// (hdim 128, 16k tokens x 16 heads, s35, docs/fp8.md): the copy ~30 us; the kernel saved 14-15 us
// at 1024 rows (no mask or causal), 20-21 us at 2048 causal (~1024 pairs per key), 54-73 us at
// 2048 without a mask and 56-75 us at 4096 causal (~2048 pairs per key), 120-600 us beyond.
constexpr double kFp8VCopyMinPairsPerKey = 1536;

// Unmasked (query row, key) pairs of one (batch, query head): exact without a window; with one (causal
// included), summed over up to 257 evenly spaced rows and scaled (a cost estimate, O(1) per call).
double unmasked_pairs(const FwdParams& p) {
  const int64_t sq = p.shape.seqlen_q, sk = p.shape.seqlen_k;
  if (!masked_problem(p)) return double(sq) * double(sk);
  const int64_t wl = p.mask.window_left, wr = p.mask.window_right, offset = sk - sq;  // bottom-right aligned
  const int64_t samples = std::min<int64_t>(sq, 257);
  double keys = 0;
  for (int64_t j = 0; j < samples; ++j) {
    const int64_t i = samples == 1 ? 0 : j * (sq - 1) / (samples - 1);
    const int64_t lo = wl < 0 ? 0 : std::max<int64_t>(0, i + offset - wl);
    const int64_t hi = wr < 0 ? sk - 1 : std::min<int64_t>(sk - 1, i + offset + wr);
    keys += double(std::max<int64_t>(0, hi - lo + 1));
  }
  return keys / double(samples) * double(sq);
}

// The row length of the V^T copy, or 0 where the call reads v as it is.
int64_t fp8_v_copy_row_len(const FwdParams& p) {
  if (p.dtype != FLASHATTN_DTYPE_FP8_E4M3 || !p.fp8.v_rows_auto || p.fp8.v_keys_permuted16 || p.cu_seqlens_q)
    return 0;
  const Shape& s = p.shape;
  if (s.seqlen_k <= 0 || unmasked_pairs(p) * s.group_size() < kFp8VCopyMinPairsPerKey * s.seqlen_k) return 0;
  return (int64_t(s.seqlen_k) + 15) / 16 * 16;
}

// The copy's bytes, rounded up so that what follows it stays aligned.
size_t fp8_v_copy_bytes(const FwdParams& p) {
  const int64_t len = fp8_v_copy_row_len(p);
  const Shape& s = p.shape;
  return len == 0 ? 0 : size_t((int64_t(s.batch) * s.nheads_kv * s.headdim * len + 255) / 256 * 256);
}

size_t fwd_workspace(const FwdParams& p) { return fp8_v_copy_bytes(p) + fwd_workspace_bytes(p); }

flashattn_status fwd(const FwdParams& p, void* workspace, void* stream) {
  LaunchFn fn = p.dtype == FLASHATTN_DTYPE_FP8_E4M3 ? find_launch_fp8(p.shape.headdim, p.fp8.out_dtype)
                                                    : find_launch(p.shape.headdim, p.dtype);
  if (fn == nullptr) return set_error(FLASHATTN_ERROR_NOT_SUPPORTED, "%s", fwd_unsupported(p));
  const int64_t len = fp8_v_copy_row_len(p);
  if (len == 0) return fn(p, static_cast<cudaStream_t>(stream), LaunchOptions{workspace});
  // v (rows) -> V^T at the workspace's start; the kernel then reads the copy (validate.cpp's keys_permuted16 form).
  const Shape& s = p.shape;
  cpu::Fp8VPermuteParams c;
  c.batch = s.batch;
  c.seqlen = s.seqlen_k;
  c.nheads = s.nheads_kv;
  c.headdim = s.headdim;
  c.v = static_cast<const uint8_t*>(p.v);
  c.v_stride[0] = p.v_stride.batch;
  c.v_stride[1] = p.v_stride.row;
  c.v_stride[2] = p.v_stride.head;
  c.out = static_cast<uint8_t*>(workspace);
  c.out_stride[0] = int64_t(s.nheads_kv) * s.headdim * len;
  c.out_stride[1] = int64_t(s.headdim) * len;
  c.row_len = len;
  flashattn_status st = cuda::fp8_v_keys_permuted16(c, stream);
  if (st != FLASHATTN_SUCCESS) return st;
  FwdParams vt = p;
  vt.v = workspace;
  vt.v_stride = RowStrides{c.out_stride[0], 1, c.out_stride[1]};
  vt.fp8.v_keys_permuted16 = true;
  vt.fp8.v_col_stride = len;
  const size_t copy = fp8_v_copy_bytes(p);
  void* rest = fwd_workspace_bytes(p) ? static_cast<uint8_t*>(workspace) + copy : nullptr;
  return fn(vt, static_cast<cudaStream_t>(stream), LaunchOptions{rest});
}

}  // namespace
}  // namespace sm90

extern const Backend kSm90Backend;
const Backend kSm90Backend = {
    FLASHATTN_BACKEND_SM90, /*on_device=*/true, /*min_cc=*/90, /*max_cc=*/90,
    &sm90::fwd_unsupported, &sm90::fwd_workspace, &sm90::fwd,
    &sm90::bwd_unsupported, &sm90::bwd_workspace, &sm90::bwd,
};

}  // namespace flashattn

extern "C" FLASHATTN_API flashattn_status flashattn_sm90_set_ablation(int pingpong, int intra_warpgroup_overlap) {
  if ((pingpong != 0 && pingpong != 1) || (intra_warpgroup_overlap != 0 && intra_warpgroup_overlap != 1))
    return flashattn::set_error(FLASHATTN_ERROR_INVALID_ARGUMENT,
                                "flashattn_sm90_set_ablation: pingpong %d, intra_warpgroup_overlap %d (0 or 1)",
                                pingpong, intra_warpgroup_overlap);
#if defined(FLASHATTN_SM90_ABLATION)
  flashattn::sm90::g_pingpong.store(pingpong);
  flashattn::sm90::g_overlap.store(intra_warpgroup_overlap);
#else
  if (pingpong != 1 || intra_warpgroup_overlap != 1)
    return flashattn::set_error(FLASHATTN_ERROR_NOT_SUPPORTED,
                                "flashattn_sm90_set_ablation: this build has only the production sm90 forward "
                                "(pingpong and intra-warpgroup overlap on); configure with "
                                "-DFLASHATTN_SM90_ABLATION=ON for the ablation kernels");
#endif
  flashattn::clear_error();
  return FLASHATTN_SUCCESS;
}
