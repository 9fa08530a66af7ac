/* Error reporting: library code returns K3C_OK / K3C_ERR and leaves a message in a per-thread buffer that
 * names what failed and where (file, tensor, field, expected vs actual). Only main() and the server decide
 * to exit; nothing in the library calls exit() or assert()s on input. */
#ifndef K3C_UTIL_ERROR_H
#define K3C_UTIL_ERROR_H

#include <stdarg.h>

#ifdef __cplusplus
extern "C" {
#endif

#define K3C_OK 0
#define K3C_ERR (-1)

/* Sets the message (printf format) and returns K3C_ERR, so callers write `return k3c_errorf(...)`. */
int k3c_errorf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Prefixes the current message with more context: "loading x" + ": " + old message (a trailing ": " of the
 * prefix is dropped, so the separator never doubles); returns K3C_ERR. */
int k3c_error_context(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
const char *k3c_error_message(void);
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
