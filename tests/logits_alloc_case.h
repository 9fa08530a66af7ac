/* Test helper: k3c_engine_logits_alloc on one device (the CPU suite runs it on "cpu", test_gpu on "cuda").
 * Two requests with the same random prompt step alone, one into a malloc'ed buffer and one into the engine's
 * logits buffer (page-locked on a device engine), both poisoned first: the rows must be finite and bitwise
 * equal. A page-locked download is asynchronous to the host, so a step that returned before its download
 * landed would leave poison (or the other request's rows) here. Then both decode one token in one step of
 * two rows into the engine's buffer, and bad sizes are refused with a message. */
#ifndef K3C_TESTS_LOGITS_ALLOC_CASE_H
#define K3C_TESTS_LOGITS_ALLOC_CASE_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "k3c.h"
#include "synth_preset.h"
#include "test.h"
#include "util/error.h"
#include "util/rng.h"

/* 0 when every row of a and b is finite and bitwise equal; else the first bad index + 1 */
static inline size_t logits_same_bits(const float *a, const float *b, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (!isfinite(a[i]) || memcmp(&a[i], &b[i], sizeof(float)) != 0) return i + 1;
    return 0;
}

/* The tiny model the logits tests step: synthesized as `tag` under the test's scratch directory and loaded
 * (*m), and an engine over it on `device` with room for two requests of 64 positions (*e). */
static inline int logits_case_engine(const char *device, const char *tag, k3c_model **m, k3c_engine **e) {
    char dir[512];
    snprintf(dir, sizeof dir, "%s/%s", test_tmpdir(), tag);
    K3C_TRY(test_synth_preset("tiny", 0, test_seed(), dir));
    K3C_TRY(k3c_load(dir, m));
    k3c_engine_options o;
    k3c_engine_options_default(&o);
    o.device = device;
    o.max_requests = 2;
    o.max_context = 64;
    o.max_rows = 32;
    o.q_max = 1;
    return k3c_engine_create(*m, &o, e);
}

static inline void logits_alloc_case(const char *device) {
    char tag[64];
    snprintf(tag, sizeof tag, "logits-alloc-%s", device);
    k3c_model *m = NULL;
    k3c_engine *e = NULL;
    CHECK_OK(logits_case_engine(device, tag, &m, &e));
    size_t V = (size_t)k3c_engine_vocab(e);
    float *plain = malloc(sizeof(float) * V), *pinned = k3c_engine_logits_alloc(e, 2);
    int ok = plain && pinned;
    int32_t prompt[12];
    k3c_rng r;
    k3c_rng_seed(&r, test_seed() ^ 0x10917);
    for (int i = 0; i < 12; i++) prompt[i] = (int32_t)(k3c_rng_next(&r) % V);
    int id[2] = {-1, -1};
    ok = ok && k3c_request_open(e, &id[0]) == K3C_OK && k3c_request_open(e, &id[1]) == K3C_OK;
    size_t bad1 = 1, bad2 = 1, bad3 = 1;
    if (ok) {
        poison_f32(plain, V);
        poison_f32(pinned, 2 * V);
        k3c_step_item a = {.request = id[0], .tokens = prompt, .n = 12}, b = {.request = id[1], .tokens = prompt, .n = 12};
        ok = k3c_engine_step(e, &a, 1, plain) == K3C_OK && k3c_engine_step(e, &b, 1, pinned) == K3C_OK;
        if (ok) bad1 = logits_same_bits(plain, pinned, V);
        int32_t next = (int32_t)(k3c_rng_next(&r) % V);
        k3c_step_item d[2] = {{.request = id[0], .tokens = &next, .n = 1}, {.request = id[1], .tokens = &next, .n = 1}};
        poison_f32(pinned, 2 * V);
        ok = ok && k3c_engine_step(e, d, 2, pinned) == K3C_OK;
        if (ok) bad2 = logits_same_bits(pinned, pinned + V, V); /* the same history: the same row */
        poison_f32(plain, V);
        k3c_step_item one = {.request = id[0], .tokens = &next, .n = 1};
        ok = ok && k3c_engine_step(e, &one, 1, plain) == K3C_OK; /* a third token for request 0 */
        if (ok) bad3 = isfinite(plain[0]) ? 0 : 1;
    }
    const char *msg = ok ? "" : k3c_error_message();
    float *none = k3c_engine_logits_alloc(e, 0);
    const char *refusal = none ? "" : k3c_error_message();
    int refused = none == NULL && strstr(refusal, "0 rows") != NULL;
    k3c_engine_logits_free(e, none);
    k3c_engine_logits_free(e, pinned);
    k3c_engine_logits_free(e, NULL); /* a no-op, as free(NULL) */
    free(plain);
    k3c_engine_free(e);
    k3c_free(m);
    CHECKF(ok, "%s: a step failed: %s", device, msg);
    CHECKF(bad1 == 0, "%s: prompt logits into the engine's buffer differ from malloc'ed at %zu", device, bad1 - 1);
    CHECKF(bad2 == 0, "%s: two requests of one history decode different rows at %zu", device, bad2 - 1);
    CHECK(bad3 == 0);
    CHECKF(refused, "%s: logits_alloc(0) was not refused with a message naming the rows: '%s'", device, refusal);
}

#endif
