/* The embedded k3-fortune model on CUDA (tests/k3_fortune.h): the held-out perplexity of the CPU engine, the
 * CUDA stock forward (prompt steps), and the specialized decode executor fed one token a step (decode) and q
 * tokens a step (uniform verify, all committed), each teacher-forced, beside the trainer's PyTorch number
 * (models/k3-fortune/metrics.json): every path within 1 % of it. The engine's counters show that the decode
 * and verify steps really ran on the executor. Then the greedy golden (tests/fixtures/k3_fortune_greedy.json,
 * the CPU's and the trainer's continuation) on CUDA stock, on the executor through k3c_generate, and through
 * the runner (greedy ids taken on the device). Public API only. */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../test.h"
#include "../k3_fortune.h"
#include "util/error.h"

#define VERIFY_Q 4

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int open_engine(k3c_model *m, const char *device, int specialized, int window, k3c_engine **e) {
    k3c_engine_options o;
    k3c_engine_options_default(&o);
    o.device = device;
    o.specialized = specialized;
    o.max_requests = 1;
    o.max_rows = window;
    o.max_context = window + 64; /* and room for the greedy golden's prompt and tokens */
    o.q_max = 8;
    K3C_TRY(k3c_engine_create(m, &o, e));
    return specialized == K3C_SPECIALIZED_ON ? k3c_engine_warmup(*e) : K3C_OK;
}

static int load_fortune(k3c_model **m, k3c_tokenizer **t) {
    char dir[4096];
    if (fortune_path(dir, sizeof dir, "models/k3-fortune")) return K3C_ERR;
    K3C_TRY(k3c_load(dir, m));
    return k3c_tokenizer_load(dir, t);
}

TEST(gpu_fortune_perplexity) {
    fortune_ref ref;
    CHECKF(fortune_reference(&ref) == 0, "models/k3-fortune/metrics.json: no held-out perplexity");
    k3c_model *m = NULL;
    k3c_tokenizer *t = NULL;
    CHECK_OK(load_fortune(&m, &t));
    k3c_tokens ids = {0};
    CHECK(fortune_heldout(t, &ids) == 0 && (long)ids.n == ref.heldout_tokens);
    char names[4][64] = {"cpu (prompt steps)", "cuda stock (prompt steps)", "cuda specialized, decode (1 a step)"};
    snprintf(names[3], sizeof names[3], "cuda specialized, verify (%d a step)", VERIFY_Q);
    double ppl[4];
    for (int path = 0; path < 4; path++) {
        k3c_engine *e = NULL;
        int spec = path >= 2 ? K3C_SPECIALIZED_ON : K3C_SPECIALIZED_OFF;
        CHECK_OK(open_engine(m, path == 0 ? "cpu" : "cuda", spec, ref.window, &e));
        fortune_mode mode = path < 2 ? FORTUNE_PROMPT : path == 2 ? FORTUNE_DECODE : FORTUNE_VERIFY;
        k3c_engine_stats before, after;
        k3c_engine_stats_get(e, &before);
        double nll, t0 = now_s();
        long scored;
        fortune_steps st;
        CHECK_OK(fortune_nll(e, ids.ids, ids.n, ref.window, mode, VERIFY_Q, &nll, &scored, &st));
        double secs = now_s() - t0;
        k3c_engine_stats_get(e, &after);
        long exec = after.executor_steps - before.executor_steps,
             dec = after.route_steps[1] - before.route_steps[1], ver = after.route_steps[2] - before.route_steps[2];
        ppl[path] = exp(nll / scored);
        printf("\n    %-44s perplexity %.4f (%+.3f%% vs the trainer), %ld scored, %ld prompt / %ld decode / %ld "
               "verify steps, %ld on the executor (planned decode %ld, verify %ld), %.1f s",
               names[path], ppl[path], 100 * (ppl[path] / ref.exported - 1), scored, st.prompt, st.decode,
               st.verify, exec, dec, ver, secs);
        k3c_engine_free(e);
        CHECKF(scored == ref.scored, "%s: %ld tokens scored, the trainer %ld", names[path], scored, ref.scored);
        /* every decode and verify step on the executor (the prompt steps never are) */
        if (path >= 2) {
            CHECKF(after.specialized == 1 && exec == st.decode + st.verify && dec == st.decode && ver == st.verify,
                   "%s: %ld executor steps, planned decode %ld / verify %ld, for %ld decode + %ld verify steps",
                   names[path], exec, dec, ver, st.decode, st.verify);
            CHECK(path == 2 ? st.verify == 0 && st.decode > 0 : st.verify > 0);
        } else {
            CHECK(exec == 0);
        }
    }
    printf("\n    trainer (PyTorch, exported checkpoint, fp32 compute) %.4f\n", ref.exported);
    for (int path = 0; path < 4; path++)
        CHECKF(fabs(ppl[path] / ref.exported - 1) < 0.01, "%s: perplexity %.4f, the trainer's %.4f: more than 1%% "
               "apart", names[path], ppl[path], ref.exported);
    k3c_tokens_free(&ids);
    k3c_tokenizer_free(t);
    k3c_free(m);
}

