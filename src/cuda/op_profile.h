/* GPU time per stock-forward op (a diagnostic: K3C_CUDA_PROFILE=1 when the CUDA backend is created).
 *
 * The CUDA backend brackets each launcher call of an op (the OP_TRY sites of cuda/backend_cuda.c) with two
 * CUDA events on its stream; after each stream sync the elapsed times are added up per op name. A report
 * gives, per name, calls, total and share of the summed op time; the difference between a step's wall time
 * and that sum is launch gaps and host work. Events are created once (a fixed pool); calls beyond the pool
 * within one sync interval are not timed (counted as dropped). Ops launched while the stream is capturing a
 * graph are never timed.
 *
 * K3C_CUDA_PROFILE=2 adds the replayed-graph mode for the specialized path: the eager profile above times
 * each op from its own host submission, so a small op's time includes the host's launch latency, and
 * nothing in it overlaps the way a replayed graph's PDL launches do. In this mode, while a profile is
 * armed (k3c_op_profile_arm, during a capture), end() adds a one-thread kernel after the op that stores
 * the GPU's global timer in a slot; the graph so captured is replayed, and each op is charged the time
 * from the stamp before it to its own. The stamps serialize the ops they sit between (the op after a stamp
 * cannot start before the stamp kernel ends), so the stamped step is slower than the plain replay; the
 * report gives both. */
#ifndef K3C_CUDA_OP_PROFILE_H
#define K3C_CUDA_OP_PROFILE_H

#include <stdio.h>

#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct k3c_op_profile k3c_op_profile;

/* NULL (and nothing allocated) unless K3C_CUDA_PROFILE is set to a non-zero value. */
k3c_op_profile *k3c_op_profile_create_from_env(void);
void k3c_op_profile_free(k3c_op_profile *p);
/* Slot to pass to end(), or -1 when this call is not timed. */
int k3c_op_profile_begin(k3c_op_profile *p, const char *op, cudaStream_t s);
void k3c_op_profile_end(k3c_op_profile *p, int slot, cudaStream_t s);
/* After the stream was synchronized: adds the pending intervals to the per-op totals. */
void k3c_op_profile_collect(k3c_op_profile *p);
/* Forgets the totals. */
void k3c_op_profile_reset(k3c_op_profile *p);
/* Replayed-graph mode (K3C_CUDA_PROFILE=2)? */
int k3c_op_profile_stamps(const k3c_op_profile *p);
/* K3C_CUDA_PROFILE's value (0 for NULL). 3 is the block-stamp mode of the specialized executor
 * (cuda/stamp.h, decode/executor_cuda.h k3c_decode_cuda_stamp_report); the stock path profiles as with 1. */
int k3c_op_profile_mode(const k3c_op_profile *p);
/* Arms the stamps while s captures (the first stamp, the step's start, goes in now); disarm after the
 * capture's last op, ran = whether the captured graph was launched. Ops profiled in between get a stamp
 * after them; collect() reads the stamps once that graph has run and s is idle (none when ran is 0). */
int k3c_op_profile_arm(k3c_op_profile *p, cudaStream_t s);
void k3c_op_profile_disarm(k3c_op_profile *p, int ran);
/* The stamp kernel (cuda/op_stamp.cu): the global timer (ns) into *slot. */
int k3c_cuda_stamp(unsigned long long *slot, cudaStream_t s);
/* Prints "PROF" lines (name, calls, total us, share of the op sum), largest first, and the op sum against
 * step_ms when step_ms > 0. */
void k3c_op_profile_report(const k3c_op_profile *p, FILE *f, double step_ms);

#ifdef __cplusplus
}
#endif

#endif
