/* Test helper: routing near-ties of an engine on the CPU backend. With f32 activations and a preset's own
 * top-k routing, an expert choice whose selection margin lies within f32 noise may go the other way in the
 * float64 reference, and then moves that row by 20-90% from that layer on and the request's later rows by
 * a few percent (seen: seed 61243734701845, tiny, token 13 at a margin of 3.0e-7, row rel L2 0.67; the next
 * smallest margin of that prompt was 6.3e-4). The CPU backend reports each row's smallest margin over the
 * MoE layers (k3c_backend_cpu_track_route_margins); a comparison made after a plan met a margin below
 * ROUTE_NEAR_TIE is counted and left out by the tests that use this. */
#ifndef K3C_TESTS_ROUTE_TIES_H
#define K3C_TESTS_ROUTE_TIES_H

#include <math.h>

#include "runtime/engine_internal.h"

#define ROUTE_NEAR_TIE 1e-5f
#define ROUTE_TIE_ROWS 64 /* rows a step may have */

typedef struct route_ties {
    k3c_backend *be;
    float margin[ROUTE_TIE_ROWS]; /* per row of the plan's steps, lowered by every step and MoE layer */
    int skipped;                  /* comparisons left out */
} route_ties;

/* Starts watching a plan of `eng`'s steps (the engine must run on the CPU backend). */
static inline void route_ties_begin(route_ties *w, k3c_engine *eng) {
    k3c_engine_view v;
    k3c_engine_view_get(eng, &v);
    w->be = v.be;
    for (int i = 0; i < ROUTE_TIE_ROWS; i++) w->margin[i] = INFINITY;
    k3c_backend_cpu_track_route_margins(w->be, w->margin, ROUTE_TIE_ROWS);
}

/* Whether the plan so far met a near-tie. */
static inline int route_ties_met(const route_ties *w) {
    for (int i = 0; i < ROUTE_TIE_ROWS; i++)
        if (w->margin[i] < ROUTE_NEAR_TIE) return 1;
    return 0;
}

/* Stops watching (before the engine or this struct goes away). */
static inline void route_ties_end(route_ties *w) {
    if (w->be) k3c_backend_cpu_track_route_margins(w->be, NULL, 0);
}

#endif
