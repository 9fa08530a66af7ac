/* The world-size-1 communicator (comm/comm.h): every collective of one rank is the identity, or a copy. */
#include "comm/comm.h"

#include <string.h>

#include "util/error.h"

static int self_all_reduce(k3c_comm *c, float *buf, size_t n) {
    (void)c, (void)buf, (void)n;
    return K3C_OK;
}

static int self_all_gather(k3c_comm *c, const void *src, void *dst, size_t bytes) {
    (void)c;
    if (src != dst && bytes) memmove(dst, src, bytes);
    return K3C_OK;
}

static int self_broadcast(k3c_comm *c, void *buf, size_t bytes, int root) {
    (void)c, (void)buf, (void)bytes;
    return root == 0 ? K3C_OK : k3c_errorf("comm self: broadcast from rank %d of a group of 1", root);
}

static int self_barrier(k3c_comm *c) {
    (void)c;
    return K3C_OK;
}

static void self_abort(k3c_comm *c) { (void)c; }
static void self_free(k3c_comm *c) { (void)c; } /* static: nothing to free */

static int self_p2p(k3c_comm *c, const void *buf, size_t bytes, int peer) {
    (void)c, (void)buf, (void)bytes;
    return k3c_errorf("comm self: send / recv with rank %d in a group of 1 (no peer)", peer);
}
static int self_send(k3c_comm *c, const void *buf, size_t bytes, int peer) { return self_p2p(c, buf, bytes, peer); }
static int self_recv(k3c_comm *c, void *buf, size_t bytes, int peer) { return self_p2p(c, buf, bytes, peer); }

static int self_all_to_all(k3c_comm *c, const void *send, const size_t *send_bytes, void *recv,
                           const size_t *recv_bytes) {
    (void)c;
    if (send_bytes[0] != recv_bytes[0])
        return k3c_errorf("comm self: all_to_all sends %zu bytes to itself, expects %zu", send_bytes[0], recv_bytes[0]);
    if (send_bytes[0]) memmove(recv, send, send_bytes[0]);
    return K3C_OK;
}

static int self_split(k3c_comm *c, int color, int key, k3c_comm **out) {
    (void)key;
    *out = color >= 0 ? c : NULL;
    return K3C_OK;
}

k3c_comm *k3c_comm_self(void) {
    static k3c_comm self = {.name = "self", .rank = 0, .size = 1, .ctx = NULL, .all_reduce_f32 = self_all_reduce,
                            .all_gather = self_all_gather, .broadcast = self_broadcast, .barrier = self_barrier,
                            .abort = self_abort, .free = self_free, .send = self_send, .recv = self_recv,
                            .all_to_all = self_all_to_all, .split = self_split};
    return &self;
}

/* ---- a layout's groups ---- */

void k3c_comm_groups_free(k3c_comm_groups *g) {
    if (!g) return;
    k3c_comm *c[3] = {g->tp, g->pp, g->ep};
    for (int i = 0; i < 3; i++)
        if (c[i]) c[i]->free(c[i]);
    *g = (k3c_comm_groups){0};
}

int k3c_comm_groups_split(k3c_comm *world, int tp, int pp, int dp, int ep, k3c_comm_groups *out) {
    *out = (k3c_comm_groups){0};
    if (tp < 1 || pp < 1 || dp < 1 || (long long)tp * pp * dp != world->size)
        return k3c_errorf("comm groups: tp %d x pp %d x dp %d for a world of %d ranks", tp, pp, dp, world->size);
    if (ep != 1 && ep != tp * dp)
        return k3c_errorf("comm groups: ep %d: expert parallelism spans the tp x dp = %d ranks of a stage, or is off "
                          "(1)", ep, tp * dp);
    if ((tp < world->size || pp > 1 || ep > 1) && !world->split)
        return k3c_errorf("comm groups: the %s communicator cannot be split into groups", world->name);
    /* world rank w = (stage dp + dp rank) tp + tp rank (model/layout.c) */
    int w = world->rank, stage_ranks = tp * dp, stage = w / stage_ranks;
    /* every world rank calls each split that is made at all (size > 1), so the calls line up */
    if (tp > 1 && world->split(world, w / tp, w % tp, &out->tp) != K3C_OK) goto fail;
    if (pp > 1 && world->split(world, w % stage_ranks, stage, &out->pp) != K3C_OK) goto fail;
    if (ep > 1 && world->split(world, stage, w % stage_ranks, &out->ep) != K3C_OK) goto fail;
    return K3C_OK;
fail:
    k3c_comm_groups_free(out);
    return k3c_error_context("comm groups (world rank %d of %d): ", w, world->size);
}
