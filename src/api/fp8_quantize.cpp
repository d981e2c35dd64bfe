// flashattn_fp8_quantize / flashattn_fp8_dequantize: validation of flashattn_fp8_quantize_params
// (every rejected call names the field), the host path (src/cpu/fp8_quantize.cpp) and, for CUDA
// tensors, the device quantizer (src/api/fp8_quantize_cuda.cu, fp16/bf16/fp32 input). Dequantizing
// CUDA tensors is refused with NOT_SUPPORTED (the FP8 attention kernels will not need it).
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "api/cuda_util.h"
#include "api/validate.h"
#include "common/error.h"
#include "common/hadamard.h"
#include "common/parallel.h"
#include "cpu/fp8_quantize.h"
#include "flashattn/flashattn.h"

using namespace flashattn;

#if UINTPTR_MAX == UINT64_MAX
static_assert(offsetof(flashattn_fp8_quantize_params, x) == 8 && offsetof(flashattn_fp8_quantize_params, x_fp8) == 80 &&
                  offsetof(flashattn_fp8_quantize_params, scales) == 152 &&
                  offsetof(flashattn_fp8_quantize_params, block_size) == 160 &&
                  offsetof(flashattn_fp8_quantize_params, hadamard_seed) == 168 &&
                  offsetof(flashattn_fp8_quantize_params, options) == 176 &&
                  offsetof(flashattn_fp8_quantize_params, x_fp8_layout) == 216 &&
                  sizeof(flashattn_fp8_quantize_params) == 224,
              "flashattn_fp8_quantize_params layout changed (python/flashattn/_lib.py mirrors it)");
#endif

