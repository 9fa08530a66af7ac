/* The engine's PP, DP (with and without EP) and hybrid layouts on CUDA (runtime/ranks_device.c, docs/PARALLEL.md
 * "PP, DP and the hybrid on CUDA"): the ranks threads of this process, all on this GPU (rank r on device r mod
 * the visible devices), the stock forward's TP, pipeline and expert groups staged communicators split from a
 * staged world of every rank (as tests/gpu/test_gpu_ppep.c splits its own), the engine's hand-off of logits rows
 * (the last stage's broadcast, each DP rank's rows to rank 0) over the in-memory host groups. The executor is
 * off at these layouts (every step stock); the runs here set it off at world size 1 and TP 2 too, so every
 * comparison is stock against stock. Public API plus the engine's test hooks (the ranks' step check).
 *
 * The batch of tests/test_layouts.c: four requests of 70, 23, 41 and 5 prompt tokens in one step (every row's
 * logits), then decode steps of which they take 6, 3, 8 and 2, every run fed the greedy tokens of world size 1's
 * f32 run (so every run computes the same rows); under DP 2 the requests are placed 0, 1, 0, 1 and DP rank 1
 * runs dummy steps from the fourth decode step on. Tiny K3 and tiny Kimi Linear of tests/tp_config.h with dense
 * routing (every expert selected: no routing near-tie can flip between a sum and its split, the bf16 criterion
 * of tests/test_tp.c). Against world size 1 on the same GPU:
 *  - PP 2: bitwise world size 1 (bf16 and f32: a stage runs world size 1's kernels on the same shapes, as the
 *    CUDA forward's PP test measured); TP 2 x PP 2: bitwise TP 2;
 *  - DEP 2, DP 2 (whole experts), PP 2 x DEP 2, the hybrid TP 2 x DP 2 + EP 4: f32 activations within 1e-5 rel L2
 *    on every row (bitwise on the CPU ranks; on the GPU the experts' launcher picks its kernel by the call's
 *    pair count, so DEP is held to tolerance, docs/PARALLEL.md; whether bitwise is printed), bf16 no farther
 *    from the f32 function than 2x world size 1's own bf16 rows;
 *  - the greedy token of every row world size 1's (f32: a difference only at a near-tie of world size 1's);
 *  - every step every rank's rows hashed and compared (k3c_engine_check_ranks): the ranks of one DP rank
 *    bitwise equal.
 * The CLI: build/k3c generate with --pp 2, --dp 2 --ep and --tp 2 --dp 2 --ep on --device cuda, the embedded
 * model, --exact-f32: the text of --tp 1 --exact-f32 (and --pp 2 in bf16 the text of --tp 1 --stock). One
 * process per rank on this GPU (K3C_TEST_NCCL_LAYOUTS=1: several NCCL ranks on one device need NCCL 2.30's
 * NCCL_MULTI_RANK_GPU_ENABLE=1, which the test sets, with NCCL_NVLS_ENABLE=0): the same three layouts with
 * --world-size / --rank / --rendezvous, every rank its own process, the text of --tp 1. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../test.h"
#include "../tp_config.h"
#include "k3c.h"
#include "model/synth.h"
#include "runtime/engine_internal.h"
#include "util/error.h"
#include "util/rng.h"

/* Several ranks on one device: as the CLI sets them (src/cli/main.c), before CUDA starts. */
__attribute__((constructor)) static void elay_env(void) {
    setenv("CUDA_DEVICE_MAX_CONNECTIONS", "32", 0);
    setenv("CUDA_MODULE_LOADING", "EAGER", 0);
}

enum { NR = 4, MAXD = 8, PROMPT_ROWS = 70 + 23 + 41 + 5, CAP = PROMPT_ROWS + 6 + 3 + 8 + 2 };
static const int plen[NR] = {70, 23, 41, 5}, ndec[NR] = {6, 3, 8, 2};

