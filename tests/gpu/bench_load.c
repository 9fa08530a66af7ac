/* Load benchmark (not a test): checkpoints of realistic size written to disk, loaded onto the GPU twice (the
 * first load warms the page cache; the second is the number), next to the two floors measured in the same
 * run: the host-to-device copy rate (cudaMemcpy of 1 GiB from pinned memory) and the page-cache read rate
 * (the staged upload's reader threads filling pinned buffers from the mapped checkpoint, no copy). A load
 * cannot beat the lower of the two. Then the staged upload alone (cuda/upload.h) on the same mapped
 * tensors with other reader counts and buffer shapes, and with the previous upload's shape (the loading
 * thread alone, 2 x 64 MiB: today's "1 reader"), for choosing the defaults.
 *
 * The checkpoints: presets with their config.json and every tensor the loader expects, in shards of one
 * layer each (plus one of the model-level tensors) with an index, as HF publishes them; PRESET:L keeps the
 * first L layers. Bytes are fast random values, not synth's (loading does not look at them beyond its
 * checks: finite bf16, MXFP4 scales below 255, zero vectors).
 *
 * Prints per checkpoint (its second load):  LOAD <name> <GB> <GB/s> <floor GB/s> <fraction of floor>
 * and per upload variant (1 GB and more):  UPLOAD <name> <variant> <GB> <s> <GB/s> <fraction of floor>
 * Usage: bench_load [--dir DIR] [--keep] [--write-only] [PRESET[:LAYERS] ...]  (default: mini
 * kimi-linear-48b:4 k3-slice:2; DIR default $TMPDIR or /tmp; the checkpoints are removed at the end unless
 * --keep; --write-only: no GPU, write and k3c_load each checkpoint once). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cuda_runtime_api.h>

#include "cuda/backend_cuda.h"
#include "cuda/upload.h"
#include "k3c.h"
#include "model/inventory.h"
#include "model/model.h"
#include "model/presets.h"
#include "runtime/engine_internal.h"
#include "util/error.h"
#include "util/rng.h"
#include "util/staging.h"
#include "../fast_checkpoint.h"

#define DIE(...) do { fprintf(stderr, "bench_load: " __VA_ARGS__); fprintf(stderr, "\n"); exit(1); } while (0)
#define CK(call) do { cudaError_t e_ = (call); if (e_ != cudaSuccess) DIE("%s: %s", #call, cudaGetErrorString(e_)); } while (0)
#define OK(call) do { if ((call) != 0) DIE("%s: %s", #call, k3c_error_message()); } while (0)

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* ---- the checkpoint ---- */

/* The config of PRESET[:LAYERS]. */
static void bench_config(const char *arg, k3c_config *c, char *name, size_t name_n) {
    char preset[64];
    snprintf(preset, sizeof preset, "%s", arg);
    char *colon = strchr(preset, ':');
    int layers = 0;
    if (colon) {
        *colon = '\0';
        layers = atoi(colon + 1);
    }
    OK(k3c_preset_config(preset, c));
    if (layers > 0 && layers < c->num_layers) { /* the schedule arrays keep their first `layers` entries */
        c->num_layers = layers;
        c->num_attn_res_blocks = k3c_config_attn_res_blocks(layers, c->attn_res_block_size);
    }
    OK(k3c_config_validate(c));
    snprintf(name, name_n, "%s-%dL", preset, c->num_layers);
}

static uint64_t checkpoint_bytes(const k3c_config *c) {
    k3c_inventory inv;
    OK(k3c_inventory_build(c, NULL, &inv));
    uint64_t b = 0;
    for (size_t i = 0; i < inv.count; i++) b += k3c_tensor_spec_bytes(&inv.specs[i]);
    k3c_inventory_free(&inv);
    return b;
}

/* DIR/NAME into out (4096 bytes), or exits. */
#define PATH_IN(out, dir, ...)                                                                                     \
    do {                                                                                                           \
        char name_[128];                                                                                           \
        snprintf(name_, sizeof name_, __VA_ARGS__);                                                                \
        if ((size_t)snprintf(out, 4096, "%s/%s", dir, name_) >= 4096) DIE("path too long: %s/%s", dir, name_);     \
    } while (0)

