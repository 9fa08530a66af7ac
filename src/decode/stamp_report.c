/* The block-stamp report (decode/stamp_report.h). */
#include "decode/stamp_report.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "util/error.h"

/* one word each: the tables are read by awk (tools/gpu-measure.sh) */
static const char *const class_names[K3C_SCLASS_COUNT] = {"GEMV",    "experts", "moe-f/t", "KDA",  "MLA",
                                                          "AR/norm", "lm-head", "argmax",  "other"};

const char *k3c_stamp_class_name(int cls) { return cls >= 0 && cls < K3C_SCLASS_COUNT ? class_names[cls] : "?"; }

static int starts(const char *s, const char *p) { return strncmp(s, p, strlen(p)) == 0; }

int k3c_stamp_class_of_op(const char *op) {
    static const char *const gemv[] = {"kda in-proj", "kda up-proj", "kda o_proj", "mla in-proj", "mla q_b",
                                       "mla o_proj", "mlp gate/up", "mlp down"};
    if (starts(op, "lm head")) return K3C_SCLASS_LM_HEAD;
    if (starts(op, "argmax")) return K3C_SCLASS_ARGMAX;
    if (starts(op, "moe experts")) return K3C_SCLASS_EXPERTS;
    /* the residual stream's ops, the fused MoE add among them ("moe out + residual add + rmsnorm") */
    if (strstr(op, "attnres") || strstr(op, "rmsnorm") || strstr(op, "final norm") || starts(op, "residual add") ||
        strcmp(op, "moe out") == 0)
        return K3C_SCLASS_NORM;
    for (size_t i = 0; i < sizeof gemv / sizeof gemv[0]; i++)
        if (starts(op, gemv[i])) return K3C_SCLASS_GEMV;
    if (starts(op, "moe ")) return K3C_SCLASS_MOE_FT;
    if (starts(op, "kda")) return K3C_SCLASS_KDA;
    if (starts(op, "mla")) return K3C_SCLASS_MLA;
    return K3C_SCLASS_OTHER;
}

static const char *const kid_names[K3C_KID_COUNT] = {
    "-",
    "gemv_t1", "gemv_t1_group", "gemv_mma", "gemv_mma_group", "gemv_scalar", "f32_to_bf16",
    "rmsnorm", "add_rmsnorm", "gated_act", "embed", "add", "round", "sigmoid", "mul_sigmoid",
    "attnres_mix",
    "route", "route_act",
    "argmax",
    "copy_batch",
    "kda_conv", "kda_gate", "kda_qk_norm", "kda_recurrent", "kda_chunked", "kda_gated_norm", "kda_decode_fused",
    "mla_cache_write", "mla_absorb_q", "mla_absorb_q_v", "mla_absorb_o_v", "mla_absorb_o", "mla_attend",
    "mla_attend_bf16v", "mla_attend_hg", "mla_attend_merge",
    "moe_mma", "moe_combine",
    "moe_pair_gate_up", "moe_pair_down", "moe_pair_mx", "moe_band_lists", "moe_band",
};

const char *k3c_stamp_kid_name(int kid) {
    return kid >= 0 && kid < K3C_KID_COUNT && kid_names[kid] ? kid_names[kid] : "?";
}

