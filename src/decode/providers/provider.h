/* A provider: one layer part of the specialized step (the seed's build_providers builds one object per layer
 * kind: KDA or MLA attention, dense MLP or MoE feed-forward). The executor builds one per layer part at build
 * time, records each part's launches into every captured step, lets each re-derive what it derived from the
 * weights after a reload, and frees them with the executor.
 *
 * A provider reads the layer's weights where the backend loaded them and works on the executor's fixed
 * buffers (decode/executor_cuda_internal.h): attention reads the normed input x and leaves its output in A;
 * a feed-forward reads x and names its output's addends (out below). Each provider's launches compute the
 * same bits as the stock ops of its part (stock/forward.c over cuda/backend_cuda.c). */
#ifndef K3C_DECODE_PROVIDERS_PROVIDER_H
#define K3C_DECODE_PROVIDERS_PROVIDER_H

struct k3c_decode_cuda;
struct k3c_exec_rec;

/* What a part adds to the residual stream: v = a2 ? r(a1 + a2) : a1 (r the bf16 rounding; a2: an MoE's
 * shared part beside its routed part). The step applies the add in the launch that reads the residual next. */
typedef struct k3c_provider_out {
    const float *a1, *a2;
} k3c_provider_out;

typedef struct k3c_provider k3c_provider;

typedef struct k3c_provider_kind {
    const char *name; /* "kda", "mla", "dense_mlp", "moe" */
    /* Checks that what the part reads resolves (weights' device copies) and builds its own state; nothing
     * here may be left for record to fail on. */
    int (*build)(k3c_provider *p);
    /* Records the part's launches for one step (s: rows, q, requests) on the executor's stream. */
    int (*record)(const k3c_provider *p, const struct k3c_exec_rec *s, k3c_provider_out *out);
    /* After new weights were written into the same device storage: re-derives in place what build derived
     * from them and checks that the addresses it resolved did not move (captured graphs hold them). */
    int (*reload)(k3c_provider *p);
    void (*free)(k3c_provider *p);
} k3c_provider_kind;

struct k3c_provider {
    const k3c_provider_kind *kind;
    struct k3c_decode_cuda *x; /* the executor: its buffers, stream, products */
    int layer;
    void *state; /* the kind's own state (NULL for the kinds that derive nothing) */
};

extern const k3c_provider_kind k3c_provider_kda;       /* providers/kda.c */
extern const k3c_provider_kind k3c_provider_mla;       /* providers/mla.c */
extern const k3c_provider_kind k3c_provider_dense_mlp; /* providers/dense_mlp.c */
extern const k3c_provider_kind k3c_provider_moe;       /* providers/moe.c */

#endif
