/* The kernels' shared memory limits, once per device (kernel_limits.h). */
#include <pthread.h>

#include "cuda/check.h"
#include "cuda/kernel_limits.h"

#define LIMITS_MAX_DEVICES 64

static pthread_mutex_t limits_lock = PTHREAD_MUTEX_INITIALIZER;
static int limits_done[LIMITS_MAX_DEVICES]; /* read under the lock or, once set, by the atomic load below */

extern "C" int k3c_cuda_kernels_prepare(void) {
    int dev = 0;
    K3C_CUDA_TRY(cudaGetDevice(&dev));
    if (dev < 0 || dev >= LIMITS_MAX_DEVICES)
        return k3c_errorf("cuda kernels: device %d (this build prepares devices 0..%d)", dev, LIMITS_MAX_DEVICES - 1);
    if (__atomic_load_n(&limits_done[dev], __ATOMIC_ACQUIRE)) return K3C_OK;
    pthread_mutex_lock(&limits_lock);
    int rc = K3C_OK;
    if (!limits_done[dev]) {
        rc = k3c_cuda_kda_limits();
        if (rc == K3C_OK) rc = k3c_cuda_mla_limits();
        if (rc == K3C_OK) rc = k3c_cuda_mla_expanded_limits();
        if (rc == K3C_OK) rc = k3c_cuda_moe_limits();
        if (rc == K3C_OK) rc = k3c_cuda_moe_pair_limits();
        if (rc == K3C_OK) __atomic_store_n(&limits_done[dev], 1, __ATOMIC_RELEASE);
    }
    pthread_mutex_unlock(&limits_lock);
    return rc;
}
