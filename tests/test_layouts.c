/* Pipeline stages and DP attention + EP MoE at the engine and the commands (runtime/engine_ranks.h,
 * docs/PARALLEL.md "Ranks at the engine and the commands"): an engine made with k3c_engine_options.layout.pp =
 * P, or .dp = N with .ep = N, runs every step on its CPU ranks in this process, rank 0 leading.
 *
 * What is asserted, against world size 1 running the same steps:
 *   - PP 2 and PP 3, DEP 2 (DP attention + EP MoE), DP 2 without EP: the logits bitwise world size 1's, in bf16
 *     and in f32 (a stage runs world size 1's operations for its layers; a DEP token's attention is world
 *     size 1's and its experts' outputs are summed in the router's order on its own rank: forward.c), so the
 *     greedy streams are identical too;
 *   - TP 2 x PP 2: bitwise TP 2 (the stages do not touch the TP sums), and within 1e-5 of world size 1 with f32
 *     activations (TP's row-parallel sums split);
 *   - every step every rank hashes its DP rank's logits rows and they are compared (k3c_engine_check_ranks):
 *     the ranks of one DP rank (its stages, its TP ranks) bitwise equal.
 * The batch: four requests of 70, 23, 41 and 5 prompt tokens in one step, then greedy decode steps of which
 * each request takes 6, 3, 8 and 2, so under DEP 2 (placed 0, 1, 0, 1 by the least-loaded rule) the DP ranks'
 * rows differ every step and DP rank 1 runs dummy steps from the fourth decode step on. Then the serving
 * scheduler under DEP 2 (prefix hits, preemption, speculation), the CLI (generate and logits), the refusals. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/stat.h>

#include "backend/backend.h"
#include "damp_residual.h"
#include "k3c.h"
#include "model/synth.h"
#include "runtime/engine_internal.h"
#include "runtime/ranks.h"
#include "test.h"
#include "tp_config.h"
#include "util/error.h"
#include "util/rng.h"

typedef struct lay {
    int tp, pp, dp, ep;
} lay;

static const char *lay_name(lay l, char *b, size_t n) {
    snprintf(b, n, "tp %d x pp %d x dp %d%s", l.tp, l.pp, l.dp, l.ep > 1 ? " +ep" : "");
    return b;
}

/* damp > 0: made repetitive (damp_residual.h), so that prompt-lookup drafts get accepted */
static int lay_model_routing(int kimi_linear, int dense, uint64_t seed, const char *name, float damp, k3c_model **m) {
    k3c_config c;
    K3C_TRY(tp_config(kimi_linear, dense, &c));
    char dir[512];
    snprintf(dir, sizeof dir, "%s/%s", test_tmpdir(), name);
    int rc = k3c_synth_write(&c, NULL, seed, dir);
    k3c_config_free(&c);
    K3C_TRY(rc);
    if (damp > 0) K3C_TRY(damp_residual_writes_in(dir, damp));
    return k3c_load(dir, m);
}

static int lay_model(int kimi_linear, uint64_t seed, const char *name, float damp, k3c_model **m) {
    return lay_model_routing(kimi_linear, 0, seed, name, damp, m);
}

static void lay_opts(k3c_engine_options *o, lay l, int exact) {
    k3c_engine_options_default(o);
    o->threads = l.tp * l.pp * l.dp; /* one worker a rank */
    o->exact_f32 = exact;
    o->layout.tp = l.tp;
    o->layout.pp = l.pp;
    o->layout.dp = l.dp;
    o->layout.ep = l.ep;
    o->rank_timeout_ms = 30000;
}

enum { NR = 4, MAXD = 8 };
static const int plen[NR] = {70, 23, 41, 5}, ndec[NR] = {6, 3, 8, 2};

typedef struct batch {
    float *lg;           /* every logits row of the run, in step order */
    size_t rows;
    int32_t stream[NR][MAXD];
    long steps, checked;
} batch;

/* The batch above on one engine of layout l; prompts[j] of plen[j] tokens. */
static int batch_run(k3c_model *m, lay l, int exact, int32_t *const *prompts, batch *b) {
    memset(b, 0, sizeof *b);
    k3c_engine_options o;
    lay_opts(&o, l, exact);
    o.max_requests = NR;
    o.max_rows = 160;
    o.max_context = 80;
    k3c_engine *e = NULL;
    K3C_TRY(k3c_engine_create(m, &o, &e));
    k3c_engine_check_ranks(e, 1);
    int V = k3c_engine_vocab(e), id[NR], rc = K3C_OK;
    size_t cap = 139 + 19;
    b->lg = malloc(sizeof(float) * cap * V);
    if (!b->lg) rc = k3c_errorf("out of memory");
    if (rc == K3C_OK) poison_f32(b->lg, cap * V);
    for (int j = 0; j < NR && rc == K3C_OK; j++) rc = k3c_request_open(e, &id[j]);
    k3c_step_item it[NR];
    for (int j = 0; j < NR; j++)
        it[j] = (k3c_step_item){.request = id[j], .tokens = prompts[j], .n = plen[j], .all_logits = 1};
    if (rc == K3C_OK) rc = k3c_engine_step(e, it, NR, b->lg);
    int32_t tok[NR];
    size_t at = 0;
    for (int j = 0; j < NR; j++) {
        at += (size_t)plen[j];
        tok[j] = rc == K3C_OK ? k3c_greedy_token(b->lg + (at - 1) * V, V) : 0;
    }
    if (rc == K3C_OK && l.dp > 1)
        for (int j = 0; j < NR && rc == K3C_OK; j++) /* least loaded, the lowest among equals: 0, 1, 0, 1 */
            if (k3c_engine_request_dp(e, id[j]) != j % l.dp)
                rc = k3c_errorf("request %d placed on DP rank %d", j, k3c_engine_request_dp(e, id[j]));
    for (int s = 0; s < MAXD && rc == K3C_OK; s++) {
        int n = 0, who[NR];
        for (int j = 0; j < NR; j++)
            if (s < ndec[j]) {
                b->stream[j][s] = tok[j];
                who[n] = j;
                it[n++] = (k3c_step_item){.request = id[j], .tokens = &tok[j], .n = 1};
            }
        rc = k3c_engine_step(e, it, n, b->lg + at * V);
        for (int i = 0; i < n && rc == K3C_OK; i++, at++) tok[who[i]] = k3c_greedy_token(b->lg + at * V, V);
    }
    b->rows = at;
    k3c_engine_stats st;
    k3c_engine_stats_get(e, &st);
    b->steps = st.steps;
    b->checked = k3c_engine_ranks_checked(e);
    char msg[1024] = "";
    if (rc != K3C_OK) snprintf(msg, sizeof msg, "%s", k3c_error_message());
    k3c_engine_free(e);
    return rc == K3C_OK ? K3C_OK : k3c_errorf("%s", msg);
}