static int collect(void *user, int32_t tok) {
    int32_t *out = user;
    out[++out[0]] = tok;
    return 0;
}

/* The position of the first difference, or -1. */
static int first_diff(const int32_t *a, const int32_t *b, int n) {
    for (int i = 0; i < n; i++)
        if (a[i] != b[i]) return i;
    return -1;
}

TEST(gpu_fortune_greedy_golden) {
    fortune_golden g;
    CHECKF(fortune_golden_load(&g) == 0, "tests/fixtures/k3_fortune_greedy.json");
    k3c_model *m = NULL;
    k3c_tokenizer *t = NULL;
    CHECK_OK(load_fortune(&m, &t));
    for (int spec = 0; spec < 2; spec++) {
        k3c_engine *e = NULL;
        CHECK_OK(open_engine(m, "cuda", spec ? K3C_SPECIALIZED_ON : K3C_SPECIALIZED_OFF, 64, &e));
        int32_t got[257] = {0};
        CHECK_OK(k3c_generate(e, g.prompt_ids, g.n_prompt, g.n, NULL, collect, got, NULL));
        k3c_engine_stats st;
        k3c_engine_stats_get(e, &st);
        int d = got[0] == g.n ? first_diff(got + 1, g.ids, g.n) : 0;
        printf("\n    k3c_generate on cuda %s: %d tokens, %s; %ld steps, %ld on the executor", spec ? "specialized" : "stock",
               got[0], d < 0 ? "the golden" : "differs", st.steps, st.executor_steps);
        CHECKF(d < 0, "cuda %s: token %d is %d, the golden %d", spec ? "specialized" : "stock", d, got[1 + d], g.ids[d]);
        /* the decode steps after the prompt on the executor (its graphs were captured by the warmup) */
        CHECKF(spec ? st.executor_steps > 0 && st.executor_steps == st.route_steps[1] : st.executor_steps == 0,
               "%ld executor steps, %ld planned decode", st.executor_steps, st.route_steps[1]);
        if (spec) {
            /* the runner: greedy ids taken on the device */
            k3c_runner_options ro;
            k3c_runner_options_default(&ro);
            k3c_runner *r = NULL;
            CHECK_OK(k3c_runner_create(e, &ro, &r));
            k3c_runner_request q = {.prompt = g.prompt_ids, .n_prompt = g.n_prompt, .max_new = g.n, .stop_token = -1};
            int h;
            CHECK_OK(k3c_runner_submit(r, &q, &h));
            CHECK_OK(k3c_runner_run(r));
            const int32_t *out;
            int n, fin;
            CHECK_OK(k3c_runner_output(r, h, &out, &n, &fin));
            k3c_engine_stats_get(e, &st);
            d = n == g.n ? first_diff(out, g.ids, g.n) : 0;
            printf("\n    runner on cuda specialized: %d tokens, %s; %ld greedy-id steps", n,
                   d < 0 ? "the golden" : "differs", st.greedy_id_steps);
            CHECKF(d < 0, "runner: token %d is %d, the golden %d", d, out[d], g.ids[d]);
            CHECK(st.greedy_id_steps > 0);
            k3c_runner_free(r);
        }
        k3c_engine_free(e);
    }
    printf("\n");
    /* the golden's text is what those ids decode to */
    char *text = NULL;
    size_t len = 0;
    CHECK_OK(k3c_tokenizer_decode(t, g.ids, (size_t)g.n, &text, &len));
    CHECK(len == strlen(g.text) && !memcmp(text, g.text, len));
    free(text);
    k3c_tokenizer_free(t);
    k3c_free(m);
}