int k3c_stamp_class_of_kid(int kid) {
    switch (kid) {
    case K3C_KID_GEMV_T1: case K3C_KID_GEMV_T1_GROUP: case K3C_KID_GEMV_MMA: case K3C_KID_GEMV_MMA_GROUP:
    case K3C_KID_GEMV_SCALAR: case K3C_KID_F32_TO_BF16: case K3C_KID_ROUND:
        return K3C_SCLASS_GEMV;
    case K3C_KID_RMSNORM: case K3C_KID_ADD_RMSNORM: case K3C_KID_ADD: case K3C_KID_ATTNRES_MIX:
        return K3C_SCLASS_NORM;
    case K3C_KID_ROUTE: case K3C_KID_ROUTE_ACT:
        return K3C_SCLASS_MOE_FT;
    case K3C_KID_ARGMAX:
        return K3C_SCLASS_ARGMAX;
    case K3C_KID_COPY_BATCH: case K3C_KID_KDA_CONV: case K3C_KID_KDA_GATE: case K3C_KID_KDA_QK_NORM:
    case K3C_KID_KDA_RECURRENT: case K3C_KID_KDA_CHUNKED: case K3C_KID_KDA_GATED_NORM: case K3C_KID_KDA_DECODE_FUSED:
        return K3C_SCLASS_KDA;
    case K3C_KID_MUL_SIGMOID: case K3C_KID_MLA_CACHE_WRITE: case K3C_KID_MLA_ABSORB_Q: case K3C_KID_MLA_ABSORB_Q_V:
    case K3C_KID_MLA_ABSORB_O_V: case K3C_KID_MLA_ABSORB_O: case K3C_KID_MLA_ATTEND: case K3C_KID_MLA_ATTEND_BF16V:
    case K3C_KID_MLA_ATTEND_HG: case K3C_KID_MLA_ATTEND_MERGE:
        return K3C_SCLASS_MLA;
    case K3C_KID_MOE_MMA: case K3C_KID_MOE_COMBINE: case K3C_KID_MOE_PAIR_GATE_UP: case K3C_KID_MOE_PAIR_DOWN:
    case K3C_KID_MOE_PAIR_MX: case K3C_KID_MOE_BAND_LISTS: case K3C_KID_MOE_BAND:
        return K3C_SCLASS_EXPERTS;
    default:
        return K3C_SCLASS_OTHER;
    }
}

/* ---- the plan ---- */

static k3c_stamp_op *plan_push(k3c_stamp_plan *p, const char *name) {
    if (p->n == p->cap) {
        int cap = p->cap ? 2 * p->cap : 256;
        k3c_stamp_op *op = realloc(p->op, sizeof *op * (size_t)cap);
        if (!op) {
            p->failed = 1;
            return NULL;
        }
        p->op = op;
        p->cap = cap;
    }
    k3c_stamp_op *o = &p->op[p->n++];
    *o = (k3c_stamp_op){.name = name, .moe_layer = -1};
    return o;
}

void k3c_stamp_plan_begin(k3c_stamp_plan *p, const char *name) {
    if (p->depth++ == 0 && !plan_push(p, name)) p->depth = 0;
}

void k3c_stamp_plan_end(k3c_stamp_plan *p, long kernels, long foreign) {
    if (p->depth == 0 || --p->depth > 0 || p->n == 0) return;
    if (kernels < 0 || foreign < 0) p->failed = 1;
    p->op[p->n - 1].kernels = kernels > 0 ? (int)kernels : 0;
    p->op[p->n - 1].foreign = foreign > 0 ? (int)foreign : 0;
}

static k3c_stamp_op *plan_last(k3c_stamp_plan *p) { return p->n ? &p->op[p->n - 1] : NULL; }

void k3c_stamp_plan_bytes(k3c_stamp_plan *p, double bytes) {
    k3c_stamp_op *o = plan_last(p);
    if (o) o->bytes += bytes;
}

void k3c_stamp_plan_positions(k3c_stamp_plan *p, double bytes_per_position) {
    k3c_stamp_op *o = plan_last(p);
    if (o) o->pos_bytes += bytes_per_position;
}

void k3c_stamp_plan_experts(k3c_stamp_plan *p, int layer, double bytes_per_expert) {
    k3c_stamp_op *o = plan_last(p);
    if (o) {
        o->moe_layer = layer;
        o->expert_bytes = bytes_per_expert;
    }
}

void k3c_stamp_plan_add(k3c_stamp_plan *p, const char *name, int kernels, double bytes) {
    k3c_stamp_op *o = plan_push(p, name);
    if (o) {
        o->kernels = kernels;
        o->bytes = bytes;
    }
}

void k3c_stamp_plan_free(k3c_stamp_plan *p) {
    free(p->op);
    *p = (k3c_stamp_plan){0};
}

/* ---- records -> launches ---- */

static uint32_t kind_of(const k3c_stamp_rec *r) { return (uint32_t)K3C_STAMP_KIND(r->info); }

