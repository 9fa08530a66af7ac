/* The engine as one rank of a group (runtime/engine_ranks.h): rank 0 leads, the others follow its steps. */
#include "runtime/engine_ranks.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cache/kda_slots.h"
#include "cache/kv_cache.h"
#include "runtime/engine_internal.h"
#include "runtime/ranks.h"
#include "util/error.h"
#include "util/log.h"

/* The message: a header, then the payload of the log's words and the step's.
 *   header: [0] magic | kind << 16, [1] message sequence number, [2] payload words, [3] of which log words,
 *           [4] step items (0 for a log or stop message), [5] flags (1: compare the logits, 2: the step runs
 *           on the executor, 4: every rank meets rank 0 at a barrier before the step), [6] step number,
 *           [7] the executor's shape (rows << 8 | q) of an executor step or of a capture message
 *   log:    per op [op, words that follow, args...]
 *   step:   per item [slot, n, pos, verify, logits mode, blocks held, blocks new, new block ids..., tokens...] */
enum { HDR_WORDS = 8, MAGIC = 0x4b33, MSG_LOG = 1, MSG_STEP = 2, MSG_STOP = 3, FLAG_CHECK = 1, ITEM_WORDS = 7 };
/* the executor at TP (runtime/engine_ranks.h k3c_ranks_capture): every rank captures a shape together */
enum { MSG_CAPTURE = 4, FLAG_EXEC = 2, FLAG_SYNC = 4 };

typedef struct follower {
    k3c_model *m;
    k3c_engine_options o;
    int num_blocks_given;
    k3c_rank rank;
    pthread_t thread;
    int started;
} follower;

struct k3c_engine_ranks {
    k3c_rank rk;
    k3c_engine *e;
    /* the engine's sizes (k3c_engine_view) */
    int max_requests, max_rows, mbr, num_blocks, max_context, block_size, vocab;
    /* the message */
    int32_t hdr[HDR_WORDS];
    int32_t *msg;          /* [cap] payload */
    size_t cap, log_cap, log_words;
    long seq, steps;
    int32_t shape;         /* the next message's header word 7 (then 0 again) */
    int allocs;            /* the log sent since the last executor step holds an op that allocates or frees */
    uint64_t *hashes;      /* [world] the step check's gather */
    int check;
    long checked;
    /* rank 0 */
    pthread_mutex_t mu;
    int *sent;             /* [max_requests] blocks of each slot's table the followers hold */
    int *held;             /* [max_requests] step scratch: what each item's table holds once the step is sent */
    int failed;
    char why[2048];
    pthread_t ka;
    pthread_cond_t ka_cv;
    int ka_on, ka_stop;
    struct timespec last;  /* when the last message went out */
    follower *fol;         /* in one process: ranks 1 .. world - 1 */
    int nfol;
    /* a follower */
    int32_t *tables;       /* [max_requests, mbr] each slot's block table as rank 0 sent it */
    int *ntab;             /* [max_requests] */
    void *snap;
    size_t snap_bytes;
    int snap_count;
    float *logits;         /* [max_rows, vocab] */
    k3c_fwd_req *fr;       /* [max_requests] */
    /* data parallelism (dp > 1): the DP rank each slot's request runs on (every rank, from rank 0's PLACE
     * ops), rank 0's count of open requests per DP rank; every rank's own items and logits rows of a step */
    int *slot_dp;          /* [max_requests] */
    int *dp_load;          /* [dp] rank 0 */
    long *dp_placed;       /* [dp] rank 0: requests placed on each so far */
    k3c_fwd_req *own;      /* [max_requests] */
    float *own_logits;     /* [max_rows, vocab] */
};

const k3c_rank *k3c_ranks_place(const k3c_engine_ranks *x) { return &x->rk; }
int k3c_ranks_rank(const k3c_engine_ranks *x) { return x->rk.rank; }
int k3c_ranks_world(const k3c_engine_ranks *x) { return x->rk.world; }
int k3c_ranks_device(const k3c_engine_ranks *x) { return k3c_rank_device(&x->rk); }
int k3c_ranks_attach_backend(k3c_engine_ranks *x, k3c_backend *be) { return k3c_rank_attach_device(&x->rk, be); }
int k3c_ranks_agree(k3c_engine_ranks *x, k3c_backend *be, int mine, int *all) {
    return k3c_rank_agree(&x->rk, be, mine, all);
}
int k3c_ranks_mailbox(k3c_engine_ranks *x, k3c_backend *be, size_t cap, k3c_comm **out, char *why, size_t why_cap) {
    int rc = k3c_rank_mailbox(&x->rk, be, cap, out, why, why_cap);
    x->rk.mailbox = *out; /* the rank's, freed with its communicators */
    return rc;
}
const char *k3c_ranks_failed(const k3c_engine_ranks *x) {
    /* rank 0's keep-alive thread may fail the group: read under its mutex (why is not written again after) */
    k3c_engine_ranks *w = (k3c_engine_ranks *)x;
    if (x->ka_on >= 0) pthread_mutex_lock(&w->mu);
    int failed = x->failed;
    if (x->ka_on >= 0) pthread_mutex_unlock(&w->mu);
    return failed ? x->why : NULL;
}
void k3c_ranks_set_check(k3c_engine_ranks *x, int on) { x->check = on != 0; }
long k3c_ranks_checked(const k3c_engine_ranks *x) { return x->checked; }

static double since(const struct timespec *t0) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)(t.tv_sec - t0->tv_sec) + (t.tv_nsec - t0->tv_nsec) * 1e-9;
}

