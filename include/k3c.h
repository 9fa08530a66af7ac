/* k3c: an inference engine for Kimi K3 and the Kimi Linear family.
 *
 * The public API is a set of opaque handles: a model (config + loaded weights), and, on top of it, an
 * engine that runs steps. Front ends (the CLI, a server) use only this header. Every call returns 0 on
 * success or -1 with a message from k3c_last_error() and a kind from k3c_last_error_kind(); a NULL handle or
 * output pointer is such an error (a getter then returns -1, a pointer-returning call NULL), and the free
 * functions take NULL as a no-op.
 *
 * Linking: `make install PREFIX=...` installs libk3c.a, this header and k3c.pc; build against it with
 * `cc prog.c $(pkg-config --cflags --libs --static k3c)` (a CUDA-enabled build needs the CUDA runtime's
 * flags, which k3c.pc carries). examples/generate.c is a complete program. */
#ifndef K3C_H
#define K3C_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The return values of every int call of this API. */
#define K3C_OK 0
#define K3C_ERR (-1)

/* ---- version: of the headers compiled against (macros) and of the library linked (k3c_version) ---- */
#define K3C_VERSION_MAJOR 0
#define K3C_VERSION_MINOR 1
#define K3C_VERSION_PATCH 0
#define K3C_VERSION_STRING "0.1.0"
/* MAJOR * 10000 + MINOR * 100 + PATCH, for #if comparisons */
#define K3C_VERSION_NUMBER (K3C_VERSION_MAJOR * 10000 + K3C_VERSION_MINOR * 100 + K3C_VERSION_PATCH)
/* "0.1.0": the library's K3C_VERSION_STRING (compare with the header's to catch a stale install). */
const char *k3c_version(void);
/* 1 when this library was built with the CUDA backend (device "cuda" available to k3c_engine_create). */
int k3c_has_cuda(void);

/* ---- errors ----
 * A failed call leaves, on the calling thread, a message naming what failed and where, and a kind saying
 * whose the failure is: a server answers K3C_ERROR_INPUT with a 4xx and the others with a 5xx. */
typedef enum k3c_error_kind {
    K3C_ERROR_NONE = 0,  /* no message set on this thread (nothing failed since it last cleared) */
    K3C_ERROR_INPUT,     /* a bad argument, option, request, config or checkpoint content: the caller's to fix */
    K3C_ERROR_OOM,       /* host or device memory refused */
    K3C_ERROR_DEVICE,    /* a CUDA or cuBLAS call failed (no device, driver, launch, fault) */
    K3C_ERROR_IO,        /* a file could not be opened, read, mapped or written */
    K3C_ERROR_INTERNAL,  /* the library broke its own invariant (a bug: please report it) */
} k3c_error_kind;

/* The message of the last failed call on this thread. */
const char *k3c_last_error(void);
/* Its kind. */
k3c_error_kind k3c_last_error_kind(void);
/* "none", "input", "out of memory", "device", "io", "internal" ("?" outside the enum). */
const char *k3c_error_kind_name(k3c_error_kind kind);

/* ---- log and progress ----
 * Warnings and notes go to the log callback, and long tasks (the weight upload to the device, ...) send
 * progress events to the progress callback; the library writes to stderr only through their defaults
 * ("k3c: warning: ..." lines; a progress line rewritten in place with \r), and never to stdout.
 * Set both before using the library from several threads: the setters are not synchronized with calls in
 * flight. A callback may be called from any thread that runs a library call. */
typedef enum k3c_log_level {
    K3C_LOG_DEBUG = 0,  /* not shown by the default */
    K3C_LOG_INFO,
    K3C_LOG_WARN,       /* the library carries on, slower or with less (e.g. pageable instead of page-locked) */
    K3C_LOG_ERROR,
} k3c_log_level;
/* msg: one line without its newline, valid during the call. */
typedef void (*k3c_log_fn)(void *user, k3c_log_level level, const char *msg);
/* fn NULL: back to the default (stderr). */
void k3c_set_log(k3c_log_fn fn, void *user);
const char *k3c_log_level_name(k3c_log_level level); /* "debug", "info", "warning", "error" */

