/* Rejection sampling of point-mass drafts (runtime/spec_accept.h). */
#include "runtime/spec_accept.h"

#include <stddef.h>

#include "runtime/sampler.h"

int k3c_spec_accept(k3c_sampler *s, const float *rows, int vocab, const int32_t *drafts, int D, int32_t *out) {
    for (int j = 0; j <= D; j++) {
        const int *ids;
        const float *p;
        int n = k3c_sampler_dist(s, rows + (size_t)j * vocab, &ids, &p);
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
            if (!accept) {
                out[j] = tok;
                k3c_sampler_observe(s, tok);
                return j + 1;
            }
        }
        out[j] = tok;
        k3c_sampler_observe(s, tok);
    }
    return D + 1;
}
