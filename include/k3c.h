/* k3c: an inference engine for Kimi K3 and the Kimi Linear family.
 *
 * The public API is a set of opaque handles: a model (config + loaded weights), and, on top of it, an
 * engine that runs steps. Front ends (the CLI, a server) use only this header. Every call returns 0 on
 * success or -1 with a message from k3c_last_error(). */
#ifndef K3C_H
#define K3C_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct k3c_model k3c_model;

/* The message of the last failed call on this thread. */
const char *k3c_last_error(void);

/* Loads a checkpoint directory (HF config.json + safetensors, sharded or not). */
int k3c_load(const char *dir, k3c_model **out);
void k3c_free(k3c_model *m);

/* Writes a synthetic checkpoint of a named preset (tiny, mini, kimi-linear-tiny, ...) to dir, in the
 * published layout, deterministic per seed. */
int k3c_synthesize(const char *preset, uint64_t seed, const char *dir);

/* ---- engine: runs steps of many requests over one loaded model ----
 * An engine owns a backend (device), the paged MLA latent cache, the KDA state slots and the step buffers,
 * all allocated once at creation. A request is one timeline (its cache blocks and its KDA slot). */
typedef struct k3c_engine k3c_engine;

typedef struct k3c_engine_options {
    const char *device;      /* "cpu" (default) or "cuda" */
    int threads;             /* cpu: worker threads, 0 = one per core */
    int max_requests;        /* open requests at once (KDA slots); default 4 */
    int max_rows;            /* tokens in one step, all requests together; default 256 */
    int max_context;         /* tokens one request may hold; default 4096 */
    int block_size;          /* MLA cache block, tokens; default 16 */
    int num_blocks;          /* MLA cache blocks; 0 = enough for max_requests full contexts */
    int q_max;               /* most tokens one verify may hold; default 8 */
    /* Batch invariance (k3c_engine_prompt_piece): the forms of KDA and MLA are chosen per row by position.
     * chunk_min: the KDA block C (0 = 64, at least 2): a non-verify item's rows in whole aligned blocks
     * [k C, (k + 1) C) use the chunked form, every other row the recurrence. mla_expand_min: the MLA block
     * (0 = 128, rounded up to a multiple of C): rows in whole aligned blocks attend in the expanded form (where
     * the backend has it), every other row absorbed. A block larger than max_rows is never used. */
    int chunk_min;
    int mla_expand_min;
    int poison_freed_blocks; /* debug: fill blocks of closed requests with NaN */
    /* diagnostic (cpu and cuda): keep activations in f32, no bf16 rounding anywhere, to check the forward against
     * float64 / fp32 references far below bf16 noise (where routing near-ties would otherwise flip experts) */
    int exact_f32;
    /* 1: the MLA latent cache stores FP8 E4M3 values (scale 1, round to nearest even, saturating at +-448;
     * util/fp8.h) instead of bf16: half the cache bytes a decode step reads, at E4M3's 3 mantissa bits. The
     * CUDA backend stores E4M3 bytes; the CPU backend stores the E4M3 values in f32 slots (the same function,
     * not the memory saving). */
    int kv_fp8;
    /* Aux hidden-state streams (EAGLE-3 / DSpark style drafter taps; vLLM's aux_hidden_state_layers; spec
     * k3-architecture.md §6): aux_layers[0 .. num_aux-1] are layer indices L in 0 .. num_layers, strictly
     * increasing, at most K3C_MAX_AUX of them (copied at creation; NULL / 0 = none). Stream j of a step holds,
     * for each logits row of the step, the hidden state entering layer aux_layers[j]: L = 0 the embedding;
     * else the value after layer L - 1 added its FFN output: with block AttnRes (K3) the block-partial prefix
     * (the sum of the sublayer outputs since the last block boundary, completed blocks not included), with the
     * plain residual (Kimi Linear) the residual stream; L = num_layers what enters the output AttnRes / final
     * norm. Pre-norm f32 holding the bf16-rounded values the forward keeps. Read with k3c_engine_aux. */
    const int *aux_layers;
    int num_aux;
} k3c_engine_options;

/* Most aux streams one engine keeps (each costs max_rows x hidden floats on the device and on the host). */
#define K3C_MAX_AUX 16

void k3c_engine_options_default(k3c_engine_options *o);
/* The model must outlive the engine. */
int k3c_engine_create(k3c_model *m, const k3c_engine_options *o, k3c_engine **out);
void k3c_engine_free(k3c_engine *e);
int k3c_engine_vocab(const k3c_engine *e);
/* Most tokens one step may carry. */
int k3c_engine_max_rows(const k3c_engine *e);
/* The model's hidden size (the width of an aux stream row). */
int k3c_engine_hidden_size(const k3c_engine *e);

