/* One whole-file reader for the small JSON files of a checkpoint. The size comes from fstat on the open
 * descriptor (not from seeking, which a FIFO or a device would defeat), after checking that it is a regular
 * file (opened without blocking, so a FIFO is refused instead of waited on), so the buffer is sized once and
 * a short read is an error rather than a silent truncation. */
#include "util/file.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "util/error.h"

int k3c_read_file(const char *path, size_t max_bytes, char **out, size_t *len) {
    /* O_NONBLOCK: opening a FIFO for reading would otherwise wait forever for a writer, before the check
     * below could refuse it; a regular file reads the same either way */
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) return k3c_errorf_kind(K3C_ERROR_IO, "%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        return k3c_errorf_kind(K3C_ERROR_IO, "%s: cannot stat: %s", path, strerror(e));
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return k3c_errorf("%s: not a regular file", path);
    }
    FILE *f = fdopen(fd, "rb");
    if (!f) {
        int e = errno;
        close(fd);
        return k3c_errorf("%s: cannot open: %s", path, strerror(e));
    }
    if (st.st_size < 0 || (unsigned long long)st.st_size > max_bytes) {
        fclose(f);
        return k3c_errorf("%s: %lld bytes: larger than the %zu bytes allowed for this file", path,
                          (long long)st.st_size, max_bytes);
    }
    size_t n = (size_t)st.st_size;
    char *buf = malloc(n + 1);
    if (!buf) {
        fclose(f);
        return k3c_errorf_kind(K3C_ERROR_OOM, "%s: out of memory reading %zu bytes", path, n);
    }
    size_t got = fread(buf, 1, n, f);
    int e = ferror(f) ? errno : 0;
    fclose(f);
    if (got != n) {
        free(buf);
        if (e) return k3c_errorf_kind(K3C_ERROR_IO, "%s: read %zu of %zu bytes: %s", path, got, n, strerror(e));
        return k3c_errorf_kind(K3C_ERROR_IO, "%s: read %zu of %zu bytes (the file shrank while being read)", path, got, n);
    }
    buf[n] = 0;
    *out = buf;
    *len = n;
    return K3C_OK;
}
