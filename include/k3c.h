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
 * published layout, deterministic per seed, on one thread per core; a checkpoint of 64 MB or more reports
 * progress events (k3c_set_progress). The bytes do not depend on the thread count. */
int k3c_synthesize(const char *preset, uint64_t seed, const char *dir);
/* Writes the embedded default model (models/k3-fortune: a trained K3-architecture checkpoint with its
 * tokenizer, 12.5 MB) into dir, an existing directory the caller owns and removes; k3c_load reads it. */
int k3c_default_model_write(const char *dir);
/* k3c_synthesize on `threads` generator threads (0 = one per core). */
int k3c_synthesize_threads(const char *preset, uint64_t seed, const char *dir, int threads);
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

/* ---- parallel layouts (k3c plan): what each rank of a layout holds and moves, from a config alone ----
 * Ranks are numbered TP innermost, then DP, then PP: rank = (stage * dp + dp_rank) * tp + tp_rank, and
 * consecutive ranks share a host (hosts divide the ranks evenly), so TP stays inside a host and PP crosses
 * hosts. PP stage s holds layers [s L / pp, (s + 1) L / pp) (integer division), the embedding on the first
 * stage, the final norm, output AttnRes and LM head on the last. Under TP (vLLM's sharding, parallel.md
 * §2.6): the KDA and MLA heads, the dense MLP and shared experts' intermediate dimension, the routed experts'
 * intermediate dimension (ep 1) and the vocabulary of the embedding and the LM head are split over the TP
 * ranks; norms, AttnRes, KDA f_a / g_a, A_log and o_norm, MLA q_a / kv_a and their norms, the router and
 * the latent projections are replicated. With ep = tp x dp the routed experts are instead placed whole, E /
 * ep on each rank of a stage. Byte counts are the published tensors' (MXFP4 experts packed, with their
 * scales). */
typedef struct k3c_layout {
    int tp, pp, dp;        /* ranks = tp x pp x dp (0 means 1) */
    int ep;                /* 0 or 1: experts TP-sharded; tp x dp: whole experts over a stage's ranks */
    int hosts;             /* 0 means 1 */
    uint64_t gpu_mem;      /* bytes of memory per GPU (the fit test) */
    int context, requests; /* per DP rank: requests of context tokens each (the caches and the floor) */
    int kv_fp8;            /* MLA cache elements in FP8 E4M3 (1 byte) instead of bf16 */
    double hbm_bytes_per_s; /* the floor's bandwidth */
    /* Decode context parallel (docs/PARALLEL.md): 0 or 1 none; > 1, a divisor of tp: the MLA latent cache,
     * otherwise replicated on every TP rank, is sharded by position over dcp consecutive TP ranks
     * (interleaved: position p on DCP rank p % dcp), so each rank holds 1/dcp of every request's MLA tokens
     * and the same cache bytes hold dcp times the tokens. KDA state is untouched. */
    int dcp;
} k3c_layout;

typedef struct k3c_layout_rank {
    int rank, host, tp_rank, pp_stage, dp_rank, ep_rank;
    int layer_first, num_layers; /* the stage's layers [layer_first, layer_first + num_layers) */
    int num_kda_layers, num_mla_layers, num_moe_layers;
    int embedding, lm_head;      /* holds a vocabulary shard of the embedding / of the LM head */
    uint64_t weight_bytes;       /* every tensor (share) the rank holds, as published */
    uint64_t routed_expert_bytes; /* of which routed experts */
    uint64_t mla_bytes_per_token; /* what one token adds to the rank's MLA latent cache (replicated over TP) */
    uint64_t mla_cache_bytes;    /* requests x context tokens (x 1 / dcp: the rank's share under DCP) */
    uint64_t mla_tokens;         /* token positions the rank's MLA cache holds: requests x ceil(context / dcp) */
    uint64_t kda_bytes_per_request; /* one KDA slot on the rank: f32 state + f32 conv window, as k3c stores them */
    uint64_t kda_bytes;          /* requests slots */
    uint64_t total_bytes;        /* weights + MLA cache + KDA slots (no activations, workspace or CUDA context) */
    int fits;                    /* total_bytes <= gpu_mem */
    /* The floor of one decode step of `requests` rows (q = 1) on this rank: its weights read once but the
     * routed experts, of which the expected distinct selected ones (E (1 - (1 - k/E)^rows) a layer, rows =
     * requests, x dp under EP) read their share on this rank, the embedding rows looked up, the MLA cache read
     * (context + 1 positions) and written, the KDA slots read and written; over hbm_bytes_per_s. Collectives
     * are not counted. */
    double step_bytes, floor_ms;
} k3c_layout_rank;

