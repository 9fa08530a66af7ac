/* The stock forward: one call runs a batch of requests through every layer (the published model's forward)
 * over a backend (backend/backend.h). Each request brings its own rows: a prompt or prompt chunk, one decode
 * token, or q verify tokens; batches may mix them. Caches and KDA slots live in cache/ (the engine owns
 * them) and are passed in.
 * All activation buffers are allocated at creation, sized for max_rows rows; a step allocates nothing. */
#ifndef K3C_STOCK_FORWARD_H
#define K3C_STOCK_FORWARD_H

#include <stdint.h>

#include "model/model.h"
#include "cache/kda_slots.h"
#include "comm/comm.h"
#include "cache/kv_cache.h"
#include "backend/backend.h"

typedef enum k3c_logits_mode {
    K3C_LOGITS_NONE = 0,
    K3C_LOGITS_LAST = 1, /* the request's last row */
    K3C_LOGITS_ALL = 2,  /* every row of the request */
} k3c_logits_mode;

/* One request in a step. */
typedef struct k3c_fwd_req {
    const int32_t *ids;          /* [n] new tokens */
    int n;
    int pos;                     /* tokens already in the request's MLA cache (and folded into its KDA slot) */
    const int32_t *block_table;  /* blocks covering positions 0 .. pos + n - 1 */
    int slot;                    /* KDA slot */
    int verify;                  /* 1: KDA slot read-only, inputs saved for k3c_forward_commit; n <= q_max */
    k3c_logits_mode logits;      /* ALL is implied for verify */
} k3c_fwd_req;

typedef struct k3c_forward_options {
    int max_rows;     /* most rows in a step */
    int max_segs;     /* most requests in a step */
    int max_context;  /* most tokens a request holds */
    int block_size;   /* MLA cache block size */
    /* The KDA block C (0 means 64; at least 2): rows of a non-verify request at positions [k C, (k + 1) C)
     * that all lie in this step run the chunked delta rule, every other row the recurrence (batch
     * invariance, see forward.c). */
    int chunk_min;
    /* The MLA block E (0 means 128, near the arithmetic break-even of the two forms at K3's shapes, see
     * forward.c; at least 2, rounded up to a multiple of C): rows of a non-verify request in whole aligned
     * E-blocks of this step attend in the expanded form (when the backend has it), every other row absorbed. */
    int mla_expand_min;
    /* 1: the MLA latent cache holds FP8 E4M3 values (k3c_backend_limits.kv_fp8). */
    int kv_fp8;
    /* Aux hidden-state streams (drafter taps, as vLLM's aux_hidden_state_layers): stream i is the
     * hidden state entering layer L = aux_layers[i], L in 0 .. num_layers: the embedding for L = 0, else the
     * value after layer L - 1 added its FFN output, i.e. with AttnRes the block-partial prefix P (not the full
     * residual: completed blocks are not in it), without AttnRes the residual stream h; L = num_layers is the
     * prefix entering the output AttnRes (plain residual: the final norm's input). Pre-norm, bf16-rounded as P is. */
    const int *aux_layers;
    int num_aux;
    /* The rank's parallel groups: o.groups = a k3c_comm_groups (comm/comm.h k3c_comm_groups_split), or its
     * members by name (o.tp, o.pp, o.ep); NULL, or a group of one rank, is none. The model must be the rank's
     * shard (model/shard.h k3c_model_shard) for the same layout.
     * tp: tensor parallelism. The backend must have the tensor-parallel ops (backend.h round, moe_partial):
     *   the step sums the row-parallel partials across the ranks (every attention's o_proj, the dense MLP's
     *   down, the MoE's routed latent and shared expert, the vocabulary-parallel embedding) in rank order and
     *   gathers the logits, so every rank computes the same hidden states and returns the same
     *   full-vocabulary logits. Every rank must run the same steps. The communicators work on the backend's
     *   memory (comm/comm.h stream_ordered): host ones (threads) for the CPU backend, stream-ordered ones made
     *   for the backend's stream (k3c_backend_cuda_stream: NCCL, staged, mailbox) for CUDA; the forward
     *   refuses the other pairings.
     * pp: pipeline parallelism, the rank's stage = pp->rank (its layers, model.h k3c_model_stage_layers). Every
     *   stage runs every step with the same requests: the first embeds, each runs its layers and hands the next
     *   stage what its first layer reads (forward.c, "Parallel ranks"); only the last stage computes logits
     *   (the others leave the logits buffer alone and need none). No aux streams. CPU backend only.
     * ep: DP attention + EP MoE (DEP), the DP ranks of a stage: each runs its own requests (full attention
     *   weights) and the MoE layers exchange rows with the ranks holding the experts (backend.h moe_route,
     *   moe_experts, moe_combine). Every rank must run every step, an idle one with nreq = 0 (a dummy step:
     *   it serves its experts to the others), and create its forward with the same max_rows (the exchange is
     *   sized by it). With tp too (the hybrid): the TP group of a DP group inside the EP group, the model the
     *   rank's hybrid shard (model/shard.h). CPU backend only. */
    union {
        k3c_comm_groups groups;
        struct {
            struct k3c_comm *tp, *pp, *ep;
        };
    };
    /* Decode context parallel (forward.c mla_dcp, docs/PARALLEL.md): dcp > 1 (a divisor of the TP size) shards
     * every MLA layer's latent cache by position over dcp ranks of the TP group, interleaved (position p on
     * DCP rank p % dcp, backend.h k3c_seg), so the cache of num_blocks blocks holds dcp times the tokens; the
     * KDA state is untouched. The caller's block tables then cover the local slots: ceil((pos + n) / dcp)
     * of them (k3c_dcp_local of rank 0). dcp_group: the rank's DCP group (dcp consecutive ranks of the TP
     * group, ranked by tp_rank % dcp); NULL when dcp equals the TP size (the TP group itself). The backend
     * must have mla_absorb, mla_attention_part and mla_merge. 0 or 1: none. */
    int dcp;
    struct k3c_comm *dcp_group;
} k3c_forward_options;

