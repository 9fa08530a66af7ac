/* Device-synthetic models (model/model.h k3c_model_synthetic): bound like a load of what synth writes
 * (shapes, vector values, byte counts), matrices behind a reservation that faults on any host read, and
 * refused by the CPU backend with a clear message. */
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "k3c.h"
#include "model/model.h"
#include "model/presets.h"
#include "model/shard.h"
#include "model/synth.h"
#include "test.h"
#include "util/error.h"

/* tiny, synthesized to disk and loaded, against the device-synthetic tiny of the same seed: same inventory,
 * same weight byte count, identical vectors (as stored: F32, or bf16-rounded). */
TEST(synthetic_matches_synth_vectors) {
    uint64_t seed = test_seed();
    char dir[512];
    snprintf(dir, sizeof dir, "%s/synthetic-tiny", test_tmpdir());
    CHECK_OK(k3c_synthesize("tiny", seed, dir));
    k3c_model *disk = NULL, *dev = NULL;
    CHECK_OK(k3c_load(dir, &disk));
    k3c_config c;
    CHECK_OK(k3c_preset_config("tiny", &c));
    int rc = k3c_model_synthetic(&c, seed, &dev);
    k3c_config_free(&c);
    CHECK_OK(rc);
    CHECK(dev->device_synthetic && !disk->device_synthetic);
    CHECK(dev->inventory.count == disk->inventory.count);
    CHECK(dev->weight_bytes == disk->weight_bytes);
    size_t vectors = 0;
    for (size_t i = 0; i < dev->inventory.count; i++) {
        const k3c_tensor_spec *a = &dev->inventory.specs[i], *b = &disk->inventory.specs[i];
        CHECK(strcmp(a->name, b->name) == 0);
        if (a->cls != K3C_TENSOR_VECTOR) {
            const void *p = a->cls == K3C_TENSOR_MATRIX ? (const void *)a->mat->w
                            : a->cls == K3C_TENSOR_MXFP4_PACKED ? (const void *)a->mx->packed
                                                                : (const void *)a->mx->scale;
            /* inside the reservation, never dereferenced here */
            CHECK((const char *)p >= (const char *)dev->synthetic_base &&
                  (const char *)p + k3c_tensor_spec_bytes(a) <= (const char *)dev->synthetic_base + dev->synthetic_bytes);
            continue;
        }
        CHECK(a->vec_len == b->vec_len);
        CHECKF(memcmp(*a->vec, *b->vec, sizeof(float) * a->vec_len) == 0, "vector %s differs from synth's", a->name);
        vectors++;
    }
    CHECK(vectors > 0);
    k3c_free(disk);
    k3c_free(dev);
}

/* A host read of a device-synthetic matrix faults (in a child, so the suite survives it), and the CPU
 * engine refuses the model, naming why. */
TEST(synthetic_host_read_faults_cpu_refuses) {
    k3c_config c;
    CHECK_OK(k3c_preset_config("k3-slice", &c));
    k3c_model *m = NULL;
    int rc = k3c_model_synthetic(&c, test_seed(), &m);
    k3c_config_free(&c);
    CHECK_OK(rc);
    CHECK(m->weights.layers[1].moe.experts[63].q2.packed != NULL);
    fflush(NULL);
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        /* default dispositions: under AddressSanitizer its own handler would turn the fault into exit(1) */
        signal(SIGSEGV, SIG_DFL);
        signal(SIGBUS, SIG_DFL);
        volatile uint8_t v = m->weights.layers[1].moe.experts[63].q2.packed[5];
        (void)v;
        _exit(0);
    }
    int status = 0;
    CHECK(waitpid(pid, &status, 0) == pid);
    CHECKF(WIFSIGNALED(status) && (WTERMSIG(status) == SIGSEGV || WTERMSIG(status) == SIGBUS),
           "host read of a device-synthetic weight did not fault (status %d)", status);
    k3c_engine_options o;
    k3c_engine_options_default(&o);
    o.max_requests = 1;
    o.max_rows = 4;
    o.max_context = 16;
    o.q_max = 1;
    k3c_engine *e = NULL;
    CHECK(k3c_engine_create(m, &o, &e) != K3C_OK);
    CHECKF(strstr(k3c_last_error(), "device-synthetic") != NULL, "message: %s", k3c_last_error());
    k3c_free(m);
}

