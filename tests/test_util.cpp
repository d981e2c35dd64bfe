#include "test_util.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <set>
#include <sstream>

#include "common/half_convert.h"

namespace flashattn::test {

size_t dtype_bytes(flashattn_dtype dtype) {
  switch (dtype) {
    case FLASHATTN_DTYPE_FP16:
    case FLASHATTN_DTYPE_BF16: return 2;
    case FLASHATTN_DTYPE_FP32: return 4;
    case FLASHATTN_DTYPE_FP64: return 8;
    case FLASHATTN_DTYPE_FP8_E4M3: return 1;
  }
  return 0;
}

const char* dtype_str(flashattn_dtype dtype) {
  switch (dtype) {
    case FLASHATTN_DTYPE_FP16: return "fp16";
    case FLASHATTN_DTYPE_BF16: return "bf16";
    case FLASHATTN_DTYPE_FP32: return "fp32";
    case FLASHATTN_DTYPE_FP64: return "fp64";
    case FLASHATTN_DTYPE_FP8_E4M3: return "fp8_e4m3";
  }
  return "?";
}

double unit_roundoff(flashattn_dtype dtype) {
  switch (dtype) {
    case FLASHATTN_DTYPE_FP16: return std::ldexp(1.0, -11);
    case FLASHATTN_DTYPE_BF16: return std::ldexp(1.0, -8);
    case FLASHATTN_DTYPE_FP32: return std::ldexp(1.0, -24);
    default: return std::ldexp(1.0, -53);
  }
}

double round_to(flashattn_dtype dtype, double v) { return round_to_dtype(dtype, v); }

uint64_t fresh_seed() {
  if (const char* env = std::getenv("FLASHATTN_TEST_SEED")) return std::strtoull(env, nullptr, 0);
  std::random_device rd;
  return (uint64_t(rd()) << 32) ^ uint64_t(rd());
}

const char* layout_str(Layout l) {
  switch (l) {
    case Layout::kContiguous: return "contiguous";
    case Layout::kPadded: return "padded";
    case Layout::kHeadMajor: return "head-major";
  }
  return "?";
}

// ---- HostTensor ----------------------------------------------------------------------------

HostTensor::HostTensor(flashattn_dtype dt, int64_t b, int64_t s, int64_t h, int64_t d, Layout layout) : dtype(dt) {
  shape[0] = b;
  shape[1] = s;
  shape[2] = h;
  shape[3] = d;
  int64_t elems = 0;
  switch (layout) {
    case Layout::kContiguous:
      stride[2] = d;
      stride[1] = h * d;
      stride[0] = s * h * d;
      elems = b * s * h * d;
      break;
    case Layout::kPadded:
      stride[2] = d + 8;
      stride[1] = h * (d + 8) + 24;
      stride[0] = s * stride[1] + 40;
      elems = b * stride[0];
      break;
    case Layout::kHeadMajor:
      stride[1] = d;
      stride[2] = s * d;
      stride[0] = h * s * d;
      elems = b * s * h * d;
      break;
  }
  stride[3] = 1;
  if (numel() == 0) elems = 0;
  bytes.assign(size_t(elems) * dtype_bytes(dt), 0);
}

double HostTensor::get(int64_t b, int64_t s, int64_t h, int64_t c) const {
  return load_double(data(), dtype, index(b, s, h, c));
}

void HostTensor::set(int64_t b, int64_t s, int64_t h, int64_t c, double v) {
  store_double(data(), dtype, index(b, s, h, c), v);
}

flashattn_tensor HostTensor::view(void* other) const {
  flashattn_tensor t;
  t.data = other ? other : const_cast<unsigned char*>(bytes.data());
  for (int i = 0; i < 4; ++i) {
    t.shape[i] = shape[i];
    t.stride[i] = stride[i];
  }
  return t;
}

RowStrides HostTensor::row_strides(bool varlen) const { return RowStrides{varlen ? 0 : stride[0], stride[1], stride[2]}; }

template <typename F>
static void for_each_index(const HostTensor& t, F f) {
  for (int64_t b = 0; b < t.shape[0]; ++b)
    for (int64_t s = 0; s < t.shape[1]; ++s)
      for (int64_t h = 0; h < t.shape[2]; ++h)
        for (int64_t c = 0; c < t.shape[3]; ++c) f(b, s, h, c);
}

HostTensor HostTensor::converted(flashattn_dtype to, Layout layout) const {
  HostTensor r(to, shape[0], shape[1], shape[2], shape[3], layout);
  for_each_index(*this, [&](int64_t b, int64_t s, int64_t h, int64_t c) { r.set(b, s, h, c, get(b, s, h, c)); });
  return r;
}

void HostTensor::fill_random(std::mt19937_64& rng, double stddev, int outliers) {
  std::normal_distribution<double> normal(0.0, stddev);
  for_each_index(*this, [&](int64_t b, int64_t s, int64_t h, int64_t c) { set(b, s, h, c, normal(rng)); });
  const int64_t n = numel();
  if (n == 0) return;
  if (outliers < 0) outliers = int(std::max<int64_t>(1, n / 1000));
  std::uniform_int_distribution<int64_t> pick(0, n - 1);
  std::uniform_real_distribution<double> mag(6.0, 10.0);
  for (int o = 0; o < outliers; ++o) {
    int64_t x = pick(rng);
    const int64_t c = x % shape[3];
    x /= shape[3];
    const int64_t h = x % shape[2];
    x /= shape[2];
    const int64_t s = x % shape[1];
    const int64_t b = x / shape[1];
    set(b, s, h, c, (rng() & 1 ? 1.0 : -1.0) * mag(rng) * stddev);
  }
}

void HostTensor::fill(double v) {
  for_each_index(*this, [&](int64_t b, int64_t s, int64_t h, int64_t c) { set(b, s, h, c, v); });
}

void HostTensor::fill_nan() {
  const int64_t n = int64_t(bytes.size() / dtype_bytes(dtype));
  for (int64_t i = 0; i < n; ++i) store_double(data(), dtype, i, NAN);
}

int64_t HostTensor::count_nan() const {
  int64_t n = 0;
  for_each_index(*this, [&](int64_t b, int64_t s, int64_t h, int64_t c) { n += std::isnan(get(b, s, h, c)); });
  return n;
}

int64_t HostTensor::padding_writes() const {
  const int64_t n = int64_t(bytes.size() / dtype_bytes(dtype));
  std::vector<char> inside(size_t(n), 0);
  for_each_index(*this, [&](int64_t b, int64_t s, int64_t h, int64_t c) { inside[size_t(index(b, s, h, c))] = 1; });
  int64_t writes = 0;
  for (int64_t i = 0; i < n; ++i)
    if (!inside[size_t(i)] && !std::isnan(load_double(data(), dtype, i))) ++writes;
  return writes;
}

bool bitwise_equal(const HostTensor& a, const HostTensor& b) {
  if (a.dtype != b.dtype) return false;
  for (int i = 0; i < 4; ++i)
    if (a.shape[i] != b.shape[i]) return false;
  const size_t es = dtype_bytes(a.dtype);
  bool eq = true;
  for_each_index(a, [&](int64_t bb, int64_t s, int64_t h, int64_t c) {
    eq = eq && std::memcmp(a.bytes.data() + a.index(bb, s, h, c) * es, b.bytes.data() + b.index(bb, s, h, c) * es,
                           es) == 0;
  });
  return eq;
}

// ---- Case / Problem ------------------------------------------------------------------------

std::string Case::str() const {
  std::ostringstream os;
  if (varlen()) {
    os << "varlen q[";
    for (size_t i = 0; i < seqlens_q.size(); ++i) os << (i ? "," : "") << seqlens_q[i];
    os << "] k[";
    for (size_t i = 0; i < seqlens_k.size(); ++i) os << (i ? "," : "") << seqlens_k[i];
    os << "]";
  } else {
    os << "b=" << batch << " sq=" << sq << " sk=" << sk;
  }
  os << " hq=" << hq << " hkv=" << hkv << " d=" << d << " " << dtype_str(dtype);
  if (causal) os << " causal";
  if (window_left >= 0 || window_right >= 0) os << " window=(" << window_left << "," << window_right << ")";
  if (softcap > 0.f) os << " softcap=" << softcap;
  if (softmax_scale > 0.f) os << " scale=" << softmax_scale;
  if (layout != Layout::kContiguous) os << " " << layout_str(layout);
  if (!lse) os << " no-lse";
  if (input_std != 1.0) os << " std=" << input_std;
  if (dropout_p > 0.f)
    os << " dropout=" << dropout_p << " (seed " << dropout_seed << ", offset " << dropout_offset << ")";
  if (!alibi_slopes.empty()) {
    os << " alibi[";
    for (size_t i = 0; i < alibi_slopes.size(); ++i) os << (i ? "," : "") << alibi_slopes[i];
    os << "]";
    if (alibi_batch_stride) os << " stride " << alibi_batch_stride;
  }
  return os.str();
}

Problem::Problem(const Case& cs, uint64_t sd) : c(cs), seed(sd) {
  int64_t bq, rows_q, rows_k;
  if (c.varlen()) {
    if (c.seqlens_k.size() != c.seqlens_q.size()) throw std::invalid_argument("seqlens_q/seqlens_k sizes differ");
    cu_q.assign(1, 0);
    cu_k.assign(1, 0);
    for (size_t i = 0; i < c.seqlens_q.size(); ++i) {
      cu_q.push_back(cu_q.back() + c.seqlens_q[i]);
      cu_k.push_back(cu_k.back() + c.seqlens_k[i]);
    }
    bq = 1;
    rows_q = cu_q.back();
    rows_k = cu_k.back();
  } else {
    bq = c.batch;
    rows_q = c.sq;
    rows_k = c.sk;
  }
  q = HostTensor(c.dtype, bq, rows_q, c.hq, c.d, c.layout);
  out = HostTensor(c.dtype, bq, rows_q, c.hq, c.d, c.layout);
  dout = HostTensor(c.dtype, bq, rows_q, c.hq, c.d, c.layout);
  dq = HostTensor(c.dtype, bq, rows_q, c.hq, c.d, c.layout);
  k = HostTensor(c.dtype, bq, rows_k, c.hkv, c.d, c.layout);
  v = HostTensor(c.dtype, bq, rows_k, c.hkv, c.d, c.layout);
  dk = HostTensor(c.dtype, bq, rows_k, c.hkv, c.d, c.layout);
  dv = HostTensor(c.dtype, bq, rows_k, c.hkv, c.d, c.layout);
  lse.assign(size_t(bq * rows_q * c.hq), NAN);
  std::mt19937_64 rng(seed);
  for (HostTensor* t : {&q, &k, &v, &dout}) {
    t->fill_nan();  // padding stays NaN: a read of it would show up in the result
    t->fill_random(rng, c.input_std);
  }
  poison_outputs();
}

int Problem::max_seqlen_q() const {
  if (!c.varlen()) return c.sq;
  return c.seqlens_q.empty() ? 0 : *std::max_element(c.seqlens_q.begin(), c.seqlens_q.end());
}
int Problem::max_seqlen_k() const {
  if (!c.varlen()) return c.sk;
  return c.seqlens_k.empty() ? 0 : *std::max_element(c.seqlens_k.begin(), c.seqlens_k.end());
}

int64_t Problem::lse_index(int b, int h, int i) const {
  if (c.varlen()) return int64_t(h) * cu_q.back() + cu_q[b] + i;
  return (int64_t(b) * c.hq + h) * c.sq + i;
}

void Problem::poison_outputs() {
  for (HostTensor* t : {&out, &dq, &dk, &dv}) t->fill_nan();
  std::fill(lse.begin(), lse.end(), NAN);
}

static Shape make_shape(const Problem& p) {
  Shape s;
  s.batch = p.batch();
  s.seqlen_q = p.max_seqlen_q();
  s.seqlen_k = p.max_seqlen_k();
  s.nheads_q = p.c.hq;
  s.nheads_kv = p.c.hkv;
  s.headdim = p.c.d;
  s.total_q = int(p.c.varlen() ? p.q.shape[1] : p.q.shape[0] * p.q.shape[1]);
  s.total_k = int(p.c.varlen() ? p.k.shape[1] : p.k.shape[0] * p.k.shape[1]);
  return s;
}

std::vector<float> alibi_standard_slopes(int n) {
  std::vector<float> s;
  for (int k = 1; k <= n; ++k) s.push_back(float(std::exp2(-8.0 * k / n)));
  return s;
}

// The normalized policies as src/api builds them (Dropout::make, the slopes pointer as given).
static Dropout make_dropout(const Case& c) {
  return Dropout::make(c.dropout_p, c.dropout_seed, c.dropout_offset, nullptr);
}
static Alibi make_alibi(const Case& c) {
  Alibi a;
  if (!c.alibi_slopes.empty()) {
    a.slopes = c.alibi_slopes.data();
    a.batch_stride = c.alibi_batch_stride;
  }
  return a;
}

static MaskOptions make_mask_options(const Case& c) {
  MaskOptions m;
  m.softmax_scale = c.softmax_scale > 0.f ? c.softmax_scale : 1.f / std::sqrt(float(c.d));
  m.softcap = c.softcap;
  m.window_left = c.window_left;
  m.window_right = c.causal ? 0 : c.window_right;
  return m;
}

FwdParams make_fwd_params(const Problem& p, const HostTensor& q, const HostTensor& k, const HostTensor& v,
                          HostTensor& out, float* lse) {
  const bool vl = p.c.varlen();
  FwdParams f{};
  f.dtype = q.dtype;
  f.shape = make_shape(p);
  f.mask = make_mask_options(p.c);
  f.q = q.data();
  f.k = k.data();
  f.v = v.data();
  f.o = out.data();
  f.lse = lse;
  f.q_stride = q.row_strides(vl);
  f.k_stride = k.row_strides(vl);
  f.v_stride = v.row_strides(vl);
  f.o_stride = out.row_strides(vl);
  f.cu_seqlens_q = vl ? p.cu_q.data() : nullptr;
  f.cu_seqlens_k = vl ? p.cu_k.data() : nullptr;
  f.dropout = make_dropout(p.c);
  f.alibi = make_alibi(p.c);
  return f;
}

BwdParams make_bwd_params(const Problem& p, const HostTensor& q, const HostTensor& k, const HostTensor& v,
                          const HostTensor& out, const HostTensor& dout, const float* lse, HostTensor& dq,
                          HostTensor& dk, HostTensor& dv) {
  const bool vl = p.c.varlen();
  BwdParams b{};
  b.dtype = q.dtype;
  b.shape = make_shape(p);
  b.mask = make_mask_options(p.c);
  b.q = q.data();
  b.k = k.data();
  b.v = v.data();
  b.o = out.data();
  b.dout = dout.data();
  b.lse = lse;
  b.dq = dq.data();
  b.dk = dk.data();
  b.dv = dv.data();
  b.q_stride = q.row_strides(vl);
  b.k_stride = k.row_strides(vl);
  b.v_stride = v.row_strides(vl);
  b.o_stride = out.row_strides(vl);
  b.dout_stride = dout.row_strides(vl);
  b.dq_stride = dq.row_strides(vl);
  b.dk_stride = dk.row_strides(vl);
  b.dv_stride = dv.row_strides(vl);
  b.cu_seqlens_q = vl ? p.cu_q.data() : nullptr;
  b.cu_seqlens_k = vl ? p.cu_k.data() : nullptr;
  b.deterministic = true;
  b.dropout = make_dropout(p.c);
  b.alibi = make_alibi(p.c);
  return b;
}

FwdParams Problem::fwd_params() { return make_fwd_params(*this, q, k, v, out, c.lse ? lse.data() : nullptr); }

BwdParams Problem::bwd_params() { return make_bwd_params(*this, q, k, v, out, dout, lse.data(), dq, dk, dv); }

static flashattn_options c_options(const Case& c, flashattn_backend backend) {
  flashattn_options o;
  std::memset(&o, 0, sizeof(o));
  o.softmax_scale = c.softmax_scale;
  o.causal = c.causal ? 1 : 0;
  o.window_left = c.window_left;
  o.window_right = c.window_right;
  o.softcap = c.softcap;
  o.dropout_p = c.dropout_p;
  o.deterministic = 1;
  o.backend = backend;
  o.device = -1;
  return o;
}

static flashattn_varlen c_varlen(const Problem& p) {
  flashattn_varlen v;
  std::memset(&v, 0, sizeof(v));
  if (p.c.varlen()) {
    v.cu_seqlens_q = p.cu_q.data();
    v.cu_seqlens_k = p.cu_k.data();
    v.batch = p.batch();
    v.max_seqlen_q = p.max_seqlen_q();
    v.max_seqlen_k = p.max_seqlen_k();
  }
  return v;
}

flashattn_fwd_params Problem::c_fwd_params(flashattn_backend backend) {
  flashattn_fwd_params f;
  std::memset(&f, 0, sizeof(f));
  f.struct_size = sizeof(f);
  f.dtype = c.dtype;
  f.q = q.view();
  f.k = k.view();
  f.v = v.view();
  f.out = out.view();
  f.lse = c.lse ? lse.data() : nullptr;
  f.options = c_options(c, backend);
  f.varlen = c_varlen(*this);
  f.dropout_seed = c.dropout_seed;
  f.dropout_offset = c.dropout_offset;
  f.alibi_slopes = c.alibi_slopes.empty() ? nullptr : c.alibi_slopes.data();
  f.alibi_batch_stride = c.alibi_batch_stride;
  return f;
}

flashattn_bwd_params Problem::c_bwd_params(flashattn_backend backend) {
  flashattn_bwd_params b;
  std::memset(&b, 0, sizeof(b));
  b.struct_size = sizeof(b);
  b.dtype = c.dtype;
  b.q = q.view();
  b.k = k.view();
  b.v = v.view();
  b.out = out.view();
  b.dout = dout.view();
  b.lse = lse.data();
  b.dq = dq.view();
  b.dk = dk.view();
  b.dv = dv.view();
  b.options = c_options(c, backend);
  b.varlen = c_varlen(*this);
  b.dropout_seed = c.dropout_seed;
  b.dropout_offset = c.dropout_offset;
  b.alibi_slopes = c.alibi_slopes.empty() ? nullptr : c.alibi_slopes.data();
  b.alibi_batch_stride = c.alibi_batch_stride;
  return b;
}

void Problem::seed_dropout_from_seed() {
  std::mt19937_64 rng(seed ^ 0x5d0e7e5eedull);
  c.dropout_seed = rng();
  c.dropout_offset = rng() >> 24;
}

std::string Problem::describe() const {
  std::ostringstream os;
  os << "[" << c.str() << "; seed " << seed << "]";
  return os.str();
}

// ---- oracle --------------------------------------------------------------------------------

Oracle run_oracle(const Problem& p, Rounding rounding, bool backward) {
  const flashattn_dtype f64 = FLASHATTN_DTYPE_FP64;
  HostTensor q = p.q.converted(f64), k = p.k.converted(f64), v = p.v.converted(f64);
  Oracle o;
  o.out = HostTensor(f64, p.q.shape[0], p.q.shape[1], p.q.shape[2], p.q.shape[3]);
  o.out.fill_nan();
  o.lse.assign(p.lse.size(), NAN);
  FwdParams f = make_fwd_params(p, q, k, v, o.out, o.lse.data());
  flashattn_status s = reference::fwd(f, rounding, p.c.dtype);
  if (s != FLASHATTN_SUCCESS) ADD_FAILURE() << "reference forward failed: " << int(s);
  if (backward) {
    HostTensor dout = p.dout.converted(f64);
    o.dq = HostTensor(f64, p.q.shape[0], p.q.shape[1], p.q.shape[2], p.q.shape[3]);
    o.dk = HostTensor(f64, p.k.shape[0], p.k.shape[1], p.k.shape[2], p.k.shape[3]);
    o.dv = HostTensor(f64, p.k.shape[0], p.k.shape[1], p.k.shape[2], p.k.shape[3]);
    for (HostTensor* t : {&o.dq, &o.dk, &o.dv}) t->fill_nan();
    BwdParams b = make_bwd_params(p, q, k, v, o.out, dout, o.lse.data(), o.dq, o.dk, o.dv);
    s = reference::bwd(b, rounding, p.c.dtype);
    if (s != FLASHATTN_SUCCESS) ADD_FAILURE() << "reference backward failed: " << int(s);
  }
  return o;
}

// ---- checks --------------------------------------------------------------------------------

double rule_unit(flashattn_dtype dtype) {
  return std::max(unit_roundoff(dtype), unit_roundoff(FLASHATTN_DTYPE_FP32));
}

double rule_atol_ulps(const Rule& rule, flashattn_dtype dtype) {
  if (rule.atol_ulps >= 0) return rule.atol_ulps;
  return (dtype == FLASHATTN_DTYPE_FP16 || dtype == FLASHATTN_DTYPE_BF16) ? 2.0 : 64.0;
}

namespace {

struct ErrStats {
  double max_err = 0, max_std = 0, max_abs = 0;
  double at_ours = 0, at_exact = 0, at_std = 0;
  std::string where, nan_where;
  int64_t nans = 0, mismatched_inf = 0, count = 0;

