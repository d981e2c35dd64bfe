// The few CUDA runtime services the API layer needs, behind plain C++ declarations so the
// host-only sources compile without CUDA headers. Implemented in cuda_util.cu when the build
// has CUDA; dispatch.cpp falls back to "no device" stubs otherwise.
#pragma once

#include <cstddef>
#include <cstdint>

#include "flashattn/flashattn.h"

namespace flashattn::cuda {

int device_count();  // 0 when the driver is missing or no device is present
// Compute capability as major*10+minor; fills name/SM count. Returns false if device is bad.
bool device_props(int device, int* cc, int* multiprocessors, char* name, size_t name_len);
// Where a pointer lives: 0 unknown/host (unregistered), 1 host-registered/pinned, 2 device
// memory of device `*device`, 3 managed.
int pointer_kind(const void* ptr, int* device);
// RAII-free helpers: they return FLASHATTN_SUCCESS or a status with the message set.
flashattn_status get_device(int* device);
flashattn_status set_device(int device);
flashattn_status malloc_async(void** ptr, size_t bytes, void* stream);
flashattn_status free_async(void* ptr, void* stream);
bool stream_is_capturing(void* stream);
// Synchronous device-to-host copy on `stream` (used only to validate cu_seqlens).
flashattn_status copy_to_host(void* dst, const void* src, size_t bytes, void* stream);
// Zero a strided [b, s, h, d] tensor / set n floats to -inf, on `stream`.
flashattn_status fill_zero(void* data, size_t elem_size, int b, int s, int h, int d, int64_t batch_stride,
                           int64_t row_stride, int64_t head_stride, void* stream);
flashattn_status fill_neg_inf(float* data, int64_t n, void* stream);

}  // namespace flashattn::cuda

namespace flashattn {
struct CombineParams;
}
namespace flashattn::cuda {

// The combine of partial results (common/combine_params.h) on device tensors, on `stream`
// (src/api/combine_cuda.cu): flashattn_combine and the GPU paths' split-KV. after_primary: the
// kernel just launched on `stream` wrote the partials and lets this one launch early (sm90+:
// programmatic dependent launch; it calls griddepcontrol.launch_dependents).
flashattn_status combine(const CombineParams& p, void* stream, bool after_primary = false);

}  // namespace flashattn::cuda

namespace flashattn::cpu {
struct Fp8QuantizeParams;
struct Fp8VPermuteParams;
}
namespace flashattn::cuda {

// flashattn_fp8_quantize on device tensors (src/api/fp8_quantize_cuda.cu), on `stream`, on the
// current device: fp16, bf16 or fp32 input (fp64 is refused with NOT_SUPPORTED naming dtype).
flashattn_status fp8_quantize(const cpu::Fp8QuantizeParams& p, void* stream);
// flashattn_fp8_v_keys_permuted16 on device tensors (src/api/fp8_quantize_cuda.cu), on `stream`.
flashattn_status fp8_v_keys_permuted16(const cpu::Fp8VPermuteParams& p, void* stream);

}  // namespace flashattn::cuda
