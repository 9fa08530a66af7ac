/* The CPU engine's load: the checkpoint is mapped (model/loader.c), and its matrices are read on first use.
 * Before the first step the backend makes them resident instead (every page of every mapped matrix and
 * MXFP4 tensor faulted in by the pool's threads), so that the load is done, and measured, at load: from the
 * page cache at the rate the machine maps pages, from disk at its read rate. */
#ifndef K3C_CPU_RESIDENT_H
#define K3C_CPU_RESIDENT_H

#include <stdint.h>

#include "cpu/ops.h"

struct k3c_model;

/* Faults in every page of m's mapped weights with pool's threads; *bytes: the weights' bytes, *seconds: the
 * wall time it took. */
int k3c_cpu_make_resident(k3c_pool *pool, const struct k3c_model *m, uint64_t *bytes, double *seconds);

#endif