namespace {

constexpr flashattn_status kInvalid = FLASHATTN_ERROR_INVALID_ARGUMENT;

flashattn_status check_strides(const char* name, const int64_t (&stride)[4]) {
  for (int i = 0; i < 3; ++i) {
    if (stride[i] < 0)
      return set_error(kInvalid, "%s.stride[%d]: %lld (negative strides are not supported)", name, i,
                       (long long)stride[i]);
  }
  if (stride[3] != 1)
    return set_error(kInvalid, "%s.stride[3]: %lld (the last dimension, headdim, must be contiguous: stride 1)",
                     name, (long long)stride[3]);
  return FLASHATTN_SUCCESS;
}

// The keys_permuted16 layout's strides (flashattn.h), of a tensor `name` of shape [b, s, h, d].
flashattn_status check_keys_permuted16_strides(const char* name, const int64_t (&os)[4], int64_t s, int64_t h,
                                               int64_t d) {
  const int64_t need = (s + 15) / 16 * 16;
  if (os[1] != 1)
    return set_error(kInvalid, "%s.stride[1]: %lld (keys_permuted16: the keys are contiguous, stride 1)", name,
                     (long long)os[1]);
  if (os[3] < need || os[3] % 16 != 0)
    return set_error(kInvalid, "%s.stride[3]: %lld (keys_permuted16: the row length L, a multiple of 16 >= "
                     "seqlen rounded up to 16 = %lld)", name, (long long)os[3], (long long)need);
  if (os[2] < d * os[3])
    return set_error(kInvalid, "%s.stride[2]: %lld (the head's rows overlap: at least headdim * %s.stride[3] "
                     "= %lld)", name, (long long)os[2], name, (long long)(d * os[3]));
  if (os[0] < h * os[2])
    return set_error(kInvalid, "%s.stride[0]: %lld (the batch entries overlap: at least nheads * "
                     "%s.stride[2] = %lld)", name, (long long)os[0], name, (long long)(h * os[2]));
  return FLASHATTN_SUCCESS;
}

// The device entry points (never reached without CUDA: run_placed refuses first).
#if defined(FLASHATTN_HAS_CUDA)
flashattn_status device_fp8_quantize(const cpu::Fp8QuantizeParams& c, void* stream) { return cuda::fp8_quantize(c, stream); }
flashattn_status device_v_keys_permuted16(const cpu::Fp8VPermuteParams& c, void* stream) {
  return cuda::fp8_v_keys_permuted16(c, stream);
}
#else
flashattn_status device_fp8_quantize(const cpu::Fp8QuantizeParams&, void*) { return FLASHATTN_ERROR_INTERNAL; }
flashattn_status device_v_keys_permuted16(const cpu::Fp8VPermuteParams&, void*) { return FLASHATTN_ERROR_INTERNAL; }
#endif

// Both directions take the same fields (x_fp8 and scales are outputs of one, inputs of the other).
flashattn_status normalize_fp8(const flashattn_fp8_quantize_params* caller, bool quantize, cpu::Fp8QuantizeParams* out,
                               int* device_out, int* num_threads, bool* nothing_to_do) {
  flashattn_status st = check_params_header(caller, "flashattn_fp8_quantize_params");
  if (st != FLASHATTN_SUCCESS) return st;
  const flashattn_fp8_quantize_params& p = *caller;
  const int device = p.options.device;

  if (dtype_size(p.dtype) == 0) return set_error(kInvalid, "dtype: unknown value %d", int(p.dtype));
  if (p.dtype == FLASHATTN_DTYPE_FP8_E4M3)
    return set_error(kInvalid, "dtype: fp8_e4m3 (dtype is x's: fp16, bf16, fp32 or fp64; x_fp8 is always E4M3)");

  const int64_t* shp = p.x.shape;
  for (int i = 0; i < 4; ++i) {
    if (shp[i] < 0) return set_error(kInvalid, "x.shape[%d]: %lld (negative)", i, (long long)shp[i]);
  }
  for (int i = 0; i < 4; ++i) {
    if (p.x_fp8.shape[i] != shp[i])
      return set_error(kInvalid, "x_fp8.shape[%d]: %lld, expected %lld (x_fp8 has x's shape [batch, seqlen, nheads, "
                       "headdim])", i, (long long)p.x_fp8.shape[i], (long long)shp[i]);
  }
  if ((st = check_strides("x", p.x.stride)) != FLASHATTN_SUCCESS) return st;
  if (p.x_fp8_layout != FLASHATTN_FP8_V_ROWS && p.x_fp8_layout != FLASHATTN_FP8_V_KEYS_PERMUTED16)
    return set_error(kInvalid, "x_fp8_layout: %d (0: rows, 1: keys_permuted16)", int(p.x_fp8_layout));
  const bool permuted = p.x_fp8_layout == FLASHATTN_FP8_V_KEYS_PERMUTED16;
  if ((st = permuted ? check_keys_permuted16_strides("x_fp8", p.x_fp8.stride, shp[1], shp[2], shp[3])
                     : check_strides("x_fp8", p.x_fp8.stride)) != FLASHATTN_SUCCESS)
    return st;
  if (p.block_size < 1) return set_error(kInvalid, "block_size: %d (must be >= 1)", p.block_size);
  if (p.hadamard != 0 && p.hadamard != 1) return set_error(kInvalid, "hadamard: %d (0 or 1)", p.hadamard);
  const int64_t b = shp[0], s = shp[1], h = shp[2], d = shp[3];
  if (p.hadamard && !hadamard_dim_supported(d))
    return set_error(kInvalid, "hadamard: 1, but x.shape[3] (headdim) is %lld: the Hadamard transform needs a power "
                     "of two in [%d, %d]", (long long)d, kHadamardMinDim, kHadamardMaxDim);

  // Before the pointers: refusals of paths that do not exist, whatever the pointers are.
  if (device >= 0 && !quantize)
    return set_error(FLASHATTN_ERROR_NOT_SUPPORTED,
                     "options.device: %d: FP8 dequantization of CUDA tensors is not implemented yet (only "
                     "flashattn_fp8_quantize runs on the GPU); dequantize host tensors (options.device = -1)", device);
#if !defined(FLASHATTN_HAS_CUDA)
  if (device >= 0)
    return set_error(FLASHATTN_ERROR_NO_DEVICE, "options.device: %d, but this build has no CUDA support", device);
#endif
  if (device >= 0 && p.dtype == FLASHATTN_DTYPE_FP64)
    return set_error(FLASHATTN_ERROR_NOT_SUPPORTED,
                     "dtype: fp64 is quantized on host tensors only (CUDA tensors: fp16, bf16 or fp32)");

  const bool blocks = b * s * h > 0;  // there are scales
  const bool elems = blocks && d > 0;
  if (elems && p.x.data == nullptr) return set_error(kInvalid, "x.data: NULL");
  if (elems && p.x_fp8.data == nullptr) return set_error(kInvalid, "x_fp8.data: NULL");
  if (blocks && p.scales == nullptr) return set_error(kInvalid, "scales: NULL");
  if (elems && (st = check_pointer("x.data", p.x.data, dtype_size(p.dtype), device)) != FLASHATTN_SUCCESS) return st;
  if (elems && (st = check_pointer("x_fp8.data", p.x_fp8.data, 1, device)) != FLASHATTN_SUCCESS) return st;
  if (blocks && (st = check_pointer("scales", p.scales, 4, device)) != FLASHATTN_SUCCESS) return st;


  cpu::Fp8QuantizeParams& c = *out;
  c = cpu::Fp8QuantizeParams{};
  c.dtype = p.dtype;
  c.batch = b;
  c.seqlen = s;
  c.nheads = h;
  c.headdim = d;
  c.x = p.x.data;
  std::memcpy(c.x_stride, p.x.stride, sizeof(c.x_stride));
  c.x_fp8 = static_cast<uint8_t*>(p.x_fp8.data);
  std::memcpy(c.x_fp8_stride, p.x_fp8.stride, sizeof(c.x_fp8_stride));
  c.keys_permuted16 = permuted;
  c.scales = p.scales;
  c.block_size = p.block_size;
  c.hadamard = p.hadamard != 0;
  c.hadamard_seed = p.hadamard_seed;
  *device_out = device;
  *num_threads = p.options.num_threads;
  *nothing_to_do = !blocks;
  return FLASHATTN_SUCCESS;
}

// Runs on_device() with `device` current (CUDA tensors), else on_host() on num_threads host threads.
template <typename OnDevice, typename OnHost>
flashattn_status run_placed(int device, int num_threads, OnDevice&& on_device, OnHost&& on_host) {
  if (device >= 0) {
#if defined(FLASHATTN_HAS_CUDA)
    int previous = -1;
    flashattn_status s = cuda::get_device(&previous);
    if (s != FLASHATTN_SUCCESS) return s;
    if (previous != device && (s = cuda::set_device(device)) != FLASHATTN_SUCCESS) return s;
    s = on_device();
    if (previous != device) cuda::set_device(previous);
    return s;
#else
    (void)on_device;
    return set_error(FLASHATTN_ERROR_INTERNAL, "options.device: %d reached the host path", device);
#endif
  }
  ScopedHostThreads threads(num_threads);
  return on_host();
}

template <typename Run>
flashattn_status run_fp8(const flashattn_fp8_quantize_params* params, bool quantize, void* stream, Run&& run) {
  clear_error();
  cpu::Fp8QuantizeParams c;
  int device = -1, num_threads = 0;
  bool nothing_to_do = false;
  flashattn_status s = normalize_fp8(params, quantize, &c, &device, &num_threads, &nothing_to_do);
  if (s != FLASHATTN_SUCCESS || nothing_to_do) return s;
  // On a device: quantize only (normalize_fp8 refused the rest).
  return run_placed(device, num_threads, [&] { return device_fp8_quantize(c, stream); }, [&] { return run(c); });
}

// flashattn_fp8_v_keys_permuted16's params: every rejected call names the field.
flashattn_status normalize_v_permute(const flashattn_fp8_v_permute_params* caller, cpu::Fp8VPermuteParams* out,
                                     int* device_out, int* num_threads) {
  flashattn_status st = check_params_header(caller, "flashattn_fp8_v_permute_params");
  if (st != FLASHATTN_SUCCESS) return st;
  const flashattn_fp8_v_permute_params& p = *caller;
  const int device = p.options.device;
  const int64_t* shp = p.v.shape;
  for (int i = 0; i < 4; ++i) {
    if (shp[i] < 0) return set_error(kInvalid, "v.shape[%d]: %lld (negative)", i, (long long)shp[i]);
    if (p.v_out.shape[i] != shp[i])
      return set_error(kInvalid, "v_out.shape[%d]: %lld, expected %lld (v_out has v's shape [batch, seqlen, nheads, "
                       "headdim])", i, (long long)p.v_out.shape[i], (long long)shp[i]);
  }
  if ((st = check_strides("v", p.v.stride)) != FLASHATTN_SUCCESS) return st;
  const int64_t b = shp[0], s = shp[1], h = shp[2], d = shp[3];
  const int64_t* os = p.v_out.stride;
  if ((st = check_keys_permuted16_strides("v_out", p.v_out.stride, s, h, d)) != FLASHATTN_SUCCESS) return st;
#if !defined(FLASHATTN_HAS_CUDA)
  if (device >= 0)
    return set_error(FLASHATTN_ERROR_NO_DEVICE, "options.device: %d, but this build has no CUDA support", device);
#endif
  const bool elems = b * h * d > 0;
  if (elems && s > 0 && p.v.data == nullptr) return set_error(kInvalid, "v.data: NULL");
  if (elems && p.v_out.data == nullptr) return set_error(kInvalid, "v_out.data: NULL");
  if (elems && s > 0 && (st = check_pointer("v.data", p.v.data, 1, device)) != FLASHATTN_SUCCESS) return st;
  // 16 bytes: the device kernel stores 16 positions at a time (L and the strides are multiples of 16).
  if (elems && (st = check_pointer("v_out.data", p.v_out.data, device >= 0 ? 16 : 1, device)) != FLASHATTN_SUCCESS)
    return st;
  if (elems && s > 0) {  // v_out must not overlap v: compare the byte ranges the two views span
    const char* v0 = static_cast<const char*>(p.v.data);
    const char* v1 = v0 + (b - 1) * p.v.stride[0] + (s - 1) * p.v.stride[1] + (h - 1) * p.v.stride[2] + d;
    const char* o0 = static_cast<const char*>(p.v_out.data);
    const char* o1 = o0 + (b - 1) * os[0] + (h - 1) * os[2] + (d - 1) * os[3] + os[3];
    if (o0 < v1 && v0 < o1) return set_error(kInvalid, "v_out.data: overlaps v (the copy needs a buffer of its own)");
  }
  cpu::Fp8VPermuteParams& c = *out;
  c = cpu::Fp8VPermuteParams{};
  c.batch = b;
  c.seqlen = s;
  c.nheads = h;
  c.headdim = d;
  c.v = static_cast<const uint8_t*>(p.v.data);
  c.v_stride[0] = p.v.stride[0];
  c.v_stride[1] = p.v.stride[1];
  c.v_stride[2] = p.v.stride[2];
  c.out = static_cast<uint8_t*>(p.v_out.data);
  c.out_stride[0] = os[0];
  c.out_stride[1] = os[2];
  c.row_len = os[3];
  *device_out = device;
  *num_threads = p.options.num_threads;
  return FLASHATTN_SUCCESS;
}

}  // namespace

