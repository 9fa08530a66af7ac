/* Parallel layouts: what each rank of (TP, PP, DP, EP) holds and moves (include/k3c.h k3c_layout_plan).
 *
 * Every tensor of the inventory is one of three kinds on a TP rank: split by rows (column-parallel: its
 * output dimension, dim 0 as stored), split by columns (row-parallel: its input dimension, the last stored
 * dim: o_proj, the MLPs' down), or replicated; a rank holds bytes / tp of a split tensor, and a split must
 * divide. The kind follows from the tensor's name (its last component before .weight), as vLLM shards the
 * same modules (parallel.md §2.6, vllm-runtime-notes.md §5.1). A_log stays whole: K3 pads it to 128 entries
 * (512 B), and where a shard would start inside the padding is a loader's choice, not a size. */
#include "model/layout.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "format/config_json.h"
#include "model/inventory.h"
#include "model/presets.h"
#include "util/error.h"

typedef enum split { SPLIT_NONE = 0, SPLIT_ROWS, SPLIT_COLS } split;

/* The module name of a tensor: the component before ".weight*" (or the last one: A_log, dt_bias, bias). */
static void component(const char *name, char *out, size_t cap) {
    const char *last = strrchr(name, '.');
    const char *end = name + strlen(name), *start = last ? last + 1 : name;
    if (last && strncmp(last + 1, "weight", 6) == 0) {
        end = last;
        const char *p = last;
        while (p > name && p[-1] != '.') p--;
        start = p;
    }
    size_t n = (size_t)(end - start) < cap - 1 ? (size_t)(end - start) : cap - 1;
    memcpy(out, start, n);
    out[n] = 0;
}

static split tp_split(const k3c_tensor_spec *s) {
    char comp[64];
    component(s->name, comp, sizeof comp);
    if (s->expert >= 0) return strcmp(comp, "w2") == 0 ? SPLIT_COLS : SPLIT_ROWS; /* w1 gate, w3 up; w2 down */
    static const char *const rows[] = {"embed_tokens", "lm_head", "q_proj", "k_proj", "v_proj", "q_conv1d",
                                       "k_conv1d", "v_conv1d", "f_b_proj", "g_b_proj", "b_proj", "g_proj",
                                       "dt_bias", "q_b_proj", "kv_b_proj", "gate_proj", "up_proj"};
    static const char *const cols[] = {"o_proj", "down_proj"};
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++)
        if (strcmp(comp, rows[i]) == 0) return SPLIT_ROWS;
    for (size_t i = 0; i < sizeof cols / sizeof cols[0]; i++)
        if (strcmp(comp, cols[i]) == 0) return SPLIT_COLS;
    return SPLIT_NONE;
}

/* Bytes one TP rank holds of a spec; -1 (with a message) where tp does not divide the split dimension. */
static int tp_bytes(const k3c_tensor_spec *s, int tp, uint64_t *out) {
    uint64_t b = k3c_tensor_spec_bytes(s);
    split k = tp > 1 ? tp_split(s) : SPLIT_NONE;
    if (k == SPLIT_NONE) {
        *out = b;
        return K3C_OK;
    }
    int dim = k == SPLIT_ROWS ? 0 : s->ndim - 1;
    if (s->shape[dim] % tp)
        return k3c_errorf("layout: tp %d does not divide dimension %d (%lld) of %s", tp, dim,
                          (long long)s->shape[dim], s->name);
    *out = b / (uint64_t)tp;
    return K3C_OK;
}

static int stage_first(int L, int pp, int s) { return (int)((long long)s * L / pp); }

void k3c_layout_stage_layers(int L, int pp, int s, int *first, int *end) {
    if (pp < 1) pp = 1;
    *first = stage_first(L, pp, s);
    *end = stage_first(L, pp, s + 1);
}

void k3c_layout_rank_experts(int E, int ep, int r, int *first, int *end) {
    if (ep < 1) ep = 1;
    *first = r * (E / ep);
    *end = *first + E / ep;
}

