/* The specialized decode executor on the CUDA backend (this file states what is built
 * so far and what is not).
 *
 * Built once after load over an engine with device "cuda", which it only reads: the weights stay in the
 * backend's arena (read in place, never copied or written), the MLA cache and KDA slots are the engine's.
 * build() does every allocation (activation and scratch buffers for PREPARED_MAX = 64 rows, cuBLASLt
 * workspace, pinned metadata and logits staging) and resolves every weight's device address; a step
 * allocates nothing. prepare_kv() binds the engine's caches (block size, max blocks per request, element
 * size) and from then on each prepared shape (rows, q) (decode/prepared.h) is captured as one CUDA graph,
 * eagerly in prepare_kv or when capture is called (the engine's policy: the second time the planner meets
 * a shape; the first runs stock and warms the kernels up). A replay changes only the contents of fixed device buffers: token
 * ids, cache slots, attention lengths, block tables padded to max blocks per request, KDA segment
 * descriptors (state / window pointers of each request's slot) and the verify save descriptors.
 *
 * What a captured step computes: the stock forward's layer loop with the same kernels and reductions as
 * the CUDA backend's ops (cuda/backend_cuda.c), so its outputs are bitwise those of the stock path, with
 * these providers (one per layer part, each bitwise the stock ops) in place of the per-op launches:
 *  - packed projections: the products of one input as one grouped launch (cuda/gemm.h k3c_cuda_gemv_group,
 *    the weights read where they were loaded): KDA's q, k, v, gate and beta projections, then its two
 *    low-rank up-projections; MLA's query (or its low-rank half), latent and output gate; the dense MLP's
 *    gate and up;
 *  - KDA: conv x3, gate, q/k norm, delta rule and gated norm as the one fused KDA decode kernel
 *    (k3c_cuda_kda_decode_fused) up to a few blocks per SM, the same launches as stock past it
 *    (k3c_cuda_kda_decode_fused_prefer: measured faster there);
 *  - the MoE as a front (router logits, latent down, shared gate and up: one grouped launch; routing; the
 *    shared activation), the persistent routed experts (one launch for all selected experts of the step),
 *    and a tail (latent norm, then latent up and shared down as one grouped launch, then their sum).
 * The aux hidden-state streams (k3c_engine_options.aux_layers, read at build) are device copies of the
 * prefix entering each tapped layer, recorded in the graphs at the stock forward's tap points, and land in
 * the engine's aux buffer (k3c_engine_aux) after each replayed step.
 * Verify steps run on scratch copies of the committed KDA state and save the fold inputs in the engine's
 * k3c_kda_slots store, so k3c_request_commit folds them exactly as after a stock verify.
 * The wide route (the seed's run_wide; decode/plan.h K3C_ROUTE_WIDE): a uniform verify step whose row count
 * is not a prepared batch (past 64, or 65 .. between the batches), up to wide_max = min(the engine's
 * max_rows, K3C_WIDE_MAX) rows, runs the engine's stock forward (k3c_decode_env.fwd) with the KDA and MLA
 * attention providers in place of its attention (stock/forward.h k3c_forward_step_attn): every layer's
 * attention from the normed input to o_proj's output by the provider, on the stock forward's own x and A,
 * everything else (embedding, AttnRes, norms, the dense MLP, the MoE, the final norm, the LM head, aux
 * streams) the stock ops. Launched eagerly on the backend's stream (no graph: the stock parts are not
 * capturable in general, and one graph per row count past 64 would be many), the step's metadata filled and
 * uploaded once before its first layer. The attention buffers and the metadata hold max(64, wide_max) rows;
 * the providers' launches are those of a captured step at that T, which equal the stock ops row for row (the
 * same kernels, the same products at the same T), so a wide step is bitwise the stock one. At TP1 and on a
 * hybrid rank (below); on a plain TP rank wide_max is 0 (wide steps plan stock, K3C_STOCK_UNPREPARED_ROWS).
 * DEP (k3c_decode_env.ep, the seed's build_dep): built for a DP rank whose MoE is expert-parallel (TP1
 * attention on its own requests, the model its expert shard, env.fwd its stock DEP forward): no fully
 * specialized step, no graphs, no feed-forward providers; every decode or uniform verify step up to wide_max
 * rows takes the wide route (plan table wide_decode), its MoE the stock forward's EP exchange (moe_route,
 * the all-to-alls, moe_experts, moe_combine), so the step's collectives are the stock DEP step's whichever
 * route each rank takes (decode/plan.h); n = 0 through step is the stock dummy step. Prompt rows, mixed
 * steps and an idle rank's dummy step plan stock and the engine runs them on the same forward.
 * The hybrid (the seed's HybridStep: TP-G attention groups inside DEP, EP MoE over every rank) is DEP with
 * world_size = G > 1 and env.tp the DP group's mailbox: the TP-prepared attention providers (their o_proj
 * sums over the mailbox, as in a captured TP step) in the stock layer loop, every other collective the stock
 * forward's over its own groups, so a wide step is bitwise the stock hybrid step; the DP group's TP ranks
 * plan every step alike (the same requests), and the mailbox holds wide_max rows of the hidden size.
 * NOT built yet: the next layer's AttnRes fused into the MoE tail (the tail's sum and the residual add are
 * still their own launches before the AttnRes mix); the seed's wide MoE (moe.wide: the routed experts of a
 * wide step as the persistent launch; a wide step's MoE is the stock one); the wide route on a plain TP rank.
 * (The engine builds a DEP rank's executor for a DP + EP layout with one stage on device cuda, at tp 1 or, the
 * hybrid, over the DP group's TP mailbox, and runs each rank's own part of a step on it when that part plans
 * wide: runtime/engine.c k3c_engine_dp_part.)
 * process_weights_after_loading has no derived copies to rebuild (no packed copies exist: the grouped launches read the loaded weights in place); it
 * re-resolves the weight addresses and checks they did not move, which keeps captured graphs valid.
 * Tensor parallelism: built for a TP rank (world_size > 1, the model that rank's shard) over the CUDA mailbox
 * (k3c_decode_env.tp, comm/mailbox_cuda.h: the one communicator its graphs can capture), the providers run on
 * the rank's shard (the shard's widths: KDA and MLA heads, the experts' and the dense MLP's intermediate
 * dimension, the vocabulary part; the latent and low-rank projections and the router replicated) and the step
 * makes the stock TP forward's collectives (stock/forward.c), in its order, as mailbox launches on the
 * executor's stream inside the graphs: the vocabulary-parallel embedding's sum (unrounded), the all-reduce of
 * every row-parallel product (attention's o_proj, the dense MLP's down: this rank's part unrounded, the sum
 * rounded), the MoE's two sums (the routed experts' f32 partial sum [T, Rin] before the latent norm and
 * up-projection, the shared expert's f32 down product [T, D] after them: stock's moe_tp), and the LM head's
 * gather, laid into the [T, V] logits. Same kernels, same partials, the same rank-order f32 sums over the same
 * communicator, so a step is bitwise the stock TP forward's on that rank, and every rank ends with the same
 * bits. The plan table then has tp_prepared = 1 on every rank (world_size and the communicator's kind are the
 * same on every rank); capture is a collective property (every rank must capture the same shapes, as the
 * engine's policy does given the same steps). A failed step (a mailbox kernel that gave up on a peer after
 * its timeout included) aborts the group. Over any other communicator (none, the staged one whose host wait
 * cannot be captured, NCCL) the executor holds no providers and its plan table says so (tp_prepared = 0):
 * every step plans stock on every rank, reason K3C_STOCK_TP_UNPREPARED; capture refuses.
 * Fused at TP, each bitwise the unfused sequence (comm/mailbox.h: the pushed one-shot and why it is safe):
 * a row-parallel product that is a streaming GEMV (T <= 8, aligned) and whose sum is a one-shot writes its
 * unrounded part from its epilogue straight into every peer's mailbox slot (the parity from the device's
 * epoch), and the mailbox's finish publishes the flags, waits, sums in rank order and rounds (decode/launch.c
 * k3c_exec_mm_rowpar: MLA's and KDA's o_proj, the dense MLP's down); the MoE tail's routed sum, its rounding
 * and the latent norm are one mailbox launch (k3c_exec_tp_sum_rmsnorm: the backend rmsnorm's reduction order
 * reproduced); every other rounded one-shot sum (the shared expert's) rounds in its own launch. Larger T
 * (cuBLASLt) and two-shot sizes keep the unfused launches. k3c_decode_cuda_tp_fusions counts what was fused.
 * Not built at TP: the single reduction of routed + shared a MoE layer of the layouts note (it would round
 * differently from the stock TP forward, which reduces the two apart). */
