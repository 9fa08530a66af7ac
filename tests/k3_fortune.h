/* The embedded k3-fortune model as a correctness check, shared by the CPU tests (test_perplexity.c) and the GPU
 * test (gpu/test_gpu_fortune.c): the trainer's numbers (models/k3-fortune/metrics.json, PyTorch), the greedy
 * golden (tests/fixtures/k3_fortune_greedy.json), the held-out text (tools/train_k3/data/heldout.txt), and
 * the held-out NLL computed through the engine three ways: prompt steps, decode steps (one token a step) and
 * uniform q-token verify steps, each teacher-forced. The protocol is the trainer's (train.py eval_windows /
 * evaluate): the text encoded without specials, consecutive windows (the last shorter, one of a single token
 * dropped), each from a fresh request, every token of a window but its first scored. Public API only. */
#ifndef K3C_TESTS_K3_FORTUNE_H
#define K3C_TESTS_K3_FORTUNE_H

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "k3c.h"

/* A path under the repository (the directory above the test binary's build folder). */
static inline int fortune_path(char *out, size_t n, const char *rel) {
    return (size_t)snprintf(out, n, "%s/../%s", test_exe_dir(), rel) < n ? 0 : -1;
}

static inline char *fortune_slurp(const char *rel) {
    char path[4096];
    if (fortune_path(path, sizeof path, rel)) return NULL;
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    char *buf = NULL;
    long len = fseek(f, 0, SEEK_END) == 0 ? ftell(f) : -1;
    if (len >= 0 && fseek(f, 0, SEEK_SET) == 0 && (buf = malloc((size_t)len + 1))) {
        if (fread(buf, 1, (size_t)len, f) != (size_t)len) {
            free(buf);
            buf = NULL;
        } else {
            buf[len] = 0;
        }
    }
    fclose(f);
    return buf;
}

/* What the trainer measured (metrics.json): the held-out perplexity of the exported checkpoint (bf16 weights,
 * MXFP4 experts, float32 compute) and of the weights before export, the tokens it scored, its window. */
typedef struct fortune_ref {
    double exported, fp32, ptq, qat;
    long scored, heldout_tokens;
    int window;
} fortune_ref;

static inline double fortune_num(const cJSON *o, const char *a, const char *b) {
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(o, a);
    if (b) x = cJSON_GetObjectItemCaseSensitive(x, b);
    return cJSON_IsNumber(x) ? x->valuedouble : NAN;
}

static inline int fortune_reference(fortune_ref *r) {
    char *text = fortune_slurp("models/k3-fortune/metrics.json");
    cJSON *root = text ? cJSON_Parse(text) : NULL;
    free(text);
    if (!root) return -1;
    const cJSON *p = cJSON_GetObjectItemCaseSensitive(root, "perplexity");
    r->exported = fortune_num(p, "exported", "heldout");
    r->fp32 = fortune_num(p, "fp32", "heldout");
    r->ptq = fortune_num(p, "ptq", "heldout");
    r->qat = fortune_num(p, "qat", "heldout");
    r->scored = (long)fortune_num(root, "heldout_exported_nll", "tokens");
    r->heldout_tokens = (long)fortune_num(root, "perplexity_protocol", "heldout_tokens");
    r->window = (int)fortune_num(root, "perplexity_protocol", "window");
    cJSON_Delete(root);
    return isfinite(r->exported) && r->scored > 0 && r->window > 1 ? 0 : -1;
}

/* The greedy golden: prompt text and ids, and the ids and text generated (CPU, equal to the trainer's). */
typedef struct fortune_golden {
    char prompt[256], text[4096];
    int32_t prompt_ids[64], ids[256];
    int n_prompt, n;
} fortune_golden;

static inline int fortune_ids(const cJSON *a, int32_t *out, int cap) {
    int n = 0;
    const cJSON *x;
    cJSON_ArrayForEach(x, a) {
        if (n == cap || !cJSON_IsNumber(x)) return -1;
        out[n++] = (int32_t)x->valueint;
    }
    return n;
}

static inline int fortune_golden_load(fortune_golden *g) {
    char *text = fortune_slurp("tests/fixtures/k3_fortune_greedy.json");
    cJSON *root = text ? cJSON_Parse(text) : NULL;
    free(text);
    if (!root) return -1;
    const cJSON *p = cJSON_GetObjectItemCaseSensitive(root, "prompt"),
                *t = cJSON_GetObjectItemCaseSensitive(root, "text");
    int rc = cJSON_IsString(p) && cJSON_IsString(t) ? 0 : -1;
    if (rc == 0) {
        snprintf(g->prompt, sizeof g->prompt, "%s", p->valuestring);
        snprintf(g->text, sizeof g->text, "%s", t->valuestring);
        g->n_prompt = fortune_ids(cJSON_GetObjectItemCaseSensitive(root, "prompt_ids"), g->prompt_ids, 64);
        g->n = fortune_ids(cJSON_GetObjectItemCaseSensitive(root, "ids"), g->ids, 256);
        rc = g->n_prompt > 0 && g->n > 0 ? 0 : -1;
    }
    cJSON_Delete(root);
    return rc;
}

