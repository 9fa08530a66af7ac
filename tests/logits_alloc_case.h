/* Test helpers: k3c_engine_logits_alloc on one device (the CPU suite runs them on "cpu", test_gpu on "cuda").
 * logits_alloc_case: two requests with the same random prompt step alone, one into a malloc'ed buffer and one
 * into the engine's logits buffer (page-locked on a device engine), both poisoned first: the rows must be
 * finite and bitwise equal. A page-locked download is asynchronous to the host, so a step that returned before
 * its download landed would leave poison (or the other request's rows) here. Then both decode one token in
 * one step of two rows into the engine's buffer, and bad sizes are refused with a message.
 * logits_fallback_case: the same buffers when the backend's host_alloc is refused (below). */
#ifndef K3C_TESTS_LOGITS_ALLOC_CASE_H
#define K3C_TESTS_LOGITS_ALLOC_CASE_H

#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "k3c.h"
#include "runtime/engine_internal.h"
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
        k3c_step_item a = {.request = id[0], .tokens = prompt, .n = 12};
        k3c_step_item b = {.request = id[1], .tokens = prompt, .n = 12};
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

/* Stub backend memory for logits_fallback_case: a host_alloc that is refused (as cudaHostAlloc
 * can be) or one that hands out malloc'ed memory it records, and a host_free that counts its calls. */
static void *fb_given;          /* the last pointer stub_host_alloc_ok returned */
static void *fb_freed;          /* the last pointer stub_host_free received */
static int fb_free_calls;

static void *stub_host_alloc_refused(k3c_backend *be, size_t bytes) {
    k3c_errorf("stub backend: %zu bytes of page-locked memory refused", bytes);
    return NULL;
}

static void *stub_host_alloc_ok(k3c_backend *be, size_t bytes) { return fb_given = malloc(bytes); }

static void stub_host_free(k3c_backend *be, void *p) {
    fb_free_calls++;
    fb_freed = p;
    free(p);
}

/* k3c_engine_logits_alloc when the backend's host_alloc fails: the buffer is malloc'ed instead, with one
 * warning on stderr per buffer naming the backend's reason; a step writes the same bits into it as into
 * any malloc'ed buffer; k3c_engine_logits_free gives it to free(), never to host_free, while a buffer
 * host_alloc did give goes back to host_free exactly once. Seven refused buffers (past the fallback list's
 * first capacity of 4) are freed out of order. On a device engine the steps download into pageable memory
 * (the driver's staging), the path a refused cudaHostAlloc leaves. */
