/* Batch-invariant greedy decoding (docs/DESIGN.md, "Batch invariance"; include/k3c.h): on every preset that
 * synthesizes, with bf16 activations (the default path), a request's greedy stream must be the same token for
 * token whether it runs
 *   - alone (k3c_generate, the reference), and alone on an engine of max_rows = one grid and one thread,
 *   - in a runner batch beside requests of other lengths, without and with speculation (spec 3),
 *   - two at a time with later joins, spec 2 and a prefill budget that is no multiple of the grid,
 *   - through k3c_engine_step directly: its prompt cut at random allowed positions (the rule as DESIGN.md
 *     states it, written out here), beside noise requests whose prompts are cut anywhere, and decoded by a
 *     random mix of decode steps and verify steps (drafts right or wrong, greedy acceptance, commit).
 * Each comparison counts the streams that differ from the alone ones and asserts that none does; the counts
 * are printed. Fresh random weights and prompts every run (test_seed). The last test runs the CLI itself
 * (`k3c run`, the command of issue 27) with --max-requests 1 / 4 / 50 and --spec 0 / 3. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "k3c.h"
#include "synth_preset.h"
#include "test.h"
#include "util/error.h"
#include "util/rng.h"

#define INV_MAXREQ 4
#define INV_NOISE 2
#define INV_MAXNEW 12
#define INV_QMAX 4

typedef struct inv_case {
    const char *preset;
    int chunk_min, mla_expand_min; /* the engine's blocks; 0 = the defaults */
    int C, E;                      /* the blocks in effect (DESIGN.md): KDA and MLA */
    int nreq, lens[INV_MAXREQ], max_new;
} inv_case;

typedef struct inv_env {
    const inv_case *c;
    char dir[512];
    k3c_model *m;
    k3c_engine *e;
    int V, max_rows;
    int32_t *prompt[INV_MAXREQ];
    int32_t alone[INV_MAXREQ][INV_MAXNEW];
} inv_env;

static void inv_close(inv_env *env) {
    k3c_engine_free(env->e);
    k3c_free(env->m);
    for (int i = 0; i < INV_MAXREQ; i++) free(env->prompt[i]);
}

static int inv_open(inv_env *env, const inv_case *c, uint64_t seed) {
    memset(env, 0, sizeof *env);
    env->c = c;
    snprintf(env->dir, sizeof env->dir, "%s/invariance-%s", test_tmpdir(), c->preset);
    K3C_TRY(test_synth_preset(c->preset, 0, seed, env->dir));
    K3C_TRY(k3c_load(env->dir, &env->m));
    int longest = 0;
    for (int i = 0; i < c->nreq; i++) longest = c->lens[i] > longest ? c->lens[i] : longest;
    k3c_engine_options o;
    k3c_engine_options_default(&o);
    o.threads = 2;
    o.max_requests = c->nreq + INV_NOISE;
    o.max_rows = env->max_rows = 256;
    o.max_context = longest + c->max_new + INV_QMAX + 8 > 72 ? longest + c->max_new + INV_QMAX + 8 : 72; /* noise: 64 */
    o.block_size = 8; /* cache blocks crossed everywhere */
    o.q_max = INV_QMAX;
    o.chunk_min = c->chunk_min;
    o.mla_expand_min = c->mla_expand_min;
    K3C_TRY(k3c_engine_create(env->m, &o, &env->e));
    env->V = k3c_engine_vocab(env->e);
    k3c_rng r;
    k3c_rng_seed(&r, seed ^ 0x1a7a);
    for (int i = 0; i < c->nreq; i++) {
        env->prompt[i] = malloc(sizeof(int32_t) * (size_t)c->lens[i]);
        if (!env->prompt[i]) return k3c_errorf("out of memory");
        for (int t = 0; t < c->lens[i]; t++) env->prompt[i][t] = (int32_t)(k3c_rng_next(&r) % (uint64_t)env->V);
    }
    return K3C_OK;
}

typedef struct collect {
    int32_t *t;
    int n;
} collect;
static int collect_token(void *u, int32_t tok) {
    collect *c = u;
    c->t[c->n++] = tok;
    return 0;
}

/* The reference: each request alone. */
static int run_alone(inv_env *env) {
    k3c_sampling greedy = {.top_p = 1};
    for (int i = 0; i < env->c->nreq; i++) {
        collect col = {env->alone[i], 0};
        K3C_TRY(k3c_generate(env->e, env->prompt[i], env->c->lens[i], env->c->max_new, &greedy, collect_token, &col,
                             NULL));
        if (col.n != env->c->max_new) return k3c_errorf("request %d alone: %d tokens", i, col.n);
    }
    return K3C_OK;
}

