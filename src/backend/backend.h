/* The backend interface: a table of ops over backend buffers, plus an opaque ctx. It sits below the stock
 * forward (stock/) and the specialized decode (decode/), which both run on it, and above the CPU and CUDA
 * implementations (cpu/backend_cpu.c, cuda/backend_cuda.c).
 *
 * The forward (stock/forward.c) owns the layer loop and never dereferences activation, cache or state
 * memory: it only does pointer arithmetic on buffers the backend allocated and passes *host* metadata
 * (token ids, row segments, block tables, pointer arrays) to the ops. A device backend copies that
 * metadata to the device itself. Weights are passed as the host views of model/weights.h (k3c_mat,
 * k3c_moe_weights, float vectors); a device backend keeps its own copy keyed by the host pointer, made
 * once in init().
 *
 * Element types:
 *   activations  f32 storage, values bf16-rounded wherever the rounding contract of stock/forward.c says
 *                so ("rounded" below); shapes are row-major [T rows, width];
 *   KDA state    f32 [H, dk, dv] per request (key channel d, value channel e: S[h][d][e]);
 *   KDA window   f32 [3][W-1][P] per request: the last W-1 pre-conv inputs of q, k and v (oldest first);
 *                values are bf16-rounded (they are matmul outputs);
 *   MLA cache    backend-defined element (kv_elem_bytes: 4 = f32 holding bf16-rounded values, 2 = bf16),
 *                per layer [num_blocks, block_size, kv_lora + rope], row = [c_normed | k_pe].
 *
 * Ops are asynchronous in effect (a device backend may queue them); sync() waits and reports the first
 * error any op met since the last sync. Ops never allocate: scratch is sized in init() from the limits. */
#ifndef K3C_BACKEND_BACKEND_H
#define K3C_BACKEND_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include "model/config.h"
#include "model/weights.h"

struct k3c_model;

/* What init() sizes its scratch for. */
typedef struct k3c_backend_limits {
    int max_rows;     /* most rows (tokens) in one step */
    int max_segs;     /* most requests in one step */
    int max_context;  /* most tokens one request may hold in the MLA cache */
    int block_size;   /* MLA cache block size (tokens) */
    int kv_fp8;       /* 1: mla_cache_write stores latents rounded to FP8 E4M3 (util/fp8.h); a backend that
                       * cannot fails init() with a message */
    int max_expert_rows; /* most rows of one moe_experts call (0: max_rows x experts per token) */
} k3c_backend_limits;

/* One request's share of a step: rows [row0, row0 + n) of every activation buffer. */
typedef struct k3c_seg {
    int row0, n;
    /* MLA: tokens already cached before this step; row i attends cache positions 0 .. pos + i. */
    int pos;
    const int32_t *block_table; /* host: block ids, position p lives in block block_table[p / block_size] */
    /* KDA (set per layer by the forward): device pointers to this request's state and conv window for the
     * current layer (the committed slot, or a verify scratch copy). */
    float *state;  /* [H, dk, dv] f32 */
    float *window; /* [3][W-1][P] f32 */
    /* > 0: the delta rule in chunked form over whole blocks of this many rows, each block on its own (the
     * segment starts at a multiple of it and holds whole blocks: stock/forward.c's invariance grid); the
     * backend may cut a block into its own fixed chunks from the block's start. 0: recurrent (a prompt's
     * ragged rows, decode, verify, commit). */
    int chunked;
    /* Decode context parallel (stock/forward.c, docs/PARALLEL.md): dcp > 1 when the request's MLA cache is
     * sharded over dcp ranks, interleaved: position p lives on rank p % dcp, at the rank's local slot p / dcp
     * (block_table[(p / dcp) / block_size]). mla_cache_write then stores only this rank's positions
     * (p % dcp == dcp_rank) and mla_attention_part attends only them. 0 or 1: not sharded. */
    int dcp, dcp_rank;
} k3c_seg;

/* The local slots of the positions [0, n) that rank r of a dcp-way sharded cache holds (p % dcp == r). */
static inline int k3c_dcp_local(int n, int dcp, int r) {
    return dcp > 1 ? (n - r + dcp - 1) / dcp : n;
}

