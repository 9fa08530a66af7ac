/* Output files of a command that all appear whole or not at all (k3c logits' --out and --aux-out). Each is
 * opened before any compute, so an unwritable path fails in a second instead of after the model ran; a
 * regular file is written to a temporary file beside it (same directory, hence the same file system) and
 * renamed over the target only once every output has been written and closed, so a failure anywhere leaves
 * no half-written or stale-looking file. A path that exists and is not a regular file (/dev/stdout, a FIFO,
 * /dev/full) is written in place: it cannot be renamed over, and it is never removed. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli/commands.h"

int cli_out_open(cli_out *o, const char *path) {
    memset(o, 0, sizeof *o);
    o->fd = -1;
    o->path = path;
    struct stat st;
    if (stat(path, &st) == 0 && !S_ISREG(st.st_mode)) {
        if (S_ISDIR(st.st_mode)) return cli_errorf("%s: is a directory", path);
        o->fd = open(path, O_WRONLY | O_CLOEXEC);
        if (o->fd < 0) return cli_errorf("cannot open %s for writing: %s", path, strerror(errno));
        return K3C_OK;
    }
    size_t n = strlen(path) + 16;
    o->tmp = malloc(n);
    if (!o->tmp) return cli_errorf("%s: out of memory", path);
    snprintf(o->tmp, n, "%s.tmp-XXXXXX", path);
    o->fd = mkstemp(o->tmp);
    if (o->fd < 0) {
        int e = errno;
        free(o->tmp);
        o->tmp = NULL;
        return cli_errorf("cannot create a file beside %s to write it: %s", path, strerror(e));
    }
    /* mkstemp makes it 0600; the file gets the mode a plain create would give it */
    mode_t mask = umask(0);
    umask(mask);
    if (fchmod(o->fd, 0666 & ~mask) != 0) {
        int e = errno;
        cli_out_abort(o);
        return cli_errorf("%s: %s", path, strerror(e));
    }
    return K3C_OK;
}

int cli_out_write(cli_out *o, const void *buf, size_t bytes) {
    const char *p = buf;
    while (bytes > 0) {
        ssize_t w = write(o->fd, p, bytes);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return cli_errorf("writing %s: %s", o->path, w < 0 ? strerror(errno) : "nothing written");
        p += w;
        bytes -= (size_t)w;
    }
    return K3C_OK;
}

int cli_out_close(cli_out *o) {
    int fd = o->fd;
    o->fd = -1;
    if (fd >= 0 && close(fd) != 0) return cli_errorf("writing %s: %s", o->path, strerror(errno));
    return K3C_OK;
}

int cli_out_commit(cli_out *o) {
    if (!o->tmp) return K3C_OK;
    if (rename(o->tmp, o->path) != 0) return cli_errorf("renaming to %s: %s", o->path, strerror(errno));
    o->committed = 1;
    return K3C_OK;
}

void cli_out_abort(cli_out *o) {
    if (o->fd >= 0) close(o->fd);
    o->fd = -1;
    if (o->tmp) unlink(o->committed ? o->path : o->tmp);
    cli_out_free(o);
}

void cli_out_free(cli_out *o) {
    free(o->tmp);
    o->tmp = NULL;
}
