/* Tensor parallelism on CPU ranks: the in-memory communicator (comm/threads.c) against sums written out in
 * rank order, and the stock forward of N rank shards (model/shard.h), one thread per rank, against the whole
 * model at world size 1: every rank bitwise the same logits; within 1e-5 of world size 1 with f32 activations
 * (exact_f32: the only difference is where the row-parallel sums split) and within the bf16 tolerance with
 * bf16 ones; greedy streams equal in f32.
 *
 * Which paths are bitwise at world size 1 too: the embedding (other ranks add -0.0, which is exact) and the
 * logits given the final hidden state (each rank's rows of the LM head are whole rows, gathered). The
 * row-parallel products (o_proj, the MLPs' down, the routed experts' down) are not: world size 1 accumulates
 * a row over all K columns in one order, a TP rank over its K / tp columns, then the ranks are summed. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "cache/kda_slots.h"
#include "cache/kv_cache.h"
#include "comm/comm.h"
#include "model/model.h"
#include "model/presets.h"
#include "model/shard.h"
#include "model/synth.h"
#include "stock/forward.h"
#include "test.h"
#include "util/error.h"
#include "util/rng.h"
#include "tp_config.h"

/* ---- the communicator ---- */

typedef struct ar_job {
    k3c_comm *c;
    int rounds;
    size_t *sizes;     /* [rounds] floats per call (changing between calls) */
    float **in;        /* [rounds] this rank's inputs */
    float **out;       /* [rounds] results */
    int rc;
} ar_job;

static void *ar_thread(void *p) {
    ar_job *j = p;
    for (int r = 0; r < j->rounds && j->rc == K3C_OK; r++) {
        memcpy(j->out[r], j->in[r], j->sizes[r] * sizeof(float));
        j->rc = j->c->all_reduce_f32(j->c, j->out[r], j->sizes[r]);
    }
    return NULL;
}

static float rand_value(k3c_rng *g) {
    uint64_t u = k3c_rng_next(g);
    switch (u % 8) {
    case 0: return 0.0f;
    case 1: return -0.0f;
    case 2: return (float)((double)(u >> 11) * 0x1p-53 * 1e30); /* large: the order decides what is lost */
    case 3: return -(float)((double)(u >> 11) * 0x1p-53 * 1e-30);
    default: return (float)((double)(u >> 11) * 0x1p-53 * 2.0 - 1.0);
    }
}

/* Many calls in a row, sizes changing between them (1 .. 5000, not multiples of the rank count), inputs with
 * +-0, huge and tiny values: every rank ends with bitwise ((x_0 + x_1) + x_2) + ... of each element. */
TEST(comm_threads_all_reduce_rank_order) {
    k3c_rng g;
    k3c_rng_seed(&g, test_seed());
    const int rounds = 40;
    for (int size = 1; size <= 8; size++) {
        k3c_comm_group *grp;
        CHECK_OK(k3c_comm_group_create(size, 10000, &grp));
        ar_job jobs[8];
        pthread_t th[8];
        size_t sizes[40];
        for (int r = 0; r < rounds; r++) sizes[r] = 1 + k3c_rng_next(&g) % (r % 5 == 0 ? 7 : 5000);
        for (int k = 0; k < size; k++) {
            k3c_comm *c;
            CHECK_OK(k3c_comm_group_join(grp, k, &c));
            jobs[k] = (ar_job){c, rounds, sizes, calloc(rounds, sizeof(float *)), calloc(rounds, sizeof(float *)), 0};
            for (int r = 0; r < rounds; r++) {
                jobs[k].in[r] = malloc(sizes[r] * sizeof(float));
                jobs[k].out[r] = malloc(sizes[r] * sizeof(float));
                for (size_t i = 0; i < sizes[r]; i++) jobs[k].in[r][i] = rand_value(&g);
            }
        }
        for (int k = 0; k < size; k++) pthread_create(&th[k], NULL, ar_thread, &jobs[k]);
        for (int k = 0; k < size; k++) pthread_join(th[k], NULL);
        int bad = 0;
        for (int k = 0; k < size; k++) bad |= jobs[k].rc != K3C_OK;
        for (int r = 0; r < rounds && !bad; r++)
            for (size_t i = 0; i < sizes[r]; i++) {
                float want = jobs[0].in[r][i];
                for (int k = 1; k < size; k++) want += jobs[k].in[r][i];
                for (int k = 0; k < size; k++)
                    if (memcmp(&jobs[k].out[r][i], &want, sizeof want)) bad = 1;
            }
        for (int k = 0; k < size; k++) {
            for (int r = 0; r < rounds; r++) free(jobs[k].in[r]), free(jobs[k].out[r]);
            free(jobs[k].in), free(jobs[k].out);
            jobs[k].c->free(jobs[k].c);
        }
        CHECKF(!bad, "size %d: a rank's sum differs from the rank-order sum (or a call failed: %s)", size,
               k3c_error_message());
    }
}

