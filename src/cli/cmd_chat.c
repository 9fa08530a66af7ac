/* k3c chat: an interactive conversation with a model, line by line from stdin. The conversation is kept as
 * OpenAI-shaped JSON messages; each turn renders the whole of it through the model's chat format and prefills
 * it again (simple and always correct: a thinking template rewrites earlier turns, so the previous prompt is
 * not always a prefix of the next; the cost is the conversation's prefill every turn). The answer streams as
 * the output parser separates it: content as is, reasoning dimmed (or hidden), tool calls on their own line.
 * Ctrl-C stops the answer and returns to the prompt; at the prompt a second Ctrl-C in a row ends the program,
 * as do /exit and end of input. */
#include <cjson/cJSON.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/commands.h"

static void chat_usage(FILE *f) {
    fprintf(f, "usage: k3c chat [--model DIR] [--system TEXT] [--reasoning show|hide] [--no-thinking]\n"
               "                [--chat-format NAME] [-n 512] [--ignore-eos] [--temperature T] [--top-k K]\n"
               "                [--top-p P] [--seed S] [--device cpu|cuda] [--threads N] [--max-context N]\n"
               "                [--memory-limit BYTES] [--kv-cache bf16|fp8]\n"
               "Reads one message per line from stdin and streams the answer. -n: most tokens per answer (an answer\n"
               "also ends at the format's end of turn unless --ignore-eos). Reasoning is shown dimmed on a terminal\n"
               "(between <think> and </think> otherwise), or not at all with --reasoning hide. --no-thinking: K3's\n"
               "prompt opens the response channel instead of the think channel. --chat-format: kimi-k3,\n"
               "kimi-k2-instruct, kimi-k2-thinking, kimi-k2-thinking-moonshot or kimi-linear, instead of the model's\n"
               "template. --max-context (default 4096, or the model's context length): tokens the whole conversation\n"
               "may hold. Each turn prefills the whole conversation again. Ctrl-C stops an answer; at the prompt,\n"
               "Ctrl-C twice, /exit or end of input (Ctrl-D) quits; /reset starts a new conversation.\n"
               "Without --model the tiny preset is synthesized (seed 0): a random model, so its answers are noise.\n");
}

#define ANSI_DIM "\033[2m"
#define ANSI_RESET "\033[0m"

static volatile sig_atomic_t interrupted;
static void on_sigint(int sig) {
    (void)sig;
    interrupted = 1;
}

/* What the answer's printer knows while it streams. */
typedef enum chat_mode { MODE_NONE = 0, MODE_REASONING, MODE_CONTENT, MODE_TOOL } chat_mode;
typedef struct chat_view {
    k3c_chat_parser *p;
    const int32_t *stops;
    int n_stops, ignore_eos;
    int show_reasoning, ansi;
    chat_mode mode;
    int write_errno, stopped_by_user, failed; /* failed: the parser refused an id (its message is set) */
} chat_view;

static int put(chat_view *v, const char *s, size_t n) {
    if (n && fwrite(s, 1, n, stdout) != n) {
        v->write_errno = errno ? errno : EIO;
        return -1;
    }
    return 0;
}
static int puts_(chat_view *v, const char *s) { return put(v, s, strlen(s)); }

/* Leaves the current mode (closing the dim run or the think tags) and enters m. */
static int enter(chat_view *v, chat_mode m) {
    if (v->mode == m) return 0;
    int rc = 0;
    if (v->mode == MODE_REASONING) rc = puts_(v, v->ansi ? ANSI_RESET "\n" : "\n</think>\n");
    else if (v->mode == MODE_TOOL) rc = puts_(v, "\n");
    if (rc == 0 && m == MODE_REASONING) rc = puts_(v, v->ansi ? ANSI_DIM : "<think>\n");
    v->mode = m;
    return rc;
}

