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

k3c_comm *k3c_comm_self(void) {
    static k3c_comm self = {"self", 0, 1, NULL, self_all_reduce, self_all_gather, self_broadcast, self_barrier,
                            self_abort, self_free, 0};
    return &self;
}