typedef struct misc_job {
    k3c_comm *c;
    int mode; /* 0 gather + broadcast; 1 mismatched sizes; 2 rank 0 never calls; 3 rank 0 aborts */
    unsigned char got[8 * 16];
    int rc1, rc2;
} misc_job;

static void *misc_thread(void *p) {
    misc_job *j = p;
    k3c_comm *c = j->c;
    unsigned char mine[16];
    for (int i = 0; i < 16; i++) mine[i] = (unsigned char)(c->rank * 16 + i);
    float x[4] = {1, 2, 3, 4};
    switch (j->mode) {
    case 0:
        j->rc1 = c->all_gather(c, mine, j->got, 16);
        memcpy(j->got + 16 * c->size, mine, 16);
        j->rc2 = c->broadcast(c, j->got + 16 * c->size, 16, c->size - 1);
        break;
    case 1: j->rc1 = c->all_reduce_f32(c, x, c->rank == 1 ? 3 : 4); break;
    case 2:
        if (c->rank != 0) j->rc1 = c->all_reduce_f32(c, x, 4);
        else j->rc1 = K3C_ERR;
        break;
    case 3:
        if (c->rank == 0) {
            c->abort(c);
            j->rc1 = K3C_ERR;
        } else {
            j->rc1 = c->barrier(c);
        }
        j->rc2 = c->barrier(c); /* a failed group fails every later call at once */
        break;
    }
    return NULL;
}

static int run_misc(int size, int mode, int timeout_ms, misc_job *jobs) {
    k3c_comm_group *grp;
    K3C_TRY(k3c_comm_group_create(size, timeout_ms, &grp));
    pthread_t th[8];
    for (int k = 0; k < size; k++) {
        memset(&jobs[k], 0, sizeof jobs[k]);
        jobs[k].mode = mode;
        K3C_TRY(k3c_comm_group_join(grp, k, &jobs[k].c));
    }
    for (int k = 0; k < size; k++) pthread_create(&th[k], NULL, misc_thread, &jobs[k]);
    for (int k = 0; k < size; k++) pthread_join(th[k], NULL);
    for (int k = 0; k < size; k++) jobs[k].c->free(jobs[k].c);
    return K3C_OK;
}