static int count_differ(const inv_env *env, int32_t got[INV_MAXREQ][INV_MAXNEW]) {
    int differ = 0;
    for (int i = 0; i < env->c->nreq; i++)
        differ += memcmp(got[i], env->alone[i], sizeof(int32_t) * (size_t)env->c->max_new) != 0;
    return differ;
}

/* Each request alone again on another engine over the same model: max_rows = the grid (k3c_generate's prompt
 * chunks one grid each) and one thread (the CPU's split of every op changes). */
static int run_alone_small(inv_env *env, int grid, int *differ) {
    const inv_case *c = env->c;
    k3c_engine_options o;
    k3c_engine_options_default(&o);
    o.threads = 1;
    o.max_requests = 1;
    o.max_rows = grid;
    o.max_context = 72;
    for (int i = 0; i < c->nreq; i++)
        if (c->lens[i] + c->max_new + 8 > o.max_context) o.max_context = c->lens[i] + c->max_new + 8;
    o.block_size = 8;
    o.q_max = INV_QMAX < grid ? INV_QMAX : grid;
    o.chunk_min = c->chunk_min;
    o.mla_expand_min = c->mla_expand_min;
    k3c_engine *e;
    K3C_TRY(k3c_engine_create(env->m, &o, &e));
    k3c_sampling greedy = {.top_p = 1};
    int32_t got[INV_MAXREQ][INV_MAXNEW];
    int rc = K3C_OK;
    for (int i = 0; i < c->nreq && rc == K3C_OK; i++) {
        collect col = {got[i], 0};
        rc = k3c_generate(e, env->prompt[i], c->lens[i], c->max_new, &greedy, collect_token, &col, NULL);
    }
    k3c_engine_free(e);
    K3C_TRY(rc);
    *differ = count_differ(env, got);
    return K3C_OK;
}

/* The whole workload through a runner; *differ = streams unlike the alone ones. */
static int run_runner(inv_env *env, int spec, int budget, int max_active, int *differ) {
    k3c_runner_options o;
    k3c_runner_options_default(&o);
    o.spec_tokens = spec;
    o.prefill_budget = budget;
    o.max_active = max_active;
    k3c_runner *r;
    K3C_TRY(k3c_runner_create(env->e, &o, &r));
    int h[INV_MAXREQ], rc = K3C_OK;
    for (int i = 0; i < env->c->nreq && rc == K3C_OK; i++) {
        k3c_runner_request q = {.prompt = env->prompt[i], .n_prompt = env->c->lens[i], .max_new = env->c->max_new,
                                .sampling = {.top_p = 1}, .stop_token = -1};
        rc = k3c_runner_submit(r, &q, &h[i]);
    }
    if (rc == K3C_OK) rc = k3c_runner_run(r);
    int32_t got[INV_MAXREQ][INV_MAXNEW];
    for (int i = 0; i < env->c->nreq && rc == K3C_OK; i++) {
        const int32_t *t;
        int n, fin;
        rc = k3c_runner_output(r, h[i], &t, &n, &fin);
        if (rc == K3C_OK && (!fin || n != env->c->max_new))
            rc = k3c_errorf("request %d: %d tokens, finished %d", i, n, fin);
        if (rc == K3C_OK) memcpy(got[i], t, sizeof(int32_t) * (size_t)n);
    }
    k3c_runner_free(r);
    if (rc == K3C_OK) *differ = count_differ(env, got);
    return rc;
}

/* The cut rule of docs/DESIGN.md, written out: a prompt ending at `end` may be cut at p when p is the end, or,
 * for each block U in effect, p is a multiple of U or lies at or past the prompt's last multiple of U. */
static int allowed_cut(const inv_case *c, int p, int end) {
    if (p == end) return 1;
    const int units[2] = {c->C, c->E};
    for (int i = 0; i < 2; i++)
        if (units[i] > 0 && p % units[i] != 0 && p < end / units[i] * units[i]) return 0;
    return 1;
}

static int rnd_int(k3c_rng *r, int lo, int hi) { return lo + (int)(k3c_rng_next(r) % (uint64_t)(hi - lo + 1)); }

/* Greedy id of a logits row (first largest). */
static int32_t argmax(const float *row, int V) { return k3c_greedy_token(row, V); }

