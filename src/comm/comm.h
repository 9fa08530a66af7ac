/* Collectives between the ranks of one parallel group (tensor, pipeline, data or expert parallel). Below both
 * the stock forward (stock TP needs the all-reduce) and the specialized decode (its mailboxes, later, beside
 * these), above nothing but the backends' memory: a communicator moves bytes, it knows no model.
 *
 * Memory: every buffer is in the memory of the backend the communicator was made for (host memory for the
 * CPU backend and the in-memory group below; device memory, ordered on the communicator's stream, for NCCL
 * and the staged group). stream_ordered tells the caller which: 0, the call reads and writes host memory
 * when it runs, so whatever produced the buffer must have finished (the stock forward syncs the backend
 * first); 1, the buffers are device memory and the call is queued on the stream the communicator was made
 * for, after the work queued there before it and before the work queued after it, so a caller that queues
 * its ops on that same stream (k3c_backend_cuda_stream) needs no host wait around it.
 *
 * Reduction order: the in-memory implementations sum element i as ((b_0[i] + b_1[i]) + b_2[i]) + ... in f32,
 * rank 0 first, whatever order the ranks arrive in, and hand every rank the same sum, so every rank ends with
 * bitwise the same values. (NCCL also gives every rank the same bits, in its own order: ring or tree.)
 *
 * Failure: every call of every rank must be matched by the same call on every other rank of the group (the
 * same sizes; a send by its peer's recv). A rank that fails marks the group failed (abort); the other ranks'
 * pending and later calls then return K3C_ERR instead of waiting, and a wait that outlasts the group's
 * timeout fails the same way, so no rank hangs on a peer that is gone. Mismatched calls (sizes, counts) fail
 * every rank that takes part in them. */
#ifndef K3C_COMM_COMM_H
#define K3C_COMM_COMM_H

#include <stddef.h>

typedef struct k3c_comm k3c_comm;

struct k3c_comm {
    const char *name; /* "self", "threads", "nccl" */
    int rank, size;
    void *ctx;
    /* buf[0 .. n) = the element-wise f32 sum over the ranks of their buf (in place). */
    int (*all_reduce_f32)(k3c_comm *c, float *buf, size_t n);
    /* dst[r * bytes .. (r + 1) * bytes) = rank r's src[0 .. bytes), on every rank; src may be dst + rank * bytes. */
    int (*all_gather)(k3c_comm *c, const void *src, void *dst, size_t bytes);
    /* buf[0 .. bytes) = root's buf on every rank. */
    int (*broadcast)(k3c_comm *c, void *buf, size_t bytes, int root);
    /* Returns once every rank called it. */
    int (*barrier)(k3c_comm *c);
    /* Marks the group failed (this rank gives up): the other ranks' waits return K3C_ERR. */
    void (*abort)(k3c_comm *c);
    void (*free)(k3c_comm *c);
    int stream_ordered; /* see Memory above: 0 host memory (self, threads), 1 device memory on a stream */

    /* The calls below are NULL in the mailbox communicator (comm/mailbox_cuda.h): the forward refuses it as a
     * pipeline or expert-parallel group. The in-memory group, the staged one and NCCL have them. */

    /* ---- point to point (pipeline stages) ---- */
    /* Sends buf[0 .. bytes) to rank peer (not this rank). Returns once the peer's matching recv has it: the
     * sends from one rank to one peer pair with that peer's recvs from it in call order, and since a send
     * waits for its recv, the ranks' sends and recvs must not wait on each other in a cycle (a pipeline sends
     * forward only). */
    int (*send)(k3c_comm *c, const void *buf, size_t bytes, int peer);
    /* Receives the next send of rank peer into buf; bytes must be the sender's (else both fail). */
    int (*recv)(k3c_comm *c, void *buf, size_t bytes, int peer);

    /* ---- expert parallel ---- */
    /* All-to-all with a count per peer (all-to-allv), every rank calling it: rank r's send holds, packed in
     * rank order, send_bytes[p] bytes for each rank p; its recv gets, packed in rank order, recv_bytes[p]
     * bytes from each rank p. send_bytes[p] of rank r must equal recv_bytes[r] of rank p (else every rank
     * fails); counts may be 0; send and recv do not overlap.
     * Why an all-to-all for the MoE and not all-gather + reduce-scatter: the expert-parallel forward
     * (stock/forward.c) dispatches each (token, selected expert) row to the expert's rank and the combine
     * hands each expert's output back to the token's rank, which sums them in the router's order exactly as
     * world size 1 does; a rank moves only the rows it needs. All-gather + reduce-scatter moves every token
     * to every rank and sums per-rank partial sums, in rank order, rounding differently from world size 1. */
    int (*all_to_all)(k3c_comm *c, const void *send, const size_t *send_bytes, void *recv,
                      const size_t *recv_bytes);
    /* A sub-group (ncclCommSplit), every rank calling it: the ranks giving the same color >= 0 form a group,
     * ranked by (key, rank here); color < 0: no group (*out = NULL). The sub-group is independent (its own
     * calls, its own free); for the in-memory group a failure anywhere fails every group split from the same
     * world, so a rank whose peer in another sub-group failed does not wait out the timeout. */
    int (*split)(k3c_comm *c, int color, int key, k3c_comm **out);
};

