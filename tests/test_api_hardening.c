/* The public API (include/k3c.h) under misuse and memory pressure: NULL handles and outputs are errors (free
 * functions no-ops), a failed cache allocation unwinds without a double free, and the memory plan reserves
 * what the options need, never more than the limit. The crash-prone cases run in a forked child, so that a
 * crash (or, under ASan, a report) is this test's failure and not the end of the run. */
#include <cjson/cJSON.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include "k3c.h"
#include "test.h"
#include "util/error.h"

/* Runs fn in a child: 0 when it exited 0, else writes what happened to msg. */
static int in_child(int (*fn)(void *), void *arg, char *msg, size_t n) {
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid < 0) return snprintf(msg, n, "fork failed"), -1;
    if (pid == 0) _exit(fn(arg));
    int st = 0;
    waitpid(pid, &st, 0);
    if (WIFEXITED(st) && WEXITSTATUS(st) == 0) return 0;
    if (WIFSIGNALED(st)) snprintf(msg, n, "the child died of signal %d", WTERMSIG(st));
    else snprintf(msg, n, "the child exited %d (the line of the failed check)", WEXITSTATUS(st) & 0xff);
    return -1;
}

static k3c_model *tiny_model(void) {
    static char dir[512];
    snprintf(dir, sizeof dir, "%s/api_tiny", test_tmpdir());
    k3c_model *m = NULL;
    if (access(dir, F_OK) != 0 && k3c_synthesize("tiny", test_seed(), dir) != 0) return NULL;
    if (k3c_load(dir, &m) != 0) return NULL;
    return m;
}

/* A child's check: exits with the line number (mod 256, never 0) when cond fails. */
#define EXPECT(cond)                                                                                               \
    do {                                                                                                           \
        if (!(cond)) {                                                                                             \
            fprintf(stderr, "    child: %s:%d: EXPECT(%s) failed (%s)\n", __FILE__, __LINE__, #cond,              \
                    k3c_last_error());                                                                             \
            return __LINE__ % 255 + 1;                                                                             \
        }                                                                                                          \
    } while (0)
#define EXPECT_ERR(call) EXPECT((call) == -1 && k3c_last_error()[0])

static int null_calls(void *arg) {
    (void)arg;
    k3c_model *m = tiny_model();
    EXPECT(m);
    k3c_model *mo = NULL;
    EXPECT_ERR(k3c_load(NULL, &mo));
    EXPECT_ERR(k3c_load("", &mo));
    EXPECT(mo == NULL);
    EXPECT_ERR(k3c_load(test_tmpdir(), NULL));
    k3c_free(NULL);
    EXPECT_ERR(k3c_synthesize(NULL, 1, test_tmpdir()));
    EXPECT_ERR(k3c_synthesize("tiny", 1, NULL));
    EXPECT_ERR(k3c_synthesize("tiny", 1, ""));

    k3c_engine_options_default(NULL);
    k3c_engine *e = NULL;
    EXPECT_ERR(k3c_engine_create(NULL, NULL, &e));
    EXPECT(e == NULL);
    EXPECT_ERR(k3c_engine_create(m, NULL, NULL));
    k3c_engine_free(NULL);
    EXPECT_ERR(k3c_engine_vocab(NULL));
    EXPECT_ERR(k3c_engine_max_rows(NULL));
    EXPECT_ERR(k3c_engine_hidden_size(NULL));
    k3c_engine_memory mm;
    EXPECT_ERR(k3c_engine_memory_get(NULL, &mm));
    int id = 0;
    EXPECT_ERR(k3c_request_open(NULL, &id));
    EXPECT_ERR(k3c_request_close(NULL, 0));
    EXPECT_ERR(k3c_request_length(NULL, 0));
    EXPECT_ERR(k3c_request_commit(NULL, 0, 0));
    k3c_step_item it = {0};
    float lg[4];
    EXPECT_ERR(k3c_engine_step(NULL, &it, 1, lg));
    EXPECT(k3c_engine_logits_alloc(NULL, 1) == NULL);
    k3c_engine_logits_free(NULL, NULL);
    EXPECT_ERR(k3c_step_logits_rows(NULL, 2));
    EXPECT(k3c_step_logits_rows(NULL, 0) == 0);
    EXPECT_ERR(k3c_engine_aux(NULL, 0, lg, NULL));

    EXPECT_ERR(k3c_sampler_create(NULL, 10, NULL));
    EXPECT_ERR(k3c_sampler_sample(NULL, lg));
    k3c_sampler_free(NULL);
    EXPECT_ERR(k3c_greedy_token(NULL, 4));
    k3c_generate_stats gs;
    EXPECT_ERR(k3c_generate(NULL, (int32_t[]){1}, 1, 1, NULL, NULL, NULL, &gs));

    k3c_runner_options_default(NULL);
    k3c_runner *r = NULL;
    EXPECT_ERR(k3c_runner_create(NULL, NULL, &r));
    EXPECT(r == NULL);
    k3c_runner_free(NULL);
    int h;
    k3c_runner_request q = {.prompt = (int32_t[]){1}, .n_prompt = 1, .max_new = 1, .stop_token = -1};
    EXPECT_ERR(k3c_runner_submit(NULL, &q, &h));
    int busy;
    EXPECT_ERR(k3c_runner_step(NULL, &busy));
    EXPECT_ERR(k3c_runner_run(NULL));
    const int32_t *toks;
    int nt, fin;
    EXPECT_ERR(k3c_runner_output(NULL, 0, &toks, &nt, &fin));
    k3c_runner_stats rs;
    k3c_runner_stats_get(NULL, &rs);
    EXPECT(rs.steps == 0);
    k3c_runner_stats_get(NULL, NULL);

    /* NULL outputs and lists on live handles */
    k3c_engine_options o;
    k3c_engine_options_default(&o);
    o.max_requests = 2;
    o.max_context = 32;
    EXPECT(k3c_engine_create(m, &o, &e) == 0);
    EXPECT_ERR(k3c_request_open(e, NULL));
    EXPECT_ERR(k3c_engine_step(e, NULL, 1, lg));
    EXPECT_ERR(k3c_engine_memory_get(e, NULL));
    EXPECT(k3c_engine_step(e, NULL, 0, NULL) == 0); /* an empty step is a no-op */
    EXPECT(k3c_runner_create(e, NULL, &r) == 0);
    EXPECT_ERR(k3c_runner_submit(r, NULL, &h));
    EXPECT_ERR(k3c_runner_submit(r, &q, NULL));
    EXPECT_ERR(k3c_runner_step(r, NULL));
    EXPECT_ERR(k3c_runner_output(r, 0, NULL, &nt, &fin));
    k3c_runner_free(r);
    k3c_engine_free(e);
    k3c_free(m);
    return 0;
}