typedef struct lay {
    int tp, pp, dp, ep, dcp; /* dcp 0: none */
} lay;

typedef struct brun {
    float *lg; /* [CAP, V]: every logits row of the run, in step order */
    size_t rows;
    int32_t stream[NR][MAXD + 1]; /* the greedy token after the prompt and after each decode step */
    long steps, checked;
    int V;
} brun;

static const char *lay_name(lay l, char *b, size_t n) {
    snprintf(b, n, "tp %d x pp %d x dp %d%s%s", l.tp, l.pp, l.dp, l.ep > 1 ? " +ep" : "", l.dcp > 1 ? " dcp" : "");
    return b;
}

/* The batch on one engine of layout l on device cuda; forced: the decode tokens (NULL: the run's own greedy
 * tokens). Logits land in a page-locked buffer (k3c_engine_logits_alloc: ranks on one device must not wait in a
 * pageable download) and are copied out. */
static int batch_run(k3c_model *m, lay l, int exact, int32_t *const *prompts, int32_t (*forced)[MAXD + 1],
                     brun *b) {
    memset(b, 0, sizeof *b);
    k3c_engine_options o;
    k3c_engine_options_default(&o);
    o.device = "cuda";
    o.exact_f32 = exact;
    o.specialized = K3C_SPECIALIZED_OFF; /* stock against stock (PP / DP run stock whatever it says) */
    o.layout.tp = l.tp;
    o.layout.pp = l.pp;
    o.layout.dp = l.dp;
    o.layout.ep = l.ep;
    o.layout.dcp = l.dcp;
    o.max_requests = NR;
    o.max_rows = 160;
    o.max_context = 80;
    o.rank_timeout_ms = 30000;
    char ln[64];
    lay_name(l, ln, sizeof ln);
    k3c_engine *e = NULL;
    if (k3c_engine_create(m, &o, &e) != K3C_OK) return k3c_error_context("%s: ", ln);
    k3c_engine_check_ranks(e, 1);
    int V = b->V = k3c_engine_vocab(e), id[NR], rc = K3C_OK;
    float *lg = k3c_engine_logits_alloc(e, o.max_rows);
    b->lg = malloc(sizeof(float) * CAP * V);
    if (!lg || !b->lg) rc = k3c_errorf("out of memory");
    if (rc == K3C_OK) poison_f32(b->lg, (size_t)CAP * V);
    for (int j = 0; j < NR && rc == K3C_OK; j++) rc = k3c_request_open(e, &id[j]);
    k3c_step_item it[NR];
    for (int j = 0; j < NR; j++)
        it[j] = (k3c_step_item){.request = id[j], .tokens = prompts[j], .n = plen[j], .all_logits = 1};
    size_t at = 0;
    if (rc == K3C_OK) {
        poison_f32(lg, (size_t)o.max_rows * V);
        rc = k3c_engine_step(e, it, NR, lg);
    }
    if (rc == K3C_OK) memcpy(b->lg, lg, sizeof(float) * (size_t)PROMPT_ROWS * V);
    int32_t tok[NR];
    for (int j = 0; j < NR; j++) {
        at += (size_t)plen[j];
        b->stream[j][0] = rc == K3C_OK ? k3c_greedy_token(b->lg + (at - 1) * V, V) : 0;
        tok[j] = forced ? forced[j][0] : b->stream[j][0];
    }
    if (rc == K3C_OK && l.dp > 1)
        for (int j = 0; j < NR && rc == K3C_OK; j++) /* least loaded, the lowest among equals: 0, 1, 0, 1 */
            if (k3c_engine_request_dp(e, id[j]) != j % l.dp)
                rc = k3c_errorf("request %d placed on DP rank %d", j, k3c_engine_request_dp(e, id[j]));
    for (int s = 0; s < MAXD && rc == K3C_OK; s++) {
        int n = 0, who[NR];
        for (int j = 0; j < NR; j++)
            if (s < ndec[j]) {
                who[n] = j;
                it[n++] = (k3c_step_item){.request = id[j], .tokens = &tok[j], .n = 1};
            }
        poison_f32(lg, (size_t)n * V);
        rc = k3c_engine_step(e, it, n, lg);
        if (rc == K3C_OK) memcpy(b->lg + at * V, lg, sizeof(float) * (size_t)n * V);
        for (int i = 0; i < n && rc == K3C_OK; i++, at++) {
            int j = who[i];
            b->stream[j][s + 1] = k3c_greedy_token(b->lg + at * V, V);
            tok[j] = forced ? forced[j][s + 1] : b->stream[j][s + 1];
        }
    }
    b->rows = at;
    k3c_engine_stats st;
    k3c_engine_stats_get(e, &st);
    b->steps = st.steps;
    b->checked = k3c_engine_ranks_checked(e);
    char msg[1024] = "";
    if (rc != K3C_OK) snprintf(msg, sizeof msg, "%s", k3c_error_message());
    if (lg) k3c_engine_logits_free(e, lg);
    k3c_engine_free(e);
    return rc == K3C_OK ? K3C_OK : k3c_errorf("%s: %s", ln, msg);
}

