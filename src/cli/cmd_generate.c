/* k3c generate: prefill a prompt (text through the model's tokenizer, or token ids) and sample new tokens,
 * printing them as they come (decoded text for a text prompt, ids otherwise) and a summary (prefill and
 * decode tokens/s). Without --model the `tiny` preset is synthesized on the fly. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/commands.h"

static void generate_usage(FILE *f) {
    fprintf(f, "usage: k3c generate [--model DIR] [--prompt TEXT | --prompt-file F | --prompt-ids 1,2,3] [-n 32]\n"
               "                    [--ignore-eos] [--temperature T] [--top-k K]\n"
               "                    [--top-p P] [--seed S] [--device cpu|cuda] [--threads N] [--stock]\n"
               "                    [--kv-cache bf16|fp8] [--max-context N] [--memory-limit BYTES]\n"
               "with --device cuda the engine takes the specialized decode executor (graph-captured steps) unless\n"
               "--stock forces the stock forward; a summary of steps per path goes to stderr\n"
               "--kv-cache fp8: MLA latent cache in FP8 E4M3 (default bf16)\n"
               "--max-context: tokens the request may hold (default: the prompt and -n); at most the model's\n"
               "  context length; --memory-limit (e.g. 8G): most bytes its caches may take (default: what the\n"
               "  device has free); a need past either is refused\n"
               "--prompt / --prompt-file: text, encoded with the model's tokenizer (special-token text stays text);\n"
               "  the answer streams as text and stops at the tokenizer's eos unless --ignore-eos\n"
               "without --model, the tiny preset is synthesized (seed 0) into a temporary directory\n");
}

/* Streams each token as it comes; a failed write (a full disk, a closed stdout) stops the generation, which
 * then fails, instead of computing tokens nobody receives. */
static int print_token(void *user, int32_t tok) {
    int *state = user; /* [0] first token still to come, [1] a write failed */
    errno = 0;
    if (printf("%s%d", state[0] ? "" : " ", tok) < 0 || fflush(stdout) != 0) {
        state[1] = errno ? errno : EIO;
        return 1;
    }
    state[0] = 0;
    return 0;
}

/* Text mode: each token through the streaming detokenizer (incomplete UTF-8 held back), stopping at eos. */
typedef struct text_out {
    k3c_detokenizer *d;
    int32_t eos;     /* -1: none, or --ignore-eos */
    int write_error; /* errno of a failed write */
} text_out;

static int write_text(text_out *o, const char *s, size_t len) {
    errno = 0;
    if ((len && fwrite(s, 1, len, stdout) != len) || fflush(stdout) != 0) {
        o->write_error = errno ? errno : EIO;
        return 1;
    }
    return 0;
}

static int print_text(void *user, int32_t tok) {
    text_out *o = user;
    if (tok == o->eos) return 1;
    const char *s;
    size_t len;
    if (k3c_detokenizer_push(o->d, tok, &s, &len) != K3C_OK) return 1;
    return write_text(o, s, len);
}

/* The prompt text of --prompt or --prompt-file (malloc'ed; NULL with a message on failure). */
static char *read_prompt_file(const char *path, size_t *len) {
    FILE *f = strcmp(path, "-") ? fopen(path, "rb") : stdin;
    if (!f) {
        cli_errorf("--prompt-file %s: %s", path, strerror(errno));
        return NULL;
    }
    size_t cap = 4096, n = 0;
    char *buf = malloc(cap);
    for (size_t got; buf && (got = fread(buf + n, 1, cap - n, f)) > 0;) {
        n += got;
        if (n == cap) {
            char *nb = realloc(buf, cap *= 2);
            if (!nb) free(buf);
            buf = nb;
        }
    }
    int err = ferror(f);
    if (f != stdin) fclose(f);
    if (!buf || err) {
        free(buf);
        cli_errorf("--prompt-file %s: %s", path, buf ? "read error" : "out of memory");
        return NULL;
    }
    *len = n;
    return buf;
}