TEST(hardening_api_null_arguments) {
    char msg[256];
    CHECKF(in_child(null_calls, NULL, msg, sizeof msg) == 0, "%s", msg);
}

/* k3c_generate with a NULL sampling struct is greedy: the stream of an explicit {temperature 0}. */
static int collect(void *user, int32_t tok) {
    int32_t **p = user;
    *(*p)++ = tok;
    return 0;
}

static int generate_null_sampling(void *arg) {
    (void)arg;
    k3c_model *m = tiny_model();
    EXPECT(m);
    k3c_engine *e = NULL;
    k3c_engine_options o;
    k3c_engine_options_default(&o);
    o.max_requests = 1;
    o.max_context = 64;
    EXPECT(k3c_engine_create(m, &o, &e) == 0);
    int32_t prompt[3] = {1, 17, 42}, a[16], b[16], *pa = a, *pb = b;
    k3c_sampling greedy = {.temperature = 0, .top_p = 1};
    EXPECT(k3c_generate(e, prompt, 3, 16, NULL, collect, &pa, NULL) == 0);
    EXPECT(k3c_generate(e, prompt, 3, 16, &greedy, collect, &pb, NULL) == 0);
    EXPECT(pa - a == 16 && pb - b == 16 && !memcmp(a, b, sizeof a));
    k3c_engine_free(e);
    k3c_free(m);
    return 0;
}

TEST(hardening_api_generate_null_sampling_is_greedy) {
    char msg[256];
    CHECKF(in_child(generate_null_sampling, NULL, msg, sizeof msg) == 0, "%s", msg);
}

/* A cache allocation the device refuses (k3c_kv_cache_init failing after its host arrays were allocated)
 * unwinds cleanly: the engine frees each array once and returns the error. The reservation is past any
 * address space (2^26-token blocks), so it fails on every machine; the explicit memory_limit lets it through
 * the plan. Under ASan this needs allocator_may_return_null=1 (make asan-test sets it). */
static int failed_cache_alloc(void *arg) {
    (void)arg;
    k3c_model *m = tiny_model();
    EXPECT(m);
    k3c_engine_options o;
    k3c_engine_options_default(&o);
    o.max_requests = 1;
    o.max_context = 64;
    o.block_size = 1 << 26;
    o.num_blocks = 1 << 20;
    o.memory_limit = (size_t)1 << 62;
    k3c_engine *e = NULL;
    EXPECT(k3c_engine_create(m, &o, &e) == -1 && e == NULL);
    EXPECT(strstr(k3c_last_error(), "kv cache"));
    /* the engine after it is whole: a fresh one creates and runs */
    k3c_engine_options_default(&o);
    o.max_requests = 1;
    o.max_context = 8;
    EXPECT(k3c_engine_create(m, &o, &e) == 0);
    int32_t tok = 1;
    int32_t *p = &tok, out[2];
    p = out;
    EXPECT(k3c_generate(e, &tok, 1, 2, NULL, collect, &p, NULL) == 0);
    k3c_engine_free(e);
    k3c_free(m);
    return 0;
}

