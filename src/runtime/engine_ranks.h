/* The engine as one rank of a group (include/k3c.h k3c_engine_options.layout; docs/PARALLEL.md): rank 0
 * leads, the other ranks follow its steps.
 *
 * Rank 0 owns the scheduler, the front end and the request table (blocks, slots, lengths). Whatever changes a
 * rank's caches is sent to every rank, in the order it happened, through the world communicator's broadcast:
 * the request opens (slot, prefix blocks), closes, commits, KDA snapshot reservations, saves and restores and
 * poisoned blocks are logged as they happen and go out with the next message; a step goes out as one message
 * carrying that log and the step (each request's slot, tokens, position, verify width, logits mode and the
 * blocks its table gained). Every rank applies the log and runs the same stock forward over its own shard,
 * backend and caches (the forward's TP collectives sum in rank order), so every rank ends with the same
 * logits; or, for a step rank 0 routed to the specialized executor (the header says so, with the shape),
 * every rank's executor over the TP group's mailbox (docs/PARALLEL.md, "The engine at TP on CUDA"). One message a step: a header of 8 words (the payload's size) and the payload, two broadcasts.
 *
 * Pipeline stages (pp > 1): every stage runs every step over its layers (the forward hands the rows from
 * stage to stage); the last stage's logits rows are broadcast over each pipeline group, so every rank holds
 * them. Data parallelism (dp > 1): rank 0 places each request on a DP rank when it opens (k3c_ranks_assign);
 * every DP rank runs the step's items placed on it, an idle one an empty (dummy) step, which with ep the
 * forward needs for its expert all-to-alls to line up; DP rank d's first rank sends its rows to rank 0, which
 * puts every row back in the step's order. Every DP rank's caches have rank 0's geometry (block ids and slots
 * are rank 0's); each touches only its requests' blocks and slots.
 *
 * An idle rank 0 (a server waiting for requests) keeps its followers' waits inside the group's timeout with an
 * empty message every quarter of it (a keep-alive thread; every message goes out under one mutex).
 *
 * Failure: a rank whose step fails records itself as the group's first failure (runtime/ranks.h) and aborts
 * the communicators; every other rank's wait then ends at once (or at the timeout, for a rank that hangs),
 * rank 0's call fails with a message naming the failed rank and step, and every later call on the engine
 * fails the same way: the group cannot go on. */
#ifndef K3C_RUNTIME_ENGINE_RANKS_H
#define K3C_RUNTIME_ENGINE_RANKS_H

#include <stddef.h>
#include <stdint.h>

#include "backend/backend.h"
#include "decode/plan.h"
#include "k3c.h"
#include "stock/forward.h"

typedef struct k3c_engine_ranks k3c_engine_ranks;
struct k3c_rank;

/* k3c_engine_create for a layout of world > 1 ranks (o normalized, layout checked by k3c_ranks_layout): in
 * this process (world_size 0: every rank a thread; device cpu, or cuda with rank r on device r % visible
 * devices) or as rank o->rank of a multi-process world (device cuda, NCCL). */
int k3c_engine_ranks_create(k3c_model *m, const k3c_engine_options *o, const k3c_layout *l, int world,
                            int num_blocks_given, k3c_engine **out);

/* This rank's place, for the engine's build (the shard it holds, the forward's TP communicator). */
const struct k3c_rank *k3c_ranks_place(const k3c_engine_ranks *x);
int k3c_ranks_rank(const k3c_engine_ranks *x);
int k3c_ranks_world(const k3c_engine_ranks *x);
/* Device cuda (runtime/ranks.h, ranks_device.c), at the engine's build: the rank's device, its TP
 * communicator moved onto its backend's stream, and the executor's TP mailbox (*out NULL with why: none). */
int k3c_ranks_device(const k3c_engine_ranks *x);
int k3c_ranks_attach_backend(k3c_engine_ranks *x, k3c_backend *be);
int k3c_ranks_mailbox(k3c_engine_ranks *x, k3c_backend *be, size_t cap, struct k3c_comm **out, char *why,
                      size_t why_cap);
int k3c_ranks_agree(k3c_engine_ranks *x, k3c_backend *be, int mine, int *all);