/* The groups of one rank of a (tp, pp, dp) layout over a world of tp x dp x pp ranks, as k3c_layout_plan
 * numbers them (model/layout.c): world rank w = (stage dp + dp rank) tp + tp rank, so tp groups are runs of
 * tp consecutive ranks. tp: the ranks of a stage and DP rank; pp: one rank per stage with the same tp and dp
 * ranks (its rank is the stage); ep (ep = tp x dp > 1, as k3c_layout's ep; tp = 1): the dp ranks of a stage,
 * whose routed experts are spread over them (its rank is the DP rank). NULL where a group would have one rank
 * (or ep = 1). */
typedef struct k3c_comm_groups {
    k3c_comm *tp, *pp, *ep;
} k3c_comm_groups;
/* Splits world (every rank calling it) into the rank's groups. Fails when world's size is not tp x dp x pp,
 * or ep is neither 1 nor tp x dp (with tp > 1 and ep: the hybrid, its EP group every rank of the stage). */
int k3c_comm_groups_split(k3c_comm *world, int tp, int pp, int dp, int ep, k3c_comm_groups *out);
void k3c_comm_groups_free(k3c_comm_groups *g);

/* World size 1: the sum and the gather of one rank (rank 0 of 1); host memory. Never fails. */
k3c_comm *k3c_comm_self(void);

/* In-memory group of `size` ranks in one process (one thread per rank), host memory: the CPU ranks' stand-in
 * for NCCL behind the same interface. create makes the group, join hands out rank r's communicator (each rank
 * once; its free leaves the group, which is freed once all `size` ranks have joined and left, so a rank that
 * leaves early does not free it under a late joiner). timeout_ms: the longest any rank waits for the others
 * in one call (0: 60 s). */
typedef struct k3c_comm_group k3c_comm_group;
int k3c_comm_group_create(int size, int timeout_ms, k3c_comm_group **out);
int k3c_comm_group_join(k3c_comm_group *g, int rank, k3c_comm **out);
/* After a failed setup (not every rank will join): frees the group now if no rank is joined, else when the
 * joined ranks have left. Not needed once every rank joined. */
void k3c_comm_group_free(k3c_comm_group *g);

/* Staged (comm/staged.c): device memory for several ranks of one process, one thread each, on one GPU or
 * several (the one-GPU tests: NCCL refuses two ranks on one device), NCCL-free, as a reference. Rank r's
 * communicator joins the in-memory group g as rank r (k3c_comm_group_join; free leaves it) and runs every
 * collective as: device -> pinned host copy on `stream` (a cudaStream_t, the rank's; device its GPU), a
 * bounded wait for the stream (at most timeout_ms, 0: 60 s), the group's collective on the host copies
 * (threads.c: the rank-order sum, every rank the same bits), host -> device on the stream. So it is
 * stream_ordered, but it blocks the calling thread until the stream reaches it, and it refuses to run while
 * its stream is being captured into a CUDA graph (a host wait cannot be captured): a captured step needs a
 * device-side communicator (NCCL, the mailboxes). Host staging grows to the largest call and is kept.
 * send / recv, all_to_all and split go the same way (a send's host copy is handed to the group's send, which
 * returns once the peer's recv has copied it; split gives staged sub-groups on the same device and stream),
 * so pipeline stages and expert-parallel ranks on one GPU run over it too.
 * Free it before its stream is destroyed. Without CUDA in the build it fails with a message. */
int k3c_comm_staged_create(k3c_comm_group *g, int rank, int device, void *stream, int timeout_ms, k3c_comm **out);

/* NCCL (comm/nccl.c): where the toolkit's nccl.h is present at build time and libnccl.so.2 loads at run time;
 * otherwise it fails with a message saying which. One process per GPU: every rank calls it with the same
 * 128-byte unique id (k3c_comm_nccl_unique_id on rank 0, handed to the others out of band: a file, a TCP
 * rendezvous) and its own rank. stream: the cudaStream_t the collectives are ordered on (NULL: the default). */
#define K3C_COMM_NCCL_ID_BYTES 128
int k3c_comm_nccl_unique_id(unsigned char id[K3C_COMM_NCCL_ID_BYTES]);
int k3c_comm_nccl_create(const unsigned char id[K3C_COMM_NCCL_ID_BYTES], int rank, int size, int device,
                         void *stream, k3c_comm **out);
/* 0 where this build has NCCL and libnccl.so.2 loads; else -1 naming which is missing (every rank checks
 * before the rendezvous, so a host without NCCL fails at once instead of waiting). */
int k3c_comm_nccl_check(void);
/* The ranks of parent that pass the same color form a new communicator, ordered by key (0 .. n - 1 within a
 * color: the new rank); every rank of parent calls it (ncclCommSplit). Same stream as parent. */
int k3c_comm_nccl_split(k3c_comm *parent, int color, int key, k3c_comm **out);
/* The stream c's later collectives are queued on (a cudaStream_t of its device), every rank calling it (it
 * drains c first: a barrier): the engine's ranks move the TP group onto the backend's stream once the backend
 * exists, so the stock forward's ops and its collectives are ordered on one stream. */
int k3c_comm_nccl_set_stream(k3c_comm *c, void *stream);

#endif