/* config: a config.json, or a directory holding one; or NULL and preset (k3c_preset_names). Fills ranks[0 ..
 * tp x pp x dp) (*n = that count; fails when cap is smaller); refuses a layout the config's dimensions do not
 * divide, naming the tensor and dimension. */
int k3c_layout_plan(const char *config, const char *preset, const k3c_layout *layout, k3c_layout_rank *ranks,
                    int cap, int *n);

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
    /* ---- parallel ranks (docs/PARALLEL.md) ----
     * layout: the ranks this engine runs on (k3c_layout's tp, pp, dp and ep; 0 = 1; its other fields are
     * not read). With tp > 1 the engine is rank 0 of tp ranks: each holds its shard of the model
     * (k3c_layout_plan's split), its own backend and caches; rank 0 keeps the request table and every step
     * of this engine (k3c_engine_step and everything built on it: k3c_generate, the runner, the scheduler)
     * runs on all ranks, their partial sums reduced in rank order, so every rank computes the same logits,
     * which rank 0 returns. pp > 1, dp > 1 and ep > 1 are refused: not wired to the engine yet. Every step
     * runs the stock forward (the specialized executor runs at world size 1 only: AUTO leaves it off, ON is
     * refused).
     * world_size 0: every rank in this process, one thread each (device cpu; each rank's backend gets
     * threads / ranks workers). world_size > 0: one process per rank over NCCL (device cuda, the GPU each
     * process sees as device 0): this process is rank `rank` of world_size (= tp x pp x dp); rank 0 writes
     * NCCL's id to the file `rendezvous` names (a path every rank sees: temporary name, then rename), the
     * others wait for it; on a rank other than 0 call k3c_engine_follow, which runs rank 0's steps until rank 0
     * frees its engine. (The CUDA backend has no tensor-parallel ops yet: such an engine fails at creation.)
     * At creation every rank checks that every other was started alike (the model's config and weight
     * bytes, the layout, the device and dtype modes, the options sizing the caches and steps) and all refuse
     * to start, naming the field and the rank, when one differs. rank_timeout_ms (0 = 60000): the longest a
     * rank waits for the others (at the rendezvous, in a collective, for the next step); an idle rank 0
     * keeps its followers within it. A rank that fails or does not answer in time fails the group: rank 0's
     * call fails naming the rank and step, and so does every later one (k3c_engine_failed). */
    k3c_layout layout;
    int rank, world_size;
    const char *rendezvous;
    int rank_timeout_ms;
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
/* Parallel ranks (k3c_engine_options.layout): this engine's rank (0 leads) and the number of ranks. */
int k3c_engine_rank(const k3c_engine *e);
int k3c_engine_world_size(const k3c_engine *e);
/* On a rank other than 0 of a multi-process world: runs rank 0's steps as they come, until rank 0 frees its
 * engine (0) or the group fails (-1, the message naming the failed rank); the engine takes no other call.
 * Then free it. On rank 0 (or at world size 1): -1. */
int k3c_engine_follow(k3c_engine *e);
/* 1 once the engine's rank group has failed (a rank failed or did not answer): every later step fails; free
 * the engine. 0 otherwise (always at world size 1). */
int k3c_engine_failed(const k3c_engine *e);

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
#define K3C_STOCK_REASONS 9 /* none, pipeline stage, rows not prepared, KV not prepared, not captured, prompt rows,
                             * non-uniform query lengths, empty, executor not prepared for tensor parallelism */
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