#ifndef K3C_DECODE_EXECUTOR_CUDA_H
#define K3C_DECODE_EXECUTOR_CUDA_H

#include <stdio.h>

#include "decode/executor.h"
#include "k3c.h"

typedef struct k3c_decode_cuda k3c_decode_cuda;

/* Builds the executor over an engine's model, backend (device "cuda") and caches (decode/executor.h
 * k3c_decode_env; the engine calls this at creation when its options ask for the executor); before
 * prepare_kv every step plans stock. */
int k3c_decode_cuda_build(const k3c_decode_env *env, int rank, int world_size, k3c_decode_cuda **out);
/* Binds the engine's caches; eager = 1 captures every prepared shape now (else on capture, see above). */
int k3c_decode_cuda_prepare_kv(k3c_decode_cuda *x, int eager);
/* Captures one prepared shape now (prepare_kv must have run); a no-op when it exists. */
int k3c_decode_cuda_capture(k3c_decode_cuda *x, int rows, int q);
/* After new weights were written into the same device storage: re-derives what the executor derived from
 * them (in place, same addresses), so captured graphs replay the new weights. */
int k3c_decode_cuda_process_weights_after_loading(k3c_decode_cuda *x);
/* The interface the engine calls (decode/executor.h); valid while x lives. */
const k3c_decode_executor *k3c_decode_cuda_executor(k3c_decode_cuda *x);
/* Shapes captured so far, and how many steps were replayed. */
int k3c_decode_cuda_num_captured(const k3c_decode_cuda *x);
void k3c_decode_cuda_counts(const k3c_decode_cuda *x, long *replays);
/* Under TP: the fused launches recorded so far (every capture and profiled step records the step again):
 * rowpar, row-parallel products whose epilogue pushed into the peers' mailbox slots (launch.c
 * k3c_exec_mm_rowpar); norm, MoE tails' all-reduce + round + latent norm as one mailbox launch; round, other
 * rounded sums made by the one-shot's own launch (the shared expert's). NULL: not wanted. */
