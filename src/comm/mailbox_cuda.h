/* The mailbox communicator ("mailbox"): comm/comm.h's interface over the CUDA kernels of the mailbox
 * protocol (comm/mailbox.h the protocol, comm/mailbox_dev.h the regions, comm/mailbox_dev.cu the kernels).
 * Buffers are device memory of the rank's GPU; every call is asynchronous on the rank's stream (like NCCL's:
 * returns once launched) and needs no host work beyond the launch, so a sequence of calls can be captured
 * in a CUDA graph and replayed: the epochs live in device memory and advance inside the kernels, and the
 * regions are allocated and mapped once, at creation (no per-call registration).
 *
 * all_reduce_f32 sums in rank order (rank 0 first: every rank gets the same bits, -0 kept), one-shot below
 * the crossover and two-shot (reduce-scatter + all-gather, the same sums) from it; all_gather and broadcast
 * go through the same slots; barrier is an empty exchange followed by a bounded wait for the stream.
 *
 * Failure: a kernel that waits longer than the timeout for a peer, finds a peer making another call (size
 * or kind), or sees the group aborted, reports into the rank's host-mapped status and tells its peers, and
 * every later call of the rank fails at once; since calls are asynchronous, a failure shows at the next
 * call, at barrier, or at k3c_comm_mailbox_check. abort ends every rank's waits. After a failure the group
 * is unusable (free it). Free only after a barrier (or once no rank has calls in flight).
 *
 * Without CUDA (or the kernels) every constructor fails with a message. */
#ifndef K3C_COMM_MAILBOX_CUDA_H
#define K3C_COMM_MAILBOX_CUDA_H

#include <stddef.h>
#include <stdint.h>

#include "comm/comm.h"

typedef struct k3c_comm_mailbox_options {
    size_t cap;            /* the most floats one all-reduce carries (cap * 4 bytes a gather's or a broadcast's
                              rank); 0: 1 << 20 (4 MB) */
    int timeout_ms;        /* the longest a kernel waits for a peer before it fails; 0: 10000 */
    uint32_t first_epoch;  /* the first call's epoch, the same on every rank; 0: 1 */
    size_t two_shot_bytes; /* all-reduces of at least this many bytes take the two-shot; 0: the default rule
                              (2 ranks: never; up to 4: 512 KB; more: 256 KB, vLLM's full-NVLink rule, to be
                              replaced by the x8 sweep); SIZE_MAX: never */
    int blocks;            /* blocks per rank of every kernel (1 .. 32); 0: 16, or fewer where co-residency
                              on a shared device needs it */
    int threads;           /* k3c_comm_mailbox_create: 1 when each rank's calls come from a host thread of its
                              own (the engine's and the TP tests' ranks). Where ranks then share a device, an
                              eager call (its stream not capturing) meets the other ranks' threads before its
                              launch and after it (the launch rendezvous, mailbox_cuda.c); 0: no rendezvous (one
                              thread may issue every rank's calls in turn, as the mailbox tests do) */
} k3c_comm_mailbox_options;

typedef enum k3c_mailbox_algo {
    K3C_MAILBOX_AUTO,     /* by size: one-shot below the crossover, two-shot from it */
    K3C_MAILBOX_ONE_SHOT,
    K3C_MAILBOX_TWO_SHOT,
} k3c_mailbox_algo;

/* `ranks` (2 .. 8) ranks in this process: rank r on device devices[r] (several ranks may share a device, the
 * one-GPU tests' setting), its calls on streams[r] (a cudaStream_t created with cudaStreamNonBlocking: a
 * blocking stream would wait for the legacy stream, which waits for a spinning rank's kernel). out[r]: rank
 * r's communicator; each is freed by its own free, the regions with the last one. Distinct devices get peer
 * access (refused where the devices cannot reach each other). A device shared by k ranks must hold k x
 * blocks blocks at once (checked, from the occupancy calculator) and give each rank's stream its own hardware
 * queue: CUDA_DEVICE_MAX_CONNECTIONS (default 8) at least k, set before the process first uses CUDA. */
int k3c_comm_mailbox_create(int ranks, const int *devices, void *const *streams, const k3c_comm_mailbox_options *o,
                            k3c_comm **out);

/* One process per rank: this process's rank (boot->rank of boot->size) on `device`, calls on `stream`
 * (NULL: the legacy stream). The regions are cudaMalloc'd, their IPC handles exchanged through boot's
 * all_gather (boot_on_device: boot's buffers are device memory, as NCCL's: staged through a device buffer and
 * ordered by boot's barrier), and the peers' regions opened with cudaIpcOpenMemHandle. Every rank must pass
 * the same options; a rank whose options differ, or whose peers' regions do not open, fails on every rank.
 * Not run in k3c's tests yet (one process per GPU needs several GPUs, or several processes on one). */
