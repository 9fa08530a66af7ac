/* What pipeline and expert parallelism add to the in-memory communicator (comm/threads.c): send / recv,
 * the all-to-all, split into a layout's groups. Every payload is fresh random data, half of its words +-0,
 * NaN, +-inf or subnormal, checked bitwise against what the test wrote, sizes change between calls; and
 * the failure contract: a missing peer ends in K3C_ERR on every rank within the timeout, mismatched calls
 * fail every rank taking part, an abort in one sub-group fails the others of the same world at once. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "comm/comm.h"
#include "test.h"
#include "util/error.h"
#include "util/rng.h"

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

/* Payload bytes: 4-byte words that are +0, -0, NaN, +-inf, subnormals or random bits (a size that is not a
 * multiple of 4 ends in random bytes), so a transport that treats the data as floats (summing, canonicalizing
 * a NaN, mapping -0 to +0 as a sentinel scheme would) shows up. */
static void fill_bytes(k3c_rng *g, unsigned char *p, size_t n) {
    static const uint32_t special[] = {0x00000000u, 0x80000000u, 0x7fc00001u, 0xffc00000u, 0x7f800000u,
                                       0xff800000u, 0x00000001u, 0x807fffffu};
    size_t i = 0;
    for (; i + 4 <= n; i += 4) {
        uint64_t u = k3c_rng_next(g);
        uint32_t w = (u & 7) < 4 ? special[(u >> 3) & 7] : (uint32_t)(u >> 32);
        memcpy(p + i, &w, 4);
    }
    for (; i < n; i++) p[i] = (unsigned char)(k3c_rng_next(g) >> 56);
}

/* A world of n threads running fn(rank job); jobs hold their comm. */
typedef struct job {
    k3c_comm *c;
    int mode;
    uint64_t seed;
    int rounds;
    int rc, rc2;
    int bad;        /* a payload differed */
    double seconds; /* how long the failing call took */
    char err[300];
} job;

static int run_world(int n, int timeout_ms, int mode, uint64_t seed, int rounds, void *(*fn)(void *), job *jobs) {
    k3c_comm_group *grp;
    K3C_TRY(k3c_comm_group_create(n, timeout_ms, &grp));
    pthread_t th[16];
    for (int k = 0; k < n; k++) {
        memset(&jobs[k], 0, sizeof jobs[k]);
        jobs[k].mode = mode;
        jobs[k].seed = seed;
        jobs[k].rounds = rounds;
        K3C_TRY(k3c_comm_group_join(grp, k, &jobs[k].c));
    }
    for (int k = 0; k < n; k++) pthread_create(&th[k], NULL, fn, &jobs[k]);
    for (int k = 0; k < n; k++) pthread_join(th[k], NULL);
    for (int k = 0; k < n; k++) jobs[k].c->free(jobs[k].c);
    return K3C_OK;
}

static void note(job *j, int rc) {
    if (rc != K3C_OK && j->rc == K3C_OK) {
        j->rc = rc;
        snprintf(j->err, sizeof j->err, "%s", k3c_error_message());
    }
}

/* ---- send / recv ---- */

/* Round r's message from rank s: its size and bytes follow from (seed, r, s) alone, so the receiver knows
 * what to expect without being told. Sizes 0 .. ~9000 bytes, changing every round. */
static size_t msg_size(uint64_t seed, int r, int s) {
    k3c_rng g;
    k3c_rng_seed(&g, seed ^ ((uint64_t)r << 20) ^ (uint64_t)s);
    uint64_t u = k3c_rng_next(&g);
    return r % 7 == 3 ? 0 : (size_t)(u % 9000);
}

static void msg_fill(uint64_t seed, int r, int s, unsigned char *p, size_t n) {
    k3c_rng g;
    k3c_rng_seed(&g, seed ^ ((uint64_t)r << 20) ^ (uint64_t)s ^ 0x5eed);
    fill_bytes(&g, p, n);
}

