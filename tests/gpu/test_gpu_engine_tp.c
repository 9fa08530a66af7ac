/* The engine at TP on CUDA (runtime/ranks_device.c, docs/PARALLEL.md "The engine at TP on CUDA"): its ranks
 * threads of this process, all on this GPU (rank r on device r mod the visible devices), the stock forward over
 * the staged communicator and the specialized executor over an in-process mailbox. Public API plus the
 * engine's test hooks (runtime/engine_internal.h: the ranks' step check). On the tiny K3 of the parallel tests
 * (tests/tp_config.h, dense routing) and the embedded k3-fortune, TP 2 against world size 1 on the same GPU:
 *  - bf16, the executor on (specialized ON: a rank without its mailbox fails the engine): a prompt step (every
 *    row's logits) then ND decode steps fed world size 1's greedy tokens; the logits no farther from the f32
 *    function (world size 1, exact f32) than 2x world size 1's own bf16 logits, nor from those; every decode
 *    step after the first (the first plans stock and warms the shape, the second captures it) counted as an
 *    executor step; every step's logits on every rank bitwise rank 0's (the ranks' hash check, every step);
 *  - f32 activations (exact f32: the executor is off, the stock forward over the staged sums): every row within
 *    1e-5 rel L2 of world size 1, the greedy stream the same (a part only at a near-tie of world size 1's);
 *  - k3c_generate at TP 2 (bf16, executor) gives the greedy stream of the step-by-step TP 2 run, bit for bit;
 *  - the CLI: build/k3c generate --tp 2 --device cuda on the embedded model: exit 0, its route summary counts
 *    specialized steps, and with --exact-f32 the text of --tp 1 --device cuda.
 * No hang: the ranks' waits are bounded (rank_timeout_ms, the mailbox's 10 s). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../test.h"
#include "../k3_fortune.h"
#include "../tp_config.h"
#include "k3c.h"
#include "model/synth.h"
#include "runtime/engine_internal.h"
#include "util/error.h"
#include "util/rng.h"

/* Several ranks on one device: as the CLI sets them (src/cli/main.c), before CUDA starts. */
__attribute__((constructor)) static void etp_env(void) {
    setenv("CUDA_DEVICE_MAX_CONNECTIONS", "32", 0);
    setenv("CUDA_MODULE_LOADING", "EAGER", 0);
}

enum { NP = 40, ND = 12 };

typedef struct erun {
    float *prompt_lg; /* [NP, V] */
    float *step_lg;   /* [ND, V] */
    int32_t stream[ND + 1]; /* the greedy token after the prompt and after each decode step */
    k3c_engine_stats st;
    long checked;
    int V;
} erun;

static void erun_free(erun *r) {
    free(r->prompt_lg);
    free(r->step_lg);
}

static void opts(k3c_engine_options *o, int tp, int exact) {
    k3c_engine_options_default(o);
    o->device = "cuda";
    o->exact_f32 = exact;
    o->specialized = exact ? K3C_SPECIALIZED_OFF : K3C_SPECIALIZED_ON;
    o->layout.tp = tp;
    o->max_requests = 1;
    o->max_rows = NP;
    o->max_context = NP + ND + 8;
    o->rank_timeout_ms = 30000;
}

/* One request: the prompt (every row's logits), then ND decode steps, fed forced (NULL: the run's own greedy
 * tokens). Logits land in page-locked buffers (k3c_engine_logits_alloc: ranks on one device must not wait in a
 * pageable download) and are copied out. */