/* The buffers, once the rank's engine exists (its sizes). */
static int attach(k3c_engine_ranks *x, k3c_engine *e) {
    k3c_engine_view v;
    k3c_engine_view_get(e, &v);
    x->e = e;
    x->max_requests = v.max_requests;
    x->max_rows = v.max_rows;
    x->mbr = v.max_blocks_per_request;
    x->num_blocks = v.kv->num_blocks;
    x->max_context = v.max_context;
    x->block_size = v.block_size;
    x->vocab = v.m->config.vocab_size;
    /* an OPEN of a whole prefix fits an empty log; the step part holds any step the engine allows */
    x->log_cap = 1024 + (size_t)x->mbr + 2;
    size_t step_cap = (size_t)(ITEM_WORDS + 2) * x->max_requests + x->max_rows + x->max_rows / x->block_size + 16;
    x->cap = x->log_cap + step_cap;
    x->msg = malloc(sizeof(int32_t) * x->cap);
    x->hashes = malloc(sizeof(uint64_t) * (size_t)x->rk.world);
    if (!x->msg || !x->hashes) return k3c_errorf_kind(K3C_ERROR_OOM, "ranks: out of memory for the step messages");
    x->slot_dp = calloc((size_t)x->max_requests, sizeof *x->slot_dp);
    if (!x->slot_dp) return k3c_errorf_kind(K3C_ERROR_OOM, "ranks: out of memory");
    if (x->rk.layout.dp > 1) {
        x->own = calloc((size_t)x->max_requests, sizeof *x->own);
        x->own_logits = malloc(sizeof(float) * (size_t)x->max_rows * x->vocab);
        if (!x->own || !x->own_logits)
            return k3c_errorf_kind(K3C_ERROR_OOM, "ranks: rank %d: out of host memory for %d logits rows", x->rk.rank,
                                   x->max_rows);
    }
    if (x->rk.rank == 0) {
        x->sent = calloc((size_t)x->max_requests, sizeof *x->sent);
        x->held = calloc((size_t)x->max_requests, sizeof *x->held);
        x->dp_load = calloc((size_t)x->rk.layout.dp, sizeof *x->dp_load);
        x->dp_placed = calloc((size_t)x->rk.layout.dp, sizeof *x->dp_placed);
        if (!x->sent || !x->held || !x->dp_load || !x->dp_placed)
            return k3c_errorf_kind(K3C_ERROR_OOM, "ranks: out of memory");
    } else {
        x->tables = malloc(sizeof(int32_t) * (size_t)x->max_requests * x->mbr);
        x->ntab = calloc((size_t)x->max_requests, sizeof *x->ntab);
        /* page-locked where the backend has it: a pageable download on a device shared with the peers' spinning
         * mailbox kernels would wait inside the driver (docs/PARALLEL.md) */
        x->logits = k3c_engine_logits_alloc(e, x->max_rows);
        x->fr = calloc((size_t)x->max_requests, sizeof *x->fr);
        if (!x->tables || !x->ntab || !x->logits || !x->fr)
            return k3c_errorf_kind(K3C_ERROR_OOM, "ranks: rank %d: out of host memory for %d logits rows", x->rk.rank,
                                   x->max_rows);
    }
    size_t stage = sizeof(int32_t) * (x->cap > HDR_WORDS ? x->cap : HDR_WORDS);
    size_t fp = sizeof(k3c_rank_fingerprint) * (size_t)x->rk.world;
    if (fp > stage) stage = fp;
    K3C_TRY(k3c_rank_stage(&x->rk, v.be, stage));
    return k3c_rank_stage_rows(&x->rk, sizeof(float) * (size_t)x->max_rows * x->vocab);
}

static void ranks_release(k3c_engine_ranks *x) {
    if (!x) return;
    if (x->snap && x->rk.be) x->rk.be->free(x->rk.be, x->snap);
    k3c_rank_release(&x->rk);
    free(x->msg);
    free(x->hashes);
    free(x->sent);
    free(x->held);
    free(x->tables);
    free(x->ntab);
    if (x->logits) k3c_engine_logits_free(x->e, x->logits);
    free(x->fr);
    free(x->slot_dp);
    free(x->dp_load);
    free(x->dp_placed);
    free(x->own);
    free(x->own_logits);
    free(x->fol);
    if (x->ka_on >= 0) {
        pthread_mutex_destroy(&x->mu);
        pthread_cond_destroy(&x->ka_cv);
    }
    free(x);
}

void k3c_ranks_free(k3c_engine_ranks *x) { ranks_release(x); }

/* The group failed: this rank's own error `own` recorded unless another rank failed first, the
 * communicators aborted, and the message (naming the first failed rank) kept for every later call. */
static int group_failed(k3c_engine_ranks *x, const char *own) {
    if (!x->failed) {
        char mine[1024];
        snprintf(mine, sizeof mine, "%s", own);
        k3c_rank_fail(&x->rk, x->steps, mine);
        int r = x->rk.rank;
        long s = x->steps;
        char first[1024];
        snprintf(first, sizeof first, "%s", mine);
        k3c_rank_failure(&x->rk, &r, &s, first, sizeof first);
        const k3c_layout *l = &x->rk.layout;
        char what[96];
        if (l->pp == 1 && l->dp == 1) snprintf(what, sizeof what, "tensor-parallel group of %d ranks", x->rk.world);
        else
            snprintf(what, sizeof what, "group of %d ranks (tp %d x pp %d x dp %d%s)", x->rk.world, l->tp, l->pp, l->dp,
                     l->ep > 1 ? ", ep" : "");
        if (s > 0) snprintf(x->why, sizeof x->why, "%s: rank %d failed at step %ld: %s", what, r, s, first);
        else snprintf(x->why, sizeof x->why, "%s: rank %d failed at start-up: %s", what, r, first);
        x->failed = 1;
    }
    return k3c_errorf_kind(K3C_ERROR_DEVICE, "%s", x->why);
}