typedef struct k3c_forward k3c_forward;

/* Calls be->init(model, limits) and allocates the activation buffers on the backend. */
int k3c_forward_create(k3c_backend *be, const struct k3c_model *m, const k3c_forward_options *o, k3c_forward **out);
void k3c_forward_free(k3c_forward *f);

/* Runs one step. logits (host, may be NULL when no request asks for any): the requested rows, request by
 * request in order, each [vocab] f32. aux (host, may be NULL): [num_aux, N, D], N = k3c_forward_logit_rows
 * (the logits rows, in the same order): stream i's rows are aux + i * N * D.
 * The caller has made every block table cover pos + n. nreq = 0: nothing, except on a DEP rank (o.ep), where
 * it is the idle rank's dummy step. A failed collective aborts the rank's groups (their other ranks fail
 * too) and fails the step. */
int k3c_forward_step(k3c_forward *f, k3c_kv_cache *kv, k3c_kda_slots *ks, const k3c_fwd_req *reqs, int nreq,
                     float *logits, float *aux);

/* An attention override for one step (the executor's wide route, decode/executor_cuda.h, fills it; stock/
 * knows nothing of what runs inside). With it the step is the stock layer loop with every layer's attention
 * (from the normed input x to the attention output A, its o_proj included) computed by run instead of the
 * stock ops; everything else (embedding, AttnRes or the residual, norms, the dense MLP, the MoE: an EP rank's
 * exchange included, the final norm, the LM head, aux streams) stays stock. begin runs once per step with
 * rows (T > 0), after the requests were validated and before any layer, so that the override can lay out its
 * metadata; a dummy step (a DEP rank's T = 0) calls neither, so its collectives are exactly the stock dummy
 * step's. x and A are backend buffers [T, hidden] on the backend's stream (a device backend: run queues its
 * launches on that stream, k3c_backend_cuda_stream). At TP1 attention is local and the override adds no
 * collective. On a TP rank (the hybrid's TP group inside DEP) run's A is what the stock layer leaves there:
 * o_proj's row-parallel part summed over the TP group and rounded, the override making that sum itself
 * (over a communicator of its own: every rank of the group must take the override alike, as the plan
 * guarantees). A DCP rank's attention merges partial attention across its group: the step refuses the
 * override there. A failed begin or run fails the step (the rank's groups aborted, as for any failed step). */
typedef struct k3c_forward_attention {
    void *ctx;
    int (*begin)(void *ctx, const k3c_fwd_req *reqs, int nreq, int T);
    int (*run)(void *ctx, int layer, const float *x, float *A, int T);
} k3c_forward_attention;

/* k3c_forward_step with every layer's attention computed by attn (NULL: k3c_forward_step itself). */
int k3c_forward_step_attn(k3c_forward *f, k3c_kv_cache *kv, k3c_kda_slots *ks, const k3c_fwd_req *reqs, int nreq,
                          float *logits, float *aux, const k3c_forward_attention *attn);

/* After a verify step of q tokens on `slot`, folds the first `accepted` (0 .. q) tokens into the slot's
 * committed KDA state and conv window in every KDA layer. (The MLA side needs nothing: the caller's
 * length moves by `accepted` and rows past it are overwritten later.) */
int k3c_forward_commit(k3c_forward *f, k3c_kda_slots *ks, int slot, int accepted);

/* Prompt pieces (batch invariance, forward.c): the most tokens, at most max_tokens, that a request holding
 * `pos` tokens of a prompt ending at position `end` can take in its next step so that no row computes
 * differently from any other cutting of the prompt into pieces the same way; 0 when no such cut is within
 * max_tokens (never when max_tokens >= k3c_forward_prompt_grid). */
int k3c_forward_prompt_piece(const k3c_forward *f, int pos, int end, int max_tokens);
/* The largest block of the policy (a multiple of every other one; 1 when there is none): a cut at a multiple
 * of it is always safe. At most max_rows. */
int k3c_forward_prompt_grid(const k3c_forward *f);

/* Rows the logits buffer needs for this batch. */
int k3c_forward_logit_rows(const k3c_fwd_req *reqs, int nreq);

#endif