static double worst_row(const brun *a, const brun *b, size_t rows) {
    double w = 0;
    for (size_t i = 0; i < rows; i++) {
        double d = rel_l2_f32f32(a->lg + i * a->V, b->lg + i * a->V, (size_t)a->V);
        if (!(d <= w)) w = d; /* NaN stays */
    }
    return w;
}

static double margin(const float *lg, int V) {
    int a = k3c_greedy_token(lg, V);
    float second = -INFINITY;
    for (int i = 0; i < V; i++)
        if (i != a && lg[i] > second) second = lg[i];
    return (double)lg[a] - second;
}

/* Rows whose greedy token differs from ref's; *bad: those of them where ref had no near-tie (margin >= tie). */
static int argmax_differ(const brun *r, const brun *ref, double tie, int *bad) {
    int n = 0;
    *bad = 0;
    for (size_t i = 0; i < ref->rows; i++) {
        const float *a = r->lg + i * r->V, *b = ref->lg + i * ref->V;
        if (k3c_greedy_token(a, r->V) == k3c_greedy_token(b, ref->V)) continue;
        n++;
        if (margin(b, ref->V) >= tie) (*bad)++;
    }
    return n;
}

static int synth_model(int kimi_linear, const char *name, k3c_model **m) {
    k3c_config c;
    K3C_TRY(tp_config(kimi_linear, 1, &c));
    char dir[512];
    snprintf(dir, sizeof dir, "%s/%s", test_tmpdir(), name);
    int rc = k3c_synth_write(&c, NULL, test_seed() ^ (uint64_t)(kimi_linear + 1), dir);
    k3c_config_free(&c);
    K3C_TRY(rc);
    return k3c_load(dir, m);
}