/* ---- rank 0 ---- */

/* Sends the header and the payload (the log, and a step when items > 0); the log is empty afterwards. */
static int send_locked(k3c_engine_ranks *x, int kind, int items, size_t step_words, int flags) {
    size_t words = x->log_words + step_words;
    x->hdr[0] = MAGIC | kind << 16;
    x->hdr[1] = (int32_t)(++x->seq);
    x->hdr[2] = (int32_t)words;
    x->hdr[3] = (int32_t)x->log_words;
    x->hdr[4] = items;
    x->hdr[5] = flags;
    x->hdr[6] = (int32_t)x->steps;
    x->hdr[7] = x->shape;
    x->shape = 0;
    int rc = k3c_rank_broadcast(&x->rk, x->hdr, sizeof x->hdr);
    if (rc == K3C_OK && words) rc = k3c_rank_broadcast(&x->rk, x->msg, words * sizeof(int32_t));
    x->log_words = 0;
    clock_gettime(CLOCK_MONOTONIC, &x->last);
    return rc;
}

int k3c_ranks_log(k3c_engine_ranks *x, k3c_rank_op op, int a, int b, const int32_t *list, int n) {
    int nargs = op == K3C_RANK_OP_CLOSE || op == K3C_RANK_OP_SNAP_RESERVE || op == K3C_RANK_OP_POISON ? 1
                : op == K3C_RANK_OP_OPEN                                                           ? 1 + n
                                                                                                   : 2;
    pthread_mutex_lock(&x->mu);
    int rc = K3C_OK;
    if (x->failed) {
        rc = k3c_errorf_kind(K3C_ERROR_DEVICE, "%s", x->why);
    } else if (x->log_words + 2 + (size_t)nargs > x->log_cap && send_locked(x, MSG_LOG, 0, 0, 0) != K3C_OK) {
        rc = group_failed(x, k3c_error_message());
    } else {
        int32_t *w = x->msg + x->log_words;
        w[0] = op;
        w[1] = nargs;
        w[2] = a;
        if (op == K3C_RANK_OP_OPEN) {
            if (n) memcpy(w + 3, list, sizeof(int32_t) * (size_t)n);
            x->sent[a] = n;
        } else if (nargs == 2) {
            w[3] = b;
        }
        if (op == K3C_RANK_OP_CLOSE) {
            x->sent[a] = 0;
            if (x->rk.layout.dp > 1) x->dp_load[x->slot_dp[a]]--;
        }
        if (op == K3C_RANK_OP_PLACE) {
            x->slot_dp[a] = b;
            x->dp_load[b]++;
            x->dp_placed[b]++;
        }
        if (op == K3C_RANK_OP_SNAP_RESERVE) x->allocs = 1;
        x->log_words += 2 + (size_t)nargs;
    }
    pthread_mutex_unlock(&x->mu);
    return rc;
}

int k3c_ranks_assign(k3c_engine_ranks *x, int slot, int dp) {
    int n = x->rk.layout.dp;
    if (n == 1) return 0;
    if (dp < 0 || dp >= n) {
        dp = 0;
        for (int d = 1; d < n; d++)
            if (x->dp_load[d] < x->dp_load[dp]) dp = d;
    }
    K3C_TRY(k3c_ranks_log(x, K3C_RANK_OP_PLACE, slot, dp, NULL, 0));
    return dp;
}

int k3c_ranks_slot_dp(const k3c_engine_ranks *x, int slot) {
    return x->rk.layout.dp > 1 && slot >= 0 && slot < x->max_requests ? x->slot_dp[slot] : 0;
}
int k3c_ranks_dp(const k3c_engine_ranks *x) { return x->rk.layout.dp; }
long k3c_ranks_placed(const k3c_engine_ranks *x, int dp) {
    return x->dp_placed && dp >= 0 && dp < x->rk.layout.dp ? x->dp_placed[dp] : 0;
}

static uint64_t hash_bytes(uint64_t h, const void *p, size_t n) {
    const unsigned char *b = p;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t w;
        memcpy(&w, b + i, 8);
        h = (h ^ w) * 0x100000001b3ull;
        h ^= h >> 29;
    }
    for (; i < n; i++) h = (h ^ b[i]) * 0x100000001b3ull;
    return h;
}

/* After a checked step: every rank's hash of its logits (and aux streams) gathered and compared. */
static int check_step(k3c_engine_ranks *x, const k3c_fwd_req *reqs, int n, const float *logits, const float *aux) {
    k3c_engine_view v;
    k3c_engine_view_get(x->e, &v);
    size_t rows = (size_t)k3c_forward_logit_rows(reqs, n);
    uint64_t h = hash_bytes(0xcbf29ce484222325ull, logits, rows * (size_t)x->vocab * sizeof(float));
    if (aux && v.num_aux) h = hash_bytes(h, aux, (size_t)v.num_aux * rows * v.m->config.hidden_size * sizeof(float));
    K3C_TRY(k3c_rank_all_gather(&x->rk, &h, x->hashes, sizeof h));
    /* the ranks of one DP rank (its TP ranks and stages) hold the same rows: compared with its first rank */
    int tp = x->rk.layout.tp, dp = x->rk.layout.dp;
    for (int q = 1; q < x->rk.world; q++) {
        int first = q / tp % dp * tp;
        if (x->hashes[q] != x->hashes[first])
            return k3c_errorf_kind(K3C_ERROR_INTERNAL, "step %ld: rank %d's logits differ from rank %d's (hash "
                                   "%016llx, rank %d's %016llx)", x->steps, q, first,
                                   (unsigned long long)x->hashes[q], first, (unsigned long long)x->hashes[first]);
    }
    x->checked++;
    return K3C_OK;
}