/* A chain, as pipeline stages run: rank s receives from s - 1, then sends to s + 1; the last rank then sends
 * a message back to rank 0 (the sampled token going back to the first stage), which rank 0 takes after its
 * own send of the round. */
static void *chain_thread(void *p) {
    job *j = p;
    k3c_comm *c = j->c;
    int n = c->size, s = c->rank;
    unsigned char *in = malloc(9000), *out = malloc(9000), *want = malloc(9000);
    for (int r = 0; r < j->rounds && j->rc == K3C_OK; r++) {
        if (s > 0) {
            size_t m = msg_size(j->seed, r, s - 1);
            note(j, c->recv(c, in, m, s - 1));
            msg_fill(j->seed, r, s - 1, want, m);
            if (j->rc == K3C_OK && memcmp(in, want, m)) j->bad = 1;
        }
        if (s < n - 1 && j->rc == K3C_OK) {
            size_t m = msg_size(j->seed, r, s);
            msg_fill(j->seed, r, s, out, m);
            note(j, c->send(c, out, m, s + 1));
        }
        if (n > 1 && s == n - 1 && j->rc == K3C_OK) {
            size_t m = msg_size(j->seed, r, 1000 + s);
            msg_fill(j->seed, r, 1000 + s, out, m);
            note(j, c->send(c, out, m, 0));
        }
        if (n > 1 && s == 0 && j->rc == K3C_OK) {
            size_t m = msg_size(j->seed, r, 1000 + n - 1);
            note(j, c->recv(c, in, m, n - 1));
            msg_fill(j->seed, r, 1000 + n - 1, want, m);
            if (j->rc == K3C_OK && memcmp(in, want, m)) j->bad = 1;
        }
    }
    free(in), free(out), free(want);
    return NULL;
}

TEST(comm_threads_send_recv_chain) {
    uint64_t seed = test_seed();
    job j[8];
    for (int n = 2; n <= 6; n += 2) {
        CHECK_OK(run_world(n, 10000, 0, seed + n, 200, chain_thread, j));
        for (int k = 0; k < n; k++) CHECKF(j[k].rc == K3C_OK && !j[k].bad, "%d ranks, rank %d: rc %d bad %d: %s", n, k,
                                           j[k].rc, j[k].bad, j[k].err);
    }
}

/* mode 1: rank 1 posts a recv of another size than rank 0 sends; 2: rank 0 sends, rank 1 never receives;
 * 3: rank 1 waits for a send that never comes; 4: a send to itself, and to a rank outside the group. */
static void *p2p_fail_thread(void *p) {
    job *j = p;
    k3c_comm *c = j->c;
    unsigned char buf[64] = {0};
    double t0 = now_s();
    switch (j->mode) {
    case 1: j->rc = c->rank == 0 ? c->send(c, buf, 64, 1) : c->recv(c, buf, 63, 0); break;
    case 2: j->rc = c->rank == 0 ? c->send(c, buf, 64, 1) : K3C_ERR; break;
    case 3: j->rc = c->rank == 1 ? c->recv(c, buf, 64, 0) : K3C_ERR; break;
    case 4:
        j->rc = c->rank == 0 ? c->send(c, buf, 8, 0) : K3C_ERR;
        if (c->rank == 0) j->rc2 = c->send(c, buf, 8, 5);
        break;
    }
    j->seconds = now_s() - t0;
    if (j->rc != K3C_OK) snprintf(j->err, sizeof j->err, "%s", k3c_error_message());
    if (c->rank == 1 || j->mode == 1) {
        /* after a failure every later call fails at once */
        double t1 = now_s();
        j->rc2 = c->barrier(c);
        if (now_s() - t1 > 0.1) j->bad = 1;
    }
    return NULL;
}

