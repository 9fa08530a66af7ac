/* The block-stamp report of a replayed specialized step (K3C_CUDA_PROFILE=3; cuda/stamp.h has the records):
 * the records grouped into launches, the launches mapped to the executor's ops, and per op, per op name, per
 * kernel class and for the step: launch ramp (last block start - first), drain (last block end - first block
 * end), span (last end - first start), the gap to the next op's first block, the bytes the op moves and the
 * bandwidth over its span and over span + gap (its "pitch": first start to the next op's first start, so the
 * pitches add up to the step), as a fraction of the copy bandwidth; then the step's expert coverage. Plain C,
 * no CUDA: the CPU tests feed it synthetic records (tests/test_stamp.c).
 *
 * The plan is what the executor records while it captures a shape's graph: its ops in order, each with the
 * number of stamped launches it made (kernel nodes it added, less cuBLASLt's, which are not stamped) and the
 * bytes it moves (weights + activations, from its shapes; the routed experts from the step's routing, MLA
 * attention from the positions the step attends). Launches are ordered by %gridid and checked against their
 * start times; they map to ops only when their count is the plan's (else the report lists launches only). */
#ifndef K3C_DECODE_STAMP_REPORT_H
#define K3C_DECODE_STAMP_REPORT_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "cuda/stamp.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum k3c_stamp_class {
    K3C_SCLASS_GEMV = 0, /* attention / dense projections */
    K3C_SCLASS_EXPERTS,  /* routed experts */
    K3C_SCLASS_MOE_FT,   /* MoE front (router, latent down, shared experts) and tail */
    K3C_SCLASS_KDA,      /* KDA recurrence and its copies */
    K3C_SCLASS_MLA,      /* MLA cache write, absorbed projections, attention */
    K3C_SCLASS_NORM,     /* AttnRes mixes, norms, residual adds */
    K3C_SCLASS_LM_HEAD,
    K3C_SCLASS_ARGMAX,
    K3C_SCLASS_OTHER,    /* embedding, activations */
    K3C_SCLASS_COUNT
} k3c_stamp_class;

const char *k3c_stamp_class_name(int cls);
/* The class of an executor op by its name (the op names of the executor's step: decode/step.c,
 * decode/providers/), and of a kernel by its kid (used when launches do not map to ops). */
int k3c_stamp_class_of_op(const char *op);
int k3c_stamp_class_of_kid(int kid);
const char *k3c_stamp_kid_name(int kid);

typedef struct k3c_stamp_op {
    const char *name;    /* a string literal of the executor */
    int kernels;         /* stamped launches */
    int foreign;         /* kernel nodes of launches not stamped (cuBLASLt) */
    double bytes;        /* weights + activations it reads and writes */
    double pos_bytes;    /* + this x the step's attended positions (MLA attention) */
    int moe_layer;       /* >= 0: the routed experts of this layer; + distinct experts x expert_bytes */
    double expert_bytes;
} k3c_stamp_op;

typedef struct k3c_stamp_plan {
    k3c_stamp_op *op;
    int n, cap;
    int depth;  /* begin/end nesting: an op inside an op belongs to the outer one */
    int failed; /* a node count was unreadable or memory ran out: launches will not be mapped */
} k3c_stamp_plan;

/* begin/end bracket one op; end takes its stamped launches and foreign kernel nodes (< 0: unknown, the plan
 * fails). bytes / positions / experts add to the open op, or to the last one when none is open. */
void k3c_stamp_plan_begin(k3c_stamp_plan *p, const char *name);
void k3c_stamp_plan_end(k3c_stamp_plan *p, long kernels, long foreign);
void k3c_stamp_plan_bytes(k3c_stamp_plan *p, double bytes);
void k3c_stamp_plan_positions(k3c_stamp_plan *p, double bytes_per_position);
void k3c_stamp_plan_experts(k3c_stamp_plan *p, int layer, double bytes_per_expert);
/* An op outside the captured graph (the greedy arg-max after it), appended whole. */
void k3c_stamp_plan_add(k3c_stamp_plan *p, const char *name, int kernels, double bytes);
void k3c_stamp_plan_free(k3c_stamp_plan *p);

typedef struct k3c_stamp_launch {
    uint32_t grid;
    int kid;
    int blocks;        /* blocks with a BEGIN */
    int blocks_no_end; /* of them, blocks with no END (their end taken as their last other stamp) */
    uint64_t s0, s1;   /* first / last block start */
    uint64_t w0, w1;   /* first / last WAIT (0, 0: none) */
    uint64_t e0, e1;   /* first / last block end (a block's end: its last warp's END) */
} k3c_stamp_launch;

typedef struct k3c_stamp_parse {
    size_t records;
    size_t orphans;  /* records of grids with no BEGIN (kernels not stamped at their start) */
    int dup_begin;   /* blocks with two BEGINs: a grid id shared by two launches */
    int inversions;  /* consecutive launches (grid order) whose first start goes back in time */
    int by_time;     /* 1: inversions were seen, launches are ordered by first start instead */
} k3c_stamp_parse;

/* Groups records into launches (*out malloc'ed, ordered as launched). K3C_OK or K3C_ERR (out of memory). */
int k3c_stamp_launches(const k3c_stamp_rec *rec, size_t n, k3c_stamp_launch **out, size_t *nl,
                       k3c_stamp_parse *info);

/* The step around the records. */
typedef struct k3c_stamp_step {
    int rows, q;
    double bandwidth;  /* copy bandwidth, bytes/s, measured in the same process (0: unknown) */
    double plain_ms;   /* the same shape's plain replayed step, host wall time (0: unknown) */
    double stamped_ms; /* this stamped step, host wall time */
    double positions;  /* attended positions summed over the rows (MLA) */
    double tick_ns;    /* the globaltimer's tick */
    size_t dropped;    /* records lost to full regions */
    const int *route;  /* [layers][rows * k] expert ids of each layer's routing (rows of MoE layers only); or NULL */
    int layers, k, experts;
    const unsigned char *is_moe; /* [layers] */
} k3c_stamp_step;

typedef struct k3c_stamp_opstat {
    int cls, launches, blocks, first_launch;
    double s0, s1, w0, e0, e1;          /* us from the step's first block start */
    double ramp, wait, drain, span, gap; /* us; gap < 0: the next op started before this one ended (PDL) */
    double pitch;                       /* span + gap: this op's first start to the next op's */
    double bytes;
} k3c_stamp_opstat;

/* Distinct experts in n ids over [0, E); pairs[e] (E entries, zeroed here) the ids naming e. Ids outside
 * [0, E) are counted in *bad. */
int k3c_stamp_coverage(const int *ids, int n, int E, int *pairs, int *bad);
/* Per-op statistics (out: plan->n entries) when the launches map to the plan: K3C_OK, else K3C_ERR. */
int k3c_stamp_op_stats(const k3c_stamp_plan *plan, const k3c_stamp_launch *L, size_t nl,
                       const k3c_stamp_step *st, k3c_stamp_opstat *out);
/* The tables ("STAMP..." and "COVER..." lines) for one stamped step. */
int k3c_stamp_report(FILE *f, const k3c_stamp_plan *plan, const k3c_stamp_launch *L, size_t nl,
                     const k3c_stamp_parse *info, const k3c_stamp_step *st);

#ifdef __cplusplus
}
#endif

#endif
