/* Test helper: a synthesized checkpoint made repetitive. Scales every bf16 tensor that writes into the
 * residual stream (attention o_proj, the dense and shared down projections, the MoE latent up-projection or
 * Kimi Linear's expert w2) by `factor`, in place in the checkpoint's shards (or its one model.safetensors):
 * the layers then add little to the embedding, the model
 * becomes nearly a bigram model whose greedy stream falls into a loop (the behaviour a real model shows on
 * repetitive text and a random one never does), so a prompt-lookup drafter's drafts get accepted. */
#ifndef K3C_TESTS_DAMP_RESIDUAL_H
#define K3C_TESTS_DAMP_RESIDUAL_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "format/safetensors.h"
#include "model/presets.h"
#include "model/synth.h"
#include "util/bf16.h"
#include "util/error.h"

static inline int damp_ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && memcmp(s + n - m, suffix, m) == 0;
}

static inline int damp_residual_writes_in(const char *dir, float factor) {
    for (int shard = 1;; shard++) {
        char path[600];
        int found = 0;
        for (int total = 1; total < 1000 && !found; total++) {
            snprintf(path, sizeof path, "%s/model-%05d-of-%06d.safetensors", dir, shard, total);
            FILE *f = fopen(path, "rb");
            if (f) found = 1, fclose(f);
        }
        if (!found && shard == 1) { /* a checkpoint of one file */
            snprintf(path, sizeof path, "%s/model.safetensors", dir);
            FILE *f = fopen(path, "rb");
            if (f) found = 2, fclose(f);
        }
        if (!found) return shard > 1 ? K3C_OK : k3c_errorf("damp: no shards in %s", dir);
        k3c_st_file st;
        K3C_TRY(k3c_st_open(&st, path));
        uint64_t hlen;
        memcpy(&hlen, st.map, 8);
        FILE *f = fopen(path, "r+b");
        int rc = f ? K3C_OK : k3c_errorf("damp: cannot open %s", path);
        for (size_t i = 0; i < st.header.num_tensors && rc == K3C_OK; i++) {
            const k3c_st_tensor *t = &st.header.tensors[i];
            if (t->dtype != K3C_DTYPE_BF16 || strstr(t->name, "routed_expert_down_proj") ||
                !(damp_ends_with(t->name, "o_proj.weight") || damp_ends_with(t->name, "down_proj.weight") ||
                  damp_ends_with(t->name, "routed_expert_up_proj.weight") || damp_ends_with(t->name, ".w2.weight")))
                continue;
            size_t n = (size_t)(t->end - t->begin) / 2;
            k3c_bf16 *v = malloc(n * 2);
            if (!v) rc = k3c_errorf("damp: out of memory");
            for (size_t k = 0; rc == K3C_OK && k < n; k++)
                v[k] = f32_to_bf16(factor * bf16_to_f32(((const k3c_bf16 *)t->data)[k]));
            if (rc == K3C_OK && (fseek(f, (long)(8 + hlen + t->begin), SEEK_SET) || fwrite(v, 2, n, f) != n))
                rc = k3c_errorf("damp: writing %s in %s", t->name, path);
            free(v);
        }
        if (f && fclose(f)) rc = k3c_errorf("damp: closing %s", path);
        k3c_st_close(&st);
        K3C_TRY(rc);
        if (found == 2) return K3C_OK;
    }
}

/* The tiny preset synthesized into dir with seed (dense: every expert routed, no discrete near-ties), then
 * made repetitive when damp > 0: the checkpoint the runner's and the scheduler's tests share. */
static inline int damp_tiny_checkpoint(const char *dir, uint64_t seed, int dense, float damp) {
    k3c_config c;
    K3C_TRY(k3c_preset_config("tiny", &c));
    if (dense) c.num_experts_per_token = c.num_experts;
    int rc = k3c_synth_write(&c, "tiny", seed, dir);
    k3c_config_free(&c);
    K3C_TRY(rc);
    return damp > 0 ? damp_residual_writes_in(dir, damp) : K3C_OK;
}

#endif
