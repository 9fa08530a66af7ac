/* The ranks' communicators on device cuda (runtime/ranks.h): the staged TP group of ranks in one process, and
 * the executor's TP mailbox (in-process or between processes over CUDA IPC). */
#include "runtime/ranks.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "comm/mailbox_cuda.h"
#include "util/error.h"

#ifdef K3C_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "cuda/backend_cuda.h"
#endif

int k3c_ranks_device_groups(k3c_rank *ranks, int world) {
    int tp = ranks[0].layout.tp;
    if (ranks[0].layout.pp > 1 || ranks[0].layout.dp > 1) { /* the staged world (k3c_rank_attach_device) */
        k3c_comm_group *g = NULL;
        if (k3c_comm_group_create(world, ranks[0].timeout_ms, &g) != K3C_OK)
            return k3c_error_context("ranks: the device group of %d ranks", world);
        for (int r = 0; r < world; r++) ranks[r].dev_group = g;
        return K3C_OK;
    }
    for (int s = 0; s < world / tp; s++) {
        k3c_comm_group *g = NULL;
        if (k3c_comm_group_create(tp, ranks[0].timeout_ms, &g) != K3C_OK)
            return k3c_error_context("ranks: the device group of TP group %d", s);
        for (int k = 0; k < tp; k++) ranks[s * tp + k].dev_group = g;
    }
    return K3C_OK;
}

int k3c_rank_device(const k3c_rank *r) {
    int visible = 0;
#ifdef K3C_HAVE_CUDA
    if (r->group && cudaGetDeviceCount(&visible) != cudaSuccess) visible = 0; /* the backend then says why */
#endif
    return r->group && visible > 0 ? r->rank % visible : 0;
}

int k3c_rank_device_share(const k3c_rank *r) {
    int visible = 0;
#ifdef K3C_HAVE_CUDA
    if (r->group && cudaGetDeviceCount(&visible) != cudaSuccess) visible = 0;
#endif
    if (!r->group) return 1;
    if (visible <= 0 || visible >= r->world) return visible <= 0 ? r->world : 1;
    return r->world / visible + (r->rank % visible < r->world % visible);
}

int k3c_rank_attach_device(k3c_rank *r, k3c_backend *be) {
#ifdef K3C_HAVE_CUDA
    if (!r->group) { /* one process per rank: NCCL, made before the backend, onto the backend's stream */
        /* every rank in the same order (TP, DCP, pipeline, expert): each call is a barrier of its group, and
         * every group's ranks reach it having passed only the calls before, which their own groups complete */
        k3c_comm *groups[4] = {r->tp_comm, r->dcp_comm, r->pp_comm, r->ep_comm};
        static const char *const what[4] = {"TP", "DCP", "pipeline", "expert"};
        for (int i = 0; i < 4; i++)
            if (groups[i] && !strcmp(groups[i]->name, "nccl") &&
                k3c_comm_nccl_set_stream(groups[i], k3c_backend_cuda_stream(be)) != K3C_OK)
                return k3c_error_context("engine: rank %d of %d: the %s communicator's stream", r->rank, r->world,
                                         what[i]);
        return K3C_OK;
    }
    if (!r->dev_group) return K3C_OK;
    k3c_comm *c = NULL;
    if (r->layout.pp > 1 || r->layout.dp > 1) {
        /* the staged world of every rank, split as the CUDA stock forward's PP / DEP tests split theirs
         * (k3c_comm_groups_split: TP runs of tp consecutive ranks, one rank per stage, a stage's DP ranks) */
        const k3c_layout *l = &r->layout;
        k3c_comm_groups gr = {0};
        if (k3c_comm_staged_create(r->dev_group, r->rank, k3c_backend_cuda_device(be), k3c_backend_cuda_stream(be),
                                   r->timeout_ms, &c) != K3C_OK)
            return k3c_error_context("engine: rank %d of %d: the staged world communicator", r->rank, r->world);
        r->dev_group = NULL;
        r->dev_world = c;
        if (k3c_comm_groups_split(c, l->tp, l->pp, l->dp, l->ep > 1 ? l->ep : 1, &gr) != K3C_OK)
            return k3c_error_context("engine: rank %d of %d: the staged groups", r->rank, r->world);
        if (gr.tp) {
            if (r->tp_comm && r->tp_comm != r->world_comm) r->tp_comm->free(r->tp_comm);
            r->tp_comm = gr.tp;
        }
        r->fwd_pp = gr.pp;
        r->fwd_ep = gr.ep;
        return K3C_OK;
    }
    if (k3c_comm_staged_create(r->dev_group, r->tp_rank, k3c_backend_cuda_device(be), k3c_backend_cuda_stream(be),
                               r->timeout_ms, &c) != K3C_OK)
        return k3c_error_context("engine: rank %d of %d: the staged TP communicator", r->rank, r->world);
    if (r->tp_comm && r->tp_comm != r->world_comm) r->tp_comm->free(r->tp_comm);
    r->tp_comm = c; /* the world's host group still carries the step messages */
    r->dev_group = NULL;
    int dcp = r->layout.dcp;
    if (dcp > 1 && dcp < r->layout.tp) {
        /* the DCP group on device memory too (the forward refuses a DCP group on other memory than TP's): split
         * from the staged TP group, runs of dcp consecutive TP ranks as k3c_ranks_threads made the host one */
        k3c_comm *d = NULL;
        if (c->split(c, r->tp_rank / dcp, r->tp_rank % dcp, &d) != K3C_OK)
            return k3c_error_context("engine: rank %d of %d: the staged DCP communicator", r->rank, r->world);
        if (r->dcp_comm) r->dcp_comm->free(r->dcp_comm);
        r->dcp_comm = d;
    }
    return K3C_OK;
#else
    (void)be;
    if (!r->group || !r->dev_group) return K3C_OK;
    return k3c_errorf_kind(K3C_ERROR_DEVICE, "engine: rank %d: this build has no CUDA", r->rank);
#endif
}