static void layouts_case(int kimi_linear, const lay *cases, int ncases) {
    const char *mn = kimi_linear ? "kimi_linear" : "k3";
    k3c_model *m = NULL;
    CHECK_OK(synth_model(kimi_linear, kimi_linear ? "elay_kl" : "elay_k3", &m));
    k3c_model_info info;
    CHECK_OK(k3c_model_info_get(m, &info));
    int V = info.vocab_size;
    int32_t buf[NR][70], *prompts[NR];
    k3c_rng g;
    k3c_rng_seed(&g, test_seed() ^ 0xe1a7);
    for (int j = 0; j < NR; j++) {
        prompts[j] = buf[j];
        for (int i = 0; i < plen[j]; i++) buf[j][i] = (int32_t)(k3c_rng_next(&g) % (uint64_t)V);
    }
    const lay one = {1, 1, 1, 1, 0}, tp2 = {2, 1, 1, 1, 0};
    brun fn = {0}, b1 = {0}, t32 = {0}, t16 = {0};
    /* the f32 function (its greedy tokens feed every run), world size 1's bf16, TP 2 (TP 2 x PP 2's reference) */
    int rc = batch_run(m, one, 1, prompts, NULL, &fn);
    if (rc == K3C_OK) rc = batch_run(m, one, 0, prompts, fn.stream, &b1);
    if (rc == K3C_OK) rc = batch_run(m, tp2, 1, prompts, fn.stream, &t32);
    if (rc == K3C_OK) rc = batch_run(m, tp2, 0, prompts, fn.stream, &t16);
    double own = rc == K3C_OK ? worst_row(&b1, &fn, fn.rows) : 0;
    if (rc == K3C_OK)
        printf("INFO engine_layouts %s: world size 1 bf16 vs the f32 function: worst row rel L2 %.3g (%zu rows)\n", mn,
               own, fn.rows);
    for (int c = 0; c < ncases && rc == K3C_OK; c++) {
        lay l = cases[c];
        char ln[64];
        lay_name(l, ln, sizeof ln);
        int bitwise_expected = l.dp == 1; /* PP (x TP): the stages run the same kernels on the same shapes */
        for (int exact = 1; exact >= 0 && rc == K3C_OK; exact--) {
            brun r;
            rc = batch_run(m, l, exact, prompts, fn.stream, &r);
            if (rc != K3C_OK) break;
            const brun *same = exact ? (l.tp > 1 ? &t32 : &fn) : (l.tp > 1 ? &t16 : &b1);
            int bitwise = r.rows == same->rows && !memcmp(r.lg, same->lg, sizeof(float) * r.rows * V);
            double w = worst_row(&r, exact ? &fn : &b1, fn.rows), wf = worst_row(&r, &fn, fn.rows);
            int bad = 0, differ = argmax_differ(&r, exact ? &fn : &b1, 1e-4, &bad);
            printf("INFO engine_layouts %s %s %s: %zu rows %s %s; worst row rel L2 vs world size 1's %s %.3g%s; %d "
                   "rows' greedy token differ (%d away from a near-tie); %ld of %ld steps every rank bitwise\n",
                   mn, exact ? "f32" : "bf16", ln, r.rows, bitwise ? "bitwise" : "NOT bitwise",
                   l.tp > 1 ? "TP 2's" : "world size 1's", exact ? "f32" : "bf16", w,
                   exact ? "" : " (vs the f32 function below)", differ, bad, r.checked, r.steps);
            char mname[64];
            snprintf(mname, sizeof mname, "elay_%s_%s_%d%d%d%s", mn, exact ? "f32" : "bf16", l.tp, l.pp, l.dp,
                     l.ep > 1 ? "e" : "");
            printf("METRIC %-28s rel_l2 %8.1e %10.3e\n", mname, exact ? 1e-5 : 2 * own, exact ? w : wf);
            if (r.rows != fn.rows) rc = k3c_errorf("%s: %zu rows, world size 1 %zu", ln, r.rows, fn.rows);
            else if (bitwise_expected && !bitwise)
                rc = k3c_errorf("%s %s: logits not bitwise %s", ln, exact ? "f32" : "bf16",
                                l.tp > 1 ? "TP 2's" : "world size 1's");
            else if (exact && !(w <= 1e-5)) rc = k3c_errorf("%s f32: rel L2 %.3g over 1e-5", ln, w);
            else if (!exact && !(wf <= 2 * own))
                rc = k3c_errorf("%s bf16: %.3g from the f32 function, over 2 x world size 1's %.3g", ln, wf, own);
            else if (exact && bad)
                rc = k3c_errorf("%s f32: %d rows' greedy token differ from world size 1's away from a near-tie", ln,
                                bad);
            else if (r.checked != r.steps || r.steps != 1 + MAXD)
                rc = k3c_errorf("%s: %ld of %ld steps compared across the ranks", ln, r.checked, r.steps);
            free(r.lg);
        }
    }
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", rc == K3C_OK ? "" : k3c_error_message());
    free(fn.lg), free(b1.lg), free(t32.lg), free(t16.lg);
    k3c_free(m);
    CHECKF(rc == K3C_OK, "%s: %s", mn, msg);
}

