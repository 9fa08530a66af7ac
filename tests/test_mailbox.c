/* The mailbox all-reduce protocol (comm/mailbox.h) on host threads, through the hard cases: many calls in a
 * row with sizes changing between them, -0.0 / +0.0 / subnormal / infinite inputs, epochs wrapping past
 * 2^32, a peer that never comes (bounded wait), a peer with another size. The reference is the sum in rank
 * order written here from the contract, compared bitwise (so -0 + -0 = -0 is checked, not just values). */
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "comm/mailbox.h"
#include "comm/mailbox_dev.h"
#include "test.h"
#include "util/error.h"
#include "util/rng.h"

#define MB_CAP 1536

typedef struct mb_job {
    k3c_mailbox *mb;
    int rank, ranks, calls, timeout_ms;
    uint32_t first_epoch;
    uint64_t seed;
    size_t extra; /* added to this rank's sizes (a mismatched call) */
    int skip;     /* 1: this rank never calls */
    long bad;     /* results that differ from the reference */
    int rc;
    char err[256];
} mb_job;

/* Every rank's input of call c, element i: the same function on every thread, so each can form the reference.
 * Mixed signs and magnitudes, signed zeros, subnormals and infinities (never both signs of infinity in one
 * element, which would make NaN, whose bits the sum need not keep). */
static float mb_value(uint64_t seed, int call, int rank, size_t i) {
    k3c_rng g;
    k3c_rng_seed(&g, seed ^ ((uint64_t)call << 32) ^ ((uint64_t)rank << 20) ^ (uint64_t)i);
    uint64_t u = k3c_rng_next(&g);
    switch (u % 16) {
    case 0: return -0.0f;
    case 1: return 0.0f;
    case 2: return ((u >> 8) & 1 ? -1.0f : 1.0f) * 1e-40f; /* subnormal */
    case 3: return (i & 1) ? INFINITY : 1.0f;               /* +inf only at odd elements */
    default: return (float)((double)(u >> 11) / 9007199254740992.0 - 0.5) * ldexpf(1.0f, (int)(u % 40) - 20);
    }
}

/* The size of call c, the same on every rank (0 included, up to the slots' capacity). */
static size_t mb_size(uint64_t seed, int call) {
    k3c_rng g;
    k3c_rng_seed(&g, seed ^ 0x51e5 ^ (uint64_t)call);
    uint64_t u = k3c_rng_next(&g);
    return u % 8 == 0 ? 0 : u % 8 == 1 ? MB_CAP : (size_t)(u % MB_CAP);
}

static void *mb_thread(void *p) {
    mb_job *j = p;
    if (j->skip) return NULL;
    k3c_mailbox_rank r;
    j->rc = k3c_mailbox_rank_init(j->mb, j->rank, j->first_epoch, &r);
    float *x = malloc(sizeof(float) * (MB_CAP + 8));
    if (!x) j->rc = K3C_ERR;
    for (int c = 0; c < j->calls && j->rc == K3C_OK; c++) {
        size_t n = mb_size(j->seed, c) + j->extra;
        if (n > MB_CAP) n = MB_CAP;
        for (size_t i = 0; i < n; i++) x[i] = mb_value(j->seed, c, j->rank, i);
        j->rc = k3c_mailbox_all_reduce(&r, x, n, j->timeout_ms);
        if (j->rc != K3C_OK) {
            snprintf(j->err, sizeof j->err, "%s", k3c_error_message());
            break;
        }
        for (size_t i = 0; i < n; i++) {
            float want = mb_value(j->seed, c, 0, i);
            for (int q = 1; q < j->ranks; q++) want += mb_value(j->seed, c, q, i);
            if (memcmp(&want, &x[i], sizeof want) != 0) j->bad++;
        }
    }
    free(x);
    return NULL;
}

/* ranks threads, calls calls each; returns how many ranks failed; *bad = differing results over all ranks. */
static int mb_run(int ranks, int calls, uint32_t first_epoch, uint64_t seed, int skip_rank, int extra_rank,
                  int timeout_ms, long *bad, char *err, size_t errcap) {
    k3c_mailbox *mb;
    if (k3c_mailbox_create(ranks, MB_CAP, &mb) != K3C_OK) return ranks;
    mb_job jobs[16];
    pthread_t th[16];
    for (int k = 0; k < ranks; k++) {
        jobs[k] = (mb_job){.mb = mb, .rank = k, .ranks = ranks, .calls = calls, .timeout_ms = timeout_ms,
                           .first_epoch = first_epoch, .seed = seed, .extra = k == extra_rank ? 1 : 0,
                           .skip = k == skip_rank};
        pthread_create(&th[k], NULL, mb_thread, &jobs[k]);
    }
    int failed = 0;
    *bad = 0;
    if (err && errcap) err[0] = 0;
    for (int k = 0; k < ranks; k++) {
        pthread_join(th[k], NULL);
        *bad += jobs[k].bad;
        if (!jobs[k].skip && jobs[k].rc != K3C_OK) {
            failed++;
            if (err && !err[0]) snprintf(err, errcap, "%s", jobs[k].err);
        }
    }
    k3c_mailbox_free(mb);
    return failed;
}