/* ---- serving scheduler: requests that come and go over one engine ----
 * A waiting queue and a running set over one engine. Each k3c_scheduler_step admits, preempts and builds
 * ONE engine step: every running request's decode (or verify, with speculation) first, then prompt chunks
 * within max_batched_tokens, each cut where k3c_engine_prompt_piece allows, so that a request's greedy stream
 * is bit for bit k3c_generate's alone (batch invariance, above) whatever it ran beside, after a preemption
 * and from a prefix hit. Admission needs a free KDA slot and enough free MLA blocks for the first chunk;
 * when a step's blocks run out the newest request (FCFS) or the lowest-priority one (PRIORITY: the largest
 * (priority, arrival)) is preempted by recompute: its blocks and slot are freed and it waits at the front of
 * the queue, its generated tokens kept and prefilled again as part of its prompt, so its output goes on
 * unchanged when it resumes (its generated tokens are replayed in pieces that keep the forms decoding gave
 * them). Prefix caching: full MLA blocks are kept, keyed by a hash chain of their tokens, with a snapshot of
 * the KDA state where a prefill chunk ended on the prefix grid (k3c_scheduler_stats.prefix_grid: the least
 * common multiple of the MLA block and k3c_engine_prompt_grid, 128 tokens with the engine's defaults); a
 * request whose prompt starts with such a prefix shares those blocks, restores the snapshot and skips those
 * tokens (cached_tokens, a multiple of the grid). Only blocks below a prompt's last whole prompt-grid block
 * are kept (rows past it are computed in the forms of that prompt's tail, which another prompt would not
 * give them), and a hit stops there too: a prompt shorter than one grid never hits. Every step goes through
 * the engine, so its plan routes decode and uniform verify steps to the specialized executor on CUDA.
 *
 * Threads: one thread owns the scheduler and calls k3c_scheduler_step (and k3c_scheduler_wait) in a loop;
 * submit, abort and stats_get may be called from any thread (they take an internal mutex, which step holds
 * only around its queue edits, never across the engine step). */
typedef struct k3c_scheduler k3c_scheduler;

typedef enum k3c_sched_policy { K3C_SCHED_FCFS = 0, K3C_SCHED_PRIORITY = 1 } k3c_sched_policy;

typedef struct k3c_scheduler_options {
    int max_seqs;           /* running requests at once (<= the engine's max_requests); 0 = the engine's */
    int max_batched_tokens; /* tokens per step, decodes first, then prefill chunks; 0 = the engine's max_rows;
                             * at least k3c_engine_prompt_grid (a prompt chunk of one grid must fit) */
    int max_queue;          /* waiting requests before submit refuses (returns 1); 0 = 1024 */
    k3c_sched_policy policy;
    int spec_tokens;        /* prompt-lookup drafts per verify (0 = off); 1 + spec_tokens <= the engine's q_max */
    int prefix_caching;     /* 1 = on (k3c_scheduler_options_default), 0 = off */
    size_t snapshot_bytes;  /* KDA snapshot memory cap, on the engine's device; 0 = the default (256 MiB) */
    /* retention: where a prompt chunk ends on a multiple of this many prefix grids, a snapshot is kept
     * (0 = 1: at every grid boundary a chunk ends on); the align positions keep theirs whatever the interval:
     * a prompt's last grid boundary, the one where its cached blocks outrun its deepest snapshot, and the
     * prefix_hint's */
    int snapshot_interval;
} k3c_scheduler_options;

typedef struct k3c_sched_sampling {
    k3c_sampling base;      /* temperature, top_k, top_p, seed (a per-request generator) */
    float min_p;            /* 0 = off: drop tokens under min_p x the top probability */
    float presence_penalty, frequency_penalty; /* 0 = off (OpenAI's: over the generated tokens) */
    float repetition_penalty; /* 1 (or 0) = off (CTRL / vLLM: over prompt and generated tokens) */
    int logprobs;           /* 0 = none; n > 0 = the chosen token's logprob and the top n - 1 alternatives */
} k3c_sched_sampling;

