/* The staged weight upload (cuda/upload.h) on the device: random extents of odd sizes through few and small
 * buffers (many slots, buffers recycled many times), pinned and pageable, against the image the extents
 * describe; the hook's conversion (the MXFP4 repack) queued after an extent's last copy, against the same
 * repack run on plainly copied bytes; and a whole backend's weights bitwise against their host bytes
 * (tiny: MXFP4 experts, kimi-linear-tiny: bf16 experts). Fresh sizes and bytes per run (test_seed()). */
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "cuda/backend_cuda.h"
#include "cuda/moe.h"
#include "cuda/upload.h"
#include "k3c.h"
#include "model/model.h"
#include "runtime/engine_internal.h"
#include "gpu_util.h"
#include "../synth_preset.h"
#include "../test.h"
#include "util/error.h"
#include "util/rng.h"

static size_t rnd(k3c_rng *r, size_t n) { return n ? (size_t)(k3c_rng_next(r) % n) : 0; }

typedef struct repack_hook {
    const k3c_stage_extent *ex;
    const uint8_t *is_packed; /* per extent */
    uint8_t *dst;
    int calls, bad_order;
    size_t last;
} repack_hook;

static int hook_done(void *ctx, size_t i, cudaStream_t st) {
    repack_hook *h = ctx;
    if (h->calls++ && i <= h->last) h->bad_order = 1;
    h->last = i;
    if (!h->is_packed[i]) return K3C_OK;
    return k3c_cuda_mxfp4_repack(h->dst + h->ex[i].dst, h->ex[i].bytes, st);
}

TEST(gpu_upload_staged) {
    k3c_rng r;
    k3c_rng_seed(&r, test_seed() ^ 0x0910ad);
    size_t pool_bytes = (size_t)8 << 20;
    uint8_t *pool = malloc(pool_bytes);
    CHECK(pool);
    for (size_t i = 0; i < pool_bytes; i += 8) {
        uint64_t v = k3c_rng_next(&r);
        memcpy(pool + i, &v, 8);
    }
    static const struct { int readers, buffers; size_t bytes; int pageable; } cfg[] = {
        {1, 1, 4097, 0}, {3, 2, 65539, 0}, {8, 4, (size_t)1 << 20, 0}, {8, 3, 12345, 1}, {2, 5, 777, 0}, {0, 0, 0, 0}};
    for (size_t c = 0; c < sizeof cfg / sizeof cfg[0]; c++) {
        size_t n = 300 + rnd(&r, 300);
        k3c_stage_extent *ex = calloc(n, sizeof *ex);
        uint8_t *packed = calloc(n, 1);
        CHECK(ex && packed);
        uint64_t at = 0;
        for (size_t i = 0; i < n; i++) {
            size_t kind = rnd(&r, 8), b;
            size_t big = cfg[c].bytes && cfg[c].bytes < 65536 ? 30000 : 300000; /* bounds the slots of tiny buffers */
            b = kind == 0 ? 0 : kind < 4 ? 1 + rnd(&r, 300) : kind < 7 ? 4 * (1 + rnd(&r, 20000)) : 4 * (1 + rnd(&r, big));
            at += rnd(&r, 2) ? 0 : rnd(&r, 3) ? (256 - at % 256) % 256 : 4 * rnd(&r, 1000); /* none, padding, far */
            at = (at + 3) & ~(uint64_t)3;
            packed[i] = b % 4 == 0 && b > 0 && rnd(&r, 3) == 0;
            ex[i] = (k3c_stage_extent){at, pool + 4 * rnd(&r, (pool_bytes - b) / 4), b};
            at += b;
        }
        size_t total = (size_t)at + 64;
        uint8_t *d_got = NULL, *d_want = NULL;
        CHECK(cudaMalloc((void **)&d_got, total) == cudaSuccess && cudaMalloc((void **)&d_want, total) == cudaSuccess);
        CHECK(cudaMemset(d_got, 0xA5, total) == cudaSuccess && cudaMemset(d_want, 0xA5, total) == cudaSuccess);
        /* the reference: plain copies of each extent, zeros in the gaps under 256 bytes, then the repacks */
        uint8_t *zeros = calloc(256, 1);
        const k3c_stage_extent *prev = NULL;
        for (size_t i = 0; i < n; i++) {
            if (!ex[i].bytes) continue;
            if (prev && ex[i].dst - (prev->dst + prev->bytes) < 256 && ex[i].dst > prev->dst + prev->bytes)
                CHECK(cudaMemcpy(d_want + prev->dst + prev->bytes, zeros, ex[i].dst - (prev->dst + prev->bytes),
                                 cudaMemcpyHostToDevice) == cudaSuccess);
            CHECK(cudaMemcpy(d_want + ex[i].dst, ex[i].src, ex[i].bytes, cudaMemcpyHostToDevice) == cudaSuccess);
            prev = &ex[i];
        }
        for (size_t i = 0; i < n; i++)
            if (packed[i]) CHECK_OK(k3c_cuda_mxfp4_repack(d_want + ex[i].dst, ex[i].bytes, 0));
        cudaStream_t st;
        CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking) == cudaSuccess);
        k3c_cuda_upload_opts o = {cfg[c].readers, cfg[c].buffers, cfg[c].bytes, cfg[c].pageable};
        repack_hook h = {.ex = ex, .is_packed = packed, .dst = d_got};
        k3c_cuda_upload_hooks hooks = {.ctx = &h, .extent_done = hook_done};
        k3c_cuda_upload_stats s;
        CHECK_OK(k3c_cuda_upload(d_got, ex, n, st, &o, &hooks, &s));
        CHECK(!h.bad_order);
        CHECKF(s.pinned == !cfg[c].pageable, "config %zu: pinned %d", c, s.pinned);
        uint8_t *got = malloc(total), *want = malloc(total);
        CHECK(got && want);
        CHECK(dev_download(got, d_got, total) == 0 && dev_download(want, d_want, total) == 0);
        size_t bad = 0, first = 0;
        for (size_t i = 0; i < total; i++)
            if (got[i] != want[i]) first = bad++ ? first : i;
        printf("INFO upload config %zu (%d readers, %d x %zu bytes, %s): %zu extents, %.1f MB, %zu slots, %zu "
               "copies: %zu bytes differ\n", c, s.run.readers, s.buffers, s.buffer_bytes,
               s.pinned ? "pinned" : "pageable", n, total / 1e6, s.run.slots, s.run.copies, bad);
        CHECKF(bad == 0, "config %zu: %zu of %zu bytes differ from plain copies, the first at %zu", c, bad, total,
               first);
        cudaStreamDestroy(st);
        cudaFree(d_got), cudaFree(d_want);
        free(got), free(want), free(zeros), free(ex), free(packed);
    }
    free(pool);
}