static int plan_ranks(const k3c_config *c, const k3c_layout *l, const k3c_inventory *inv, k3c_layout_rank *ranks,
                      int n) {
    int tp = l->tp, pp = l->pp, dp = l->dp, ep = l->ep, L = c->num_layers, E = c->num_experts;
    int per_host = n / l->hosts, dcp = l->dcp > 1 ? l->dcp : 1;
    int eb = l->kv_fp8 ? 1 : 2;
    double lat = k3c_config_mla_latent(c), D = c->hidden_size;
    /* a KDA slot of one layer on a TP rank: f32 state [H/tp, dk, dk], f32 window [3][W-1][P/tp] */
    uint64_t kda_layer = (uint64_t)(c->kda_num_heads / tp) * c->kda_head_dim * c->kda_head_dim * 4 +
                         (uint64_t)3 * (c->kda_conv_kernel > 0 ? c->kda_conv_kernel - 1 : 0) *
                             (uint64_t)(k3c_config_kda_proj(c) / tp) * 4;
    for (int r = 0; r < n; r++) {
        k3c_layout_rank *k = &ranks[r];
        memset(k, 0, sizeof *k);
        k->rank = r;
        k->host = r / per_host;
        k->tp_rank = r % tp;
        k->dp_rank = r / tp % dp;
        k->pp_stage = r / (tp * dp);
        k->ep_rank = ep > 1 ? r % (tp * dp) : 0;
        int first, end;
        k3c_layout_stage_layers(L, pp, k->pp_stage, &first, &end);
        k->layer_first = first;
        k->num_layers = end - first;
        k->embedding = k->pp_stage == 0;
        k->lm_head = k->pp_stage == pp - 1;
        for (int i = first; i < end; i++) {
            k->num_kda_layers += c->layer_attn[i] == K3C_ATTN_KDA;
            k->num_mla_layers += c->layer_attn[i] == K3C_ATTN_MLA;
            k->num_moe_layers += c->layer_is_moe[i] != 0;
        }
        /* ep: this rank's experts [e0, e0 + E / ep) */
        int e0 = 0, e1 = E;
        if (ep > 1) k3c_layout_rank_experts(E, ep, k->ep_rank, &e0, &e1);
        uint64_t embed_bytes = 0, expert_layer_all = 0; /* one MoE layer's experts on this rank, as held */
        int expert_layer = -1;
        for (size_t i = 0; i < inv->count; i++) {
            const k3c_tensor_spec *s = &inv->specs[i];
            int embed = s->layer < 0 && strstr(s->name, "embed_tokens") != NULL;
            /* a tied embedding is also the LM head: the last stage holds it too */
            int mine = s->layer >= 0 ? s->layer >= first && s->layer < end
                                     : embed ? k->embedding || (c->tie_word_embeddings && k->lm_head) : k->lm_head;
            if (!mine) continue;
            uint64_t b = 0;
            if (s->expert >= 0 && ep > 1) {
                if (s->expert < e0 || s->expert >= e1) continue;
                b = k3c_tensor_spec_bytes(s);
            } else if (tp_bytes(s, tp, &b) != K3C_OK) {
                return K3C_ERR;
            }
            k->weight_bytes += b;
            if (s->expert >= 0) {
                k->routed_expert_bytes += b;
                if (expert_layer < 0) expert_layer = s->layer;
                if (s->layer == expert_layer) expert_layer_all += b;
            }
            if (embed && !c->tie_word_embeddings) embed_bytes = b; /* looked up by rows, not read whole */
        }
        k->mla_bytes_per_token = (uint64_t)k3c_config_mla_latent(c) * eb * k->num_mla_layers;
        /* under DCP the rank holds its share of every request's positions (interleaved: ceil on rank 0) */
        uint64_t local = ((uint64_t)l->context + dcp - 1) / dcp;
        k->mla_tokens = local * (uint64_t)l->requests;
        k->mla_cache_bytes = k->mla_bytes_per_token * k->mla_tokens;
        k->kda_bytes_per_request = kda_layer * k->num_kda_layers;
        k->kda_bytes = k->kda_bytes_per_request * (uint64_t)l->requests;
        k->total_bytes = k->weight_bytes + k->mla_cache_bytes + k->kda_bytes;
        k->fits = k->total_bytes <= l->gpu_mem;

        /* the floor (k3c.h): the same model as k3c bench's (cli/bench_cuda.c bytes_for), per rank */
        double b = l->requests, rows = ep > 1 ? b * dp : b, K = c->num_experts_per_token;
        double step = (double)(k->weight_bytes - k->routed_expert_bytes - embed_bytes);
        if (k->embedding && !c->tie_word_embeddings)
            step += 2.0 * b * D / tp; /* the looked-up rows (bf16) of this rank's vocabulary shard, on average */
        if (E > 0 && k->num_moe_layers > 0) {
            /* expected distinct experts selected by `rows` rows, of which this rank holds a share: 1 / tp of each
             * (TP), or the 1 / ep of them it holds whole (EP); expert_layer_all is the rank's bytes of a layer */
            double distinct = E * (1.0 - pow(1.0 - K / E, rows));
            step += k->num_moe_layers * (double)expert_layer_all * distinct / E;
        }
        /* the cache read: this rank's share of the context; the write: one rank in dcp stores a new position */
        step += k->num_mla_layers * (b * ((double)l->context + 1.0) / dcp * lat * eb + b * lat * eb / dcp);
        step += (double)k->num_kda_layers * b * 2.0 * (double)kda_layer;
        k->step_bytes = step;
        k->floor_ms = step / l->hbm_bytes_per_s * 1e3;
    }
    return K3C_OK;
}

