/* Test helper: the engine's shared prefix blocks and KDA snapshots on one device (the CPU suite runs it on
 * "cpu", test_gpu on "cuda"). Request A prefills 2 blocks and its slot is saved; request B opens on A's two
 * blocks and restores the snapshot; both then take the same 5 tokens, each alone in a step: their logits are
 * finite and bitwise equal (the same computation on the same state and cache rows), while a B' on the same
 * blocks without the restore (a zero KDA state) differs. The shared blocks keep a reference while any holder
 * is open and are free once every holder closed. */
#ifndef K3C_TESTS_SNAPSHOT_CASE_H
#define K3C_TESTS_SNAPSHOT_CASE_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "k3c.h"
#include "runtime/engine_internal.h"
#include "synth_preset.h"
#include "test.h"
#include "util/error.h"
#include "util/rng.h"

static inline void snapshot_case(const char *device) {
    char dir[512];
    snprintf(dir, sizeof dir, "%s/snapshot-%s", test_tmpdir(), device);
    CHECK_OK(test_synth_preset("tiny", 0, test_seed() ^ 0x5a, dir));
    k3c_model *m;
    CHECK_OK(k3c_load(dir, &m));
    k3c_engine_options o;
    k3c_engine_options_default(&o);
    o.device = device;
    o.threads = 2;
    o.max_requests = 3;
    o.max_context = 64;
    o.block_size = 16;
    k3c_engine *e;
    CHECK_OK(k3c_engine_create(m, &o, &e));
    int V = k3c_engine_vocab(e), total = k3c_engine_blocks_free(e);
    CHECK(k3c_engine_snapshot_bytes(e) > 0);
    CHECK_OK(k3c_engine_snapshots_reserve(e, 2));
    int32_t prompt[32], next[5];
    k3c_rng r;
    k3c_rng_seed(&r, test_seed() ^ 0x5b);
    for (int i = 0; i < 32; i++) prompt[i] = (int32_t)(k3c_rng_next(&r) % (uint64_t)V);
    for (int i = 0; i < 5; i++) next[i] = (int32_t)(k3c_rng_next(&r) % (uint64_t)V);
    float *la = k3c_engine_logits_alloc(e, 5), *lb = k3c_engine_logits_alloc(e, 5), *lc = k3c_engine_logits_alloc(e, 5);
    CHECK(la && lb && lc);
    for (int i = 0; i < 5 * V; i++) la[i] = lb[i] = lc[i] = NAN;
    int a, b, c;
    CHECK_OK(k3c_request_open(e, &a));
    k3c_step_item it = {.request = a, .tokens = prompt, .n = 32};
    CHECK_OK(k3c_engine_step(e, &it, 1, la));
    CHECK_OK(k3c_engine_snapshot_save(e, a, 1));
    int n;
    const int32_t *blocks = k3c_engine_request_blocks(e, a, &n);
    CHECK(blocks && n == 2);
    int32_t shared[2] = {blocks[0], blocks[1]};
    CHECK_OK(k3c_engine_request_open_prefix(e, shared, 2, &b));
    CHECK_OK(k3c_engine_snapshot_restore(e, b, 1));
    CHECK_OK(k3c_engine_request_open_prefix(e, shared, 2, &c)); /* no restore: a zero KDA state */
    CHECK(k3c_request_length(e, b) == 32 && k3c_engine_block_refs(e, shared[0]) == 3);
    k3c_step_item sa = {.request = a, .tokens = next, .n = 5, .all_logits = 1};
    k3c_step_item sb = {.request = b, .tokens = next, .n = 5, .all_logits = 1};
    k3c_step_item sc = {.request = c, .tokens = next, .n = 5, .all_logits = 1};
    CHECK_OK(k3c_engine_step(e, &sa, 1, la));
    CHECK_OK(k3c_engine_step(e, &sb, 1, lb));
    CHECK_OK(k3c_engine_step(e, &sc, 1, lc));
    int differs = 0;
    for (int i = 0; i < 5 * V; i++) {
        CHECKF(isfinite(la[i]) && memcmp(&la[i], &lb[i], sizeof(float)) == 0,
               "%s: logit %d: %.9g from the prefilled request, %.9g from the restored one", device, i, la[i], lb[i]);
        differs += la[i] != lc[i];
    }
    CHECKF(differs > 0, "%s: a request without the snapshot gave the same logits", device);
    CHECK_OK(k3c_request_close(e, a));
    CHECK(k3c_engine_block_refs(e, shared[0]) == 2 && k3c_engine_blocks_free(e) == total - 2 - 2 * 1);
    CHECK_OK(k3c_request_close(e, b));
    CHECK_OK(k3c_request_close(e, c));
    CHECK(k3c_engine_blocks_free(e) == total && k3c_engine_block_refs(e, shared[0]) == 0);
    CHECK(k3c_engine_request_open_prefix(e, shared, 2, &b) == K3C_ERR); /* free blocks are no prefix */
    CHECK(k3c_engine_snapshot_save(e, 0, 5) == K3C_ERR);              /* no request 0 open, no snapshot 5 */
    k3c_engine_logits_free(e, la);
    k3c_engine_logits_free(e, lb);
    k3c_engine_logits_free(e, lc);
    k3c_engine_free(e);
    k3c_free(m);
}

#endif