int k3c_comm_mailbox_create_ipc(k3c_comm *boot, int boot_on_device, int device, void *stream,
                                const k3c_comm_mailbox_options *o, k3c_comm **out);

/* all_reduce_f32 with the algorithm chosen by the caller (every rank must choose the same: another choice
 * is a mismatch, reported as one). */
int k3c_comm_mailbox_all_reduce(k3c_comm *c, float *buf, size_t n, k3c_mailbox_algo algo);

/* all_reduce_f32 (AUTO: the algorithm the communicator's own call picks for n, so the same bits) and
 * all_gather launched on `stream` (a cudaStream_t of the rank's device; NULL: the rank's own) instead of the
 * rank's stream: the specialized executor's, whose captured graphs hold these launches. The caller keeps the
 * rule the co-residency argument needs (at most one mailbox kernel of a rank in flight): the rank's streams
 * never run its mailbox calls at the same time (the executor's step waits for the backend's stream before it
 * starts, and drains its own before it returns). Every rank must make the same calls in the same order,
 * whichever stream each is on. */
int k3c_comm_mailbox_all_reduce_on(k3c_comm *c, float *buf, size_t n, void *stream);
int k3c_comm_mailbox_all_gather_on(k3c_comm *c, const void *src, void *dst, size_t bytes, void *stream);
/* The fused calls of the specialized executor (comm/mailbox.h: the pushed one-shot; mailbox_dev.h's
 * launchers), on `stream` as all_reduce_on, under the same rule (at most one mailbox kernel of a rank in
 * flight; the product kernel that pushes is no mailbox kernel: it never waits).
 *
 * push_targets: where a product's epilogue writes this rank's part of a pushed one-shot: slot[p], peer p's
 * slot for this rank as writer at parity 0 (NULL for p == rank), the parity-1 slot parity_floats further;
 * the parity is the low bit of *epoch (this rank's next epoch, device memory: read by the kernel once the
 * kernels before it on the stream have completed, as a graph replay needs); *failed nonzero: the rank has
 * failed, write nothing. cap: the most floats a call carries. */
typedef struct k3c_comm_mailbox_push {
    int ranks, rank;
    float *slot[8];
    size_t parity_floats, cap;
    const uint32_t *epoch, *failed;
} k3c_comm_mailbox_push;
int k3c_comm_mailbox_push_targets(k3c_comm *c, k3c_comm_mailbox_push *out);
/* 1 when all_reduce_on of n floats takes the one-shot (within cap): where the fused calls stand in for it. */
int k3c_comm_mailbox_one_shot(k3c_comm *c, size_t n);
/* all_reduce_on of n floats where it is a one-shot (k3c_comm_mailbox_one_shot), each sum then rounded to bf16
 * in the same launch: the bits of all_reduce_on and then k3c_cuda_round_bf16. */
int k3c_comm_mailbox_all_reduce_round_on(k3c_comm *c, float *buf, size_t n, void *stream);
/* The finish of a pushed one-shot: buf[0 .. n) (this rank's part, already pushed to every peer by a kernel
 * before this launch on `stream`) = the rank-order sum, rounded to bf16 with round: the bits of
 * all_reduce_on and then k3c_cuda_round_bf16. */
int k3c_comm_mailbox_finish_on(k3c_comm *c, float *buf, size_t n, int round, void *stream);
/* buf [rows, n] = rmsnorm(bf16(sum over ranks), w, eps) rounded to bf16, in one launch: the bits of
 * all_reduce_on, k3c_cuda_round_bf16 and k3c_cuda_rmsnorm(round 1); n a multiple of 4, rows * n <= cap. */
int k3c_comm_mailbox_reduce_rmsnorm_on(k3c_comm *c, float *buf, int rows, int n, const float *w, float eps,
                                       void *stream);
/* 1 for a mailbox communicator (the one a CUDA graph can capture), else 0. */
int k3c_comm_is_mailbox(const k3c_comm *c);

/* K3C_OK, or the failure a kernel of this rank reported (K3C_ERR with its message); launches and waits for
 * nothing. */
int k3c_comm_mailbox_check(k3c_comm *c);

typedef struct k3c_comm_mailbox_info {
    int ranks, blocks;
    size_t cap;            /* floats */
    size_t two_shot_bytes; /* SIZE_MAX: never */
    size_t region_bytes;   /* one rank's region */
} k3c_comm_mailbox_info;
int k3c_comm_mailbox_get_info(k3c_comm *c, k3c_comm_mailbox_info *info);

/* The epoch the rank's next call will use (read from the device after the rank's stream has drained: not
 * during capture); K3C_ERR where the blocks disagree (a broken invariant) or the read fails. */
int k3c_comm_mailbox_epoch(k3c_comm *c, uint32_t *epoch);

#endif
