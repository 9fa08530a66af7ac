/* Token sampling from one row of logits: greedy, or temperature with optional top-k and top-p (nucleus)
 * filtering, from a seeded generator (util/rng.h) so a run is reproducible. */
#define _GNU_SOURCE /* qsort_r: the comparison gets the logits without a global, so samplers on other threads never race */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "k3c.h"
#include "util/error.h"
#include "util/rng.h"

struct k3c_sampler {
    k3c_sampling s;
    int vocab;
    k3c_rng rng;
    int *idx;     /* [vocab] candidate ids */
    float *prob;  /* [vocab] */
};

int k3c_sampler_create(const k3c_sampling *s, int vocab, k3c_sampler **out) {
    if (!out) return k3c_errorf("sampler: the output handle is NULL");
    *out = NULL;
    static const k3c_sampling greedy = {.temperature = 0};
    if (!s) s = &greedy;
    if (vocab <= 0) return k3c_errorf("sampler: vocab %d", vocab);
    if (s->top_k < 0) return k3c_errorf("sampler: top_k %d is negative", s->top_k);
    /* NaN fails every comparison below silently (exp(x / NaN) makes every probability NaN) */
    if (isnan(s->temperature) || isinf(s->temperature))
        return k3c_errorf("sampler: temperature %g, expected a finite number (<= 0: greedy)", (double)s->temperature);
    if (isnan(s->top_p)) return k3c_errorf("sampler: top_p is NaN");
    k3c_sampler *x = calloc(1, sizeof *x);
    if (!x) return k3c_errorf_kind(K3C_ERROR_OOM, "sampler: out of memory");
    x->s = *s;
    x->vocab = vocab;
    x->idx = malloc(sizeof(int) * (size_t)vocab);
    x->prob = malloc(sizeof(float) * (size_t)vocab);
    if (!x->idx || !x->prob) {
        k3c_sampler_free(x);
        return k3c_errorf_kind(K3C_ERROR_OOM, "sampler: out of memory (vocab %d)", vocab);
    }
    k3c_rng_seed(&x->rng, s->seed);
    *out = x;
    return K3C_OK;
}

void k3c_sampler_free(k3c_sampler *s) {
    if (!s) return;
    free(s->idx);
    free(s->prob);
    free(s);
}

static int cmp_desc(const void *a, const void *b, void *logits) {
    int i = *(const int *)a, j = *(const int *)b;
    const float *l = logits;
    float x = l[i], y = l[j];
    if (x != y) return x > y ? -1 : 1;
    return i - j;
}

int32_t k3c_greedy_token(const float *l, int n) {
    if (!l) return k3c_errorf("greedy token: the logits are NULL");
    int best = 0;
    for (int i = 1; i < n; i++)
        if (l[i] > l[best] || (isnan(l[best]) && !isnan(l[i]))) best = i;
    return best;
}

/* Heap of the k best ids seen so far in s->idx[0..k), the worst (last in cmp_desc order) at the root. */
static void heap_down(int *h, int k, int at, const float *logits) {
    for (;;) {
        int l = 2 * at + 1, r = l + 1, w = at;
        if (l < k && cmp_desc(&h[l], &h[w], (void *)logits) > 0) w = l;
        if (r < k && cmp_desc(&h[r], &h[w], (void *)logits) > 0) w = r;
        if (w == at) return;
        int t = h[at];
        h[at] = h[w];
        h[w] = t;
        at = w;
    }
}

/* s->idx[0..k) = the first k ids of the cmp_desc order, in that order: the same prefix a full sort gives
 * (cmp_desc is a total order on ids: ties go to the lower id), in O(V log k) instead of O(V log V). */
static void top_k_sorted(k3c_sampler *s, const float *logits, int k) {
    int *h = s->idx;
    for (int i = 0; i < k; i++) h[i] = i;
    for (int i = k / 2 - 1; i >= 0; i--) heap_down(h, k, i, logits);
    for (int i = k; i < s->vocab; i++) {
        if (cmp_desc(&i, &h[0], (void *)logits) >= 0) continue; /* not better than the worst kept */
        h[0] = i;
        heap_down(h, k, 0, logits);
    }
    qsort_r(h, (size_t)k, sizeof(int), cmp_desc, (void *)logits);
}

/* The nucleus within candidates s->idx[0..n) in rank order with probabilities s->prob (unnormalised) and
 * normaliser z: the shortest prefix whose share reaches top_p (all n when it never does). */
static int nucleus_cut(const k3c_sampler *s, int n, double z) {
    double acc = 0;
    for (int i = 0; i < n; i++) {
        acc += s->prob[i] / z;
        if (acc >= s->s.top_p) return i + 1;
    }
    return n;
}