typedef struct k3c_progress {
    const char *what;  /* the task, e.g. "cuda: uploading weights" (valid during the call) */
    double done, total; /* bytes */
    double seconds;     /* since the task started */
    int final;          /* 1 on the task's last event (done, or given up after an error) */
} k3c_progress;
typedef void (*k3c_progress_fn)(void *user, const k3c_progress *p);
/* fn NULL: progress events are dropped (k3c_set_progress was called); never called: the stderr default. */
void k3c_set_progress(k3c_progress_fn fn, void *user);

/* ---- model ---- */
typedef struct k3c_model k3c_model;

/* Loads a checkpoint directory (HF config.json + safetensors, sharded or not). */
int k3c_load(const char *dir, k3c_model **out);
void k3c_free(k3c_model *m);

/* Writes a synthetic checkpoint of a named preset (tiny, mini, kimi-linear-tiny, ...) to dir, in the
 * published layout, deterministic per seed. */
int k3c_synthesize(const char *preset, uint64_t seed, const char *dir);
/* The preset names, NULL-terminated (static). */
const char *const *k3c_preset_names(void);
/* 1 when the preset has weights k3c_synthesize writes to disk; 0 for a config-only (benchmark or
 * full-size) preset, of which k3c_synthesize writes config.json only, and for an unknown name. */
int k3c_preset_has_weights(const char *preset);
/* A model of a preset whose weights exist only where an engine runs: a "cuda" engine generates them in
 * device memory (deterministic per seed); nothing is written to disk and a "cpu" engine refuses it. For
 * benchmarks of presets too large to write (k3-slice, kimi-linear-48b, ...). */
int k3c_model_synthesize_device(const char *preset, uint64_t seed, k3c_model **out);

/* What a model is: its config, its layer schedule and its sizes (k3c_model_info_get). Every count is
 * over the text model; sizes in bytes. */
#define K3C_DTYPES 16 /* entries of k3c_model_info's per-dtype arrays */
typedef enum k3c_layer_attention { K3C_LAYER_KDA = 1, K3C_LAYER_MLA = 2 } k3c_layer_attention;
typedef enum k3c_layer_ffn { K3C_LAYER_DENSE = 1, K3C_LAYER_MOE = 2 } k3c_layer_ffn;
typedef struct k3c_model_info {
    const char *family;          /* "Kimi K3" or "Kimi Linear" */
    const char *tensor_prefix;   /* "language_model." (K3) or "" (Kimi Linear) */
    int hidden_size, vocab_size, num_layers;
    int num_kda_layers, num_mla_layers, num_dense_layers, num_moe_layers;
    int num_experts, num_experts_per_token, num_shared_experts;
    int moe_intermediate_size, intermediate_size;
    int expert_in;               /* width the routed experts see (the latent, or hidden_size) */
    const char *expert_dtype;    /* "MXFP4" or "BF16" */
    int num_attention_heads, kv_lora_rank, q_lora_rank, qk_rope_head_dim, v_head_dim;
    int kda_num_heads, kda_head_dim, kda_conv_kernel;
    int attn_res_block_size;     /* 0: plain residual */
    int num_attn_res_blocks;
    int max_position_embeddings; /* the model's context length */
    int tie_word_embeddings;
    int bos_token_id, eos_token_id, pad_token_id;
    /* checkpoint */
    size_t num_tensors;          /* text-model tensors checked and bound */
    size_t num_skipped_tensors;  /* vision_tower. / mm_projector. tensors in the files, not part of the text model */
    int num_shards;              /* 0: a device-synthetic model (no files) */
    int device_synthetic;
    /* sizes */
    uint64_t params_total, params_routed, params_embedding;
    double params_active;        /* per token: non-expert + k / E of the routed experts; the embedding only when tied */
    uint64_t weight_bytes;       /* the bound tensors as stored */
    uint64_t file_bytes;         /* the shard files mapped */
    uint64_t owned_bytes;        /* f32 copies of small vectors the loader keeps */
    uint64_t embedding_bytes;    /* the embedding matrix as stored */
    uint64_t routed_expert_bytes; /* all routed experts as stored */
    uint64_t mla_cache_bytes_per_token; /* bf16 latent x MLA layers: what one token adds to the MLA cache
                                         * (half with k3c_engine_options.kv_fp8 on cuda) */
    uint64_t kda_state_bytes_per_request; /* KDA layers x (f32 state + bf16 conv window) */
    uint64_t kda_state_bytes, kda_conv_bytes; /* of one KDA layer */
    /* bytes and tensor counts per stored dtype of the model tensors, indexed as k3c_dtype_name_of names them */
    uint64_t dtype_bytes[K3C_DTYPES], dtype_tensors[K3C_DTYPES];
} k3c_model_info;
/* Fills *out (strings are static). */
int k3c_model_info_get(const k3c_model *m, k3c_model_info *out);
/* Layer l's attention and FFN kind; 0 for an l outside 0 .. num_layers - 1 (or a NULL model). */
k3c_layer_attention k3c_model_layer_attention(const k3c_model *m, int l);
k3c_layer_ffn k3c_model_layer_ffn(const k3c_model *m, int l);
/* 1 where layer l starts an AttnRes block, else 0. */
int k3c_model_layer_block_start(const k3c_model *m, int l);
/* A stored dtype's name ("BF16", "F32", "F8_E4M3", ...), "INVALID" for an index without one. */
const char *k3c_dtype_name_of(int dtype);

