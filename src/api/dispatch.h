// Backend selection and execution (src/api/dispatch.cpp).
#pragma once

#include <cstdint>

#include "api/backend.h"
#include "common/error.h"
#include "api/validate.h"

namespace flashattn {

flashattn_status select_fwd(const FwdParams& p, const CallContext& ctx, const Backend** out);
flashattn_status select_bwd(const BwdParams& p, const CallContext& ctx, const Backend** out);
size_t fwd_workspace(const Backend& b, const FwdParams& p, const CallContext& ctx);
size_t bwd_workspace(const Backend& b, const BwdParams& p, const CallContext& ctx);
flashattn_status run_fwd(const Backend& b, const FwdParams& p, const CallContext& ctx, void* workspace,
                         size_t workspace_bytes, void* stream);
flashattn_status run_bwd(const Backend& b, const BwdParams& p, const CallContext& ctx, void* workspace,
                         size_t workspace_bytes, void* stream);
uint32_t compiled_backends();
// What AUTO picks on `device` for a bf16 hdim-128 problem (FLASHATTN_BACKEND_AUTO if nothing).
flashattn_backend auto_backend(int device, bool forward);

}  // namespace flashattn
