/* k3c generate: prefill a prompt (text through the model's tokenizer, or token ids) and sample new tokens,
 * printing them as they come (as text, or ids) and a summary (prefill and decode tokens/s). Without --model the
 * embedded default model runs (--preset: a synthesized one). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/commands.h"

static void generate_usage(FILE *f) {
    fprintf(f, "usage: k3c generate [--model DIR | --preset NAME]\n"
               "                    [--prompt TEXT | --prompt-file F | --prompt-ids 1,2,3] [--text]\n"
               "                    [-n 32] [--ignore-eos] [--temperature T] [--top-k K] [--top-p P] [--seed S]\n"
               "                    [--device cpu|cuda] [--threads N] [--stock] [--kv-cache bf16|fp8]\n"
               "                    [--max-context N] [--memory-limit BYTES] [--exact-f32] [--tp N]\n"
               "                    [--rank R --world-size W --rendezvous PATH] [--rank-timeout S]\n"
               "--prompt / --prompt-file (- reads stdin): text, encoded with the model's tokenizer (special-token\n"
               "  text stays text); the output is streamed as text. --prompt-ids: token ids; the output stays ids\n"
               "  unless --text. Without a prompt: the model's bos id alone, output as ids\n"
               "generation ends at -n tokens or at an end id (the config's and the tokenizer's eos, the chat\n"
               "  format's end of turn; printed as an id, not as text) unless --ignore-eos\n"
               "with --device cuda the engine takes the specialized decode executor (graph-captured steps) unless\n"
               "--stock forces the stock forward; a summary of steps per path goes to stderr\n"
               "--kv-cache fp8: MLA latent cache in FP8 E4M3 (default bf16)\n"
               "--max-context: tokens the request may hold (default: the prompt and -n); at most the model's\n"
               "  context length; --memory-limit (e.g. 8G): most bytes its caches may take (default: what the\n"
               "  device has free); a need past either is refused\n"
               "--exact-f32 (diagnostic): f32 activations, no bf16 rounding\n"
               CLI_PARALLEL_HELP CLI_MODEL_HELP);
}

#define MAX_PROMPT_FILE ((size_t)1 << 30) /* a guard against an absurd input, not a format limit */

/* What the token callback needs: the output mode, the end ids, and what happened. */
typedef struct gen_out {
    k3c_detokenizer *text; /* NULL: print ids */
    const int32_t *stops;
    int n_stops;
    int first;             /* no token printed yet */
    int write_errno;       /* a write failed (stops the generation) */
    int bad_id;            /* the text decoder refused an id (outside the tokenizer's vocabulary) */
    int32_t stopped_at;    /* the end id that stopped it, or -1 */
} gen_out;

/* Streams each token as it comes; a failed write (a full disk, a closed stdout) stops the generation, which
 * then fails, instead of computing tokens nobody receives. An end id stops it too: as ids it is printed (it
 * is part of the output), as text it is not (its text is a marker, not an answer). */