/* ---- engine: runs steps of many requests over one loaded model ----
 * An engine owns a backend (device), the paged MLA latent cache, the KDA state slots and the step buffers,
 * all allocated once at creation. A request is one timeline (its cache blocks and its KDA slot). */
typedef struct k3c_engine k3c_engine;

/* The specialized decode executor (CUDA): decode and uniform-verify steps of prepared shapes replayed as
 * captured graphs, bitwise the stock forward's results. */
typedef enum k3c_specialized {
    K3C_SPECIALIZED_AUTO = 0, /* built where the device has one (cuda, without exact_f32), else stock only */
    K3C_SPECIALIZED_OFF,      /* every step runs the stock forward */
    K3C_SPECIALIZED_ON,       /* built, or k3c_engine_create fails saying why */
} k3c_specialized;

typedef struct k3c_engine_options {
    const char *device;      /* "cpu" (default) or "cuda" */
    int threads;             /* cpu: worker threads, 0 = one per core */
    /* k3c_specialized: whether the engine builds the specialized decode executor and routes the steps its
     * plan allows to it (k3c_engine_step, k3c_engine_step_greedy, k3c_generate and the runner alike); each
     * step shape is captured the second time a step of it comes (the first runs stock), or all of them at
     * once by k3c_engine_warmup */
    int specialized;
    int max_requests;        /* open requests at once (KDA slots); default 4 */
    int max_rows;            /* tokens in one step, all requests together; default 256 */
    int max_context;         /* tokens one request may hold; 0 (default) = 4096, or the model's context length
                              * if shorter; more than the model's context length (max_position_embeddings) is
                              * refused */
    int block_size;          /* MLA cache block, tokens; default 16 */
    int num_blocks;          /* MLA cache blocks; 0 = enough for max_requests full contexts */
    int q_max;               /* most tokens one verify may hold; default 8 */
    int chunk_min;           /* prompt rows >= this use the chunked KDA form; 0 = 16 */
    int mla_expand_min;      /* prompt rows >= this use the expanded MLA form (where the backend has it); 0 = 128 */
    int poison_freed_blocks; /* debug: fill blocks of closed requests with NaN */
    /* diagnostic (cpu and cuda): keep activations in f32, no bf16 rounding anywhere, to check the forward against
     * float64 / fp32 references far below bf16 noise (where routing near-ties would otherwise flip experts) */
    int exact_f32;
    /* 1: the MLA latent cache stores FP8 E4M3 values (scale 1, round to nearest even, saturating at +-448;
     * util/fp8.h) instead of bf16: half the cache bytes a decode step reads, at E4M3's 3 mantissa bits. The
     * CUDA backend stores E4M3 bytes; the CPU backend stores the E4M3 values in f32 slots (the same function,
     * not the memory saving). */
    int kv_fp8;
    /* Aux hidden-state streams (EAGLE-3 / DSpark style drafter taps; vLLM's aux_hidden_state_layers; the
     * hidden state entering a layer): aux_layers[0 .. num_aux-1] are layer indices L in 0 .. num_layers, strictly
     * increasing, at most K3C_MAX_AUX of them (copied at creation; NULL / 0 = none). Stream j of a step holds,
     * for each logits row of the step, the hidden state entering layer aux_layers[j]: L = 0 the embedding;
     * else the value after layer L - 1 added its FFN output: with block AttnRes (K3) the block-partial prefix
     * (the sum of the sublayer outputs since the last block boundary, completed blocks not included), with the
     * plain residual (Kimi Linear) the residual stream; L = num_layers what enters the output AttnRes / final
     * norm. Pre-norm f32 holding the bf16-rounded values the forward keeps. Read with k3c_engine_aux. */
    const int *aux_layers;
    int num_aux;
    /* The memory plan: bytes the caches (MLA latent cache + KDA state, on the engine's device) may take; 0 =
     * what the device has free at creation, once the weights are in place (cpu: MemAvailable, within a
     * cgroup's memory.max; cuda: cudaMemGetInfo). Caches for max_requests x max_context (or num_blocks) past
     * it are refused at creation; weights and step buffers are not counted. k3c_engine_memory_get tells what
     * was reserved. */
    size_t memory_limit;
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
/* Requests the engine can hold open at once (its KDA slots). */
int k3c_engine_max_requests(const k3c_engine *e);
/* The device the engine runs on ("cpu" or "cuda"; static). */
const char *k3c_engine_device(const k3c_engine *e);

/* What the memory plan reserved at creation. */
typedef struct k3c_engine_memory {
    size_t cache_bytes;       /* kv_bytes + kda_bytes, on the engine's device */
    size_t kv_bytes;          /* the MLA latent cache */
    size_t kda_bytes;         /* the KDA state slots (and their verify scratch) */
    size_t limit;             /* the limit they were checked against; 0 = none could be told */
    const char *limit_source; /* "memory_limit", or where the device's free memory was read */
    int max_requests, max_context;
    long cache_tokens;        /* token positions the MLA cache holds, all requests together */
} k3c_engine_memory;
int k3c_engine_memory_get(const k3c_engine *e, k3c_engine_memory *out);

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

/* Runs one step. logits (host): the requested rows item by item, each [vocab] float32. The step is planned
 * (see "routing" below): on an engine with the specialized executor a decode or uniform verify step of a
 * captured shape runs there, anything else the stock forward; the logits are the same either way. An item
 * counts as prompt rows (never specialized) when it is not a verify and carries more than one token or is
 * the request's first. */
int k3c_engine_step(k3c_engine *e, const k3c_step_item *items, int n, float *logits);
/* The same step, returning the greedy token of each logits row (k3c_greedy_token's order) in ids[row].
 * logits: a host buffer of the step's logits rows ([rows, vocab] float32, k3c_step_logits_rows) that the
 * step may use: a stock step computes the logits there and takes the ids from them; a specialized step
 * takes the arg-max on the device and downloads only the ids (4 bytes a row), leaving logits as it was. */
int k3c_engine_step_greedy(k3c_engine *e, const k3c_step_item *items, int n, int32_t *ids, float *logits);
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

/* ---- routing: which path runs each step, and what each path ran ----
 * Every step is planned once (the specialized decode's predicates, src/decode/plan.h) by
 * its shape alone: decode (every request one token) or uniform verify (every request q tokens) of a
 * prepared row count (1, 2, 4, 8, 16, 24, 32, 48, 64) with its graph captured runs specialized; wide
 * verifies past 64 rows, prompt rows, mixed steps and shapes not captured yet run the stock forward. An
 * engine without the executor (cpu, or K3C_SPECIALIZED_OFF) plans against a nominal table (every row count
 * up to 64 prepared, no graphs needed) and runs every step stock: its counts say what an executor would
 * have taken. */
#define K3C_ROUTES 4        /* stock, decode, verify, wide */
#define K3C_STOCK_REASONS 8 /* none, pipeline stage, rows not prepared, KV not prepared, not captured, prompt rows,
                             * non-uniform query lengths, empty */
typedef struct k3c_engine_stats {
    int specialized;                           /* 1: the engine has the specialized executor, enabled */
    int graphs_captured;                       /* step shapes captured so far */
    long steps;                                /* steps run, every path and entry point */
    long route_steps[K3C_ROUTES];              /* the plan's route of each step */
    long stock_reason_steps[K3C_STOCK_REASONS]; /* of the steps planned stock: the predicate that failed */
    long executor_steps;                       /* steps the specialized executor ran (graph replays) */
    long greedy_id_steps;                      /* of those, steps that downloaded token ids, not logits */
} k3c_engine_stats;
void k3c_engine_stats_get(const k3c_engine *e, k3c_engine_stats *out);
/* "stock", "decode", "verify", "wide" ("?" outside 0 .. K3C_ROUTES - 1). */
const char *k3c_route_name(int route);
/* "specialized", "pipeline-stage input", "row count not prepared", ... ("?" outside 0 .. K3C_STOCK_REASONS - 1). */
const char *k3c_stock_reason_text(int reason);
/* Captures every prepared step shape now (the engine's q_max and max_requests bound them), so no later
 * step pays a capture or runs stock for want of one. A no-op on an engine without the executor. */
int k3c_engine_warmup(k3c_engine *e);
/* A/B switch for benchmarks and checks: on = 0 runs every following step stock, on = 1 routes again
 * (fails on an engine without the executor). The plan and its counts are kept either way. */
int k3c_engine_set_specialized(k3c_engine *e, int on);

/* Op profile, a diagnostic of cuda engines created with K3C_CUDA_PROFILE=1, 2 or 3 in the environment:
 * K3C_PROFILE_QUERY returns 0 (not profiling), 1 (events: profiled specialized steps run their recorded
 * launches eagerly), 2 (stamps: such steps are captured again with a time stamp after every op) or 3 (block
 * stamps: such a step replays its graph with every kernel stamping each block's start, wait and end; its
 * _SPECIALIZED report is the "STAMP..." tables of that one step, step_ms the plain step's time to compare);
 * K3C_PROFILE_RESET forgets both paths' totals; K3C_PROFILE_NEXT makes the next specialized step run
 * profiled (stock steps always are); K3C_PROFILE_REPORT_STOCK / _SPECIALIZED write "PROF ..." lines of the
 * ops timed since the reset (the specialized report with its host phases) to out, a FILE * (void * keeps
 * <stdio.h> out of this header), as shares of step_ms. 0 (or the query's answer) or -1; on an engine
 * that does not profile every op but QUERY is a no-op returning 0. */
typedef enum k3c_profile_op {
    K3C_PROFILE_QUERY = 0,
    K3C_PROFILE_RESET,
    K3C_PROFILE_NEXT,
    K3C_PROFILE_REPORT_STOCK,
    K3C_PROFILE_REPORT_SPECIALIZED,
} k3c_profile_op;
int k3c_engine_profile(k3c_engine *e, k3c_profile_op op, void *out, double step_ms);

/* Device measurements next to which a benchmark states its floor. k3c_device_copy_bandwidth: read +
 * write bytes per second of a 1 GiB device-to-device copy (best of 5); k3c_device_download_seconds: the
 * median of 5 device-to-host copies of `bytes` into page-locked (pageable = 0) or malloc'ed memory. cuda
 * only: -1 and a message elsewhere. */
int k3c_device_copy_bandwidth(const char *device, double *bytes_per_s);
int k3c_device_download_seconds(const char *device, size_t bytes, int pageable, double *seconds);

/* ---- sampling and generation ---- */
typedef struct k3c_sampling {
    float temperature; /* <= 0: greedy (argmax, ties to the lower id) */
    int top_k;         /* 0: off */
    float top_p;       /* >= 1 or <= 0: off */
    uint64_t seed;
} k3c_sampling;

typedef struct k3c_sampler k3c_sampler;
/* s NULL: greedy. */
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
 * decode step), closes the request. s NULL: greedy; on_token and stats may be NULL. */