TEST(gpu_engine_layouts_k3_tiny) {
    const lay cases[] = {{1, 2, 1, 1, 0}, {1, 1, 2, 2, 0}, {1, 1, 2, 1, 0}, {1, 2, 2, 2, 0}, {2, 2, 1, 1, 0},
                         {2, 1, 2, 4, 0}};
    layouts_case(0, cases, (int)(sizeof cases / sizeof cases[0]));
}

TEST(gpu_engine_layouts_kimi_linear_tiny) {
    const lay cases[] = {{1, 2, 1, 1, 0}, {1, 1, 2, 2, 0}, {2, 1, 2, 4, 0}};
    layouts_case(1, cases, (int)(sizeof cases / sizeof cases[0]));
}

/* ---- the CLI on the embedded model ---- */

static const char *const cli_layouts[] = {"--pp 2", "--dp 2 --ep", "--tp 2 --dp 2 --ep"};

TEST(gpu_engine_layouts_cli_generate) {
    char k3c[4096], cmd[16384], ref[4300], ref16[4300], out[4300], err[4300];
    CHECK(test_k3c_binary(k3c, sizeof k3c));
    const char *args = "generate --prompt 'A penny saved is' -n 24 --ignore-eos --device cuda";
    snprintf(ref, sizeof ref, "%s/elay_cli_ref.txt", test_tmpdir());
    snprintf(ref16, sizeof ref16, "%s/elay_cli_ref16.txt", test_tmpdir());
    snprintf(out, sizeof out, "%s/elay_cli_out.txt", test_tmpdir());
    snprintf(err, sizeof err, "%s/elay_cli_out.err", test_tmpdir());
    snprintf(cmd, sizeof cmd, "%s %s --exact-f32 > %s 2>/dev/null", k3c, args, ref);
    CHECK(test_run_status(cmd) == 0);
    snprintf(cmd, sizeof cmd, "%s %s --stock > %s 2>/dev/null", k3c, args, ref16);
    CHECK(test_run_status(cmd) == 0);
    for (size_t i = 0; i < sizeof cli_layouts / sizeof cli_layouts[0]; i++) {
        snprintf(cmd, sizeof cmd, "%s %s %s --exact-f32 > %s 2> %s", k3c, args, cli_layouts[i], out, err);
        CHECKF(test_run_status(cmd) == 0, "%s failed (stderr in %s)", cmd, err);
        snprintf(cmd, sizeof cmd, "cmp -s %s %s", ref, out);
        CHECKF(test_run_status(cmd) == 0, "k3c generate --exact-f32 %s --device cuda printed other text than --tp 1 "
               "(%s, %s)", cli_layouts[i], ref, out);
        snprintf(cmd, sizeof cmd, "%s %s %s > %s 2> %s", k3c, args, cli_layouts[i], out, err);
        CHECKF(test_run_status(cmd) == 0, "%s failed (stderr in %s)", cmd, err);
        snprintf(cmd, sizeof cmd, "cmp -s %s %s", ref16, out);
        int same = test_run_status(cmd) == 0;
        printf("INFO engine_layouts cli: --exact-f32 %s = --tp 1; bf16 %s text %s --tp 1 --stock's\n", cli_layouts[i],
               cli_layouts[i], same ? "equal to" : "differs from");
        if (i == 0) CHECKF(same, "k3c generate --pp 2 --device cuda (bf16) printed other text than --tp 1 --stock");
    }
}