typedef struct dreq {
    int id, done, n_out;
    int32_t out[INV_MAXNEW];
    int32_t win[1 + INV_QMAX];
} dreq;

/* The workload through k3c_engine_step directly, all requests at once with two noise requests, in random
 * steps: each request takes part in a step or not (at random), a prompt piece ends at a random allowed cut
 * within what the step has left, a decoding request decodes one token or verifies 1 + d tokens whose drafts
 * are its alone stream's next tokens, each replaced by a wrong one with probability 1/3; noise requests
 * take prompt pieces of 1..40 tokens cut anywhere and start over when full. */
static int run_direct(inv_env *env, uint64_t seed, int *differ) {
    const inv_case *c = env->c;
    int V = env->V, nreq = c->nreq, rc = K3C_OK;
    k3c_rng r;
    k3c_rng_seed(&r, seed);
    dreq q[INV_MAXREQ];
    int noise[INV_NOISE], noise_len[INV_NOISE];
    int32_t noise_tok[INV_NOISE][64];
    memset(q, 0, sizeof q);
    for (int i = 0; i < nreq; i++) K3C_TRY(k3c_request_open(env->e, &q[i].id));
    for (int k = 0; k < INV_NOISE; k++) {
        K3C_TRY(k3c_request_open(env->e, &noise[k]));
        noise_len[k] = 0;
    }
    float *logits = malloc(sizeof(float) * (size_t)env->max_rows * V);
    if (!logits) return k3c_errorf("out of memory");
    k3c_step_item items[INV_MAXREQ + INV_NOISE];
    int kind[INV_MAXREQ + INV_NOISE], who[INV_MAXREQ + INV_NOISE];
    for (int steps = 0; rc == K3C_OK; steps++) {
        int busy = 0;
        for (int i = 0; i < nreq; i++) busy |= q[i].n_out < c->max_new;
        if (!busy) break;
        if (steps > 4000) {
            rc = k3c_errorf("direct run: no progress");
            break;
        }
        int n = 0, rows = 0;
        for (int i = 0; i < nreq; i++) {
            dreq *d = &q[i];
            int left = env->max_rows - rows;
            if (d->n_out >= c->max_new || rnd_int(&r, 0, 3) == 0) continue;
            if (d->done < c->lens[i]) {
                int hi = c->lens[i] - d->done < left ? c->lens[i] - d->done : left, m = 0;
                if (hi <= 0) continue;
                for (int tries = 0; tries < 8 && !m; tries++) {
                    int t = rnd_int(&r, 1, hi);
                    if (allowed_cut(c, d->done + t, c->lens[i])) m = t;
                }
                if (!m) continue;
                items[n] = (k3c_step_item){.request = d->id, .tokens = env->prompt[i] + d->done, .n = m};
                kind[n] = 0;
            } else {
                int need = c->max_new - d->n_out, dd = rnd_int(&r, 0, INV_QMAX - 1);
                if (dd > need - 1) dd = need - 1;
                if (1 + dd > left) continue;
                d->win[0] = d->out[d->n_out - 1];
                for (int j = 0; j < dd; j++) {
                    int32_t right = env->alone[i][d->n_out + j];
                    d->win[1 + j] = rnd_int(&r, 0, 2) ? right : (int32_t)((right + 1 + rnd_int(&r, 0, V - 2)) % V);
                }
                items[n] = (k3c_step_item){.request = d->id, .tokens = d->win, .n = 1 + dd, .verify = dd > 0};
                kind[n] = dd > 0 ? 2 : 1;
            }
            who[n] = i;
            rows += items[n].n;
            n++;
        }
        for (int k = 0; k < INV_NOISE; k++) {
            int left = env->max_rows - rows, m = rnd_int(&r, 1, 40);
            if (m > left || rnd_int(&r, 0, 2) == 0) continue;
            if (noise_len[k] + m > 64) {
                K3C_TRY(k3c_request_close(env->e, noise[k]));
                K3C_TRY(k3c_request_open(env->e, &noise[k]));
                noise_len[k] = 0;
            }
            for (int t = 0; t < m; t++) noise_tok[k][noise_len[k] + t] = (int32_t)rnd_int(&r, 0, V - 1);
            items[n] = (k3c_step_item){.request = noise[k], .tokens = noise_tok[k] + noise_len[k], .n = m,
                                       .all_logits = rnd_int(&r, 0, 1)};
            noise_len[k] += m;
            kind[n] = 3;
            who[n] = k;
            rows += m;
            n++;
        }
        if (n == 0) continue;
        rc = k3c_engine_step(env->e, items, n, logits);
        size_t row = 0;
        for (int s = 0; s < n && rc == K3C_OK; s++) {
            dreq *d = kind[s] == 3 ? NULL : &q[who[s]];
            if (kind[s] == 3) {
                row += items[s].all_logits ? (size_t)items[s].n : 1;
            } else if (kind[s] == 0) {
                d->done += items[s].n;
                if (d->done == c->lens[who[s]]) d->out[d->n_out++] = argmax(logits + row * V, V);
                row++;
            } else if (kind[s] == 1) {
                d->out[d->n_out++] = argmax(logits + row * V, V);
                row++;
            } else {
                int dd = items[s].n - 1, acc = 0;
                int32_t next = -1;
                for (int j = 0; j <= dd; j++) {
                    next = argmax(logits + (row + (size_t)j) * V, V);
                    if (j == dd || next != items[s].tokens[1 + j]) break;
                    acc++;
                }
                row += (size_t)items[s].n;
                rc = k3c_request_commit(env->e, d->id, 1 + acc);
                for (int j = 0; j < acc; j++) d->out[d->n_out++] = items[s].tokens[1 + j];
                d->out[d->n_out++] = next;
            }
        }
    }
    free(logits);
    for (int i = 0; i < nreq; i++) k3c_request_close(env->e, q[i].id);
    for (int k = 0; k < INV_NOISE; k++) k3c_request_close(env->e, noise[k]);
    K3C_TRY(rc);
    int32_t got[INV_MAXREQ][INV_MAXNEW];
    for (int i = 0; i < nreq; i++) memcpy(got[i], q[i].out, sizeof got[i]);
    *differ = count_differ(env, got);
    return K3C_OK;
}

