/* The mailbox all-reduce protocol (issue: the executor's in-kernel one-shot all-reduce), as a state machine
 * on host threads: the model the CUDA kernel will follow, tested here through the hard cases before the kernel
 * exists (tests/test_mailbox.c).
 *
 * Memory: one region per rank, allocated once for the group (symmetric: every rank's region has the same
 * layout; on GPUs, peer-mapped between the ranks' processes). Region r holds, for each parity b in {0, 1} and
 * each peer p, a slot of `cap` floats that only rank p writes, its element count, and a 32-bit flag.
 *
 * One call of rank r with epoch e (b = e & 1), n <= cap floats x:
 *   1. push: for every peer p != r, copy x into region p's slot [b][r], store n, then store flag [b][r] = e
 *      with release order (the data is visible before the flag);
 *   2. wait: for every peer p != r, spin until region r's flag [b][p] == e (acquire), within a timeout;
 *      a peer's n different from r's is a mismatched call: an error on every rank that sees it;
 *   3. sum, in place: x[i] = ((s_0[i] + s_1[i]) + s_2[i]) + ..., s_p rank p's values (x itself for p = r),
 *      rank 0 first, so every rank computes bitwise the same sum (and -0 + -0 stays -0: the sum starts from
 *      rank 0's value, not from +0);
 *   4. e = e + 1, but 2 after 2^32 - 1: 0 is the flags' initial value (a flag never equals an epoch it was
 *      not set to) and the parity must keep alternating.
 *
 * Why two parities and no barrier: a rank p can push epoch e + 2 into the slot [b][p] of region r only after
 * finishing epoch e + 1, which needed r's push of e + 1, which r makes only after it finished reading epoch e
 * from that slot. So a slot is never overwritten while it is read, with no acknowledgement and no reset of
 * flags (the flag's value, not its presence, says which call it belongs to). Epochs wrap at 2^32; only
 * equality is ever compared, and a flag two calls stale differs from the current epoch.
 *
 * No sentinel in the data (the barrier-free push with a NaN or -0 pattern): the payload may hold any bits,
 * -0.0 and NaN included.
 *
 * The pushed one-shot (the device form's fused calls, comm/mailbox_dev.h k3c_mbx_finish): step 1's copy is
 * made by the kernel that produces x (a row-parallel product's epilogue, cuda/gemm.h k3c_cuda_fanout), which
 * stores x straight into slot [b][r] of every peer's region, b from r's own epoch e as that kernel reads it,
 * and fences; a later kernel on r's stream (the finish) then stores the flags, waits, sums and rounds. The
 * producer writes slot [b][r] of call e before any flag of call e exists, and that is as safe as the plain
 * push, for the reason above: the producer runs only after r's call e - 1 completed (stream order; no
 * kernel between them lets its successor start before it ends, and the mailbox kernels never do), so every
 * peer p has posted its flags of e - 1, so p finished reading epoch e - 2 from that slot (p reads epoch e - 2
 * before it starts call e - 1). A peer reads slot [b][r] for call e only after r's flag [b][r] = e, which r
 * stores after the producer's stores (all of x, then a system-scope fence, then kernel completion, then the
 * finish's own fence and release store), so it reads x, not what the slot held before. The epoch the
 * producer reads is the one the finish will use: nothing runs between them on r's stream, and r's epoch
 * changes only at the end of r's mailbox calls. A producer's parity is never guessed (the executor's graphs
 * replay it: the device's epoch decides each time). When r has failed, its producer writes nothing (its
 * finish returns at once). The finish exchanges the same flags and the same data as the plain one-shot of
 * the same n, so the two pair call for call (a rank may push either way).
 *
 * Whole rows (k3c_mbx_reduce_rmsnorm): the same protocol with the data split by rows instead of elements
 * (a norm needs its row), block k pushing and reading the rows of its part; another kind of call (op), so
 * a rank splitting the same floats differently is a mismatch, not a silent misread. */
#ifndef K3C_COMM_MAILBOX_H
#define K3C_COMM_MAILBOX_H

#include <stddef.h>
#include <stdint.h>

typedef struct k3c_mailbox k3c_mailbox;

/* The regions of `ranks` ranks (2 .. 64), slots of cap floats (> 0). */
int k3c_mailbox_create(int ranks, size_t cap, k3c_mailbox **out);
void k3c_mailbox_free(k3c_mailbox *mb);

/* One rank's side: its rank and its next epoch (every rank of the group starts from the same one). */
typedef struct k3c_mailbox_rank {
    k3c_mailbox *mb;
    int rank;
    uint32_t epoch;
} k3c_mailbox_rank;

/* first_epoch 0 means 1 (0 is the flags' empty value). */
int k3c_mailbox_rank_init(k3c_mailbox *mb, int rank, uint32_t first_epoch, k3c_mailbox_rank *r);

/* x[0 .. n) = the sum over the ranks of their x (in place), every rank bitwise the same; n <= cap. Fails (and
 * leaves x unchanged) when a peer has not pushed within timeout_ms or pushed another n. */
int k3c_mailbox_all_reduce(k3c_mailbox_rank *r, float *x, size_t n, int timeout_ms);

#endif
