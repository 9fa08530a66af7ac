/* cuBLASLt loaded on first use (cuda/cublaslt.h says why). The library is looked up as the dynamic loader
 * would (LD_LIBRARY_PATH, the binary's run path, the system's cache), then in the toolkit the build used
 * (K3C_CUDA_LIBDIR), by its versioned name: the major version of the headers compiled against. */
#ifdef K3C_HAVE_CUDA /* the whole file */
#include "cuda/cublaslt.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "util/error.h"

#define K3C_STR2(x) #x
#define K3C_STR(x) K3C_STR2(x)
#define LT_SONAME "libcublasLt.so." K3C_STR(CUBLAS_VER_MAJOR)

static k3c_cublaslt_api api;
static int api_ok;
static char api_err[1024];
static pthread_once_t api_once = PTHREAD_ONCE_INIT;

static void api_load(void) {
    const char *tried[3] = {LT_SONAME, NULL, NULL};
    char path[1024];
#ifdef K3C_CUDA_LIBDIR
    snprintf(path, sizeof path, "%s/%s", K3C_CUDA_LIBDIR, LT_SONAME);
    tried[1] = path;
#endif
    void *h = NULL;
    const char *why = "";
    for (int i = 0; i < 3 && tried[i] && !h; i++) {
        h = dlopen(tried[i], RTLD_NOW | RTLD_LOCAL);
        if (!h) why = dlerror();
    }
    if (!h) {
        snprintf(api_err, sizeof api_err, "cannot load %s (cuBLASLt of CUDA %d, needed by the cuda backend): %s",
                 LT_SONAME, CUBLAS_VER_MAJOR, why ? why : "?");
        return;
    }
    /* dlsym's void * into each typed slot: the slots are function pointers of the header's signatures */
#define LT_SYM(field, name)                                                                                       \
    do {                                                                                                           \
        void *p_ = dlsym(h, name);                                                                                 \
        if (!p_) {                                                                                                 \
            snprintf(api_err, sizeof api_err, "%s has no %s: %s", LT_SONAME, name, dlerror());                     \
            return;                                                                                                \
        }                                                                                                          \
        memcpy(&api.field, &p_, sizeof p_);                                                                        \
    } while (0)
    LT_SYM(Create, "cublasLtCreate");
    LT_SYM(Destroy, "cublasLtDestroy");
    LT_SYM(Matmul, "cublasLtMatmul");
    LT_SYM(MatmulDescCreate, "cublasLtMatmulDescCreate");
    LT_SYM(MatmulDescDestroy, "cublasLtMatmulDescDestroy");
    LT_SYM(MatmulDescSetAttribute, "cublasLtMatmulDescSetAttribute");
    LT_SYM(MatrixLayoutCreate, "cublasLtMatrixLayoutCreate");
    LT_SYM(MatrixLayoutDestroy, "cublasLtMatrixLayoutDestroy");
    LT_SYM(MatmulPreferenceCreate, "cublasLtMatmulPreferenceCreate");
    LT_SYM(MatmulPreferenceDestroy, "cublasLtMatmulPreferenceDestroy");
    LT_SYM(MatmulPreferenceSetAttribute, "cublasLtMatmulPreferenceSetAttribute");
    LT_SYM(MatmulAlgoGetHeuristic, "cublasLtMatmulAlgoGetHeuristic");
#undef LT_SYM
    api_ok = 1;
}

const k3c_cublaslt_api *k3c_cublaslt(void) {
    pthread_once(&api_once, api_load);
    if (!api_ok) {
        k3c_errorf_kind(K3C_ERROR_DEVICE, "%s", api_err);
        return NULL;
    }
    return &api;
}

#endif
