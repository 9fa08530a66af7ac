/* The embedded default model (models/k3-fortune): written out byte for byte, loadable with its tokenizer; the
 * CLI's temporary copy of it removed, signals included. */
#include <dirent.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "k3c.h"
#include "test.h"
#include "util/error.h"

/* Entries of a directory other than . and .. (-1: cannot open). */
static int count_entries(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return -1;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) n++;
    closedir(d);
    return n;
}

TEST(default_model_write_loads) {
    char dir[] = "/tmp/k3c-test-default-XXXXXX";
    CHECK(mkdtemp(dir) != NULL);
    CHECK_OK(k3c_default_model_write(dir));
    char cmd[256];
    snprintf(cmd, sizeof cmd, "cmp -s %s/config.json models/k3-fortune/config.json && cmp -s %s/tiktoken.model "
             "models/k3-fortune/tiktoken.model", dir, dir);
    CHECK(system(cmd) == 0);
    k3c_model *m = NULL;
    CHECK_OK(k3c_load(dir, &m));
    k3c_tokenizer *t = NULL;
    CHECK_OK(k3c_tokenizer_load(dir, &t));
    k3c_tokenizer_free(t);
    k3c_free(m);
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    CHECK(system(cmd) == 0);
    CHECK(k3c_default_model_write("/nonexistent-k3c-dir") != K3C_OK);
}

/* Without --model the CLI runs the embedded model from a temporary directory that it removes: after generate,
 * tokenize and chat nothing is left in $TMPDIR; a SIGTERM at any moment of the write (sent 0 .. 30 ms after
 * the start, while the 12.5 MB go out) leaves nothing either, and the process ends by that signal. */
TEST(default_model_cli_leaves_nothing) {
    char bin[PATH_MAX], tmp[PATH_MAX], cmd[3 * PATH_MAX + 256];
    CHECK(test_k3c_binary(bin, sizeof bin));
    snprintf(tmp, sizeof tmp, "%s/default_tmp", test_tmpdir());
    CHECK(mkdir(tmp, 0755) == 0);
    static const char *const runs[] = {"generate --prompt Hi -n 2", "tokenize Hi", "chat -n 2 </dev/null"};
    for (int i = 0; i < 3; i++) {
        snprintf(cmd, sizeof cmd, "TMPDIR='%s' '%s' %s >/dev/null 2>&1", tmp, bin, runs[i]);
        CHECKF(test_run_status(cmd) == 0, "k3c %s failed", runs[i]);
        CHECKF(count_entries(tmp) == 0, "k3c %s left %d entries in %s", runs[i], count_entries(tmp), tmp);
    }
    int signalled = 0;
    for (int k = 0; k < 16; k++) {
        int in[2];
        CHECK(pipe(in) == 0);
        pid_t pid = fork();
        CHECK(pid >= 0);
        if (pid == 0) {
            setenv("TMPDIR", tmp, 1);
            signal(SIGTERM, SIG_DFL);
            int fd = open("/dev/null", O_RDWR);
            if (fd >= 0) dup2(fd, 1), dup2(fd, 2);
            /* chat reads a pipe nobody writes: it never exits by itself */
            dup2(in[0], 0);
            close(in[1]);
            execl(bin, bin, "chat", (char *)NULL);
            _exit(127);
        }
        close(in[0]);
        usleep((useconds_t)(k * 2000));
        kill(pid, SIGTERM);
        int status = 0;
        waitpid(pid, &status, 0);
        close(in[1]);
        signalled += WIFSIGNALED(status) && WTERMSIG(status) == SIGTERM;
        CHECKF(count_entries(tmp) == 0, "SIGTERM %d ms after the start left %d entries in %s", k * 2,
               count_entries(tmp), tmp);
    }
    CHECKF(signalled == 16, "%d of 16 runs ended by SIGTERM", signalled);
}
