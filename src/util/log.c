#include "util/log.h"

#include <stdarg.h>
#include <stdio.h>

/* Set by the embedding program before it uses the library (k3c.h: not synchronized with running calls). */
static k3c_log_fn log_fn;
static void *log_user;
static k3c_progress_fn progress_fn;
static void *progress_user;
static int progress_set;

void k3c_set_log(k3c_log_fn fn, void *user) {
    log_fn = fn;
    log_user = user;
}

void k3c_set_progress(k3c_progress_fn fn, void *user) {
    progress_fn = fn;
    progress_user = user;
    progress_set = 1;
}

const char *k3c_log_level_name(k3c_log_level level) {
    switch (level) {
    case K3C_LOG_DEBUG: return "debug";
    case K3C_LOG_INFO: return "info";
    case K3C_LOG_WARN: return "warning";
    case K3C_LOG_ERROR: return "error";
    }
    return "?";
}

void k3c_log(k3c_log_level level, const char *fmt, ...) {
    char msg[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (log_fn) {
        log_fn(log_user, level, msg);
        return;
    }
    if (level == K3C_LOG_DEBUG) return; /* the default shows info and above */
    if (level >= K3C_LOG_WARN) fprintf(stderr, "k3c: %s: %s\n", k3c_log_level_name(level), msg);
    else fprintf(stderr, "k3c: %s\n", msg);
}

/* The default: one line rewritten in place (\r), ended on the final event. */
static void progress_stderr(const k3c_progress *p) {
    double rate = p->seconds > 0 ? p->done / p->seconds : 0;
    fprintf(stderr, "\r%s %7.2f / %.2f GB  %6.2f GB/s%s", p->what, p->done / 1e9, p->total / 1e9, rate / 1e9,
            p->final ? "\n" : "");
    fflush(stderr);
}

void k3c_progress_report(const char *what, double done, double total, double seconds, int final) {
    k3c_progress p = {.what = what, .done = done, .total = total, .seconds = seconds, .final = final};
    if (!progress_set) progress_stderr(&p);
    else if (progress_fn) progress_fn(progress_user, &p);
}
