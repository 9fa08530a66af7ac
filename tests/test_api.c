/* The public API of include/k3c.h beyond stepping: the version, error kinds, the log and progress
 * callbacks, model inspection, the routing decision and its counts on an engine without the executor,
 * greedy steps, NULL safety of the new calls, and (CUDA-enabled builds) cuBLASLt loaded only when used.
 * Expectations are written from the header's contracts and from the model's config as config.json states
 * it (a synthesized tiny checkpoint, fresh seed per run), not from the code under test. */
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "k3c.h"
#include "model/presets.h"
#include "test.h"
#include "util/error.h"
#include "util/log.h"
#include "util/rng.h"

#ifdef K3C_HAVE_CUDA
#include "cuda/cublaslt.h"
#endif

TEST(api_version) {
    CHECK(strcmp(k3c_version(), K3C_VERSION_STRING) == 0);
    char want[64];
    snprintf(want, sizeof want, "%d.%d.%d", K3C_VERSION_MAJOR, K3C_VERSION_MINOR, K3C_VERSION_PATCH);
    CHECK(strcmp(K3C_VERSION_STRING, want) == 0);
    CHECK(K3C_VERSION_NUMBER == K3C_VERSION_MAJOR * 10000 + K3C_VERSION_MINOR * 100 + K3C_VERSION_PATCH);
    char bin[1024], cmd[2048], out[256] = "";
    CHECK(test_k3c_binary(bin, sizeof bin));
    snprintf(cmd, sizeof cmd, "'%s' --version > '%s/version.txt'", bin, test_tmpdir());
    CHECK(test_run_status(cmd) == 0);
    snprintf(cmd, sizeof cmd, "%s/version.txt", test_tmpdir());
    FILE *f = fopen(cmd, "r");
    CHECK(f != NULL);
    CHECK(fgets(out, sizeof out, f) != NULL);
    fclose(f);
    snprintf(want, sizeof want, "k3c %s (", K3C_VERSION_STRING);
    CHECKF(strncmp(out, want, strlen(want)) == 0, "k3c --version printed '%s'", out);
}

TEST(api_error_kinds) {
    k3c_error_clear();
    CHECK(k3c_last_error_kind() == K3C_ERROR_NONE);
    /* a directory that does not exist: its config.json cannot be opened */
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/no-such-model", test_tmpdir());
    k3c_model *m = (k3c_model *)1;
    CHECK(k3c_load(dir, &m) != K3C_OK);
    CHECK(m == NULL);
    CHECKF(k3c_last_error_kind() == K3C_ERROR_IO, "missing checkpoint: kind %s (%s)",
           k3c_error_kind_name(k3c_last_error_kind()), k3c_last_error());
    /* writing where no directory can be made */
    CHECK(k3c_synthesize("tiny", 1, "/proc/k3c-cannot-be-here") != K3C_OK);
    CHECKF(k3c_last_error_kind() == K3C_ERROR_IO, "synthesize into /proc: kind %s (%s)",
           k3c_error_kind_name(k3c_last_error_kind()), k3c_last_error());
    /* bad arguments */
    CHECK(k3c_synthesize("no-such-preset", 1, dir) != K3C_OK);
    CHECK(k3c_last_error_kind() == K3C_ERROR_INPUT);
    CHECK(k3c_load(NULL, &m) != K3C_OK && k3c_last_error_kind() == K3C_ERROR_INPUT);
    CHECK(k3c_load(dir, NULL) != K3C_OK && k3c_last_error_kind() == K3C_ERROR_INPUT);
    /* the kind survives added context, and an explicit kind is kept */
    k3c_errorf_kind(K3C_ERROR_OOM, "inner");
    k3c_error_context("outer");
    CHECK(k3c_last_error_kind() == K3C_ERROR_OOM);
    CHECK(strcmp(k3c_last_error(), "outer: inner") == 0);
    k3c_errorf("plain");
    CHECK(k3c_last_error_kind() == K3C_ERROR_INPUT);
    k3c_error_clear();
    CHECK(k3c_last_error_kind() == K3C_ERROR_NONE);
    static const char *const names[] = {"none", "input", "out of memory", "device", "io", "internal"};
    for (int k = K3C_ERROR_NONE; k <= K3C_ERROR_INTERNAL; k++)
        CHECK(strcmp(k3c_error_kind_name((k3c_error_kind)k), names[k]) == 0);
    CHECK(strcmp(k3c_error_kind_name((k3c_error_kind)99), "?") == 0);
}