/* Steps per path (k3c_engine_stats): what the specialized executor ran and why the rest ran stock. */
static void print_routes(const k3c_engine *e) {
    k3c_engine_stats st;
    k3c_engine_stats_get(e, &st);
    fprintf(stderr, "%ld steps: %ld specialized (planned decode %ld, verify %ld, wide %ld), stock %ld;", st.steps,
            st.executor_steps, st.route_steps[1], st.route_steps[2], st.route_steps[3], st.route_steps[0]);
    for (int i = 1; i < K3C_STOCK_REASONS; i++)
        if (st.stock_reason_steps[i]) fprintf(stderr, " %s: %ld", k3c_stock_reason_text(i), st.stock_reason_steps[i]);
    fprintf(stderr, "; %d graphs captured [%s; --stock for the stock path]\n", st.graphs_captured,
            st.specialized ? "specialized" : "no specialized executor");
}

int cmd_generate(int argc, char **argv) {
    const char *model = NULL, *ids_s = NULL, *prompt = NULL, *prompt_file = NULL;
    long n = 32;
    int stock = 0, ignore_eos = 0;
    k3c_engine_options o;
    k3c_engine_options_default(&o);
    k3c_sampling s = {.top_p = 1}; /* greedy unless --temperature */
    for (int i = 1; i < argc; i++) {
        const char *v;
        int bad = 0;
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            generate_usage(stdout);
            return 0;
        } else if (!strcmp(argv[i], "--stock")) stock = 1;
        else if (!strcmp(argv[i], "--ignore-eos")) ignore_eos = 1;
        else if ((v = cli_option(argc, argv, &i, "--prompt"))) bad = cli_str("--prompt", prompt = v);
        else if ((v = cli_option(argc, argv, &i, "--prompt-file"))) bad = cli_str("--prompt-file", prompt_file = v);
        else if ((v = cli_option(argc, argv, &i, "--model"))) bad = cli_str("--model", model = v);
        else if ((v = cli_option(argc, argv, &i, "--prompt-ids"))) bad = cli_str("--prompt-ids", ids_s = v);
        else if ((v = cli_option(argc, argv, &i, "-n"))) bad = cli_int("-n", v, 0, 1 << 30, &n);
        else if (cli_sampling_option(argc, argv, &i, &s, &bad)) { /* into s; bad on a bad value */ }
        else if (cli_engine_option(argc, argv, &i, &o, &bad)) { /* into o; bad on a bad value */ }
        else bad = cli_unexpected(argv[i]);
        if (bad) {
            fprintf(stderr, "k3c generate: %s\n", cli_error());
            generate_usage(stderr);
            return 2;
        }
    }
    if (cli_sampling_check(&s)) {
        fprintf(stderr, "k3c generate: %s\n", cli_error());
        return 2;
    }
    if (!!prompt + !!prompt_file + !!ids_s > 1) {
        fprintf(stderr, "k3c generate: give one of --prompt, --prompt-file and --prompt-ids\n");
        return 2;
    }
    int32_t *ids = NULL;
    int n_ids = 0;
    k3c_tokenizer *tok = NULL;
    text_out tout = {.eos = -1};
    if (prompt || prompt_file) {
        /* the tokenizer beside the weights (a checkpoint directory), or the default model's */
        int rc_t = model ? (k3c_tokenizer_present(model) ? k3c_tokenizer_load(model, &tok)
                                                         : cli_errorf("%s has no tokenizer files (tiktoken.model, "
                                                                      "tokenizer_config.json): give --prompt-ids",
                                                                      model))
                         : k3c_tokenizer_load_preset("tiny", &tok);
        size_t len = prompt ? strlen(prompt) : 0;
        char *text = prompt_file && rc_t == K3C_OK ? read_prompt_file(prompt_file, &len) : NULL;
        k3c_tokens tk = {0};
        if (rc_t != K3C_OK || (prompt_file && !text) ||
            k3c_tokenizer_encode_ordinary(tok, prompt ? prompt : text, len, &tk) != K3C_OK ||
            k3c_detokenizer_create(tok, &tout.d) != K3C_OK) {
            fprintf(stderr, "k3c generate: %s\n", cli_error());
            free(text);
            k3c_tokens_free(&tk);
            k3c_tokenizer_free(tok);
            return 2;
        }
        free(text);
        if (tk.n == 0) {
            fprintf(stderr, "k3c generate: the prompt is empty\n");
            k3c_tokens_free(&tk);
            k3c_detokenizer_free(tout.d);
            k3c_tokenizer_free(tok);
            return 2;
        }
        ids = tk.ids; /* k3c_tokens_free frees ids with free() */
        n_ids = (int)tk.n;
        tout.eos = ignore_eos ? -1 : k3c_tokenizer_eos(tok);
    }
    /* No prompt given: start from token 1 (the synthesized presets' bos id), so the README's one-line
     * command runs as it stands. */
    if (!ids && !ids_s) ids_s = "1";
    if (!ids && cli_parse_ids(ids_s, &ids, &n_ids)) {
        fprintf(stderr, "k3c generate: --prompt-ids needs a comma-separated list of token ids\n");
        generate_usage(stderr);
        return 2;
    }
    int ctx = 0;
    if (cli_context(&o, n_ids, n, "-n", &ctx)) {
        fprintf(stderr, "k3c generate: %s\n", cli_error());
        free(ids);
        return 2;
    }
    k3c_model *m = NULL;
    k3c_engine *e = NULL;
    int rc = 1;
    if (cli_load_model(model, "tiny", 0, &m) != K3C_OK) goto fail;
    o.max_requests = 1;
    o.max_context = ctx;
    o.specialized = stock ? K3C_SPECIALIZED_OFF : K3C_SPECIALIZED_AUTO;
    if (k3c_engine_create(m, &o, &e) != K3C_OK) {
        cli_errorf("-n %ld with a %d-token prompt: %s", n, n_ids, k3c_last_error());
        goto fail;
    }
    cli_report_memory("generate", e, o.device);
    k3c_generate_stats st;
    int state[2] = {1, 0};
    int grc = tout.d ? k3c_generate(e, ids, n_ids, (int)n, &s, print_text, &tout, &st)
                     : k3c_generate(e, ids, n_ids, (int)n, &s, print_token, state, &st);
    if (tout.d && grc == K3C_OK && !tout.write_error) {
        const char *rest;
        size_t len;
        if (k3c_detokenizer_finish(tout.d, &rest, &len) == K3C_OK) write_text(&tout, rest, len);
    }
    if (grc != K3C_OK) {
        printf("\n");
        goto fail;
    }
    if (state[1] || tout.write_error) {
        cli_errorf("writing the output to standard output: %s (stopped after %d tokens)",
                   strerror(state[1] ? state[1] : tout.write_error), st.generated);
        goto fail;
    }
    printf("\n");
    /* the tokens before the summary on stderr, also when both go to one pipe */
    if (cli_flush_stdout() != 0) goto fail;
    int decode_steps = st.generated > 0 ? st.generated - 1 : 0;
    fprintf(stderr, "prefill: %d tokens in %.3f s (%.1f tok/s); decode: %d steps in %.3f s (%.1f tok/s) [%s]\n",
            st.prompt_tokens, st.prefill_seconds, st.prefill_seconds > 0 ? st.prompt_tokens / st.prefill_seconds : 0,
            decode_steps, st.decode_seconds, st.decode_seconds > 0 ? decode_steps / st.decode_seconds : 0, o.device);
    if (!strcmp(o.device, "cuda")) print_routes(e);
    rc = 0;
    goto done;
fail:
    fprintf(stderr, "k3c generate: %s\n", cli_error());
done:
    k3c_engine_free(e);
    if (m) k3c_free(m);
    free(ids);
    k3c_detokenizer_free(tout.d);
    k3c_tokenizer_free(tok);
    return rc;
}