typedef struct k3c_grammar k3c_grammar; /* constrained decoding (below) */

typedef struct k3c_sched_request {
    const int32_t *prompt;  /* [n_prompt], copied by submit */
    int n_prompt;
    int max_new;            /* tokens to generate, >= 1; n_prompt + max_new <= the engine's max_context */
    k3c_sched_sampling sampling;
    const int32_t *stop_ids; /* [n_stop_ids], copied; generation ends when one is sampled */
    int n_stop_ids;
    int ignore_eos;         /* 0: the model's eos_token_id ends generation too */
    int priority;           /* lower first (PRIORITY policy; must be 0 under FCFS) */
    /* Prompt tokens later requests will likely share (a system prompt, the earlier turns of a chat; 0 = none):
     * prefill stops once at the last block boundary within them, so a KDA snapshot is kept there and the
     * next request starting with them hits it. Without a hint a prefix becomes a hit from the third request
     * that shares it (the second leaves the snapshot where it parts from the first). */
    int prefix_hint;
    /* NULL, or the grammar the output is held to (constrained decoding, below): read-only, shared, it must
     * outlive the request's FINISHED event. A constrained request makes its steps download logits. */
    const k3c_grammar *grammar;
    void *user;             /* returned in its events */
} k3c_sched_request;

typedef enum k3c_sched_event_kind { K3C_SCHED_TOKEN = 0, K3C_SCHED_FINISHED = 1 } k3c_sched_event_kind;
typedef enum k3c_finish_reason {
    K3C_FINISH_NONE = 0,
    K3C_FINISH_STOP,    /* a stop id or eos was sampled (it is in stop_token, not in a TOKEN event) */
    K3C_FINISH_LENGTH,  /* max_new tokens */
    K3C_FINISH_ABORT,   /* k3c_scheduler_abort */
    K3C_FINISH_ERROR,   /* the request could not run (its message in the event) */
} k3c_finish_reason;

/* Events of one step, in order; a request's TOKEN events come before its FINISHED. Pointers are valid until
 * the next k3c_scheduler_step. */
typedef struct k3c_sched_event {
    k3c_sched_event_kind kind;
    uint64_t id;
    void *user;
    int32_t token;                /* TOKEN: a generated token (text; a stop id or eos is never one) */
    float logprob;                /* TOKEN: its logprob (sampling.logprobs > 0; else 0) */
    int n_top;                    /* TOKEN: the top alternatives (sampling.logprobs - 1 of them, or 0) */
    const int32_t *top_ids;       /* [n_top], best first */
    const float *top_logprobs;    /* [n_top] */
    k3c_finish_reason finish;     /* FINISHED */
    int32_t stop_token;           /* FINISHED with STOP: the id that stopped it; else -1 */
    float stop_logprob;           /* its logprob (when asked) */
    int prompt_tokens, cached_tokens, completion_tokens; /* FINISHED (completion counts the stop id) */
    int preemptions;              /* FINISHED: times this request was preempted */
    double queue_seconds;         /* FINISHED: from submit to its first admission (vLLM's queue time; the whole
                                   * wait when it never ran) */
    const char *message;          /* FINISHED with ERROR: why */
} k3c_sched_event;

void k3c_scheduler_options_default(k3c_scheduler_options *o);
/* The engine must outlive the scheduler and be used by nothing else meanwhile (the scheduler opens every
 * request on it). */
int k3c_scheduler_create(k3c_engine *e, const k3c_scheduler_options *o, k3c_scheduler **out);
/* Closes every request; no events follow. */
void k3c_scheduler_free(k3c_scheduler *s);
/* 0: queued (*id set, never 0); 1: refused, the queue is full (a server answers 429; no message set);
 * -1: a bad request (empty prompt, a token outside the vocabulary, n_prompt + max_new past the engine's
 * max_context, bad sampling, priority under FCFS...): K3C_ERROR_INPUT with a message (400). */