/* One process per rank, all on this GPU (opt-in: NCCL must allow several ranks on one device). */
TEST(gpu_engine_layouts_cli_processes) {
    const char *on = getenv("K3C_TEST_NCCL_LAYOUTS");
    if (!on || strcmp(on, "1") != 0) {
        printf("INFO engine_layouts processes: skipped (K3C_TEST_NCCL_LAYOUTS=1 runs them: NCCL 2.30's "
               "NCCL_MULTI_RANK_GPU_ENABLE)\n");
        return;
    }
    char k3c[4096], cmd[16384], ref[4400], dir[4300];
    CHECK(test_k3c_binary(k3c, sizeof k3c));
    snprintf(dir, sizeof dir, "%s/elay_proc", test_tmpdir());
    snprintf(cmd, sizeof cmd, "mkdir -p %s", dir);
    CHECK(test_run_status(cmd) == 0);
    const char *args = "generate --prompt 'A penny saved is' -n 24 --ignore-eos --device cuda --exact-f32";
    snprintf(ref, sizeof ref, "%s/ref.txt", dir);
    snprintf(cmd, sizeof cmd, "%s %s > %s 2>/dev/null", k3c, args, ref);
    CHECK(test_run_status(cmd) == 0);
    const int world[] = {2, 2, 4};
    for (size_t i = 0; i < sizeof cli_layouts / sizeof cli_layouts[0]; i++) {
        /* every rank in the background, each bounded by timeout; the status: all ranks' exits 0 */
        snprintf(cmd, sizeof cmd,
                 "cd %s && rm -f rdv* && export NCCL_MULTI_RANK_GPU_ENABLE=1 NCCL_NVLS_ENABLE=0; pids=; "
                 "for r in $(seq 0 %d); do timeout 240 %s %s %s --world-size %d --rank $r --rendezvous %s/rdv "
                 "--rank-timeout 60 > r$r.out 2> r$r.err & pids=\"$pids $!\"; done; st=0; "
                 "for p in $pids; do wait $p || st=1; done; exit $st",
                 dir, world[i] - 1, k3c, args, cli_layouts[i], world[i], dir);
        int st = test_run_status(cmd);
        CHECKF(st == 0, "%s --world-size %d, one process a rank on this GPU, failed (logs in %s)", cli_layouts[i],
               world[i], dir);
        snprintf(cmd, sizeof cmd, "cmp -s %s %s/r0.out", ref, dir);
        CHECKF(test_run_status(cmd) == 0, "%s over %d processes printed other text than --tp 1 (%s/r0.out)",
               cli_layouts[i], world[i], dir);
        printf("INFO engine_layouts processes: --exact-f32 %s over %d processes on one GPU = --tp 1\n", cli_layouts[i],
               world[i]);
    }
}

/* k3c bench --device cuda --tp 2 (threads on this GPU, each rank generating its shard of the device-synthetic
 * weights): runs, prints its STEP rows (stock over the staged sums) and SPEC rows (the executor over the
 * in-process mailbox); then --pp 2 and --dp 2 --ep, STEP rows alone (the executor runs under tp only); the
 * rows are printed here. */