#ifdef K3C_HAVE_CUDA

/* What each rank tells the others before the mailbox exists. */
typedef struct mbx_hello {
    char host[64];
    int device;
    void *stream;
} mbx_hello;

/* What the TP group's first rank tells the others once it made an in-process mailbox group. */
typedef struct mbx_made {
    int ok;
    char why[200];
    k3c_comm *comm[8];
} mbx_made;

static void host_name(char out[64]) {
    memset(out, 0, 64);
    if (gethostname(out, 63) != 0) snprintf(out, 64, "?");
}

/* Host bytes over the TP group of a process-per-rank world (NCCL: device buffers), at build: a device buffer
 * of this call's size, freed after (no peer's collective spins yet). */
static int tp_gather_host(k3c_rank *r, k3c_backend *be, const void *src, void *dst, size_t bytes) {
    k3c_comm *c = r->tp_comm;
    if (!c->stream_ordered) return c->all_gather(c, src, dst, bytes);
    size_t all = bytes * (size_t)c->size;
    char *d = be->alloc(be, all);
    if (!d) return k3c_error_context("ranks: %zu bytes for the mailbox's hello", all);
    be->upload(be, d + bytes * (size_t)c->rank, src, bytes);
    int rc = be->sync(be);
    if (rc == K3C_OK) rc = c->all_gather(c, d + bytes * (size_t)c->rank, d, bytes);
    if (rc == K3C_OK) rc = c->barrier(c);
    if (rc == K3C_OK) be->download(be, dst, d, all);
    if (rc == K3C_OK) rc = be->sync(be);
    be->free(be, d);
    return rc;
}

int k3c_rank_agree(k3c_rank *r, k3c_backend *be, int mine, int *all) {
    int32_t me = mine != 0, got[4096];
    int n = r->group ? r->world : r->tp_comm->size;
    int rc = r->group ? r->world_comm->all_gather(r->world_comm, &me, got, sizeof me)
                      : tp_gather_host(r, be, &me, got, sizeof me);
    *all = 1;
    for (int q = 0; q < n && rc == K3C_OK; q++)
        if (!got[q]) *all = 0;
    return rc == K3C_OK ? K3C_OK : k3c_error_context("ranks: rank %d: agreeing on the executor", r->rank);
}

