// Thin C++ wrapper over the C ABI: exceptions instead of status codes, and helpers to describe
// tensors. Header-only; links against the same libflashattn.
#pragma once

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "flashattn/flashattn.h"

namespace flashattn {

class Error : public std::runtime_error {
 public:
  Error(flashattn_status status, const std::string& message)
      : std::runtime_error(std::string(flashattn_status_string(status)) + ": " + message), status_(status) {}
  flashattn_status status() const { return status_; }

 private:
  flashattn_status status_;
};

inline void check(flashattn_status status) {
  if (status != FLASHATTN_SUCCESS) throw Error(status, flashattn_last_error());
}

// A contiguous [batch, seqlen, nheads, headdim] tensor view.
inline flashattn_tensor contiguous_tensor(void* data, int64_t batch, int64_t seqlen, int64_t nheads,
                                          int64_t headdim) {
  flashattn_tensor t;
  t.data = data;
  t.shape[0] = batch;
  t.shape[1] = seqlen;
  t.shape[2] = nheads;
  t.shape[3] = headdim;
  t.stride[3] = 1;
  t.stride[2] = headdim;
  t.stride[1] = nheads * headdim;
  t.stride[0] = seqlen * nheads * headdim;
  return t;
}

inline size_t forward_workspace_size(const flashattn_fwd_params& p) {
  size_t bytes = 0;
  check(flashattn_fwd_workspace_size(&p, &bytes));
  return bytes;
}

inline size_t backward_workspace_size(const flashattn_bwd_params& p) {
  size_t bytes = 0;
  check(flashattn_bwd_workspace_size(&p, &bytes));
  return bytes;
}

// workspace may be null: the call then allocates what it needs (stream-ordered on device).
inline void forward(const flashattn_fwd_params& p, void* stream = nullptr, void* workspace = nullptr,
                    size_t workspace_bytes = 0) {
  check(flashattn_fwd(&p, workspace, workspace_bytes, stream));
}

inline void backward(const flashattn_bwd_params& p, void* stream = nullptr, void* workspace = nullptr,
                     size_t workspace_bytes = 0) {
  check(flashattn_bwd(&p, workspace, workspace_bytes, stream));
}

inline std::string version() { return flashattn_version(); }

}  // namespace flashattn