TEST(gpu_engine_layouts_bench) {
    char k3c[4096], cmd[16384], out[4300], err[4300];
    CHECK(test_k3c_binary(k3c, sizeof k3c));
    snprintf(out, sizeof out, "%s/elay_bench.txt", test_tmpdir());
    snprintf(err, sizeof err, "%s/elay_bench.err", test_tmpdir());
    snprintf(cmd, sizeof cmd, "timeout 300 %s bench --device cuda --preset mini --tp 2 --batches 1,4 --verify 1,4 "
             "--steps 5 --context 64 > %s 2> %s", k3c, out, err);
    int st = test_run_status(cmd);
    snprintf(cmd, sizeof cmd, "grep -E '^(bench|STEP|SPEC)' %s | sed 's/^/INFO engine_layouts bench tp 2: /'", out);
    test_run_status(cmd);
    CHECKF(st == 0, "k3c bench --device cuda --preset mini --tp 2 failed (stdout %s, stderr %s)", out, err);
    snprintf(cmd, sizeof cmd, "grep -Eq '^STEP mini +4 +1 ' %s && grep -Eq '^SPEC mini +4 +1 +[0-9]' %s", out, out);
    CHECKF(test_run_status(cmd) == 0, "k3c bench --tp 2: no STEP or SPEC row for batch 4 (%s)", out);
    const char *const more[] = {"--pp 2", "--dp 2 --ep"};
    for (int i = 0; i < 2; i++) {
        snprintf(cmd, sizeof cmd, "timeout 300 %s bench --device cuda --preset mini %s --batches 1,4 --steps 5 "
                 "--context 64 > %s 2> %s", k3c, more[i], out, err);
        st = test_run_status(cmd);
        snprintf(cmd, sizeof cmd, "grep -E '^(bench|STEP)' %s | sed 's/^/INFO engine_layouts bench %s: /'", out, more[i]);
        test_run_status(cmd);
        CHECKF(st == 0, "k3c bench --device cuda --preset mini %s failed (stdout %s, stderr %s)", more[i], out, err);
        snprintf(cmd, sizeof cmd, "grep -Eq '^STEP mini +4 +1 ' %s && ! grep -q '^SPEC' %s", out, out);
        CHECKF(test_run_status(cmd) == 0, "k3c bench %s: no STEP row for batch 4, or a SPEC row (%s)", more[i], out);
    }
}

/* DCP narrower than TP at the engine on cuda (--tp 4 --dcp 2: the DCP groups staged splits of the staged TP
 * group, runtime/ranks_device.c; the forward refuses a DCP group on other memory than TP's): f32 within 1e-5 of
 * TP 4 without DCP (tests/test_dcp.c's bound), bf16 printed, every step every rank bitwise rank 0. */
TEST(gpu_engine_layouts_dcp_narrower_than_tp) {
    k3c_model *m = NULL;
    CHECK_OK(synth_model(0, "elay_dcp", &m));
    k3c_model_info info;
    CHECK_OK(k3c_model_info_get(m, &info));
    int32_t buf[NR][70], *prompts[NR];
    k3c_rng g;
    k3c_rng_seed(&g, test_seed() ^ 0xdc9);
    for (int j = 0; j < NR; j++) {
        prompts[j] = buf[j];
        for (int i = 0; i < plen[j]; i++) buf[j][i] = (int32_t)(k3c_rng_next(&g) % (uint64_t)info.vocab_size);
    }
    const lay tp4 = {4, 1, 1, 1, 0}, dcp2 = {4, 1, 1, 1, 2};
    brun a = {0}, b = {0};
    int rc = K3C_OK;
    for (int exact = 1; exact >= 0 && rc == K3C_OK; exact--) {
        rc = batch_run(m, tp4, exact, prompts, NULL, &a);
        if (rc == K3C_OK) rc = batch_run(m, dcp2, exact, prompts, a.stream, &b);
        if (rc == K3C_OK) {
            double w = worst_row(&b, &a, a.rows);
            printf("INFO engine_layouts tp 4 dcp 2 %s: worst row rel L2 vs tp 4 %.3g (%zu rows); %ld of %ld steps every "
                   "rank bitwise\n", exact ? "f32" : "bf16", w, a.rows, b.checked, b.steps);
            if (exact && !(w <= 1e-5)) rc = k3c_errorf("tp 4 dcp 2 f32: rel L2 %.3g over 1e-5", w);
            else if (b.rows != a.rows || b.checked != b.steps)
                rc = k3c_errorf("%zu rows (tp 4: %zu), %ld of %ld steps compared", b.rows, a.rows, b.checked, b.steps);
        }
        free(a.lg), free(b.lg);
        a.lg = b.lg = NULL;
    }
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", rc == K3C_OK ? "" : k3c_error_message());
    k3c_free(m);
    CHECKF(rc == K3C_OK, "%s", msg);
}
