/* The CLI speaking text: `k3c generate --prompt` / `--prompt-file` / `--prompt-ids --text` against the ids
 * path and `k3c tokenize` / `detokenize` (independent commands over the same tokenizer), stopping at the end
 * ids, a model without a tokenizer, write failures; and `k3c chat` in a real terminal (tmux: keys sent, the
 * screen read back), skipped with a note where tmux is not installed. */
#include <limits.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "test.h"

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static char *slurp(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    size_t cap = 1 << 20, n = 0;
    char *buf = malloc(cap + 1);
    if (buf) n = fread(buf, 1, cap, f);
    if (buf) buf[n] = 0;
    fclose(f);
    return buf;
}

/* Runs `k3c ARGS` (shell syntax) with stdin from /dev/null: *out and *err receive stdout and stderr
 * (malloc'd); the exit status. */
static int k3c(const char *args, char **out, char **err) {
    char bin[PATH_MAX], of[PATH_MAX], ef[PATH_MAX], cmd[3 * PATH_MAX + 16384];
    *out = *err = NULL;
    if (!test_k3c_binary(bin, sizeof bin)) return -2;
    snprintf(of, sizeof of, "%s/text_stdout.txt", test_tmpdir());
    snprintf(ef, sizeof ef, "%s/text_stderr.txt", test_tmpdir());
    /* args with their own stdout redirection (" >/...") keep it (*out is then empty) */
    int own = strstr(args, " >/") != NULL;
    snprintf(cmd, sizeof cmd, "'%s' %s <'/dev/null' %s%s%s 2>'%s'", bin, args, own ? "" : ">'", own ? "" : of,
             own ? "" : "'", ef);
    unlink(of);
    int st = test_run_status(cmd);
    *out = slurp(of);
    *err = slurp(ef);
    if (!*out) *out = calloc(1, 1);
    if (!*err) *err = calloc(1, 1);
    return st;
}

/* "1 2 3\n" -> "1,2,3" (in place) */
static char *commas(char *ids) {
    for (char *p = ids; *p; p++) {
        if (*p == ' ') *p = ',';
        if (*p == '\n') *p = 0;
    }
    return ids;
}

/* Text in, text out, three ways that must agree: --prompt TEXT; the ids of TEXT from `tokenize --no-special`
 * with --prompt-ids --text; and those ids generating ids, turned into text by `detokenize`. Special-token
 * text in a plain prompt stays text. --prompt-file reads the same. */
TEST(cli_text_generate_agrees_with_ids) {
    static const char *const prompts[] = {"Hello", "The quick brown fox, 你好! <|open|>x<|close|>"};
    for (int i = 0; i < 2; i++) {
        char args[4096], *out, *err, *ids, *err2, *text, *err3;
        /* --ignore-eos: the three runs generate the same -n tokens, whatever ids come */
        snprintf(args, sizeof args, "tokenize --no-special '%s'", prompts[i]);
        CHECK(k3c(args, &ids, &err) == 0 && ids[0]);
        free(err);
        commas(ids);
        snprintf(args, sizeof args, "generate --prompt '%s' -n 24 --ignore-eos", prompts[i]);
        CHECKF(k3c(args, &text, &err) == 0, "%s", err);
        snprintf(args, sizeof args, "generate --prompt-ids %s -n 24 --text --ignore-eos", ids);
        CHECKF(k3c(args, &out, &err2) == 0, "%s", err2);
        CHECKF(!strcmp(out, text), "--prompt gave [%s], --prompt-ids --text [%s]", text, out);
        CHECK(strstr(err, "prefill: ") && strstr(err2, "prefill: "));
        free(out);
        free(err2);
        /* the prompt's token count is the tokenizer's */
        int n_ids = 1;
        for (char *p = ids; *p; p++) n_ids += *p == ',';
        char want[64];
        snprintf(want, sizeof want, "prefill: %d tokens", n_ids);
        CHECKF(strstr(err, want), "want '%s' in %s", want, err);
        free(err);
        snprintf(args, sizeof args, "generate --prompt-ids %s -n 24 --ignore-eos", ids);
        char *gen;
        CHECK(k3c(args, &gen, &err) == 0);
        free(err);
        snprintf(args, sizeof args, "detokenize --ids %s", commas(gen));
        CHECK(k3c(args, &out, &err3) == 0);
        CHECKF(!strcmp(out, text), "detokenize of the ids gave [%s], --prompt [%s]", out, text);
        free(out);
        free(err3);
        free(gen);
        /* the same text from a file */
        char path[1024];
        snprintf(path, sizeof path, "%s/prompt.txt", test_tmpdir());
        FILE *f = fopen(path, "wb");
        CHECK(f && fputs(prompts[i], f) >= 0 && fclose(f) == 0);
        snprintf(args, sizeof args, "generate --prompt-file '%s' -n 24 --ignore-eos", path);
        CHECK(k3c(args, &out, &err) == 0);
        CHECKF(!strcmp(out, text), "--prompt-file gave [%s], --prompt [%s]", out, text);
        free(out);
        free(err);
        free(text);
        free(ids);
    }
}

