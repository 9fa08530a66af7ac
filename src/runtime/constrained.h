/* The scheduler's logits constraint: a constrained request's next token is the one its sampler picks among
 * the tokens its grammar admits (constrain/grammar.h), with the budget of the tokens it has left.
 *
 * Greedy (no penalties): the best logits are checked first, in the order k3c_greedy_token ranks them (the
 * first largest value, NaN below every number, ties to the lower id), and the first the grammar admits is
 * taken; only when none of the best K3C_CONSTRAINED_TOP is admitted is the whole vocabulary masked. Sampling
 * takes the distribution the sampler would sample the row with the refused logits at -inf (penalties,
 * temperature, then top-k, top-p, min-p over the admitted tokens): the model's renormalized over the admitted
 * tokens. Without top-k, top-p and min-p it first draws from the whole row and keeps an admitted draw (the
 * same distribution, constrained.c), so the vocabulary is masked only after a refused draw. Both only read the request's own logits row and grammar state:
 * a constrained request's tokens do not depend on its batch neighbours.
 *
 * Where the budget leaves no admissible token (max_new below the grammar's shortest output) the grammar
 * alone decides; a grammar that admits nothing is an error (K3C_ERROR_INTERNAL). */
#ifndef K3C_RUNTIME_CONSTRAINED_H
#define K3C_RUNTIME_CONSTRAINED_H

#include <stdint.h>

#include "constrain/grammar.h"
#include "k3c.h"

#define K3C_CONSTRAINED_TOP 16

/* Scratch of one thread, sized for vocab ids. */
typedef struct k3c_constrained_scratch {
    float *row;    /* [vocab] the masked row */
    uint8_t *mask; /* [vocab] */
    int vocab;
} k3c_constrained_scratch;

int k3c_constrained_scratch_init(k3c_constrained_scratch *w, int vocab);
void k3c_constrained_scratch_release(k3c_constrained_scratch *w);

/* The next token from row ([vocab] logits) with `remaining` tokens left (it included); the matcher takes it.
 * Not observed by the sampler (the caller does, as for k3c_sampler_next). */
int k3c_constrained_next(k3c_sampler *s, k3c_gmatch *m, const float *row, int remaining,
                         k3c_constrained_scratch *w, int32_t *tok);

/* A verify's acceptance under the constraint (runtime/spec_accept.h's, row j's target being the constrained
 * distribution after the tokens accepted before it): drafts are taken while they equal the constrained
 * choice (greedy) or pass the rejection test against the masked distribution (sampled). Writes the emitted
 * tokens to out and their count to *n; each is taken by the matcher and observed by s. */
int k3c_constrained_accept(k3c_sampler *s, k3c_gmatch *m, const float *rows, const int32_t *drafts, int D,
                           int remaining, k3c_constrained_scratch *w, int32_t *out, int *n);

#endif
