/*
 * flashattn experimental knobs: not part of the stable C ABI; may change without notice.
 */
#ifndef FLASHATTN_FLASHATTN_EXPERIMENTAL_H
#define FLASHATTN_FLASHATTN_EXPERIMENTAL_H

#include "flashattn/flashattn.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Ablation switches of the sm90 (Hopper) forward kernel, process-global, read at each launch.
 * pingpong: order the GEMMs of the consumer warpgroups so one's softmax overlaps the other's
 * GEMMs. intra_warpgroup_overlap: issue the next block's Q K^T before the current softmax and
 * its P V after. 1 = on (default), 0 = off. Each combination is a kernel of its own; those
 * with one off are compiled only when the library is configured with
 * -DFLASHATTN_SM90_ABLATION=ON. Returns FLASHATTN_ERROR_NOT_SUPPORTED when the build has no
 * sm90 path or, for anything but (1, 1), no ablation kernels;
 * FLASHATTN_ERROR_INVALID_ARGUMENT for values other than 0 and 1. */
FLASHATTN_API flashattn_status flashattn_sm90_set_ablation(int pingpong, int intra_warpgroup_overlap);

/* Caps the shared memory per block that the sm80 (portable) path assumes it may use, in bytes;
 * 0 (default) = the device's own opt-in limit. A large-smem GPU then runs the kernels (tile and
 * buffering choices) that a smaller one would, e.g. 166912 for an A100; what needs more than the
 * cap fails with FLASHATTN_ERROR_NOT_SUPPORTED naming the smem it needs. Process-global.
 * Returns FLASHATTN_ERROR_NOT_SUPPORTED when the build has no sm80 path. */
FLASHATTN_API flashattn_status flashattn_sm80_set_smem_limit(int bytes);

#ifdef __cplusplus
}
#endif
#endif /* FLASHATTN_FLASHATTN_EXPERIMENTAL_H */