/* Batch invariance: a request's logits depend only on its own tokens, bit for bit, not on the other items of
 * its steps, on verify against decode (a verified row equals the decoded one) or on how its prompt was cut
 * into items, as long as every cut is one k3c_engine_prompt_piece allows. The runner and k3c_generate cut
 * that way. (Within one backend; CPU and CUDA differ by f32 summation order, and on CUDA some kernels are
 * not invariant yet: docs/DESIGN.md.)
 * k3c_engine_prompt_piece: how many tokens (<= max_tokens) a request holding `pos` tokens of a prompt that
 * ends at position `end` should feed next; 0 when no allowed cut lies within max_tokens, which never happens
 * for max_tokens >= k3c_engine_prompt_grid (a cut at a multiple of the grid is always allowed, at most
 * max_rows). */
int k3c_engine_prompt_piece(const k3c_engine *e, int pos, int end, int max_tokens);
int k3c_engine_prompt_grid(const k3c_engine *e);

/* Opens a fresh request (empty cache, zero KDA state); *id identifies it until closed. */
int k3c_request_open(k3c_engine *e, int *id);
/* Frees its blocks and slot. */
int k3c_request_close(k3c_engine *e, int id);
/* Tokens the request holds (committed). */
int k3c_request_length(const k3c_engine *e, int id);

/* One request's part of a step. */
typedef struct k3c_step_item {
    int request;
    const int32_t *tokens; /* [n] new tokens: a prompt (chunk), one decode token, or q verify tokens */
    int n;
    /* 0: the tokens are appended. 1: verify: logits for all n rows, the request's state is unchanged until
     * k3c_request_commit (which must come before its next step). */
    int verify;
    int all_logits;        /* non-verify: 1 = logits for every row, 0 = for the last row only */
} k3c_step_item;

/* Runs one step. logits (host): the requested rows item by item, each [vocab] float32. */
int k3c_engine_step(k3c_engine *e, const k3c_step_item *items, int n, float *logits);
/* Host memory for `rows` logits rows ([rows, vocab] float32), for k3c_engine_step, the runner and the
 * executor to write logits into: page-locked on a device engine, so a step's logits download runs at the
 * link's DMA rate instead of through the driver's staging (kimi-linear-48b b=64 on the H200: 42 MB at 7.4
 * GB/s into malloc'ed memory, docs/BENCHMARKS.md); malloc'ed on the CPU. Any host buffer still works as
 * logits; this one is faster. Where page-locked memory is refused (the driver or the host will not pin that
 * much) the buffer is malloc'ed instead, with a one-line warning on stderr giving the reason: the engine
 * works, its downloads slower. NULL with an error message on failure (rows < 1, or no host memory at all).
 * Free it with k3c_engine_logits_free (which frees each buffer the way it was allocated) before
 * k3c_engine_free: the engine does not free buffers still held, and none can be freed after it is gone. */
float *k3c_engine_logits_alloc(k3c_engine *e, int rows);
void k3c_engine_logits_free(k3c_engine *e, float *logits);
/* The logits rows such a step writes: n for a verify or all_logits item, else 1, summed over the items. */
int k3c_step_logits_rows(const k3c_step_item *items, int n);
/* After a verify of q tokens: keep the first `accepted` (0..q): the request then holds length + accepted
 * tokens and its KDA state is the state after exactly those tokens. */
int k3c_request_commit(k3c_engine *e, int id, int accepted);
/* Aux stream j (0 .. num_aux-1, in the order of k3c_engine_options.aux_layers) of the last step that ran
 * (k3c_engine_step, or a runner step, whichever path ran it): copies [rows, hidden] f32 into out, the rows
 * being that step's logits rows in the same order as its logits. *rows (may be NULL) receives their count.
 * Fails (and writes nothing) when the engine has no aux layers, j is out of range, or no step has succeeded
 * since creation or the last step failed. */
int k3c_engine_aux(const k3c_engine *e, int j, float *out, int *rows);

/* ---- sampling and generation ---- */
typedef struct k3c_sampling {
    float temperature; /* <= 0: greedy (argmax, ties to the lower id) */
    int top_k;         /* 0: off */
    float top_p;       /* >= 1 or <= 0: off */
    uint64_t seed;
} k3c_sampling;

typedef struct k3c_sampler k3c_sampler;
int k3c_sampler_create(const k3c_sampling *s, int vocab, k3c_sampler **out);
void k3c_sampler_free(k3c_sampler *s);
int32_t k3c_sampler_sample(k3c_sampler *s, const float *logits);
/* The greedy token of one logits row: the first largest value, a NaN below every number (all NaN: 0). */
int32_t k3c_greedy_token(const float *logits, int vocab);

typedef struct k3c_generate_stats {
    int prompt_tokens, generated;
    double prefill_seconds, decode_seconds; /* decode: the steps after the first sampled token */
} k3c_generate_stats;