static inline void logits_fallback_case(const char *device) {
    char tag[64], errpath[600];
    snprintf(tag, sizeof tag, "logits-fallback-%s", device);
    snprintf(errpath, sizeof errpath, "%s/%s.stderr", test_tmpdir(), tag);
    k3c_model *m = NULL;
    k3c_engine *e = NULL;
    CHECK_OK(logits_case_engine(device, tag, &m, &e));
    k3c_engine_view v;
    k3c_engine_view_get(e, &v);
    void *(*orig_alloc)(k3c_backend *, size_t) = v.be->host_alloc;
    void (*orig_free)(k3c_backend *, void *) = v.be->host_free;
    v.be->host_alloc = stub_host_alloc_refused;
    v.be->host_free = stub_host_free;
    fb_given = fb_freed = NULL;
    fb_free_calls = 0;

    /* the engine's warnings go to a file for the duration of the refused allocations */
    fflush(stderr);
    int saved_err = dup(2), fd = open(errpath, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    int redirected = saved_err >= 0 && fd >= 0 && dup2(fd, 2) >= 0;
    enum { NFB = 7 };
    float *fb[NFB];
    for (int i = 0; i < NFB; i++) fb[i] = k3c_engine_logits_alloc(e, i == 0 ? 2 : 1 + i % 3);
    fflush(stderr);
    if (redirected) dup2(saved_err, 2);
    if (saved_err >= 0) close(saved_err);
    if (fd >= 0) close(fd);
    int allocated = 1;
    for (int i = 0; i < NFB; i++) allocated = allocated && fb[i];
    const char *alloc_msg = allocated ? "" : k3c_error_message();

    char warn[4096] = {0};
    FILE *wf = fopen(errpath, "r");
    size_t wn = wf ? fread(warn, 1, sizeof warn - 1, wf) : 0;
    if (wf) fclose(wf);
    warn[wn] = 0;
    int lines = 0;
    for (size_t i = 0; i < wn; i++) lines += warn[i] == '\n';
    int warned = strstr(warn, "k3c: warning:") && strstr(warn, "page-locked memory refused") &&
                 strstr(warn, "malloc'ed");

    /* two requests with one random prompt: one steps into plain malloc'ed memory, one into fb[0] */
    size_t V = (size_t)k3c_engine_vocab(e);
    float *plain = malloc(sizeof(float) * V);
    int32_t prompt[12];
    k3c_rng r;
    k3c_rng_seed(&r, test_seed() ^ 0xfa11bac);
    for (int i = 0; i < 12; i++) prompt[i] = (int32_t)(k3c_rng_next(&r) % V);
    int id[2] = {-1, -1};
    int ok = allocated && plain && k3c_request_open(e, &id[0]) == K3C_OK && k3c_request_open(e, &id[1]) == K3C_OK;
    size_t bad1 = 1, bad2 = 1;
    if (ok) {
        poison_f32(plain, V);
        poison_f32(fb[0], 2 * V);
        k3c_step_item a = {.request = id[0], .tokens = prompt, .n = 12};
        k3c_step_item b = {.request = id[1], .tokens = prompt, .n = 12};
        ok = k3c_engine_step(e, &a, 1, plain) == K3C_OK && k3c_engine_step(e, &b, 1, fb[0]) == K3C_OK;
        if (ok) bad1 = logits_same_bits(plain, fb[0], V);
        int32_t next = (int32_t)(k3c_rng_next(&r) % V);
        k3c_step_item d[2] = {{.request = id[0], .tokens = &next, .n = 1}, {.request = id[1], .tokens = &next, .n = 1}};
        poison_f32(fb[0], 2 * V);
        ok = ok && k3c_engine_step(e, d, 2, fb[0]) == K3C_OK;
        if (ok) bad2 = logits_same_bits(fb[0], fb[0] + V, V); /* the same history: the same row */
    }
    const char *step_msg = ok ? "" : k3c_error_message();

    /* a buffer host_alloc gives, beside a refused one still held */
    v.be->host_alloc = stub_host_alloc_ok;
    float *pinned = k3c_engine_logits_alloc(e, 3);
    int pinned_is_stubs = pinned && pinned == fb_given;
    int calls_before = fb_free_calls;
    k3c_engine_logits_free(e, pinned);
    int pinned_calls = fb_free_calls - calls_before, pinned_freed_once = pinned_calls == 1 && fb_freed == pinned;

    static const int order[NFB] = {3, 0, 6, 1, 5, 2, 4}; /* out of allocation order */
    calls_before = fb_free_calls;
    for (int i = 0; i < NFB; i++) k3c_engine_logits_free(e, fb[order[i]]);
    int fallback_not_host_freed = fb_free_calls == calls_before;

    v.be->host_alloc = orig_alloc;
    v.be->host_free = orig_free;
    free(plain);
    k3c_engine_free(e);
    k3c_free(m);
    CHECKF(allocated, "%s: logits_alloc returned NULL when host_alloc was refused: %s", device, alloc_msg);
    CHECKF(redirected && lines == NFB && warned,
           "expected %d one-line warnings naming the refusal and malloc'ed memory, got %d lines: '%s'", NFB, lines,
           warn);
    CHECKF(ok, "%s: a step into the fallback buffer failed: %s", device, step_msg);
    CHECKF(bad1 == 0, "%s: prompt logits into the fallback buffer differ from malloc'ed at %zu", device, bad1 - 1);
    CHECKF(bad2 == 0, "%s: two requests of one history decode different rows at %zu", device, bad2 - 1);
    CHECKF(pinned_is_stubs, "logits_alloc did not return host_alloc's buffer");
    CHECKF(pinned_freed_once, "host_alloc's buffer: host_free called %d times (want 1), last with %p (want %p)",
           pinned_calls, fb_freed, (void *)pinned);
    CHECKF(fallback_not_host_freed, "fallback buffers went to host_free (%d calls)", fb_free_calls - calls_before);
}

#endif
