/* The mailbox all-reduce protocol on host threads (comm/mailbox.h says the protocol and why it is safe). */
#include "comm/mailbox.h"

#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "util/error.h"

#define MB_MAX_RANKS 64

/* What rank p leaves in region r for parity b: the count, then (release) the flag. */
typedef struct mb_slot {
    float *data;
    size_t n;
    _Atomic uint32_t flag;
} mb_slot;

struct k3c_mailbox {
    int ranks;
    size_t cap;
    mb_slot *slot; /* [ranks (region)][2 (parity)][ranks (writer)] */
    float *data;   /* backing store of every slot's data */
};

static mb_slot *slot_at(const k3c_mailbox *mb, int region, int parity, int writer) {
    return &mb->slot[((size_t)region * 2 + (size_t)parity) * (size_t)mb->ranks + (size_t)writer];
}

int k3c_mailbox_create(int ranks, size_t cap, k3c_mailbox **out) {
    *out = NULL;
    if (ranks < 2 || ranks > MB_MAX_RANKS || cap == 0 || cap > ((size_t)1 << 30))
        return k3c_errorf("mailbox: %d ranks of %zu floats (2 .. %d ranks, 1 .. 2^30 floats)", ranks, cap,
                          MB_MAX_RANKS);
    k3c_mailbox *mb = calloc(1, sizeof *mb);
    size_t slots = (size_t)ranks * 2 * (size_t)ranks;
    if (mb) {
        mb->slot = calloc(slots, sizeof *mb->slot);
        mb->data = malloc(slots * cap * sizeof(float));
    }
    if (!mb || !mb->slot || !mb->data) {
        k3c_mailbox_free(mb);
        return k3c_errorf_kind(K3C_ERROR_OOM, "mailbox: out of memory for %d ranks of %zu floats", ranks, cap);
    }
    mb->ranks = ranks;
    mb->cap = cap;
    for (size_t i = 0; i < slots; i++) {
        mb->slot[i].data = mb->data + i * cap;
        atomic_init(&mb->slot[i].flag, 0);
    }
    *out = mb;
    return K3C_OK;
}

void k3c_mailbox_free(k3c_mailbox *mb) {
    if (!mb) return;
    free(mb->slot);
    free(mb->data);
    free(mb);
}

int k3c_mailbox_rank_init(k3c_mailbox *mb, int rank, uint32_t first_epoch, k3c_mailbox_rank *r) {
    if (!mb || !r) return k3c_errorf("mailbox rank_init: %s is NULL", mb ? "the rank" : "the mailbox");
    if (rank < 0 || rank >= mb->ranks) return k3c_errorf("mailbox: rank %d of %d", rank, mb->ranks);
    *r = (k3c_mailbox_rank){mb, rank, first_epoch ? first_epoch : 1};
    return K3C_OK;
}

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec * 1e-6;
}

int k3c_mailbox_all_reduce(k3c_mailbox_rank *r, float *x, size_t n, int timeout_ms) {
    if (!r || !r->mb || (n > 0 && !x)) return k3c_errorf("mailbox all_reduce: NULL argument");
    k3c_mailbox *mb = r->mb;
    if (n > mb->cap) return k3c_errorf("mailbox all_reduce: %zu floats, the slots hold %zu", n, mb->cap);
    const uint32_t e = r->epoch;
    const int b = (int)(e & 1), me = r->rank, N = mb->ranks;
    /* 1. push into every peer's region */
    for (int p = 0; p < N; p++) {
        if (p == me) continue;
        mb_slot *s = slot_at(mb, p, b, me);
        if (n) memcpy(s->data, x, n * sizeof(float));
        s->n = n;
        atomic_store_explicit(&s->flag, e, memory_order_release);
    }
    /* 2. wait for every peer's push into this region */
    double deadline = now_ms() + timeout_ms;
    for (int p = 0; p < N; p++) {
        if (p == me) continue;
        mb_slot *s = slot_at(mb, me, b, p);
        /* host threads may outnumber the cores: yield while spinning (a GPU block would not) */
        for (unsigned spin = 0; atomic_load_explicit(&s->flag, memory_order_acquire) != e; spin++) {
            if ((spin & 63) == 63) sched_yield();
            if ((spin & 1023) == 1023 && now_ms() > deadline)
                return k3c_errorf("mailbox all_reduce: rank %d waited %d ms for rank %d's epoch %u (it holds %u)",
                                  me, timeout_ms, p, e, atomic_load_explicit(&s->flag, memory_order_acquire));
        }
        if (s->n != n)
            return k3c_errorf("mailbox all_reduce: rank %d reduces %zu floats, rank %d pushed %zu (epoch %u)", me,
                              n, p, s->n, e);
    }
    /* 3. the sum in rank order, starting from rank 0's value */
    for (size_t i = 0; i < n; i++) {
        float acc = me == 0 ? x[i] : slot_at(mb, me, b, 0)->data[i];
        for (int p = 1; p < N; p++) acc += p == me ? x[i] : slot_at(mb, me, b, p)->data[i];
        x[i] = acc;
    }
    /* 4. the next epoch; 0 is the flags' empty value, so 2^32 - 1 is followed by 2 (the parity still
     * alternates: the argument for two slots needs it) */
    r->epoch = e + 1 ? e + 1 : 2;
    return K3C_OK;
}