/* The gate of the KDA gated output norm: sigmoid in both families. transformers 5.17's
 * KimiLinearRMSNormGated sets activation = "sigmoid", and its saved logits (tests/fixtures/kimi_linear_hf)
 * match sigmoid only. Kept as a flag (1 = silu) so a family that differs can set it here. */
static inline int k3c_config_kda_silu_gate(const k3c_config *c) { (void)c; return 0; }

typedef struct k3c_backend k3c_backend;

struct k3c_backend {
    const char *name;  /* "cpu", "cuda" */
    void *ctx;
    int kv_elem_bytes; /* bytes per MLA cache element (see above) */

    /* ---- lifetime ---- */
    /* Called once before any op; a device backend uploads the weights here. */
    int (*init)(k3c_backend *be, const struct k3c_model *m, const k3c_backend_limits *lim);
    /* Frees everything the backend owns, the struct included. */
    void (*destroy)(k3c_backend *be);
    /* Waits for queued ops; returns K3C_ERR with a message if any op failed since the last sync. */
    int (*sync)(k3c_backend *be);

    /* ---- memory ---- */
    void *(*alloc)(k3c_backend *be, size_t bytes); /* NULL + error message on failure */
    void (*free)(k3c_backend *be, void *p);
    void (*upload)(k3c_backend *be, void *dst, const void *host_src, size_t bytes);
    void (*download)(k3c_backend *be, void *host_dst, const void *src, size_t bytes);
    void (*copy)(k3c_backend *be, void *dst, const void *src, size_t bytes);
    void (*fill_bytes)(k3c_backend *be, void *dst, int byte, size_t bytes); /* memset; 0xff poisons (NaN) */
    /* Bytes free for allocations now, the engine's default memory limit for its caches (cpu: MemAvailable of
     * /proc/meminfo; cuda: cudaMemGetInfo's free, i.e. after the weights); *source names where it came from.
     * 0 when it cannot be told. */
    size_t (*mem_free)(k3c_backend *be, const char **source);
    /* Optional (NULL: plain malloc / free): host memory that downloads land in at the link's DMA rate
     * (page-locked), for the logits buffers (k3c_engine_logits_alloc, which falls back to malloc when
     * host_alloc fails and never hands such a buffer to host_free). host_free waits for queued ops first,
     * since a download into p may still be in flight. */
    void *(*host_alloc)(k3c_backend *be, size_t bytes); /* NULL + error message on failure */
    void (*host_free)(k3c_backend *be, void *p);
    /* dst[i, :] = src[rows[i], :] for i < n, width D floats (host row indices). */
    void (*gather_rows)(k3c_backend *be, const float *src, const int *rows, int n, int D, float *dst);

    /* ---- dense ops (all outputs rounded unless said otherwise) ---- */
    /* out[t, :] = embed row ids[t] (exact: bf16 weights). ids: host [T]. A backend with the tensor-parallel
     * ops below also takes ids[t] = -1: a row of -0.0, the rows of a vocabulary-parallel embedding that
     * another rank holds (x + -0.0 is x for every x, so the all-reduce of the ranks' rows is exact). */
    void (*embed)(k3c_backend *be, const k3c_mat *E, const int32_t *ids, int T, float *out);
    /* y[t, r] = sum_c W[r, c] x[t, c], fp32 accumulate; x [T, W.cols], y [T, W.rows].
     * round: 1 = rounded (every activation), 0 = f32 (the final logits only). */
    void (*matmul)(k3c_backend *be, const k3c_mat *W, const float *x, int T, float *y, int round);
    /* y[t, 0:n] = RMSNorm(x[t, 0:n]; w, eps); rows strided (x_stride, y_stride floats); rounded. Columns
     * past n are not touched. y may alias x. */
    void (*rmsnorm)(k3c_backend *be, const float *x, int x_stride, const float *w, int T, int n, float eps,
                    float *y, int y_stride);
    /* out = a + b over T*D, rounded (the bf16 residual / prefix add). out may alias a. */
    void (*add)(k3c_backend *be, const float *a, const float *b, size_t n, float *out);
    /* AttnRes Mix (spec §4.2) per row over nsrc sources src[j] ([T, D] each, host array of device
     * pointers, oldest block first, partial prefix last); rounded. */
    void (*attnres_mix)(k3c_backend *be, const float *const *src, int nsrc, int T, int D, const float *proj,
                        const float *norm, float eps, float *out);
    /* out = act(gate) * up' (SwiGLU or SiTU per config), n = T * width; rounded. */
    void (*gated_act)(k3c_backend *be, const float *gate, const float *up, size_t n, float *out);
    /* x = x * sigmoid(g) elementwise over n, rounded (MLA output gate). */
    void (*sigmoid_mul)(k3c_backend *be, float *x, const float *g, size_t n);