static void write_checkpoint(const k3c_config *c, const char *dir) { OK(fast_checkpoint_write(c, dir)); }
static void remove_checkpoint(const char *dir, int layers) { fast_checkpoint_remove(dir, layers); }

/* ---- floors ---- */

/* bytes/s of cudaMemcpy host -> device from pinned memory, 1 GiB, best of 3 */
static double h2d_floor(void) {
    size_t n = (size_t)1 << 30;
    void *h = NULL, *d = NULL;
    CK(cudaHostAlloc(&h, n, cudaHostAllocDefault));
    CK(cudaMalloc(&d, n));
    memset(h, 1, n);
    double best = 0;
    for (int r = 0; r < 4; r++) {
        double t = now_s();
        CK(cudaMemcpy(d, h, n, cudaMemcpyHostToDevice));
        t = now_s() - t;
        if (r > 0 && n / t > best) best = n / t; /* the first warms the mapping */
    }
    cudaFreeHost(h);
    cudaFree(d);
    return best;
}

/* The upload's extents of a loaded model: every inventory tensor's host bytes, at 256-byte aligned offsets
 * in inventory order (the backend's arena layout). */
static k3c_stage_extent *model_extents(const k3c_model *m, size_t *n, uint64_t *span) {
    const k3c_inventory *inv = &m->inventory;
    k3c_stage_extent *ex = calloc(inv->count, sizeof *ex);
    if (!ex) DIE("out of memory");
    uint64_t at = 0;
    *n = 0;
    for (size_t i = 0; i < inv->count; i++) {
        const k3c_tensor_spec *s = &inv->specs[i];
        const void *h = s->cls == K3C_TENSOR_MATRIX          ? (const void *)(s->mat ? s->mat->w : NULL)
                        : s->cls == K3C_TENSOR_MXFP4_PACKED ? (const void *)(s->mx ? s->mx->packed : NULL)
                        : s->cls == K3C_TENSOR_MXFP4_SCALE  ? (const void *)(s->mx ? s->mx->scale : NULL)
                                                            : (const void *)(s->vec ? *s->vec : NULL);
        size_t b = s->cls == K3C_TENSOR_VECTOR ? sizeof(float) * (size_t)s->vec_len : (size_t)k3c_tensor_spec_bytes(s);
        if (!h || !b) continue;
        ex[(*n)++] = (k3c_stage_extent){at, h, b};
        at = (at + b + 255) & ~(uint64_t)255;
    }
    *span = at;
    return ex;
}

static int nop_copy(void *ctx, int buf, const uint8_t *src, uint64_t dst, size_t bytes) { return K3C_OK; }
static int nop_buf(void *ctx, int buf) { return K3C_OK; }

/* bytes/s of the reader threads alone: the extents of a fresh mapping of the checkpoint (no page mapped
 * yet, as at a load) into 4 x 64 MiB pinned buffers, nothing copied */
static double read_floor(const char *path, int readers) {
    k3c_model *m = NULL;
    OK(k3c_load(path, &m));
    size_t n;
    uint64_t span;
    k3c_stage_extent *ex = model_extents(m, &n, &span);
    k3c_stage_plan p;
    OK(k3c_stage_plan_build(ex, n, (size_t)64 << 20, 256, &p));
    uint8_t *bufs[4];
    for (int b = 0; b < 4; b++) CK(cudaHostAlloc((void **)&bufs[b], (size_t)64 << 20, cudaHostAllocDefault));
    k3c_stage_ops ops = {NULL, nop_copy, nop_buf, nop_buf, NULL, NULL};
    k3c_stage_stats st;
    OK(k3c_stage_run(&p, bufs, 4, readers, 0, &ops, &st));
    for (int b = 0; b < 4; b++) cudaFreeHost(bufs[b]);
    k3c_stage_plan_free(&p);
    free(ex);
    k3c_free(m);
    return st.seconds > 0 ? st.payload / st.seconds : 0;
}

