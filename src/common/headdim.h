// Which compiled kernel a head dim runs on, shared by the GPU paths: its own, or the next larger
// one (the kernels zero-fill the columns past the tensors' head dim on load and never store
// them). Device kernels move 16-byte chunks along the head dim, so it must be a multiple of 8
// (the Python layer pads others, as flash_attn does).
#pragma once

namespace flashattn {

// compiled: ascending head dims, ended by 0 (a path built with none is just {0}).
// Returns the smallest one >= headdim, or 0 when none fits or headdim is not a multiple of 8.
template <int N>
constexpr int kernel_headdim_for(int headdim, const int (&compiled)[N]) {
  if (headdim <= 0 || headdim % 8 != 0) return 0;
  for (int k : compiled)
    if (k >= headdim) return k;
  return 0;
}

}  // namespace flashattn
