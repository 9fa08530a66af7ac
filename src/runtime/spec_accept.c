/* Rejection sampling of point-mass drafts (runtime/spec_accept.h). */
#include "runtime/spec_accept.h"

#include <stddef.h>

#include "runtime/sampler.h"

int k3c_spec_accept(k3c_sampler *s, const float *rows, int vocab, const int32_t *drafts, int D, int32_t *out) {
    return k3c_spec_accept_filtered(s, rows, vocab, drafts, D, out, NULL);
}

/* Emits out[j] = tok: observed, then handed to the filter. */
static int emit(k3c_sampler *s, const k3c_spec_filter *f, int32_t *out, int j, int32_t tok) {
    out[j] = tok;
    k3c_sampler_observe(s, tok);
    return f && f->took(f->user, tok) ? -1 : 0;
}

int k3c_spec_accept_filtered(k3c_sampler *s, const float *rows, int vocab, const int32_t *drafts, int D,
                             int32_t *out, const k3c_spec_filter *f) {
    for (int j = 0; j <= D; j++) {
        const int *ids;
        const float *p;
        const float *row = rows + (size_t)j * vocab;
        if (f && !(row = f->row(f->user, j, row))) return -1;
        int n = k3c_sampler_dist(s, row, &ids, &p);
        int32_t tok;
        if (j == D) {
            tok = n == 1 ? ids[0] : k3c_sampler_draw(s, ids, p, n, -1); /* the bonus token */
        } else {
            int32_t d = drafts[j];
            float pd = 0;
            for (int i = 0; i < n; i++)
                if (ids[i] == d) {
                    pd = p[i];
                    break;
                }
            /* greedy (a point mass): accepted exactly when d is the argmax, without a draw */
            int accept = n == 1 ? pd > 0 : k3c_sampler_uniform(s) < pd;
            tok = accept ? d : n == 1 ? ids[0] : k3c_sampler_draw(s, ids, p, n, d);
            if (!accept) return emit(s, f, out, j, tok) ? -1 : j + 1;
        }
        if (emit(s, f, out, j, tok)) return -1;
    }
    return D + 1;
}