extern "C" {

flashattn_fp8_quantize_params flashattn_fp8_quantize_params_init(void) {
  flashattn_fp8_quantize_params p;
  std::memset(&p, 0, sizeof(p));
  p.struct_size = sizeof(p);
  p.dtype = FLASHATTN_DTYPE_BF16;
  p.x.stride[3] = 1;
  p.x_fp8.stride[3] = 1;
  p.block_size = 128;
  p.options = flashattn_default_options();
  return p;
}

flashattn_status flashattn_fp8_quantize(const flashattn_fp8_quantize_params* params, void* stream) {
  return run_fp8(params, true, stream, [](const cpu::Fp8QuantizeParams& c) { return cpu::fp8_quantize(c); });
}

flashattn_status flashattn_fp8_dequantize(const flashattn_fp8_quantize_params* params, void* stream) {
  return run_fp8(params, false, stream, [](const cpu::Fp8QuantizeParams& c) { return cpu::fp8_dequantize(c); });
}

flashattn_fp8_v_permute_params flashattn_fp8_v_permute_params_init(void) {
  flashattn_fp8_v_permute_params p;
  std::memset(&p, 0, sizeof(p));
  p.struct_size = sizeof(p);
  p.v.stride[3] = 1;
  p.options = flashattn_default_options();
  return p;
}

flashattn_status flashattn_fp8_v_keys_permuted16(const flashattn_fp8_v_permute_params* params, void* stream) {
  clear_error();
  cpu::Fp8VPermuteParams c;
  int device = -1, num_threads = 0;
  flashattn_status s = normalize_v_permute(params, &c, &device, &num_threads);
  if (s != FLASHATTN_SUCCESS || c.batch * c.nheads * c.headdim == 0) return s;
  return run_placed(device, num_threads, [&] { return device_v_keys_permuted16(c, stream); },
                    [&] { return cpu::fp8_v_keys_permuted16(c); });
}

}  // extern "C"