TEST(comm_threads_gather_broadcast_and_failures) {
    misc_job j[8];
    CHECK_OK(run_misc(5, 0, 10000, j));
    for (int k = 0; k < 5; k++) {
        CHECK(j[k].rc1 == K3C_OK && j[k].rc2 == K3C_OK);
        for (int i = 0; i < 5 * 16; i++) CHECK(j[k].got[i] == i);
        for (int i = 0; i < 16; i++) CHECK(j[k].got[5 * 16 + i] == 4 * 16 + i); /* rank 4's bytes */
    }
    CHECK_OK(run_misc(3, 1, 10000, j)); /* sizes differ: every rank fails, none hangs */
    for (int k = 0; k < 3; k++) CHECK(j[k].rc1 == K3C_ERR);
    CHECK_OK(run_misc(4, 2, 300, j)); /* rank 0 gone: the others time out (300 ms) */
    for (int k = 1; k < 4; k++) CHECK(j[k].rc1 == K3C_ERR);
    CHECK_OK(run_misc(4, 3, 60000, j)); /* an abort ends the others' waits at once, not after 60 s */
    for (int k = 0; k < 4; k++) CHECK(j[k].rc1 == K3C_ERR && j[k].rc2 == K3C_ERR);
    k3c_comm *s = k3c_comm_self();
    float x[3] = {1, -0.0f, 2};
    unsigned char a[4] = {1, 2, 3, 4}, b[4] = {0};
    CHECK(s->size == 1 && s->rank == 0 && s->all_reduce_f32(s, x, 3) == K3C_OK && x[0] == 1 && signbit(x[1]));
    CHECK(s->all_gather(s, a, b, 4) == K3C_OK && memcmp(a, b, 4) == 0 && s->barrier(s) == K3C_OK);
    CHECK(s->broadcast(s, a, 4, 1) == K3C_ERR);
}

/* ---- the sharded forward ---- */


typedef struct rank_run {
    const k3c_model *m; /* the rank's model (a shard, or the whole model at world size 1) */
    k3c_comm *comm;     /* NULL at world size 1 */
    int exact;
    const int32_t *prompt;
    int n_prompt, n_new;
    float *prompt_logits; /* [n_prompt, V]: every prompt row */
    float *step_logits;   /* [n_new, V]: the logits each greedy token was taken from */
    int32_t *stream;      /* [n_new] */
    int rc;
    char err[512];
} rank_run;

static int argmax(const float *x, int n) {
    int b = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[b]) b = i;
    return b;
}

static int run_rank(rank_run *r) {
    const k3c_config *c = &r->m->config;
    int V = c->vocab_size * (r->m->tp_size > 1 ? r->m->tp_size : 1), bs = 16, ctx = r->n_prompt + r->n_new;
    k3c_backend *be = k3c_backend_cpu_create(1);
    if (!be) return K3C_ERR;
    k3c_backend_cpu_set_exact(be, r->exact);
    k3c_forward_options o = {.max_rows = r->n_prompt, .max_segs = 2, .max_context = ctx + 1, .block_size = bs,
                             .tp = r->comm};
    k3c_forward *f = NULL;
    k3c_kv_cache kv = {0};
    k3c_kda_slots ks = {0};
    int32_t table[64];
    int rc = k3c_forward_create(be, r->m, &o, &f);
    if (rc == K3C_OK) rc = k3c_kv_cache_init(&kv, be, c, (ctx + bs - 1) / bs + 1, bs);
    if (rc == K3C_OK) rc = k3c_kda_slots_init(&ks, be, c, 1, 1, 2);
    if (rc == K3C_OK) {
        k3c_kda_slots_reset(&ks, be, 0);
        for (int i = 0; i < (ctx + bs - 1) / bs; i++) table[i] = k3c_kv_cache_take(&kv);
        k3c_fwd_req q = {.ids = r->prompt, .n = r->n_prompt, .pos = 0, .block_table = table, .slot = 0,
                         .logits = K3C_LOGITS_ALL};
        rc = k3c_forward_step(f, &kv, &ks, &q, 1, r->prompt_logits, NULL);
        int32_t tok = rc == K3C_OK ? argmax(r->prompt_logits + (size_t)(r->n_prompt - 1) * V, V) : 0;
        for (int s = 0; s < r->n_new && rc == K3C_OK; s++) {
            r->stream[s] = tok;
            q = (k3c_fwd_req){.ids = &tok, .n = 1, .pos = r->n_prompt + s, .block_table = table, .slot = 0,
                              .logits = K3C_LOGITS_LAST};
            rc = k3c_forward_step(f, &kv, &ks, &q, 1, r->step_logits + (size_t)s * V, NULL);
            tok = argmax(r->step_logits + (size_t)s * V, V);
        }
    }
    if (rc != K3C_OK) snprintf(r->err, sizeof r->err, "%s", k3c_error_message());
    k3c_kda_slots_release(&ks, be);
    k3c_kv_cache_release(&kv, be);
    k3c_forward_free(f);
    be->destroy(be);
    return rc;
}