/* A device-synthetic model's shard (model/shard.h): device-synthetic itself, every tensor of its inventory a
 * range of the model's reservation (no host copy: a read would fault, as above) of the shard's own size, no two
 * overlapping (the CUDA backend finds a tensor's device copy by its host address), for a TP 2 rank, a pipeline
 * stage and the hybrid's EP rank; the CPU engine refuses it at TP 2 as it refuses the model. */
static int cmp_u64(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

TEST(synthetic_shard_is_device_synthetic) {
    k3c_config c;
    CHECK_OK(k3c_preset_config("k3-slice", &c));
    k3c_model *m = NULL;
    int rc = k3c_model_synthetic(&c, test_seed(), &m);
    k3c_config_free(&c);
    CHECK_OK(rc);
    uintptr_t lo = (uintptr_t)m->synthetic_base, hi = lo + m->synthetic_bytes;
    const k3c_model_part parts[] = {{.tp_rank = 1, .tp = 2}, {.pp_stage = 1, .pp = 2},
                                    {.tp_rank = 1, .tp = 2, .ep_rank = 3, .ep = 4}};
    for (size_t pi = 0; pi < sizeof parts / sizeof parts[0]; pi++) {
        k3c_model *s = NULL;
        CHECK_OK(k3c_model_shard(m, &parts[pi], &s));
        CHECK(s->device_synthetic && s->synthetic_seed == m->synthetic_seed && !s->synthetic_base);
        const k3c_inventory *inv = &s->inventory;
        uint64_t *ranges = malloc(sizeof(uint64_t) * 2 * (inv->count + 1));
        CHECK(ranges != NULL);
        size_t n = 0;
        int outside = 0;
        for (size_t i = 0; i < inv->count; i++) {
            const k3c_tensor_spec *sp = &inv->specs[i];
            const void *p = sp->cls == K3C_TENSOR_MATRIX          ? (const void *)sp->mat->w
                            : sp->cls == K3C_TENSOR_MXFP4_PACKED ? (const void *)sp->mx->packed
                            : sp->cls == K3C_TENSOR_MXFP4_SCALE  ? (const void *)sp->mx->scale
                                                                 : NULL;
            if (!p) continue; /* vectors: real host arrays */
            uintptr_t a = (uintptr_t)p, b = a + k3c_tensor_spec_bytes(sp);
            outside += a < lo || b > hi;
            ranges[2 * n] = a, ranges[2 * n + 1] = b, n++;
        }
        /* sorted by start (pairs move together: sort the starts with their ends packed beside them) */
        uint64_t *pairs = malloc(sizeof(uint64_t) * 2 * (n + 1));
        CHECK(pairs != NULL);
        memcpy(pairs, ranges, sizeof(uint64_t) * 2 * n);
        qsort(pairs, n, 2 * sizeof(uint64_t), cmp_u64);
        int overlap = 0;
        for (size_t i = 1; i < n; i++) overlap += pairs[2 * i] < pairs[2 * i - 1];
        printf("    part %zu: %zu device tensors of %zu, %d outside the reservation, %d overlapping\n", pi, n,
               inv->count, outside, overlap);
        free(ranges), free(pairs);
        CHECKF(n > 0 && !outside && !overlap, "part %zu: %d outside, %d overlapping", pi, outside, overlap);
        k3c_model_shard_free(s);
    }
    k3c_engine_options o;
    k3c_engine_options_default(&o);
    o.max_requests = 1;
    o.max_rows = 4;
    o.max_context = 16;
    o.q_max = 1;
    o.layout.tp = 2;
    k3c_engine *e = NULL;
    CHECK(k3c_engine_create(m, &o, &e) != K3C_OK);
    CHECKF(strstr(k3c_last_error(), "device-synthetic") != NULL, "message: %s", k3c_last_error());
    k3c_free(m);
}
