/* The rendezvous file (comm/rendezvous.h): rank 0's NCCL unique id for the other ranks, and failure notes. */
#include "comm/rendezvous.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "util/error.h"

_Static_assert(sizeof(k3c_rendezvous_record) == 224, "the record's size is part of the file format");
_Static_assert(offsetof(k3c_rendezvous_record, id) == 88, "the id's offset");
_Static_assert(offsetof(k3c_rendezvous_record, check) == 216, "the checksum's offset");

#define MAGIC "K3CRDV01"
#define POLL_MS 20

static uint64_t fnv1a(const void *p, size_t n) {
    const unsigned char *b = p;
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 0x100000001b3ull;
    return h;
}

static uint64_t now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_REALTIME, &t);
    return (uint64_t)t.tv_sec * 1000000000ull + (uint64_t)t.tv_nsec;
}

static void host_name(char out[64]) {
    memset(out, 0, 64);
    if (gethostname(out, 63) != 0) snprintf(out, 64, "?");
    out[63] = 0;
}

void k3c_rendezvous_record_fill(k3c_rendezvous_record *r, const unsigned char id[K3C_RENDEZVOUS_ID_BYTES],
                                int world_size, uint32_t pid, uint64_t written_ns, const char *host) {
    memset(r, 0, sizeof *r);
    memcpy(r->magic, MAGIC, 8);
    r->world_size = (uint32_t)world_size;
    r->pid = pid;
    r->written_ns = written_ns;
    snprintf(r->host, sizeof r->host, "%s", host);
    memcpy(r->id, id, K3C_RENDEZVOUS_ID_BYTES);
    r->check = fnv1a(r, offsetof(k3c_rendezvous_record, check));
}

/* bytes to PATH.tmp.<pid>, then renamed over path */
static int write_atomic(const char *path, const void *bytes, size_t n, const char *what) {
    char tmp[4200];
    if (snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid()) >= (int)sizeof tmp)
        return k3c_errorf("%s %s: the path is too long", what, path);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return k3c_errorf_kind(K3C_ERROR_IO, "%s: cannot create %s: %s", what, tmp, strerror(errno));
    const char *p = bytes;
    size_t done = 0;
    while (done < n) {
        ssize_t w = write(fd, p + done, n - done);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) {
            int e = errno;
            close(fd);
            unlink(tmp);
            return k3c_errorf_kind(K3C_ERROR_IO, "%s: writing %s: %s", what, tmp, strerror(e));
        }
        done += (size_t)w;
    }
    /* the data reaches the file before the name does: a reader on another host never sees the name first */
    if (fsync(fd) != 0 || close(fd) != 0) {
        int e = errno;
        unlink(tmp);
        return k3c_errorf_kind(K3C_ERROR_IO, "%s: writing %s: %s", what, tmp, strerror(e));
    }
    if (rename(tmp, path) != 0) {
        int e = errno;
        unlink(tmp);
        return k3c_errorf_kind(K3C_ERROR_IO, "%s: renaming %s to %s: %s", what, tmp, path, strerror(e));
    }
    return K3C_OK;
}

int k3c_rendezvous_publish(const char *path, const unsigned char id[K3C_RENDEZVOUS_ID_BYTES], int world_size) {
    if (!path || !*path) return k3c_errorf("rendezvous: no file named (--rendezvous PATH)");
    if (world_size < 1) return k3c_errorf("rendezvous %s: world size %d", path, world_size);
    k3c_rendezvous_clear_failures(path, world_size);
    char host[64];
    host_name(host);
    k3c_rendezvous_record r;
    k3c_rendezvous_record_fill(&r, id, world_size, (uint32_t)getpid(), now_ns(), host);
    return write_atomic(path, &r, sizeof r, "rendezvous");
}

void k3c_rendezvous_remove(const char *path) {
    if (path && *path) unlink(path);
}