static void *rank_thread(void *p) {
    rank_run *r = p;
    r->rc = run_rank(r);
    return NULL;
}

static void free_run(rank_run *r) {
    free(r->prompt_logits);
    free(r->step_logits);
    free(r->stream);
}

static int alloc_run(rank_run *r, int V) {
    r->prompt_logits = malloc((size_t)r->n_prompt * V * sizeof(float));
    r->step_logits = malloc((size_t)r->n_new * V * sizeof(float));
    r->stream = malloc((size_t)r->n_new * sizeof(int32_t));
    if (!r->prompt_logits || !r->step_logits || !r->stream) return K3C_ERR;
    poison_f32(r->prompt_logits, (size_t)r->n_prompt * V);
    poison_f32(r->step_logits, (size_t)r->n_new * V);
    return K3C_OK;
}

/* Largest relative L2 distance of a row between a and b (NaN: inf). */
static double worst_row(const float *a, const float *b, int rows, int V) {
    double w = 0;
    for (int i = 0; i < rows; i++) {
        double d = rel_l2_f32f32(a + (size_t)i * V, b + (size_t)i * V, (size_t)V);
        if (!(d <= w)) w = d;
    }
    return w;
}

/* The whole model at world size 1 against tp ranks of its shards, on a 70-token prompt (one whole chunked
 * KDA block of 64 plus recurrent rows) and 8 greedy decode steps. */
/* exact: f32 activations, tol the bound on every row's distance to world size 1. Else bf16 activations,
 * compared as bf16 rounding noise: world size 1 in f32 is the function, and the TP ranks' bf16 logits must lie
 * no farther from it than tol times world size 1's own bf16 logits do (worst row), and no farther from those
 * than tol times that distance either. */