int k3c_scheduler_submit(k3c_scheduler *s, const k3c_sched_request *q, uint64_t *id);
/* Aborts a waiting or running request: its blocks and slot are freed at the next step boundary and a
 * FINISHED event with K3C_FINISH_ABORT follows. Unknown or finished ids: a no-op (0). */
int k3c_scheduler_abort(k3c_scheduler *s, uint64_t id);
/* Runs one engine step (admitting, preempting, prefilling chunks, decoding, verifying) if there is work,
 * after applying the aborts and submits that came since the last one. *events / *n_events: what happened
 * (valid until the next call); *busy = 1 while requests wait or run. A failed step (-1: the engine or
 * memory failed) leaves every request it touched FINISHED with ERROR; the scheduler stays usable. */
int k3c_scheduler_step(k3c_scheduler *s, const k3c_sched_event **events, int *n_events, int *busy);
/* Blocks until a submit or abort arrives or timeout_ms passes (returns at once when there is work). */
void k3c_scheduler_wait(k3c_scheduler *s, int timeout_ms);

#define K3C_SCHED_SPEC_POS 64 /* draft positions counted apart (spec_tokens is at most 63 in k3c serve) */
typedef struct k3c_scheduler_stats {
    int running, waiting;
    long preemptions;
    long prompt_tokens, generation_tokens;         /* prompts of requests that produced a token (as vLLM's
                                                    * counter: cached tokens included), tokens generated */
    long prefill_tokens;                           /* prompt rows computed (recomputes included, hits not) */
    long prefix_queries_tokens, prefix_hits_tokens; /* prompt tokens looked up / found in the prefix cache */
    int blocks_total, blocks_used;                 /* MLA blocks; used = held by a request */
    int blocks_cached;                             /* blocks with a prefix-cache entry (used or not) */
    int kda_slots_total, kda_slots_used;
    long snapshots, snapshot_bytes;                /* KDA snapshots kept now, and their bytes */
    long snapshot_bytes_limit;                     /* the cap in effect (snapshot_bytes, or the default) */
    long snapshot_bytes_each;                      /* one snapshot (0: the model has no KDA layers) */
    int snapshots_max;                             /* how many the cap holds (reserved at creation) */
    int snapshot_interval;                         /* the retention interval in effect */
    int prefix_grid;                               /* tokens: hits and snapshots sit on its multiples */
    int block_size;                                /* tokens of one MLA block */
    int last_step_tokens;                          /* tokens the last engine step ran (0: none ran) */
    long spec_drafts, spec_draft_tokens, spec_accepted_tokens;
    long spec_accepted_by_pos[K3C_SCHED_SPEC_POS]; /* verifies whose draft at position i was accepted */
    long finished_stop, finished_length, finished_abort, finished_error;
    long steps, executor_steps;
    long route_steps[K3C_ROUTES];                  /* the engine's plan of each step (k3c_route_name) */
} k3c_scheduler_stats;
/* A snapshot as of the last step boundary. */
void k3c_scheduler_stats_get(k3c_scheduler *s, k3c_scheduler_stats *out);

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

/* ---- chat: an OpenAI chat request -> prompt ids; a model's output ids -> content, reasoning, tool calls ----
 * The Kimi chat formats rendered natively (no Jinja engine) and their output parsed token by token; docs/TEXT.md
 * describes the formats, what a request may hold and what is refused. A chat template is chosen from a model
 * directory (DIR/chat_template.jinja, else tokenizer_config.json's chat_template, else the family's default) or
 * by name; a template text k3c does not know is refused, never rendered approximately. Thread use: a template
 * is read-only once loaded; a parser belongs to one thread at a time. */
typedef struct k3c_chat_template k3c_chat_template;

/* family: k3c_model_info.family ("Kimi K3" or "Kimi Linear"). model_dir NULL: the family's default format
 * (what a synthesized preset, which ships no template, uses). */