void k3c_decode_cuda_tp_fusions(const k3c_decode_cuda *x, long *rowpar, long *norm, long *round);
/* Wide steps run so far (the wide route, above). */
long k3c_decode_cuda_wide_steps(const k3c_decode_cuda *x);
void k3c_decode_cuda_free(k3c_decode_cuda *x);

/* Op profile of the specialized path (a diagnostic; K3C_CUDA_PROFILE=1 when the executor is built, as for
 * the stock path's cuda/op_profile.h): profile_next makes the next replayable step run its recorded launches
 * eagerly instead of replaying the graph (the same launches and arguments, so the same outputs; without the
 * graph the launch gaps are larger, so read the shares), each timed with events; profile returns the totals
 * (NULL without K3C_CUDA_PROFILE). With K3C_CUDA_PROFILE=2 the next step is instead captured again with a
 * time stamp after every op and that graph replayed (the same launches, PDL included, plus the stamps),
 * each op charged the time between its stamp and the one before. */
struct k3c_op_profile;
void k3c_decode_cuda_profile_next(k3c_decode_cuda *x);
struct k3c_op_profile *k3c_decode_cuda_profile(k3c_decode_cuda *x);
/* With K3C_CUDA_PROFILE, host wall time (ms) of the run calls since the last profile_next: [0] step begin,
 * metadata fill and upload issue; [1] waiting for the step and the logits download into the caller's buffer. */
void k3c_decode_cuda_host_profile(const k3c_decode_cuda *x, double ms[2]);
/* With K3C_CUDA_PROFILE=3 (block stamps, cuda/stamp.h) the next profiled step replays its own graph with the
 * stamped kernels writing block stamps (and every replay is timed with two events); this writes the report
 * of the last such step (decode/stamp_report.h: per op, op name, kernel class, the step, expert coverage),
 * plain_ms the same shape's plain step time to compare with (0: unknown). K3C_ERR without a stamped step. */
int k3c_decode_cuda_stamp_report(k3c_decode_cuda *x, FILE *f, double plain_ms);

#endif
