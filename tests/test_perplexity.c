/* The embedded k3-fortune model as a correctness test on the CPU: the engine's held-out perplexity against the
 * trainer's own PyTorch evaluation of the exported checkpoint (models/k3-fortune/metrics.json), through
 * `k3c perplexity` on the whole held-out text; the command's protocol against an in-process computation
 * (tests/k3_fortune.h: prompt, decode and verify steps); the greedy continuation of a fixed prompt against the
 * committed golden (which is also the trainer's sample); the command's argument errors. */
#include <limits.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "test.h"
#include "k3_fortune.h"
#include "util/error.h"

#define HELDOUT "tools/train_k3/data/heldout.txt"

/* Runs `k3c ARGS` (shell syntax, from the repository root) with stdin from /dev/null: stdout and stderr into
 * malloc'd strings; the exit status. */
static int run_k3c(const char *args, char **out, char **err) {
    char bin[PATH_MAX], root[PATH_MAX], cmd[4 * PATH_MAX + 4096];
    *out = *err = NULL;
    if (!test_k3c_binary(bin, sizeof bin) || fortune_path(root, sizeof root, "")) return -2;
    snprintf(cmd, sizeof cmd, "cd '%s' && '%s' %s </dev/null >'%s/ppl_out.txt' 2>'%s/ppl_err.txt'", root, bin, args,
             test_tmpdir(), test_tmpdir());
    int st = test_run_status(cmd);
    char path[PATH_MAX + 32];
    for (int k = 0; k < 2; k++) {
        snprintf(path, sizeof path, "%s/ppl_%s.txt", test_tmpdir(), k ? "err" : "out");
        FILE *f = fopen(path, "rb");
        char *buf = calloc(1 << 16, 1);
        if (f && buf) buf[fread(buf, 1, (1 << 16) - 1, f)] = 0;
        if (f) fclose(f);
        *(k ? err : out) = buf;
    }
    return st;
}

/* The value after `key` in the command's output, NAN when absent. */
static double field(const char *out, const char *key) {
    const char *p = out ? strstr(out, key) : NULL;
    return p ? strtod(p + strlen(key), NULL) : NAN;
}

TEST(perplexity_cpu_matches_trainer) {
    fortune_ref ref;
    CHECKF(fortune_reference(&ref) == 0, "models/k3-fortune/metrics.json: no held-out perplexity");
    char args[256], *out, *err;
    snprintf(args, sizeof args, "perplexity --file " HELDOUT " --window %d", ref.window);
    int st = run_k3c(args, &out, &err);
    CHECKF(st == 0, "k3c %s: exit %d: %s", args, st, err);
    double ppl = field(out, "perplexity: "), scored = field(out, "scored: "), tokens = field(out, "tokens: ");
    printf("\n    k3c cpu %.4f, trainer (exported checkpoint, PyTorch fp32 compute) %.4f: %+.3f%% (fp32 weights %.4f, "
           "PTQ %.4f, QAT %.4f); %.0f tokens scored; %s",
           ppl, ref.exported, 100 * (ppl / ref.exported - 1), ref.fp32, ref.ptq, ref.qat, scored,
           strstr(out, "speed: ") ? strstr(out, "speed: ") + 7 : "\n");
    CHECKF(tokens == ref.heldout_tokens && scored == ref.scored, "%.0f tokens, %.0f scored; the trainer: %ld, %ld",
           tokens, scored, ref.heldout_tokens, ref.scored);
    CHECKF(fabs(ppl / ref.exported - 1) < 0.01, "perplexity %.4f, the trainer's %.4f: more than 1%% apart", ppl,
           ref.exported);
    free(out);
    free(err);
}

/* `k3c perplexity` on the first 1100 held-out tokens (windows 512, 512, 76) against the same windows run in
 * process as prompt steps (pieces of 512 rows, where the command cuts at 256: batch invariance makes them the
 * same logits), as decode steps and as verify steps of 4; and --window 300 gives windows of 300. */
