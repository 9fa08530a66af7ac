/* The sampler's serving extensions (include/k3c.h has the plain sampler): min-p, presence / frequency /
 * repetition penalties over a request's tokens, the distribution a row samples from (for speculative
 * acceptance, runtime/spec_accept.h) and logprobs.
 *
 * Order of the processing, per row: penalties on the raw logits (repetition as CTRL / vLLM: a logit of a
 * token of the prompt or the output is divided by the penalty when positive, multiplied when not; then
 * OpenAI's frequency and presence: minus count x frequency, minus presence once the token was generated),
 * then temperature, top-k, top-p, min-p (drop candidates whose probability is under min_p x the top one),
 * as transformers orders its warpers. Greedy (temperature <= 0) takes the argmax of the penalized logits.
 * A sampler without penalties or min-p samples exactly as k3c_sampler_sample (the same generator draws). */
#ifndef K3C_RUNTIME_SAMPLER_H
#define K3C_RUNTIME_SAMPLER_H

#include <stdint.h>

#include "k3c.h"

typedef struct k3c_sampler_ext {
    float min_p;              /* 0 = off */
    float presence, frequency; /* 0 = off */
    float repetition;         /* 1 (or 0) = off */
} k3c_sampler_ext;

/* x NULL: none (k3c_sampler_create). Checks the values (finite; min_p in [0, 1]; repetition > 0). */
int k3c_sampler_create_ext(const k3c_sampling *s, const k3c_sampler_ext *x, int vocab, k3c_sampler **out);
/* 1 when the row's token is its greedy argmax of the raw logits (greedy and no penalties). */
int k3c_sampler_plain_greedy(const k3c_sampler *s);
int k3c_sampler_greedy(const k3c_sampler *s);
/* 1 when the row's distribution is cut before sampling (top-k, top-p or min-p on): a constraint's mask must
 * then come first (runtime/constrained.h). */
int k3c_sampler_truncates(const k3c_sampler *s);
/* The repetition penalty's prompt tokens (call once, before the first row). */
int k3c_sampler_set_prompt(k3c_sampler *s, const int32_t *ids, int n);
/* A token the request emitted (counted by the penalties). */
void k3c_sampler_observe(k3c_sampler *s, int32_t token);
/* Samples a row with every extension (the generator draws once unless greedy); observes nothing. */
int32_t k3c_sampler_next(k3c_sampler *s, const float *logits);
/* The distribution of a row after the processing above: *ids / *p the candidates in rank order (greedy: the
 * argmax with p = 1), p summing to 1; returns their count. Valid until the next call on s. */
int k3c_sampler_dist(k3c_sampler *s, const float *logits, const int **ids, const float **p);
/* A uniform draw in [0, 1) from the request's generator. */
double k3c_sampler_uniform(k3c_sampler *s);
/* One draw from candidates (ids, p) of a k3c_sampler_dist; skip >= 0: that id is left out and the rest
 * renormalized (the residual of a rejected point-mass draft). */
int32_t k3c_sampler_draw(k3c_sampler *s, const int *ids, const float *p, int n, int32_t skip);
/* logprobs of the model's distribution (log-softmax of the raw logits, no penalty or temperature, as vLLM's
 * default): *lp of token tok, and the n_top best ids with theirs (best first, ties to the lower id). Uses
 * the sampler's scratch (invalidates a k3c_sampler_dist). */
void k3c_sampler_logprobs(k3c_sampler *s, const float *logits, int32_t tok, int n_top, int32_t *top_ids,
                          float *top_lp, float *lp);

#endif
