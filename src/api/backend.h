// The one table of compute paths. Each path (reference, cpu, sm80, sm90) defines one Backend
// in its own library; src/api/dispatch.cpp lists those compiled in and picks one per call.
// Params reaching a backend are validated (src/api/validate.cpp): shapes, strides, alignment,
// mask bounds and cu_seqlens are consistent; the backend only checks what it supports.
#pragma once

#include <cstddef>

#include "common/params.h"
#include "flashattn/flashattn.h"

namespace flashattn {

struct Backend {
  flashattn_backend id;
  bool on_device;     // CUDA tensors (true) or host tensors (false)
  int min_cc;         // lowest compute capability (major*10+minor) it runs on; 0 for host
  int max_cc;         // highest (sm90a code runs on exactly 90); 0 = no limit

  // nullptr when the problem is supported; otherwise a message naming the unsupported field,
  // e.g. "headdim 48 is not compiled for sm80 (compiled: 32 64 96 128 192 256)".
  const char* (*fwd_unsupported)(const FwdParams&);
  size_t (*fwd_workspace)(const FwdParams&);
  // stream is a cudaStream_t for device backends. Returns FLASHATTN_SUCCESS or calls
  // set_error() (src/common/error.h) and returns its status.
  flashattn_status (*fwd)(const FwdParams&, void* workspace, void* stream);

  const char* (*bwd_unsupported)(const BwdParams&);
  size_t (*bwd_workspace)(const BwdParams&);
  flashattn_status (*bwd)(const BwdParams&, void* workspace, void* stream);
};

// Defined by each path's library; declared here so dispatch can list them.
extern const Backend kReferenceBackend;
extern const Backend kCpuBackend;
extern const Backend kSm80Backend;  // only when FLASHATTN_HAS_SM80
extern const Backend kSm90Backend;  // only when FLASHATTN_HAS_SM90

}  // namespace flashattn