/* The test hook (ranks.h): fail, or stall past the timeout, at this step. */
static int fault(k3c_engine_ranks *x) {
    int f = k3c_ranks_fault_at(x->rk.rank, x->steps);
    if (f == 1) return k3c_errorf("rank %d: the test fault at step %ld", x->rk.rank, x->steps);
    if (f == 2) {
        struct timespec nap = {0, 10 * 1000000L}, t0;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        while (since(&t0) * 1000 < 1.5 * x->rk.timeout_ms) nanosleep(&nap, NULL);
    }
    return K3C_OK;
}

/* Every rank's part of a step (reqs: the whole step, in rank 0's order): its DP rank's items over its
 * stage's layers; the last stage's rows to every stage; at rank 0, every DP rank's rows in the step's order.
 * logits: rank 0's output rows, a follower's buffer. */
static int run_step(k3c_engine_ranks *x, const k3c_engine_view *v, const k3c_fwd_req *reqs, int n, float *logits,
                    float *aux, int check) {
    const k3c_layout *l = &x->rk.layout;
    const k3c_fwd_req *own = reqs;
    int nown = n;
    float *out = logits;
    if (l->dp > 1) {
        nown = 0;
        for (int i = 0; i < n; i++)
            if (x->slot_dp[reqs[i].slot] == x->rk.dp_rank) x->own[nown++] = reqs[i];
        own = x->own;
        out = x->own_logits;
    }
    K3C_TRY(fault(x));
    /* nown = 0: nothing, or with ep the dummy step that serves this rank's experts to the others */
    K3C_TRY(l->dp > 1 ? k3c_engine_dp_part(x->e, own, nown, out, aux) /* DEP: its executor, or stock */
                      : k3c_forward_step(v->fwd, v->kv, v->ks, own, nown, out, aux));
    size_t row = (size_t)x->vocab * sizeof(float), rows = (size_t)k3c_forward_logit_rows(own, nown);
    /* the hand-off in host memory: the in-memory groups as they are (CPU ranks, and CUDA ranks in one process,
     * whose forward has staged groups of its own), through a device buffer over NCCL (k3c_rank_stage_rows) */
    if (l->pp > 1 && rows) K3C_TRY(k3c_rank_pp_broadcast(&x->rk, out, rows * row));
    if (check) K3C_TRY(check_step(x, own, nown, out, aux));
    if (l->dp == 1 || x->rk.pp_stage != 0 || x->rk.tp_rank != 0) return K3C_OK;
    if (x->rk.rank != 0) return rows ? k3c_rank_send_rows(&x->rk, out, rows * row, 0) : K3C_OK;
    /* rank 0: DP rank d's rows come in its items' order; each goes back to its item's place in the step */
    for (int d = 0; d < l->dp; d++) {
        size_t at = 0, got = 0;
        for (int i = 0; i < n; i++)
            if (x->slot_dp[reqs[i].slot] == d) got += (size_t)k3c_forward_logit_rows(&reqs[i], 1);
        if (d > 0 && got) K3C_TRY(k3c_rank_recv_rows(&x->rk, x->own_logits, got * row, d * l->tp));
        const float *src = x->own_logits;
        for (int i = 0; i < n; i++) {
            size_t k = (size_t)k3c_forward_logit_rows(&reqs[i], 1);
            if (x->slot_dp[reqs[i].slot] == d && k) {
                memcpy((char *)logits + at * row, src, k * row);
                src += k * x->vocab;
            }
            at += k;
        }
    }
    return K3C_OK;
}

int k3c_ranks_step(k3c_engine_ranks *x, const k3c_plan *exec, const k3c_fwd_req *reqs, const int *nblocks, int n,
                   float *logits, float *aux) {
    pthread_mutex_lock(&x->mu);
    if (x->failed) {
        pthread_mutex_unlock(&x->mu);
        return k3c_errorf_kind(K3C_ERROR_DEVICE, "%s", x->why);
    }
    /* the step after the log */
    int32_t *w = x->msg + x->log_words;
    size_t k = 0;
    for (int i = 0; i < n; i++) {
        const k3c_fwd_req *q = &reqs[i];
        /* the blocks this step's rows reach, as far as the followers lack them: a request's table on rank 0 may
         * hold more (a failed step's, or a verify's past a commit that kept fewer), which later steps send; so
         * a step never carries more than its rows' blocks (the message's bound, attach) */
        int need = (q->pos + q->n + x->block_size - 1) / x->block_size, sent = x->sent[q->slot];
        int held = nblocks[i] < need ? nblocks[i] : need;
        if (held < sent) held = sent;
        int fresh = held - sent;
        x->held[i] = held;
        w[k++] = q->slot;
        w[k++] = q->n;
        w[k++] = q->pos;
        w[k++] = q->verify;
        w[k++] = (int32_t)q->logits;
        w[k++] = held;
        w[k++] = fresh;
        memcpy(w + k, q->block_table + sent, sizeof(int32_t) * (size_t)fresh);
        k += (size_t)fresh;
        memcpy(w + k, q->ids, sizeof(int32_t) * (size_t)q->n);
        k += (size_t)q->n;
    }
    x->steps++;
    if (exec) x->shape = exec->rows << 8 | exec->q;
    /* a follower freeing or allocating device memory (a KDA snapshot reserve) waits for the whole device inside
     * the driver: on a device shared with rank 0, not while rank 0's mailbox kernels spin, so the executor's
     * step starts after every rank has applied the log */
    int sync = exec && x->allocs;
    int flags = (x->check ? FLAG_CHECK : 0) | (exec ? FLAG_EXEC : 0) | (sync ? FLAG_SYNC : 0);
    int rc = send_locked(x, MSG_STEP, n, k, flags);
    if (rc == K3C_OK && sync) rc = x->rk.world_comm->barrier(x->rk.world_comm);
    if (sync) x->allocs = 0;
    if (rc == K3C_OK)
        for (int i = 0; i < n; i++) x->sent[reqs[i].slot] = x->held[i];
    k3c_engine_view v;
    k3c_engine_view_get(x->e, &v);
    if (rc == K3C_OK && exec) { /* the executor runs TP-only layouts (pp 1, dp 1: build_executor) */
        rc = k3c_engine_exec_step(x->e, exec, reqs, n, logits, aux);
        if (rc == K3C_OK && x->check) rc = check_step(x, reqs, n, logits, aux);
    } else if (rc == K3C_OK) {
        rc = run_step(x, &v, reqs, n, logits, aux, x->check);
    }
    if (rc != K3C_OK) rc = group_failed(x, k3c_error_message());
    pthread_mutex_unlock(&x->mu);
    return rc;
}

