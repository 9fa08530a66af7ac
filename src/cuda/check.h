/* CUDA error checking for library code: every runtime call and every launch is checked, and a failure
 * becomes a k3c_errorf message naming the call, the CUDA error and where it happened. Library code returns
 * the error (K3C_ERR); it never exits. Usable from .cu and .c files. */
#ifndef K3C_CUDA_CHECK_H
#define K3C_CUDA_CHECK_H

#include <cuda_runtime_api.h>

#include "util/error.h"

/* The error kind of a CUDA failure (include/k3c.h k3c_error_kind): device memory refused is OOM, the rest
 * (no device, driver, launch, fault) DEVICE. */
#define K3C_CUDA_ERROR_KIND(err) ((err) == cudaErrorMemoryAllocation ? K3C_ERROR_OOM : K3C_ERROR_DEVICE)

/* Returns K3C_ERR from the enclosing function when `call` does not return cudaSuccess. */
#define K3C_CUDA_TRY(call)                                                                                         \
    do {                                                                                                           \
        cudaError_t k3c_cuda_err_ = (call);                                                                        \
        if (k3c_cuda_err_ != cudaSuccess)                                                                          \
            return k3c_errorf_kind(K3C_CUDA_ERROR_KIND(k3c_cuda_err_), "%s:%d: %s: CUDA error %s (%s)", __FILE__,  \
                                   __LINE__, #call, cudaGetErrorName(k3c_cuda_err_),                               \
                                   cudaGetErrorString(k3c_cuda_err_));                                              \
    } while (0)

/* cudaMalloc / cudaHostAlloc into *pp for an owner whose free function frees every non-NULL pointer: on
 * failure *pp is set to NULL (the runtime does not promise what it leaves there) before K3C_ERR is returned,
 * so the owner's free never frees it. */
#define K3C_CUDA_MALLOC(pp, bytes)                                                                                 \
    do {                                                                                                           \
        cudaError_t k3c_cuda_err_ = cudaMalloc((void **)(pp), (bytes));                                            \
        if (k3c_cuda_err_ != cudaSuccess) {                                                                        \
            *(pp) = NULL;                                                                                          \
            return k3c_errorf_kind(K3C_ERROR_OOM, "%s:%d: cudaMalloc(%s, %zu bytes): CUDA error %s (%s)", __FILE__, __LINE__, #pp,   \
                              (size_t)(bytes), cudaGetErrorName(k3c_cuda_err_), cudaGetErrorString(k3c_cuda_err_)); \
        }                                                                                                          \
    } while (0)
#define K3C_CUDA_HOST_ALLOC(pp, bytes)                                                                             \
    do {                                                                                                           \
        cudaError_t k3c_cuda_err_ = cudaHostAlloc((void **)(pp), (bytes), cudaHostAllocDefault);                   \
        if (k3c_cuda_err_ != cudaSuccess) {                                                                        \
            *(pp) = NULL;                                                                                          \
            return k3c_errorf_kind(K3C_ERROR_OOM, "%s:%d: cudaHostAlloc(%s, %zu bytes): CUDA error %s (%s)", __FILE__, __LINE__, #pp, \
                              (size_t)(bytes), cudaGetErrorName(k3c_cuda_err_), cudaGetErrorString(k3c_cuda_err_)); \
        }                                                                                                          \
    } while (0)

/* After a <<<...>>> launch: a bad configuration shows up here (the kernel's own faults surface at the next
 * synchronizing call, which is checked the same way). */
#define K3C_CUDA_LAUNCHED(what)                                                                                    \
    do {                                                                                                           \
        cudaError_t k3c_cuda_err_ = cudaGetLastError();                                                            \
        if (k3c_cuda_err_ != cudaSuccess)                                                                          \
            return k3c_errorf_kind(K3C_CUDA_ERROR_KIND(k3c_cuda_err_), "%s:%d: launching %s: CUDA error %s (%s)",  \
                                   __FILE__, __LINE__, what, cudaGetErrorName(k3c_cuda_err_),                      \
                                   cudaGetErrorString(k3c_cuda_err_));                                              \
    } while (0)

/* Whether p is pageable host memory (not page-locked, not device memory). A copy between the device and
 * pageable memory waits for the stream's earlier work inside the driver while holding a lock of the context
 * that every launch from every thread takes (seen on the H200, 2026-12-02: one TP rank's logits download in
 * cuMemcpyDtoHAsync, the peer rank's thread blocked on the driver's rwlock in cuLaunchKernelEx). With
 * several ranks on one device that is a deadlock until the mailbox timeout: the download waits for this
 * rank's collective kernel, which waits for a peer whose next launch waits for the lock. So callers drain
 * the stream with cudaStreamSynchronize (which waits without that lock) before such a copy. */
static inline int k3c_cuda_host_pageable(const void *p) {
    struct cudaPointerAttributes a;
    if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
        (void)cudaGetLastError(); /* older drivers: an unregistered pointer is an error; clear it */
        return 1;
    }
    return a.type == cudaMemoryTypeUnregistered;
}

#endif
