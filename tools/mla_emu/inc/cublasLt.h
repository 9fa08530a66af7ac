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
       CUBLASLT_MATMUL_DESC_TRANSB, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
       CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
       CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES };
struct cublasLtMatmulAlgo_t { unsigned long long data[8]; }; /* 64 bytes, as the real one (gemm.cu keeps a copy) */
struct cublasLtMatmulHeuristicResult_t { cublasLtMatmulAlgo_t algo; };
/* one C-variadic function a name, so that cuda/cublaslt.h can take each one's type (decltype(&f)); the table
 * of loaded entry points is never there (k3c_cublaslt returns NULL: no handle is ever created) */
#define EMU_LT(name) \
    static inline cublasStatus_t name(...) { return CUBLAS_STATUS_NOT_SUPPORTED; }
EMU_LT(cublasLtCreate)
EMU_LT(cublasLtDestroy)
EMU_LT(cublasLtMatmulDescCreate)
EMU_LT(cublasLtMatmulDescSetAttribute)
EMU_LT(cublasLtMatmulDescDestroy)
EMU_LT(cublasLtMatrixLayoutCreate)
EMU_LT(cublasLtMatrixLayoutDestroy)
EMU_LT(cublasLtMatmulPreferenceCreate)
EMU_LT(cublasLtMatmulPreferenceSetAttribute)
EMU_LT(cublasLtMatmulPreferenceDestroy)
EMU_LT(cublasLtMatmulAlgoGetHeuristic)
EMU_LT(cublasLtMatmul)
struct k3c_cublaslt_api;
extern "C" inline const k3c_cublaslt_api *k3c_cublaslt(void) { return nullptr; }
