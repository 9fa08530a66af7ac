/* The ranks of a parallel engine (include/k3c.h k3c_engine_options.layout, docs/PARALLEL.md): which ranks
 * exist and where each sits in the layout, the one place that builds their communicators, the start-up
 * check that every rank was started alike, the record of the rank that failed first, and host bytes moved
 * between the ranks through their backend's memory.
 *
 * Ranks are numbered as k3c_layout_plan numbers them: rank = (stage * dp + dp_rank) * tp + tp_rank. Every rank
 * has the world communicator (rank 0's step broadcasts, the start-up check), its TP group's (the stock
 * forward's all-reduce and gather) and, split from the world by each rank (k3c_rank_split), its pipeline group
 * (pp > 1) and its stage's expert group (ep > 1), as k3c_comm_groups_split makes them. Two ways to make them:
 *   - in one process (k3c_ranks_threads): the in-memory groups of comm/threads.c, one thread per rank;
 *   - one process per rank (k3c_ranks_nccl): NCCL, its unique id handed out through a rendezvous file
 *     (comm/rendezvous.h), the TP groups split from the world (ncclCommSplit) where they are smaller. */
#ifndef K3C_RUNTIME_RANKS_H
#define K3C_RUNTIME_RANKS_H

#include <stddef.h>
#include <stdint.h>

#include "backend/backend.h"
#include "comm/comm.h"
#include "k3c.h"
#include "model/config.h"

typedef struct k3c_rank_group k3c_rank_group;

typedef struct k3c_rank {
    int rank, world;
    k3c_layout layout;        /* normalized: tp, pp, dp >= 1 */
    int tp_rank, pp_stage, dp_rank;
    k3c_comm *world_comm;     /* every rank */
    k3c_comm *tp_comm;        /* the rank's TP group (may be world_comm) */
    k3c_comm *dcp_comm;       /* its DCP group where 1 < dcp < tp (dcp consecutive ranks); NULL: none, or tp_comm */
    k3c_comm *pp_comm;        /* pp > 1: the rank's pipeline group (one rank per stage; its rank is the stage) */
    k3c_comm *ep_comm;        /* ep > 1: the DP ranks of its stage (its rank is the DP rank); else NULL */
    int timeout_ms;           /* the longest any rank waits for the others in one call */
    k3c_rank_group *group;    /* in one process: the shared failure record; NULL over NCCL */
    char *rendezvous;         /* over NCCL: the rendezvous file (failure notes beside it); else NULL */
    /* staging of host bytes (k3c_rank_broadcast / _all_gather) where the communicator moves device memory */
    k3c_backend *be;
    void *stage;
    size_t stage_bytes;
    /* on device cuda (runtime/ranks_device.c): in one process, the in-memory group the TP group's staged
     * communicators join (tp_comm is replaced by this rank's once its backend exists); the executor's TP
     * mailbox (NULL: none, the executor stays unprepared) */
    k3c_comm_group *dev_group;
    k3c_comm *mailbox;
    /* on device cuda, ranks in one process with pp or dp > 1: the staged world over dev_group (a group of every
     * rank) and the forward's pipeline and expert groups split from it (pp_comm and ep_comm stay the host
     * groups, which the engine's hand-off of logits rows uses); NULL elsewhere, the forward then takes pp_comm
     * and ep_comm */
    k3c_comm *dev_world, *fwd_pp, *fwd_ep;
    /* over NCCL with pp or dp > 1: a device buffer for the hand-off of logits rows (k3c_rank_stage_rows) */
    void *rows_stage;
    size_t rows_stage_bytes;
} k3c_rank;

/* The layout the options ask for, checked against the config: tp, pp, dp, ep normalized (0 = 1); what the
 * engine cannot run refused with the reason (pp past the layers, ep other than tp x dp, ep without dp > 1,
 * aux streams with pp or dp); ep with tp > 1 is the hybrid (TP attention groups, EP MoE over every rank of a
 * stage); every split the layout makes must
 * divide (k3c_layout_plan's checks); world_size, when given (> 0), must equal tp x pp x dp and rank lie in
 * 0 .. world_size - 1. *world: tp x pp x dp. */