static int by_grid_block(const void *a, const void *b) {
    const k3c_stamp_rec *x = a, *y = b;
    if (x->grid != y->grid) return x->grid < y->grid ? -1 : 1;
    uint32_t bx = K3C_STAMP_BLOCKID(x->info), by = K3C_STAMP_BLOCKID(y->info);
    if (bx != by) return bx < by ? -1 : 1;
    if (kind_of(x) != kind_of(y)) return kind_of(x) < kind_of(y) ? -1 : 1;
    return (x->t > y->t) - (x->t < y->t);
}

/* launches sorted by grid - base (grid ids taken modulo 2^32 from the earliest launch's), base subtracted
 * before and added back after the sort */
static int by_grid(const void *a, const void *b) {
    uint32_t x = ((const k3c_stamp_launch *)a)->grid, y = ((const k3c_stamp_launch *)b)->grid;
    return (x > y) - (x < y);
}
static int by_start(const void *a, const void *b) {
    const k3c_stamp_launch *x = a, *y = b;
    if (x->s0 != y->s0) return x->s0 < y->s0 ? -1 : 1;
    return by_grid(a, b);
}

int k3c_stamp_launches(const k3c_stamp_rec *rec, size_t n, k3c_stamp_launch **out, size_t *nl,
                       k3c_stamp_parse *info) {
    *out = NULL;
    *nl = 0;
    *info = (k3c_stamp_parse){.records = n};
    if (n == 0) return K3C_OK;
    k3c_stamp_rec *r = malloc(sizeof *r * n);
    k3c_stamp_launch *L = malloc(sizeof *L * n); /* at most one launch a record */
    if (!r || !L) {
        free(r);
        free(L);
        return k3c_errorf_kind(K3C_ERROR_OOM, "stamp report: out of memory for %zu records", n);
    }
    memcpy(r, rec, sizeof *r * n);
    qsort(r, n, sizeof *r, by_grid_block);
    size_t m = 0;
    for (size_t i = 0; i < n;) {
        size_t j = i;
        while (j < n && r[j].grid == r[i].grid) j++;
        k3c_stamp_launch l = {.grid = r[i].grid, .s0 = UINT64_MAX, .e0 = UINT64_MAX, .w0 = UINT64_MAX};
        for (size_t a = i; a < j;) { /* one block: its records sorted BEGIN, WAIT, END, each by time */
            size_t b = a;
            uint32_t blk = K3C_STAMP_BLOCKID(r[a].info);
            uint64_t begin = 0, wait = 0, end = 0;
            int nbegin = 0, nwait = 0, nend = 0;
            for (; b < j && K3C_STAMP_BLOCKID(r[b].info) == blk; b++) {
                int kind = K3C_STAMP_KIND(r[b].info);
                if (kind == K3C_STAMP_BEGIN) {
                    if (nbegin++ == 0) {
                        begin = r[b].t;
                        l.kid = K3C_STAMP_KID(r[b].info);
                    }
                } else if (kind == K3C_STAMP_WAIT) {
                    if (nwait++ == 0) wait = r[b].t;
                } else if (kind == K3C_STAMP_END) {
                    nend++;
                    end = r[b].t; /* sorted by time: the last warp's */
                }
            }
            if (nbegin == 0) {
                info->orphans += b - a;
            } else {
                if (nbegin > 1) info->dup_begin++;
                if (nend == 0) {
                    l.blocks_no_end++;
                    end = nwait && wait > begin ? wait : begin;
                }
                l.blocks++;
                if (begin < l.s0) l.s0 = begin;
                if (begin > l.s1) l.s1 = begin;
                if (nwait) {
                    if (wait < l.w0) l.w0 = wait;
                    if (wait > l.w1) l.w1 = wait;
                }
                if (end < l.e0) l.e0 = end;
                if (end > l.e1) l.e1 = end;
            }
            a = b;
        }
        if (l.blocks) {
            if (l.w0 == UINT64_MAX) l.w0 = 0;
            L[m++] = l;
        }
        i = j;
    }
    free(r);
    if (m) {
        size_t first = 0;
        for (size_t i = 1; i < m; i++)
            if (L[i].s0 < L[first].s0) first = i;
        uint32_t base = L[first].grid;
        for (size_t i = 0; i < m; i++) L[i].grid -= base;
        qsort(L, m, sizeof *L, by_grid);
        for (size_t i = 1; i < m; i++)
            if (L[i].s0 < L[i - 1].s0) info->inversions++;
        /* a stream's launches start in order (a launch's blocks start only after every block of the one before
         * it has started), so an inversion means the grid ids are not in launch order: use the times */
        if (info->inversions) {
            info->by_time = 1;
            qsort(L, m, sizeof *L, by_start);
        }
        for (size_t i = 0; i < m; i++) L[i].grid += base;
    }
    *out = L;
    *nl = m;
    return K3C_OK;
}

