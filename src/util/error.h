/* Error reporting: library code returns K3C_OK / K3C_ERR and leaves a message in a per-thread buffer that
 * names what failed and where (file, tensor, field, expected vs actual), and a kind (include/k3c.h's
 * k3c_error_kind) that says whose the failure is, so a server can answer 4xx or 5xx. Only main() and the
 * server decide to exit; nothing in the library calls exit() or assert()s on input. */
#ifndef K3C_UTIL_ERROR_H
#define K3C_UTIL_ERROR_H

#include <stdarg.h>

#include "k3c.h"

#ifdef __cplusplus
extern "C" {
#endif

/* K3C_OK (0) and K3C_ERR (-1) come from k3c.h. */

/* Sets the message (printf format) with kind K3C_ERROR_INPUT and returns K3C_ERR, so callers write
 * `return k3c_errorf(...)`: a bad argument, option, request, config or checkpoint content. */
int k3c_errorf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* The same with an explicit kind: K3C_ERROR_OOM where host or device memory was refused, K3C_ERROR_IO
 * where a file could not be opened, read, mapped or written, K3C_ERROR_DEVICE where a CUDA or cuBLAS call
 * failed, K3C_ERROR_INTERNAL where the library broke its own invariant. */
int k3c_errorf_kind(k3c_error_kind kind, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Prefixes the current message with more context: "loading x" + ": " + old message (a trailing ": " of the
 * prefix is dropped, so the separator never doubles); keeps the kind; returns K3C_ERR. */
int k3c_error_context(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
const char *k3c_error_message(void);
k3c_error_kind k3c_error_kind_get(void);
/* Clears the message and the kind (K3C_ERROR_NONE). */
void k3c_error_clear(void);

/* Propagate an error: K3C_TRY(call()) returns K3C_ERR from the enclosing function when call() failed. */
#define K3C_TRY(expr)                                                                                              \
    do {                                                                                                           \
        if ((expr) != K3C_OK) return K3C_ERR;                                                                      \
    } while (0)

#ifdef __cplusplus
}
#endif

#endif
