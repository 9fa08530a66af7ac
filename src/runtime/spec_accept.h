/* Speculative acceptance for a drafter whose proposal is a point mass (the prompt-lookup drafter,
 * runtime/drafter.h): the verify of [t0, d1..dD] gives rows r0..rD, row j the target distribution p_j of
 * the token after t0 d1..dj (runtime/sampler.h's processing, penalties counting the tokens accepted before
 * it). Rejection sampling (Leviathan et al. / Chen et al.) with q_j = the point mass at d_{j+1}: accept
 * d_{j+1} with probability min(1, p_j(d) / q_j(d)) = p_j(d); on rejection draw from norm(max(p_j - q_j, 0)),
 * which is p_j with d_{j+1} removed and renormalized; when every draft is accepted the bonus token is a draw
 * from p_D. Every emitted token is then distributed exactly as sampling p one token at a time. A greedy
 * request's p_j is the point mass at its argmax: acceptance is the comparison and no draw is made. */
#ifndef K3C_RUNTIME_SPEC_ACCEPT_H
#define K3C_RUNTIME_SPEC_ACCEPT_H

#include <stdint.h>

#include "k3c.h"

/* rows: [D + 1, vocab] logits; drafts [D]. Writes the emitted tokens to out ([D + 1]) and returns their
 * count, 1 .. D + 1 (accepted drafts = count - 1, or D when count = D + 1); each is observed by s. */
int k3c_spec_accept(k3c_sampler *s, const float *rows, int vocab, const int32_t *drafts, int D, int32_t *out);

/* The same with row j passed through filter->row(user, j, row) before its distribution is taken (the
 * constrained decoding's mask, runtime/constrained.h; NULL: failure) and each emitted token handed to
 * filter->took(user, token) after it is observed (nonzero: failure). Returns the count, or -1. */
typedef struct k3c_spec_filter {
    const float *(*row)(void *user, int j, const float *row);
    int (*took)(void *user, int32_t token);
    void *user;
} k3c_spec_filter;
int k3c_spec_accept_filtered(k3c_sampler *s, const float *rows, int vocab, const int32_t *drafts, int D,
                             int32_t *out, const k3c_spec_filter *filter);

#endif