TEST(comm_threads_send_recv_failures) {
    job j[2];
    CHECK_OK(run_world(2, 10000, 1, 0, 0, p2p_fail_thread, j)); /* sizes differ: both fail at once */
    CHECKF(j[0].rc == K3C_ERR && j[1].rc == K3C_ERR, "mismatch: %d %d", j[0].rc, j[1].rc);
    CHECKF(strstr(j[1].err, "63") && strstr(j[1].err, "64"), "%s", j[1].err);
    CHECK(j[0].seconds < 5 && j[1].seconds < 5 && j[0].rc2 == K3C_ERR && j[1].rc2 == K3C_ERR && !j[1].bad);
    CHECK_OK(run_world(2, 250, 2, 0, 0, p2p_fail_thread, j)); /* no recv: the send times out */
    CHECKF(j[0].rc == K3C_ERR && strstr(j[0].err, "timed out"), "%s", j[0].err);
    CHECK(j[0].seconds >= 0.2 && j[0].seconds < 3);
    CHECK(j[1].rc2 == K3C_ERR);
    CHECK_OK(run_world(2, 250, 3, 0, 0, p2p_fail_thread, j)); /* no send: the recv times out */
    CHECKF(j[1].rc == K3C_ERR && strstr(j[1].err, "timed out"), "%s", j[1].err);
    CHECK(j[1].seconds >= 0.2 && j[1].seconds < 3);
    CHECK_OK(run_world(2, 10000, 4, 0, 0, p2p_fail_thread, j)); /* no such peer */
    CHECK(j[0].rc == K3C_ERR && j[0].rc2 == K3C_ERR && j[0].seconds < 1);
    k3c_comm *s = k3c_comm_self();
    unsigned char b[4] = {0};
    CHECK(s->send(s, b, 4, 0) == K3C_ERR && s->recv(s, b, 4, 0) == K3C_ERR);
}

/* ---- all-to-all ---- */

/* Round r: rank s sends cnt(r, s, d) bytes to rank d, the bytes a function of (seed, r, s, d). */
static size_t a2a_count(uint64_t seed, int r, int s, int d) {
    k3c_rng g;
    k3c_rng_seed(&g, seed ^ ((uint64_t)r << 24) ^ ((uint64_t)s << 12) ^ (uint64_t)d);
    uint64_t u = k3c_rng_next(&g);
    return u % 3 == 0 ? 0 : (size_t)(u >> 8) % (r % 2 ? 50 : 3000);
}

static void *a2a_thread(void *p) {
    job *j = p;
    k3c_comm *c = j->c;
    int n = c->size, me = c->rank;
    size_t sb[16], rb[16];
    unsigned char *send = malloc(16 * 3000), *recv = malloc(16 * 3000 + 1), *want = malloc(3000);
    for (int r = 0; r < j->rounds && j->rc == K3C_OK; r++) {
        size_t at = 0;
        for (int d = 0; d < n; d++) {
            sb[d] = a2a_count(j->seed, r, me, d);
            rb[d] = a2a_count(j->seed, r, d, me);
            k3c_rng g;
            k3c_rng_seed(&g, j->seed ^ ((uint64_t)r << 24) ^ ((uint64_t)me << 12) ^ (uint64_t)d ^ 0xa2a);
            fill_bytes(&g, send + at, sb[d]);
            at += sb[d];
        }
        memset(recv, 0xee, 16 * 3000 + 1);
        note(j, c->all_to_all(c, send, sb, recv, rb));
        at = 0;
        for (int s = 0; s < n && j->rc == K3C_OK; s++) {
            k3c_rng g;
            k3c_rng_seed(&g, j->seed ^ ((uint64_t)r << 24) ^ ((uint64_t)s << 12) ^ (uint64_t)me ^ 0xa2a);
            fill_bytes(&g, want, rb[s]);
            if (memcmp(recv + at, want, rb[s])) j->bad = 1;
            at += rb[s];
        }
        if (j->rc == K3C_OK && recv[at] != 0xee) j->bad = 1; /* nothing written past the parts */
    }
    free(send), free(recv), free(want);
    return NULL;
}

