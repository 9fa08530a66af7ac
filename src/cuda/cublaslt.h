/* cuBLASLt, loaded when first used: the entry points k3c calls, resolved with dlopen / dlsym from
 * libcublasLt.so.<major> the first time a CUDA engine needs them (cuda/gemm.cu's k3c_cuda_gemm_init).
 * Linking libcublasLt.so instead maps its 540 MB and runs its initializers in every process, the CPU-only
 * runs and `k3c --help` of a CUDA-enabled build included: 209-214 MB of resident memory and 0.15-0.20 s
 * (against 3.6 MB and 0.00 s loaded on use; a build without CUDA: 1.9 MB; measured 2026-12-01,
 * `/usr/bin/time -v build/k3c --help`, CUDA 13.0, no GPU). */
#ifndef K3C_CUDA_CUBLASLT_H
#define K3C_CUDA_CUBLASLT_H

#include <cublasLt.h>

#ifdef __cplusplus
#define K3C_LT_TYPEOF(f) decltype(&f)
extern "C" {
#else
#define K3C_LT_TYPEOF(f) __typeof__(&f)
#endif

/* One pointer per function of cublasLt.h that k3c calls, with the header's own signature. */
typedef struct k3c_cublaslt_api {
    K3C_LT_TYPEOF(cublasLtCreate) Create;
    K3C_LT_TYPEOF(cublasLtDestroy) Destroy;
    K3C_LT_TYPEOF(cublasLtMatmul) Matmul;
    K3C_LT_TYPEOF(cublasLtMatmulDescCreate) MatmulDescCreate;
    K3C_LT_TYPEOF(cublasLtMatmulDescDestroy) MatmulDescDestroy;
    K3C_LT_TYPEOF(cublasLtMatmulDescSetAttribute) MatmulDescSetAttribute;
    K3C_LT_TYPEOF(cublasLtMatrixLayoutCreate) MatrixLayoutCreate;
    K3C_LT_TYPEOF(cublasLtMatrixLayoutDestroy) MatrixLayoutDestroy;
    K3C_LT_TYPEOF(cublasLtMatmulPreferenceCreate) MatmulPreferenceCreate;
    K3C_LT_TYPEOF(cublasLtMatmulPreferenceDestroy) MatmulPreferenceDestroy;
    K3C_LT_TYPEOF(cublasLtMatmulPreferenceSetAttribute) MatmulPreferenceSetAttribute;
    K3C_LT_TYPEOF(cublasLtMatmulAlgoGetHeuristic) MatmulAlgoGetHeuristic;
} k3c_cublaslt_api;

/* The table, loaded on the first call (thread-safe; the library stays loaded for the process). NULL with
 * a K3C_ERROR_DEVICE message naming the library and dlerror() when it cannot be loaded or lacks a symbol
 * (the failure is remembered: later calls fail the same way without retrying). */
const k3c_cublaslt_api *k3c_cublaslt(void);

#ifdef __cplusplus
}
#endif

#endif
