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
 * -0.0 and NaN included. */
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
