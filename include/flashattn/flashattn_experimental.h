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
 * its P V after. 1 = on (default), 0 = off. Returns FLASHATTN_ERROR_NOT_SUPPORTED when the
 * build has no sm90 path, FLASHATTN_ERROR_INVALID_ARGUMENT for values other than 0 and 1. */
FLASHATTN_API flashattn_status flashattn_sm90_set_ablation(int pingpong, int intra_warpgroup_overlap);

#ifdef __cplusplus
}
#endif
#endif /* FLASHATTN_FLASHATTN_EXPERIMENTAL_H */