int k3c_ranks_layout(const k3c_config *c, const k3c_engine_options *o, k3c_layout *out, int *world);

/* In one process: ranks[0 .. world) each get their communicators (in-memory groups); each rank's thread
 * then uses its own entry and releases it. */
int k3c_ranks_threads(const k3c_layout *l, int timeout_ms, k3c_rank *ranks);
/* One process per rank: this process's rank through NCCL (device 0 of this process: set
 * CUDA_VISIBLE_DEVICES per rank), rank 0 publishing the unique id at path, the others waiting for it. */
int k3c_ranks_nccl(const k3c_layout *l, int rank, const char *rendezvous, int timeout_ms, k3c_rank *out);
/* Every rank of the world, each in its own thread or process, the same calls in the same order: its pipeline
 * and expert groups split from the world communicator (nothing where pp = 1 and ep = 1). */
int k3c_rank_split(k3c_rank *r);
/* ---- on device cuda (runtime/ranks_device.c) ----
 * Ranks as threads of one process: rank r's backend on device r % visible devices; the stock forward's TP
 * collectives over the staged communicator (comm/staged.c: host waits, never a device spin) and the
 * executor's over an in-process mailbox (comm/mailbox_cuda.h). One process per rank: the stock forward over
 * NCCL (k3c_ranks_nccl), the executor over an IPC mailbox of the TP group when all its ranks are on one host.
 * device_groups: before the threads start, one in-memory group per TP group (ranks[0 .. world)); with pp or
 * dp > 1 one group of every rank instead (the staged world, from which each rank's TP, pipeline and expert
 * groups are split once its backend exists: k3c_rank_attach_device). */
int k3c_ranks_device_groups(k3c_rank *ranks, int world);
/* The device this rank's backend takes (ranks in one process: rank % visible devices; one process per
 * rank: 0, CUDA_VISIBLE_DEVICES chooses). */
int k3c_rank_device(const k3c_rank *r);
/* The ranks of this process on this rank's device (its memory is split among them); 1 over NCCL. */
int k3c_rank_device_share(const k3c_rank *r);
/* Once the rank's CUDA backend exists: in one process, tp_comm becomes the staged communicator on its
 * stream (and dcp_comm, where 1 < dcp < tp, a staged split of it; pp or dp > 1: every rank's staged world,
 * split into tp_comm, fwd_pp and fwd_ep as k3c_comm_groups_split makes them, a collective of every rank); over
 * NCCL, the TP, DCP, pipeline and expert groups' collectives move onto the backend's stream
 * (k3c_comm_nccl_set_stream). */
int k3c_rank_attach_device(k3c_rank *r, k3c_backend *be);
/* The executor's TP mailbox, every rank of the TP group calling it at the same point (a collective): slots
 * of cap floats. *out NULL, with the reason in why, where the group cannot have one (TP wider than 8, ranks
 * on different hosts, or the mailbox refused: every rank of the group gets the same answer); K3C_ERR only
 * when the exchange between the ranks failed. The mailbox is the rank's (k3c_rank_release frees it). */
int k3c_rank_mailbox(k3c_rank *r, k3c_backend *be, size_t cap, k3c_comm **out, char *why, size_t why_cap);
/* The TP group's ranks (ranks in one process: the world, which is then the TP group) agree: *all = 1 when every
 * rank passed mine != 0. A collective of every rank at the same point; K3C_ERR when the exchange failed. */
int k3c_rank_agree(k3c_rank *r, k3c_backend *be, int mine, int *all);

/* Frees this rank's communicators and staging (the group's record goes with its last rank). */
void k3c_rank_release(k3c_rank *r);

/* Host bytes through the communicators (staged through be's memory where they need device buffers; call
 * k3c_rank_stage first, with the largest transfer). Both fail, without hanging, when the group has failed or a
 * peer does not come within the timeout. */