/* Every rank's outcome of a capture (1 captured), gathered: 1 when all captured. */
static int capture_agreed(k3c_engine_ranks *x, int mine, int *all_ok) {
    int32_t me = mine, *all = malloc(sizeof(int32_t) * (size_t)x->rk.world);
    if (!all) return k3c_errorf_kind(K3C_ERROR_OOM, "ranks: out of memory");
    int rc = k3c_rank_all_gather(&x->rk, &me, all, sizeof me);
    *all_ok = 1;
    for (int q = 0; q < x->rk.world && rc == K3C_OK; q++)
        if (!all[q]) *all_ok = 0;
    free(all);
    return rc;
}

int k3c_ranks_capture(k3c_engine_ranks *x, int rows, int q) {
    pthread_mutex_lock(&x->mu);
    if (x->failed) {
        pthread_mutex_unlock(&x->mu);
        return k3c_errorf_kind(K3C_ERROR_DEVICE, "%s", x->why);
    }
    x->shape = rows << 8 | q;
    int rc = send_locked(x, MSG_CAPTURE, 0, 0, 0), all_ok = 0;
    char mine[512] = "";
    if (rc == K3C_OK) {
        int ok = k3c_engine_exec_capture(x->e, rows, q) == K3C_OK;
        if (!ok) snprintf(mine, sizeof mine, "%s", k3c_error_message());
        rc = capture_agreed(x, ok, &all_ok);
    }
    if (rc != K3C_OK) rc = group_failed(x, k3c_error_message());
    else if (!all_ok)
        rc = k3c_errorf("capturing the step shape (%d rows, q %d) failed on %s", rows, q,
                        *mine ? mine : "another rank (its log says why)");
    pthread_mutex_unlock(&x->mu);
    return rc;
}

/* Keeps the followers' waits (each at most the group's timeout) short of the timeout while rank 0 is idle. */
static void *keepalive_main(void *arg) {
    k3c_engine_ranks *x = arg;
    /* a quarter of the timeout, at most 10 s (NCCL's bounded waits are 60 s whatever the timeout) */
    double period = x->rk.timeout_ms / 4000.0;
    if (period > 10) period = 10;
    if (period < 0.01) period = 0.01;
    pthread_mutex_lock(&x->mu);
    while (!x->ka_stop) {
        struct timespec dl;
        clock_gettime(CLOCK_REALTIME, &dl);
        long ns = (long)(period * 1e9);
        dl.tv_sec += ns / 1000000000L;
        dl.tv_nsec += ns % 1000000000L;
        if (dl.tv_nsec >= 1000000000L) dl.tv_sec++, dl.tv_nsec -= 1000000000L;
        pthread_cond_timedwait(&x->ka_cv, &x->mu, &dl);
        if (x->ka_stop || x->failed || since(&x->last) < period) continue;
        if (send_locked(x, MSG_LOG, 0, 0, 0) != K3C_OK) group_failed(x, k3c_error_message());
    }
    pthread_mutex_unlock(&x->mu);
    return NULL;
}

void k3c_ranks_stop(k3c_engine_ranks *x) {
    if (!x || x->rk.rank != 0 || x->ka_on < 0) return; /* ka_on < 0: rank 0 never got as far as a message */
    if (x->ka_on > 0) {
        pthread_mutex_lock(&x->mu);
        x->ka_stop = 1;
        pthread_cond_signal(&x->ka_cv);
        pthread_mutex_unlock(&x->mu);
        pthread_join(x->ka, NULL);
        x->ka_on = 0;
    }
    pthread_mutex_lock(&x->mu);
    if (!x->failed && send_locked(x, MSG_STOP, 0, 0, 0) != K3C_OK) group_failed(x, k3c_error_message());
    pthread_mutex_unlock(&x->mu);
    for (int i = 0; i < x->nfol; i++)
        if (x->fol[i].started) pthread_join(x->fol[i].thread, NULL);
    x->nfol = 0;
}

/* ---- a follower ---- */

/* The payload's words, bounds-checked: a malformed message is an internal error, never a wild read. */
typedef struct cursor {
    const int32_t *w;
    size_t n, at;
    int bad;
} cursor;