static void check_tp(int kimi_linear, int exact, double tol) {
    k3c_config c;
    CHECK_OK(tp_config(kimi_linear, !exact, &c));
    char dir[4200];
    snprintf(dir, sizeof dir, "%s/tp_%s", test_tmpdir(), kimi_linear ? "kimi_linear" : "k3");
    uint64_t seed = test_seed();
    int rc = k3c_synth_write(&c, NULL, seed, dir);
    int V = c.vocab_size;
    k3c_config_free(&c);
    CHECK_OK(rc);
    k3c_model *m;
    CHECK_OK(k3c_model_load(dir, &m));
    enum { NP = 70, NN = 8 };
    int32_t prompt[NP];
    k3c_rng g;
    k3c_rng_seed(&g, seed ^ 0x7a11);
    for (int i = 0; i < NP; i++) prompt[i] = (int32_t)(k3c_rng_next(&g) % (uint64_t)V);
    rank_run one = {.m = m, .exact = exact, .prompt = prompt, .n_prompt = NP, .n_new = NN};
    CHECK(alloc_run(&one, V) == K3C_OK);
    CHECKF(run_rank(&one) == K3C_OK, "world size 1: %s", one.err);
    /* bf16: the f32 function on world size 1's own tokens (its decode inputs are then the same) */
    rank_run fn = {.m = m, .exact = 1, .prompt = prompt, .n_prompt = NP, .n_new = NN};
    double noise = 0;
    if (!exact) {
        CHECK(alloc_run(&fn, V) == K3C_OK);
        CHECKF(run_rank(&fn) == K3C_OK, "world size 1, f32: %s", fn.err);
        noise = worst_row(one.prompt_logits, fn.prompt_logits, NP, V);
        printf("    %s bf16 world size 1 vs f32: worst row rel L2 %.3g (prompt)\n", kimi_linear ? "kimi-linear" : "k3",
               noise);
    }
    const int tps[] = {2, 4, 8};
    int failed = 0;
    for (int ti = 0; ti < 3 && !failed; ti++) {
        int tp = tps[ti];
        k3c_model *sh[8] = {0};
        rank_run runs[8];
        pthread_t th[8];
        k3c_comm_group *grp;
        CHECK_OK(k3c_comm_group_create(tp, 60000, &grp));
        for (int k = 0; k < tp; k++) {
            CHECK_OK(k3c_model_shard_tp(m, k, tp, &sh[k]));
            runs[k] = (rank_run){.m = sh[k], .exact = exact, .prompt = prompt, .n_prompt = NP, .n_new = NN};
            CHECK_OK(k3c_comm_group_join(grp, k, &runs[k].comm));
            CHECK(alloc_run(&runs[k], V) == K3C_OK);
        }
        for (int k = 0; k < tp; k++) pthread_create(&th[k], NULL, rank_thread, &runs[k]);
        for (int k = 0; k < tp; k++) pthread_join(th[k], NULL);
        for (int k = 0; k < tp && !failed; k++)
            if (runs[k].rc != K3C_OK) {
                test_fail(__FILE__, __LINE__, "tp %d rank %d: %s", tp, k, runs[k].err);
                failed = 1;
            }
        if (!failed) {
            /* every rank the same bits */
            for (int k = 1; k < tp; k++)
                if (memcmp(runs[k].prompt_logits, runs[0].prompt_logits, (size_t)NP * V * 4) ||
                    memcmp(runs[k].step_logits, runs[0].step_logits, (size_t)NN * V * 4) ||
                    memcmp(runs[k].stream, runs[0].stream, NN * 4)) {
                    test_fail(__FILE__, __LINE__, "tp %d: rank %d's logits differ from rank 0's", tp, k);
                    failed = 1;
                    break;
                }
        }
        if (!failed) {
            double wp = worst_row(runs[0].prompt_logits, one.prompt_logits, NP, V);
            int same = 0;
            while (same < NN && runs[0].stream[same] == one.stream[same]) same++;
            double ws = worst_row(runs[0].step_logits, one.step_logits, same, V);
            double wf = exact ? 0 : worst_row(runs[0].prompt_logits, fn.prompt_logits, NP, V);
            printf("    %s %s tp %d: worst row rel L2 vs world size 1: prompt %.3g, decode %.3g; greedy %d/%d tokens "
                   "equal", kimi_linear ? "kimi-linear" : "k3", exact ? "f32" : "bf16", tp, wp, ws, same, NN);
            if (!exact) printf("; prompt vs the f32 function %.3g", wf);
            printf("\n");
            if (exact && !(wp <= tol && ws <= tol)) {
                test_fail(__FILE__, __LINE__, "tp %d: rel L2 %.3g / %.3g over %.3g", tp, wp, ws, tol);
                failed = 1;
            } else if (!exact && !(wf <= tol * noise && wp <= tol * noise)) {
                test_fail(__FILE__, __LINE__, "tp %d bf16: %.3g from the f32 function and %.3g from world size 1's "
                          "bf16, against world size 1's own %.3g (x %.1f allowed)", tp, wf, wp, noise, tol);
                failed = 1;
            } else if (exact && same < NN) {
                /* f32: the stream may part only at a greedy near-tie of the world-size-1 logits */
                const float *lg = same == 0 ? one.prompt_logits + (size_t)(NP - 1) * V
                                            : one.step_logits + (size_t)(same - 1) * V;
                int a = argmax(lg, V);
                float second = -INFINITY;
                for (int i = 0; i < V; i++)
                    if (i != a && lg[i] > second) second = lg[i];
                if (!(lg[a] - second < 1e-4f)) {
                    test_fail(__FILE__, __LINE__, "tp %d f32: greedy stream parts at token %d (margin %g)", tp, same,
                              (double)(lg[a] - second));
                    failed = 1;
                }
            }
        }
        for (int k = 0; k < tp; k++) {
            free_run(&runs[k]);
            runs[k].comm->free(runs[k].comm);
            k3c_model_shard_free(sh[k]);
        }
    }
    free_run(&one);
    if (!exact) free_run(&fn);
    k3c_model_free(m);
}