    /* ---- KDA ---- */
    /* Causal depthwise conv + SiLU of one of q/k/v (which = 0, 1, 2) for each seg's rows, using and
     * advancing seg->window + which * (W-1) * P. x, out: [T, P]; taps [P, W]; out rounded. */
    void (*kda_conv)(k3c_backend *be, const float *x, const float *taps, int which, const k3c_seg *segs,
                     int nseg, float *out);
    /* g [T, P] = decay gate of f [T, P] (spec §2.2 step 5, or the Kimi Linear form), f32;
     * beta [T, H] = sigmoid(b [T, H]), f32. */
    void (*kda_gate)(k3c_backend *be, const float *f, const float *b, const float *a_log, const float *dt_bias,
                     int T, float *g, float *beta);
    /* q, k [T, P]: per-head L2 norm in place, q also scaled by dk^-1/2; f32 (not rounded). */
    void (*kda_qk_norm)(k3c_backend *be, float *q, float *k, int T);
    /* Gated delta rule per seg on seg->state (chunked or recurrent per seg->chunked); o [T, P] rounded.
     * o may be NULL (commit: only the state matters). */
    void (*kda_delta)(k3c_backend *be, const float *q, const float *k, const float *v, const float *g,
                      const float *beta, const k3c_seg *segs, int nseg, float *o);
    /* y [T, P] = per-head gated RMSNorm of o with weight w [dk] and gate z [T, P] (sigmoid for K3, silu
     * for Kimi Linear, chosen from the config in init); rounded. */
    void (*kda_gated_norm)(k3c_backend *be, const float *o, const float *z, const float *w, int T, float *y);

    /* ---- MLA (NoPE; absorbed, and optionally expanded for prompt rows) ---- */
    /* Writes latent rows lat [T, kv_lora + rope] (already rounded) of each seg to the cache at positions
     * pos .. pos + n - 1 through the seg's block table. cache: one layer's [num_blocks, block_size, lat].
     * With limits.kv_fp8 every element is stored rounded to FP8 E4M3 (util/fp8.h k3c_e4m3_round), so every
     * later read of the cache (absorbed or expanded attention) sees the E4M3 value. */
    void (*mla_cache_write)(k3c_backend *be, const float *lat, const k3c_seg *segs, int nseg, void *cache);
    /* (With seg dcp > 1 only the positions of seg dcp_rank are stored, each at its local slot: see k3c_seg.) */
    /* Attention of each seg's query rows over its cached latents (positions 0 .. pos + i for row i), the
     * rows of this step included (written before). q [T, Hm * (nope + rope)] per head [q_nope | q_pe];
     * inside, in f32: q_abs[h] = W_UK[h]^T q_nope[h], scores = [q_abs | q_pe] . [c | k_pe] / sqrt(nope + rope),
     * softmax, o_lat[h] = sum p c, o[h] = W_UV[h] o_lat[h] (W_UK, W_UV from kv_b). o [T, Hm * v] rounded.
     * When the backend has mla_attention_expanded, segs may be a subset of the step's segments (the
     * others go to the expanded op, which the forward calls after this one: rows of other segments that
     * this op writes are overwritten there). */
    void (*mla_attention)(k3c_backend *be, const k3c_mla_weights *w, const float *q, const k3c_seg *segs,
                          int nseg, const void *cache, float *o);
    /* Optional, NULL when the backend lacks it (the forward then uses mla_attention for every segment).
     * The same attention in the expanded form (spec §3.2), for prompt segments: per head, every cached
     * latent c of positions 0 .. pos + n - 1 is decompressed through kv_b, once per call and shared by the
     * segment's rows: k_nope[h] = rnd(W_UK[h] c), v[h] = rnd(W_UV[h] c) (f32 accumulate, rounded like every
     * matmul output); scores = (q_nope . k_nope + q_pe . k_pe) / sqrt(nope + rope), causal softmax (f32),
     * o[h] = sum p v. Same arguments as mla_attention; o rounded; writes only the rows of segs. Equal to
     * mla_attention in exact arithmetic (the k/v rounding is the only contract difference). */
    void (*mla_attention_expanded)(k3c_backend *be, const k3c_mla_weights *w, const float *q, const k3c_seg *segs,
                                   int nseg, const void *cache, float *o);