/* One load as k3c does it (k3c_load, then a CUDA engine): prints its line, returns the upload's GB/s. */
static double load_once(const char *path, const char *name, int run) {
    k3c_model *m = NULL;
    k3c_engine *e = NULL;
    double t0 = now_s();
    OK(k3c_load(path, &m));
    double t_map = now_s() - t0;
    k3c_engine_options o;
    k3c_engine_options_default(&o);
    o.device = "cuda";
    o.max_requests = 1;
    o.max_context = 64;
    double t1 = now_s();
    OK(k3c_engine_create(m, &o, &e));
    double t_engine = now_s() - t1;
    k3c_engine_view v;
    k3c_engine_view_get(e, &v);
    k3c_cuda_upload_stats st;
    k3c_backend_cuda_load_stats(v.be, &st);
    k3c_engine_free(e);
    k3c_free(m);
    double gbs = st.seconds > 0 ? st.run.payload / st.seconds : 0;
    printf("%s load %d: map+check %.3f s, engine %.3f s, of it the upload %.2f GB in %.3f s = %.2f GB/s (%d "
           "readers, staging %d x %zu MiB %s, alloc+free %.3f s; waited for readers %.3f s, for copies %.3f s)\n",
           name, run, t_map, t_engine, st.run.payload / 1e9, st.seconds, gbs / 1e9, st.run.readers, st.buffers,
           st.buffer_bytes >> 20, st.pinned ? "pinned" : "pageable", st.alloc_s, st.run.wait_fill_s,
           st.run.wait_copy_s);
    fflush(stdout);
    return gbs;
}

/* The staged upload alone with other shapes, each on a fresh mapping of the checkpoint. */
static void sweep(const char *path, const char *name, int readers, double floor) {
    static const struct { const char *label; int readers, buffers, mib; } var[] = {
        {"previous:1thread-2x64MiB", -1, 2, 64}, {"readers1-4x64MiB", 1, 4, 64},   {"readers2-4x64MiB", 2, 4, 64},
        {"readers4-4x64MiB", 4, 4, 64},          {"readers8-4x64MiB", 8, 4, 64},   {"readers16-4x64MiB", 16, 4, 64},
        {"default-2x64MiB", 0, 2, 64},           {"default-8x32MiB", 0, 8, 32},    {"default-8x64MiB", 0, 8, 64},
        {"default-4x16MiB", 0, 4, 16},           {"default-16x16MiB", 0, 16, 16},  {"default-4x128MiB", 0, 4, 128}};
    cudaStream_t s;
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    uint8_t *d = NULL;
    for (size_t k = 0; k < sizeof var / sizeof var[0]; k++) {
        k3c_model *m = NULL;
        OK(k3c_load(path, &m));
        size_t n;
        uint64_t span;
        k3c_stage_extent *ex = model_extents(m, &n, &span);
        if (!d) CK(cudaMalloc((void **)&d, span ? span : 256));
        k3c_cuda_upload_opts uo = {var[k].readers ? var[k].readers : readers, var[k].buffers, (size_t)var[k].mib << 20, 0};
        k3c_cuda_upload_stats us;
        OK(k3c_cuda_upload(d, ex, n, s, &uo, NULL, &us));
        double g = us.seconds > 0 ? us.run.payload / us.seconds : 0;
        printf("UPLOAD %s %-26s %.3f %.3f %.2f %.3f  (%d readers; waited for readers %.3f s, copies %.3f s)\n", name,
               var[k].label, us.run.payload / 1e9, us.seconds, g / 1e9, floor > 0 ? g / floor : 0, us.run.readers,
               us.run.wait_fill_s, us.run.wait_copy_s);
        fflush(stdout);
        free(ex);
        k3c_free(m);
    }
    cudaFree(d);
    cudaStreamDestroy(s);
}

/* ---- main ---- */

