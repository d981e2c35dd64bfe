// GQA packing (FA2's seqlenq_ngroups_swapped, generalised to several queries): the `group` query
// heads of a kv head become the rows of one tile, so a decode step reads K/V once per group
// instead of once per query head. Row r of a packed tile is query r / group of head
// kv_head * group + r % group; each row keeps its own query index for the mask, its own q/o/LSE
// address. group 1 is no packing (row r is query r of the tile's head).
#pragma once

#include "common/hd.h"

namespace flashattn {

struct GqaPack {
  int group = 1;

  FA_HD bool packed() const { return group > 1; }
  FA_HD int query(int r) const { return r / group; }
  FA_HD int head(int r) const { return r % group; }
  // Kernel rows per sequence and kernel heads.
  FA_HD int rows(int seqlen_q) const { return seqlen_q * group; }
  FA_HD int heads(int nheads_q) const { return nheads_q / group; }
};

}  // namespace flashattn
