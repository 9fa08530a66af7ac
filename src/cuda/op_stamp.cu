/* The op profile's time stamp (cuda/op_profile.h, K3C_CUDA_PROFILE=2): one thread reads %globaltimer, the
 * GPU's nanosecond clock, common to all SMs (clock64 counts per SM), and stores it. Launched without PDL, so
 * it starts only after the kernel before it has finished: the stamp marks that op's end. */
#include "cuda/op_profile.h"

__global__ void op_stamp_kernel(unsigned long long *slot) {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    *slot = t;
}

extern "C" int k3c_cuda_stamp(unsigned long long *slot, cudaStream_t s) {
    op_stamp_kernel<<<1, 1, 0, s>>>(slot);
    return cudaGetLastError() == cudaSuccess ? 0 : -1;
}
