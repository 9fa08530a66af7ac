/* The device form of the mailbox protocol (comm/mailbox.h is the protocol and the argument for its safety;
 * comm/mailbox_dev.cu the kernels; comm/mailbox_cuda.c the communicator over them): the layout of a rank's
 * region, shared by the kernels and the host code that allocates and maps the regions, and the launchers.
 * Plain C (no CUDA header), so the CPU tests check the layout and the partition arithmetic.
 *
 * A region, one allocation per rank, the same layout on every rank (symmetric):
 *   [0, 256)      k3c_mbx_state: this rank's epochs and failure word (only it writes them) and the abort word
 *                 (written by a peer that gives up)
 *   f1            flags [2 parity][blocks][ranks writer], 16 bytes each: the one-shot's push, the two-shot's
 *                 reduce-scatter push, a gather's or a broadcast's push
 *   f2            flags [2][blocks][ranks]: the two-shot's all-gather push
 *   slots         [2 parity][ranks writer][slot_floats]: what writer w pushed (the whole input for a one-shot,
 *                 its slice of this rank's shard for a two-shot, the bytes of a gather or broadcast)
 *   ag            [2][ranks][slot_floats]: the two-shot's reduced shards, at their own offsets
 * Every part starts on a 256-byte boundary; slot_floats is the capacity rounded up to 64 floats.
 *
 * Blocks: each kernel runs `blocks` blocks per rank, the same on every rank, and block k of a rank exchanges
 * flags only with block k of each peer: block k pushes part k of the data and, after the flags, reads part k
 * of what the peers' blocks k pushed, so one flag per (parity, block, writer) orders exactly the data it
 * covers. Every block exchanges its flags in every call, whether its part is empty or not (a small call
 * leaves most parts empty), so the two-parity argument of comm/mailbox.h holds per block; each block keeps
 * its own epoch (state.epoch[k]), read at its start and advanced at its end, so a call needs no grid-wide
 * synchronisation and no host involvement (graph replays advance it in the kernel). */
#ifndef K3C_COMM_MAILBOX_DEV_H
#define K3C_COMM_MAILBOX_DEV_H

#include <stddef.h>
#include <stdint.h>

#ifdef __CUDACC__
#define K3C_MBX_HD __host__ __device__
#else
#define K3C_MBX_HD
#endif