static int32_t next(cursor *c) {
    if (c->at >= c->n) {
        c->bad = 1;
        return 0;
    }
    return c->w[c->at++];
}

static const int32_t *take(cursor *c, int32_t n) {
    if (n < 0 || (size_t)n > c->n - c->at) {
        c->bad = 1;
        return NULL;
    }
    const int32_t *p = c->w + c->at;
    c->at += (size_t)n;
    return p;
}

static int malformed(k3c_engine_ranks *x, const char *what) {
    return k3c_errorf_kind(K3C_ERROR_INTERNAL, "rank %d: message %ld from rank 0 is malformed: %s", x->rk.rank,
                           x->seq, what);
}

static int apply_log(k3c_engine_ranks *x, const k3c_engine_view *v, cursor *c) {
    while (c->at < c->n && !c->bad) {
        int32_t op = next(c), nargs = next(c);
        const int32_t *a = take(c, nargs);
        if (c->bad || nargs < 1) return malformed(x, "a log entry past the log");
        int slot = a[0];
        int slot_op = op != K3C_RANK_OP_SNAP_RESERVE && op != K3C_RANK_OP_POISON;
        if (slot_op && (slot < 0 || slot >= x->max_requests)) return malformed(x, "a slot out of range");
        switch (op) {
        case K3C_RANK_OP_OPEN:
            if (nargs - 1 > x->mbr) return malformed(x, "a prefix longer than a block table");
            for (int i = 1; i < nargs; i++)
                if (a[i] < 0 || a[i] >= x->num_blocks) return malformed(x, "a block out of range");
            memcpy(x->tables + (size_t)slot * x->mbr, a + 1, sizeof(int32_t) * (size_t)(nargs - 1));
            x->ntab[slot] = nargs - 1;
            k3c_kda_slots_reset(v->ks, v->be, slot);
            break;
        case K3C_RANK_OP_CLOSE: x->ntab[slot] = 0; break;
        case K3C_RANK_OP_COMMIT:
            if (nargs != 2) return malformed(x, "a commit");
            if (k3c_ranks_slot_dp(x, slot) == x->rk.dp_rank) K3C_TRY(k3c_forward_commit(v->fwd, v->ks, slot, a[1]));
            break;
        case K3C_RANK_OP_PLACE:
            if (nargs != 2 || a[1] < 0 || a[1] >= x->rk.layout.dp) return malformed(x, "a DP rank out of range");
            x->slot_dp[slot] = a[1];
            break;
        case K3C_RANK_OP_SNAP_RESERVE:
            if (x->snap) v->be->free(v->be, x->snap);
            x->snap = NULL;
            x->snap_count = 0;
            x->snap_bytes = k3c_kda_slots_snapshot_bytes(v->ks);
            if (slot > 0 && x->snap_bytes) {
                x->snap = v->be->alloc(v->be, x->snap_bytes * (size_t)slot);
                if (!x->snap)
                    return k3c_error_context("rank %d: %d KDA snapshots of %zu bytes", x->rk.rank, slot, x->snap_bytes);
                x->snap_count = slot;
            }
            break;
        case K3C_RANK_OP_SNAP_SAVE:
        case K3C_RANK_OP_SNAP_RESTORE:
            if (nargs != 2 || a[1] < 0 || a[1] >= x->snap_count) return malformed(x, "a snapshot out of range");
            if (op == K3C_RANK_OP_SNAP_SAVE) k3c_kda_slots_save(v->ks, v->be, slot, (char *)x->snap + x->snap_bytes * (size_t)a[1]);
            else k3c_kda_slots_restore(v->ks, v->be, slot, (char *)x->snap + x->snap_bytes * (size_t)a[1]);
            break;
        case K3C_RANK_OP_POISON: {
            if (slot < 0 || slot >= x->num_blocks) return malformed(x, "a block out of range");
            k3c_kv_cache *kv = v->kv; /* as k3c_kv_cache_give poisons a freed block on rank 0 */
            size_t bb = (size_t)kv->block_size * kv->latent * v->be->kv_elem_bytes;
            for (int l = 0; l < kv->num_layers; l++)
                if (kv->layer[l]) v->be->fill_bytes(v->be, (char *)kv->layer[l] + bb * (size_t)slot, 0xff, bb);
            break;
        }
        default: return malformed(x, "an unknown log op");
        }
    }
    return c->bad ? malformed(x, "a log entry past the log") : K3C_OK;
}

