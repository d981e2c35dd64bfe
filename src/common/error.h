// Thread-local error message behind flashattn_last_error().
#pragma once

#include "flashattn/flashattn.h"

namespace flashattn {

// Records a printf-style message and returns `status`, so callers can `return set_error(...)`.
flashattn_status set_error(flashattn_status status, const char* fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;
void clear_error();
const char* last_error();

// For device backends: turns a failed cudaError_t into FLASHATTN_ERROR_CUDA naming `what`.
// (Declared with int to keep CUDA headers out of host-only code; see src/api/cuda_util.h.)
flashattn_status cuda_failure(int cuda_error, const char* what);

}  // namespace flashattn