TEST(perplexity_cli_protocol_in_process) {
    char dir[PATH_MAX];
    CHECK(fortune_path(dir, sizeof dir, "models/k3-fortune") == 0);
    k3c_model *m = NULL;
    CHECK_OK(k3c_load(dir, &m));
    k3c_tokenizer *t = NULL;
    CHECK_OK(k3c_tokenizer_load(dir, &t));
    k3c_tokens ids = {0};
    CHECK(fortune_heldout(t, &ids) == 0 && ids.n > 1100);
    k3c_engine_options o;
    k3c_engine_options_default(&o);
    o.max_requests = 1;
    o.max_rows = 512;
    o.max_context = 512;
    k3c_engine *e = NULL;
    CHECK_OK(k3c_engine_create(m, &o, &e));
    static const struct {
        int n, window;
    } runs[] = {{1100, 512}, {700, 300}};
    for (int k = 0; k < 2; k++) {
        double nll[3];
        long scored[3];
        fortune_steps st[3];
        for (int mode = 0; mode < 3; mode++)
            CHECK_OK(fortune_nll(e, ids.ids, (size_t)runs[k].n, runs[k].window, (fortune_mode)mode, 4, &nll[mode],
                                 &scored[mode], &st[mode]));
        int windows = (runs[k].n + runs[k].window - 1) / runs[k].window;
        CHECK(scored[0] == runs[k].n - windows && scored[1] == scored[0] && scored[2] == scored[0]);
        CHECK(st[0].prompt == windows && st[1].prompt == windows && st[1].verify == 0 && st[2].verify > 0);
        char args[256], *out, *err;
        snprintf(args, sizeof args, "perplexity --file " HELDOUT " --max-tokens %d --window %d --threads 2",
                 runs[k].n, runs[k].window);
        int rc = run_k3c(args, &out, &err);
        CHECKF(rc == 0, "k3c %s: exit %d: %s", args, rc, err);
        const char *tot = strstr(out, "(total ");
        double cli = tot ? strtod(tot + 7, NULL) : NAN;
        printf("%s    %d tokens, windows of %d: NLL k3c perplexity %.3f, in process: prompt %.3f, decode %.3f, "
               "verify q=4 %.3f", k ? "\n" : "\n", runs[k].n, runs[k].window, cli, nll[0], nll[1], nll[2]);
        CHECKF(field(out, "scored: ") == scored[0], "%s", out);
        CHECK_CLOSE(cli, nll[0], 2e-3, 1e-6);
        /* decode and verify: the same model through other kernels forms (recurrent KDA, absorbed MLA) */
        CHECK_CLOSE(nll[1], nll[0], 0, 2e-3);
        CHECK_CLOSE(nll[2], nll[0], 0, 2e-3);
        free(out);
        free(err);
    }
    printf("\n");
    k3c_engine_free(e);
    k3c_tokens_free(&ids);
    k3c_tokenizer_free(t);
    k3c_free(m);
}

/* The README's first command on the embedded model: greedy from a fixed prompt prints the committed text,
 * whose ids are the trainer's own greedy sample (PyTorch, fp32 weights) of the same prompt. */
TEST(perplexity_greedy_golden) {
    fortune_golden g;
    CHECKF(fortune_golden_load(&g) == 0, "tests/fixtures/k3_fortune_greedy.json");
    char args[8192], *out, *err;
    snprintf(args, sizeof args, "generate --prompt '%s' -n %d", g.prompt, g.n);
    int st = run_k3c(args, &out, &err);
    CHECKF(st == 0, "k3c %s: exit %d: %s", args, st, err);
    size_t len = strlen(g.text);
    CHECKF(!strncmp(out, g.text, len) && !strcmp(out + len, "\n"), "k3c %s printed [%s], the golden is [%s]", args,
           out, g.text);
    free(out);
    free(err);
    /* the ids, and the trainer's */
    char list[4096];
    size_t l = 0;
    for (int i = 0; i < g.n_prompt; i++) l += (size_t)snprintf(list + l, sizeof list - l, i ? ",%d" : "%d", g.prompt_ids[i]);
    snprintf(args, sizeof args, "generate --prompt-ids %s -n %d", list, g.n);
    CHECK(run_k3c(args, &out, &err) == 0);
    char *p = out;
    for (int i = 0; i < g.n; i++) {
        char *end;
        long id = strtol(p, &end, 10);
        CHECKF(end != p && id == g.ids[i], "id %d: %ld, the golden %d", i, end != p ? id : -1L, g.ids[i]);
        p = end;
    }
    free(out);
    free(err);
    char *metrics = fortune_slurp("models/k3-fortune/metrics.json");
    cJSON *root = metrics ? cJSON_Parse(metrics) : NULL;
    free(metrics);
    CHECK(root);
    const cJSON *s0 = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(root, "samples"), 0);
    int32_t trainer[256];
    int n = fortune_ids(cJSON_GetObjectItemCaseSensitive(s0, "greedy_ids"), trainer, 256);
    const cJSON *prompt = cJSON_GetObjectItemCaseSensitive(s0, "prompt");
    int same = cJSON_IsString(prompt) && !strcmp(prompt->valuestring, g.prompt) && n == g.n &&
               !memcmp(trainer, g.ids, sizeof(int32_t) * (size_t)n);
    cJSON_Delete(root);
    CHECKF(same, "the golden is not the trainer's greedy sample of \"%s\"", g.prompt);
}