/* ---- statistics ---- */

int k3c_stamp_coverage(const int *ids, int n, int E, int *pairs, int *bad) {
    int distinct = 0;
    *bad = 0;
    memset(pairs, 0, sizeof *pairs * (size_t)E);
    for (int i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= E) {
            (*bad)++;
            continue;
        }
        if (pairs[ids[i]]++ == 0) distinct++;
    }
    return distinct;
}

static int layer_distinct(const k3c_stamp_step *st, int layer) {
    if (!st->route || layer < 0 || layer >= st->layers || !st->is_moe || !st->is_moe[layer] || st->experts <= 0)
        return 0;
    int *pairs = malloc(sizeof *pairs * (size_t)st->experts), bad;
    if (!pairs) return 0;
    int d = k3c_stamp_coverage(st->route + (size_t)layer * st->rows * st->k, st->rows * st->k, st->experts, pairs, &bad);
    free(pairs);
    return d;
}

static double op_bytes(const k3c_stamp_op *o, const k3c_stamp_step *st) {
    double b = o->bytes + o->pos_bytes * st->positions;
    if (o->moe_layer >= 0) b += layer_distinct(st, o->moe_layer) * o->expert_bytes;
    return b;
}

static long plan_kernels(const k3c_stamp_plan *p) {
    long s = 0;
    for (int i = 0; i < p->n; i++) s += p->op[i].kernels;
    return s;
}

static uint64_t step_start(const k3c_stamp_launch *L, size_t nl) {
    uint64_t t = UINT64_MAX;
    for (size_t i = 0; i < nl; i++)
        if (L[i].s0 < t) t = L[i].s0;
    return t;
}

static double us(uint64_t t, uint64_t t0) { return ((double)t - (double)t0) * 1e-3; }

int k3c_stamp_op_stats(const k3c_stamp_plan *plan, const k3c_stamp_launch *L, size_t nl, const k3c_stamp_step *st,
                       k3c_stamp_opstat *out) {
    if (plan->failed || plan_kernels(plan) != (long)nl || nl == 0) return K3C_ERR;
    uint64_t t0 = step_start(L, nl);
    size_t a = 0;
    for (int i = 0; i < plan->n; i++) {
        const k3c_stamp_op *o = &plan->op[i];
        k3c_stamp_opstat s = {.cls = k3c_stamp_class_of_op(o->name), .launches = o->kernels, .first_launch = (int)a,
                              .bytes = op_bytes(o, st)};
        if (o->kernels == 0) {
            s.s0 = s.s1 = s.w0 = s.e0 = s.e1 = NAN;
        } else {
            uint64_t s0 = UINT64_MAX, s1 = 0, w0 = UINT64_MAX, e0 = UINT64_MAX, e1 = 0;
            for (size_t j = a; j < a + (size_t)o->kernels; j++) {
                s0 = L[j].s0 < s0 ? L[j].s0 : s0;
                s1 = L[j].s1 > s1 ? L[j].s1 : s1;
                if (L[j].w0 && L[j].w0 < w0) w0 = L[j].w0;
                e0 = L[j].e0 < e0 ? L[j].e0 : e0;
                e1 = L[j].e1 > e1 ? L[j].e1 : e1;
                s.blocks += L[j].blocks;
            }
            s.s0 = us(s0, t0), s.s1 = us(s1, t0), s.e0 = us(e0, t0), s.e1 = us(e1, t0);
            s.w0 = w0 == UINT64_MAX ? NAN : us(w0, t0);
            s.ramp = s.s1 - s.s0;
            s.wait = isnan(s.w0) ? NAN : s.w0 - s.s0;
            s.drain = s.e1 - s.e0;
            s.span = s.e1 - s.s0;
        }
        out[i] = s;
        a += (size_t)o->kernels;
    }
    /* gap and pitch against the next op that launched anything (the last: its span, no gap) */
    for (int i = 0; i < plan->n; i++) {
        if (out[i].launches == 0) {
            out[i].ramp = out[i].wait = out[i].drain = out[i].span = out[i].gap = out[i].pitch = NAN;
            continue;
        }
        int j = i + 1;
        while (j < plan->n && out[j].launches == 0) j++;
        out[i].gap = j < plan->n ? out[j].s0 - out[i].e1 : 0;
        out[i].pitch = out[i].span + out[i].gap;
    }
    return K3C_OK;
}