    /* ---- decode context parallel (optional: NULL where the backend has none; the forward then refuses dcp).
     * The absorbed attention cut where the ranks of a DCP group exchange (stock/forward.c mla_dcp): every
     * rank attends the heads of the whole group over its own positions, and the partials are merged exactly
     * (softmax over the union of the positions = the partial softmaxes weighted by their sums). ---- */
    /* q_abs [T, Hm, kv_lora + rope] = [W_UK[h]^T q_nope[h] | q_pe[h]] for every row (the rank's heads), f32:
     * the query mla_attention forms inside. */
    void (*mla_absorb)(k3c_backend *be, const k3c_mla_weights *w, const float *q, int T, float *q_abs);
    /* For each seg's row i and each of H heads (q_abs [T, H, kv_lora + rope], any head count): the attention
     * over this rank's positions among 0 .. pos + i (seg dcp, dcp_rank; k3c_dcp_local(pos + i + 1, ...) local
     * slots), in f32: o_lat [T, H, kv_lora] = sum_p e^(s_p - m) c_p / sum_p e^(s_p - m) (normalized over the
     * rank's positions) and lse [T, H] = m + log(sum_p e^(s_p - m)), m the max score, scores as in
     * mla_attention. A row that sees none of the rank's positions: o_lat 0, lse -inf. Writes the segs' rows. */
    void (*mla_attention_part)(k3c_backend *be, const float *q_abs, int H, const k3c_seg *segs, int nseg,
                               const void *cache, float *o_lat, float *lse);
    /* The merge of n partials, part r's o_lat [T, Hm, kv_lora] at o_parts + r * stride and its lse [T, Hm] at
     * lses + r * stride (floats), per row t and head h, in f32 and in part order r = 0 .. n-1 (the same bits
     * wherever it runs on the same parts): M = max_r lse_r; w_r = e^(lse_r - M) (0 for lse_r = -inf);
     * lat = (sum_r w_r o_r) / (sum_r w_r); then o [T, Hm * v] = rnd(W_UV[h] lat), as mla_attention ends. */
    void (*mla_merge)(k3c_backend *be, const k3c_mla_weights *w, const float *o_parts, const float *lses,
                      size_t stride, int n, int T, float *o);

    /* ---- MoE ---- */
    /* out [T, D] = latent MoE / MoE of y [T, D] (y already rounded), per row, rounding ("rnd") exactly at:
     *   router logits = W_r y in f32 (not rounded); k3c_route -> idx[k], weight[k] (f32);
     *   z = rnd(W_rdown y) when routed_expert_hidden_size > 0, else z = y;
     *   per selected expert j (in k3c_route's output order): a = rnd(W1 z), u = rnd(W3 z),
     *       h = rnd(act(a, u)), d_j = rnd(W2 h)   (MXFP4 or bf16 weights, f32 accumulate);
     *   r = rnd(sum_j weight[j] * d_j), summed in f32 in j order;
     *   latent: r = rnd(W_rup rnd(RMSNorm(r; latent_norm, rms_norm_eps)))  (norm only if latent_moe_use_norm);
     *   shared (when present): s = rnd(W_sdown rnd(act(rnd(W_sgate y), rnd(W_sup y)))), else s = 0;
     *   out = rnd(r + s). */
    void (*moe)(k3c_backend *be, const k3c_moe_weights *w, const float *y, int T, float *out);