int k3c_rank_mailbox(k3c_rank *r, k3c_backend *be, size_t cap, k3c_comm **out, char *why, size_t why_cap) {
    *out = NULL;
    int tp = r->layout.tp;
    if (tp < 2) {
        snprintf(why, why_cap, "tp %d", tp);
        return K3C_OK;
    }
    if (tp > 8) { /* the same on every rank: no exchange */
        snprintf(why, why_cap, "the mailbox joins at most 8 ranks, the TP group has %d", tp);
        return K3C_OK;
    }
    mbx_hello me = {.device = k3c_backend_cuda_device(be), .stream = k3c_backend_cuda_stream(be)};
    host_name(me.host);
    mbx_hello all[8];
    k3c_comm_mailbox_options mo = {.cap = cap, .timeout_ms = r->timeout_ms < 10000 ? r->timeout_ms : 10000,
                                   .threads = 1}; /* a thread a rank */
    if (r->group) {
        /* threads: the world's host group carries the pointers (one process), the TP group's first rank makes
         * every rank's communicator and hands them out */
        mbx_hello *w = malloc(sizeof *w * (size_t)r->world);
        mbx_made *made = malloc(sizeof *made * (size_t)r->world);
        if (!w || !made) {
            free(w), free(made);
            return k3c_errorf_kind(K3C_ERROR_OOM, "ranks: out of memory");
        }
        int rc = r->world_comm->all_gather(r->world_comm, &me, w, sizeof me);
        int first = r->rank - r->tp_rank;
        mbx_made mine = {0};
        if (rc == K3C_OK && r->tp_rank == 0) {
            int devices[8];
            void *streams[8];
            for (int k = 0; k < tp; k++) devices[k] = w[first + k].device, streams[k] = w[first + k].stream;
            mine.ok = k3c_comm_mailbox_create(tp, devices, streams, &mo, mine.comm) == K3C_OK;
            if (!mine.ok) {
                snprintf(mine.why, sizeof mine.why, "%s", k3c_error_message());
                k3c_error_clear();
            }
        }
        if (rc == K3C_OK) rc = r->world_comm->all_gather(r->world_comm, &mine, made, sizeof mine);
        if (rc == K3C_OK) {
            if (made[first].ok) *out = made[first].comm[r->tp_rank];
            else snprintf(why, why_cap, "%s", made[first].why);
        } else if (mine.ok) { /* nobody got theirs: the leader frees them all */
            for (int k = 0; k < tp; k++) mine.comm[k]->free(mine.comm[k]);
        }
        free(w), free(made);
        return rc == K3C_OK ? K3C_OK : k3c_error_context("ranks: rank %d: the mailbox's set-up", r->rank);
    }
    /* one process per rank: IPC within a host only (the peers' regions are mapped through CUDA IPC) */
    K3C_TRY(tp_gather_host(r, be, &me, all, sizeof me));
    for (int k = 0; k < tp; k++)
        if (strcmp(all[k].host, all[0].host) != 0) {
            snprintf(why, why_cap, "the TP group's ranks are on different hosts (%s, %s)", all[0].host, all[k].host);
            return K3C_OK;
        }
    if (k3c_comm_mailbox_create_ipc(r->tp_comm, r->tp_comm->stream_ordered, me.device, me.stream, &mo, out) != K3C_OK) {
        *out = NULL; /* create_ipc fails on every rank alike */
        snprintf(why, why_cap, "%s", k3c_error_message());
        k3c_error_clear();
    }
    return K3C_OK;
}

#else

int k3c_rank_agree(k3c_rank *r, k3c_backend *be, int mine, int *all) {
    (void)r, (void)be;
    *all = mine != 0;
    return K3C_OK;
}

int k3c_rank_mailbox(k3c_rank *r, k3c_backend *be, size_t cap, k3c_comm **out, char *why, size_t why_cap) {
    (void)r, (void)be, (void)cap;
    *out = NULL;
    snprintf(why, why_cap, "this build has no CUDA");
    return K3C_OK;
}

#endif