int k3c_chat_template_load(const char *model_dir, const char *family, k3c_chat_template **out);
/* "kimi-k2-instruct", "kimi-k2-thinking", "kimi-k2-thinking-moonshot", "kimi-linear", "kimi-k3"; an unknown
 * name is refused naming the known ones. */
int k3c_chat_template_from_name(const char *name, k3c_chat_template **out);
void k3c_chat_template_free(k3c_chat_template *t);
/* The format's name (as above) and where it came from (a file, or "default for Kimi K3", "by name"); static
 * or owned by t. */
const char *k3c_chat_template_name(const k3c_chat_template *t);
const char *k3c_chat_template_source(const k3c_chat_template *t);

/* Appends the prompt ids of request_json (len bytes; an OpenAI chat completion request body) to out:
 * `messages` (required), `tools`, `add_generation_prompt` (default true: the prompt ends with the assistant's
 * opening), `tool_choice`, `response_format`, and `chat_template_kwargs` {"thinking": false,
 * "thinking_effort": "low"|"high"|"max"} (K3; other keys of the request are ignored). Each rendered piece is
 * tokenized as the format says: K2 family: the rendered text with every special token allowed (what
 * transformers does with the template's output); K3: its markers as their special ids and every text piece
 * on its own with specials off (special-token text in content stays text). No BOS is added (Kimi's templates
 * add none). K3C_ERR (out unchanged) for a request the format cannot express, naming the message and field,
 * or a marker the tokenizer lacks. */
int k3c_chat_encode(const k3c_chat_template *t, const k3c_tokenizer *tok, const char *request_json, size_t len,
                    k3c_tokens *out);
/* The ids that end an assistant turn in this format, as the tokenizer has them: <|im_end|> (K2 family,
 * Kimi Linear) or <|end_of_msg|> (K3), then [EOS] and the tokenizer's eos where they differ. Writes up to cap
 * ids and returns how many there are (more than cap: the first cap written), or -1. */
int k3c_chat_stop_ids(const k3c_chat_template *t, const k3c_tokenizer *tok, int32_t *ids, int cap);

/* The output parser: fed the generated ids one at a time, it separates reasoning from content and parses
 * tool calls as they stream. Structure is recognised by token id only (text that spells a marker is content);
 * malformed output (an unterminated section, arguments that are not a JSON object) becomes content, never an
 * error. */
typedef struct k3c_chat_parser k3c_chat_parser;

typedef enum k3c_chat_event_kind {
    K3C_CHAT_CONTENT = 1, /* text: a content delta */
    K3C_CHAT_REASONING,   /* text: a reasoning delta */
    K3C_CHAT_TOOL_START,  /* index, id, name: a tool call begins */
    K3C_CHAT_TOOL_ARGS,   /* index, text: the next bytes of the call's arguments (JSON object text) */
    K3C_CHAT_TOOL_END,    /* index: the call is complete; its arguments parse as a JSON object */
    K3C_CHAT_TOOL_VOID,   /* index: the started call turned out malformed: drop it (its raw text follows as
                             CONTENT); an index is never reused */
} k3c_chat_event_kind;

typedef struct k3c_chat_event {
    k3c_chat_event_kind kind;
    int index;        /* the tool call's index (0-based); -1 for text */
    const char *text; /* CONTENT / REASONING / TOOL_ARGS: len bytes, valid UTF-8, not NUL-terminated */
    size_t len;
    const char *id;   /* TOOL_START: "functions.NAME:IDX" */
    const char *name; /* TOOL_START */
} k3c_chat_event;

/* request_json (len bytes) may be NULL: the parser must know whether the prompt opened K3's think channel
 * (chat_template_kwargs.thinking, default true); the K2 thinking templates parse <think> blocks always. The
 * template and the tokenizer must outlive the parser. */
int k3c_chat_parser_create(const k3c_chat_template *t, const k3c_tokenizer *tok, const char *request_json,
                           size_t len, k3c_chat_parser **out);