static int engine_run(k3c_model *m, int tp, int exact, const int32_t *prompt, const int32_t *forced, erun *r) {
    memset(r, 0, sizeof *r);
    k3c_engine_options o;
    opts(&o, tp, exact);
    k3c_engine *e = NULL;
    K3C_TRY(k3c_engine_create(m, &o, &e));
    k3c_engine_check_ranks(e, 1);
    int V = r->V = k3c_engine_vocab(e), id = -1, rc = K3C_OK;
    float *lg = k3c_engine_logits_alloc(e, NP);
    r->prompt_lg = malloc(sizeof(float) * (size_t)NP * V);
    r->step_lg = malloc(sizeof(float) * (size_t)ND * V);
    if (!lg || !r->prompt_lg || !r->step_lg) rc = k3c_errorf("out of memory");
    if (rc == K3C_OK) {
        poison_f32(lg, (size_t)NP * V);
        rc = k3c_request_open(e, &id);
    }
    /* the prompt cut where k3c_generate cuts it (k3c_engine_prompt_piece: the same bits whatever the cuts) */
    for (int done = 0; done < NP && rc == K3C_OK;) {
        int n = k3c_engine_prompt_piece(e, done, NP, NP);
        k3c_step_item it = {.request = id, .tokens = prompt + done, .n = n, .all_logits = 1};
        rc = k3c_engine_step(e, &it, 1, lg + (size_t)done * V);
        done += n;
    }
    if (rc == K3C_OK) {
        memcpy(r->prompt_lg, lg, sizeof(float) * (size_t)NP * V);
        r->stream[0] = k3c_greedy_token(lg + (size_t)(NP - 1) * V, V);
    }
    for (int s = 0; s < ND && rc == K3C_OK; s++) {
        int32_t in = forced ? forced[s] : r->stream[s];
        k3c_step_item d = {.request = id, .tokens = &in, .n = 1};
        poison_f32(lg, (size_t)V);
        rc = k3c_engine_step(e, &d, 1, lg);
        if (rc == K3C_OK) {
            memcpy(r->step_lg + (size_t)s * V, lg, sizeof(float) * (size_t)V);
            r->stream[s + 1] = k3c_greedy_token(lg, V);
        }
    }
    k3c_engine_stats_get(e, &r->st);
    r->checked = k3c_engine_ranks_checked(e);
    char msg[1024] = "";
    if (rc != K3C_OK) snprintf(msg, sizeof msg, "%s", k3c_error_message());
    if (id >= 0) k3c_request_close(e, id);
    k3c_engine_logits_free(e, lg);
    k3c_engine_free(e);
    return rc == K3C_OK ? K3C_OK : k3c_errorf("tp %d%s: %s", tp, exact ? " (exact f32)" : "", msg);
}

static double worst_row(const float *a, const float *b, int rows, int V) {
    double w = 0;
    for (int i = 0; i < rows; i++) {
        double d = rel_l2_f32f32(a + (size_t)i * V, b + (size_t)i * V, (size_t)V);
        if (!(d <= w)) w = d; /* NaN stays */
    }
    return w;
}

static double worst(const erun *a, const erun *b) {
    return fmax(worst_row(a->prompt_lg, b->prompt_lg, NP, a->V), worst_row(a->step_lg, b->step_lg, ND, a->V));
}

static double margin(const float *lg, int V) {
    int a = k3c_greedy_token(lg, V);
    float second = -INFINITY;
    for (int i = 0; i < V; i++)
        if (i != a && lg[i] > second) second = lg[i];
    return (double)lg[a] - second;
}

/* Greedy tokens two streams share; a part is allowed only where `one`'s logits had a near-tie (< tie). */
static int same_stream(const erun *one, const int32_t *stream, int n, double tie, int *same) {
    int t = 0;
    while (t < n && stream[t] == one->stream[t]) t++;
    *same = t;
    if (t == n) return K3C_OK;
    const float *lg = t == 0 ? one->prompt_lg + (size_t)(NP - 1) * one->V : one->step_lg + (size_t)(t - 1) * one->V;
    double g = margin(lg, one->V);
    return g < tie ? K3C_OK : k3c_errorf("the greedy stream parts at token %d (world size 1's margin %g)", t, g);
}

static int collect_token(void *u, int32_t tok) {
    int32_t *c = u;
    if (c[0] < ND + 1) c[1 + c[0]++] = tok;
    return 0;
}