TEST(tp_cpu_k3_f32_matches_world_size_1) { check_tp(0, 1, 1e-5); }
TEST(tp_cpu_kimi_linear_f32_matches_world_size_1) { check_tp(1, 1, 1e-5); }
TEST(tp_cpu_k3_bf16_within_tolerance) { check_tp(0, 0, 2.0); }
TEST(tp_cpu_kimi_linear_bf16_within_tolerance) { check_tp(1, 0, 2.0); }

/* What the forward refuses: a TP communicator with the whole model (not a shard) or another rank's shard,
 * and shards that do not divide. */
TEST(tp_cpu_refusals) {
    k3c_config c;
    CHECK_OK(tp_config(0, 0, &c));
    char dir[4200];
    snprintf(dir, sizeof dir, "%s/tp_refuse", test_tmpdir());
    int rc = k3c_synth_write(&c, NULL, 5, dir);
    k3c_config_free(&c);
    CHECK_OK(rc);
    k3c_model *m, *s = NULL;
    CHECK_OK(k3c_model_load(dir, &m));
    CHECK(k3c_model_shard_tp(m, 0, 3, &s) == K3C_ERR && !s); /* 8 heads do not split 3 ways */
    CHECK(strstr(k3c_error_message(), "tp 3"));
    CHECK(k3c_model_shard_tp(m, 2, 2, &s) == K3C_ERR);
    CHECK(k3c_model_shard_tp(m, 0, 16, &s) == K3C_ERR); /* 8 heads */
    k3c_comm_group *grp;
    k3c_comm *c0, *c1;
    CHECK_OK(k3c_comm_group_create(2, 1000, &grp));
    CHECK_OK(k3c_comm_group_join(grp, 0, &c0));
    CHECK_OK(k3c_comm_group_join(grp, 1, &c1));
    k3c_backend *be = k3c_backend_cpu_create(1);
    k3c_forward *f = NULL;
    k3c_forward_options o = {.max_rows = 8, .max_segs = 1, .max_context = 16, .block_size = 16, .tp = c0};
    CHECK(k3c_forward_create(be, m, &o, &f) == K3C_ERR && !f);
    CHECK(strstr(k3c_error_message(), "shard"));
    CHECK_OK(k3c_model_shard_tp(m, 1, 2, &s));
    CHECK(k3c_forward_create(be, s, &o, &f) == K3C_ERR && !f); /* rank 1's shard on rank 0 */
    /* a device-memory (stream-ordered) communicator on the host backend */
    k3c_model *s0 = NULL;
    CHECK_OK(k3c_model_shard_tp(m, 0, 2, &s0));
    k3c_comm dev = *c0;
    dev.stream_ordered = 1;
    o.tp = &dev;
    CHECK(k3c_forward_create(be, s0, &o, &f) == K3C_ERR && !f);
    CHECK(strstr(k3c_error_message(), "device memory"));
    k3c_model_shard_free(s0);
    be->destroy(be);
    k3c_model_shard_free(s);
    c0->free(c0);
    c1->free(c1);
    k3c_model_free(m);
}

/* The shard's inventory (model/shard.h): the same tensors as the whole model's, each bound to the rank's part
 * of the whole tensor, checked byte for byte against the whole one: whole (replicated), rows [r R, (r + 1) R)
 * (column-parallel), columns [r C, (r + 1) C) of every row (row-parallel), or part r of a vector. */