static void check_case(const inv_case *c) {
    uint64_t seed = test_seed() ^ k3c_hash_str(c->preset);
    inv_env env;
    int rc = inv_open(&env, c, seed);
    CHECKF(rc == K3C_OK, "%s: %s", c->preset, k3c_error_message());
    CHECK_OK(run_alone(&env));
    int grid = c->E > 0 ? c->E : c->C, total = 0, d;
    struct {
        const char *what;
        int spec, budget, max_active;
    } runs[] = {
        {"runner, every request at once", 0, 0, 0},
        {"runner, every request at once, spec 3", 3, 0, 0},
        {"runner, 2 at a time, spec 2, prefill budget 1.5 grids", 2, grid + grid / 2, 2},
    };
    CHECK_OK(run_alone_small(&env, grid, &d));
    printf("    %s, alone, engine of max_rows %d (one grid) and 1 thread: %d of %d streams differ from alone\n",
           c->preset, grid, d, c->nreq);
    total += d;
    for (size_t k = 0; k < sizeof runs / sizeof runs[0]; k++) {
        CHECK_OK(run_runner(&env, runs[k].spec, runs[k].budget, runs[k].max_active, &d));
        printf("    %s, %s: %d of %d streams differ from alone\n", c->preset, runs[k].what, d, c->nreq);
        total += d;
    }
    CHECK_OK(run_direct(&env, seed + 17, &d));
    printf("    %s, engine steps, random allowed prompt cuts + noise requests + decode / verify mix: %d of %d streams "
           "differ from alone\n", c->preset, d, c->nreq);
    total += d;
    CHECKF(total == 0, "%s: %d streams differ in all (seed %llu)", c->preset, total, (unsigned long long)test_seed());
    inv_close(&env);
}

/* tiny on the default blocks (C = 64, E = 128): a prompt with a whole MLA block, a whole KDA block after it
 * and a ragged tail, one ending 3 rows past a block, one without any whole block. The other presets on
 * smaller blocks (mini: E = 12 rounded up to a multiple of C = 8), so that short prompts cross several
 * blocks and the test stays fast (mini's prefill runs at ~60 tokens/s on 2 threads). */
static const inv_case cases[] = {
    {"tiny", 0, 0, 64, 128, 4, {200, 131, 40, 9}, INV_MAXNEW},
    {"tiny-grouped", 16, 32, 16, 32, 4, {75, 40, 17, 5}, INV_MAXNEW},
    {"mini", 8, 12, 8, 16, 3, {40, 19, 6}, 6},
    {"kimi-linear-tiny", 16, 32, 16, 32, 4, {81, 32, 47, 3}, INV_MAXNEW},
};

