// The sm90 backward as the backend table sees it (defined in bwd_launch.cu).
#pragma once

#include <cstddef>

#include "common/params.h"
#include "flashattn/flashattn.h"

namespace flashattn::sm90 {

const char* bwd_unsupported(const BwdParams& p);
size_t bwd_workspace(const BwdParams& p);
flashattn_status bwd(const BwdParams& p, void* workspace, void* stream);

}  // namespace flashattn::sm90
