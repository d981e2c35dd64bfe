// Validation of the C ABI structs and their normalization into FwdParams/BwdParams.
// Every rejected call names the offending field in flashattn_last_error().
#pragma once

#include <cstdint>

#include "common/error.h"
#include "common/params.h"
#include "flashattn/flashattn.h"

namespace flashattn {

struct CallContext {
  flashattn_backend backend;  // as requested (AUTO not yet resolved)
  int device;                 // -1 host
  bool nothing_to_do;         // every output is empty
  bool no_keys;               // fixed-length seqlen_k == 0 (outputs are zeros / -inf)
  bool no_queries;            // fixed-length seqlen_q == 0 (bwd: dk = dv = 0)
  int num_threads = 0;        // options.num_threads: host paths' workers, 0 = default
};

// Passed as `stream` by the workspace-size queries: validate without touching device memory.
inline void* const kSizeQuery = reinterpret_cast<void*>(~uintptr_t(0));

flashattn_status normalize_fwd(const flashattn_fwd_params* p, void* stream, FwdParams* out,
                               CallContext* ctx);
flashattn_status normalize_bwd(const flashattn_bwd_params* p, void* stream, BwdParams* out,
                               CallContext* ctx);

// For the entry points that read only options.backend, .device and .num_threads (flashattn_combine,
// flashattn_fp8_quantize): the backend is known, the device and backend agree, num_threads >= 0.
flashattn_status check_placement_options(const flashattn_options& o);
// Their common preamble: params non-null, struct_size this header's sizeof(P) (`what` names P), and
// check_placement_options(params->options).
template <class P>
flashattn_status check_params_header(const P* params, const char* what) {
  if (params == nullptr) return set_error(FLASHATTN_ERROR_INVALID_ARGUMENT, "params: NULL");
  if (params->struct_size != sizeof(P))
    return set_error(FLASHATTN_ERROR_INVALID_ARGUMENT,
                     "params.struct_size: %u, expected sizeof(%s) = %zu (header/library mismatch?)",
                     params->struct_size, what, sizeof(P));
  return check_placement_options(params->options);
}
// `ptr` (non-null) is aligned to `align` and lies in the memory space `device` says (-1: host;
// checked only in CUDA builds). The message names `name`.
flashattn_status check_pointer(const char* name, const void* ptr, size_t align, int device);

size_t dtype_size(flashattn_dtype dtype);
const char* dtype_name(flashattn_dtype dtype);

}  // namespace flashattn