static double worst_row(const batch *a, const batch *b, int V) {
    double w = 0;
    for (size_t i = 0; i < a->rows; i++) {
        double d = rel_l2_f32f32(a->lg + i * V, b->lg + i * V, (size_t)V);
        if (!(d <= w)) w = d;
    }
    return w;
}

static void layouts_case(int kimi_linear, int exact) {
    uint64_t seed = test_seed();
    k3c_model *m;
    char mname[64];
    snprintf(mname, sizeof mname, "layouts_%s_%d", kimi_linear ? "kl" : "k3", exact);
    CHECK_OK(lay_model(kimi_linear, seed, mname, 0, &m));
    k3c_model_info info;
    CHECK_OK(k3c_model_info_get(m, &info));
    int V = info.vocab_size;
    int32_t buf[NR][70], *prompts[NR];
    k3c_rng g;
    k3c_rng_seed(&g, seed ^ 0x1a7);
    for (int j = 0; j < NR; j++) {
        prompts[j] = buf[j];
        for (int i = 0; i < plen[j]; i++) buf[j][i] = (int32_t)(k3c_rng_next(&g) % (uint64_t)V);
    }
    const lay one = {1, 1, 1, 1}, tp2 = {2, 1, 1, 1};
    /* The hybrid {2, 1, 2, 4} is not among these: with the preset's top-k routing one seed
     * (35568420373665) put tiny K3's f32 hybrid 0.395 from world size 1 with identical streams. Its cause, seen
     * with the router's selections logged (k3c_route_margin beside each): one row's 4th expert was 13 at world
     * size 1 (margin 1.19e-7, one ulp of the selection score) and 6 in the hybrid (margin 0), whose attention
     * sums are TP's, reassociated: a routing near-tie, not a defect. The hybrid is held to its bounds under
     * dense routing below (layouts_engine_hybrid_*, no top-k to flip) and on the embedded model (the CLI test). */
    const lay cases[] = {{1, 2, 1, 1}, {1, 3, 1, 1}, {1, 1, 2, 2}, {1, 1, 2, 1},
                         {2, 2, 1, 1}, {1, 2, 2, 2}};
    batch ref, rtp, r32 = {0};
    int rc = batch_run(m, one, exact, prompts, &ref);
    if (rc == K3C_OK) rc = batch_run(m, tp2, exact, prompts, &rtp);
    /* bf16: the f32 function, for the hybrid's tolerance (its prompt rows, which every run computes from the same
     * tokens: no farther from it than 2x world size 1's own bf16 rows) */
    if (rc == K3C_OK && !exact) rc = batch_run(m, one, 1, prompts, &r32);
    size_t prompt_rows = 0;
    for (int j = 0; j < NR; j++) prompt_rows += (size_t)plen[j];
    const char *mn = kimi_linear ? "kimi-linear" : "k3";
    for (size_t c = 0; c < sizeof cases / sizeof cases[0] && rc == K3C_OK; c++) {
        lay l = cases[c];
        char ln[64];
        lay_name(l, ln, sizeof ln);
        batch r;
        rc = batch_run(m, l, exact, prompts, &r);
        if (rc != K3C_OK) {
            rc = k3c_errorf("%s: %s", ln, k3c_error_message());
            break;
        }
        const batch *want = l.tp > 1 ? &rtp : &ref;
        int hybrid = l.tp > 1 && l.ep > 1; /* TP attention (TP's sums), the MoE world size 1's: bitwise neither */
        int bitwise = r.rows == want->rows && !memcmp(r.lg, want->lg, sizeof(float) * r.rows * V);
        int same = !memcmp(r.stream, ref.stream, sizeof r.stream);
        double w = worst_row(&r, &ref, V);
        if (hybrid) {
            double own = 0, dist = 0;
            if (!exact) {
                batch rp = r, op = ref;
                rp.rows = op.rows = prompt_rows;
                dist = worst_row(&rp, &r32, V);
                own = worst_row(&op, &r32, V);
            }
            printf("    %s %s %s (hybrid): vs world size 1 worst row rel L2 %.3g", mn, exact ? "f32" : "bf16", ln, w);
            if (!exact) printf(", prompt rows vs the f32 function %.3g (world size 1's own %.3g)", dist, own);
            printf("; greedy streams %s; %ld of %ld steps compared across the ranks\n", same ? "identical" : "differ",
                   r.checked, r.steps);
            if (exact && !(w <= 1e-5)) rc = k3c_errorf("%s: rel L2 %.3g over 1e-5", ln, w);
            else if (exact && !same) rc = k3c_errorf("%s: greedy streams differ from world size 1's", ln);
            else if (!exact && !(dist <= 2 * own))
                rc = k3c_errorf("%s: %.3g from the f32 function, over 2 x %.3g", ln, dist, own);
            else if (r.checked != r.steps || r.steps != 1 + MAXD)
                rc = k3c_errorf("%s: %ld of %ld steps compared", ln, r.checked, r.steps);
            free(r.lg);
            continue;
        }
        printf("    %s %s %s: %zu logits rows %s %s; vs world size 1 worst row rel L2 %.3g; greedy streams %s; %ld of "
               "%ld steps compared across the ranks\n", mn, exact ? "f32" : "bf16", ln, r.rows,
               bitwise ? "bitwise" : "NOT bitwise", l.tp > 1 ? "TP 2's" : "world size 1's", w,
               same ? "identical" : "differ", r.checked, r.steps);
        if (!bitwise) rc = k3c_errorf("%s: logits not bitwise %s", ln, l.tp > 1 ? "TP 2's" : "world size 1's");
        else if (exact && !(w <= 1e-5)) rc = k3c_errorf("%s: rel L2 %.3g over 1e-5", ln, w);
        else if (exact && !same) rc = k3c_errorf("%s: greedy streams differ from world size 1's", ln);
        else if (r.checked != r.steps || r.steps != 1 + MAXD)
            rc = k3c_errorf("%s: %ld of %ld steps compared", ln, r.checked, r.steps);
        free(r.lg);
    }
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", k3c_error_message());
    free(ref.lg);
    free(rtp.lg);
    free(r32.lg);
    k3c_free(m);
    CHECKF(rc == K3C_OK, "%s %s: %s", mn, exact ? "f32" : "bf16", msg);
}