/* ---- a synthesized tiny model shared by the tests below ---- */

static int tiny_model(const char *tag, k3c_model **m, char *dir, size_t n) {
    snprintf(dir, n, "%s/api-%s", test_tmpdir(), tag);
    K3C_TRY(k3c_synthesize("tiny", test_seed() ^ 0xa91, dir));
    return k3c_load(dir, m);
}

static k3c_engine *cpu_engine(k3c_model *m, int max_requests) {
    k3c_engine_options o;
    k3c_engine_options_default(&o);
    o.threads = 2;
    o.max_requests = max_requests;
    o.max_context = 96;
    o.max_rows = 64;
    k3c_engine *e = NULL;
    return k3c_engine_create(m, &o, &e) == K3C_OK ? e : NULL;
}

TEST(api_error_kind_oom_and_device) {
    k3c_model *m = NULL;
    char dir[1024];
    CHECK_OK(tiny_model("kinds", &m, dir, sizeof dir));
    k3c_engine *e = cpu_engine(m, 1);
    CHECK(e != NULL);
    /* 2^30 rows of logits: far more host memory than any machine gives one buffer */
    float *big = k3c_engine_logits_alloc(e, 1 << 30);
    CHECK(big == NULL);
    CHECKF(k3c_last_error_kind() == K3C_ERROR_OOM, "2^30 logits rows: kind %s (%s)",
           k3c_error_kind_name(k3c_last_error_kind()), k3c_last_error());
    k3c_engine_free(e);
    /* bad options are the caller's */
    k3c_engine_options o;
    k3c_engine_options_default(&o);
    o.q_max = 999;
    CHECK(k3c_engine_create(m, &o, &e) != K3C_OK && k3c_last_error_kind() == K3C_ERROR_INPUT);
    /* a cuda engine where none can be made (no CUDA in the build, or no GPU) is a device failure */
    k3c_engine_options_default(&o);
    o.device = "cuda";
    o.max_requests = 1;
    o.max_context = 32;
    if (k3c_engine_create(m, &o, &e) == K3C_OK) {
        printf("  [a GPU is here: the device-failure case is not reached]\n");
        k3c_engine_free(e);
    } else {
        CHECKF(k3c_last_error_kind() == K3C_ERROR_DEVICE, "cuda engine without a GPU: kind %s (%s)",
               k3c_error_kind_name(k3c_last_error_kind()), k3c_last_error());
    }
    k3c_free(m);
}

/* ---- log and progress ---- */

typedef struct log_seen {
    int n;
    k3c_log_level level;
    char msg[256];
    int progress_n, progress_final;
    double done, total;
    char what[64];
} log_seen;

static void log_cb(void *user, k3c_log_level level, const char *msg) {
    log_seen *s = user;
    s->n++;
    s->level = level;
    snprintf(s->msg, sizeof s->msg, "%s", msg);
}

static void progress_cb(void *user, const k3c_progress *p) {
    log_seen *s = user;
    s->progress_n++;
    s->progress_final = p->final;
    s->done = p->done;
    s->total = p->total;
    snprintf(s->what, sizeof s->what, "%s", p->what);
}

/* Runs fn with stderr redirected to a file; returns what it wrote (static buffer). */
static const char *captured_stderr(void (*fn)(void)) {
    static char buf[1024];
    char path[1024];
    snprintf(path, sizeof path, "%s/stderr.txt", test_tmpdir());
    fflush(stderr);
    int saved = dup(2), fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    buf[0] = 0;
    if (saved < 0 || fd < 0) return buf;
    dup2(fd, 2);
    close(fd);
    fn();
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    FILE *f = fopen(path, "r");
    if (f) {
        size_t n = fread(buf, 1, sizeof buf - 1, f);
        buf[n] = 0;
        fclose(f);
    }
    return buf;
}