static int show_events(chat_view *v, const k3c_chat_event *ev, size_t n) {
    for (size_t i = 0; i < n; i++) {
        const k3c_chat_event *e = &ev[i];
        int rc = 0;
        char line[512];
        switch (e->kind) {
        case K3C_CHAT_REASONING:
            if (v->show_reasoning && (rc = enter(v, MODE_REASONING)) == 0) rc = put(v, e->text, e->len);
            break;
        case K3C_CHAT_CONTENT:
            if ((rc = enter(v, MODE_CONTENT)) == 0) rc = put(v, e->text, e->len);
            break;
        case K3C_CHAT_TOOL_START:
            snprintf(line, sizeof line, "%s[tool call %s] %s ", v->mode == MODE_NONE ? "" : "\n", e->id, e->name);
            if ((rc = enter(v, MODE_TOOL)) == 0) rc = puts_(v, line);
            break;
        case K3C_CHAT_TOOL_ARGS: rc = put(v, e->text, e->len); break;
        case K3C_CHAT_TOOL_END: rc = enter(v, MODE_NONE); break;
        case K3C_CHAT_TOOL_VOID: rc = puts_(v, " [malformed: shown as text]\n"); v->mode = MODE_NONE; break;
        }
        if (rc) return -1;
    }
    return fflush(stdout) == 0 ? 0 : (v->write_errno = errno ? errno : EIO, -1);
}

/* Each sampled token: through the parser to the screen; a stop id ends the answer (the parser says so), Ctrl-C
 * and a failed write stop it. */
static int on_token(void *user, int32_t tok) {
    chat_view *v = user;
    int stop = 0;
    for (int i = 0; i < v->n_stops; i++) stop |= tok == v->stops[i];
    if (!(stop && v->ignore_eos)) {
        const k3c_chat_event *ev;
        size_t n;
        if (k3c_chat_parser_feed(v->p, tok, &ev, &n) != K3C_OK) {
            v->failed = 1;
            return 1;
        }
        if (show_events(v, ev, n) != 0) return 1;
        if (k3c_chat_parser_done(v->p) == 1) return 1;
    }
    if (interrupted) {
        v->stopped_by_user = 1;
        return 1;
    }
    return 0;
}

/* One line from stdin without its newline (malloc'd in *line); 1 with a line, 0 at end of input, -1 on
 * Ctrl-C (EINTR: the handler is installed without SA_RESTART). */
static int read_line(char **line, size_t *cap) {
    errno = 0;
    ssize_t n = getline(line, cap, stdin);
    if (n >= 0) {
        while (n > 0 && ((*line)[n - 1] == '\n' || (*line)[n - 1] == '\r')) (*line)[--n] = 0;
        return 1;
    }
    int intr = interrupted || errno == EINTR;
    clearerr(stdin);
    return intr ? -1 : 0;
}

static cJSON *message(const char *role, const char *content) {
    cJSON *m = cJSON_CreateObject();
    if (!m || !cJSON_AddStringToObject(m, "role", role) || !cJSON_AddStringToObject(m, "content", content)) {
        cJSON_Delete(m);
        return NULL;
    }
    return m;
}

/* The request body of the conversation so far, ending with the assistant's opening. */
static char *request_body(cJSON *messages, int no_thinking) {
    cJSON *o = cJSON_CreateObject(), *kw = NULL;
    char *s = NULL;
    if (o && cJSON_AddItemReferenceToObject(o, "messages", messages) && cJSON_AddTrueToObject(o, "add_generation_prompt") &&
        (kw = cJSON_AddObjectToObject(o, "chat_template_kwargs")) && cJSON_AddBoolToObject(kw, "thinking", !no_thinking))
        s = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    return s;
}