    /* ---- tensor parallel (optional: NULL where the backend has none; the forward then refuses a TP
     * communicator). The forward sums the partial results across ranks and rounds the sums. ---- */
    /* x = rnd(x) over n floats (a sum across ranks takes the rounding a single product would have had). */
    void (*round)(k3c_backend *be, float *x, size_t n);
    /* moe on one TP rank's shard (every expert's and the shared expert's intermediate dimension split,
     * model/shard.h), up to the cross-rank sums: r_part [T, expert_in] = sum_j weight[j] * (W2 h_j) with this
     * rank's part of each d_j, f32 and not rounded (d_j unrounded too: its sum across ranks is what moe
     * rounds); s_part [T, D] = W_sdown h_s on this rank's part, f32 (NULL: no shared experts). Routing, z and
     * the hidden activations round as in moe. The forward all-reduces r_part and s_part, rounds both, and
     * finishes: latent norm and up-projection (rounded), out = rnd(r + s). */
    void (*moe_partial)(k3c_backend *be, const k3c_moe_weights *w, const float *y, int T, float *r_part,
                        float *s_part);

    /* ---- expert parallel (optional: NULL where the backend has none; the forward then refuses an EP group).
     * moe cut where the expert-parallel forward exchanges (row, selected expert) pairs between ranks
     * (stock/forward.c): the three together compute exactly moe's rounding above, whichever rank runs which
     * expert. ---- */
    /* Routing of y [T, D]: idx (host [T, K]) and wts ([T, K] f32) as k3c_route gives them, in its output order
     * (a device backend downloads idx: the forward builds the exchange on the host); z [T, expert_in] = rnd(W_rdown
     * y) with a latent, else y. */
    void (*moe_route)(k3c_backend *be, const k3c_moe_weights *w, const float *y, int T, int *idx, float *wts,
                      float *z);
    /* n rows x [n, expert_in], row i for routed expert expert[i] (host [n], one this rank holds):
     * d[i] = rnd(W2 rnd(act(rnd(W1 x_i), rnd(W3 x_i)))), moe's d_j. At most limits.max_expert_rows rows. */
    void (*moe_experts)(k3c_backend *be, const k3c_moe_weights *w, const float *x, const int *expert, int n,
                        float *d);
    /* out [T, D] for y [T, D] given every row's selected experts' outputs: pair (t, j)'s d_j at d + pair_row[t K
     * + j] * expert_in (host pair_row [T, K]) and its weight wts[t, j]: r = rnd(sum_j wts[t, j] d_j) in j order,
     * then the rest of moe (latent norm and up-projection, the shared expert of y, out = rnd(r + s)). */
    void (*moe_combine)(k3c_backend *be, const k3c_moe_weights *w, const float *y, int T, const float *wts,
                        const float *d, const int *pair_row, float *out);
};

/* Backends. threads <= 0: one per core. */
k3c_backend *k3c_backend_cpu_create(int threads);
/* Diagnostic: with exact = 1 the CPU backend skips every bf16 rounding of activations (f32 throughout), so
 * the forward can be checked against the float64 reference far below bf16 noise. Tests only. */
void k3c_backend_cpu_set_exact(k3c_backend *be, int exact);
/* Tests only: while margins is not NULL, every MoE layer of the CPU backend lowers margins[t] (t < rows, t
 * the step's row) to that row's routing margin (cpu/ops.h k3c_route_margin); the caller sets them (to
 * INFINITY) before a step. A test comparing another backend's stream with the CPU's tells a routing near-tie
 * (a tiny margin: f32 noise may pick another expert) from a wrong result with it. */
void k3c_backend_cpu_track_route_margins(k3c_backend *be, float *margins, int rows);
/* Tests only: CPU backends created after this call offer mla_attention_expanded (on = 1, the default) or
 * leave it NULL (on = 0: every MLA step absorbed), so a test can compare the two forms through the engine. */
void k3c_backend_cpu_test_mla_expanded(int on);
/* Defined by src/cuda when built with CUDA; returns NULL with a message when no GPU is usable. */
k3c_backend *k3c_backend_cuda_create(int device);
/* The same diagnostic on the CUDA backend (f32 activations, f32 MLA cache); call before init. Tests only. */
void k3c_backend_cuda_set_exact(k3c_backend *be, int exact);

#endif