static const uint8_t *spec_rows(const k3c_tensor_spec *sp, size_t *rows, size_t *row_bytes) {
    switch (sp->cls) {
    case K3C_TENSOR_MATRIX: *rows = (size_t)sp->shape[0], *row_bytes = (size_t)sp->shape[1] * 2; return (const uint8_t *)sp->mat->w;
    case K3C_TENSOR_MXFP4_PACKED: *rows = (size_t)sp->shape[0], *row_bytes = (size_t)sp->shape[1]; return sp->mx->packed;
    case K3C_TENSOR_MXFP4_SCALE: *rows = (size_t)sp->shape[0], *row_bytes = (size_t)sp->shape[1]; return sp->mx->scale;
    case K3C_TENSOR_VECTOR: *rows = 1, *row_bytes = (size_t)sp->vec_len * 4; return (const uint8_t *)*sp->vec;
    }
    return NULL;
}

static void check_shard_inventory(int kimi_linear) {
    k3c_config c;
    CHECK_OK(tp_config(kimi_linear, 0, &c));
    char dir[4200];
    snprintf(dir, sizeof dir, "%s/tp_inv_%d", test_tmpdir(), kimi_linear);
    int rc = k3c_synth_write(&c, NULL, test_seed(), dir);
    k3c_config_free(&c);
    CHECK_OK(rc);
    k3c_model *m;
    CHECK_OK(k3c_model_load(dir, &m));
    const k3c_inventory *fi = &m->inventory;
    for (int tp = 2; tp <= 4; tp += 2)
        for (int rank = 0; rank < tp; rank++) {
            k3c_model *s;
            CHECK_OK(k3c_model_shard_tp(m, rank, tp, &s));
            const k3c_inventory *si = &s->inventory;
            CHECKF(si->count == fi->count, "tp %d rank %d: %zu tensors, the model has %zu", tp, rank, si->count,
                   fi->count);
            int whole = 0, by_rows = 0, by_cols = 0, bad = 0;
            for (size_t i = 0; i < si->count && i < fi->count && !bad; i++) {
                const k3c_tensor_spec *a = &si->specs[i], *b = &fi->specs[i];
                size_t ar, ab, br, bb;
                const uint8_t *pa = spec_rows(a, &ar, &ab), *pb = spec_rows(b, &br, &bb);
                if (strcmp(a->name, b->name) || !pa || !pb) {
                    test_fail(__FILE__, __LINE__, "tp %d rank %d: tensor %zu is %s (bound %d), the model's %s", tp,
                              rank, i, a->name, pa != NULL, b->name);
                    bad = 1;
                } else if (ar == br && ab == bb) { /* replicated */
                    bad = memcmp(pa, pb, ar * ab) != 0;
                    whole++;
                } else if (ar * tp == br && ab == bb) {
                    bad = memcmp(pa, pb + (size_t)rank * ar * ab, ar * ab) != 0;
                    by_rows++;
                } else if (ar == br && ab * tp == bb) {
                    for (size_t r = 0; r < ar && !bad; r++) bad = memcmp(pa + r * ab, pb + r * bb + rank * ab, ab) != 0;
                    by_cols++;
                } else {
                    bad = 1;
                }
                if (bad)
                    test_fail(__FILE__, __LINE__, "tp %d rank %d: %s [%zu x %zu bytes] is not the rank's part of the "
                              "model's [%zu x %zu]", tp, rank, a->name, ar, ab, br, bb);
            }
            CHECK(whole > 0 && by_rows > 0 && by_cols > 0);
            k3c_model_shard_free(s);
        }
    k3c_model_free(m);
}

TEST(tp_shard_inventory_k3) { check_shard_inventory(0); }
TEST(tp_shard_inventory_kimi_linear) { check_shard_inventory(1); }