TEST(layouts_engine_k3_f32) { layouts_case(0, 1); }
TEST(layouts_engine_k3_bf16) { layouts_case(0, 0); }
TEST(layouts_engine_kimi_linear_f32) { layouts_case(1, 1); }
TEST(layouts_engine_kimi_linear_bf16) { layouts_case(1, 0); }

/* ---- the serving scheduler on DEP 2, PP 2 and the hybrid ---- */

enum { NJOBS = 6, SNEW = 20, PREFIX = 64 };

typedef struct sjob {
    int32_t prompt[PREFIX + 40];
    int n_prompt;
    int32_t out[SNEW];
    float gap[SNEW]; /* the greedy margin of each token (logprobs of the two best) */
    int n_out, finished;
    uint64_t id;
} sjob;

/* Every job through one scheduler over an engine of layout l: chunked prefill (48 tokens a step), three
 * requests at once on too few cache blocks (preemption), prefix hits (the even jobs share a 64-token prefix,
 * hinted), three prompt-lookup drafts a verify (verify steps and commits on the DP rank of the request), freed
 * blocks poisoned on every rank. */
static int sched_run(k3c_model *m, lay l, sjob *jobs, k3c_scheduler_stats *out, long *checked, long *steps,
                     long placed[2]) {
    k3c_engine_options o;
    lay_opts(&o, l, 1);
    o.max_requests = 3;
    o.max_rows = 64;
    o.max_context = PREFIX + 40 + SNEW;
    o.chunk_min = 16;
    o.mla_expand_min = 32;
    o.q_max = 4;
    o.poison_freed_blocks = 1;
    o.num_blocks = 12;
    k3c_engine *e = NULL;
    K3C_TRY(k3c_engine_create(m, &o, &e));
    k3c_engine_check_ranks(e, 1);
    k3c_scheduler_options so;
    k3c_scheduler_options_default(&so);
    so.max_seqs = 3;
    so.max_batched_tokens = 48;
    so.spec_tokens = 3;
    k3c_scheduler *s = NULL;
    int rc = k3c_scheduler_create(e, &so, &s);
    for (int j = 0; j < NJOBS && rc == K3C_OK; j++) {
        jobs[j].n_out = jobs[j].finished = 0;
        k3c_sched_request q = {.prompt = jobs[j].prompt, .n_prompt = jobs[j].n_prompt, .max_new = SNEW,
                               .ignore_eos = 1, .prefix_hint = j % 2 ? 0 : PREFIX, .user = &jobs[j]};
        q.sampling.logprobs = 2;
        if (k3c_scheduler_submit(s, &q, &jobs[j].id) != 0) rc = k3c_errorf("submit: %s", k3c_error_message());
    }
    int busy = 1, k = 0;
    while (rc == K3C_OK && busy) {
        const k3c_sched_event *ev;
        int n;
        rc = k3c_scheduler_step(s, &ev, &n, &busy);
        for (int i = 0; i < n && rc == K3C_OK; i++) {
            sjob *j = ev[i].user;
            if (ev[i].kind == K3C_SCHED_TOKEN && j->n_out < SNEW) {
                j->gap[j->n_out] = ev[i].n_top >= 2 ? ev[i].top_logprobs[0] - ev[i].top_logprobs[1] : 0;
                j->out[j->n_out++] = ev[i].token;
            }
            else if (ev[i].kind == K3C_SCHED_FINISHED && ev[i].finish == K3C_FINISH_ERROR)
                rc = k3c_errorf("job failed: %s", ev[i].message);
            else if (ev[i].kind == K3C_SCHED_FINISHED) j->finished = 1;
        }
        if (++k > 5000) rc = k3c_errorf("still busy after %d steps", k);
    }
    k3c_scheduler_stats_get(s, out);
    *checked = k3c_engine_ranks_checked(e);
    k3c_engine_stats est;
    k3c_engine_stats_get(e, &est);
    *steps = est.steps;
    placed[0] = k3c_engine_dp_placed(e, 0);
    placed[1] = k3c_engine_dp_placed(e, 1);
    char msg[1024] = "";
    if (rc != K3C_OK) snprintf(msg, sizeof msg, "%s", k3c_error_message());
    k3c_scheduler_free(s);
    k3c_engine_free(e);
    return rc == K3C_OK ? K3C_OK : k3c_errorf("%s", msg);
}

