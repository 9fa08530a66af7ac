/* emulator shim: the CUDA runtime names moe.h / moe.cu / the test helpers use (emu_rt.cpp defines them on
 * host memory; device properties are an H200's: 132 SMs, 227 KB opt-in shared memory per block) */
#pragma once
/* kernels launch with <<<>>> here: the emulator has no cudaLaunchKernelEx (nor any overlap to gain) */
#define K3C_EMU_NO_PDL 1
#include <stddef.h>
#include <string.h>
typedef void *cudaStream_t;
typedef int cudaError_t;
#define cudaSuccess 0
#define cudaErrorInvalidValue 1
enum cudaMemcpyKind { cudaMemcpyHostToDevice = 1, cudaMemcpyDeviceToHost = 2, cudaMemcpyDeviceToDevice = 3 };
enum cudaDeviceAttr { cudaDevAttrMultiProcessorCount = 16, cudaDevAttrMaxSharedMemoryPerBlockOptin = 97 };
enum cudaFuncAttribute { cudaFuncAttributeMaxDynamicSharedMemorySize = 8 };
#ifdef __cplusplus
extern "C" {
#endif
cudaError_t cudaMalloc(void **p, size_t n);
cudaError_t cudaFree(void *p);
cudaError_t cudaMemcpy(void *d, const void *s, size_t n, enum cudaMemcpyKind k);
cudaError_t cudaMemset(void *d, int v, size_t n);
cudaError_t cudaDeviceSynchronize(void);
cudaError_t cudaGetLastError(void);
cudaError_t cudaGetDevice(int *d);
cudaError_t cudaDeviceGetAttribute(int *v, enum cudaDeviceAttr a, int dev);
const char *cudaGetErrorName(cudaError_t);
const char *cudaGetErrorString(cudaError_t);
#ifdef __cplusplus
}
struct dim3 {
    unsigned x, y, z;
    constexpr dim3(unsigned a = 1, unsigned b = 1, unsigned c = 1) : x(a), y(b), z(c) {}
};
cudaError_t emu_func_set_attribute(const void *f, int attr, int value);
cudaError_t emu_occupancy(int *blocks, const void *f, int threads, size_t dyn_smem);
/* the block stamps' per-translation-unit binding (cuda/stamp.cuh K3C_STAMP_TU): a copy, in order */
template <class T>
inline cudaError_t cudaMemcpyToSymbolAsync(T &sym, const void *src, size_t n, size_t off, cudaMemcpyKind,
                                           cudaStream_t) {
    memcpy((char *)&sym + off, src, n);
    return 0;
}
template <class F> inline cudaError_t cudaFuncSetAttribute(F f, cudaFuncAttribute a, int v) {
    return emu_func_set_attribute((const void *)f, a, v);
}
template <class F>
inline cudaError_t cudaOccupancyMaxActiveBlocksPerMultiprocessor(int *b, F f, int threads, size_t smem) {
    return emu_occupancy(b, (const void *)f, threads, smem);
}
#endif
