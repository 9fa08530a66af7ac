/* Device measurements for benchmarks (cuda/measure.h): a 1 GiB device-to-device copy timed with events,
 * and device -> host copies timed on the host as the engine's logits download is. */
#ifdef K3C_HAVE_CUDA /* the whole file */
#include "cuda/measure.h"

#include <stdlib.h>
#include <time.h>

#include <cuda_runtime_api.h>

#include "cuda/check.h"
#include "util/error.h"

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

int k3c_cuda_copy_bandwidth(double *bytes_per_s) {
    size_t n = (size_t)1 << 30;
    void *a = NULL, *b = NULL;
    cudaEvent_t e0 = NULL, e1 = NULL;
    double best = 0;
    int rc = K3C_ERR;
    cudaError_t ce = cudaMalloc(&a, n);
    if (ce == cudaSuccess) ce = cudaMalloc(&b, n);
    if (ce == cudaSuccess) ce = cudaMemset(a, 1, n);
    if (ce == cudaSuccess) ce = cudaMemset(b, 2, n);
    if (ce == cudaSuccess) ce = cudaEventCreate(&e0);
    if (ce == cudaSuccess) ce = cudaEventCreate(&e1);
    for (int r = 0; r < 6 && ce == cudaSuccess; r++) {
        float ms = 0;
        ce = cudaEventRecord(e0, 0);
        if (ce == cudaSuccess) ce = cudaMemcpyAsync(r & 1 ? a : b, r & 1 ? b : a, n, cudaMemcpyDeviceToDevice, 0);
        if (ce == cudaSuccess) ce = cudaEventRecord(e1, 0);
        if (ce == cudaSuccess) ce = cudaEventSynchronize(e1);
        if (ce == cudaSuccess) ce = cudaEventElapsedTime(&ms, e0, e1);
        if (ce == cudaSuccess && r > 0 && ms > 0 && 2.0 * n / (ms * 1e-3) > best) best = 2.0 * n / (ms * 1e-3);
    }
    if (ce == cudaSuccess) {
        *bytes_per_s = best;
        rc = K3C_OK;
    } else {
        k3c_errorf_kind(ce == cudaErrorMemoryAllocation ? K3C_ERROR_OOM : K3C_ERROR_DEVICE,
                        "copy bandwidth (2 x 1 GiB on the device): %s", cudaGetErrorString(ce));
    }
    if (e0) cudaEventDestroy(e0);
    if (e1) cudaEventDestroy(e1);
    cudaFree(a);
    cudaFree(b);
    return rc;
}

int k3c_cuda_download_seconds(size_t bytes, int pageable, double *seconds) {
    void *d = NULL, *h = NULL;
    double t[5] = {0};
    if (pageable) h = malloc(bytes);
    else if (cudaHostAlloc(&h, bytes, cudaHostAllocDefault) != cudaSuccess) h = NULL;
    cudaError_t ce = h ? cudaMalloc(&d, bytes) : cudaErrorMemoryAllocation;
    if (ce == cudaSuccess) ce = cudaMemset(d, 0, bytes);
    if (ce == cudaSuccess) ce = cudaDeviceSynchronize();
    for (int r = 0; r < 5 && ce == cudaSuccess; r++) {
        double t0 = now_s();
        ce = cudaMemcpy(h, d, bytes, cudaMemcpyDeviceToHost);
        t[r] = now_s() - t0;
    }
    cudaFree(d);
    if (pageable) free(h);
    else if (h) cudaFreeHost(h);
    if (ce != cudaSuccess)
        return k3c_errorf_kind(ce == cudaErrorMemoryAllocation ? K3C_ERROR_OOM : K3C_ERROR_DEVICE,
                               "download of %zu bytes: %s", bytes, cudaGetErrorString(ce));
    for (int i = 0; i < 5; i++)
        for (int j = i + 1; j < 5; j++)
            if (t[j] < t[i]) {
                double x = t[i];
                t[i] = t[j];
                t[j] = x;
            }
    *seconds = t[2];
    return K3C_OK;
}

#endif