TEST(comm_threads_all_to_all_counts) {
    uint64_t seed = test_seed();
    job j[8];
    for (int n = 1; n <= 8; n++) {
        CHECK_OK(run_world(n, 10000, 0, seed + n, 60, a2a_thread, j));
        for (int k = 0; k < n; k++)
            CHECKF(j[k].rc == K3C_OK && !j[k].bad, "%d ranks, rank %d: rc %d bad %d: %s", n, k, j[k].rc, j[k].bad,
                   j[k].err);
    }
    size_t sb = 5, rb = 5;
    unsigned char a[5] = {1, 2, 3, 4, 5}, b[5] = {0};
    k3c_comm *s = k3c_comm_self();
    CHECK(s->all_to_all(s, a, &sb, b, &rb) == K3C_OK && memcmp(a, b, 5) == 0);
    rb = 4;
    CHECK(s->all_to_all(s, a, &sb, b, &rb) == K3C_ERR);
}

/* mode 1: rank 2 expects one byte less from rank 0 than rank 0 sends; 2: rank 0 never calls. */
static void *a2a_fail_thread(void *p) {
    job *j = p;
    k3c_comm *c = j->c;
    size_t sb[4] = {4, 4, 4, 4}, rb[4] = {4, 4, 4, 4};
    unsigned char send[16] = {0}, recv[16];
    if (j->mode == 1 && c->rank == 2) rb[0] = 3;
    double t0 = now_s();
    j->rc = j->mode == 2 && c->rank == 0 ? K3C_ERR : c->all_to_all(c, send, sb, recv, rb);
    j->seconds = now_s() - t0;
    if (j->rc != K3C_OK) snprintf(j->err, sizeof j->err, "%s", k3c_error_message());
    return NULL;
}

TEST(comm_threads_all_to_all_failures) {
    job j[4];
    CHECK_OK(run_world(4, 10000, 1, 0, 0, a2a_fail_thread, j));
    for (int k = 0; k < 4; k++) {
        CHECKF(j[k].rc == K3C_ERR && j[k].seconds < 5, "rank %d: rc %d in %.2f s", k, j[k].rc, j[k].seconds);
        CHECKF(strstr(j[k].err, "rank 0 sends 4 bytes to rank 2, which expects 3"), "rank %d: %s", k, j[k].err);
    }
    CHECK_OK(run_world(4, 250, 2, 0, 0, a2a_fail_thread, j));
    for (int k = 1; k < 4; k++)
        CHECKF(j[k].rc == K3C_ERR && j[k].seconds >= 0.2 && j[k].seconds < 3, "rank %d: rc %d in %.2f s: %s", k,
               j[k].rc, j[k].seconds, j[k].err);
}

/* ---- split into a layout's groups ---- */

/* mode: 0 a world of tp 2 x pp 2 x dp 2: each group's all-reduce sums exactly its members' world ranks, and
 * pp sends pass stage to stage; 1 the same layout, world rank 5 aborts its tp group: every rank's next
 * call in any group fails, at once; 2 tp 1 x pp 2 x dp 4 with ep 4: the ep group is the stage's dp ranks. */