static int follow_step(k3c_engine_ranks *x, const k3c_engine_view *v, cursor *c, int items, int flags) {
    if (items < 1 || items > x->max_requests) return malformed(x, "the step's item count");
    int rows = 0;
    for (int i = 0; i < items; i++) {
        int slot = next(c), n = next(c), pos = next(c), verify = next(c), mode = next(c), held = next(c),
            fresh = next(c);
        if (c->bad || slot < 0 || slot >= x->max_requests || n < 1 || n > x->max_rows || pos < 0 ||
            pos + n > x->max_context || held > x->mbr || fresh < 0 || x->ntab[slot] + fresh != held)
            return malformed(x, "a step item");
        const int32_t *blocks = take(c, fresh), *ids = take(c, n);
        if (c->bad) return malformed(x, "a step item past the message");
        int32_t *table = x->tables + (size_t)slot * x->mbr;
        for (int b = 0; b < fresh; b++) {
            if (blocks[b] < 0 || blocks[b] >= x->num_blocks) return malformed(x, "a block out of range");
            table[x->ntab[slot] + b] = blocks[b];
        }
        x->ntab[slot] = held;
        x->fr[i] = (k3c_fwd_req){.ids = ids, .n = n, .pos = pos, .block_table = table, .slot = slot,
                                 .verify = verify, .logits = (k3c_logits_mode)mode};
        rows += verify || mode == K3C_LOGITS_ALL ? n : mode == K3C_LOGITS_LAST;
    }
    if (c->at != c->n) return malformed(x, "words after the last step item");
    if (rows > x->max_rows) return malformed(x, "more logits rows than max_rows");
    if (flags & FLAG_SYNC) K3C_TRY(x->rk.world_comm->barrier(x->rk.world_comm));
    if (flags & FLAG_EXEC) {
        K3C_TRY(fault(x));
        int q = x->hdr[7] & 0xff;
        k3c_plan p = {.route = q > 1 ? K3C_ROUTE_VERIFY : K3C_ROUTE_DECODE, .rows = x->hdr[7] >> 8, .q = q};
        if (p.rows != rows) return malformed(x, "an executor step's shape");
        K3C_TRY(k3c_engine_exec_step(x->e, &p, x->fr, items, x->logits, v->aux));
        if (flags & FLAG_CHECK) K3C_TRY(check_step(x, x->fr, items, x->logits, v->aux));
        return K3C_OK;
    }
    return run_step(x, v, x->fr, items, x->logits, v->aux, flags & FLAG_CHECK);
}

int k3c_ranks_follow(k3c_engine_ranks *x) {
    if (x->rk.rank == 0) return k3c_errorf("engine follow: rank 0 leads; only the other ranks follow");
    k3c_engine_view v;
    k3c_engine_view_get(x->e, &v);
    for (;;) {
        int rc = k3c_rank_broadcast(&x->rk, x->hdr, sizeof x->hdr);
        int kind = x->hdr[0] >> 16;
        if (rc == K3C_OK && ((x->hdr[0] & 0xffff) != MAGIC || x->hdr[1] != (int32_t)(x->seq + 1) || x->hdr[2] < 0 ||
                             (size_t)x->hdr[2] > x->cap || x->hdr[3] < 0 || x->hdr[3] > x->hdr[2] ||
                             kind < MSG_LOG || kind > MSG_CAPTURE))
            rc = malformed(x, "its header (a different k3c build, or a lost message)");
        if (rc == K3C_OK) x->seq++;
        if (rc == K3C_OK && x->hdr[2] > 0) rc = k3c_rank_broadcast(&x->rk, x->msg, sizeof(int32_t) * (size_t)x->hdr[2]);
        if (rc == K3C_OK) {
            cursor log = {x->msg, (size_t)x->hdr[3], 0, 0};
            rc = apply_log(x, &v, &log);
        }
        if (rc == K3C_OK && kind == MSG_STOP) return K3C_OK;
        if (rc == K3C_OK && kind == MSG_CAPTURE) { /* a failure here is the shape's, not the group's */
            int ok = k3c_engine_exec_capture(x->e, x->hdr[7] >> 8, x->hdr[7] & 0xff) == K3C_OK, all_ok;
            if (!ok) {
                k3c_log(K3C_LOG_WARN, "rank %d: capturing the step shape (%d rows, q %d) failed: %s", x->rk.rank,
                        x->hdr[7] >> 8, x->hdr[7] & 0xff, k3c_error_message());
                k3c_error_clear();
            }
            rc = capture_agreed(x, ok, &all_ok);
        }
        if (rc == K3C_OK && kind == MSG_STEP) {
            x->steps++;
            cursor step = {x->msg + x->hdr[3], (size_t)(x->hdr[2] - x->hdr[3]), 0, 0};
            rc = follow_step(x, &v, &step, x->hdr[4], x->hdr[5]);
        }
        if (rc != K3C_OK) return group_failed(x, k3c_error_message());
    }
}

static pthread_mutex_t hook_mu = PTHREAD_MUTEX_INITIALIZER;
static k3c_ranks_exec_hook exec_hook;
static void *exec_hook_user;

void k3c_ranks_test_executor(k3c_ranks_exec_hook make, void *user) {
    pthread_mutex_lock(&hook_mu);
    exec_hook = make;
    exec_hook_user = user;
    pthread_mutex_unlock(&hook_mu);
}

const k3c_decode_executor *k3c_ranks_test_executor_make(k3c_engine *e) {
    pthread_mutex_lock(&hook_mu);
    k3c_ranks_exec_hook make = exec_hook;
    void *user = exec_hook_user;
    pthread_mutex_unlock(&hook_mu);
    return make ? make(e, user) : NULL;
}

/* ---- creation ---- */

/* One rank's engine (its shard, backend, forward and caches), then the start-up check with every other
 * rank. rk is moved into the rank's state. On failure the rank has told the group (its peers' waits end) and
 * the message names the rank that failed first. */
