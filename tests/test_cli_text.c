/* generate --prompt: the prompt through the model's tokenizer, the answer streamed as text. Checked end to end
 * against the id commands: tokenize the prompt, generate from those ids, detokenize the answer; the text
 * command must print exactly that. A model directory without tokenizer files is refused with a message. */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "test.h"

/* stdout of a shell command (malloc'ed, NUL-terminated, the trailing newline dropped); *status its exit. */
static char *capture(const char *cmd, int *status) {
    FILE *p = popen(cmd, "r");
    if (!p) return NULL;
    size_t cap = 1 << 16, n = 0;
    char *buf = calloc(cap + 1, 1);
    if (buf) n = fread(buf, 1, cap, p);
    int st = pclose(p);
    *status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
    if (!buf) return NULL;
    while (n && buf[n - 1] == '\n') buf[--n] = 0;
    return buf;
}

TEST(cli_generate_prompt_text_matches_id_commands) {
    char bin[PATH_MAX], dir[PATH_MAX], cmd[4 * PATH_MAX + 8192];
    CHECK(test_k3c_binary(bin, sizeof bin));
    snprintf(dir, sizeof dir, "%s/cli_text_tiny", test_tmpdir());
    snprintf(cmd, sizeof cmd, "'%s' synth --preset tiny --out '%s' --seed %llu >/dev/null 2>&1", bin, dir,
             (unsigned long long)(test_seed() % 997));
    CHECK(test_run_status(cmd) == 0);
    static const char *prompts[] = {"Hello, world", "Fortune favours the bold. 人生", "x"};
    for (size_t k = 0; k < sizeof prompts / sizeof prompts[0]; k++) {
        int st;
        snprintf(cmd, sizeof cmd, "'%s' tokenize --model '%s' '%s' 2>/dev/null", bin, dir, prompts[k]);
        char *ids = capture(cmd, &st);
        CHECKF(ids && st == 0 && ids[0], "tokenize '%s': exit %d", prompts[k], st);
        for (char *c = ids; c && *c; c++)
            if (*c == ' ') *c = ',';
        snprintf(cmd, sizeof cmd, "'%s' generate --model '%s' --prompt-ids %s -n 12 --ignore-eos 2>/dev/null", bin, dir, ids);
        char *out_ids = capture(cmd, &st);
        CHECKF(out_ids && st == 0, "generate --prompt-ids: exit %d", st);
        for (char *c = out_ids; c && *c; c++)
            if (*c == ' ') *c = ',';
        snprintf(cmd, sizeof cmd, "'%s' detokenize --model '%s' --ids %s 2>/dev/null", bin, dir, out_ids);
        char *want = capture(cmd, &st);
        CHECKF(want && st == 0, "detokenize: exit %d", st);
        snprintf(cmd, sizeof cmd, "'%s' generate --model '%s' --prompt '%s' -n 12 --ignore-eos 2>/dev/null", bin, dir,
                 prompts[k]);
        char *got = capture(cmd, &st);
        CHECKF(got && st == 0, "generate --prompt '%s': exit %d", prompts[k], st);
        if (want && got) CHECKF(!strcmp(want, got), "prompt '%s': text '%s', the id commands give '%s'", prompts[k], got, want);
        free(ids), free(out_ids), free(want), free(got);
    }
    /* without tokenizer files: refused, naming the directory, exit 2 */
    snprintf(cmd, sizeof cmd, "rm -f '%s/tiktoken.model' '%s/tokenizer_config.json'", dir, dir);
    CHECK(test_run_status(cmd) == 0);
    int st;
    snprintf(cmd, sizeof cmd, "'%s' generate --model '%s' --prompt hi -n 2 2>&1 >/dev/null", bin, dir);
    char *err = capture(cmd, &st);
    CHECKF(st == 2 && err && strstr(err, "no tokenizer files"), "no tokenizer: exit %d, '%s'", st, err ? err : "");
    free(err);
    /* ids still work there */
    snprintf(cmd, sizeof cmd, "'%s' generate --model '%s' --prompt-ids 1,2 -n 2 >/dev/null 2>&1", bin, dir);
    CHECK(test_run_status(cmd) == 0);
}
