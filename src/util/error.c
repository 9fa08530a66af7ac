#include "util/error.h"

#include <stdio.h>
#include <string.h>

static _Thread_local char error_buffer[2048];
static _Thread_local k3c_error_kind error_kind;

static int error_set(k3c_error_kind kind, const char *fmt, va_list ap) {
    vsnprintf(error_buffer, sizeof error_buffer, fmt, ap);
    error_kind = kind;
    return K3C_ERR;
}

int k3c_errorf(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    error_set(K3C_ERROR_INPUT, fmt, ap);
    va_end(ap);
    return K3C_ERR;
}

int k3c_errorf_kind(k3c_error_kind kind, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    error_set(kind, fmt, ap);
    va_end(ap);
    return K3C_ERR;
}

int k3c_error_context(const char *fmt, ...) {
    char prefix[1024], old[sizeof error_buffer];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    /* the ": " separator is added here; a prefix written with its own ("loading x: ") would double it */
    size_t n = strlen(prefix);
    while (n > 0 && (prefix[n - 1] == ' ' || prefix[n - 1] == ':')) prefix[--n] = 0;
    memcpy(old, error_buffer, sizeof old);
    snprintf(error_buffer, sizeof error_buffer, "%.1000s: %.1040s", prefix, old);
    /* context on a message nobody set (a caller's bug): the failure is the library's */
    if (error_kind == K3C_ERROR_NONE) error_kind = K3C_ERROR_INTERNAL;
    return K3C_ERR;
}

const char *k3c_error_message(void) { return error_buffer[0] ? error_buffer : "unknown error"; }

k3c_error_kind k3c_error_kind_get(void) { return error_buffer[0] ? error_kind : K3C_ERROR_NONE; }

void k3c_error_clear(void) {
    error_buffer[0] = 0;
    error_kind = K3C_ERROR_NONE;
}