int k3c_rank_stage(k3c_rank *r, k3c_backend *be, size_t max_bytes);
int k3c_rank_broadcast(k3c_rank *r, void *host, size_t bytes); /* from rank 0, over the world */
int k3c_rank_all_gather(k3c_rank *r, const void *src, void *dst, size_t bytes);
/* The step's hand-off of logits rows (host memory on every rank): staged through a device buffer of
 * max_bytes where the world is NCCL's and pp or dp > 1 (stage_rows allocates it, after k3c_rank_stage; a no-op
 * elsewhere: the in-memory groups move host memory). pp_broadcast: from the last stage to every stage of the
 * rank's pipeline group; send_rows / recv_rows: to / from world rank peer. */
int k3c_rank_stage_rows(k3c_rank *r, size_t max_bytes);
int k3c_rank_pp_broadcast(k3c_rank *r, void *host, size_t bytes);
int k3c_rank_send_rows(k3c_rank *r, const void *host, size_t bytes, int peer);
int k3c_rank_recv_rows(k3c_rank *r, void *host, size_t bytes, int peer);

/* This rank failed (at step `step`, 0 = start-up) with msg: recorded unless a rank failed before, then the
 * communicators are aborted, so every other rank's wait ends at once. */
void k3c_rank_fail(k3c_rank *r, long step, const char *msg);
/* The first failure recorded: 1 with its rank, step and message, 0 when none is (in one process the shared
 * record; over NCCL the failure notes beside the rendezvous file). */
int k3c_rank_failure(const k3c_rank *r, int *rank, long *step, char *msg, size_t cap);

/* ---- the start-up check ----
 * Every rank fills a fingerprint of how it was started and all of them all-gather and compare them: the
 * library version, the model's config and weights, the layout and world size, the rank itself, the device
 * and dtype modes, and every option that sizes a cache or a step. A difference fails every rank with a
 * message naming the field, the rank and both values. */
enum {
    K3C_FP_VERSION, K3C_FP_CONFIG, K3C_FP_WEIGHTS, K3C_FP_WORLD, K3C_FP_TP, K3C_FP_PP, K3C_FP_DP, K3C_FP_EP,
    K3C_FP_RANK, K3C_FP_DEVICE, K3C_FP_EXACT_F32, K3C_FP_KV_FP8, K3C_FP_MAX_CONTEXT, K3C_FP_MAX_REQUESTS,
    K3C_FP_MAX_ROWS, K3C_FP_BLOCK_SIZE, K3C_FP_NUM_BLOCKS, K3C_FP_Q_MAX, K3C_FP_CHUNK_MIN, K3C_FP_MLA_EXPAND_MIN,
    K3C_FP_AUX_LAYERS, K3C_FP_POISON, K3C_FP_DCP, K3C_FP_FIELDS
};
typedef struct k3c_rank_fingerprint {
    uint64_t v[K3C_FP_FIELDS];
} k3c_rank_fingerprint;
const char *k3c_rank_fingerprint_field(int field);
void k3c_rank_fingerprint_fill(k3c_rank_fingerprint *f, const k3c_config *c, uint64_t weight_bytes,
                               const k3c_engine_options *o, const k3c_rank *r);
/* All-gathers and compares (K3C_FP_RANK must equal each rank's place, every other field rank 0's). *differ = 1
 * when they differ (every rank then fails with the same message); 0 when they agree or the gather failed. */
int k3c_rank_fingerprint_check(k3c_rank *r, const k3c_rank_fingerprint *mine, int *differ);

/* ---- test hooks (tests only; process-wide, set before the engine is created; rank -1: off) ----
 * fault: rank `rank` fails its step number `step` (1, 2, ...: the forward steps rank 0 leads) with an
 * error, or (stall = 1) waits there past the group's timeout before going on. skew: rank `rank`'s fingerprint
 * field `field` differs. */
void k3c_ranks_test_fault(int rank, long step, int stall);
void k3c_ranks_test_skew(int rank, int field);
/* 0: no fault for (rank, step); 1: fail; 2: stall. */
int k3c_ranks_fault_at(int rank, long step);

#endif
