/* Independent float64 reference forward of the whole model (Kimi K3 and Kimi Linear), written from
 * the published architecture (KDA, MLA, AttnRes, MoE, config) alone. It shares no math with the engine (nothing from
 * src/cpu, src/stock, src/runtime): the format layer is used only to read tensors and config.json.
 *
 * Everything is computed in double, with no bf16 rounding of activations anywhere: it is the exact
 * function the bf16-stored weights define, the oracle the engine is compared against.
 *  - KDA in the recurrent form (§2.2), token by token, state in double;
 *  - MLA in the expanded form (§3.2): c decompressed through kv_b_proj to per-head k_nope and v, shared k_pe
 *    appended, causal softmax;
 *  - K3: block AttnRes as the explicit list of completed blocks plus the partial prefix P (§4.3);
 *    Kimi Linear: the plain pre-norm residual (§10);
 *  - router per §5.3 (sigmoid or softmax scores, optional correction bias, general grouped top-k, renormalisation,
 *    routed_scaling_factor after it); top-k ties go to the lower expert (and group) id;
 *  - latent MoE with its RMSNorm (§5.4) or full-width experts (Kimi Linear); MXFP4 experts dequantized;
 *  - SiTU or SiLU per config; final norm; lm_head (or the embedding when tied / lm_head is absent).
 * Weights of any float dtype (BF16, F16, F32, F64) are read into double on the fly from the mapped file.
 *
 * Cost: one pass over the whole sequence, every layer on all n tokens: O(n * parameters) multiply-adds
 * plus O(n^2) for MLA attention; no caches. The logits of row i depend only on ids[0..i] (the model is
 * causal), so row i equals the logits of the prefix of length i+1. Meant for test models and n <= 64
 * (the tiny preset at n = 24 runs in well under a second); it is not a fast path.
 *
 * The forward only reads the model (scratch is allocated per call), so concurrent calls on one model are safe.
 *
 * Found while validating against transformers (tests/test_reference.c): transformers 5.17's Kimi Linear gates the
 * KDA output norm with sigmoid(gate), as K3 does (its logits match to 2.5e-6 with sigmoid, 1.3 rel L2 with silu). */
#ifndef K3C_TESTS_REF_FORWARD_H
#define K3C_TESTS_REF_FORWARD_H

#include "model/config.h"

typedef struct ref_model ref_model;

/* Opens DIR/config.json and the checkpoint in DIR and binds every tensor the forward needs (names, shapes
 * and dtypes checked). K3C_OK, or K3C_ERR with a message naming the tensor and what was wrong. */
int ref_model_open(const char *dir, ref_model **out);
void ref_model_free(ref_model *m);
/* The parsed config (owned by the model). */
const k3c_config *ref_model_config(const ref_model *m);

/* logits[i * vocab + v] for i in 0..n-1: logits after the causal prefix ids[0..i]. n >= 1; every id must
 * be in [0, vocab). */
int ref_logits(ref_model *m, const int *ids, int n, double *logits);

/* Aux hidden-state taps (spec §6): for each j, out[(j * n + i) * D + d] is, at token i, the value after
 * layer layers[j] (0-based) has added its FFN output: with AttnRes the block-partial prefix P, without it
 * the residual stream h. layers[j] = -1 taps the embedding. Layers may repeat and come in any order. */
int ref_hidden(ref_model *m, const int *ids, int n, const int *layers, int num_layers, double *out);

/* Both in one pass; logits and/or out may be NULL (then num_layers must be 0 when out is NULL). */
int ref_forward(ref_model *m, const int *ids, int n, double *logits, const int *layers, int num_layers,
                double *out);

/* Counts router selections: counts[l * num_experts + e] += 1 each time expert e of layer l is chosen by a
 * later forward (NULL stops counting). The array belongs to the caller. */
void ref_count_routes(ref_model *m, long *counts);

/* Rounds every MLA latent value a cache would hold (c_normed and k_pe, per token and layer) through fn
 * before any use, as a cache in that format does (NULL: exact). */
void ref_set_latent_round(ref_model *m, double (*fn)(double));

/* ---- building blocks, exposed for hand-checkable tests ---- */

/* AttnRes Mix (§4.2) for one token: sources[0..num_sources-1] (oldest block first, partial prefix last),
 * pseudo-query w and norm weight n of length dim; out = sum_j softmax_j(s)_j * sources[j], with
 * s_j = rsqrt(mean(v_j^2) + eps) * sum_d v_j[d] n[d] w[d]. With one source, out equals it exactly. */
void ref_attnres_mix(const double *const *sources, int num_sources, const double *w, const double *n, int dim,
                     double eps, double *out);

/* Router (§5.3) for one token: from the router logits [E], writes idx[k] (selected experts, in selection
 * order: descending score+bias, ties to the lower id) and weight[k]. bias may be NULL. */
void ref_route(const k3c_config *c, const double *logits, const double *bias, int *idx, double *weight);

#endif