static void emit_warning(void) { k3c_log(K3C_LOG_WARN, "pageable logits (%d rows)", 7); }
static void emit_info(void) { k3c_log(K3C_LOG_INFO, "reserved %d blocks", 3); }
static void emit_debug(void) { k3c_log(K3C_LOG_DEBUG, "capture of (%d rows, q %d) failed", 2, 1); }
static void emit_progress(void) { k3c_progress_report("cuda: uploading weights", 1.5e9, 3e9, 1.0, 1); }

TEST(api_log_and_progress_callbacks) {
    /* the defaults: what the library wrote to stderr before the callbacks existed */
    CHECK(strcmp(captured_stderr(emit_warning), "k3c: warning: pageable logits (7 rows)\n") == 0);
    CHECK(strcmp(captured_stderr(emit_info), "k3c: reserved 3 blocks\n") == 0);
    CHECK(strcmp(captured_stderr(emit_debug), "") == 0);
    const char *p = captured_stderr(emit_progress);
    CHECKF(strcmp(p, "\rcuda: uploading weights    1.50 / 3.00 GB    1.50 GB/s\n") == 0, "progress line '%s'", p);
    /* callbacks get every level and the progress numbers; nothing reaches stderr */
    log_seen s = {0};
    k3c_set_log(log_cb, &s);
    k3c_set_progress(progress_cb, &s);
    const char *w = captured_stderr(emit_warning);
    CHECK(s.n == 1 && s.level == K3C_LOG_WARN && strcmp(s.msg, "pageable logits (7 rows)") == 0);
    captured_stderr(emit_debug);
    CHECK(s.n == 2 && s.level == K3C_LOG_DEBUG);
    const char *q = captured_stderr(emit_progress);
    CHECK(s.progress_n == 1 && s.progress_final == 1 && s.done == 1.5e9 && s.total == 3e9);
    CHECK(strcmp(s.what, "cuda: uploading weights") == 0);
    int quiet = w[0] == 0 && q[0] == 0;
    /* NULL: the log back to its default; progress dropped */
    k3c_set_log(NULL, NULL);
    k3c_set_progress(NULL, NULL);
    CHECK(strcmp(captured_stderr(emit_warning), "k3c: warning: pageable logits (7 rows)\n") == 0);
    CHECK(strcmp(captured_stderr(emit_progress), "") == 0 && s.progress_n == 1);
    CHECK(quiet);
    CHECK(strcmp(k3c_log_level_name(K3C_LOG_WARN), "warning") == 0);
}

/* ---- model inspection ---- */

