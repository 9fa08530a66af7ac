/* The library's only way to say something outside a return value: warnings, notes and progress go through
 * k3c_log / k3c_progress_report to the callbacks of include/k3c.h (k3c_set_log, k3c_set_progress), whose
 * defaults write to stderr what the library wrote there before they existed. Nothing else in src/ outside
 * src/cli writes to stderr or stdout. */
#ifndef K3C_UTIL_LOG_H
#define K3C_UTIL_LOG_H

#include "k3c.h"

#ifdef __cplusplus
extern "C" {
#endif

void k3c_log(k3c_log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* One progress event (see k3c_progress in k3c.h). */
void k3c_progress_report(const char *what, double done, double total, double seconds, int final);

#ifdef __cplusplus
}
#endif

#endif