/* Generation stops at the first end id (tiny: [EOS] 769, <|end_of_msg|> 770): the ids up to and including it,
 * and as text what comes before it; --ignore-eos runs to -n. Prompts 1, 2, ... until one of them meets an end
 * id within 400 greedy tokens. */
TEST(cli_text_generate_stops_at_eos) {
    char args[8192], *all = NULL, *err;
    int stop_at = -1, prompt = 0;
    while (stop_at < 0 && ++prompt <= 40) {
        snprintf(args, sizeof args, "generate -n 400 --ignore-eos --prompt-ids %d", prompt);
        free(all);
        CHECK(k3c(args, &all, &err) == 0);
        free(err);
        int n = 0;
        char *ids = strdup(all);
        for (char *p = strtok(ids, " \n"); p; p = strtok(NULL, " \n"), n++)
            if (stop_at < 0 && (atoi(p) == 769 || atoi(p) == 770)) stop_at = n;
        CHECK(n == 400);
        free(ids);
    }
    CHECKF(stop_at >= 0, "no end id in 400 greedy tokens from 40 prompts");
    char *stopped;
    snprintf(args, sizeof args, "generate -n 400 --prompt-ids %d", prompt);
    CHECK(k3c(args, &stopped, &err) == 0);
    CHECKF(strstr(err, "ended at end id"), "%s", err);
    free(err);
    /* the prefix of stop_at + 1 ids */
    char *cut = strdup(all), *p = cut;
    for (int k = 0; k <= stop_at; k++) p += strcspn(p, " \n") + (k < stop_at);
    *p = 0;
    CHECKF(!strncmp(stopped, cut, strlen(cut)) && stopped[strlen(cut)] == '\n', "stopped [%s], want [%s]", stopped, cut);
    /* as text: the ids before the end id, decoded */
    char *text, *dec;
    snprintf(args, sizeof args, "generate -n 400 --prompt-ids %d --text", prompt);
    CHECK(k3c(args, &text, &err) == 0);
    free(err);
    char *last = strrchr(cut, ' ');
    if (last) {
        *last = 0;
        snprintf(args, sizeof args, "detokenize --ids %s", commas(cut));
        CHECK(k3c(args, &dec, &err) == 0);
        free(err);
    } else {
        dec = strdup("\n"); /* the end id came first: no text */
    }
    CHECKF(!strcmp(text, dec), "text [%s], want [%s]", text, dec);
    printf("    greedy tiny from prompt id %d: end id at token %d\n", prompt, stop_at + 1);
    free(text);
    free(dec);
    free(cut);
    free(stopped);
    free(all);
}

/* A model directory without tokenizer files runs on ids and says so, naming the directory, when text is
 * asked for (exit 2); bad prompt options are refused; text that cannot be written fails the run. */