TEST(layouts_scheduler_matches_world_size_1) {
    uint64_t seed = test_seed();
    k3c_model *m;
    CHECK_OK(lay_model(0, seed, "layouts_sched", 0.05f, &m));
    k3c_model_info info;
    CHECK_OK(k3c_model_info_get(m, &info));
    uint64_t V = (uint64_t)info.vocab_size;
    static sjob a[NJOBS], b[NJOBS];
    k3c_rng g;
    k3c_rng_seed(&g, seed ^ 0xde9);
    int32_t prefix[PREFIX];
    for (int i = 0; i < PREFIX; i++) prefix[i] = (int32_t)(k3c_rng_next(&g) % V);
    /* even jobs: the shared prefix, then 4 .. 34 tokens of their own; odd ones: a prefix of their own; a prompt
     * ends with its own first tokens again, which the drafter then proposes */
    for (int j = 0; j < NJOBS; j++) {
        int own = 4 + 6 * j;
        for (int i = 0; i < PREFIX; i++) a[j].prompt[i] = j % 2 ? (int32_t)(k3c_rng_next(&g) % V) : prefix[i];
        for (int i = 0; i < own; i++) a[j].prompt[PREFIX + i] = (int32_t)(k3c_rng_next(&g) % V);
        a[j].n_prompt = PREFIX + own;
    }
    k3c_scheduler_stats sa;
    long ca, stepa, pa[2], pb[2];
    int rc = sched_run(m, (lay){1, 1, 1, 1}, a, &sa, &ca, &stepa, pa);
    /* DEP 2 and PP 2 bitwise world size 1; the hybrid within f32 rounding (a stream may part only at a near-tie
     * of world size 1's logits) */
    const lay cases[] = {{1, 1, 2, 2}, {1, 2, 1, 1}, {2, 1, 2, 4}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0] && rc == K3C_OK; c++) {
        int hybrid = cases[c].tp > 1;
        char ln[64];
        lay_name(cases[c], ln, sizeof ln);
        memcpy(b, a, sizeof b);
        k3c_scheduler_stats sb;
        long cb, stepb;
        rc = sched_run(m, cases[c], b, &sb, &cb, &stepb, pb);
        if (rc != K3C_OK) {
            rc = k3c_errorf("%s: %s", ln, k3c_error_message());
            break;
        }
        int equal = 0, ties = 0;
        for (int j = 0; j < NJOBS; j++) {
            if (!a[j].finished || !b[j].finished || a[j].n_out != SNEW || b[j].n_out != SNEW)
                rc = k3c_errorf("%s: job %d unfinished", ln, j);
            int t = 0;
            while (t < SNEW && a[j].out[t] == b[j].out[t]) t++;
            equal += t;
            if (t < SNEW && hybrid && a[j].gap[t] < 1e-4f) ties++;
            else if (t < SNEW && rc == K3C_OK)
                rc = k3c_errorf("%s: job %d parts from world size 1 at token %d (margin %g)", ln, j, t,
                                (double)a[j].gap[t]);
        }
        printf("    scheduler %s (f32): %d of %d tokens as world size 1 (%d parted at a near-tie); %ld steps (%ld "
               "world size 1), %ld compared across the ranks; drafts accepted %ld / %ld; prefix hits %ld tokens "
               "(%ld world size 1); preemptions %ld; admissions on DP ranks 0 / 1: %ld / %ld\n", ln, equal, NJOBS * SNEW, ties, stepb, stepa, cb,
               sb.spec_accepted_tokens, sb.spec_draft_tokens, sb.prefix_hits_tokens, sa.prefix_hits_tokens,
               sb.preemptions, pb[0], pb[1]);
        /* DEP: both DP ranks take requests (the odd jobs, with no cached prefix, go to the less loaded) */
        if (rc == K3C_OK && cases[c].dp > 1 && (pb[0] == 0 || pb[1] == 0))
            rc = k3c_errorf("%s: admissions on DP ranks 0 / 1: %ld / %ld", ln, pb[0], pb[1]);
        if (rc == K3C_OK && cb != stepb) rc = k3c_errorf("%s: %ld of %ld steps compared", ln, cb, stepb);
        /* the paths this test is for were taken (verifies ran; how many drafts are accepted depends on the seed) */
        if (rc == K3C_OK && !(sb.prefix_hits_tokens > 0 && sb.preemptions > 0 && sb.spec_draft_tokens > 0))
            rc = k3c_errorf("%s: prefix hits %ld, preemptions %ld, drafts %ld", ln, sb.prefix_hits_tokens,
                            sb.preemptions, sb.spec_draft_tokens);
    }
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", k3c_error_message());
    k3c_free(m);
    CHECKF(rc == K3C_OK, "%s", msg);
}