static void *split_thread(void *p) {
    job *j = p;
    k3c_comm *w = j->c;
    k3c_comm_groups g;
    int tp = j->mode == 2 ? 1 : 2, dp = j->mode == 2 ? 4 : 2, ep = j->mode == 2 ? 4 : 1;
    j->rc = k3c_comm_groups_split(w, tp, 2, dp, ep, &g);
    if (j->rc != K3C_OK) {
        snprintf(j->err, sizeof j->err, "%s", k3c_error_message());
        return NULL;
    }
    int r = w->rank, stage = r / (tp * dp);
    /* the members a group should have: sum of 2^world rank over them */
    float tp_want = 0, pp_want = 0, ep_want = 0;
    for (int q = 0; q < w->size; q++) {
        if (q / tp == r / tp) tp_want += (float)(1 << q);
        if (q % (tp * dp) == r % (tp * dp)) pp_want += (float)(1 << q);
        if (q / (tp * dp) == stage) ep_want += (float)(1 << q);
    }
    if (j->mode == 1) {
        if (r == 5) {
            g.tp->abort(g.tp);
            j->rc = K3C_ERR;
        } else {
            double t0 = now_s();
            float x = 1;
            /* the pp group of rank 5's stage, or any other: the failure reaches them all */
            j->rc = g.pp->all_reduce_f32(g.pp, &x, 1);
            if (j->rc == K3C_OK) j->rc = g.pp->all_reduce_f32(g.pp, &x, 1);
            if (j->rc == K3C_OK) j->rc = g.tp->all_reduce_f32(g.tp, &x, 1);
            j->seconds = now_s() - t0;
        }
        j->rc2 = w->barrier(w);
        k3c_comm_groups_free(&g);
        return NULL;
    }
    float x = (float)(1 << r);
    if (g.tp) {
        if (g.tp->size != tp || g.tp->rank != r % tp) j->bad = 1;
        note(j, g.tp->all_reduce_f32(g.tp, &x, 1));
        if (x != tp_want) j->bad = 1;
    }
    if (g.pp->size != 2 || g.pp->rank != stage) j->bad = 1;
    x = (float)(1 << r);
    note(j, g.pp->all_reduce_f32(g.pp, &x, 1));
    if (x != pp_want) j->bad = 1;
    int v = r, got = -1;
    if (stage == 0) note(j, g.pp->send(g.pp, &v, sizeof v, 1));
    else note(j, g.pp->recv(g.pp, &got, sizeof got, 0));
    if (stage == 1 && got != r - tp * dp) j->bad = 1;
    if (ep > 1) {
        if (!g.ep || g.ep->size != dp || g.ep->rank != r % dp) j->bad = 1;
        x = (float)(1 << r);
        if (g.ep) note(j, g.ep->all_reduce_f32(g.ep, &x, 1));
        if (x != ep_want) j->bad = 1;
    } else if (g.ep) {
        j->bad = 1;
    }
    k3c_comm_groups_free(&g);
    return NULL;
}

TEST(comm_threads_split_groups) {
    job j[8];
    CHECK_OK(run_world(8, 10000, 0, 0, 0, split_thread, j));
    for (int k = 0; k < 8; k++) CHECKF(j[k].rc == K3C_OK && !j[k].bad, "rank %d: rc %d bad %d: %s", k, j[k].rc,
                                       j[k].bad, j[k].err);
    CHECK_OK(run_world(8, 10000, 2, 0, 0, split_thread, j));
    for (int k = 0; k < 8; k++) CHECKF(j[k].rc == K3C_OK && !j[k].bad, "ep, rank %d: rc %d bad %d: %s", k, j[k].rc,
                                       j[k].bad, j[k].err);
    CHECK_OK(run_world(8, 60000, 1, 0, 0, split_thread, j)); /* a 60 s timeout: only the abort can end the waits */
    for (int k = 0; k < 8; k++)
        CHECKF(j[k].rc == K3C_ERR && j[k].rc2 == K3C_ERR && j[k].seconds < 5, "rank %d: rc %d / %d in %.2f s", k,
               j[k].rc, j[k].rc2, j[k].seconds);
    /* layouts that do not describe the world */
    k3c_comm_groups g;
    k3c_comm *s = k3c_comm_self();
    CHECK(k3c_comm_groups_split(s, 2, 1, 1, 1, &g) == K3C_ERR);
    CHECK(k3c_comm_groups_split(s, 1, 1, 1, 1, &g) == K3C_OK && !g.tp && !g.pp && !g.ep);
}