/* Each bad argument exits non-zero with a message naming it, before any scoring. */
TEST(perplexity_cli_errors) {
    char notok[PATH_MAX], one[PATH_MAX], empty[PATH_MAX];
    snprintf(notok, sizeof notok, "%s/ppl_no_tokenizer", test_tmpdir());
    snprintf(one, sizeof one, "%s/ppl_one.txt", test_tmpdir());
    snprintf(empty, sizeof empty, "%s/ppl_empty.txt", test_tmpdir());
    CHECK(mkdir(notok, 0755) == 0);
    CHECK_OK(k3c_default_model_write(notok));
    char rm[PATH_MAX + 64];
    snprintf(rm, sizeof rm, "%s/tiktoken.model", notok);
    CHECK(unlink(rm) == 0);
    FILE *f = fopen(one, "w");
    CHECK(f && fputs("a", f) >= 0 && fclose(f) == 0);
    f = fopen(empty, "w");
    CHECK(f && fclose(f) == 0);
    char cases[12][PATH_MAX + 128], expect[12][PATH_MAX + 128];
    int n = 0;
#define CASE(a, x)                                                                                                 \
    snprintf(cases[n], sizeof cases[n], "%s", a), snprintf(expect[n], sizeof expect[n], "%s", x), n++
    CASE("perplexity", "--file F is required");
    CASE("perplexity --file /no/such/file", "cannot open /no/such/file");
    snprintf(cases[n], sizeof cases[n], "perplexity --file '%s'", empty);
    snprintf(expect[n], sizeof expect[n], "--file %s is empty", empty), n++;
    snprintf(cases[n], sizeof cases[n], "perplexity --file '%s'", one);
    snprintf(expect[n], sizeof expect[n], "gives 1 token: perplexity needs at least 2"), n++;
    snprintf(cases[n], sizeof cases[n], "perplexity --model '%s' --file " HELDOUT, notok);
    snprintf(expect[n], sizeof expect[n], "%s has no tokenizer files", notok), n++;
    CASE("perplexity --file " HELDOUT " --window 1", "--window: '1' is not an integer in 2..");
    CASE("perplexity --file " HELDOUT " --window x", "--window: 'x' is not an integer");
    CASE("perplexity --file " HELDOUT " --window 2000000", "--window 2000000 is longer than the model's context "
                                                           "length 1048576");
    CASE("perplexity --file " HELDOUT " --max-tokens 1", "--max-tokens: '1' is not an integer in 2..");
    CASE("perplexity --file " HELDOUT " --model x --preset tiny", "--model x and --preset tiny: give one of them");
    CASE("perplexity --file " HELDOUT " --device tpu", "--device: 'tpu' is not cpu or cuda");
    CASE("perplexity --file " HELDOUT " --bogus", "unexpected argument '--bogus'");
#undef CASE
    for (int i = 0; i < n; i++) {
        char *out, *err;
        int st = run_k3c(cases[i], &out, &err);
        CHECKF(st > 0 && strstr(err, expect[i]) && !strstr(out, "perplexity:"), "k3c %s: exit %d, stderr \"%s\" lacks "
               "\"%s\"", cases[i], st, err, expect[i]);
        free(out);
        free(err);
    }
}