/* The held-out text's ids (encode_ordinary through t). */
static inline int fortune_heldout(const k3c_tokenizer *t, k3c_tokens *ids) {
    char *text = fortune_slurp("tools/train_k3/data/heldout.txt");
    if (!text) return -1;
    int rc = k3c_tokenizer_encode_ordinary(t, text, strlen(text), ids);
    free(text);
    return rc;
}

/* -log softmax(row)[target] in double. */
static inline double fortune_row_nll(const float *row, int vocab, int32_t target) {
    double m = row[0];
    for (int v = 1; v < vocab; v++) m = row[v] > m ? row[v] : m;
    double s = 0;
    for (int v = 0; v < vocab; v++) s += exp(row[v] - m);
    return log(s) + m - row[target];
}

typedef enum fortune_mode {
    FORTUNE_PROMPT, /* each window as prompt steps of at most max_rows tokens, logits of every row */
    FORTUNE_DECODE, /* the window's first token as a prompt, then one decode step per token */
    FORTUNE_VERIFY, /* the first token as a prompt, then verify steps of q tokens (all committed), then decode
                     * steps for the tail shorter than q */
} fortune_mode;

/* Steps the engine ran in each mode, for the caller to check against its routing counters. */
typedef struct fortune_steps {
    long prompt, decode, verify;
} fortune_steps;

/* Total NLL and tokens scored over ids[0 .. n) in windows of `window` tokens, the engine's logits feeding
 * the NLL; the engine needs max_requests >= 1, max_context >= window, q_max >= q and (FORTUNE_PROMPT)
 * max_rows rows. NaN logits give a NaN total. */
static inline int fortune_nll(k3c_engine *e, const int32_t *ids, size_t n, int window, fortune_mode mode, int q,
                              double *nll, long *scored, fortune_steps *steps) {
    int V = k3c_engine_vocab(e), rows = mode == FORTUNE_PROMPT ? k3c_engine_max_rows(e) : q > 1 ? q : 1;
    float *lg = k3c_engine_logits_alloc(e, rows);
    if (!lg) return -1;
    fortune_steps st = {0};
    double total = 0;
    long cnt = 0;
    int rc = 0;
    for (size_t w0 = 0; rc == 0 && w0 + 1 < n; w0 += (size_t)window) {
        int len = n - w0 < (size_t)window ? (int)(n - w0) : window;
        const int32_t *w = ids + w0;
        int req;
        if (k3c_request_open(e, &req) != K3C_OK) {
            rc = -1;
            break;
        }
        /* fed: tokens given so far; the logits of token i predict token i + 1 (the last token is never fed) */
        int fed = 0;
        while (rc == 0 && fed < len - 1) {
            k3c_step_item it = {.request = req, .tokens = w + fed};
            if (mode == FORTUNE_PROMPT) {
                it.n = k3c_engine_prompt_piece(e, fed, len, rows);
                it.all_logits = 1;
                st.prompt++;
            } else if (fed == 0) {
                it.n = 1; /* a request's first item is prompt rows whatever its length */
                st.prompt++;
            } else if (mode == FORTUNE_VERIFY && len - 1 - fed >= q) {
                it.n = q;
                it.verify = 1;
                st.verify++;
            } else {
                it.n = 1;
                st.decode++;
            }
            if (it.n <= 0 || k3c_engine_step(e, &it, 1, lg) != K3C_OK ||
                (it.verify && k3c_request_commit(e, req, it.n) != K3C_OK)) {
                rc = -1;
                break;
            }
            /* every row predicts the token after it, within the window */
            int out = it.all_logits || it.verify ? it.n : 1, first = fed + it.n - out;
            for (int r = 0; r < out; r++)
                if (first + r + 1 < len) {
                    total += fortune_row_nll(lg + (size_t)r * V, V, w[first + r + 1]);
                    cnt++;
                }
            fed += it.n;
        }
        if (k3c_request_close(e, req) != K3C_OK) rc = -1;
    }
    k3c_engine_logits_free(e, lg);
    *nll = total;
    *scored = cnt;
    if (steps) *steps = st;
    return rc;
}

#endif