TEST(api_model_info_against_config) {
    k3c_model *m = NULL;
    char dir[1024];
    CHECK_OK(tiny_model("info", &m, dir, sizeof dir));
    k3c_config c;
    CHECK_OK(k3c_preset_config("tiny", &c)); /* what synth wrote to config.json */
    k3c_model_info f;
    memset(&f, 0xa5, sizeof f); /* poisoned: every field must be written */
    CHECK_OK(k3c_model_info_get(m, &f));
    CHECK(f.hidden_size == c.hidden_size && f.vocab_size == c.vocab_size && f.num_layers == c.num_layers);
    CHECK(f.num_experts == c.num_experts && f.num_experts_per_token == c.num_experts_per_token);
    CHECK(f.max_position_embeddings == c.max_position_embeddings);
    CHECK(strcmp(f.family, c.family == K3C_FAMILY_K3 ? "Kimi K3" : "Kimi Linear") == 0);
    CHECK(strcmp(f.expert_dtype, c.expert_format == K3C_EXPERTS_MXFP4 ? "MXFP4" : "BF16") == 0);
    int kda = 0, moe = 0;
    for (int l = 0; l < c.num_layers; l++) {
        k3c_layer_attention a = k3c_model_layer_attention(m, l);
        k3c_layer_ffn ff = k3c_model_layer_ffn(m, l);
        CHECKF(a == (c.layer_attn[l] == K3C_ATTN_KDA ? K3C_LAYER_KDA : K3C_LAYER_MLA), "layer %d attention", l);
        CHECKF(ff == (c.layer_is_moe[l] ? K3C_LAYER_MOE : K3C_LAYER_DENSE), "layer %d ffn", l);
        CHECK(k3c_model_layer_block_start(m, l) == (c.attn_res_block_size > 0 && l % c.attn_res_block_size == 0));
        kda += a == K3C_LAYER_KDA;
        moe += ff == K3C_LAYER_MOE;
    }
    CHECK(f.num_kda_layers == kda && f.num_mla_layers == c.num_layers - kda);
    CHECK(f.num_moe_layers == moe && f.num_dense_layers == c.num_layers - moe);
    CHECK(kda > 0 && kda < c.num_layers && moe > 0); /* tiny has both kinds of each */
    /* out of range and NULL: 0, never a crash */
    CHECK(k3c_model_layer_attention(m, -1) == 0 && k3c_model_layer_attention(m, c.num_layers) == 0);
    CHECK(k3c_model_layer_ffn(NULL, 0) == 0 && k3c_model_layer_block_start(NULL, 0) == 0);
    CHECK(k3c_model_info_get(NULL, &f) != K3C_OK && k3c_model_info_get(m, NULL) != K3C_OK);
    /* cache sizes from the spec: the bf16 latent (kv_lora + rope) per MLA layer per token; per KDA layer an
     * f32 [H, dk, dk] state and a bf16 window of W - 1 rows of q, k, v (H * dk each) */
    CHECK(f.mla_cache_bytes_per_token == (uint64_t)(c.kv_lora_rank + c.qk_rope_head_dim) * 2 * (c.num_layers - kda));
    uint64_t st = (uint64_t)c.kda_num_heads * c.kda_head_dim * c.kda_head_dim * 4;
    uint64_t win = (uint64_t)(c.kda_conv_kernel - 1) * 3 * c.kda_num_heads * c.kda_head_dim * 2;
    CHECK(f.kda_state_bytes == st && f.kda_conv_bytes == win && f.kda_state_bytes_per_request == (st + win) * kda);
    /* sizes: the shard files hold the tensors plus one header each, so the tensors' bytes are below the
     * files' and the dtype rows add up to them; the active parameters are fewer than the total */
    uint64_t by_dtype = 0, tensors = 0;
    for (int d = 0; d < K3C_DTYPES; d++) by_dtype += f.dtype_bytes[d], tensors += f.dtype_tensors[d];
    CHECK(by_dtype == f.weight_bytes && tensors == f.num_tensors && f.num_tensors > 0);
    CHECK(f.weight_bytes < f.file_bytes && f.num_shards >= 1 && !f.device_synthetic);
    CHECK(f.dtype_tensors[1] > 0 && strcmp(k3c_dtype_name_of(1), "BF16") == 0); /* K3C_DTYPE_BF16 */
    CHECK(strcmp(k3c_dtype_name_of(0), "INVALID") == 0 && strcmp(k3c_dtype_name_of(99), "INVALID") == 0);
    CHECK(f.params_routed > 0 && f.params_routed < f.params_total && f.params_active < (double)f.params_total);
    CHECK(f.params_embedding == (uint64_t)c.vocab_size * c.hidden_size);
    CHECK(f.embedding_bytes == 2 * f.params_embedding); /* bf16 */
    k3c_config_free(&c);
    k3c_free(m);
    /* a device-synthetic model: the same config, no files */
    CHECK_OK(k3c_model_synthesize_device("tiny", 3, &m));
    CHECK_OK(k3c_model_info_get(m, &f));
    CHECK(f.device_synthetic == 1 && f.num_shards == 0 && f.file_bytes == 0 && f.weight_bytes > 0);
    k3c_free(m);
    /* the preset list names tiny and says it has weights */
    int seen = 0;
    for (const char *const *p = k3c_preset_names(); p && *p; p++) seen += !strcmp(*p, "tiny");
    CHECK(seen == 1 && k3c_preset_has_weights("tiny") == 1 && k3c_preset_has_weights("no-such") == 0);
}

/* ---- routing on an engine without the executor ---- */