TEST(invariance_tiny) { check_case(&cases[0]); }
TEST(invariance_tiny_grouped) { check_case(&cases[1]); }
TEST(invariance_mini) { check_case(&cases[2]); }
TEST(invariance_kimi_linear_tiny) { check_case(&cases[3]); }

/* k3c_engine_prompt_piece against the rule written out above: the largest allowed cut within max_tokens. */
TEST(invariance_prompt_piece_rule) {
    inv_env env;
    int rc = inv_open(&env, &cases[1], test_seed());
    CHECKF(rc == K3C_OK, "%s", k3c_error_message());
    CHECK(k3c_engine_prompt_grid(env.e) == 32);
    k3c_rng r;
    k3c_rng_seed(&r, test_seed() ^ 0x91ece);
    for (int it = 0; it < 20000; it++) {
        int end = rnd_int(&r, 1, 300), pos = rnd_int(&r, 0, end - 1), max = rnd_int(&r, 1, 80);
        int want = 0;
        for (int m = 1; m <= max && pos + m <= end; m++)
            if (allowed_cut(&cases[1], pos + m, end)) want = m;
        int got = k3c_engine_prompt_piece(env.e, pos, end, max);
        CHECKF(got == want, "pos %d end %d max %d: %d, want %d", pos, end, max, got, want);
        if (max >= 32) CHECKF(got > 0, "pos %d end %d max %d: no piece", pos, end, max);
    }
    inv_close(&env);
}

/* The CLI command of issue 27: `k3c run` on tiny with 8 random prompts (5..150 tokens), greedy, with
 * --max-requests 8 against 2 and against --spec 3: every request's output line identical. */
TEST(invariance_cli_run_tiny) {
    char bin[512];
    CHECK(test_k3c_binary(bin, sizeof bin));
    char dir[600];
    snprintf(dir, sizeof dir, "%s/invariance-cli-tiny", test_tmpdir());
    CHECK_OK(test_synth_preset("tiny", 0, test_seed() ^ 0xc11, dir));
    k3c_rng r;
    k3c_rng_seed(&r, test_seed() ^ 0xc12);
    static char prompts[8 * 150 * 5 + 32];
    size_t off = 0;
    for (int i = 0; i < 8; i++) {
        int n = rnd_int(&r, 5, 150);
        for (int t = 0; t < n; t++)
            off += (size_t)snprintf(prompts + off, sizeof prompts - off, "%s%d", t ? "," : (i ? ";" : ""),
                                    rnd_int(&r, 0, 1023));
    }
    char ppath[700];
    snprintf(ppath, sizeof ppath, "%s/prompts.txt", dir);
    FILE *f = fopen(ppath, "w");
    CHECK(f && fputs(prompts, f) >= 0 && fclose(f) == 0);
    static const char *args[] = {"--max-requests 8", "--max-requests 2", "--max-requests 8 --spec 3"};
    static char out0[1 << 16], out[1 << 16];
    int differ = 0;
    for (size_t k = 0; k < sizeof args / sizeof args[0]; k++) {
        char cmd[4096], opath[700];
        snprintf(opath, sizeof opath, "%s/out%zu.txt", dir, k);
        snprintf(cmd, sizeof cmd, "%s run --model %s --prompts \"$(cat %s)\" -n 12 %s > %s 2>/dev/null", bin, dir,
                 ppath, args[k], opath);
        CHECKF(test_run_status(cmd) == 0, "%s failed", cmd);
        FILE *g = fopen(opath, "r");
        CHECK(g);
        char *dst = k ? out : out0;
        size_t len = fread(dst, 1, (1 << 16) - 1, g);
        fclose(g);
        dst[len] = 0;
        CHECK(strstr(dst, "request 7 ") != NULL);
        if (k == 0) continue;
        /* line by line: one request a line */
        int d = 0;
        const char *a = out0, *b = out;
        while (*a || *b) {
            const char *ea = strchr(a, '\n'), *eb = strchr(b, '\n');
            size_t la = ea ? (size_t)(ea - a) : strlen(a), lb = eb ? (size_t)(eb - b) : strlen(b);
            d += la != lb || memcmp(a, b, la) != 0;
            a += la + (ea != NULL);
            b += lb + (eb != NULL);
        }
        printf("    k3c run %s: %d of 8 streams differ from %s\n", args[k], d, args[0]);
        differ += d;
    }
    CHECKF(differ == 0, "%d streams differ", differ);
}