#ifdef __cplusplus
extern "C" {
#endif

#define K3C_MBX_MAX_RANKS 8   /* the GPUs of one NVLink host; more ranks take NCCL */
#define K3C_MBX_MAX_BLOCKS 32
#ifndef K3C_MBX_THREADS /* a CPU emulation runs the kernels with smaller blocks */
#define K3C_MBX_THREADS 512
#endif
#define K3C_MBX_ALIGN 256
/* the largest capacity: counts travel as 32-bit words, a gather's bytes included (4 x floats) */
#define K3C_MBX_MAX_CAP ((size_t)1 << 28)

/* What a writer leaves for one (parity, block) in a reader's region: count and op first, then (release) the
 * epoch. count: floats of an all-reduce, bytes of a gather or broadcast. */
typedef struct k3c_mbx_flag {
    uint32_t epoch;
    uint32_t count;
    uint32_t op;
    uint32_t pad;
} k3c_mbx_flag;

#ifdef __cplusplus
static_assert(sizeof(k3c_mbx_flag) == 16, "a flag is 16 bytes: count and op beside the epoch");
#else
_Static_assert(sizeof(k3c_mbx_flag) == 16, "a flag is 16 bytes: count and op beside the epoch");
#endif

/* The kinds of call, in a flag's op (a peer making another kind of call is a mismatch, like another size). */
enum {
    K3C_MBX_OP_ONE_SHOT = 1,
    K3C_MBX_OP_TWO_SHOT = 2,
    K3C_MBX_OP_GATHER = 3,
    K3C_MBX_OP_BROADCAST = 4, /* | root << 8 */
    K3C_MBX_OP_REDUCE_NORM = 5, /* | rows << 8: an all-reduce + round + RMSNorm of whole rows (blocks own rows) */
};

typedef struct k3c_mbx_state {
    uint32_t failed;   /* set by this rank's first failing block: later calls return at once */
    uint32_t abort;    /* a peer's rank + 1: it gave up, so waits for it (or anyone) end now */
    uint32_t pad[30];  /* the epochs on their own lines */
    uint32_t epoch[K3C_MBX_MAX_BLOCKS]; /* block k's next epoch (never 0: the flags' empty value) */
} k3c_mbx_state;

/* A failure, as the rank's first failing block reports it, into host-mapped memory (code written last). */
enum {
    K3C_MBX_ERR_TIMEOUT = 1,  /* a peer's flag did not come within the timeout */
    K3C_MBX_ERR_MISMATCH = 2, /* a peer made another call (size or kind) */
    K3C_MBX_ERR_ABORTED = 3,  /* a peer (or this rank's host) aborted the group */
};
typedef struct k3c_mbx_status {
    uint32_t code;
    uint32_t peer;       /* the rank waited for, mismatched, or that aborted */
    uint32_t epoch;      /* the failing call's epoch */
    uint32_t seen;       /* what the peer's flag held */
    uint32_t count, op;  /* this rank's call */
    uint32_t peer_count, peer_op;
    uint32_t block;
    uint32_t pad[7];
} k3c_mbx_status;

typedef struct k3c_mbx_layout {
    int ranks, blocks;
    size_t slot_floats;              /* per (parity, writer) */
    size_t f1, f2, slots, ag, bytes; /* byte offsets in a region, and the region's size */
} k3c_mbx_layout;

/* What a kernel of rank `rank` needs, by value (no host state: graph replays reuse it as captured). */
typedef struct k3c_mbx_args {
    char *region[K3C_MBX_MAX_RANKS]; /* rank p's region, as this rank's device addresses it (peer-mapped) */
    k3c_mbx_status *status;          /* this rank's report: the device address of mapped host memory */
    unsigned long long timeout_ns;
    k3c_mbx_layout lay;
    int rank;
} k3c_mbx_args;

static inline size_t k3c_mbx_round(size_t x, size_t a) { return (x + a - 1) / a * a; }

/* The layout for ranks x blocks and cap floats a call (cap <= K3C_MBX_MAX_CAP); 0, or -1 for bad numbers. */
static inline int k3c_mbx_layout_make(int ranks, int blocks, size_t cap, k3c_mbx_layout *l) {
    if (ranks < 2 || ranks > K3C_MBX_MAX_RANKS || blocks < 1 || blocks > K3C_MBX_MAX_BLOCKS || cap < 1 ||
        cap > K3C_MBX_MAX_CAP)
        return -1;
    size_t flags = (size_t)2 * blocks * ranks * sizeof(k3c_mbx_flag);
    l->ranks = ranks;
    l->blocks = blocks;
    l->slot_floats = k3c_mbx_round(cap, K3C_MBX_ALIGN / sizeof(float));
    l->f1 = k3c_mbx_round(sizeof(k3c_mbx_state), K3C_MBX_ALIGN);
    l->f2 = l->f1 + k3c_mbx_round(flags, K3C_MBX_ALIGN);
    l->slots = l->f2 + k3c_mbx_round(flags, K3C_MBX_ALIGN);
    l->ag = l->slots + (size_t)2 * ranks * l->slot_floats * sizeof(float);
    l->bytes = l->ag + (size_t)2 * ranks * l->slot_floats * sizeof(float);
    return 0;
}

/* Flag (parity, block, writer) of the flag array at byte offset `at` of a region. */
static inline K3C_MBX_HD k3c_mbx_flag *k3c_mbx_flag_at(char *region, size_t at, const k3c_mbx_layout *l,
                                                       uint32_t parity, int block, int writer) {
    return (k3c_mbx_flag *)(region + at) + ((size_t)parity * l->blocks + block) * l->ranks + writer;
}

/* Slot (parity, writer) of the slot array at byte offset `at` (l->slots or l->ag) of a region. */
static inline K3C_MBX_HD float *k3c_mbx_slot_at(char *region, size_t at, const k3c_mbx_layout *l, uint32_t parity,
                                                int writer) {
    return (float *)(region + at) + ((size_t)parity * l->ranks + writer) * l->slot_floats;
}

/* Part u of `parts` of n elements: [*lo, *hi), boundaries on multiples of g elements (so a part of 16-byte
 * aligned data is 16-byte aligned), the last part ending at n; the parts cover [0, n) in order, each once.
 * One-shot block k: part k of blocks; two-shot: part s * blocks + k of ranks * blocks is block k's piece of
 * rank s's shard (the shards are contiguous: rank s owns parts s * blocks .. s * blocks + blocks - 1). */
static inline K3C_MBX_HD void k3c_mbx_part(size_t n, size_t g, unsigned u, unsigned parts, size_t *lo, size_t *hi) {
    size_t ng = n / g;
    *lo = g * (ng * u / parts);
    *hi = u + 1 == parts ? n : g * (ng * (u + 1) / parts);
}

/* The epoch after e: 0 is skipped (the flags' initial value) and the parity keeps alternating. */
static inline K3C_MBX_HD uint32_t k3c_mbx_next_epoch(uint32_t e) { return e + 1 ? e + 1 : 2; }

/* Launchers (comm/mailbox_dev.cu), asynchronous on `stream` (a cudaStream_t) on the current device, which
 * must be the one a->region[a->rank] lives on. x, src, dst: device memory of this rank. */
/* x[0 .. n) = the sum over the ranks of their x, in rank order; two_shot: reduce-scatter + all-gather. */
int k3c_mbx_all_reduce(const k3c_mbx_args *a, float *x, size_t n, int two_shot, void *stream);
/* The one-shot with each sum rounded to bf16 values: the bits of k3c_mbx_all_reduce and then the backend's
 * rounding pass (k3c_cuda_round_bf16), in one launch. */
int k3c_mbx_one_shot_round(const k3c_mbx_args *a, float *x, size_t n, void *stream);
/* The second half of a one-shot all-reduce whose push was made before this launch, by a kernel ordered before
 * it on `stream` that wrote x[0 .. n) into every peer's slot (e & 1, rank) of the slot array, e the epoch of
 * this rank's block 0 (state.epoch[0]) when that kernel ran, and fenced its stores (__threadfence_system):
 * a product's epilogue (comm/mailbox.h: the pushed one-shot and why it is safe). Then the flags, the wait and
 * the rank-order sum into x, rounded to bf16 values with round: the bits of k3c_mbx_all_reduce (one-shot or
 * two-shot) followed by the backend's rounding pass. */
int k3c_mbx_finish(const k3c_mbx_args *a, float *x, size_t n, int round, void *stream);
/* x[rows, n] (dense) = rmsnorm(bf16(the rank-order sum of x), w, eps), rounded to bf16: the bits of
 * k3c_mbx_all_reduce, then k3c_cuda_round_bf16, then k3c_cuda_rmsnorm(x, n, w, rows, n, eps, 1, x, n) (the
 * norm's reduction order reproduced, mailbox_dev.cu); n a multiple of 4, rows * n within the slots. */
int k3c_mbx_reduce_rmsnorm(const k3c_mbx_args *a, float *x, int rows, int n, const float *w, float eps,
                           void *stream);
/* root < 0: dst[p * bytes ..) = rank p's src (a gather; src may be dst + rank * bytes); else dst (= src on
 * the root) = the root's src on every rank. */
int k3c_mbx_exchange(const k3c_mbx_args *a, const void *src, void *dst, size_t bytes, int root, void *stream);
/* Writes rank + 1 into the abort word of every region (this rank's too): every waiting block ends. */
int k3c_mbx_abort(const k3c_mbx_args *a, void *stream);
/* The fewest blocks of any mailbox kernel for `ranks` ranks that one multiprocessor of the current device
 * holds at once (the occupancy calculator). */
int k3c_mbx_blocks_per_sm(int ranks, int *out);

#ifdef __cplusplus
}
#endif

#endif