void k3c_chat_parser_free(k3c_chat_parser *p);
/* Feeds one generated id (decoded through a streaming detokenizer inside: text is emitted only as whole
 * UTF-8 characters); *events / *n_events (either may be NULL) receive what it produced, valid until the next
 * call on p. A stop id (k3c_chat_stop_ids) finishes the parse; ids after it are ignored. An id outside the
 * vocabulary is an error. */
int k3c_chat_parser_feed(k3c_chat_parser *p, int32_t id, const k3c_chat_event **events, size_t *n_events);
/* The output ended (a stop id, the length limit): settles what is still open. Idempotent. */
int k3c_chat_parser_finish(k3c_chat_parser *p, const k3c_chat_event **events, size_t *n_events);
/* 1 once a stop id was fed (or finish called), else 0; -1 for NULL. */
int k3c_chat_parser_done(const k3c_chat_parser *p);
/* The assistant message so far as JSON text (malloc'd, NUL-terminated; the caller frees it), OpenAI's
 * shape: {"role": "assistant", "content": "..." (null when empty and there are tool calls),
 * "reasoning_content": "..." (only when there was reasoning), "tool_calls": [{"id": "functions.NAME:IDX",
 * "type": "function", "function": {"name": "NAME", "arguments": "{...}"}}] (only when there are calls)}. */
int k3c_chat_parser_result_json(k3c_chat_parser *p, char **json);

/* ---- constrained decoding: a grammar the scheduler holds a request's output to ----
 * The scheduler (k3c_sched_request.grammar) takes only tokens the grammar admits: for each generated token
 * it checks candidates against the grammar's byte-level automaton (the best logits first for greedy; the
 * whole vocabulary masked before sampling) and, with max_new - generated tokens left, only tokens after
 * which the shortest completion still fits, so an output that reaches max_new has completed its grammar
 * (where max_new allows the grammar's shortest output, k3c_grammar_min_tokens; where it does not, the
 * grammar alone applies and the output is cut). A grammar is read-only once built and may serve several
 * requests at once; it must outlive them (until their FINISHED events). docs/SERVING.md says what is
 * enforced. */
typedef struct k3c_grammar_vocab k3c_grammar_vocab;

/* The tokenizer's tokens as grammars read them (their bytes, which are special, sorted for the mask's walk):
 * built once per tokenizer, independent of it afterwards. */
int k3c_grammar_vocab_create(const k3c_tokenizer *tok, k3c_grammar_vocab **out);
void k3c_grammar_vocab_free(k3c_grammar_vocab *v);
/* One JSON object of the JSON Schema schema_json (len bytes; NULL: any object), then one of end_ids (1 .. 8
 * ids). strict 1: a keyword k3c cannot enforce is refused (K3C_ERROR_INPUT naming its path); 0: it is not
 * enforced. */
int k3c_grammar_json_create(const k3c_grammar_vocab *v, const char *schema_json, size_t len, int strict,
                            const int32_t *end_ids, int n_end, k3c_grammar **out);
/* What a chat request's tool_choice or response_format asks for (*out NULL when neither constrains it:
 * tool_choice none / auto and response_format text or absent): tool_choice "required" forces the format's
 * tool-call section with calls of the named tools only, a named function one call of it; the arguments are
 * a JSON object of the tool's parameters (lenient: what k3c cannot enforce is not enforced).
 * response_format json_object / json_schema makes the content one JSON object (json_schema strict: a keyword
 * k3c cannot enforce is refused, naming it). A reasoning section, where the format opens one, stays free
 * text up to its close. The template and tokenizer are those the prompt was rendered with (with
 * add_generation_prompt: a request without it is refused). */
int k3c_chat_grammar_create(const k3c_chat_template *t, const k3c_tokenizer *tok, const k3c_grammar_vocab *v,
                            const char *request_json, size_t len, k3c_grammar **out);
void k3c_grammar_free(k3c_grammar *g);
/* Tokens the grammar's shortest output takes at most (one per byte and per special token). */
int k3c_grammar_min_tokens(const k3c_grammar *g);

#ifdef __cplusplus
}
#endif
#endif
