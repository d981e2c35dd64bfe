#include <cuda_runtime.h>

#include <cstring>

#include "api/cuda_util.h"
#include "common/error.h"

namespace flashattn {

flashattn_status cuda_failure(int err, const char* what) {
  cudaGetLastError();  // clear the sticky-free error so the next call starts clean
  return set_error(FLASHATTN_ERROR_CUDA, "%s failed: %s (%s)", what,
                   cudaGetErrorString(cudaError_t(err)), cudaGetErrorName(cudaError_t(err)));
}

namespace cuda {

int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return n;
}

bool device_props(int device, int* cc, int* sms, char* name, size_t name_len) {
  if (sms == nullptr && (name == nullptr || name_len == 0)) {
    // The per-call path (dispatch) needs only the compute capability: attribute queries are
    // cheap, cudaGetDeviceProperties is not.
    int major = 0, minor = 0;
    if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess ||
        cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device) != cudaSuccess) {
      cudaGetLastError();
      return false;
    }
    *cc = major * 10 + minor;
    return true;
  }
  cudaDeviceProp p;
  if (cudaGetDeviceProperties(&p, device) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  *cc = p.major * 10 + p.minor;
  if (sms) *sms = p.multiProcessorCount;
  if (name && name_len) {
    std::strncpy(name, p.name, name_len - 1);
    name[name_len - 1] = '\0';
  }
  return true;
}

int pointer_kind(const void* ptr, int* device) {
  cudaPointerAttributes a;
  if (cudaPointerGetAttributes(&a, ptr) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  if (device) *device = a.device;
  switch (a.type) {
    case cudaMemoryTypeDevice: return 2;
    case cudaMemoryTypeManaged: return 3;
    case cudaMemoryTypeHost: return 1;
    default: return 0;
  }
}

flashattn_status get_device(int* device) {
  cudaError_t e = cudaGetDevice(device);
  return e == cudaSuccess ? FLASHATTN_SUCCESS : cuda_failure(e, "cudaGetDevice");
}

flashattn_status set_device(int device) {
  cudaError_t e = cudaSetDevice(device);
  return e == cudaSuccess ? FLASHATTN_SUCCESS : cuda_failure(e, "cudaSetDevice");
}

flashattn_status malloc_async(void** ptr, size_t bytes, void* stream) {
  cudaError_t e = cudaMallocAsync(ptr, bytes, cudaStream_t(stream));
  if (e != cudaSuccess) {
    cudaGetLastError();
    return set_error(FLASHATTN_ERROR_WORKSPACE, "workspace: allocating %zu bytes failed: %s",
                     bytes, cudaGetErrorString(e));
  }
  return FLASHATTN_SUCCESS;
}

flashattn_status free_async(void* ptr, void* stream) {
  cudaError_t e = cudaFreeAsync(ptr, cudaStream_t(stream));
  return e == cudaSuccess ? FLASHATTN_SUCCESS : cuda_failure(e, "cudaFreeAsync(workspace)");
}

bool stream_is_capturing(void* stream) {
  cudaStreamCaptureStatus s = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(cudaStream_t(stream), &s) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return s != cudaStreamCaptureStatusNone;
}

flashattn_status copy_to_host(void* dst, const void* src, size_t bytes, void* stream) {
  cudaError_t e = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, cudaStream_t(stream));
  if (e == cudaSuccess) e = cudaStreamSynchronize(cudaStream_t(stream));
  return e == cudaSuccess ? FLASHATTN_SUCCESS : cuda_failure(e, "reading cu_seqlens");
}

namespace {
__global__ void fill_zero_kernel(char* data, int es, int s, int h, int d, int64_t bs, int64_t rs, int64_t hs,
                                 int64_t rows) {
  for (int64_t r = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; r < rows; r += int64_t(gridDim.x) * blockDim.x) {
    int64_t hi = r % h, si = (r / h) % s, bi = r / (int64_t(h) * s);
    char* p = data + (bi * bs + si * rs + hi * hs) * es;
    for (int i = 0; i < d * es; ++i) p[i] = 0;
  }
}
__global__ void fill_neg_inf_kernel(float* data, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    data[i] = -INFINITY;
}
int grid_for(int64_t n) { return int(n / 256 + 1 < 4096 ? n / 256 + 1 : 4096); }
}  // namespace

flashattn_status fill_zero(void* data, size_t es, int b, int s, int h, int d, int64_t bs, int64_t rs, int64_t hs,
                           void* stream) {
  int64_t rows = int64_t(b) * s * h;
  fill_zero_kernel<<<grid_for(rows), 256, 0, cudaStream_t(stream)>>>(static_cast<char*>(data), int(es), s, h, d, bs,
                                                                     rs, hs, rows);
  cudaError_t e = cudaGetLastError();
  return e == cudaSuccess ? FLASHATTN_SUCCESS : cuda_failure(e, "zero-fill launch");
}

flashattn_status fill_neg_inf(float* data, int64_t n, void* stream) {
  fill_neg_inf_kernel<<<grid_for(n), 256, 0, cudaStream_t(stream)>>>(data, n);
  cudaError_t e = cudaGetLastError();
  return e == cudaSuccess ? FLASHATTN_SUCCESS : cuda_failure(e, "lse fill launch");
}

}  // namespace cuda
}  // namespace flashattn
