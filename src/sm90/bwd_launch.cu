// The sm90 backend's backward entry points: head dim / dtype -> the generated instantiation
// (bwd_hdim<D>_<dtype>.cu, FLASHATTN_SM90_BWD_HDIM_<D> says which exist).
#include <cstdio>

#include "common/error.h"
#include "common/headdim.h"
#include "sm90/bwd_launch.h"
#include "sm90/bwd_entry.h"

namespace flashattn::sm90 {

#define FA_SM90_BWD_FOR_EACH_DTYPE(D)                                                                   \
  extern template flashattn_status launch_bwd<D, cutlass::half_t>(const BwdParams&, void*, cudaStream_t); \
  extern template flashattn_status launch_bwd<D, cutlass::bfloat16_t>(const BwdParams&, void*, cudaStream_t);
#if defined(FLASHATTN_SM90_BWD_HDIM_64)
FA_SM90_BWD_FOR_EACH_DTYPE(64)
#endif
#if defined(FLASHATTN_SM90_BWD_HDIM_96)
FA_SM90_BWD_FOR_EACH_DTYPE(96)
#endif
#if defined(FLASHATTN_SM90_BWD_HDIM_128)
FA_SM90_BWD_FOR_EACH_DTYPE(128)
#endif
#if defined(FLASHATTN_SM90_BWD_HDIM_192)
FA_SM90_BWD_FOR_EACH_DTYPE(192)
#endif
#if defined(FLASHATTN_SM90_BWD_HDIM_256)
FA_SM90_BWD_FOR_EACH_DTYPE(256)
#endif

namespace {

struct BwdEntry {
  flashattn_status (*launch)(const BwdParams&, void*, cudaStream_t);
  size_t (*workspace)(const BwdParams&);
  bool ordered_dq;  // dQ goes through the writer warp, which can order it (deterministic mode)
};

template <int D>
BwdEntry pick(flashattn_dtype dt) {
  return {dt == FLASHATTN_DTYPE_FP16 ? &launch_bwd<D, cutlass::half_t> : &launch_bwd<D, cutlass::bfloat16_t>,
          &bwd_workspace_bytes<D>, BwdTraits<D, cutlass::bfloat16_t>::kDqBulkReduce};
}

// As the forward's kernel_headdim (launch.cu): the smallest compiled head dim >= headdim, for
// a multiple of 8; 0 when none.
int bwd_kernel_headdim(int headdim) {
  static constexpr int kCompiled[] = {
#if defined(FLASHATTN_SM90_BWD_HDIM_64)
      64,
#endif
#if defined(FLASHATTN_SM90_BWD_HDIM_96)
      96,
#endif
#if defined(FLASHATTN_SM90_BWD_HDIM_128)
      128,
#endif
#if defined(FLASHATTN_SM90_BWD_HDIM_192)
      192,
#endif
#if defined(FLASHATTN_SM90_BWD_HDIM_256)
      256,
#endif
      0};
  return kernel_headdim_for(headdim, kCompiled);
}

BwdEntry find_bwd(int headdim, flashattn_dtype dt) {
  switch (bwd_kernel_headdim(headdim)) {
#if defined(FLASHATTN_SM90_BWD_HDIM_64)
    case 64: return pick<64>(dt);
#endif
#if defined(FLASHATTN_SM90_BWD_HDIM_96)
    case 96: return pick<96>(dt);
#endif
#if defined(FLASHATTN_SM90_BWD_HDIM_128)
    case 128: return pick<128>(dt);
#endif
#if defined(FLASHATTN_SM90_BWD_HDIM_192)
    case 192: return pick<192>(dt);
#endif
#if defined(FLASHATTN_SM90_BWD_HDIM_256)
    case 256: return pick<256>(dt);
#endif
    default: return {nullptr, nullptr, false};
  }
}

}  // namespace

const char* bwd_unsupported(const BwdParams& p) {
  static thread_local char msg[160];
  if (p.dtype != FLASHATTN_DTYPE_FP16 && p.dtype != FLASHATTN_DTYPE_BF16)
    return "dtype: only fp16 and bf16 are supported by sm90";
  const BwdEntry e = find_bwd(p.shape.headdim, p.dtype);
  if (e.launch == nullptr) {
    std::snprintf(msg, sizeof(msg), "headdim %d has no sm90 backward in this build (compiled: %s%s)", p.shape.headdim,
                  FLASHATTN_SM90_BWD_HEADDIMS_STR, p.shape.headdim % 8 != 0 ? "; needs a multiple of 8" : "");
    return msg;
  }
  // Its dQ is added by atomics from registers (no smem left for the ordered bulk reduce).
  if (p.deterministic && !e.ordered_dq) {
    std::snprintf(msg, sizeof(msg), "deterministic: the sm90 backward at headdim %d (kernel %d) is not deterministic "
                  "(sm80's is)", p.shape.headdim, bwd_kernel_headdim(p.shape.headdim));
    return msg;
  }
  const Shape& sh = p.shape;
  const TmaExtents x = TmaExtents::of(p);
  if (const char* name = tma_broadcast_operand({{"q", p.q_stride, x.rows_q, sh.nheads_q},
                                                {"dout", p.dout_stride, x.rows_q, sh.nheads_q},
                                                {"k", p.k_stride, x.rows_k, sh.nheads_kv},
                                                {"v", p.v_stride, x.rows_k, sh.nheads_kv},
                                                {"dk", p.dk_stride, x.rows_k, sh.nheads_kv},
                                                {"dv", p.dv_stride, x.rows_k, sh.nheads_kv}},
                                               x.batch)) {
    std::snprintf(msg, sizeof(msg), "%s.stride: zero strides (broadcast) are not supported by sm90 (TMA)", name);
    return msg;
  }
  return nullptr;
}

size_t bwd_workspace(const BwdParams& p) {
  const BwdEntry e = find_bwd(p.shape.headdim, p.dtype);
  return e.workspace != nullptr ? e.workspace(p) : 0;
}

flashattn_status bwd(const BwdParams& p, void* workspace, void* stream) {
  if (const char* why = bwd_unsupported(p)) return set_error(FLASHATTN_ERROR_NOT_SUPPORTED, "%s", why);
  return find_bwd(p.shape.headdim, p.dtype).launch(p, workspace, static_cast<cudaStream_t>(stream));
}

}  // namespace flashattn::sm90