/* Every weight of a backend, device bytes against the host view it was uploaded from (MXFP4 packed codes
 * against a repack of the host bytes copied plainly). */
static void check_backend_weights(const char *preset) {
    char dir[512];
    snprintf(dir, sizeof dir, "%s/upload-%s", test_tmpdir(), preset);
    CHECK_OK(test_synth_preset(preset, 0, test_seed() ^ k3c_hash_str(preset), dir));
    k3c_model *m = NULL;
    CHECK_OK(k3c_load(dir, &m));
    k3c_engine_options o;
    k3c_engine_options_default(&o);
    o.device = "cuda";
    o.max_requests = 1;
    o.max_context = 64;
    k3c_engine *e = NULL;
    CHECK_OK(k3c_engine_create(m, &o, &e));
    k3c_engine_view v;
    k3c_engine_view_get(e, &v);
    const k3c_inventory *inv = &m->inventory;
    size_t checked = 0, bad = 0, bytes = 0;
    const char *first = NULL;
    for (size_t i = 0; i < inv->count; i++) {
        const k3c_tensor_spec *s = &inv->specs[i];
        const void *h = s->cls == K3C_TENSOR_MATRIX          ? (const void *)(s->mat ? s->mat->w : NULL)
                        : s->cls == K3C_TENSOR_MXFP4_PACKED ? (const void *)(s->mx ? s->mx->packed : NULL)
                        : s->cls == K3C_TENSOR_MXFP4_SCALE  ? (const void *)(s->mx ? s->mx->scale : NULL)
                                                            : (const void *)(s->vec ? *s->vec : NULL);
        size_t b = s->cls == K3C_TENSOR_VECTOR ? sizeof(float) * (size_t)s->vec_len : (size_t)k3c_tensor_spec_bytes(s);
        if (!h || !b) continue;
        void *d = k3c_backend_cuda_weight(v.be, h);
        CHECKF(d != NULL, "%s: %s was not uploaded", preset, s->name);
        uint8_t *want = malloc(b), *got = malloc(b);
        CHECK(want && got);
        memcpy(want, h, b);
        if (s->cls == K3C_TENSOR_MXFP4_PACKED) {
            void *t = dev_upload(h, b);
            CHECK(t != NULL);
            CHECK_OK(k3c_cuda_mxfp4_repack(t, b, 0));
            CHECK(dev_download(want, t, b) == 0);
            cudaFree(t);
        }
        CHECK(dev_download(got, d, b) == 0);
        if (memcmp(got, want, b)) first = bad++ ? first : s->name;
        checked++;
        bytes += b;
        free(want), free(got);
    }
    k3c_cuda_upload_stats st;
    k3c_backend_cuda_load_stats(v.be, &st);
    printf("INFO upload %s: %zu tensors, %.1f MB bitwise checked; the upload: %.1f MB in %.4f s, %d readers, %d x "
           "%zu bytes %s\n", preset, checked, bytes / 1e6, st.run.payload / 1e6, st.seconds, st.run.readers,
           st.buffers, st.buffer_bytes, st.pinned ? "pinned" : "pageable");
    CHECKF(bad == 0, "%s: %zu of %zu tensors differ from their host bytes, the first %s", preset, bad, checked, first);
    CHECK(st.run.payload == bytes);
    k3c_engine_free(e);
    k3c_free(m);
}

TEST(gpu_upload_weights_bitwise) {
    check_backend_weights("tiny");
    check_backend_weights("kimi-linear-tiny");
}