int k3c_generate(k3c_engine *e, const int32_t *prompt, int n_prompt, int max_new, const k3c_sampling *s,
                 k3c_token_fn on_token, void *user, k3c_generate_stats *stats);

/* ---- runner: continuous batching over one engine ----
 * A queue of requests; up to max_active of them hold engine requests at once. Each k3c_runner_step builds and
 * runs ONE engine step: requests still prefilling contribute a prompt chunk (all chunks together within
 * prefill_budget tokens), decoding requests one token, or with speculation a verify of q = 1 + d tokens (the
 * last sampled token and d drafts from a prompt-lookup drafter). Requests join when a slot frees and finish
 * (max_new tokens, or the stop token) between steps. Every step is planned by the engine (see "routing"
 * above) and counted per route: on an engine with the specialized executor its decode and uniform verify
 * steps run there (greedy steps download only token ids); without one every step runs stock.
 *
 * Speculation is greedy only: requests with temperature > 0 always decode one token (with speculation on
 * they then make the step a mixed one). Drafts are checked against the argmax, so greedy streams are the
 * same with and without speculation. */
typedef struct k3c_runner k3c_runner;

typedef struct k3c_runner_options {
    int spec_tokens;    /* d: drafts per verify, 0 = no speculation; 1 + d must not exceed the engine's q_max */
    int prefill_budget; /* prompt tokens per step, all requests together; 0 = the engine's max_rows */
    int max_active;     /* requests holding engine slots at once; 0 = every slot the engine has free */
} k3c_runner_options;