/* Called with each sampled token; a nonzero return stops generation. */
typedef int (*k3c_token_fn)(void *user, int32_t token);

/* Opens a request, prefills the prompt (in chunks of max_rows), samples max_new tokens (each fed back as a
 * decode step), closes the request. */
int k3c_generate(k3c_engine *e, const int32_t *prompt, int n_prompt, int max_new, const k3c_sampling *s,
                 k3c_token_fn on_token, void *user, k3c_generate_stats *stats);

/* ---- runner: continuous batching over one engine ----
 * A queue of requests; up to max_active of them hold engine requests at once. Each k3c_runner_step builds and
 * runs ONE engine step: requests still prefilling contribute a prompt chunk (all chunks together within
 * prefill_budget tokens), decoding requests one token, or with speculation a verify of q = 1 + d tokens (the
 * last sampled token and d drafts from a prompt-lookup drafter). Requests join when a slot frees and finish
 * (max_new tokens, or the stop token) between steps. Every step is routed by the specialized decode's plan
 * (decode/plan.h) and counted per route; without a specialized executor (the CPU) every step runs the stock
 * forward, and the counts say what an executor preparing every row count up to 64 would have taken.
 *
 * Speculation is greedy only: requests with temperature > 0 always decode one token (with speculation on
 * they then make the step a mixed one). Drafts are checked against the argmax, and the engine is batch
 * invariant (above), so a greedy stream is the same bit for bit with and without speculation, alone or
 * beside any other requests, for any prefill_budget. */
typedef struct k3c_runner k3c_runner;

typedef struct k3c_runner_options {
    int spec_tokens;    /* d: drafts per verify, 0 = no speculation; 1 + d must not exceed the engine's q_max */
    /* prompt tokens per step, all requests together; 0 = the engine's max_rows; raised to the engine's
     * k3c_engine_prompt_grid (chunks are cut where k3c_engine_prompt_piece allows) */
    int prefill_budget;
    int max_active;     /* requests holding engine slots at once; 0 = every slot the engine has free */
} k3c_runner_options;

typedef struct k3c_runner_request {
    const int32_t *prompt; /* [n_prompt], copied by submit */
    int n_prompt;
    int max_new;           /* tokens to generate, >= 1 */
    k3c_sampling sampling;
    int32_t stop_token;    /* < 0: none; else generation ends after emitting it (it is part of the output) */
} k3c_runner_request;

/* Steps per route and per stock reason: indices are decode/plan.h's k3c_route and k3c_stock_reason. */
#define K3C_RUNNER_ROUTES 4
#define K3C_RUNNER_REASONS 8
typedef struct k3c_runner_stats {
    long steps;
    long route_steps[K3C_RUNNER_ROUTES];          /* the plan's route of each step */
    long stock_reason_steps[K3C_RUNNER_REASONS];  /* of the stock steps: the failing predicate */
    long executor_steps;                          /* steps a specialized executor ran (0 without one) */
    long prompt_tokens, generated;                /* prompt tokens prefilled, tokens emitted */
    long verify_items;                            /* request verifies (one per request per verify step) */
    long drafts_proposed;                         /* draft tokens verified, padding included */
    long drafts_padded;                           /* of those, padding (the drafter had fewer than d) */
    long drafts_accepted;
    double seconds;                               /* wall time inside k3c_runner_step */
} k3c_runner_stats;

void k3c_runner_options_default(k3c_runner_options *o);
/* The engine must outlive the runner; the runner opens and closes its requests. */
int k3c_runner_create(k3c_engine *e, const k3c_runner_options *o, k3c_runner **out);
void k3c_runner_free(k3c_runner *r);
/* Queues a request; *handle (0, 1, 2, ... in submission order) names it until the runner is freed. */
int k3c_runner_submit(k3c_runner *r, const k3c_runner_request *q, int *handle);
/* Runs one step (admitting waiting requests first); *busy = 1 while requests wait or run afterwards. After a
 * failed step the state of the runner's requests is unknown: free the runner (it closes them). */
int k3c_runner_step(k3c_runner *r, int *busy);
/* Steps until every submitted request has finished. */
int k3c_runner_run(k3c_runner *r);
/* The tokens generated so far for a handle (valid until the next step); *finished = 1 once it ended. */
int k3c_runner_output(const k3c_runner *r, int handle, const int32_t **tokens, int *n, int *finished);
void k3c_runner_stats_get(const k3c_runner *r, k3c_runner_stats *out);
const char *k3c_runner_route_name(int route);   /* "stock", "decode", "verify", "wide" */
const char *k3c_runner_reason_name(int reason); /* decode/plan.h's k3c_stock_reason_name */

#ifdef __cplusplus
}
#endif
#endif