int cmd_chat(int argc, char **argv) {
    const char *model = NULL, *system = NULL, *format = NULL;
    long n = 512;
    int show_reasoning = 1, no_thinking = 0, ignore_eos = 0;
    k3c_engine_options o;
    k3c_engine_options_default(&o);
    k3c_sampling s = {.top_p = 1}; /* greedy unless --temperature */
    for (int i = 1; i < argc; i++) {
        const char *v;
        int bad = 0;
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            chat_usage(stdout);
            return 0;
        } else if (!strcmp(argv[i], "--no-thinking")) no_thinking = 1;
        else if (!strcmp(argv[i], "--ignore-eos")) ignore_eos = 1;
        else if ((v = cli_option(argc, argv, &i, "--model"))) bad = cli_str("--model", model = v);
        else if ((v = cli_option(argc, argv, &i, "--system"))) bad = cli_str("--system", system = v);
        else if ((v = cli_option(argc, argv, &i, "--chat-format"))) bad = cli_str("--chat-format", format = v);
        else if ((v = cli_option(argc, argv, &i, "--reasoning"))) {
            bad = cli_str("--reasoning", v);
            if (!bad && strcmp(v, "show") && strcmp(v, "hide")) bad = cli_errorf("--reasoning: '%s' is not show or hide", v);
            show_reasoning = !bad && !strcmp(v, "show");
        } else if ((v = cli_option(argc, argv, &i, "-n"))) bad = cli_int("-n", v, 1, 1 << 30, &n);
        else if (cli_sampling_option(argc, argv, &i, &s, &bad)) { /* into s; bad on a bad value */ }
        else if (cli_engine_option(argc, argv, &i, &o, &bad)) { /* into o; bad on a bad value */ }
        else bad = cli_unexpected(argv[i]);
        if (bad) {
            fprintf(stderr, "k3c chat: %s\n", cli_error());
            chat_usage(stderr);
            return 2;
        }
    }
    if (cli_sampling_check(&s)) {
        fprintf(stderr, "k3c chat: %s\n", cli_error());
        return 2;
    }
    k3c_model *m = NULL;
    k3c_engine *e = NULL;
    k3c_tokenizer *tok = NULL;
    k3c_chat_template *tpl = NULL;
    cJSON *messages = NULL;
    char *line = NULL;
    size_t line_cap = 0;
    int rc = 1;
    if (cli_load_model(model, "tiny", 0, &m) != K3C_OK) goto fail;
    k3c_model_info info;
    if (k3c_model_info_get(m, &info) != K3C_OK) goto fail;
    if (cli_load_tokenizer(model, "tiny", &tok) != 0) goto fail;
    if (!tok) {
        cli_no_tokenizer(model);
        rc = 2;
        goto fail;
    }
    if ((format ? k3c_chat_template_from_name(format, &tpl) : k3c_chat_template_load(model, info.family, &tpl)) != K3C_OK) {
        if (!format) cli_errorf("%s (--chat-format NAME chooses a known format)", k3c_last_error());
        rc = 2;
        goto fail;
    }
    int32_t stops[8];
    int n_stops = k3c_chat_stop_ids(tpl, tok, stops, 8);
    if (n_stops < 0) goto fail;
    o.max_requests = 1;
    if (k3c_engine_create(m, &o, &e) != K3C_OK) goto fail;
    k3c_engine_memory mem;
    if (k3c_engine_memory_get(e, &mem) != K3C_OK) goto fail;
    if (!(messages = cJSON_CreateArray())) {
        cli_errorf("out of memory");
        goto fail;
    }
    if (system && !cJSON_AddItemToArray(messages, message("system", system))) {
        cli_errorf("out of memory");
        goto fail;
    }
    fprintf(stderr, "k3c chat: %s, %s format (%s), %d tokens of context on %s; /exit or Ctrl-D quits, Ctrl-C stops "
                    "an answer\n", model ? model : "the synthesized tiny preset (a random model)",
            k3c_chat_template_name(tpl), k3c_chat_template_source(tpl), mem.max_context, k3c_engine_device(e));
    /* Ctrl-C: a flag the token callback and the prompt read; no SA_RESTART, so it interrupts the line read */
    struct sigaction sa, saved;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_sigint;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, &saved);
    int tty_in = isatty(0), ansi = isatty(1), prompt_interrupts = 0;
    for (;;) {
        if (tty_in) {
            fputs("> ", stdout);
            if (cli_flush_stdout() != 0) goto fail_restore;
        }
        interrupted = 0;
        int got = read_line(&line, &line_cap);
        if (got < 0) {
            interrupted = 0;
            if (++prompt_interrupts >= 2) {
                fputs("\n", stdout);
                break;
            }
            fputs("\n(Ctrl-C again, /exit or Ctrl-D quits)\n", stdout);
            continue;
        }
        if (got == 0) {
            if (tty_in) fputs("\n", stdout);
            break;
        }
        prompt_interrupts = 0;
        if (!strcmp(line, "/exit")) break;
        if (!strcmp(line, "/reset")) {
            while (cJSON_GetArraySize(messages) > (system ? 1 : 0))
                cJSON_DeleteItemFromArray(messages, cJSON_GetArraySize(messages) - 1);
            fputs("(a new conversation)\n", stdout);
            continue;
        }
        if (!line[0]) continue;
        cJSON *user = message("user", line);
        if (!user || !cJSON_AddItemToArray(messages, user)) {
            cJSON_Delete(user);
            cli_errorf("out of memory");
            goto fail_restore;
        }
        char *body = request_body(messages, no_thinking);
        k3c_tokens prompt = {0};
        if (!body || k3c_chat_encode(tpl, tok, body, strlen(body), &prompt) != K3C_OK) {
            fprintf(stderr, "k3c chat: %s\n", body ? k3c_last_error() : "out of memory");
            cJSON_DeleteItemFromArray(messages, cJSON_GetArraySize(messages) - 1);
            free(body);
            continue;
        }
        /* the answer may use what is left of the context; the conversation must leave room for one token */
        long room = (long)mem.max_context - (long)prompt.n + 1;
        if (room < 1) {
            fprintf(stderr, "k3c chat: the conversation is %zu tokens, the context %d: /reset starts a new one "
                            "(--max-context for a longer one)\n", prompt.n, mem.max_context);
            cJSON_DeleteItemFromArray(messages, cJSON_GetArraySize(messages) - 1);
            k3c_tokens_free(&prompt);
            free(body);
            continue;
        }
        chat_view v = {.stops = stops, .n_stops = n_stops, .ignore_eos = ignore_eos, .show_reasoning = show_reasoning,
                       .ansi = ansi};
        k3c_generate_stats st;
        int ok = k3c_chat_parser_create(tpl, tok, body, strlen(body), &v.p) == K3C_OK &&
                 k3c_generate(e, prompt.ids, (int)prompt.n, (int)(n < room ? n : room), &s, on_token, &v, &st) == K3C_OK;
        const k3c_chat_event *ev;
        size_t n_ev;
        ok = ok && !v.failed && k3c_chat_parser_finish(v.p, &ev, &n_ev) == K3C_OK;
        if (ok && !v.write_errno) show_events(&v, ev, n_ev);
        if (!v.write_errno) {
            enter(&v, MODE_NONE);
            puts_(&v, v.stopped_by_user ? "\n[stopped]\n" : "\n");
            fflush(stdout);
        }
        char *answer = NULL;
        ok = ok && k3c_chat_parser_result_json(v.p, &answer) == K3C_OK;
        cJSON *a = answer ? cJSON_Parse(answer) : NULL;
        free(answer);
        k3c_chat_parser_free(v.p);
        k3c_tokens_free(&prompt);
        free(body);
        if (v.write_errno) {
            cJSON_Delete(a);
            cli_errorf("writing the answer to standard output: %s", strerror(v.write_errno));
            goto fail_restore;
        }
        if (!ok || !a) {
            cJSON_Delete(a);
            goto fail_restore;
        }
        /* the answer, as far as it went (a stopped one too: the user saw it), is part of the conversation */
        cJSON_AddItemToArray(messages, a);
        interrupted = 0;
    }
    rc = cli_flush_stdout() == 0 ? 0 : 1;
    if (rc) fprintf(stderr, "k3c chat: %s\n", cli_error());
    sigaction(SIGINT, &saved, NULL);
    goto done;
fail_restore:
    sigaction(SIGINT, &saved, NULL);
fail:
    fprintf(stderr, "k3c chat: %s\n", cli_error());
done:
    free(line);
    cJSON_Delete(messages);
    k3c_chat_template_free(tpl);
    k3c_engine_free(e);
    k3c_tokenizer_free(tok);
    if (m) k3c_free(m);
    return rc;
}