/* Reads path into *r: 0 accepted; else 1 with why[] saying why it was refused (or that there is none). */
static int read_record(const char *path, int world_size, uint64_t not_before_ns, k3c_rendezvous_record *r,
                       char *why, size_t cap) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        snprintf(why, cap, "no file (%s)", strerror(errno));
        return 1;
    }
    unsigned char buf[sizeof *r + 1];
    size_t n = 0;
    for (;;) {
        ssize_t got = read(fd, buf + n, sizeof buf - n);
        if (got < 0 && errno == EINTR) continue;
        if (got <= 0) break;
        n += (size_t)got;
        if (n == sizeof buf) break;
    }
    close(fd);
    if (n != sizeof *r) {
        snprintf(why, cap, "%s: %zu%s bytes, a record is %zu", n < sizeof *r ? "truncated" : "not a k3c rendezvous record",
                 n, n > sizeof *r ? " or more" : "", sizeof *r);
        return 1;
    }
    memcpy(r, buf, sizeof *r);
    if (memcmp(r->magic, MAGIC, 8) != 0) {
        snprintf(why, cap, "not a k3c rendezvous record (magic)");
        return 1;
    }
    if (r->check != fnv1a(r, offsetof(k3c_rendezvous_record, check))) {
        snprintf(why, cap, "corrupt: its checksum does not match");
        return 1;
    }
    r->host[sizeof r->host - 1] = 0;
    if ((int)r->world_size != world_size) {
        snprintf(why, cap, "for a world size of %u, this rank's is %d", r->world_size, world_size);
        return 1;
    }
    if (r->written_ns < not_before_ns) {
        snprintf(why, cap, "stale: written %.1f s before this rank began to wait (more than its timeout)",
                 (double)(not_before_ns - r->written_ns) / 1e9 + 0.0);
        return 1;
    }
    char host[64];
    host_name(host);
    if (!strcmp(host, r->host) && r->pid > 0 && kill((pid_t)r->pid, 0) != 0 && errno == ESRCH) {
        snprintf(why, cap, "stale: written by process %u on this host, which no longer runs", r->pid);
        return 1;
    }
    return 0;
}

int k3c_rendezvous_wait(const char *path, int world_size, int timeout_ms, unsigned char id[K3C_RENDEZVOUS_ID_BYTES]) {
    if (!path || !*path) return k3c_errorf("rendezvous: no file named (--rendezvous PATH)");
    if (world_size < 1 || timeout_ms < 1)
        return k3c_errorf("rendezvous %s: world size %d, timeout %d ms", path, world_size, timeout_ms);
    uint64_t start = now_ns(), timeout_ns = (uint64_t)timeout_ms * 1000000ull;
    uint64_t not_before = start > timeout_ns ? start - timeout_ns : 0;
    struct timespec t0, t;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    char why[256] = "no file";
    for (;;) {
        k3c_rendezvous_record r;
        if (read_record(path, world_size, not_before, &r, why, sizeof why) == 0) {
            memcpy(id, r.id, K3C_RENDEZVOUS_ID_BYTES);
            return K3C_OK;
        }
        clock_gettime(CLOCK_MONOTONIC, &t);
        long ms = (long)(t.tv_sec - t0.tv_sec) * 1000 + (t.tv_nsec - t0.tv_nsec) / 1000000;
        if (ms >= timeout_ms)
            return k3c_errorf_kind(K3C_ERROR_IO,
                                   "rendezvous %s: no usable record from rank 0 after %d ms (last seen: %s); is rank "
                                   "0 running with the same --rendezvous and --world-size %d?",
                                   path, timeout_ms, why, world_size);
        struct timespec nap = {0, POLL_MS * 1000000L};
        nanosleep(&nap, NULL);
    }
}

static int note_path(char *out, size_t cap, const char *path, int rank) {
    return snprintf(out, cap, "%s.failed.%d", path, rank) < (int)cap ? K3C_OK : K3C_ERR;
}

int k3c_rendezvous_note_failure(const char *path, int rank, long step, const char *msg) {
    char p[4200], text[1200];
    if (!path || !*path || note_path(p, sizeof p, path, rank) != K3C_OK) return K3C_ERR;
    int n = snprintf(text, sizeof text, "%ld %llu\n%s\n", step, (unsigned long long)now_ns(), msg ? msg : "");
    if (n < 0) return K3C_ERR;
    if ((size_t)n >= sizeof text) n = (int)sizeof text - 1;
    return write_atomic(p, text, (size_t)n, "rendezvous failure note");
}

int k3c_rendezvous_find_failure(const char *path, int world_size, int *rank, long *step, char *msg, size_t cap) {
    int found = 0;
    unsigned long long first = 0;
    if (!path || !*path) return 0;
    for (int r = 0; r < world_size; r++) {
        char p[4200], text[1200];
        if (note_path(p, sizeof p, path, r) != K3C_OK) continue;
        FILE *f = fopen(p, "r");
        if (!f) continue;
        size_t n = fread(text, 1, sizeof text - 1, f);
        fclose(f);
        text[n] = 0;
        long s = 0;
        unsigned long long ns = 0;
        char *nl = strchr(text, '\n');
        if (!nl || sscanf(text, "%ld %llu", &s, &ns) != 2) continue;
        /* the earliest note: the rank that failed first; the others' notes are what its abort did to them */
        if (found && ns >= first) continue;
        found = 1;
        first = ns;
        *rank = r;
        *step = s;
        char *body = nl + 1, *end = strchr(body, '\n');
        if (end) *end = 0;
        if (cap) snprintf(msg, cap, "%s", body);
    }
    return found;
}

void k3c_rendezvous_clear_failures(const char *path, int world_size) {
    if (!path || !*path) return;
    for (int r = 0; r < world_size; r++) {
        char p[4200];
        if (note_path(p, sizeof p, path, r) == K3C_OK) unlink(p);
    }
}
