/* the runtime calls of the GPU tests on host memory, and the kda.cu launchers under emu.h */
#include <cstdlib>
#include <cstring>
#include "kda_emu.cpp"
thread_local dim3 threadIdx, blockIdx;
dim3 blockDim, gridDim;
thread_local emu_block *emu_cur;
long emu_blocks_run;
extern "C" {
cudaError_t cudaMalloc(void **p, size_t n) { *p = malloc(n ? n : 1); return *p ? 0 : 2; }
cudaError_t cudaFree(void *p) { free(p); return 0; }
cudaError_t cudaMemcpy(void *d, const void *s, size_t n, enum cudaMemcpyKind) { memcpy(d, s, n); return 0; }
cudaError_t cudaMemset(void *d, int v, size_t n) { memset(d, v, n); return 0; }
cudaError_t cudaDeviceSynchronize(void) { return 0; }
cudaError_t cudaGetLastError(void) { return 0; }
const char *cudaGetErrorName(cudaError_t) { return "emu"; }
const char *cudaGetErrorString(cudaError_t) { return "emu"; }
}
