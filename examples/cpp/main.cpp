// One forward on the host path through the installed package, checked against a naive
// softmax(Q K^T / sqrt(d)) V computed here. Exit code 0 when they agree.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "flashattn/flashattn.h"

int main() {
  const int b = 1, sq = 37, sk = 53, h = 2, d = 16;
  std::mt19937 rng(7);
  std::normal_distribution<float> nd;
  auto make = [&](int s) {
    std::vector<float> t(size_t(b) * s * h * d);
    for (float& x : t) x = nd(rng);
    return t;
  };
  std::vector<float> q = make(sq), k = make(sk), v = make(sk), out(q.size(), NAN);
  auto view = [&](std::vector<float>& t, int s) {
    flashattn_tensor x = {t.data(), {b, s, h, d}, {int64_t(s) * h * d, int64_t(h) * d, d, 1}};
    return x;
  };
  flashattn_fwd_params p = flashattn_fwd_params_init();
  p.dtype = FLASHATTN_DTYPE_FP32;
  p.q = view(q, sq);
  p.k = view(k, sk);
  p.v = view(v, sk);
  p.out = view(out, sq);
  p.options.device = -1;  // host tensors
  if (flashattn_fwd(&p, nullptr, 0, nullptr) != FLASHATTN_SUCCESS) {
    std::fprintf(stderr, "flashattn_fwd: %s\n", flashattn_last_error());
    return 1;
  }
  double max_err = 0;
  for (int hh = 0; hh < h; ++hh)
    for (int i = 0; i < sq; ++i) {
      std::vector<double> s(sk);
      double m = -INFINITY, l = 0;
      for (int j = 0; j < sk; ++j) {
        double acc = 0;
        for (int c = 0; c < d; ++c) acc += double(q[(i * h + hh) * d + c]) * k[(j * h + hh) * d + c];
        s[j] = acc / std::sqrt(double(d));
        m = std::max(m, s[j]);
      }
      for (int j = 0; j < sk; ++j) l += (s[j] = std::exp(s[j] - m));
      for (int c = 0; c < d; ++c) {
        double o = 0;
        for (int j = 0; j < sk; ++j) o += s[j] / l * v[(j * h + hh) * d + c];
        const double e = std::fabs(o - out[(i * h + hh) * d + c]);
        if (!(e <= max_err)) max_err = e;  // a NaN (an unwritten output) sticks
      }
    }
  std::printf("flashattn %s, host forward %dx%d, %d heads, d %d: max |err| %.2e\n", flashattn_version(), sq, sk,
              h, d, max_err);
  return max_err < 1e-4 ? 0 : 2;
}