TEST(mailbox_all_reduce_many_calls_bitwise) {
    static const int sizes[] = {2, 3, 4, 8};
    for (size_t s = 0; s < sizeof sizes / sizeof *sizes; s++) {
        long bad;
        char err[256];
        int calls = sizes[s] <= 4 ? 3000 : 1000;
        int failed = mb_run(sizes[s], calls, 0, test_seed() ^ (uint64_t)s, -1, -1, 20000, &bad, err, sizeof err);
        printf("  [%d ranks, %d calls: %d ranks failed, %ld results differ from the rank-order sum]\n", sizes[s],
               calls, failed, bad);
        CHECKF(failed == 0, "%d ranks: %s", sizes[s], err);
        CHECK(bad == 0);
    }
}

TEST(mailbox_epochs_wrap) {
    /* from 2^32 - 7 on: the epoch passes 2^32 - 1, skips 0 and goes on at 2 with the parity alternating */
    long bad;
    char err[256];
    int failed = mb_run(4, 64, UINT32_MAX - 6, test_seed(), -1, -1, 20000, &bad, err, sizeof err);
    CHECKF(failed == 0, "%s", err);
    CHECK(bad == 0);
    k3c_mailbox *mb;
    CHECK_OK(k3c_mailbox_create(2, 4, &mb));
    k3c_mailbox_rank r;
    CHECK_OK(k3c_mailbox_rank_init(mb, 0, 0, &r));
    CHECK(r.epoch == 1);
    k3c_mailbox_free(mb);
}

TEST(mailbox_missing_peer_times_out) {
    long bad;
    char err[256];
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    int failed = mb_run(3, 5, 0, test_seed(), 2, -1, 200, &bad, err, sizeof err);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double s = (t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) * 1e-9;
    printf("  [rank 2 never calls: %d ranks failed in %.2f s: %s]\n", failed, s, err);
    CHECK(failed == 2 && strstr(err, "rank 2") != NULL);
    CHECK(s < 5.0);
}

TEST(mailbox_mismatched_sizes_fail) {
    long bad;
    char err[256];
    /* rank 1 reduces one float more in every call: its peers see it at the first call with n < cap */
    int failed = mb_run(3, 20, 0, test_seed(), -1, 1, 2000, &bad, err, sizeof err);
    CHECK(failed >= 1);
    CHECKF(strstr(err, "pushed") != NULL || strstr(err, "waited") != NULL, "%s", err);
    k3c_mailbox *mb;
    CHECK(k3c_mailbox_create(1, 8, &mb) != K3C_OK);
    CHECK(k3c_mailbox_create(4, 0, &mb) != K3C_OK);
    CHECK_OK(k3c_mailbox_create(2, 8, &mb));
    k3c_mailbox_rank r;
    CHECK(k3c_mailbox_rank_init(mb, 2, 0, &r) != K3C_OK);
    CHECK_OK(k3c_mailbox_rank_init(mb, 0, 0, &r));
    float x[9] = {0};
    CHECK(k3c_mailbox_all_reduce(&r, x, 9, 10) != K3C_OK); /* past the slots */
    k3c_mailbox_free(mb);
}

/* The device mailbox's region layout and partition arithmetic (comm/mailbox_dev.h), which its kernels and
 * its host side share: every part of a region aligned and apart, the highest flag and slot inside their
 * arrays; the parts of n elements covering [0, n) in order, on multiples of g, a two-shot shard the parts
 * s * G .. s * G + G - 1; the epoch's successor skipping 0 and alternating the parity across the wrap. */

