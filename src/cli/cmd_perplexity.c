/* k3c perplexity: the perplexity of a model on a text file, by the protocol of tools/train_k3 (train.py's
 * eval_windows and evaluate, whose numbers models/k3-fortune/metrics.json records): the text encoded without
 * specials (tiktoken's encode_ordinary, no BOS), cut into consecutive windows of --window tokens (the last
 * one shorter; one of a single token scores nothing and is dropped), each window run from an empty state;
 * every token of a window but its first is scored by the NLL of the model's next-token distribution at the
 * position before it; perplexity = exp(total NLL / tokens scored). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli/commands.h"

#define MAX_TEXT_FILE ((size_t)1 << 30) /* a guard against an absurd input, not a format limit */

static void perplexity_usage(FILE *f) {
    fprintf(f, "usage: k3c perplexity [--model DIR | --preset NAME] --file F [--window N] [--max-tokens N]\n"
               "                      [--device cpu|cuda] [--threads N] [--f32] [--kv-cache bf16|fp8]\n"
               "                      [--max-context N] [--memory-limit BYTES]\n"
               "the text of F (- reads stdin) encoded without special tokens, cut into consecutive windows of\n"
               "  --window tokens (default 512, the trainer's; 2 .. the model's context length), each run from an\n"
               "  empty state; every token but the first of its window is scored: the NLL (nats) of the model's\n"
               "  next-token distribution at the position before it; perplexity = exp(mean NLL). This is the\n"
               "  protocol of tools/train_k3/train.py (its held-out numbers: models/k3-fortune/metrics.json)\n"
               "--max-tokens N: only the first N tokens of the text (the trainer's --eval-tokens)\n"
               "--f32 (diagnostic): f32 activations, no bf16 rounding\n"
               "prints the tokens, windows, tokens scored, mean NLL, perplexity and tokens/s on stdout\n"
               CLI_MODEL_HELP);
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* -log softmax(row)[target], in double: the max subtracted before the sum of exponentials. */
static double row_nll(const float *row, int vocab, int32_t target) {
    float m = row[0];
    for (int v = 1; v < vocab; v++) m = row[v] > m ? row[v] : m;
    double s = 0;
    for (int v = 0; v < vocab; v++) s += exp((double)row[v] - m);
    return log(s) + m - row[target];
}

int cmd_perplexity(int argc, char **argv) {
    const char *model = NULL, *preset = NULL, *file = NULL;
    long window = 512, max_tokens = 0;
    int f32 = 0;
    k3c_engine_options o;
    k3c_engine_options_default(&o);
    for (int i = 1; i < argc; i++) {
        const char *v;
        int bad = 0;
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            perplexity_usage(stdout);
            return 0;
        } else if (!strcmp(argv[i], "--f32")) f32 = 1;
        else if (cli_model_option(argc, argv, &i, &model, &preset, &bad)) { /* bad on a bad value */ }
        else if ((v = cli_option(argc, argv, &i, "--file"))) bad = cli_str("--file", file = v);
        else if ((v = cli_option(argc, argv, &i, "--window"))) bad = cli_int("--window", v, 2, 1 << 24, &window);
        else if ((v = cli_option(argc, argv, &i, "--max-tokens")))
            bad = cli_int("--max-tokens", v, 2, 0x7fffffffL, &max_tokens);
        else if (cli_engine_option(argc, argv, &i, &o, &bad)) { /* into o; bad on a bad value */ }
        else bad = cli_unexpected(argv[i]);
        if (bad) {
            fprintf(stderr, "k3c perplexity: %s\n", cli_error());
            perplexity_usage(stderr);
            return 2;
        }
    }
    if (!file) {
        fprintf(stderr, "k3c perplexity: --file F is required (the text to score)\n");
        perplexity_usage(stderr);
        return 2;
    }
    char *text = NULL;
    size_t text_len = 0;
    if (cli_read_input(file, MAX_TEXT_FILE, &text, &text_len) != 0) {
        fprintf(stderr, "k3c perplexity: --file: %s\n", cli_error());
        return 2;
    }
    if (text_len == 0) {
        fprintf(stderr, "k3c perplexity: --file %s is empty: no text to score\n", file);
        free(text);
        return 2;
    }
    k3c_model *m = NULL;
    k3c_engine *e = NULL;
    k3c_tokenizer *tok = NULL;
    k3c_tokens ids = {0};
    float *logits = NULL;
    int rc = 1;
    if (cli_load_model(model, preset, 0, &m) != K3C_OK) goto fail;
    if (cli_load_tokenizer(model, preset, &tok) != 0) goto fail;
    if (!tok) {
        cli_errorf("%s has no tokenizer files (no tiktoken.model beside its config.json): perplexity scores text, "
                   "which needs the model's tokenizer", model);
        rc = 2;
        goto fail;
    }
    if (k3c_tokenizer_encode_ordinary(tok, text, text_len, &ids) != K3C_OK) goto fail;
    size_t n_text = ids.n;
    if (max_tokens > 0 && ids.n > (size_t)max_tokens) ids.n = (size_t)max_tokens;
    if (ids.n < 2) {
        cli_errorf("--file %s gives %zu token%s%s: perplexity needs at least 2", file, ids.n, ids.n == 1 ? "" : "s",
                   max_tokens > 0 ? " (within --max-tokens)" : "");
        rc = 2;
        goto fail;
    }
    k3c_model_info info;
    if (k3c_model_info_get(m, &info) != K3C_OK) goto fail;
    if (window > info.max_position_embeddings) {
        cli_errorf("--window %ld is longer than the model's context length %d", window, info.max_position_embeddings);
        rc = 2;
        goto fail;
    }
    for (size_t i = 0; i < ids.n; i++)
        if (ids.ids[i] < 0 || ids.ids[i] >= info.vocab_size) {
            cli_errorf("token %zu of --file %s is id %d, outside the model's vocabulary of %d", i, file, ids.ids[i],
                       info.vocab_size);
            goto fail;
        }
    int win = (int)window;
    if (o.max_context > 0 && o.max_context < win) {
        cli_errorf("--max-context %d is shorter than --window %d (a window runs as one request)", o.max_context, win);
        rc = 2;
        goto fail;
    }
    o.max_requests = 1;
    o.max_context = o.max_context > 0 ? o.max_context : win;
    o.exact_f32 = f32;
    if (k3c_engine_create(m, &o, &e) != K3C_OK) {
        cli_errorf("--window %d: %s", win, k3c_last_error());
        goto fail;
    }
    int V = k3c_engine_vocab(e), rows = k3c_engine_max_rows(e);
    if (!(logits = malloc(sizeof(float) * (size_t)rows * V))) {
        cli_errorf("out of memory for %d x %d logits", rows, V);
        goto fail;
    }
    double nll = 0, t0 = now_s();
    long scored = 0, windows = 0;
    int last = 0;
    for (size_t w0 = 0; w0 + 1 < ids.n; w0 += (size_t)win) {
        int n = ids.n - w0 < (size_t)win ? (int)(ids.n - w0) : win;
        last = n;
        const int32_t *w = ids.ids + w0;
        int req;
        if (k3c_request_open(e, &req) != K3C_OK) goto fail;
        /* the window as prompt pieces the engine allows (the same logits as one step, batch invariance),
         * all rows' logits: row r predicts token r + 1 */
        for (int pos = 0; pos < n;) {
            int k = k3c_engine_prompt_piece(e, pos, n, rows);
            if (k <= 0) {
                cli_errorf("no prompt piece at position %d of a %d-token window (max_rows %d)", pos, n, rows);
                goto fail;
            }
            k3c_step_item it = {.request = req, .tokens = w + pos, .n = k, .all_logits = 1};
            if (k3c_engine_step(e, &it, 1, logits) != K3C_OK) goto fail;
            for (int r = 0; r < k && pos + r + 1 < n; r++) {
                double x = row_nll(logits + (size_t)r * V, V, w[pos + r + 1]);
                if (!isfinite(x)) {
                    cli_errorf("the NLL of token %zu (window %ld, position %d) is %g: the logits are not finite",
                               w0 + pos + r + 1, windows, pos + r + 1, x);
                    goto fail;
                }
                nll += x;
                scored++;
            }
            pos += k;
        }
        if (k3c_request_close(e, req) != K3C_OK) goto fail;
        windows++;
    }
    double secs = now_s() - t0;
    printf("tokens: %zu of %zu in %s (%zu bytes)\n", ids.n, n_text, file, text_len);
    printf("windows: %ld of %d tokens", windows, win);
    if (last != win) printf(" (the last %d)", last);
    printf(", each from an empty state\n");
    printf("scored: %ld tokens\n", scored);
    printf("mean NLL: %.6f nats (total %.3f)\n", nll / scored, nll);
    printf("perplexity: %.4f\n", exp(nll / scored));
    printf("speed: %.0f tokens/s (%.3f s) [%s%s]\n", secs > 0 ? ids.n / secs : 0, secs, o.device,
           f32 ? ", f32" : "");
    if (cli_flush_stdout() != 0) goto fail;
    rc = 0;
    goto done;
fail:
    fprintf(stderr, "k3c perplexity: %s\n", cli_error());
done:
    free(logits);
    k3c_engine_free(e);
    if (m) k3c_free(m);
    k3c_tokens_free(&ids);
    k3c_tokenizer_free(tok);
    free(text);
    return rc;
}