TEST(hardening_api_failed_cache_alloc_no_double_free) {
    char msg[256];
    CHECKF(in_child(failed_cache_alloc, NULL, msg, sizeof msg) == 0, "%s", msg);
}

/* The memory plan: the reservation is the MLA cache of max_requests x max_context tokens (in blocks) plus the
 * KDA state, computed here from the config as the spec lays it out (latent = kv_lora_rank + qk_rope_head_dim
 * f32 per token per MLA layer on the CPU backend); a limit one byte short refuses with the options named, the
 * exact need is accepted and reported. */
TEST(hardening_engine_memory_plan) {
    char dir[512];
    snprintf(dir, sizeof dir, "%s/plan_tiny", test_tmpdir());
    CHECK_OK(k3c_synthesize("tiny", test_seed(), dir));
    k3c_model *m = NULL;
    CHECK_OK(k3c_load(dir, &m));
    /* the config, read back from the file (not from the engine under test) */
    char cfg[600];
    snprintf(cfg, sizeof cfg, "%s/config.json", dir);
    FILE *f = fopen(cfg, "r");
    CHECK(f);
    char text[1 << 15];
    size_t n = fread(text, 1, sizeof text - 1, f);
    text[n] = 0;
    fclose(f);
    cJSON *root = cJSON_Parse(text), *tc = cJSON_GetObjectItem(root, "text_config");
    CHECK(root && tc);
    int kv_lora = cJSON_GetObjectItem(tc, "kv_lora_rank")->valueint;
    int rope = cJSON_GetObjectItem(tc, "qk_rope_head_dim")->valueint;
    cJSON *lac = cJSON_GetObjectItem(tc, "linear_attn_config");
    int n_mla = cJSON_GetArraySize(cJSON_GetObjectItem(lac, "full_attn_layers"));
    cJSON_Delete(root);
    CHECK(n_mla > 0 && kv_lora > 0 && rope > 0);
    k3c_engine_options o;
    k3c_engine_options_default(&o);
    o.max_requests = 3;
    o.max_context = 100; /* 7 blocks of 16 */
    k3c_engine *e = NULL;
    CHECK_OK(k3c_engine_create(m, &o, &e));
    k3c_engine_memory mm;
    CHECK_OK(k3c_engine_memory_get(e, &mm));
    CHECK(mm.max_requests == 3 && mm.max_context == 100 && mm.cache_tokens == 3 * 7 * 16);
    CHECKF(mm.kv_bytes == (size_t)3 * 7 * 16 * (kv_lora + rope) * 4 * n_mla, "kv %zu", mm.kv_bytes);
    CHECK(mm.kda_bytes > 0 && mm.cache_bytes == mm.kv_bytes + mm.kda_bytes);
    CHECK(mm.limit >= mm.cache_bytes && mm.limit_source && mm.limit_source[0]);
    size_t need = mm.cache_bytes;
    k3c_engine_free(e);
    e = NULL;
    o.memory_limit = need - 1;
    CHECK(k3c_engine_create(m, &o, &e) != 0 && e == NULL);
    CHECKF(strstr(k3c_last_error(), "max_requests 3 x max_context 100") && strstr(k3c_last_error(), "memory limit"),
           "%s", k3c_last_error());
    o.memory_limit = need;
    CHECK_OK(k3c_engine_create(m, &o, &e));
    CHECK_OK(k3c_engine_memory_get(e, &mm));
    CHECK(mm.cache_bytes == need && mm.limit == need && !strcmp(mm.limit_source, "memory_limit"));
    /* a request past max_context is refused with the option named */
    int id;
    CHECK_OK(k3c_request_open(e, &id));
    int32_t toks[101] = {0};
    for (int i = 0; i < 101; i++) toks[i] = 1 + i % 7;
    k3c_step_item it = {.request = id, .tokens = toks, .n = 101};
    float *lg = malloc(sizeof(float) * (size_t)k3c_engine_vocab(e));
    CHECK(lg);
    CHECK(k3c_engine_step(e, &it, 1, lg) != 0 && strstr(k3c_last_error(), "max_context is 100"));
    free(lg);
    k3c_engine_free(e);
    /* max_context 0: 4096, within the model's context */
    k3c_engine_options_default(&o);
    o.max_requests = 1;
    CHECK_OK(k3c_engine_create(m, &o, &e));
    CHECK_OK(k3c_engine_memory_get(e, &mm));
    CHECK(mm.max_context == 4096);
    k3c_engine_free(e);
    k3c_free(m);
}