  // ours is compared with `target` (the exact value, or the exact value given ours' own
  // forward output); the yardstick is standard vs exact.
  template <typename Where>
  void add(double ours, double exact, double standard, Where where_fn) {
    add(ours, exact, standard, where_fn, exact);
  }
  template <typename Where>
  void add(double ours, double exact, double standard, Where where_fn, double target) {
    ++count;
    if (std::isnan(ours) || std::isnan(exact) || std::isnan(target)) {
      if (nans++ == 0) nan_where = where_fn();
      return;
    }
    max_abs = std::max(max_abs, std::fabs(exact));
    const double e = std::fabs(ours - target);
    const double es = std::isnan(standard) ? 0.0 : std::fabs(standard - exact);
    max_std = std::max(max_std, es);
    if (e > max_err || where.empty()) {
      max_err = e;
      at_ours = ours;
      at_exact = target;
      at_std = standard;
      where = where_fn();
    }
  }
};

// `dtype`: whose rule applies (LSE: always FP32, computed in fp32 by every path).
::testing::AssertionResult verdict(const Problem& p, const char* name, const ErrStats& st, flashattn_dtype dtype,
                                   Rule rule, int64_t padding_writes) {
  const double atol = rule_atol_ulps(rule, dtype) * rule_unit(dtype) * std::max(1.0, st.max_abs);
  const double tol = rule.factor * st.max_std + atol;
  std::ostringstream os;
  os << name << ": max|ours - exact| = " << st.max_err << " at " << st.where << " (ours " << st.at_ours
     << ", exact " << st.at_exact << ", standard " << st.at_std << "); standard-attention error "
     << st.max_std << ", tolerance " << rule.factor << " x that + " << atol << " = " << tol << "; " << st.count
     << " elements, max|exact| " << st.max_abs;
  if (st.nans) os << "; " << st.nans << " NaN (first at " << st.nan_where << ")";
  if (st.mismatched_inf)
    os << "; " << st.mismatched_inf << " rows where exactly one of ours/exact is -inf (first at " << st.nan_where
       << ")";
  if (padding_writes) os << "; " << padding_writes << " writes outside the tensor view";
  os << " " << p.describe();
  if (st.nans || st.mismatched_inf || padding_writes || !(st.max_err <= tol))
    return ::testing::AssertionFailure() << os.str();
  return ::testing::AssertionSuccess() << os.str();
}

}  // namespace

namespace {

::testing::AssertionResult check_tensor_against(const Problem& p, const char* name, const HostTensor& ours,
                                                const HostTensor& target, const HostTensor& exact,
                                                const HostTensor& standard, bool key_side, Rule rule) {
  ErrStats st;
  for (int b = 0; b < p.batch(); ++b) {
    const int len = key_side ? p.seqlen_k(b) : p.seqlen_q(b);
    const int64_t bi = key_side ? p.k_b(b) : p.q_b(b);
    for (int i = 0; i < len; ++i) {
      const int64_t row = key_side ? p.k_row(b, i) : p.q_row(b, i);
      for (int64_t h = 0; h < ours.shape[2]; ++h)
        for (int64_t c = 0; c < ours.shape[3]; ++c)
          st.add(
              ours.get(bi, row, h, c), exact.get(bi, row, h, c), standard.get(bi, row, h, c),
              [&] {
                std::ostringstream w;
                w << "[seq " << b << ", row " << i << ", head " << h << ", " << c << "]";
                return w.str();
              },
              target.get(bi, row, h, c));
    }
  }
  return verdict(p, name, st, p.c.dtype, rule, ours.padding_writes());
}

}  // namespace

::testing::AssertionResult check_tensor(const Problem& p, const char* name, const HostTensor& ours,
                                        const HostTensor& exact, const HostTensor& standard, bool key_side,
                                        Rule rule) {
  return check_tensor_against(p, name, ours, exact, exact, standard, key_side, rule);
}

::testing::AssertionResult check_lse(const Problem& p, const std::vector<float>& ours,
                                     const std::vector<float>& exact, const std::vector<float>& standard,
                                     Rule rule) {
  ErrStats st;
  for (int b = 0; b < p.batch(); ++b)
    for (int h = 0; h < p.c.hq; ++h)
      for (int i = 0; i < p.seqlen_q(b); ++i) {
        const int64_t x = p.lse_index(b, h, i);
        auto where = [&] {
          std::ostringstream w;
          w << "[seq " << b << ", head " << h << ", row " << i << "]";
          return w.str();
        };
        const bool oi = ours[x] == -INFINITY, ei = exact[x] == -INFINITY;
        if (oi || ei) {
          if (oi != ei && st.mismatched_inf++ == 0) st.nan_where = where();
          continue;
        }
        st.add(ours[x], exact[x], standard[x] == -INFINITY ? double(exact[x]) : double(standard[x]), where);
      }
  return verdict(p, "lse", st, FLASHATTN_DTYPE_FP32, rule, 0);
}

::testing::AssertionResult check_fwd(const Problem& p, const Oracle& exact, const Oracle& standard, Rule rule) {
  auto r = check_tensor(p, "out", p.out, exact.out, standard.out, false, rule);
  if (!r || !p.c.lse) return r;
  return check_lse(p, p.lse, exact.lse, standard.lse, rule);
}

Oracle run_oracle_given_output(const Problem& p, bool given_lse) {
  const flashattn_dtype f64 = FLASHATTN_DTYPE_FP64;
  HostTensor q = p.q.converted(f64), k = p.k.converted(f64), v = p.v.converted(f64);
  HostTensor out = p.out.converted(f64), dout = p.dout.converted(f64);
  Oracle o;
  o.dq = HostTensor(f64, p.q.shape[0], p.q.shape[1], p.q.shape[2], p.q.shape[3]);
  o.dk = HostTensor(f64, p.k.shape[0], p.k.shape[1], p.k.shape[2], p.k.shape[3]);
  o.dv = HostTensor(f64, p.k.shape[0], p.k.shape[1], p.k.shape[2], p.k.shape[3]);
  for (HostTensor* t : {&o.dq, &o.dk, &o.dv}) t->fill_nan();
  BwdParams b = make_bwd_params(p, q, k, v, out, dout, nullptr, o.dq, o.dk, o.dv);
  // The reference backward takes P from an fp64 LSE when given one (and D from `out` then).
  std::vector<double> lse64(p.lse.begin(), p.lse.end());
  if (given_lse) b.lse_fp64 = lse64.data();
  if (reference::bwd(b, Rounding::kExactGivenOutput, p.c.dtype) != FLASHATTN_SUCCESS)
    ADD_FAILURE() << "reference backward (given output) failed";
  return o;
}

::testing::AssertionResult check_bwd(const Problem& p, const Oracle& exact, const Oracle& standard, Rule rule,
                                     bool given_lse) {
  const Oracle given = run_oracle_given_output(p, given_lse);
  // "exact" in the messages below is the exact gradient given p.out.
  const char* names[3] = {"dq (exact given out)", "dk (exact given out)", "dv (exact given out)"};
  if (given_lse) names[0] = "dq (exact given out, lse)", names[1] = "dk (exact given out, lse)",
                 names[2] = "dv (exact given out, lse)";
  auto r = check_tensor_against(p, names[0], p.dq, given.dq, exact.dq, standard.dq, false, rule);
  if (r) r = check_tensor_against(p, names[1], p.dk, given.dk, exact.dk, standard.dk, true, rule);
  if (r) r = check_tensor_against(p, names[2], p.dv, given.dv, exact.dv, standard.dv, true, rule);
  return r;
}

::testing::AssertionResult check_fwd_sampled(const Problem& p, int rows, std::mt19937_64& rng, Rule rule) {
  const flashattn_dtype f64 = FLASHATTN_DTYPE_FP64;
  HostTensor q = p.q.converted(f64), k = p.k.converted(f64), v = p.v.converted(f64);
  HostTensor unused(f64, 0, 0, 0, 0);
  FwdParams f = make_fwd_params(p, q, k, v, unused, nullptr);
  // (sequence, row) samples: first and last row of each sequence, the rest at random.
  std::set<std::pair<int, int>> picks;
  for (int b = 0; b < p.batch(); ++b)
    if (p.seqlen_q(b) > 0) {
      picks.emplace(b, 0);
      picks.emplace(b, p.seqlen_q(b) - 1);
    }
  std::uniform_int_distribution<int> pick_b(0, p.batch() - 1);
  for (int tries = 0; int(picks.size()) < rows && tries < 100 * rows; ++tries) {
    const int b = pick_b(rng);
    if (p.seqlen_q(b) == 0) continue;
    picks.emplace(b, std::uniform_int_distribution<int>(0, p.seqlen_q(b) - 1)(rng));
  }
  ErrStats so, sl;
  std::vector<double> oe(size_t(p.c.d)), os(size_t(p.c.d));
  for (const auto& [b, i] : picks)
    for (int h = 0; h < p.c.hq; ++h) {
      const double le = reference::fwd_row(f, Rounding::kExact, p.c.dtype, b, h, i, oe.data());
      const double ls = reference::fwd_row(f, Rounding::kInputPrecision, p.c.dtype, b, h, i, os.data());
      auto where = [&] {
        std::ostringstream w;
        w << "[seq " << b << ", row " << i << ", head " << h << "]";
        return w.str();
      };
      for (int c = 0; c < p.c.d; ++c) so.add(p.out.get(p.q_b(b), p.q_row(b, i), h, c), oe[c], os[c], where);
      if (p.c.lse) {
        const float ours = p.lse[size_t(p.lse_index(b, h, i))];
        if (ours == -INFINITY || le == -INFINITY) {
          if ((ours == -INFINITY) != (le == -INFINITY) && sl.mismatched_inf++ == 0) sl.nan_where = where();
        } else {
          sl.add(ours, le, ls == -INFINITY ? le : ls, where);
        }
      }
    }
  auto r = verdict(p, "out (sampled rows)", so, p.c.dtype, rule, p.out.padding_writes());
  if (!r || !p.c.lse) return r;
  return verdict(p, "lse (sampled rows)", sl, FLASHATTN_DTYPE_FP32, rule, 0);
}

}  // namespace flashattn::test