typedef struct k3c_runner_request {
    const int32_t *prompt; /* [n_prompt], copied by submit */
    int n_prompt;
    int max_new;           /* tokens to generate, >= 1 */
    k3c_sampling sampling;
    int32_t stop_token;    /* < 0: none; else generation ends after emitting it (it is part of the output) */
} k3c_runner_request;

/* Steps per route and per stock reason: indices as k3c_route_name and k3c_stock_reason_text name them. */
#define K3C_RUNNER_ROUTES K3C_ROUTES
#define K3C_RUNNER_REASONS K3C_STOCK_REASONS
typedef struct k3c_runner_stats {
    long steps;
    long route_steps[K3C_RUNNER_ROUTES];          /* the plan's route of each step */
    long stock_reason_steps[K3C_RUNNER_REASONS];  /* of the stock steps: the failing predicate */
    long executor_steps;                          /* steps the specialized executor ran (0 without one) */
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

/* ---- tokenizer: text <-> token ids ----
 * Kimi's tiktoken tokenizer as a checkpoint ships it beside its weights: tiktoken.model (one base64 token
 * and its rank per line; the rank is the id and the merge priority) and tokenizer_config.json
 * (added_tokens_decoder names the special slots after the base ranks, bos / eos / pad / unk name tokens).
 * Ids are bit-exact with Kimi's tokenization_kimi.py on Python tiktoken 0.14: its chunking of long inputs,
 * its pre-split pattern (through PCRE2, widened to the reference's Unicode 16 tables), byte-level BPE with
 * the lowest rank merged first (leftmost on a tie). Special slots: 258 (Kimi Linear / K2) or 256 (K3,
 * chosen when added_tokens_decoder names <|open|> or <|end_of_msg|>); an unnamed slot i is the special
 * <|reserved_token_i|>. A tokenizer is read-only once loaded: encode and decode may run on several
 * threads at once. */
typedef struct k3c_tokenizer k3c_tokenizer;

/* 1 when dir holds a tokenizer (a tiktoken.model file), 0 when it does not (a model that runs on ids). */
int k3c_tokenizer_present(const char *dir);
/* Loads dir/tiktoken.model and dir/tokenizer_config.json (regular files only). Errors name the file and
 * line; a directory without tiktoken.model says it has no tokenizer. */
int k3c_tokenizer_load(const char *dir, k3c_tokenizer **out);
/* The tokenizer `k3c synth` writes beside a preset's weights (embedded in the library: no file read). */
int k3c_tokenizer_load_preset(const char *preset, k3c_tokenizer **out);
void k3c_tokenizer_free(k3c_tokenizer *t);

/* A growing list of ids: encode appends to it. Start from {0}; free with k3c_tokens_free. */
typedef struct k3c_tokens {
    int32_t *ids;
    size_t n, cap;
} k3c_tokens;
void k3c_tokens_free(k3c_tokens *v);

/* Appends the ids of text[0 .. len) to out. allow_special = 1: the text of every special token (reserved
 * names included) becomes its id, the leftmost first (Kimi's encode default, allowed_special="all");
 * 0: special text is ordinary text. Ill-formed UTF-8 is read as Python's bytes.decode("utf-8",
 * "replace") reads it (each maximal ill-formed subpart is U+FFFD; so the three bytes of an encoded
 * surrogate are three U+FFFD: a Python str's lone surrogate, one U+FFFD in tiktoken, has no UTF-8 form).
 * No BOS is added. On failure out is left as it was. */
int k3c_tokenizer_encode(const k3c_tokenizer *t, const char *text, size_t len, int allow_special, k3c_tokens *out);
/* k3c_tokenizer_encode with allow_special = 0 (tiktoken's encode_ordinary). */
int k3c_tokenizer_encode_ordinary(const k3c_tokenizer *t, const char *text, size_t len, k3c_tokens *out);

/* Decodes ids into a malloc'd buffer (NUL after the last byte; the caller frees it): _bytes joins the
 * token bytes as they are (possibly ill-formed UTF-8, like tiktoken's decode_bytes); _decode makes it
 * valid UTF-8, each maximal ill-formed subpart U+FFFD (tiktoken's decode, errors="replace"). An id
 * outside the vocabulary is an error naming it. */
int k3c_tokenizer_decode_bytes(const k3c_tokenizer *t, const int32_t *ids, size_t n, char **out, size_t *len);
int k3c_tokenizer_decode(const k3c_tokenizer *t, const int32_t *ids, size_t n, char **out, size_t *len);

/* The bytes of one token (a special's text; not NUL-terminated) and their count, or NULL for an id
 * outside the vocabulary. */
const char *k3c_tokenizer_token(const k3c_tokenizer *t, int32_t id, size_t *len);
/* The id of a special token by its text ("[BOS]", "<|im_end|>", "<|reserved_token_163650|>"), or -1. */
int32_t k3c_tokenizer_special_id(const k3c_tokenizer *t, const char *name);
int k3c_tokenizer_is_special(const k3c_tokenizer *t, int32_t id);
/* Ids are 0 .. vocab - 1: the base ranks 0 .. num_base - 1, then the special slots. */
int32_t k3c_tokenizer_vocab(const k3c_tokenizer *t);
int32_t k3c_tokenizer_num_base(const k3c_tokenizer *t);
/* The ids tokenizer_config.json names as bos / eos / pad / unk, -1 where it names none. */
int32_t k3c_tokenizer_bos(const k3c_tokenizer *t);
int32_t k3c_tokenizer_eos(const k3c_tokenizer *t);
int32_t k3c_tokenizer_pad(const k3c_tokenizer *t);
int32_t k3c_tokenizer_unk(const k3c_tokenizer *t);

/* Streaming decode: ids in, text out as soon as it is complete. Output is always valid UTF-8 and never
 * splits a code point: bytes that may still begin a character (at most 3) wait for the next id; bytes
 * that cannot are U+FFFD at once. Everything pushed plus finish equals k3c_tokenizer_decode of all ids. */
typedef struct k3c_detokenizer k3c_detokenizer;
/* The tokenizer must outlive the detokenizer. */
int k3c_detokenizer_create(const k3c_tokenizer *t, k3c_detokenizer **out);
/* Feeds one id; *text / *len: the text it completes (possibly empty; valid until the next call). */
int k3c_detokenizer_push(k3c_detokenizer *d, int32_t id, const char **text, size_t *len);
/* End of the stream: held-back bytes come out as U+FFFD; the detokenizer is then empty, ready for another. */
int k3c_detokenizer_finish(k3c_detokenizer *d, const char **text, size_t *len);
/* Bytes held back right now (0 .. 3). */
size_t k3c_detokenizer_pending(const k3c_detokenizer *d);
void k3c_detokenizer_free(k3c_detokenizer *d);

#ifdef __cplusplus
}
#endif
#endif