int main(int argc, char **argv) {
    const char *tmp = getenv("TMPDIR"), *dir = tmp && *tmp ? tmp : "/tmp";
    int keep = 0, write_only = 0, nargs = 0;
    const char *args[32];
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--dir") && i + 1 < argc) dir = argv[++i];
        else if (!strcmp(argv[i], "--keep")) keep = 1;
        else if (!strcmp(argv[i], "--write-only")) write_only = 1;
        else if (argv[i][0] == '-') DIE("usage: bench_load [--dir DIR] [--keep] [--write-only] [PRESET[:LAYERS] ...]");
        else if (nargs < 32) args[nargs++] = argv[i];
    }
    static const char *defaults[] = {"mini", "kimi-linear-48b:4", "k3-slice:2"};
    if (!nargs) {
        for (int i = 0; i < 3; i++) args[i] = defaults[i];
        nargs = 3;
    }
    if (write_only) { /* no GPU: the checkpoints only, each loaded once (k3c_load) as a check */
        for (int a = 0; a < nargs; a++) {
            k3c_config c;
            char name[96], path[4096];
            bench_config(args[a], &c, name, sizeof name);
            PATH_IN(path, dir, "k3c-bench-load-%s", name);
            double t = now_s();
            write_checkpoint(&c, path);
            k3c_model *m = NULL;
            OK(k3c_load(path, &m));
            printf("%s: %.2f GB (%llu bytes bound) written to %s and loaded in %.1f s\n", name,
                   checkpoint_bytes(&c) / 1e9, m->weight_bytes, path, now_s() - t);
            k3c_free(m);
            if (!keep) remove_checkpoint(path, c.num_layers);
            k3c_config_free(&c);
        }
        return 0;
    }
    CK(cudaSetDevice(0));
    struct cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    int readers = k3c_stage_default_readers();
    printf("device: %s; host: %ld cores online, %d readers by default\n", prop.name, sysconf(_SC_NPROCESSORS_ONLN),
           readers);
    double h2d = h2d_floor();
    printf("floor: host-to-device cudaMemcpy of 1 GiB from pinned memory: %.2f GB/s\n", h2d / 1e9);
    fflush(stdout);

    for (int a = 0; a < nargs; a++) {
        k3c_config c;
        char name[96], path[4096];
        bench_config(args[a], &c, name, sizeof name);
        PATH_IN(path, dir, "k3c-bench-load-%s", name);
        uint64_t bytes = checkpoint_bytes(&c);
        double t = now_s();
        write_checkpoint(&c, path);
        printf("%s: %.2f GB written to %s in %.1f s\n", name, bytes / 1e9, path, now_s() - t);
        fflush(stdout);

        load_once(path, name, 1); /* warms the page cache (if the write did not leave it warm) */
        int wide = readers * 2 < (int)sysconf(_SC_NPROCESSORS_ONLN) ? readers * 2 : (int)sysconf(_SC_NPROCESSORS_ONLN);
        double rd = read_floor(path, readers), rd_wide = wide > readers ? read_floor(path, wide) : 0;
        double rd_best = rd > rd_wide ? rd : rd_wide, floor = rd_best < h2d ? rd_best : h2d;
        printf("floor: page cache -> pinned buffers, no copy: %.2f GB/s with %d reader threads", rd / 1e9, readers);
        if (wide > readers) printf(", %.2f GB/s with %d", rd_wide / 1e9, wide);
        printf("; the load's floor min(read, host-to-device) = %.2f GB/s\n", floor / 1e9);
        double gbs = load_once(path, name, 2);
        printf("LOAD %s %.3f %.2f %.2f %.3f\n", name, bytes / 1e9, gbs / 1e9, floor / 1e9, floor > 0 ? gbs / floor : 0);
        fflush(stdout);
        if (bytes >= (1ull << 30)) sweep(path, name, readers, floor);
        if (!keep) remove_checkpoint(path, c.num_layers);
        k3c_config_free(&c);
    }
    return 0;
}