int k3c_layout_plan_config(const k3c_config *c, const k3c_layout *layout, k3c_layout_rank *ranks, int cap, int *n) {
    k3c_layout l = *layout;
    if (l.tp <= 0) l.tp = 1;
    if (l.pp <= 0) l.pp = 1;
    if (l.dp <= 0) l.dp = 1;
    if (l.ep <= 0) l.ep = 1;
    if (l.hosts <= 0) l.hosts = 1;
    if (l.dcp <= 0) l.dcp = 1;
    *n = 0;
    if (l.tp % l.dcp)
        return k3c_errorf("layout: dcp %d: decode context parallelism shards the MLA cache over a divisor of the tp "
                          "%d ranks", l.dcp, l.tp);
    long long world = (long long)l.tp * l.pp * l.dp;
    if (world > 1 << 20) return k3c_errorf("layout: %lld ranks (tp %d x pp %d x dp %d)", world, l.tp, l.pp, l.dp);
    if (l.ep != 1 && l.ep != l.tp * l.dp)
        return k3c_errorf("layout: ep %d: expert parallelism spans the tp x dp = %d ranks of a stage (ep %d), or is "
                          "off (ep 1)", l.ep, l.tp * l.dp, l.tp * l.dp);
    if (l.ep > 1 && c->num_experts % l.ep)
        return k3c_errorf("layout: ep %d does not divide the %d routed experts", l.ep, c->num_experts);
    if (l.pp > c->num_layers) return k3c_errorf("layout: pp %d stages for %d layers", l.pp, c->num_layers);
    if (world % l.hosts) return k3c_errorf("layout: %lld ranks do not spread evenly over %d hosts", world, l.hosts);
    int has_kda = 0, has_mla = 0;
    for (int i = 0; i < c->num_layers; i++) {
        has_kda |= c->layer_attn[i] == K3C_ATTN_KDA;
        has_mla |= c->layer_attn[i] == K3C_ATTN_MLA;
    }
    if (has_kda && c->kda_num_heads % l.tp)
        return k3c_errorf("layout: tp %d does not divide the %d KDA heads", l.tp, c->kda_num_heads);
    if (has_mla && c->num_attention_heads % l.tp)
        return k3c_errorf("layout: tp %d does not divide the %d MLA heads", l.tp, c->num_attention_heads);
    if (l.context < 0 || l.requests < 0) return k3c_errorf("layout: context %d, requests %d", l.context, l.requests);
    if (!(l.hbm_bytes_per_s > 0)) return k3c_errorf("layout: bandwidth %g bytes/s", l.hbm_bytes_per_s);
    if (world > cap) return k3c_errorf("layout: %lld ranks, room for %d", world, cap);
    k3c_inventory inv;
    K3C_TRY(k3c_inventory_build(c, NULL, &inv));
    int rc = plan_ranks(c, &l, &inv, ranks, (int)world);
    k3c_inventory_free(&inv);
    if (rc == K3C_OK) *n = (int)world;
    return rc;
}

int k3c_layout_plan(const char *config, const char *preset, const k3c_layout *layout, k3c_layout_rank *ranks,
                    int cap, int *n) {
    if (!layout || !ranks || !n) return k3c_errorf("k3c_layout_plan: NULL %s", !layout ? "layout" : !ranks ? "ranks" : "n");
    *n = 0;
    if (!config == !preset) return k3c_errorf("k3c_layout_plan: give a config or a preset, not %s", config ? "both" : "neither");
    k3c_config c;
    if (config) {
        struct stat st;
        char path[4096];
        if (stat(config, &st) == 0 && S_ISDIR(st.st_mode)) {
            if (snprintf(path, sizeof path, "%s/config.json", config) >= (int)sizeof path)
                return k3c_errorf("%s: path too long", config);
        } else {
            snprintf(path, sizeof path, "%s", config);
        }
        K3C_TRY(k3c_config_load(path, &c));
    } else {
        K3C_TRY(k3c_preset_config(preset, &c));
    }
    int rc = k3c_layout_plan_config(&c, layout, ranks, cap, n);
    k3c_config_free(&c);
    return rc;
}
