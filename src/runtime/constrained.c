/* Constrained token choice (runtime/constrained.h). */
#include "runtime/constrained.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/sampler.h"
#include "runtime/spec_accept.h"
#include "util/error.h"

int k3c_constrained_scratch_init(k3c_constrained_scratch *w, int vocab) {
    memset(w, 0, sizeof *w);
    w->row = malloc(sizeof *w->row * (size_t)vocab);
    w->mask = malloc((size_t)vocab);
    w->vocab = vocab;
    if (!w->row || !w->mask) {
        k3c_constrained_scratch_release(w);
        return k3c_errorf_kind(K3C_ERROR_OOM, "constrained decoding: out of memory (vocab %d)", vocab);
    }
    return K3C_OK;
}

void k3c_constrained_scratch_release(k3c_constrained_scratch *w) {
    free(w->row);
    free(w->mask);
    memset(w, 0, sizeof *w);
}

/* k3c_greedy_token's order: a before b when larger, NaN below every number, ties to the lower id. */
static int before(float a, int ia, float b, int ib) {
    if (isnan(a)) return isnan(b) && ia < ib;
    if (isnan(b)) return 1;
    return a != b ? a > b : ia < ib;
}

/* The whole vocabulary's mask, the budget dropped where it leaves nothing. */
static int full_mask(k3c_gmatch *m, int remaining, k3c_constrained_scratch *w) {
    int n = k3c_gmatch_mask(m, remaining, w->mask, w->vocab);
    if (n == 0 && remaining > 0) n = k3c_gmatch_mask(m, 0, w->mask, w->vocab);
    if (n == 0)
        return k3c_errorf_kind(K3C_ERROR_INTERNAL, "constrained decoding: the grammar admits no token of the "
                                                   "vocabulary here");
    return K3C_OK;
}

/* The greedy choice: the first admitted token in k3c_greedy_token's order. */
static int greedy(k3c_gmatch *m, const float *row, int remaining, k3c_constrained_scratch *w, int32_t *tok) {
    int V = w->vocab, top[K3C_CONSTRAINED_TOP], k = 0;
    for (int i = 0; i < V; i++) {
        if (k == K3C_CONSTRAINED_TOP && !before(row[i], i, row[top[k - 1]], top[k - 1])) continue;
        int at = k < K3C_CONSTRAINED_TOP ? k++ : k - 1;
        while (at > 0 && before(row[i], i, row[top[at - 1]], top[at - 1])) {
            top[at] = top[at - 1];
            at--;
        }
        top[at] = i;
    }
    for (int j = 0; j < k; j++)
        if (k3c_gmatch_admits(m, top[j], remaining)) {
            *tok = top[j];
            return K3C_OK;
        }
    K3C_TRY(full_mask(m, remaining, w));
    int best = -1;
    for (int i = 0; i < V; i++)
        if (w->mask[i] && (best < 0 || before(row[i], i, row[best], best))) best = i;
    *tok = best;
    return K3C_OK;
}

static int all_finite(const float *row, int n) {
    for (int i = 0; i < n; i++)
        if (!isfinite(row[i])) return 0;
    return 1;
}

/* The row with refused tokens at -inf (and NaN / inf of admitted ones finite, so that no refused token can
 * win against them in the sampler's arithmetic). */
static const float *masked_row(const float *row, const k3c_constrained_scratch *w) {
    for (int i = 0; i < w->vocab; i++) {
        float x = row[i];
        if (!w->mask[i]) x = -INFINITY;
        else if (isnan(x) || x == -INFINITY) x = -FLT_MAX;
        else if (x == INFINITY) x = FLT_MAX;
        w->row[i] = x;
    }
    return w->row;
}

int k3c_constrained_next(k3c_sampler *s, k3c_gmatch *m, const float *row, int remaining,
                         k3c_constrained_scratch *w, int32_t *tok) {
    int32_t t;
    if (k3c_sampler_plain_greedy(s)) {
        K3C_TRY(greedy(m, row, remaining, w, &t));
    } else if (!k3c_sampler_greedy(s) && !k3c_sampler_truncates(s) && all_finite(row, w->vocab) &&
               k3c_gmatch_admits(m, t = k3c_sampler_next(s, row), remaining)) {
        /* a draw from the whole distribution p that the grammar admits is taken: with the draw from p
         * restricted to the admitted set A that a refused one leads to, token x in A comes out with probability
         * p(x) + (1 - p(A)) p(x) / p(A) = p(x) / p(A), the masked distribution's, so the mask is walked only
         * when a draw is refused. Not with top-k / top-p / min-p, which would cut p before the mask. */
    } else {
        K3C_TRY(full_mask(m, remaining, w));
        t = k3c_sampler_next(s, masked_row(row, w));
        if (t < 0 || t >= w->vocab || !w->mask[t])
            return k3c_errorf_kind(K3C_ERROR_INTERNAL, "constrained decoding: the sampler took refused token %d", t);
    }
    K3C_TRY(k3c_gmatch_advance(m, t));
    *tok = t;
    return K3C_OK;
}

typedef struct accept_ctx {
    k3c_gmatch *m;
    k3c_constrained_scratch *w;
    int remaining;
} accept_ctx;

static const float *filter_row(void *user, int j, const float *row) {
    accept_ctx *c = user;
    if (full_mask(c->m, c->remaining - j, c->w) != K3C_OK) return NULL;
    return masked_row(row, c->w);
}

static int filter_took(void *user, int32_t tok) {
    accept_ctx *c = user;
    if (tok < 0 || tok >= c->w->vocab || !c->w->mask[tok])
        return k3c_errorf_kind(K3C_ERROR_INTERNAL, "constrained decoding: acceptance took refused token %d", tok);
    return k3c_gmatch_advance(c->m, tok);
}

int k3c_constrained_accept(k3c_sampler *s, k3c_gmatch *m, const float *rows, const int32_t *drafts, int D,
                           int remaining, k3c_constrained_scratch *w, int32_t *out, int *n) {
    *n = 0;
    if (k3c_sampler_plain_greedy(s)) {
        for (int j = 0; j <= D; j++) {
            int32_t t;
            K3C_TRY(greedy(m, rows + (size_t)j * w->vocab, remaining - j, w, &t));
            K3C_TRY(k3c_gmatch_advance(m, t));
            k3c_sampler_observe(s, t);
            out[j] = t;
            *n = j + 1;
            if (j == D || t != drafts[j]) break;
        }
        return K3C_OK;
    }
    accept_ctx c = {m, w, remaining};
    k3c_spec_filter f = {filter_row, filter_took, &c};
    int cnt = k3c_spec_accept_filtered(s, rows, w->vocab, drafts, D, out, &f);
    if (cnt < 0) return K3C_ERR;
    *n = cnt;
    return K3C_OK;
}