static double gbs(double bytes, double t_us) { return t_us > 0 ? bytes / (t_us * 1e3) : 0; } /* GB/s */
static double frac(double bytes, double t_us, double bw) { return t_us > 0 && bw > 0 ? bytes / (t_us * 1e-6) / bw : 0; }

typedef struct agg {
    const char *name;
    int cls, ops, timed, launches; /* timed: ops that launched */
    double span, gap, pitch, ramp, drain, bytes;
} agg;

static void agg_add(agg *g, const k3c_stamp_opstat *s) {
    g->ops++;
    g->launches += s->launches;
    g->bytes += s->bytes;
    if (s->launches == 0) return;
    g->timed++;
    g->span += s->span;
    g->gap += s->gap;
    g->pitch += s->pitch;
    g->ramp += s->ramp;
    g->drain += s->drain;
}

#define AGG_COLS "%s %s %-34s %-8s %4s %5s %10s %9s %10s %8s %8s %9s %8s %8s %6s\n"
static void agg_header(FILE *f, const char *prefix, const char *tag, const char *what) {
    fprintf(f, AGG_COLS, prefix, tag, what, "class", "ops", "L", "span_us", "gap_us", "pitch_us", "ramp_us", "drain_us",
            "MB", "GBs_span", "GBs_ptch", "copy");
}
static void agg_print(FILE *f, const char *prefix, const char *tag, const char *what, const agg *g, double bw) {
    int timed = g->timed;
    fprintf(f, "%s %s %-34s %-8s %4d %5d %10.2f %9.2f %10.2f %8.3f %8.3f %9.3f %8.1f %8.1f %6.3f\n", prefix, tag, what,
            k3c_stamp_class_name(g->cls), g->ops, g->launches, g->span, g->gap, g->pitch, timed ? g->ramp / timed : 0,
            timed ? g->drain / timed : 0, g->bytes / 1e6, gbs(g->bytes, g->span), gbs(g->bytes, g->pitch),
            frac(g->bytes, g->pitch, bw));
}

static void coverage_report(FILE *f, const k3c_stamp_step *st) {
    if (!st->route || !st->is_moe || st->experts <= 0 || st->k <= 0) return;
    int E = st->experts, n = st->rows * st->k, layers = 0, bad_all = 0;
    int *pairs = malloc(sizeof *pairs * (size_t)E);
    long hist[33] = {0}; /* experts with 1..32 pairs in one layer; [0]: more than 32 */
    double dsum = 0;
    int dmin = E, dmax = 0;
    if (!pairs) return;
    for (int l = 0; l < st->layers; l++) {
        if (!st->is_moe[l]) continue;
        int bad, d = k3c_stamp_coverage(st->route + (size_t)l * n, n, E, pairs, &bad), most = 0;
        for (int e = 0; e < E; e++) {
            if (pairs[e] > most) most = pairs[e];
            if (pairs[e] > 0) hist[pairs[e] <= 32 ? pairs[e] : 0]++;
        }
        fprintf(f, "COVER b=%d q=%d layer %3d: %4d distinct experts of %d, %d pairs, at most %d on one expert%s\n",
                st->rows / st->q, st->q, l, d, E, n, most, bad ? " (ids out of range)" : "");
        layers++;
        dsum += d;
        dmin = d < dmin ? d : dmin;
        dmax = d > dmax ? d : dmax;
        bad_all += bad;
    }
    free(pairs);
    if (!layers) return;
    double uniform = E * (1.0 - pow(1.0 - (double)st->k / E, st->rows));
    fprintf(f, "COVER b=%d q=%d: %d MoE layers, distinct experts per layer mean %.1f (min %d, max %d; uniform routing "
               "would give %.1f), %.2f pairs per distinct expert; experts by pairs per layer:",
            st->rows / st->q, st->q, layers, dsum / layers, dmin, dmax, uniform, dsum > 0 ? layers * (double)n / dsum : 0);
    for (int c = 1; c <= 32; c++)
        if (hist[c]) fprintf(f, " %d:%ld", c, hist[c]);
    if (hist[0]) fprintf(f, " >32:%ld", hist[0]);
    fprintf(f, "%s\n", bad_all ? " (some ids out of range)" : "");
}