TEST(api_cpu_engine_routes_stock_and_counts) {
    k3c_model *m = NULL;
    char dir[1024];
    CHECK_OK(tiny_model("route", &m, dir, sizeof dir));
    k3c_engine_options o;
    k3c_engine_options_default(&o);
    CHECK(o.specialized == K3C_SPECIALIZED_AUTO);
    k3c_engine *e = NULL;
    /* the executor is cuda's: asked for on the cpu, creation fails naming why */
    o.specialized = K3C_SPECIALIZED_ON;
    CHECK(k3c_engine_create(m, &o, &e) != K3C_OK && e == NULL);
    CHECK(strstr(k3c_last_error(), "cuda") != NULL && k3c_last_error_kind() == K3C_ERROR_INPUT);
    o.specialized = 7;
    CHECK(k3c_engine_create(m, &o, &e) != K3C_OK && strstr(k3c_last_error(), "specialized 7") != NULL);
    e = cpu_engine(m, 2);
    CHECK(e != NULL);
    CHECK(k3c_engine_max_requests(e) == 2 && strcmp(k3c_engine_device(e), "cpu") == 0);
    CHECK(k3c_engine_set_specialized(e, 1) != K3C_OK); /* no executor to switch on */
    CHECK_OK(k3c_engine_set_specialized(e, 0));
    CHECK_OK(k3c_engine_warmup(e)); /* nothing to capture */
    /* two requests with the same prompt: one through k3c_engine_step, one through the greedy step */
    k3c_rng r;
    k3c_rng_seed(&r, test_seed() ^ 0x9e7);
    int V = k3c_engine_vocab(e), a, b;
    int32_t prompt[9];
    for (int i = 0; i < 9; i++) prompt[i] = (int32_t)(k3c_rng_next(&r) % (uint64_t)V);
    float *la = malloc(sizeof(float) * V), *lb = malloc(sizeof(float) * V);
    CHECK(la && lb);
    CHECK_OK(k3c_request_open(e, &a));
    CHECK_OK(k3c_request_open(e, &b));
    k3c_step_item pa = {.request = a, .tokens = prompt, .n = 9}, pb = {.request = b, .tokens = prompt, .n = 9};
    CHECK_OK(k3c_engine_step(e, &pa, 1, la));
    int32_t ta = k3c_greedy_token(la, V), tb = -1;
    CHECK_OK(k3c_engine_step_greedy(e, &pb, 1, &tb, lb));
    CHECK(tb == ta);
    const int decodes = 6;
    for (int s = 0; s < decodes; s++) {
        k3c_step_item da = {.request = a, .tokens = &ta, .n = 1}, db = {.request = b, .tokens = &tb, .n = 1};
        CHECK_OK(k3c_engine_step(e, &da, 1, la));
        CHECK_OK(k3c_engine_step_greedy(e, &db, 1, &tb, lb));
        ta = k3c_greedy_token(la, V);
        CHECKF(ta == tb, "decode %d: greedy step %d, argmax of the logits step %d", s, tb, ta);
    }
    /* one two-request decode step: 2 rows, a decode route on the nominal table */
    k3c_step_item two[2] = {{.request = a, .tokens = &ta, .n = 1}, {.request = b, .tokens = &tb, .n = 1}};
    int32_t ids[2];
    float *l2 = malloc(sizeof(float) * 2 * V);
    CHECK(l2 != NULL);
    CHECK_OK(k3c_engine_step_greedy(e, two, 2, ids, l2));
    CHECK(ids[0] == k3c_greedy_token(l2, V) && ids[1] == k3c_greedy_token(l2 + V, V));
    k3c_engine_stats st;
    memset(&st, 0x5a, sizeof st);
    k3c_engine_stats_get(e, &st);
    /* 2 prompt steps (stock: prompt rows) and 2 x decodes + 1 decode steps, all run stock */
    CHECK(st.specialized == 0 && st.graphs_captured == 0 && st.executor_steps == 0 && st.greedy_id_steps == 0);
    CHECK(st.steps == 2 + 2 * decodes + 1);
    CHECK(st.route_steps[0] == 2 && st.stock_reason_steps[5] == 2); /* prompt rows */
    CHECK(st.route_steps[1] == 2 * decodes + 1 && st.route_steps[2] == 0 && st.route_steps[3] == 0);
    CHECK(strcmp(k3c_route_name(1), "decode") == 0 && strcmp(k3c_route_name(9), "?") == 0);
    CHECK(strcmp(k3c_stock_reason_text(5), "prompt rows") == 0 && strcmp(k3c_stock_reason_text(-1), "?") == 0);
    /* NULL safety of the new calls */
    CHECK(k3c_engine_step_greedy(e, two, 2, NULL, l2) != K3C_OK && k3c_engine_step_greedy(e, two, 2, ids, NULL) != K3C_OK);
    CHECK(k3c_engine_set_specialized(NULL, 0) != K3C_OK && k3c_engine_warmup(NULL) != K3C_OK);
    CHECK(k3c_engine_max_requests(NULL) == -1 && k3c_engine_vocab(NULL) == -1); /* k3c.h: a getter returns -1 for a NULL handle */
    k3c_engine_stats_get(NULL, &st);
    CHECK(st.steps == 0);
    k3c_engine_stats_get(e, NULL);
    CHECK(k3c_engine_profile(e, K3C_PROFILE_QUERY, NULL, 0) == 0);
    CHECK(k3c_engine_profile(e, K3C_PROFILE_RESET, NULL, 0) != K3C_OK);
    double bw = -1;
    CHECK(k3c_device_copy_bandwidth("cpu", &bw) != K3C_OK && bw == -1);
    CHECK(k3c_device_copy_bandwidth("cuda", NULL) != K3C_OK);
    free(la), free(lb), free(l2);
    k3c_engine_free(e);
    k3c_free(m);
}