TEST(cli_text_without_tokenizer_and_errors) {
    char dir[PATH_MAX], args[PATH_MAX + 256], *out, *err;
    snprintf(dir, sizeof dir, "%s/text_no_tokenizer", test_tmpdir());
    snprintf(args, sizeof args, "synth --preset tiny --out '%s'", dir);
    CHECK(k3c(args, &out, &err) == 0);
    free(out);
    free(err);
    char path[PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/tiktoken.model", dir);
    CHECK(unlink(path) == 0);
    static const char *const text_cmds[] = {"generate --prompt hi", "generate --prompt-ids 1,2 --text", "chat"};
    for (int i = 0; i < 3; i++) {
        snprintf(args, sizeof args, "%s --model '%s'", text_cmds[i], dir);
        int st = k3c(args, &out, &err);
        CHECKF(st == 2 && strstr(err, dir) && strstr(err, "no tokenizer") && strstr(err, "--prompt-ids"),
               "%s: exit %d: %s", text_cmds[i], st, err);
        free(out);
        free(err);
    }
    snprintf(args, sizeof args, "generate --model '%s' --prompt-ids 1,2 -n 3 --ignore-eos", dir);
    CHECK(k3c(args, &out, &err) == 0);
    int spaces = 0;
    for (char *p = out; *p; p++) spaces += *p == ' ';
    CHECKF(spaces == 2, "ids output [%s]", out);
    free(out);
    free(err);
    static const struct {
        const char *args, *msg;
        int status;
    } bad[] = {
        {"generate --prompt hi --prompt-ids 1", "one of --prompt, --prompt-file and --prompt-ids", 2},
        {"generate --prompt ''", "--prompt: an empty value", 2},
        {"generate --prompt-file /no/such/file", "/no/such/file", 2},
        {"generate --prompt-file /dev/null", "--prompt-file /dev/null gives no tokens", 2},
        {"chat --reasoning dim", "--reasoning: 'dim' is not show or hide", 2},
        {"chat --chat-format chatml", "chatml", 2},
        {"generate --prompt Hello -n 8 --ignore-eos >/dev/full", "writing the text to standard output", 1},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        int st = k3c(bad[i].args, &out, &err);
        CHECKF(st == bad[i].status && strstr(err, bad[i].msg), "%s: exit %d: %s", bad[i].args, st, err);
        free(out);
        free(err);
    }
}

/* ---- k3c chat in a terminal ---- */

/* tmux on a private socket (-L), no user configuration (-f /dev/null): the test neither sees nor disturbs
 * another tmux server. */
static char tmux_sock[64];

/* A test that fails midway leaves its session, where the chat would wait for input forever: at exit the last
 * server is killed, and each session starts a watchdog that kills its server after 120 s (a background job of
 * the session's shell that ignores Ctrl-C: the terminal sends it to the whole foreground group; `timeout` would
 * pass it on to the chat a second time). */
static void tmux_kill_at_exit(void) {
    char cmd[256];
    if (!tmux_sock[0]) return;
    snprintf(cmd, sizeof cmd, "tmux -f /dev/null -L %s kill-server >/dev/null 2>&1", tmux_sock);
    test_run_status(cmd);
}

static int tmux(const char *args) {
    char cmd[16384];
    snprintf(cmd, sizeof cmd, "tmux -f /dev/null -L %s %s >/dev/null 2>&1", tmux_sock, args);
    return test_run_status(cmd);
}

/* The visible screen of the session (with -e: its escape sequences too), malloc'd. */
static char *screen(int escapes) {
    char path[PATH_MAX], cmd[PATH_MAX + 256];
    snprintf(path, sizeof path, "%s/pane.txt", test_tmpdir());
    snprintf(cmd, sizeof cmd, "tmux -f /dev/null -L %s capture-pane -p -S - %s -t chat >'%s' 2>/dev/null", tmux_sock,
             escapes ? "-e" : "", path);
    if (test_run_status(cmd) != 0) return NULL;
    return slurp(path);
}

/* Polls the screen until pred holds or `seconds` pass: 1 when it held. */
static int wait_for(int (*pred)(const char *screen, const void *arg), const void *arg, double seconds) {
    double end = now_s() + seconds;
    for (;;) {
        char *s = screen(0);
        int ok = s && pred(s, arg);
        free(s);
        if (ok) return 1;
        if (now_s() > end) return 0;
        usleep(100 * 1000);
    }
}

static int has(const char *s, const void *needle) { return strstr(s, needle) != NULL; }

static int count_of(const char *s, const char *needle) {
    int n = 0;
    for (const char *p = s; (p = strstr(p, needle)); p += strlen(needle)) n++;
    return n;
}
/* `needle` at least n times on the screen */
typedef struct count_arg {
    const char *needle;
    int n;
} count_arg;
static int has_n(const char *s, const void *arg) {
    const count_arg *c = arg;
    return count_of(s, c->needle) >= c->n;
}
/* the last non-empty line is the prompt alone (capture-pane drops the space of "> "): the answer is over */
static int prompt_back(const char *s, const void *arg) {
    (void)arg;
    const char *end = s + strlen(s);
    while (end > s && (end[-1] == '\n' || end[-1] == ' ')) end--;
    const char *start = end;
    while (start > s && start[-1] != '\n') start--;
    return end - start == 1 && *start == '>';
}
/* the line "> QUESTION" is on the screen, and after it the prompt came back */
static int answered(const char *s, const void *question) {
    char line[256];
    snprintf(line, sizeof line, "> %s\n", (const char *)question);
    const char *q = strstr(s, line);
    return q && prompt_back(q + strlen(line), NULL);
}

static int start_chat(const char *args) {
    char bin[1024], cmd[4096];
    if (!test_k3c_binary(bin, sizeof bin)) return -1;
    /* the exit status is printed where the test can read it; the pane stays for the screen reads after */
    snprintf(cmd, sizeof cmd,
             "new-session -d -s chat -x 120 -y 40 \"(trap '' INT QUIT; sleep 120 && tmux -f /dev/null -L %s kill-server) "
             ">/dev/null 2>&1 & "
             "TMPDIR='%s' '%s' chat %s; echo K3C_EXIT=\\$?; sleep 30\"", tmux_sock,
             test_tmpdir(), bin, args);
    return tmux(cmd);
}

TEST(cli_text_chat_in_tmux) {
    if (test_run_status("command -v tmux >/dev/null 2>&1") != 0) {
        printf("    note: tmux is not installed (make deps installs it): k3c chat's terminal test skipped\n");
        return;
    }
    atexit(tmux_kill_at_exit);
    /* one server (socket) per phase: a server whose last session ended is still exiting when the next
     * new-session would reach it, which then fails */
    snprintf(tmux_sock, sizeof tmux_sock, "k3c-test-%d-probe", (int)getpid());
    /* tmux needs a pseudo-terminal: a chroot without /dev/pts has none */
    if (tmux("new-session -d -s probe true") != 0) {
        printf("    note: tmux cannot start a session here (no pseudo-terminals: is /dev/pts mounted?): k3c chat's "
               "terminal test skipped\n");
        return;
    }
    snprintf(tmux_sock, sizeof tmux_sock, "k3c-test-%d-turns", (int)getpid());
    /* (1) two turns that end by themselves (-n 12), then /exit: the screen is the transcript docs/TEXT.md shows */
    CHECK(start_chat("-n 12 --system 'You are terse.'") == 0);
    int ok = wait_for(prompt_back, NULL, 20);
    char *s = screen(0);
    CHECKF(ok, "no prompt within 20 s:\n%s", s ? s : "");
    free(s);
    CHECK(tmux("send-keys -t chat 'Hello, who are you?' Enter") == 0);
    ok = wait_for(answered, "Hello, who are you?", 20);
    s = screen(0);
    CHECKF(ok, "no answer and prompt within 20 s:\n%s", s ? s : "");
    free(s);
    CHECK(tmux("send-keys -t chat 'And a second turn?' Enter") == 0);
    ok = wait_for(answered, "And a second turn?", 20);
    s = screen(1);
    /* on a terminal the reasoning is dimmed (a random model's output is all reasoning: it never closes the
     * think channel the prompt opened) */
    CHECKF(ok && strstr(s, "\033[2m"), "second turn: no dimmed answer and prompt:\n%s", s ? s : "");
    free(s);
    CHECK(tmux("send-keys -t chat /exit Enter") == 0);
    ok = wait_for(has, "K3C_EXIT=", 20);
    s = screen(0);
    CHECKF(ok && strstr(s, "K3C_EXIT=0"), "/exit:\n%s", s ? s : "");
    printf("    transcript (tmux capture-pane -p):\n");
    for (char *line = strtok(s, "\n"); line; line = strtok(NULL, "\n")) printf("      | %s\n", line);
    free(s);
    tmux("kill-server");
    snprintf(tmux_sock, sizeof tmux_sock, "k3c-test-%d-stop", (int)getpid());

    /* (2) a long answer (-n 100000, --ignore-eos) stopped by Ctrl-C; the prompt comes back, a second turn
     * works, and two Ctrl-C at the prompt end the program (exit 0) */
    CHECK(start_chat("-n 100000 --max-context 120000 --ignore-eos --reasoning hide --no-thinking") == 0);
    CHECK(wait_for(prompt_back, NULL, 20));
    CHECK(tmux("send-keys -t chat 'Tell me a long story' Enter") == 0);
    /* some answer on the screen after the question (with --no-thinking K3 answers in the response channel) */
    double t0 = now_s();
    ok = 0;
    while (!ok && now_s() - t0 < 20) {
        s = screen(0);
        char *q = s ? strstr(s, "> Tell me a long story\n") : NULL;
        ok = q && strlen(q + strlen("> Tell me a long story\n")) > 200;
        free(s);
        if (!ok) usleep(100 * 1000);
    }
    CHECK(ok);
    CHECK(tmux("send-keys -t chat C-c") == 0);
    ok = wait_for(answered, "Tell me a long story", 20) && wait_for(has, "[stopped]", 1);
    s = screen(0);
    CHECKF(ok, "Ctrl-C: no [stopped] and prompt within 20 s:\n%s", s ? s : "");
    CHECK(!strstr(s, "K3C_EXIT="));
    free(s);
    CHECK(tmux("send-keys -t chat 'again' Enter") == 0);
    usleep(500 * 1000);
    CHECK(tmux("send-keys -t chat C-c") == 0);
    count_arg two_stops = {"[stopped]", 2};
    ok = wait_for(answered, "again", 20) && wait_for(has_n, &two_stops, 1);
    CHECK(ok);
    CHECK(tmux("send-keys -t chat C-c") == 0);
    CHECK(wait_for(has, "Ctrl-C again", 20));
    s = screen(0);
    CHECK(!strstr(s, "K3C_EXIT="));
    free(s);
    CHECK(tmux("send-keys -t chat C-c") == 0);
    ok = wait_for(has, "K3C_EXIT=", 20);
    s = screen(0);
    CHECKF(ok && strstr(s, "K3C_EXIT=0"), "two Ctrl-C at the prompt:\n%s", s ? s : "");
    free(s);
    tmux("kill-server");
}