/* ---- the commands: generate, logits and run on the embedded k3-fortune ---- */

static size_t slurp(const char *path, void *buf, size_t cap) {
    FILE *f = fopen(path, "rb");
    if (!f) return 0;
    size_t n = fread(buf, 1, cap, f);
    fclose(f);
    return n;
}

/* `k3c ARGS LAYOUT > out` (stderr to err), or, where ARGS end in --out, `k3c ARGS out LAYOUT`; its exit
 * status. */
static int k3c_to(const char *k3c, const char *args, const char *layout, const char *out, const char *err) {
    char cmd[16384];
    size_t n = strlen(args);
    if (n > 5 && !strcmp(args + n - 5, "--out"))
        snprintf(cmd, sizeof cmd, "%s %s %s %s > /dev/null 2> %s", k3c, args, out, layout, err);
    else
        snprintf(cmd, sizeof cmd, "%s %s %s > %s 2> %s", k3c, args, layout, out, err);
    return test_run_status(cmd);
}

TEST(layouts_cli_pp_dep_equal_world_size_1) {
    char k3c[4096], dir[4200], a[4400], b[4400], err[4400];
    CHECK(test_k3c_binary(k3c, sizeof k3c));
    snprintf(dir, sizeof dir, "%s/layouts_cli", test_tmpdir());
    CHECK(mkdir(dir, 0755) == 0);
    snprintf(err, sizeof err, "%s/err.txt", dir);
    static char ta[1 << 18], tb[1 << 18];
    /* text: bf16 (the default) for the bitwise layouts, f32 for TP 2 x PP 2 against TP 1 */
    struct {
        const char *args, *layout, *ref;
    } same[] = {
        {"generate --prompt 'A penny saved is' -n 24 --ignore-eos", "--pp 2", "--tp 1"},
        {"generate --prompt 'A penny saved is' -n 24 --ignore-eos", "--dp 2 --ep", "--tp 1"},
        {"generate --prompt 'A penny saved is' -n 24 --ignore-eos", "--pp 2 --dp 2 --ep", "--tp 1"},
        {"generate --prompt 'A penny saved is' -n 24 --ignore-eos --exact-f32", "--tp 2 --pp 2", "--tp 1"},
        {"generate --prompt 'A penny saved is' -n 24 --ignore-eos --exact-f32", "--tp 2 --dp 2 --ep", "--tp 1"},
        {"generate --prompt 'A penny saved is' -n 24 --ignore-eos --exact-f32", "--tp 2 --pp 2 --dp 2 --ep", "--tp 1"},
        /* four requests of different lengths at once, drafts verified: DP loads uneven, a DP rank idle at the end */
        {"run --prompts '1,2,3;4,5,6,7,8,9,10,11,12,13,14;15;16,17,18,19,20' -n 8 --spec 2", "--dp 2 --ep", "--tp 1"},
        {"run --prompts '1,2,3;4,5,6,7,8,9,10,11,12,13,14;15;16,17,18,19,20' -n 8 --spec 2", "--pp 2", "--tp 1"},
        /* logits files, bitwise */
        {"logits --prompt-ids 5,9,2,7,7,1,3,8,4 --prefill 4 --out", "--pp 2", "--tp 1"},
        {"logits --prompt-ids 5,9,2,7,7,1,3,8,4 --prefill 4 --out", "--dp 2 --ep", "--tp 1"},
        {"logits --prompt-ids 5,9,2,7,7,1,3,8,4 --prefill 4 --out", "--tp 2 --pp 2", "--tp 2"},
        {"logits --prompt-ids 5,9,2,7,7,1,3,8,4 --prefill 4 --f32 --out", "--tp 2 --pp 2", "--tp 2"},
    };
    for (size_t i = 0; i < sizeof same / sizeof same[0]; i++) {
        snprintf(a, sizeof a, "%s/a%zu", dir, i);
        snprintf(b, sizeof b, "%s/b%zu", dir, i);
        CHECKF(k3c_to(k3c, same[i].args, same[i].ref, a, err) == 0, "%s %s", same[i].args, same[i].ref);
        int st = k3c_to(k3c, same[i].args, same[i].layout, b, err);
        char e[2048] = "";
        e[slurp(err, e, sizeof e - 1)] = 0;
        CHECKF(st == 0, "k3c %s %s: exit %d: %s", same[i].args, same[i].layout, st, e);
        size_t na = slurp(a, ta, sizeof ta), nb = slurp(b, tb, sizeof tb);
        /* run's last lines are timings: compare what comes before "steps:" */
        char *sa = strstr(ta, "steps:"), *sb = strstr(tb, "steps:");
        if (!strncmp(same[i].args, "run", 3) && sa && sb) na = (size_t)(sa - ta), nb = (size_t)(sb - tb);
        CHECKF(na > 8 && na == nb && !memcmp(ta, tb, na), "k3c %s: %s printed other output than %s (%s, %s)",
               same[i].args, same[i].layout, same[i].ref, a, b);
    }
    /* TP 2 x PP 2 and the hybrid with f32 activations: within 1e-5 of world size 1 */
    const char *lg = "logits --prompt-ids 5,9,2,7,7,1,3,8,4 --prefill 4 --f32 --out";
    snprintf(a, sizeof a, "%s/f1", dir);
    CHECK(k3c_to(k3c, lg, "--tp 1", a, err) == 0);
    size_t na = slurp(a, ta, sizeof ta);
    const char *within[] = {"--tp 2 --pp 2", "--tp 2 --dp 2 --ep"};
    for (int k = 0; k < 2; k++) {
        snprintf(b, sizeof b, "%s/f2_%d", dir, k);
        CHECK(k3c_to(k3c, lg, within[k], b, err) == 0);
        size_t nb = slurp(b, tb, sizeof tb);
        CHECKF(na == nb && na == sizeof(float) * 9 * 4096, "logits files of %zu and %zu bytes", na, nb);
        double w = 0;
        for (int r = 0; r < 9; r++) {
            double d = rel_l2_f32f32((const float *)tb + r * 4096, (const float *)ta + r * 4096, 4096);
            if (!(d <= w)) w = d;
        }
        printf("    k3c logits --f32 %s vs --tp 1: worst row rel L2 %.3g\n", within[k], w);
        CHECKF(w <= 1e-5, "%s: rel L2 %.3g", within[k], w);
    }
    /* the refused layouts: a message and a non-zero exit */
    struct {
        const char *layout, *want;
    } bad[] = {
        {"--tp 2 --ep", "without data parallelism"},
        {"--dp 2 --ep --tp 4", "does not divide the 2 KDA heads"},
        {"--dp 3 --ep", "ep 3 does not divide the 16 routed experts"},
        {"--pp 99", "more pipeline stages"},
        {"--ep", "--ep"},
        {"--tp 3", "does not divide"},
        {"--pp 2 --world-size 2 --rendezvous /nonexistent/rdv", "runs over NCCL on device cuda"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        snprintf(b, sizeof b, "%s/bad%zu", dir, i);
        int st = k3c_to(k3c, "generate --prompt-ids 1,2 -n 2", bad[i].layout, b, err);
        char e[2048] = "";
        e[slurp(err, e, sizeof e - 1)] = 0;
        CHECKF(st != 0 && strstr(e, bad[i].want) && slurp(b, tb, 1) == 0, "%s: exit %d, '%s'", bad[i].layout, st, e);
        printf("    generate %s: exit %d: %s", bad[i].layout, st, e);
    }
}

/* The hybrid in bf16 with dense routing (every expert selected: no routing near-tie can flip between a sum and
 * its split), the criterion of tests/test_tp.c: its prompt rows no farther from the f32 function than 2x world
 * size 1's own bf16 rows. */
static void hybrid_bf16(int kimi_linear) {
    uint64_t seed = test_seed();
    k3c_model *m;
    CHECK_OK(lay_model_routing(kimi_linear, 1, seed, kimi_linear ? "layouts_hyb_kl" : "layouts_hyb_k3", 0, &m));
    k3c_model_info info;
    CHECK_OK(k3c_model_info_get(m, &info));
    int V = info.vocab_size;
    int32_t buf[NR][70], *prompts[NR];
    k3c_rng g;
    k3c_rng_seed(&g, seed ^ 0x4b1d);
    size_t prompt_rows = 0;
    for (int j = 0; j < NR; j++) {
        prompts[j] = buf[j];
        prompt_rows += (size_t)plen[j];
        for (int i = 0; i < plen[j]; i++) buf[j][i] = (int32_t)(k3c_rng_next(&g) % (uint64_t)V);
    }
    batch f32 = {0}, one = {0}, tp = {0}, hyb = {0};
    int rc = batch_run(m, (lay){1, 1, 1, 1}, 1, prompts, &f32);
    if (rc == K3C_OK) rc = batch_run(m, (lay){1, 1, 1, 1}, 0, prompts, &one);
    if (rc == K3C_OK) rc = batch_run(m, (lay){2, 1, 1, 1}, 0, prompts, &tp);
    if (rc == K3C_OK) rc = batch_run(m, (lay){2, 1, 2, 4}, 0, prompts, &hyb);
    if (rc == K3C_OK) {
        f32.rows = one.rows = tp.rows = hyb.rows = prompt_rows;
        double own = worst_row(&one, &f32, V), dt = worst_row(&tp, &f32, V), dh = worst_row(&hyb, &f32, V);
        double vs1 = worst_row(&hyb, &one, V);
        printf("    %s bf16, dense routing, tp 2 x dp 2 +ep (hybrid): prompt rows vs world size 1's bf16 %.3g; vs the "
               "f32 function %.3g (world size 1's own %.3g, TP 2's %.3g); %ld of %ld steps compared across the ranks\n",
               kimi_linear ? "kimi-linear" : "k3", vs1, dh, own, dt, hyb.checked, hyb.steps);
        if (!(dh <= 2 * own)) rc = k3c_errorf("hybrid %.3g from the f32 function, over 2 x %.3g", dh, own);
        else if (hyb.checked != hyb.steps) rc = k3c_errorf("%ld of %ld steps compared", hyb.checked, hyb.steps);
    }
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", k3c_error_message());
    free(f32.lg), free(one.lg), free(tp.lg), free(hyb.lg);
    k3c_free(m);
    CHECKF(rc == K3C_OK, "%s", msg);
}

TEST(layouts_engine_hybrid_k3_bf16_dense_routing) { hybrid_bf16(0); }
TEST(layouts_engine_hybrid_kimi_linear_bf16_dense_routing) { hybrid_bf16(1); }

/* ---- a rank that fails or hangs mid-run ---- */

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static int collect_token(void *u, int32_t tok) {
    (void)u, (void)tok;
    return 0;
}

/* k3c_generate on layout l with the test fault of the last rank (a later stage, the idle DP rank's, a TP rank
 * of the idle group) at step 2; the message and the seconds the failing call took. */
static int faulty(k3c_model *m, lay l, int stall, int timeout_ms, char *msg, size_t cap, double *seconds) {
    k3c_engine_options o;
    lay_opts(&o, l, 0);
    o.max_requests = 1;
    o.max_context = 64;
    o.rank_timeout_ms = timeout_ms;
    k3c_engine *e = NULL;
    K3C_TRY(k3c_engine_create(m, &o, &e));
    int32_t prompt[6] = {1, 2, 3, 4, 5, 6};
    k3c_ranks_test_fault(l.tp * l.pp * l.dp - 1, 2, stall);
    double t0 = now_s();
    int rc = k3c_generate(e, prompt, 6, 16, NULL, collect_token, NULL, NULL);
    *seconds = now_s() - t0;
    k3c_ranks_test_fault(-1, 0, 0);
    snprintf(msg, cap, "%s", k3c_error_message());
    int failed = k3c_engine_failed(e);
    k3c_engine_free(e); /* joins the ranks: no hang */
    return rc == K3C_ERR && failed ? K3C_OK : k3c_errorf("generate succeeded despite the fault");
}

TEST(layouts_failed_rank_fails_the_group) {
    k3c_model *m;
    CHECK_OK(lay_model(0, 17, "layouts_fault", 0, &m));
    const lay cases[] = {{1, 2, 1, 1}, {1, 1, 2, 2}, {2, 1, 2, 4}};
    int rc = K3C_OK;
    char msg[2048], want[64];
    double s = 0;
    for (size_t c = 0; c < sizeof cases / sizeof cases[0] && rc == K3C_OK; c++) {
        lay l = cases[c];
        char ln[64];
        lay_name(l, ln, sizeof ln);
        int last = l.tp * l.pp * l.dp - 1;
        snprintf(want, sizeof want, "rank %d failed at step 2", last);
        /* an error: every rank's wait ends at once (abort), far inside the 20 s timeout */
        rc = faulty(m, l, 0, 20000, msg, sizeof msg, &s);
        if (rc == K3C_OK)
            printf("    %s, rank %d fails at step 2: generate failed in %.3f s: %.160s\n", ln, last, s, msg);
        if (rc == K3C_OK && !(strstr(msg, want) && strstr(msg, "test fault") && s < 5))
            rc = k3c_errorf("%s: %.2f s, '%s'", ln, s, msg);
        /* a hang: the others give up at the timeout (400 ms), not later */
        if (rc == K3C_OK) rc = faulty(m, l, 1, 400, msg, sizeof msg, &s);
        if (rc == K3C_OK)
            printf("    %s, rank %d hangs at step 2: generate failed in %.3f s: %.160s\n", ln, last, s, msg);
        if (rc == K3C_OK && !(strstr(msg, "failed at step 2") && strstr(msg, "timed out") && s >= 0.35 && s < 3))
            rc = k3c_errorf("%s hangs: %.2f s, '%s'", ln, s, msg);
    }
    char why[2048];
    snprintf(why, sizeof why, "%s", k3c_error_message());
    k3c_free(m);
    CHECKF(rc == K3C_OK, "%s", why);
}

/* ---- what the engine refuses ---- */

TEST(layouts_refused) {
    k3c_model *m;
    CHECK_OK(lay_model(0, 19, "layouts_refuse", 0, &m));
    int aux = 2;
    struct {
        lay l;
        int aux, world;
        const char *want;
    } cases[] = {
        {{1, 2, 1, 1}, 1, 0, "aux streams with pp 2"},
        {{1, 1, 2, 2}, 1, 0, "aux streams with dp 2"},
        {{1, 2, 1, 1}, 0, 2, "one process per rank runs over NCCL on device cuda"},
        {{1, 1, 2, 1}, 0, 2, "one process per rank runs over NCCL on device cuda"},
        {{1, 10, 1, 1}, 0, 0, "more pipeline stages than the model's 9 layers"},
        {{1, 1, 1, 3}, 0, 0, "spans the tp x dp = 1 ranks"},
        {{2, 1, 1, 2}, 0, 0, "without data parallelism"},
        {{1, 1, 3, 3}, 0, 0, "does not divide"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        k3c_engine_options o;
        lay_opts(&o, cases[i].l, 0);
        if (cases[i].aux) o.aux_layers = &aux, o.num_aux = 1;
        if (cases[i].world) o.world_size = cases[i].world, o.rendezvous = "/nonexistent/rdv";
        k3c_engine *e = NULL;
        int rc = k3c_engine_create(m, &o, &e);
        char msg[2048];
        snprintf(msg, sizeof msg, "%s", k3c_error_message());
        k3c_engine_free(e);
        if (rc != K3C_ERR || e || !strstr(msg, cases[i].want)) {
            k3c_free(m);
            CHECKF(0, "case %zu: rc %d, message '%s' (want '%s')", i, rc, msg, cases[i].want);
        }
    }
    k3c_free(m);
}

/* ---- the logits hand-off staged through backend memory (runtime/ranks.h k3c_rank_stage_rows) ----
 * Over NCCL the hand-off's rows go through a device buffer; here the same calls on CPU ranks, each rank's
 * "device" buffer its CPU backend's memory (the in-memory groups move it as NCCL would move device memory),
 * the staging forced on as a world of NCCL's would have it: tp 1 x pp 2 x dp 2, the last stage's rows to stage
 * 0 of each pipeline group (the root keeps its own, the others get every byte), DP rank 1's rows to rank 0,
 * the receive buffers poisoned first; a call past the staging fails on either end, naming both sizes. */
enum { HO_BYTES = 4000 };

typedef struct ho_rank {
    k3c_rank r;
    int rc, bad;
    char err[512];
} ho_rank;

static unsigned char ho_pattern(int from, int call, size_t i) { return (unsigned char)(from * 97 + call * 31 + i * 7 + 1); }

static void *ho_main(void *p) {
    ho_rank *h = p;
    k3c_rank *r = &h->r;
    k3c_backend *be = k3c_backend_cpu_create(1);
    unsigned char *buf = malloc(HO_BYTES + 64);
    int rc = be && buf ? k3c_rank_split(r) : K3C_ERR;
    if (rc == K3C_OK) {
        r->be = be;
        r->stage = be->alloc(be, 64); /* what k3c_rank_stage allocates over NCCL */
        r->stage_bytes = 64;
        rc = r->stage ? k3c_rank_stage_rows(r, HO_BYTES) : K3C_ERR;
        if (rc == K3C_OK && !r->rows_stage) rc = k3c_errorf("no rows staging with pp 2 x dp 2");
    }
    /* the last stage's rows to every stage */
    if (rc == K3C_OK) {
        int last = r->pp_stage == 1;
        for (size_t i = 0; i < HO_BYTES; i++) buf[i] = last ? ho_pattern(r->rank, 0, i) : 0xa5;
        rc = k3c_rank_pp_broadcast(r, buf, HO_BYTES);
        int from = r->dp_rank + 2; /* the last stage's rank of this pipeline group */
        for (size_t i = 0; i < HO_BYTES && rc == K3C_OK; i++) h->bad += buf[i] != ho_pattern(from, 0, i);
    }
    /* DP rank 1's first rank (rank 1) to rank 0, twice (the second of another size) */
    for (int call = 1; call <= 2 && rc == K3C_OK; call++) {
        size_t n = call == 1 ? HO_BYTES : 123;
        if (r->rank == 1) {
            for (size_t i = 0; i < n; i++) buf[i] = ho_pattern(1, call, i);
            rc = k3c_rank_send_rows(r, buf, n, 0);
        } else if (r->rank == 0) {
            memset(buf, 0xa5, HO_BYTES + 64);
            rc = k3c_rank_recv_rows(r, buf, n, 1);
            for (size_t i = 0; i < n && rc == K3C_OK; i++) h->bad += buf[i] != ho_pattern(1, call, i);
            for (size_t i = n; i < HO_BYTES + 64 && rc == K3C_OK; i++) h->bad += buf[i] != 0xa5;
        }
    }
    /* past the staging: refused on either end before anything moves (the engine then fails the group) */
    if (rc == K3C_OK && (r->rank == 0 || r->rank == 1)) {
        int st = r->rank == 1 ? k3c_rank_send_rows(r, buf, HO_BYTES + 1, 0) : k3c_rank_recv_rows(r, buf, HO_BYTES + 1, 1);
        if (st == K3C_OK) rc = k3c_errorf("rank %d: a hand-off past the staging passed", r->rank);
        else snprintf(h->err, sizeof h->err, "%s", k3c_error_message());
        k3c_error_clear();
    }
    if (rc != K3C_OK) {
        snprintf(h->err, sizeof h->err, "%s", k3c_error_message());
        k3c_rank_fail(r, 1, h->err);
    }
    h->rc = rc;
    k3c_rank_release(r); /* frees the stagings with r->be */
    if (be) be->destroy(be);
    free(buf);
    return NULL;
}

TEST(layouts_rows_handoff_staged) {
    k3c_layout l = {.tp = 1, .pp = 2, .dp = 2, .ep = 1, .dcp = 1};
    k3c_rank ranks[4];
    CHECK_OK(k3c_ranks_threads(&l, 2000, ranks));
    ho_rank h[4];
    pthread_t th[4];
    for (int r = 0; r < 4; r++) {
        memset(&h[r], 0, sizeof h[r]);
        h[r].r = ranks[r];
        CHECK(pthread_create(&th[r], NULL, ho_main, &h[r]) == 0);
    }
    for (int r = 0; r < 4; r++) pthread_join(th[r], NULL);
    for (int r = 0; r < 4; r++) {
        printf("    rank %d: %s%s%s\n", r, h[r].rc == K3C_OK ? "ok" : "failed", *h[r].err ? ": " : "", h[r].err);
        CHECKF(h[r].rc == K3C_OK && h[r].bad == 0, "rank %d: %d bytes differ: %s", r, h[r].bad, h[r].err);
    }
    CHECKF(strstr(h[1].err, "a send of 4001 bytes of logits rows, staging holds 4000"), "the sender: %s", h[1].err);
    CHECKF(strstr(h[0].err, "a receive of 4001 bytes of logits rows, staging holds 4000"), "rank 0: %s", h[0].err);
}