/* A CUDA-enabled build does not map cuBLASLt until a cuda engine needs it (cuda/cublaslt.h): a CPU run
 * costs what a build without CUDA costs. Linked, the library was mapped before main. */
static int maps_contain(const char *what) {
    FILE *f = fopen("/proc/self/maps", "r");
    if (!f) return -1;
    char line[1024];
    int found = 0;
    while (fgets(line, sizeof line, f))
        if (strstr(line, what)) found = 1;
    fclose(f);
    return found;
}

static int lt_mapped_at_start = -1;
__attribute__((constructor)) static void record_maps_at_start(void) { lt_mapped_at_start = maps_contain("libcublasLt"); }

TEST(api_cuda_libraries_loaded_lazily) {
    CHECK(lt_mapped_at_start == 0); /* before main: only linked libraries are mapped */
#ifdef K3C_HAVE_CUDA
    CHECK(k3c_has_cuda() == 1);
    const k3c_cublaslt_api *lt = k3c_cublaslt();
    CHECKF(lt != NULL && lt->Create && lt->Matmul, "loading cuBLASLt: %s", k3c_last_error());
    CHECK(maps_contain("libcublasLt") == 1);
    CHECK(k3c_cublaslt() == lt); /* loaded once */
#else
    CHECK(k3c_has_cuda() == 0);
#endif
}

/* The CLI on the cpu: `k3c run` counts the planned routes and says every step ran stock (no executor
 * here), with and without --stock; both runs emit the same tokens. */
static int read_text(const char *path, char *buf, size_t n) {
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    size_t got = fread(buf, 1, n - 1, f);
    buf[got] = 0;
    fclose(f);
    return 0;
}

TEST(api_cli_run_counts_routes_on_cpu) {
    char bin[1024], cmd[4096], out[2][8192], err[8192], path[1024];
    CHECK(test_k3c_binary(bin, sizeof bin));
    for (int stock = 0; stock < 2; stock++) {
        snprintf(cmd, sizeof cmd, "'%s' run --prompts '1,2,3;4,5' -n 5 --spec 2 --threads 2 %s > '%s/run%d.out' "
                 "2> '%s/run%d.err'", bin, stock ? "--stock" : "", test_tmpdir(), stock, test_tmpdir(), stock);
        CHECK(test_run_status(cmd) == 0);
        snprintf(path, sizeof path, "%s/run%d.out", test_tmpdir(), stock);
        CHECK(read_text(path, out[stock], sizeof out[stock]) == 0);
        snprintf(path, sizeof path, "%s/run%d.err", test_tmpdir(), stock);
        CHECK(read_text(path, err, sizeof err) == 0);
        CHECKF(strstr(err, "steps: ") && strstr(err, "decode ") && strstr(err, "every step ran stock"),
               "k3c run%s summary: %s", stock ? " --stock" : "", err);
    }
    CHECK(strcmp(out[0], out[1]) == 0 && strstr(out[0], "request 1 (2 prompt tokens):") != NULL);
}
