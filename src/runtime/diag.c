/* The diagnostics of include/k3c.h: the op profile of a cuda engine's two paths and the device
 * measurements benchmarks state their floors against. Without CUDA in the build every call says so. */
#include <stdio.h>
#include <string.h>

#include "k3c.h"
#include "runtime/engine_internal.h"
#include "util/error.h"

#ifdef K3C_HAVE_CUDA
#include "cuda/backend_cuda.h"
#include "cuda/measure.h"
#include "cuda/op_profile.h"
#endif

static int check_device(const char *device, const char *what) {
    if (!device || strcmp(device, "cuda") != 0)
        return k3c_errorf("%s: device '%s': only cuda is measured", what, device ? device : "(null)");
#ifndef K3C_HAVE_CUDA
    return k3c_errorf_kind(K3C_ERROR_DEVICE, "%s: this build has no CUDA backend", what);
#else
    return K3C_OK;
#endif
}

int k3c_device_copy_bandwidth(const char *device, double *bytes_per_s) {
    if (!bytes_per_s) return k3c_errorf("k3c_device_copy_bandwidth: NULL output");
    K3C_TRY(check_device(device, "k3c_device_copy_bandwidth"));
#ifdef K3C_HAVE_CUDA
    return k3c_cuda_copy_bandwidth(bytes_per_s);
#else
    return K3C_ERR;
#endif
}

int k3c_device_download_seconds(const char *device, size_t bytes, int pageable, double *seconds) {
    if (!seconds) return k3c_errorf("k3c_device_download_seconds: NULL output");
    if (bytes == 0) return k3c_errorf("k3c_device_download_seconds: 0 bytes");
    K3C_TRY(check_device(device, "k3c_device_download_seconds"));
#ifdef K3C_HAVE_CUDA
    return k3c_cuda_download_seconds(bytes, pageable, seconds);
#else
    (void)pageable;
    return K3C_ERR;
#endif
}

int k3c_engine_profile(k3c_engine *e, k3c_profile_op op, void *out, double step_ms) {
    if (!e) return k3c_errorf("k3c_engine_profile: NULL engine");
#ifdef K3C_HAVE_CUDA
    k3c_engine_view v;
    k3c_engine_view_get(e, &v);
    k3c_op_profile *stock = k3c_backend_is_cuda(v.be) ? k3c_backend_cuda_profile(v.be) : NULL;
    k3c_op_profile *spec = v.xc ? k3c_decode_cuda_profile(v.xc) : NULL;
    if (op == K3C_PROFILE_QUERY) return stock ? k3c_op_profile_mode(stock) : 0;
    if (!stock) return k3c_errorf("k3c_engine_profile: the engine does not profile (K3C_CUDA_PROFILE unset at creation)");
    switch (op) {
    case K3C_PROFILE_QUERY: break;
    case K3C_PROFILE_RESET:
        k3c_op_profile_reset(stock);
        if (spec) k3c_op_profile_reset(spec);
        return K3C_OK;
    case K3C_PROFILE_NEXT:
        if (!v.xc) return k3c_errorf("k3c_engine_profile: the engine has no specialized executor");
        k3c_decode_cuda_profile_next(v.xc);
        return K3C_OK;
    case K3C_PROFILE_REPORT_STOCK:
    case K3C_PROFILE_REPORT_SPECIALIZED: {
        if (!out) return k3c_errorf("k3c_engine_profile: NULL output stream");
        FILE *f = out;
        if (op == K3C_PROFILE_REPORT_STOCK) {
            k3c_op_profile_report(stock, f, step_ms);
            return K3C_OK;
        }
        if (!spec) return k3c_errorf("k3c_engine_profile: the engine has no specialized executor");
        if (k3c_op_profile_mode(spec) == 3) return k3c_decode_cuda_stamp_report(v.xc, f, step_ms);
        k3c_op_profile_report(spec, f, step_ms);
        double hm[2];
        k3c_decode_cuda_host_profile(v.xc, hm);
        fprintf(f, "PROF host: metadata %.3f ms, waiting for the step and the logits download %.3f ms\n", hm[0],
                hm[1]);
        return K3C_OK;
    }
    }
    return k3c_errorf("k3c_engine_profile: unknown op %d", (int)op);
#else
    (void)out, (void)step_ms;
    if (op == K3C_PROFILE_QUERY) return 0;
    return k3c_errorf("k3c_engine_profile: this build has no CUDA backend");
#endif
}
