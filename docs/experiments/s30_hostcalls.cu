// Host cost of the CUDA runtime calls our C side makes per attention call (s30, issue 17 item 5).
#include <chrono>
#include <cstdio>
#include <cuda_runtime.h>
__global__ void empty_kernel(int* p) { if (p && threadIdx.x == 1234567) *p = 0; }
template <class F> double us_per(F f, int n) {
  for (int i = 0; i < 1000; ++i) f();
  auto t = std::chrono::steady_clock::now();
  for (int i = 0; i < n; ++i) f();
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t).count() / n;
}
int main() {
  void* d = nullptr; cudaMalloc(&d, 1 << 20);
  cudaStream_t s; cudaStreamCreate(&s);
  const int n = 200000;
  cudaPointerAttributes a;
  int dev = 0, v = 0; cudaStreamCaptureStatus cs;
  printf("cudaPointerGetAttributes %.3f us\n", us_per([&] { cudaPointerGetAttributes(&a, d); }, n));
  printf("cudaPointerGetAttributes(offset ptr) %.3f us\n", us_per([&] { cudaPointerGetAttributes(&a, (char*)d + 4096); }, n));
  printf("cudaGetDevice %.3f us\n", us_per([&] { cudaGetDevice(&dev); }, n));
  printf("cudaDeviceGetAttribute(cc major) %.3f us\n", us_per([&] { cudaDeviceGetAttribute(&v, cudaDevAttrComputeCapabilityMajor, 0); }, n));
  printf("cudaStreamIsCapturing %.3f us\n", us_per([&] { cudaStreamIsCapturing(s, &cs); }, n));
  printf("cudaGetLastError %.3f us\n", us_per([&] { (void)cudaGetLastError(); }, n));
  printf("empty kernel launch %.3f us\n", us_per([&] { empty_kernel<<<1, 32, 0, s>>>(nullptr); }, 20000));
  cudaStreamSynchronize(s);
  return 0;
}
