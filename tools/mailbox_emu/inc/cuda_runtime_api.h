/* The part of the CUDA runtime API that comm/mailbox_cuda.c, comm/mailbox_dev.cu and
 * tests/gpu/test_gpu_mailbox.c use, on host memory (emu.cpp): device memory is host memory, a stream is a
 * worker thread running its queue in order, a kernel launch runs every CUDA thread of every block as an OS
 * thread, a graph is the list of a captured stream's operations. */
#ifndef MAILBOX_EMU_CUDA_RUNTIME_API_H
#define MAILBOX_EMU_CUDA_RUNTIME_API_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum cudaError {
    cudaSuccess = 0,
    cudaErrorInvalidValue = 1,
    cudaErrorMemoryAllocation = 2,
    cudaErrorInvalidDevice = 101,
    cudaErrorNotReady = 600,
    cudaErrorPeerAccessAlreadyEnabled = 704,
    cudaErrorNotSupported = 801,
    cudaErrorStreamCaptureUnsupported = 900,
} cudaError_t;

enum cudaMemcpyKind {
    cudaMemcpyHostToHost = 0,
    cudaMemcpyHostToDevice = 1,
    cudaMemcpyDeviceToHost = 2,
    cudaMemcpyDeviceToDevice = 3,
    cudaMemcpyDefault = 4
};
enum cudaStreamCaptureMode {
    cudaStreamCaptureModeGlobal = 0,
    cudaStreamCaptureModeThreadLocal = 1,
    cudaStreamCaptureModeRelaxed = 2
};
enum cudaStreamCaptureStatus {
    cudaStreamCaptureStatusNone = 0,
    cudaStreamCaptureStatusActive = 1,
    cudaStreamCaptureStatusInvalidated = 2
};
enum cudaDeviceAttr { cudaDevAttrMultiProcessorCount = 16 };

#define cudaStreamDefault 0x00
#define cudaStreamNonBlocking 0x01
#define cudaHostAllocDefault 0x00
#define cudaHostAllocPortable 0x01
#define cudaHostAllocMapped 0x02
#define cudaIpcMemLazyEnablePeerAccess 0x01

typedef struct CUstream_st *cudaStream_t;
typedef struct CUevent_st *cudaEvent_t;
struct cudaDeviceProp {
    char name[256];
};
typedef struct CUgraph_st *cudaGraph_t;
typedef struct CUgraphExec_st *cudaGraphExec_t;
typedef struct cudaIpcMemHandle_st {
    char reserved[64];
} cudaIpcMemHandle_t;

cudaError_t cudaGetDevice(int *d);
cudaError_t cudaSetDevice(int d);
cudaError_t cudaGetDeviceCount(int *n);
cudaError_t cudaDeviceGetAttribute(int *v, enum cudaDeviceAttr a, int d);
cudaError_t cudaDeviceGetPCIBusId(char *id, int len, int d);
cudaError_t cudaDeviceCanAccessPeer(int *can, int d, int peer);
cudaError_t cudaDeviceEnablePeerAccess(int peer, unsigned flags);
cudaError_t cudaDeviceSynchronize(void);
cudaError_t cudaMalloc(void **p, size_t n);
cudaError_t cudaFree(void *p);
cudaError_t cudaMemset(void *p, int v, size_t n);
cudaError_t cudaMemcpy(void *d, const void *s, size_t n, enum cudaMemcpyKind k);
cudaError_t cudaMemcpyAsync(void *d, const void *s, size_t n, enum cudaMemcpyKind k, cudaStream_t st);
cudaError_t cudaHostAlloc(void **p, size_t n, unsigned flags);
cudaError_t cudaMallocHost(void **p, size_t n);
cudaError_t cudaFreeHost(void *p);
cudaError_t cudaHostGetDevicePointer(void **d, void *h, unsigned flags);
cudaError_t cudaStreamCreate(cudaStream_t *s);
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned flags);
cudaError_t cudaStreamDestroy(cudaStream_t s);
cudaError_t cudaStreamGetFlags(cudaStream_t s, unsigned *flags);
cudaError_t cudaStreamSynchronize(cudaStream_t s);
cudaError_t cudaStreamQuery(cudaStream_t s);
cudaError_t cudaStreamBeginCapture(cudaStream_t s, enum cudaStreamCaptureMode m);
cudaError_t cudaStreamEndCapture(cudaStream_t s, cudaGraph_t *g);
cudaError_t cudaStreamIsCapturing(cudaStream_t s, enum cudaStreamCaptureStatus *status);
cudaError_t cudaGraphInstantiate(cudaGraphExec_t *e, cudaGraph_t g, unsigned long long flags);
cudaError_t cudaGraphLaunch(cudaGraphExec_t e, cudaStream_t s);
cudaError_t cudaGraphDestroy(cudaGraph_t g);
cudaError_t cudaGraphExecDestroy(cudaGraphExec_t e);
cudaError_t cudaIpcGetMemHandle(cudaIpcMemHandle_t *h, void *p);
cudaError_t cudaIpcOpenMemHandle(void **p, cudaIpcMemHandle_t h, unsigned flags);
cudaError_t cudaIpcCloseMemHandle(void *p);
cudaError_t cudaEventCreate(cudaEvent_t *e);
cudaError_t cudaEventDestroy(cudaEvent_t e);
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s);
cudaError_t cudaEventSynchronize(cudaEvent_t e);
cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t a, cudaEvent_t b);
cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *p, int d);
/* cuda/check.h's k3c_cuda_host_pageable: every pointer here reads as unregistered host memory */
enum cudaMemoryType { cudaMemoryTypeUnregistered = 0, cudaMemoryTypeHost = 1, cudaMemoryTypeDevice = 2 };
struct cudaPointerAttributes {
    enum cudaMemoryType type;
    int device;
    void *devicePointer, *hostPointer;
};
static inline cudaError_t cudaPointerGetAttributes(struct cudaPointerAttributes *a, const void *p) {
    (void)p;
    a->type = cudaMemoryTypeUnregistered;
    a->device = 0;
    a->devicePointer = a->hostPointer = 0;
    return cudaSuccess;
}
cudaError_t cudaGetLastError(void);
const char *cudaGetErrorString(cudaError_t e);
const char *cudaGetErrorName(cudaError_t e);

#ifdef __cplusplus
}
extern int emu_blocks_per_sm;
template <class F> cudaError_t cudaOccupancyMaxActiveBlocksPerMultiprocessor(int *n, F, int, size_t) {
    *n = emu_blocks_per_sm;
    return cudaSuccess;
}
#endif

#endif
