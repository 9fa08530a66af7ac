/* The specialized decode executor on the CUDA backend (decode-executor.md; this file states what is built
 * so far and what is not).
 *
 * Built once after load over an engine with device "cuda", which it only reads: the weights stay in the
 * backend's arena (read in place, never copied or written), the MLA cache and KDA slots are the engine's.
 * build() does every allocation (activation and scratch buffers for PREPARED_MAX = 64 rows, cuBLASLt
 * workspace, pinned metadata and logits staging) and resolves every weight's device address; a step
 * allocates nothing. prepare_kv() binds the engine's caches (block size, max blocks per request, element
 * size) and from then on each prepared shape (rows, q) (decode/prepared.h) is captured as one CUDA graph,
 * eagerly in prepare_kv or lazily (a shape is captured the second time the planner asks for it; the first
 * runs stock and warms the kernels up). A replay changes only the contents of fixed device buffers: token
 * ids, cache slots, attention lengths, block tables padded to max blocks per request, KDA segment
 * descriptors (state / window pointers of each request's slot) and the verify save descriptors.
 *
 * What a captured step computes: the stock forward's layer loop with the same launchers and arguments as
 * the CUDA backend's ops (cuda/backend_cuda.c), except that a KDA layer's conv x3, gate, q/k norm, delta rule
 * and gated norm run as the one fused KDA decode kernel (k3c_cuda_kda_decode_fused, the same per-element
 * math), so its outputs are bitwise those of the stock path; verify steps run on scratch copies of the
 * committed KDA state and save the fold inputs in the engine's k3c_kda_slots store, so k3c_request_commit
 * folds them exactly as after a stock verify.
 * NOT built yet (decode-executor.md §3): the other fused providers (packed KDA / MLA projections, the MoE
 * front / experts / tail split with the fused next AttnRes); the gain so far is the removal of host work and
 * launch gaps by graph replay, and 6 launches fewer per KDA layer. Wide verify steps (rows past 64, q > 1) run the
 * plain stock forward. process_weights_after_loading has no derived copies to rebuild yet (it re-resolves
 * the weight addresses and checks they did not move, which keeps captured graphs valid).
 * Tensor parallelism: everything is built for (rank, world_size) = (0, 1). */
#ifndef K3C_DECODE_EXECUTOR_CUDA_H
#define K3C_DECODE_EXECUTOR_CUDA_H

#include "decode/executor.h"
#include "k3c.h"

typedef struct k3c_decode_cuda k3c_decode_cuda;

/* Builds the executor over e (device "cuda"); before prepare_kv every step plans stock. */
int k3c_decode_cuda_build(k3c_engine *e, int rank, int world_size, k3c_decode_cuda **out);
/* Binds the engine's caches; eager = 1 captures every prepared shape now (else lazily, see above). */
int k3c_decode_cuda_prepare_kv(k3c_decode_cuda *x, int eager);
/* Captures one prepared shape now (prepare_kv must have run); a no-op when it exists. */
int k3c_decode_cuda_capture(k3c_decode_cuda *x, int rows, int q);
/* After new weights were written into the same device storage: re-derives what the executor derived from
 * them (in place, same addresses), so captured graphs replay the new weights. */
int k3c_decode_cuda_process_weights_after_loading(k3c_decode_cuda *x);
/* The interface the runner calls (k3c_runner_set_executor); valid while x lives. */
const k3c_decode_executor *k3c_decode_cuda_executor(k3c_decode_cuda *x);
/* Shapes captured so far, and how many steps were replayed / ran stock through run (wide steps). */
int k3c_decode_cuda_num_captured(const k3c_decode_cuda *x);
void k3c_decode_cuda_counts(const k3c_decode_cuda *x, long *replays, long *wide_stock);
void k3c_decode_cuda_free(k3c_decode_cuda *x);

#endif
