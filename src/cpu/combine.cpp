// Host combine of partial attention results; see combine.h.
#include "cpu/combine.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "common/error.h"
#include "common/half_convert.h"
#include "common/parallel.h"

namespace flashattn::cpu {
namespace {

// Acc: float for fp16/bf16/fp32 tensors, double for fp64.
template <typename Acc>
inline Acc load_acc(const void* base, flashattn_dtype dtype, int64_t i) {
  if constexpr (sizeof(Acc) == sizeof(double)) {
    return Acc(load_double(base, dtype, i));
  } else {
    return Acc(load_float(base, dtype, i));
  }
}

template <typename Acc>
inline void store_acc(void* base, flashattn_dtype dtype, int64_t i, Acc v) {
  if constexpr (sizeof(Acc) == sizeof(double)) {
    store_double(base, dtype, i, double(v));
  } else {
    store_float(base, dtype, i, float(v));
  }
}

// Per thread: the row's split weights and the headdim accumulators.
template <typename Acc>
struct Scratch {
  std::vector<Acc> w, acc;
};

// One (batch, query row) item: every head of it.
template <typename Acc>
void combine_row(const CombineParams& p, int64_t b, int64_t i, Scratch<Acc>& sc) {
  const int S = p.num_splits;
  const Acc kInf = std::numeric_limits<Acc>::infinity();
  const Acc kNaN = std::numeric_limits<Acc>::quiet_NaN();
  std::vector<Acc>& w = sc.w;
  std::vector<Acc>& acc = sc.acc;
  for (int64_t h = 0; h < p.nheads; ++h) {
    // The row's LSEs and their max; NaN anywhere makes the row NaN.
    Acc m = -kInf;
    bool nan = false;
    for (int s = 0; s < S; ++s) {
      const int64_t li = s * p.lse_partial_stride[0] + b * p.lse_partial_stride[1] + h * p.lse_partial_stride[2] +
                         i * p.lse_partial_stride[3];
      const Acc l = p.lse_partial_fp64 ? Acc(p.lse_partial_fp64[li]) : Acc(p.lse_partial[li]);
      w[size_t(s)] = l;
      if (std::isnan(l)) nan = true;
      else if (l > m) m = l;
    }
    Acc lse_out;
    const int64_t obase = b * p.out_stride[0] + i * p.out_stride[1] + h * p.out_stride[2];
    if (nan || m == kInf) {
      lse_out = kNaN;
      for (int64_t c = 0; c < p.headdim; ++c) store_acc<Acc>(p.out, p.dtype, obase + c, kNaN);
    } else if (m == -kInf) {
      // No split saw a key for this row.
      lse_out = -kInf;
      for (int64_t c = 0; c < p.headdim; ++c) store_acc<Acc>(p.out, p.dtype, obase + c, Acc(0));
    } else {
      Acc sum = 0;
      for (int s = 0; s < S; ++s) {
        w[size_t(s)] = std::exp(w[size_t(s)] - m);  // exp(-inf) = 0: an empty split
        sum += w[size_t(s)];
      }
      // sum >= 1 (the max's term is exp(0) = 1).
      lse_out = m + std::log(sum);
      const Acc inv = Acc(1) / sum;
      for (int64_t c = 0; c < p.headdim; ++c) acc[size_t(c)] = 0;
      for (int s = 0; s < S; ++s) {
        if (w[size_t(s)] == Acc(0)) continue;  // its O_s is not read (may be anything)
        const Acc ws = w[size_t(s)] * inv;
        const int64_t ib = s * p.o_partial_stride[0] + b * p.o_partial_stride[1] + i * p.o_partial_stride[2] +
                           h * p.o_partial_stride[3];
        for (int64_t c = 0; c < p.headdim; ++c) acc[size_t(c)] += ws * load_acc<Acc>(p.o_partial, p.partial_dtype, ib + c);
      }
      for (int64_t c = 0; c < p.headdim; ++c) store_acc<Acc>(p.out, p.dtype, obase + c, acc[size_t(c)]);
    }
    const int64_t lo = p.lse_index(b, h, i);
    if (p.lse) p.lse[lo] = float(lse_out);
    if (p.lse_fp64) p.lse_fp64[lo] = double(lse_out);
  }
}

template <typename Acc>
flashattn_status run(const CombineParams& p) {
  const int64_t rows = p.batch * p.seqlen_q;
  if (rows == 0 || p.nheads == 0) return FLASHATTN_SUCCESS;
  // Small problems: no threads (starting them would cost more than the work).
  const int64_t work = rows * p.nheads * (p.headdim + 1) * p.num_splits;
  const int64_t chunk = 16;  // rows per item
  const int64_t items = (rows + chunk - 1) / chunk;
  auto scratch = [&] { return Scratch<Acc>{std::vector<Acc>(size_t(p.num_splits)), std::vector<Acc>(size_t(p.headdim))}; };
  auto body = [&](int64_t item, Scratch<Acc>& sc) {
    for (int64_t r = item * chunk; r < std::min(rows, (item + 1) * chunk); ++r)
      combine_row<Acc>(p, r / p.seqlen_q, r % p.seqlen_q, sc);
  };
  std::string err;
  if (work < (int64_t(1) << 16)) {
    ScopedHostThreads one(1);
    err = parallel_for(items, scratch, body);
  } else {
    err = parallel_for(items, scratch, body);
  }
  if (!err.empty()) return set_error(FLASHATTN_ERROR_INTERNAL, "combine: %s", err.c_str());
  return FLASHATTN_SUCCESS;
}

}  // namespace

flashattn_status combine(const CombineParams& p) {
  if (p.dtype == FLASHATTN_DTYPE_FP64) return run<double>(p);
  return run<float>(p);
}

}  // namespace flashattn::cpu