static void check_engine_tp(const char *name, k3c_model *m) {
    k3c_model_info info;
    CHECK_OK(k3c_model_info_get(m, &info));
    int V = info.vocab_size;
    int32_t prompt[NP];
    k3c_rng g;
    k3c_rng_seed(&g, test_seed() ^ 0x7e57);
    for (int i = 0; i < NP; i++) prompt[i] = (int32_t)(k3c_rng_next(&g) % (uint64_t)V);
    erun fn, one, two, fn2;
    CHECK_OK(engine_run(m, 1, 1, prompt, NULL, &fn)); /* the f32 function */
    CHECK_OK(engine_run(m, 1, 0, prompt, fn.stream, &one));
    int rc = engine_run(m, 2, 0, prompt, fn.stream, &two);
    if (rc != K3C_OK) {
        erun_free(&fn), erun_free(&one);
        CHECKF(0, "%s: %s", name, k3c_error_message());
    }
    /* bf16, the executor: the tolerance of tests/gpu/test_gpu_tp_exec.c */
    double noise = worst(&one, &fn), vs1 = worst(&two, &one), vsf = worst(&two, &fn);
    printf("INFO engine_tp %s tp 2 bf16: worst row rel L2 vs world size 1 %.3g, vs the f32 function %.3g (world "
           "size 1's own %.3g); %ld executor steps of %ld (world size 1: %ld); %ld of %ld steps every rank bitwise\n",
           name, vs1, vsf, noise, two.st.executor_steps, two.st.steps, one.st.executor_steps, two.checked,
           two.st.steps);
    printf("METRIC engine_tp2_%-12s rel_l2 %8.1e %10.3e\n", name, 2 * noise, fmax(vs1, vsf));
    CHECKF(vs1 <= 2 * noise && vsf <= 2 * noise,
           "%s tp 2: %.3g from world size 1's bf16 and %.3g from the f32 function, world size 1's own %.3g "
           "(x 2 allowed)",
           name, vs1, vsf, noise);
    CHECKF(two.st.steps > ND && two.st.executor_steps == ND - 1 && one.st.executor_steps == ND - 1,
           "%s: %ld of %ld steps on the executor at tp 2, %ld at world size 1 (want %d: every decode step after the "
           "first)", name, two.st.executor_steps, two.st.steps, one.st.executor_steps, ND - 1);
    CHECKF(two.checked == two.st.steps, "%s tp 2: %ld of %ld steps compared across the ranks", name, two.checked,
           two.st.steps);
    /* f32 activations: the stock forward over the staged sums */
    rc = engine_run(m, 2, 1, prompt, NULL, &fn2);
    int same = 0;
    if (rc == K3C_OK) rc = same_stream(&fn, fn2.stream, ND + 1, 1e-4, &same);
    if (rc == K3C_OK) {
        double w = worst_row(fn2.prompt_lg, fn.prompt_lg, NP, V);
        double wd = worst_row(fn2.step_lg, fn.step_lg, same < ND ? same : ND, V);
        printf("INFO engine_tp %s tp 2 f32: worst row rel L2 vs world size 1: prompt %.3g, decode %.3g; greedy %d/%d "
               "equal; %ld of %ld steps every rank bitwise\n", name, w, wd, same, ND + 1, fn2.checked, fn2.st.steps);
        if (!(w <= 1e-5 && wd <= 1e-5)) rc = k3c_errorf("rel L2 %.3g / %.3g over 1e-5", w, wd);
        else if (fn2.checked != fn2.st.steps)
            rc = k3c_errorf("%ld of %ld steps compared across the ranks", fn2.checked, fn2.st.steps);
    }
    if (rc == K3C_OK) erun_free(&fn2);
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", rc == K3C_OK ? "" : k3c_error_message());
    erun_free(&fn), erun_free(&one);
    CHECKF(rc == K3C_OK, "%s tp 2 f32: %s", name, msg);
    /* k3c_generate at TP 2 (bf16, the executor): the step-by-step run's greedy stream */
    erun own;
    rc = engine_run(m, 2, 0, prompt, NULL, &own);
    int32_t got[2 + ND] = {0};
    k3c_engine *e = NULL;
    k3c_engine_options o;
    opts(&o, 2, 0);
    if (rc == K3C_OK) rc = k3c_engine_create(m, &o, &e);
    if (rc == K3C_OK) {
        k3c_engine_check_ranks(e, 1);
        rc = k3c_generate(e, prompt, NP, ND + 1, NULL, collect_token, got, NULL);
    }
    k3c_engine_stats st = {0};
    if (e) k3c_engine_stats_get(e, &st);
    snprintf(msg, sizeof msg, "%s", rc == K3C_OK ? "" : k3c_error_message());
    long checked = e ? k3c_engine_ranks_checked(e) : 0;
    k3c_engine_free(e);
    int equal = rc == K3C_OK && got[0] == ND + 1 && !memcmp(got + 1, own.stream, sizeof(int32_t) * (ND + 1));
    if (rc == K3C_OK) erun_free(&own);
    erun_free(&two);
    CHECKF(rc == K3C_OK, "%s: k3c_generate at tp 2: %s", name, msg);
    printf("INFO engine_tp %s: k3c_generate tp 2: %d tokens, %s the step-by-step stream; %ld executor steps of %ld, "
           "%ld checked across the ranks\n", name, got[0], equal ? "equal to" : "NOT equal to", st.executor_steps,
           st.steps, checked);
    CHECKF(equal, "%s: k3c_generate at tp 2 gave another greedy stream than the step-by-step run", name);
    CHECKF(st.executor_steps > 0 && checked == st.steps, "%s: k3c_generate at tp 2: %ld executor steps, %ld of %ld "
           "checked", name, st.executor_steps, checked, st.steps);
}

