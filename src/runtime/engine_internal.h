/* What a specialized decode executor needs of the engine it serves (decode/executor.h): read access to
 * its model, backend, caches and KDA slots, and the two halves of k3c_engine_step around the forward, so a
 * step the executor runs has exactly the engine's checks and effects (blocks taken, lengths moved, an
 * uncommitted verify left for k3c_request_commit). Not part of include/k3c.h: front ends never see it. */
#ifndef K3C_RUNTIME_ENGINE_INTERNAL_H
#define K3C_RUNTIME_ENGINE_INTERNAL_H

#include "k3c.h"
#include "model/model.h"
#include "runtime/kda_slots.h"
#include "runtime/kv_cache.h"
#include "stock/backend.h"
#include "stock/forward.h"

typedef struct k3c_engine_view {
    const k3c_model *m;
    k3c_backend *be;
    k3c_kv_cache *kv;
    k3c_kda_slots *ks;
    int max_requests, max_rows, max_context, block_size, q_max;
    int max_blocks_per_request; /* block table length that covers max_context */
    /* aux streams (k3c_engine_options.aux_layers, validated): a path running a step writes stream j of its
     * N logits rows to aux + j * N * hidden (host, [num_aux, max_rows, hidden] floats); step_end marks them valid */
    const int *aux_layers;
    int num_aux;
    float *aux;
} k3c_engine_view;

void k3c_engine_view_get(k3c_engine *e, k3c_engine_view *v);

/* First half of k3c_engine_step: validates the items, takes the cache blocks the step writes and returns
 * the forward requests (pos, block table, slot, verify) in *reqs (valid until the next step). Nothing is
 * changed on failure except blocks taken (they stay with their requests, as in k3c_engine_step). */
int k3c_engine_step_begin(k3c_engine *e, const k3c_step_item *items, int n, const k3c_fwd_req **reqs);
/* Second half, after the forward ran the step: moves lengths, marks verifies pending, marks the aux streams
 * (written by the path that ran the step) valid for the step's logits rows. */
void k3c_engine_step_end(k3c_engine *e, const k3c_step_item *items, int n);

#endif
