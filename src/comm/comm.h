/* Collectives between the ranks of one parallel group (tensor, pipeline, data or expert parallel). Below both
 * the stock forward (stock TP needs the all-reduce) and the specialized decode (its mailboxes, later, beside
 * these), above nothing but the backends' memory: a communicator moves bytes, it knows no model.
 *
 * Memory: every buffer is in the memory of the backend the communicator was made for (host memory for the
 * CPU backend and the in-memory group below; device memory, ordered on the communicator's stream, for NCCL).
 *
 * Reduction order: the in-memory implementations sum element i as ((b_0[i] + b_1[i]) + b_2[i]) + ... in f32,
 * rank 0 first, whatever order the ranks arrive in, and hand every rank the same sum, so every rank ends with
 * bitwise the same values. (NCCL also gives every rank the same bits, in its own order: ring or tree.)
 *
 * Failure: every call of every rank must be matched by the same call on every other rank of the group (the
 * same sizes). A rank that fails marks the group failed (abort); the other ranks' pending and later calls
 * then return K3C_ERR instead of waiting, and a wait that outlasts the group's timeout fails the same way,
 * so no rank hangs on a peer that is gone. */
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
};

/* World size 1: the sum and the gather of one rank (rank 0 of 1); host memory. Never fails. */
k3c_comm *k3c_comm_self(void);

/* In-memory group of `size` ranks in one process (one thread per rank), host memory: the CPU ranks' stand-in
 * for NCCL behind the same interface. create makes the group, join hands out rank r's communicator (each rank
 * once; its free leaves the group, the last one frees it). timeout_ms: the longest any rank waits for the
 * others in one call (0: 60 s). */
typedef struct k3c_comm_group k3c_comm_group;
int k3c_comm_group_create(int size, int timeout_ms, k3c_comm_group **out);
int k3c_comm_group_join(k3c_comm_group *g, int rank, k3c_comm **out);
/* Frees a group no rank joined (after a failed setup); a joined group is freed by its last rank's free. */
void k3c_comm_group_free(k3c_comm_group *g);

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

#endif