static int rank_start(k3c_model *m, const k3c_engine_options *o, int nbg, k3c_rank *rk, k3c_engine **out) {
    *out = NULL;
    k3c_engine_ranks *x = calloc(1, sizeof *x);
    if (!x) {
        k3c_rank_fail(rk, 0, "out of memory");
        k3c_rank_release(rk);
        return k3c_errorf_kind(K3C_ERROR_OOM, "ranks: out of memory");
    }
    x->rk = *rk;
    memset(rk, 0, sizeof *rk);
    x->ka_on = -1; /* no mutex yet */
    k3c_engine *e = NULL;
    int rc = k3c_rank_split(&x->rk);
    if (rc == K3C_OK) rc = k3c_engine_build(m, o, nbg, x, &e);
    if (rc == K3C_OK) rc = attach(x, e);
    if (rc == K3C_OK && x->rk.rank == 0) {
        pthread_mutex_init(&x->mu, NULL);
        pthread_cond_init(&x->ka_cv, NULL);
        x->ka_on = 0;
        clock_gettime(CLOCK_MONOTONIC, &x->last);
    }
    int differ = 0;
    if (rc == K3C_OK) {
        k3c_rank_fingerprint fp;
        k3c_rank_fingerprint_fill(&fp, &m->config, (uint64_t)m->weight_bytes, o, &x->rk);
        rc = k3c_rank_fingerprint_check(&x->rk, &fp, &differ);
    }
    if (rc != K3C_OK) {
        /* ranks started differently: every rank has the same message, no rank failed first */
        char why[2048];
        snprintf(why, sizeof why, "%s", k3c_error_message());
        group_failed(x, why);
        if (!differ) snprintf(why, sizeof why, "%s", x->why);
        if (e) k3c_engine_free(e); /* frees x with it */
        else ranks_release(x);
        return k3c_errorf_kind(K3C_ERROR_DEVICE, "engine: %s", why);
    }
    *out = e;
    return K3C_OK;
}

static void *follower_main(void *arg) {
    follower *f = arg;
    k3c_engine *e = NULL;
    if (rank_start(f->m, &f->o, f->num_blocks_given, &f->rank, &e) != K3C_OK) return NULL;
    k3c_engine_follow(e); /* its failure is in the group's record, which rank 0 reports */
    k3c_engine_free(e);
    return NULL;
}

static int online_cores(void) {
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}

int k3c_engine_ranks_create(k3c_model *m, const k3c_engine_options *o, const k3c_layout *l, int world,
                            int num_blocks_given, k3c_engine **out) {
    *out = NULL;
    int timeout = o->rank_timeout_ms > 0 ? o->rank_timeout_ms : 60000;
    k3c_engine *e = NULL;
    if (o->world_size > 0) { /* one process per rank: this one is o->rank */
        if (strcmp(o->device, "cuda") != 0)
            return k3c_errorf("engine: world_size %d: one process per rank runs over NCCL on device cuda; CPU ranks "
                              "run in one process (tp without world_size)", o->world_size);
        k3c_rank rk;
        K3C_TRY(k3c_ranks_nccl(l, o->rank, o->rendezvous, timeout, &rk));
        K3C_TRY(rank_start(m, o, num_blocks_given, &rk, &e));
    } else {
        int cuda = !strcmp(o->device, "cuda");
        if (!cuda && strcmp(o->device, "cpu") != 0)
            return k3c_errorf("engine: tp %d on device %s: ranks in one process run on device cpu or cuda", l->tp,
                              o->device);
        k3c_rank *ranks = calloc((size_t)world, sizeof *ranks);
        follower *fol = calloc((size_t)world, sizeof *fol);
        if (!ranks || !fol) {
            free(ranks), free(fol);
            return k3c_errorf_kind(K3C_ERROR_OOM, "engine: out of memory for %d ranks", world);
        }
        if (k3c_ranks_threads(l, timeout, ranks) != K3C_OK) {
            free(ranks), free(fol);
            return K3C_ERR;
        }
        /* on cuda the ranks' device collectives join these once each rank's backend exists (the TP groups'; with
         * pp or dp > 1 the staged world's, split into the forward's groups) */
        if (cuda && k3c_ranks_device_groups(ranks, world) != K3C_OK) {
            for (int r = 0; r < world; r++) k3c_rank_release(&ranks[r]);
            free(ranks), free(fol);
            return K3C_ERR;
        }
        /* each rank's backend gets its share of the cores */
        k3c_engine_options ro = *o;
        int cores = o->threads > 0 ? o->threads : online_cores();
        ro.threads = cores / world > 0 ? cores / world : 1;
        for (int r = 1; r < world; r++) {
            fol[r] = (follower){.m = m, .o = ro, .num_blocks_given = num_blocks_given, .rank = ranks[r]};
            fol[r].started = pthread_create(&fol[r].thread, NULL, follower_main, &fol[r]) == 0;
            if (!fol[r].started) {
                k3c_rank_fail(&fol[r].rank, 0, "cannot start its thread");
                k3c_rank_release(&fol[r].rank);
            }
        }
        int rc = rank_start(m, &ro, num_blocks_given, &ranks[0], &e);
        free(ranks);
        if (rc != K3C_OK) {
            for (int r = 1; r < world; r++)
                if (fol[r].started) pthread_join(fol[r].thread, NULL);
            free(fol);
            return K3C_ERR;
        }
        /* rank 0's state owns the followers from here (k3c_ranks_stop joins them); fol[0] is unused */
        k3c_engine_ranks *x = k3c_engine_xr(e);
        x->fol = fol;
        x->nfol = world;
    }
    k3c_engine_ranks *x = k3c_engine_xr(e);
    /* K3C_CHECK_RANKS=1, a diagnostic for the commands (tools/gpu-multi.sh) as K3C_CUDA_PROFILE is: rank 0 has
     * every step checked (check_step: each rank's logits hash against rank 0's), as k3c_ranks_set_check does */
    const char *chk = getenv("K3C_CHECK_RANKS");
    if (x->rk.rank == 0 && chk && atoi(chk) > 0) x->check = 1;
    if (x->rk.rank == 0) {
        x->ka_on = pthread_create(&x->ka, NULL, keepalive_main, x) == 0;
        if (!x->ka_on) {
            k3c_engine_free(e);
            return k3c_errorf("engine: cannot start the ranks' keep-alive thread: %s", strerror(errno));
        }
    }
    *out = e;
    return K3C_OK;
}
