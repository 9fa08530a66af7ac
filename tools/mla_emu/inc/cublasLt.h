/* emulator shim: the cuBLASLt names gemm.cu compiles against. The emulator never creates a handle (the MLA
 * launcher gets gemm NULL, so k3c_cuda_matmul_bf16 takes the streaming kernels); every call fails. */
#pragma once
#include <cstddef>
typedef int cublasStatus_t;
#define CUBLAS_STATUS_SUCCESS 0
#define CUBLAS_STATUS_NOT_SUPPORTED 15
typedef void *cublasLtHandle_t, *cublasLtMatmulDesc_t, *cublasLtMatrixLayout_t, *cublasLtMatmulPreference_t;
typedef int cublasOperation_t;
enum { CUBLAS_OP_N, CUBLAS_OP_T, CUBLAS_COMPUTE_32F, CUDA_R_32F, CUDA_R_16BF, CUBLASLT_MATMUL_DESC_TRANSA,
       CUBLASLT_MATMUL_DESC_TRANSB, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES };
struct cublasLtMatmulHeuristicResult_t { int algo; };
template <class... A> static inline cublasStatus_t emu_cublaslt(A...) { return CUBLAS_STATUS_NOT_SUPPORTED; }
#define cublasLtCreate emu_cublaslt
#define cublasLtDestroy emu_cublaslt
#define cublasLtMatmulDescCreate emu_cublaslt
#define cublasLtMatmulDescSetAttribute emu_cublaslt
#define cublasLtMatmulDescDestroy emu_cublaslt
#define cublasLtMatrixLayoutCreate emu_cublaslt
#define cublasLtMatrixLayoutDestroy emu_cublaslt
#define cublasLtMatmulPreferenceCreate emu_cublaslt
#define cublasLtMatmulPreferenceSetAttribute emu_cublaslt
#define cublasLtMatmulPreferenceDestroy emu_cublaslt
#define cublasLtMatmulAlgoGetHeuristic emu_cublaslt
#define cublasLtMatmul emu_cublaslt