int k3c_stamp_report(FILE *f, const k3c_stamp_plan *plan, const k3c_stamp_launch *L, size_t nl,
                     const k3c_stamp_parse *info, const k3c_stamp_step *st) {
    char tag[64];
    snprintf(tag, sizeof tag, "b=%d q=%d", st->q > 0 ? st->rows / st->q : st->rows, st->q);
    long want = plan_kernels(plan);
    k3c_stamp_opstat *os = plan->n > 0 ? malloc(sizeof *os * (size_t)plan->n) : NULL;
    int mapped = os && k3c_stamp_op_stats(plan, L, nl, st, os) == K3C_OK;
    long foreign = 0;
    for (int i = 0; i < plan->n; i++) foreign += plan->op[i].foreign;
    fprintf(f, "STAMP %s: %zu launches from %zu records (%zu dropped, %zu of unstamped starts), globaltimer tick %.0f "
               "ns; launch order by %s (%d inversions, %d shared grid ids); plan %d ops, %ld stamped launches, %ld "
               "cuBLASLt kernels: %s\n",
            tag, nl, info->records, st->dropped, info->orphans, st->tick_ns, info->by_time ? "start time" : "grid id",
            info->inversions, info->dup_begin, plan->n, want, foreign,
            mapped         ? "mapped to ops"
            : plan->failed ? "NOT mapped (the plan's node counts failed)"
                           : "NOT mapped (launch count differs: the tables take each launch as an op, by kernel, "
                             "without bytes)");
    uint64_t t0 = step_start(L, nl);
    /* per launch: always (the detail under the op table) */
    fprintf(f, "STAMPL %s %4s %-18s %-8s %4s %6s %9s %7s %7s %8s %7s %8s %8s %4s\n", tag, "#", "kernel", "class", "op",
            "blocks", "start_us", "ramp", "wait", "fend", "drain", "span", "gap", "noend");
    int op = 0, left = mapped && plan->n ? plan->op[0].kernels : 0;
    for (size_t i = 0; i < nl; i++) {
        while (mapped && left == 0 && op + 1 < plan->n) left = plan->op[++op].kernels;
        int cls = mapped ? os[op].cls : k3c_stamp_class_of_kid(L[i].kid);
        double gap = i + 1 < nl ? us(L[i + 1].s0, t0) - us(L[i].e1, t0) : 0;
        fprintf(f, "STAMPL %s %4zu %-18s %-8s %4d %6d %9.2f %7.2f %7.2f %8.2f %7.2f %8.2f %8.2f %4d\n", tag, i,
                k3c_stamp_kid_name(L[i].kid), k3c_stamp_class_name(cls), mapped ? op : -1, L[i].blocks, us(L[i].s0, t0),
                us(L[i].s1, t0) - us(L[i].s0, t0), L[i].w0 ? us(L[i].w0, t0) - us(L[i].s0, t0) : NAN,
                us(L[i].e0, t0) - us(L[i].s0, t0), us(L[i].e1, t0) - us(L[i].e0, t0), us(L[i].e1, t0) - us(L[i].s0, t0),
                gap, L[i].blocks_no_end);
        if (mapped) left--;
    }
    double gpu = 0;
    for (size_t i = 0; i < nl; i++) gpu = us(L[i].e1, t0) > gpu ? us(L[i].e1, t0) : gpu;
    /* unmapped: the tables below take each launch as an op of its kernel's class, with no bytes */
    k3c_stamp_plan each = {0};
    if (!mapped) {
        free(os);
        os = nl ? malloc(sizeof *os * nl) : NULL;
        for (size_t i = 0; i < nl; i++) k3c_stamp_plan_add(&each, k3c_stamp_kid_name(L[i].kid), 1, 0);
        if (!os || each.failed || k3c_stamp_op_stats(&each, L, nl, st, os) != K3C_OK) {
            fprintf(f, "STAMPSTEP %s gpu_us %.2f launches %zu (no tables: out of memory)\n", tag, gpu, nl);
            free(os);
            k3c_stamp_plan_free(&each);
            coverage_report(f, st);
            return K3C_OK;
        }
        for (size_t i = 0; i < nl; i++) os[i].cls = k3c_stamp_class_of_kid(L[i].kid);
        plan = &each;
    }
    double bw = st->bandwidth;
    fprintf(f, "STAMPOP %s %4s %-40s %-8s %3s %6s %9s %7s %7s %8s %7s %8s %8s %9s %8s %8s %6s\n", tag, "#", "op", "class",
            "L", "blocks", "start_us", "ramp", "wait", "fend", "drain", "span", "gap", "MB", "GBs_span", "GBs_ptch", "copy");
    for (int i = 0; i < plan->n; i++) {
        const k3c_stamp_opstat *s = &os[i];
        char name[48];
        snprintf(name, sizeof name, "%s%s", plan->op[i].name, plan->op[i].foreign ? " *" : "");
        fprintf(f, "STAMPOP %s %4d %-40s %-8s %3d %6d %9.2f %7.2f %7.2f %8.2f %7.2f %8.2f %8.2f %9.3f %8.1f %8.1f %6.3f\n",
                tag, i, name, k3c_stamp_class_name(s->cls), s->launches, s->blocks, s->s0, s->ramp, s->wait,
                s->e0 - s->s0, s->drain, s->span, s->gap, s->bytes / 1e6, gbs(s->bytes, s->span), gbs(s->bytes, s->pitch),
                frac(s->bytes, s->pitch, bw));
    }
    /* per op name, in order of first appearance */
    agg *names = plan->n > 0 ? calloc((size_t)plan->n, sizeof *names) : NULL;
    int nn = 0;
    agg cls[K3C_SCLASS_COUNT] = {{0}}, all = {.name = "step", .cls = -1};
    double gap_pos = 0, gap_neg = 0;
    for (int c = 0; c < K3C_SCLASS_COUNT; c++) cls[c].cls = c;
    for (int i = 0; i < plan->n; i++) {
        int j = 0;
        while (names && j < nn && strcmp(names[j].name, plan->op[i].name)) j++;
        if (names && j == nn) names[nn++] = (agg){.name = plan->op[i].name, .cls = os[i].cls};
        if (names) agg_add(&names[j], &os[i]);
        agg_add(&cls[os[i].cls], &os[i]);
        agg_add(&all, &os[i]);
        if (os[i].launches) {
            if (os[i].gap > 0) gap_pos += os[i].gap;
            else gap_neg += os[i].gap;
        }
    }
    agg_header(f, "STAMPNAME", tag, "op");
    for (int j = 0; j < nn; j++) agg_print(f, "STAMPNAME", tag, names[j].name, &names[j], bw);
    free(names);
    agg_header(f, "STAMPCLASS", tag, "class");
    for (int c = 0; c < K3C_SCLASS_COUNT; c++)
        if (cls[c].ops) agg_print(f, "STAMPCLASS", tag, k3c_stamp_class_name(c), &cls[c], bw);
    double floor_us = bw > 0 ? all.bytes / bw * 1e6 : 0;
    fprintf(f, "STAMPSTEP %s gpu_us %.2f (first block start to last block end), ops %d, launches %zu; sum of spans %.2f, "
               "gaps %.2f (+%.2f idle, %.2f overlapped); %.1f MB, floor %.2f us at %.0f GB/s copy: %.3f of floor; "
               "stamped step %.3f ms wall, plain step %.3f ms wall (the stamps' cost: %+.3f ms)\n",
            tag, gpu, plan->n, nl, all.span, gap_pos + gap_neg, gap_pos, gap_neg, all.bytes / 1e6, floor_us, bw / 1e9,
            gpu > 0 ? floor_us / gpu : 0, st->stamped_ms, st->plain_ms,
            st->plain_ms > 0 ? st->stamped_ms - st->plain_ms : 0);
    free(os);
    k3c_stamp_plan_free(&each);
    coverage_report(f, st);
    return K3C_OK;
}