/* Rank 0's log of what changes the caches (the ops below; args as named), sent with the next message. */
typedef enum k3c_rank_op {
    K3C_RANK_OP_OPEN = 1,   /* slot, then list[n]: the prefix blocks its table starts with */
    K3C_RANK_OP_CLOSE,      /* slot */
    K3C_RANK_OP_COMMIT,     /* slot, accepted */
    K3C_RANK_OP_SNAP_RESERVE, /* count */
    K3C_RANK_OP_SNAP_SAVE,  /* slot, snapshot */
    K3C_RANK_OP_SNAP_RESTORE, /* slot, snapshot */
    K3C_RANK_OP_POISON,     /* block (freed with poison_freed_blocks) */
    K3C_RANK_OP_PLACE,      /* slot, dp rank: the request just opened runs on that DP rank (k3c_ranks_assign) */
} k3c_rank_op;
int k3c_ranks_log(k3c_engine_ranks *x, k3c_rank_op op, int a, int b, const int32_t *list, int n);
/* Rank 0, after a request's OPEN: the DP rank it runs on (dp >= 0: that one, where its prefix blocks were
 * computed; -1: the least loaded, the fewest open requests, the lowest DP rank among equals), logged as a
 * PLACE op; every rank then runs that slot's steps on that DP rank only. Returns the DP rank (0 at dp 1). */
int k3c_ranks_assign(k3c_engine_ranks *x, int slot, int dp);
/* The DP rank a slot's request runs on (0 at dp 1); the layout's dp. */
int k3c_ranks_slot_dp(const k3c_engine_ranks *x, int slot);
int k3c_ranks_dp(const k3c_engine_ranks *x);
/* Rank 0 (dp > 1): the requests placed on DP rank dp so far (a diagnostic). */
long k3c_ranks_placed(const k3c_engine_ranks *x, int dp);
/* Rank 0's step: sends it and runs rank 0's part (reqs as k3c_forward_step takes them; nblocks[i] the
 * blocks request i's table holds now): the stock forward, or with exec (the step's plan, route decode or
 * verify) the specialized executor on every rank (its TP mailbox; the same shape captured on every rank). */
int k3c_ranks_step(k3c_engine_ranks *x, const k3c_plan *exec, const k3c_fwd_req *reqs, const int *nblocks,
                   int n, float *logits, float *aux);
/* Rank 0: every rank captures the executor's shape (rows, q) now, together, before any step of it runs (a
 * rank capturing while a peer's mailbox kernel spins on the same device could wait for that device inside
 * the driver). K3C_OK when every rank captured it; a rank that could not fails the shape (it stays stock on
 * every rank), not the group. */
int k3c_ranks_capture(k3c_engine_ranks *x, int rows, int q);
/* A follower's loop: until rank 0 stops (0) or the group fails (-1). */
int k3c_ranks_follow(k3c_engine_ranks *x);
/* The group's failure message once it failed, else NULL. */
const char *k3c_ranks_failed(const k3c_engine_ranks *x);
/* Diagnostic (tests): every step, every rank hashes its logits (and aux streams) and they compare them; a
 * difference fails the step naming the rank. checked: the steps compared so far. */
void k3c_ranks_set_check(k3c_engine_ranks *x, int on);
long k3c_ranks_checked(const k3c_engine_ranks *x);

/* Test hook (tests only; process-wide, set before the engine is created; NULL: off): every rank's engine of a
 * rank group routes its specialized steps to the executor make returns for it (k3c_engine_set_executor on
 * every rank; make runs in the rank's build, fn's executor must outlive the engine), so the routing and the
 * messages of the executor at TP run on CPU ranks with a fake executor. */
typedef const struct k3c_decode_executor *(*k3c_ranks_exec_hook)(k3c_engine *e, void *user);
void k3c_ranks_test_executor(k3c_ranks_exec_hook make, void *user);
const struct k3c_decode_executor *k3c_ranks_test_executor_make(k3c_engine *e);

/* Rank 0: stops the keep-alive and the followers (a last message, then joins the threads of an in-process
 * group); before the engine's parts are freed. free: the rest, after them. */
void k3c_ranks_stop(k3c_engine_ranks *x);
void k3c_ranks_free(k3c_engine_ranks *x);

#endif