TEST(mailbox_device_layout) {
    static const int blocks[] = {1, 2, 3, 16, 32};
    static const size_t caps[] = {1, 63, 64, 65, 1000, (size_t)1 << 20};
    for (int R = 2; R <= K3C_MBX_MAX_RANKS; R++)
        for (size_t bi = 0; bi < sizeof blocks / sizeof *blocks; bi++)
            for (size_t ci = 0; ci < sizeof caps / sizeof *caps; ci++) {
                const int G = blocks[bi];
                k3c_mbx_layout l;
                CHECK(k3c_mbx_layout_make(R, G, caps[ci], &l) == 0);
                size_t flags = (size_t)2 * G * R * sizeof(k3c_mbx_flag), slots = (size_t)2 * R * l.slot_floats * 4;
                CHECK(l.slot_floats >= caps[ci] && l.slot_floats % 64 == 0 && l.slot_floats < caps[ci] + 64);
                CHECK(l.f1 % K3C_MBX_ALIGN == 0 && l.f2 % K3C_MBX_ALIGN == 0 && l.slots % K3C_MBX_ALIGN == 0 &&
                      l.ag % K3C_MBX_ALIGN == 0);
                CHECK(l.f1 >= sizeof(k3c_mbx_state) && l.f2 >= l.f1 + flags && l.slots >= l.f2 + flags);
                CHECK(l.ag == l.slots + slots && l.bytes == l.ag + slots);
                char *base = (char *)0 + 4096; /* addresses only: nothing is dereferenced */
                CHECK((char *)(k3c_mbx_flag_at(base, l.f1, &l, 1, G - 1, R - 1) + 1) == base + l.f1 + flags);
                CHECK((char *)k3c_mbx_flag_at(base, l.f2, &l, 0, 0, 0) == base + l.f2);
                CHECK((char *)(k3c_mbx_slot_at(base, l.slots, &l, 1, R - 1) + l.slot_floats) == base + l.ag);
                CHECK((char *)(k3c_mbx_slot_at(base, l.ag, &l, 1, R - 1) + l.slot_floats) == base + l.bytes);
                CHECK((size_t)((char *)k3c_mbx_slot_at(base, l.slots, &l, 0, 1) - base) % K3C_MBX_ALIGN == 0);
            }
    k3c_mbx_layout l;
    CHECK(k3c_mbx_layout_make(1, 1, 8, &l) != 0 && k3c_mbx_layout_make(K3C_MBX_MAX_RANKS + 1, 1, 8, &l) != 0);
    CHECK(k3c_mbx_layout_make(2, 0, 8, &l) != 0 && k3c_mbx_layout_make(2, K3C_MBX_MAX_BLOCKS + 1, 8, &l) != 0);
    CHECK(k3c_mbx_layout_make(2, 1, 0, &l) != 0 && k3c_mbx_layout_make(2, 1, K3C_MBX_MAX_CAP + 1, &l) != 0);

    k3c_rng g;
    k3c_rng_seed(&g, test_seed() ^ 0x9a27);
    static const unsigned parts[] = {1, 2, 3, 7, 8, 16, 24, 64, 256};
    for (int t = 0; t < 600; t++) {
        size_t n = t < 300 ? (size_t)t : (size_t)(k3c_rng_next(&g) % ((size_t)1 << 28));
        for (size_t gi = 0; gi < 2; gi++)
            for (size_t pi = 0; pi < sizeof parts / sizeof *parts; pi++) {
                const size_t gr = gi ? 16 : 4;
                size_t at = 0;
                for (unsigned u = 0; u < parts[pi]; u++) {
                    size_t lo, hi;
                    k3c_mbx_part(n, gr, u, parts[pi], &lo, &hi);
                    CHECKF(lo == at && hi >= lo && lo % gr == 0 && (hi % gr == 0 || u + 1 == parts[pi]),
                           "n %zu, g %zu, part %u of %u: [%zu, %zu) after %zu", n, gr, u, parts[pi], lo, hi, at);
                    at = hi;
                }
                CHECK(at == n);
            }
        /* two-shot: rank s's shard is parts s * G .. s * G + G - 1 of R * G, contiguous, the ranks in order */
        for (int R = 2; R <= K3C_MBX_MAX_RANKS; R++) {
            const unsigned G = 1 + (unsigned)(k3c_rng_next(&g) % 32);
            size_t lo0, hi0, lo1, hi1;
            k3c_mbx_part(n, 4, 0, (unsigned)R * G, &lo0, &hi0);
            k3c_mbx_part(n, 4, (unsigned)R * G - 1, (unsigned)R * G, &lo1, &hi1);
            CHECK(lo0 == 0 && hi1 == n);
        }
    }
    CHECK(k3c_mbx_next_epoch(1) == 2 && k3c_mbx_next_epoch(UINT32_MAX - 1) == UINT32_MAX);
    CHECK(k3c_mbx_next_epoch(UINT32_MAX) == 2);
    for (uint32_t e = UINT32_MAX - 8, k = 0; k < 16; k++, e = k3c_mbx_next_epoch(e))
        CHECK(e != 0 && (k3c_mbx_next_epoch(e) & 1) != (e & 1));
}
