/* MoE router (spec §5.3, transformers' KimiMoEGate): scores, optional grouped selection on the
 * bias-corrected scores, top-k, weights from the uncorrected scores. Ties break to the lower id (expert and
 * group), and results are ordered by decreasing selection score. */
#include <math.h>

#include "cpu/ops.h"

/* Whether a value ranks above b: larger, or a number against a NaN (NaN ranks below every number). */
static int ranks_above(float a, float b) { return a > b || (a == a && b != b); }

/* Inserts (val, id) into the descending list top[0..*cnt) of capacity k; ids arrive in increasing order,
 * so an equal value never displaces an earlier one (ties to the lower id). The order is total: numbers by
 * value, then NaNs, each by id (+0 and -0 equal), so the list is the k best of what was offered whatever
 * the NaNs among them, and cuda/router.cu's rank selection gives the same experts in the same order. */
static void topk_insert(float *topv, int *topi, int *cnt, int k, float val, int id) {
    int pos = *cnt;
    while (pos > 0 && ranks_above(val, topv[pos - 1])) pos--;
    if (pos >= k) return;
    int last = *cnt < k ? *cnt : k - 1;
    for (int i = last; i > pos; i--) {
        topv[i] = topv[i - 1];
        topi[i] = topi[i - 1];
    }
    topv[pos] = val;
    topi[pos] = id;
    if (*cnt < k) (*cnt)++;
}

/* score[E] (sigmoid or softmax of the logits) and sel[E] (score + bias, -inf outside the kept groups when
 * grouped); *group_gap: under grouped selection, the last kept group's score minus the best dropped one's
 * (INFINITY when no group is dropped). */
static void route_scores(const k3c_config *c, const float *logits, const float *bias, float *score, float *sel,
                         float *group_gap) {
    int E = c->num_experts;
    *group_gap = INFINITY;
    if (c->router_sigmoid) {
        for (int e = 0; e < E; e++) score[e] = k3c_sigmoidf(logits[e]);
    } else {
        float mx = -INFINITY, sum = 0.0f;
        for (int e = 0; e < E; e++) mx = logits[e] > mx ? logits[e] : mx;
        for (int e = 0; e < E; e++) sum += score[e] = expf(logits[e] - mx);
        for (int e = 0; e < E; e++) score[e] /= sum;
    }
    int use_bias = c->use_correction_bias && bias;
    for (int e = 0; e < E; e++) sel[e] = score[e] + (use_bias ? bias[e] : 0.0f);

    int G = c->num_expert_group;
    if (c->use_grouped_topk && G > 1 && E % G == 0 && c->topk_group < G) {
        /* Group score: sum of the group's top-2 selection scores; keep topk_group groups, mask the rest. */
        int per = E / G, keep = c->topk_group > 0 ? c->topk_group : 1;
        float gv[G], gsc[G];
        int gi[G], gcnt = 0;
        for (int gr = 0; gr < G; gr++) {
            float tv[2];
            int ti[2], tc = 0;
            for (int e = gr * per; e < (gr + 1) * per; e++) topk_insert(tv, ti, &tc, 2, sel[e], e);
            float gs = tc > 1 ? tv[0] + tv[1] : tv[0];
            gsc[gr] = gs;
            topk_insert(gv, gi, &gcnt, keep, gs, gr);
        }
        for (int gr = 0; gr < G; gr++) {
            int kept = 0;
            for (int i = 0; i < gcnt; i++) kept |= gi[i] == gr;
            if (!kept) {
                for (int e = gr * per; e < (gr + 1) * per; e++) sel[e] = -INFINITY;
                if (gcnt > 0 && gv[gcnt - 1] - gsc[gr] < *group_gap) *group_gap = gv[gcnt - 1] - gsc[gr];
            }
        }
    }
}

void k3c_route(const k3c_config *c, const float *logits, const float *bias, int *idx, float *weight) {
    int E = c->num_experts, k = c->num_experts_per_token;
    float score[E], sel[E], group_gap; /* E = 896 for K3: a few KB of stack */
    route_scores(c, logits, bias, score, sel, &group_gap);

    float topv[k];
    int cnt = 0;
    for (int e = 0; e < E; e++) topk_insert(topv, idx, &cnt, k, sel[e], e);

    /* cnt < k only when k > E, which config validation rejects; the unused slots get weight 0. */
    for (int i = cnt; i < k; i++) idx[i] = 0;
    float sum = 0.0f;
    for (int i = 0; i < k; i++) {
        weight[i] = i < cnt ? score[idx[i]] : 0.0f;
        sum += weight[i];
    }
    /* transformers divides first, then scales: w / (sum + 1e-20) * factor. */
    for (int i = 0; i < k; i++)
        weight[i] = c->moe_renormalize ? weight[i] / (sum + 1e-20f) * c->routed_scaling_factor
                                       : weight[i] * c->routed_scaling_factor;
}

float k3c_route_margin(const k3c_config *c, const float *logits, const float *bias) {
    int E = c->num_experts, k = c->num_experts_per_token;
    float score[E], sel[E], group_gap;
    route_scores(c, logits, bias, score, sel, &group_gap);
    /* the k + 1 largest selection scores: the k-th selected against the best one left out */
    float topv[k + 1];
    int topi[k + 1], cnt = 0;
    for (int e = 0; e < E; e++) topk_insert(topv, topi, &cnt, k + 1, sel[e], e);
    float gap = cnt > k && topv[k] > -INFINITY ? topv[k - 1] - topv[k] : INFINITY;
    return gap < group_gap ? gap : group_gap;
}