TEST(gpu_engine_tp_k3_tiny) {
    k3c_config c;
    CHECK_OK(tp_config(0, 1, &c));
    char dir[512];
    snprintf(dir, sizeof dir, "%s/engine_tp_k3", test_tmpdir());
    int rc = k3c_synth_write(&c, NULL, test_seed(), dir);
    k3c_config_free(&c);
    CHECK_OK(rc);
    k3c_model *m = NULL;
    CHECK_OK(k3c_load(dir, &m));
    check_engine_tp("k3_tiny", m);
    k3c_free(m);
}

TEST(gpu_engine_tp_fortune) {
    char dir[4096];
    CHECK(fortune_path(dir, sizeof dir, "models/k3-fortune") == 0);
    k3c_model *m = NULL;
    CHECK_OK(k3c_load(dir, &m));
    check_engine_tp("k3_fortune", m);
    k3c_free(m);
}

/* The CLI on the embedded model: --tp 2 --device cuda (threads on this GPU; main sets the environment). */
TEST(gpu_engine_tp_cli_generate) {
    char k3c[4096], cmd[16384], out1[4300], out2[4300], err2[4300];
    CHECK(test_k3c_binary(k3c, sizeof k3c));
    snprintf(out1, sizeof out1, "%s/engine_tp_cli_1.txt", test_tmpdir());
    snprintf(out2, sizeof out2, "%s/engine_tp_cli_2.txt", test_tmpdir());
    snprintf(err2, sizeof err2, "%s/engine_tp_cli_2.err", test_tmpdir());
    const char *args = "generate --prompt 'A penny saved is' -n 24 --ignore-eos --device cuda";
    /* bf16, the executor: runs, and its summary counts specialized steps */
    snprintf(cmd, sizeof cmd, "env -u CUDA_DEVICE_MAX_CONNECTIONS -u CUDA_MODULE_LOADING %s %s --tp 2 > %s 2> %s", k3c,
             args, out2, err2);
    CHECKF(test_run_status(cmd) == 0, "%s failed (stderr in %s)", cmd, err2);
    snprintf(cmd, sizeof cmd, "grep -Eq 'steps: [1-9][0-9]* specialized' %s", err2);
    CHECKF(test_run_status(cmd) == 0, "k3c generate --tp 2 --device cuda ran no step on the executor (%s)", err2);
    snprintf(cmd, sizeof cmd, "%s %s > %s 2>/dev/null", k3c, args, out1);
    CHECK(test_run_status(cmd) == 0);
    snprintf(cmd, sizeof cmd, "cmp -s %s %s", out1, out2);
    int same_text = test_run_status(cmd) == 0;
    printf("INFO engine_tp cli: bf16 --tp 2 text %s --tp 1's\n", same_text ? "equal to" : "differs from");
    /* f32 activations: the text of --tp 1 */
    snprintf(cmd, sizeof cmd, "%s %s --exact-f32 > %s 2>/dev/null", k3c, args, out1);
    CHECK(test_run_status(cmd) == 0);
    snprintf(cmd, sizeof cmd, "%s %s --exact-f32 --tp 2 > %s 2>/dev/null", k3c, args, out2);
    CHECK(test_run_status(cmd) == 0);
    snprintf(cmd, sizeof cmd, "cmp -s %s %s", out1, out2);
    CHECKF(test_run_status(cmd) == 0, "k3c generate --exact-f32 --tp 2 --device cuda printed other text than --tp 1 "
           "(%s, %s)", out1, out2);
}