static int print_token(void *user, int32_t tok) {
    gen_out *g = user;
    int stop = 0;
    for (int i = 0; i < g->n_stops; i++) stop |= tok == g->stops[i];
    errno = 0;
    int bad;
    if (g->text) {
        const char *s = "";
        size_t n = 0;
        if (!stop && k3c_detokenizer_push(g->text, tok, &s, &n) != K3C_OK) {
            g->bad_id = 1; /* an id outside the tokenizer's vocabulary (a model vocabulary larger than it) */
            return 1;
        }
        bad = (n && fwrite(s, 1, n, stdout) != n) || fflush(stdout) != 0;
    } else {
        bad = printf("%s%d", g->first ? "" : " ", tok) < 0 || fflush(stdout) != 0;
    }
    if (bad) {
        g->write_errno = errno ? errno : EIO;
        return 1;
    }
    g->first = 0;
    if (stop) {
        g->stopped_at = tok;
        return 1;
    }
    return 0;
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
    const char *model = NULL, *preset = NULL, *ids_s = NULL, *prompt = NULL, *prompt_file = NULL;
    long n = 32;
    int stock = 0, as_text = 0, ignore_eos = 0;
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
        else if (!strcmp(argv[i], "--text")) as_text = 1;
        else if (!strcmp(argv[i], "--ignore-eos")) ignore_eos = 1;
        else if (!strcmp(argv[i], "--exact-f32")) o.exact_f32 = 1;
        else if (cli_model_option(argc, argv, &i, &model, &preset, &bad)) { /* bad on a bad value */ }
        else if ((v = cli_option(argc, argv, &i, "--prompt-ids"))) bad = cli_str("--prompt-ids", ids_s = v);
        else if ((v = cli_option(argc, argv, &i, "--prompt-file"))) bad = cli_str("--prompt-file", prompt_file = v);
        else if ((v = cli_option(argc, argv, &i, "--prompt"))) bad = cli_str("--prompt", prompt = v);
        else if ((v = cli_option(argc, argv, &i, "-n"))) bad = cli_int("-n", v, 0, 1 << 30, &n);
        else if (cli_sampling_option(argc, argv, &i, &s, &bad)) { /* into s; bad on a bad value */ }
        else if (cli_engine_option(argc, argv, &i, &o, &bad)) { /* into o; bad on a bad value */ }
        else if (cli_parallel_option(argc, argv, &i, &o, &bad)) { /* into o; bad on a bad value */ }
        else bad = cli_unexpected(argv[i]);
        if (bad) {
            fprintf(stderr, "k3c generate: %s\n", cli_error());
            generate_usage(stderr);
            return 2;
        }
    }
    if (cli_parallel_finish(&o)) {
        fprintf(stderr, "k3c generate: %s\n", cli_error());
        return 2;
    }
    if (!!ids_s + !!prompt + !!prompt_file > 1) {
        fprintf(stderr, "k3c generate: give one of --prompt, --prompt-file and --prompt-ids\n");
        return 2;
    }
    if (cli_sampling_check(&s)) {
        fprintf(stderr, "k3c generate: %s\n", cli_error());
        return 2;
    }
    int text_in = prompt || prompt_file;
    as_text |= text_in;
    int32_t *ids = NULL;
    int n_ids = 0;
    if (ids_s && cli_parse_ids(ids_s, &ids, &n_ids)) {
        fprintf(stderr, "k3c generate: --prompt-ids needs a comma-separated list of token ids\n");
        generate_usage(stderr);
        return 2;
    }
    char *file_text = NULL;
    size_t file_len = 0;
    if (prompt_file && cli_read_input(prompt_file, MAX_PROMPT_FILE, &file_text, &file_len) != 0) {
        fprintf(stderr, "k3c generate: --prompt-file: %s\n", cli_error());
        free(ids);
        return 2;
    }
    k3c_model *m = NULL;
    k3c_engine *e = NULL;
    k3c_tokenizer *tok = NULL;
    k3c_detokenizer *detok = NULL;
    int rc = 1;
    if (cli_load_model(model, preset, 0, &m) != K3C_OK) goto fail;
    if (as_text) {
        if (cli_load_tokenizer(model, preset, &tok) != 0) goto fail;
        if (!tok) {
            cli_no_tokenizer(model);
            rc = 2;
            goto fail;
        }
        if (k3c_detokenizer_create(tok, &detok) != K3C_OK) goto fail;
    } else if (!ignore_eos && cli_load_tokenizer(model, preset, &tok) != 0) {
        /* ids in and out: the tokenizer only names end ids; bad tokenizer files leave the config's eos */
        tok = NULL;
    }
    if (text_in) {
        const char *t = prompt ? prompt : file_text;
        size_t len = prompt ? strlen(prompt) : file_len;
        k3c_tokens v = {0};
        /* a plain prompt is text: special-token text in it is not a control token (k3c chat renders those) */
        if (k3c_tokenizer_encode_ordinary(tok, t, len, &v) != K3C_OK) goto fail;
        if (v.n == 0 || v.n > INT32_MAX) {
            k3c_tokens_free(&v);
            cli_errorf("%s%s gives no tokens: an empty prompt", prompt ? "--prompt" : "--prompt-file ", prompt ? "" : prompt_file);
            rc = 2;
            goto fail;
        }
        ids = v.ids; /* malloc'd, freed below */
        n_ids = (int)v.n;
    } else if (!ids) {
        /* no prompt: the model's bos id alone (0 where the config names none) */
        k3c_model_info info;
        if (k3c_model_info_get(m, &info) != K3C_OK) goto fail;
        if (!(ids = malloc(sizeof *ids))) {
            cli_errorf("out of memory");
            goto fail;
        }
        ids[0] = info.bos_token_id >= 0 ? info.bos_token_id : 0;
        n_ids = 1;
    }
    int ctx = 0;
    if (cli_context(&o, n_ids, n, "-n", &ctx)) {
        rc = 2;
        goto fail;
    }
    int32_t stops[16];
    int n_stops = ignore_eos ? 0 : cli_stop_ids(m, tok, model, stops, 16);
    o.max_requests = 1;
    o.max_context = ctx;
    o.specialized = stock ? K3C_SPECIALIZED_OFF : K3C_SPECIALIZED_AUTO;
    if (k3c_engine_create(m, &o, &e) != K3C_OK) {
        cli_errorf("-n %ld with a %d-token prompt: %s", n, n_ids, k3c_last_error());
        goto fail;
    }
    if ((rc = cli_follow("generate", e)) >= 0) goto done; /* a rank other than 0: rank 0 prints */
    rc = 1;
    cli_report_memory("generate", e, o.device);
    k3c_generate_stats st;
    gen_out g = {.text = detok, .stops = stops, .n_stops = n_stops, .first = 1, .stopped_at = -1};
    if (k3c_generate(e, ids, n_ids, (int)n, &s, print_token, &g, &st) != K3C_OK) {
        printf("\n");
        goto fail;
    }
    if (g.bad_id) {
        printf("\n");
        cli_errorf("decoding the output: %s", k3c_last_error());
        goto fail;
    }
    if (g.write_errno) {
        cli_errorf("writing the %s to standard output: %s (stopped after %d tokens)", detok ? "text" : "tokens",
                   strerror(g.write_errno), st.generated);
        goto fail;
    }
    if (detok) {
        const char *rest;
        size_t rest_n;
        /* bytes of an unfinished character at the end: U+FFFD, as the decoder promises */
        if (k3c_detokenizer_finish(detok, &rest, &rest_n) != K3C_OK) goto fail;
        fwrite(rest, 1, rest_n, stdout);
    }
    printf("\n");
    /* the tokens before the summary on stderr, also when both go to one pipe */
    if (cli_flush_stdout() != 0) goto fail;
    int decode_steps = st.generated > 0 ? st.generated - 1 : 0;
    fprintf(stderr, "prefill: %d tokens in %.3f s (%.1f tok/s); decode: %d steps in %.3f s (%.1f tok/s) [%s]\n",
            st.prompt_tokens, st.prefill_seconds, st.prefill_seconds > 0 ? st.prompt_tokens / st.prefill_seconds : 0,
            decode_steps, st.decode_seconds, st.decode_seconds > 0 ? decode_steps / st.decode_seconds : 0, o.device);
    if (g.stopped_at >= 0)
        fprintf(stderr, "k3c generate: ended at end id %d after %d tokens (--ignore-eos: run to -n)\n", g.stopped_at,
                st.generated);
    if (!strcmp(o.device, "cuda")) print_routes(e);
    rc = 0;
    goto done;
fail:
    fprintf(stderr, "k3c generate: %s\n", cli_error());
done:
    k3c_engine_free(e);
    if (m) k3c_free(m);
    k3c_detokenizer_free(detok);
    k3c_tokenizer_free(tok);
    free(ids);
    free(file_text);
    return rc;
}