/* Top-p without top-k: the normaliser is summed over every id in id order (no ranking needed for it); the
 * nucleus is then looked for among the best 64 ids, then 512, 4096, ... (each by top_k_sorted, O(V log m)),
 * and only when it needs more than V/8 ids, or the best m hold under 1/16 of it, among all of them, fully
 * sorted. The result is the same as ranking every id first, since a prefix of the ranking does not depend on
 * how far it was computed (the sampled ids of the measurement below are those of the full sort). Measured at
 * V = 163,840 (this machine, one core, N(0, scale^2) logits, T = 1): scale 8, top_p 0.5 / 0.9: 0.70 / 0.70
 * ms per token; scale 4: 0.70 / 3.3 ms; scale 2: 4.4 / 23.5 ms; scale 1 (flat): 20.9 ms; the full sort
 * every time: 20 ms. Returns n; s->idx / s->prob hold the candidates in rank order. */
static int nucleus_only(k3c_sampler *s, const float *logits) {
    int V = s->vocab;
    float mx = logits[0];
    for (int i = 1; i < V; i++)
        if (logits[i] > mx) mx = logits[i];
    double z = 0;
    for (int i = 0; i < V; i++) z += exp(((double)logits[i] - mx) / s->s.temperature);
    for (int m = 64;; m = m < V ? m * 8 : V) {
        int full = m >= V / 8;
        if (full) {
            m = V;
            for (int i = 0; i < V; i++) s->idx[i] = i;
            qsort_r(s->idx, (size_t)V, sizeof(int), cmp_desc, (void *)logits);
        } else {
            top_k_sorted(s, logits, m);
        }
        double share = 0;
        for (int i = 0; i < m; i++) {
            s->prob[i] = (float)exp(((double)logits[s->idx[i]] - mx) / s->s.temperature);
            share += s->prob[i] / z;
        }
        int n = nucleus_cut(s, m, z);
        if (n < m || full) return n;
        /* a flat distribution (the best m hold under 1/16 of the nucleus) needs a large part of the
         * vocabulary: rank it all at once rather than pass over it at 8x the size each time */
        if (share < s->s.top_p / 16) m = V;
    }
}

int32_t k3c_sampler_sample(k3c_sampler *s, const float *logits) {
    if (!s || !logits) return k3c_errorf("sampler sample: %s is NULL", s ? "the logits" : "the sampler");
    int V = s->vocab;
    if (s->s.temperature <= 0) return k3c_greedy_token(logits, V);
    int k = s->s.top_k > 0 && s->s.top_k < V ? s->s.top_k : V;
    int nucleus = s->s.top_p > 0 && s->s.top_p < 1;
    if (k == V && !nucleus) {
        /* Plain temperature sampling needs no order: the walk below visits ids in id order (the same
         * distribution as visiting them by rank; one generator draw per token, as on every path). */
        float mx = logits[0];
        for (int i = 1; i < V; i++)
            if (logits[i] > mx) mx = logits[i];
        /* sum of the stored (float) probabilities, in the walk's order: the walk's running sum ends exactly
         * at sum, so u < sum always lands on an id (the fallback below is for NaN logits only) */
        double sum = 0;
        for (int i = 0; i < V; i++) {
            s->prob[i] = (float)exp(((double)logits[i] - mx) / s->s.temperature);
            sum += s->prob[i];
        }
        double u = (double)(k3c_rng_next(&s->rng) >> 11) * (1.0 / 9007199254740992.0) * sum, acc = 0;
        for (int i = 0; i < V; i++) {
            acc += s->prob[i];
            if (u < acc) return i;
        }
        return V - 1;
    }
    int n;
    double sum = 0;
    if (k < V) {
        /* top-k (then maybe top-p within it): the k best in descending logit order (ties: lower id), the
         * normaliser summed over them in that order */
        top_k_sorted(s, logits, k);
        n = k;
        double mx = logits[s->idx[0]];
        for (int i = 0; i < n; i++) {
            double p = exp(((double)logits[s->idx[i]] - mx) / s->s.temperature);
            s->prob[i] = (float)p;
            sum += p;
        }
        if (nucleus) n = nucleus_cut(s, n, sum);
    } else {
        n = nucleus_only(s, logits);
    }
    if (nucleus) {
        sum = 0;
        for (int i = 0; i < n; i++) sum += s->prob[i];
    }
    /* uniform in [0, sum) from the top 53 bits */
    double u = (double)(k3c_rng_next(&s->rng) >> 11) * (1.0 / 9007199254740992.0) * sum, acc = 0;
    for (int i = 0; i < n; i++) {
        acc += s->prob[i];
        if (u < acc) return s->idx[i];
    }
    return s->idx[n - 1];
}
