/* Generation on one request: prompt prefill in chunks of at most max_rows tokens (cut on the engine's
 * invariance grid, k3c_engine_prompt_piece), then one decode step per
 * sampled token. Timing separates the prefill (up to and including the first sampled token's logits) from
 * the decode steps. Greedy generation steps through k3c_engine_step_greedy: where the specialized executor
 * runs a step only its token id comes back from the device. */
#include <stdlib.h>
#include <time.h>

#include "k3c.h"
#include "util/error.h"

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

int k3c_generate(k3c_engine *e, const int32_t *prompt, int n_prompt, int max_new, const k3c_sampling *s,
                 k3c_token_fn on_token, void *user, k3c_generate_stats *stats) {
    k3c_generate_stats st = {.prompt_tokens = n_prompt};
    if (stats) *stats = (k3c_generate_stats){0};
    if (!e) return k3c_errorf("generate: the engine is NULL");
    if (n_prompt <= 0 || !prompt)
        return k3c_errorf("generate: empty prompt (%d tokens%s)", n_prompt, prompt ? "" : ", NULL");
    if (max_new < 0) return k3c_errorf("generate: max_new %d is negative", max_new);
    static const k3c_sampling greedy_sampling = {.temperature = 0}; /* k3c.h: NULL sampling is greedy */
    if (!s) s = &greedy_sampling;
    int V = k3c_engine_vocab(e);
    /* page-locked (k3c_engine_logits_alloc): a pageable download can wait for the whole device inside the
     * driver, which TP ranks sharing a GPU must not do while a peer's collective spins */
    float *logits = k3c_engine_logits_alloc(e, 1);
    k3c_sampler *smp = NULL;
    int id = -1, rc = K3C_ERR;
    if (!logits) goto done; /* k3c_engine_logits_alloc said why */
    if (k3c_sampler_create(s, V, &smp) != K3C_OK || k3c_request_open(e, &id) != K3C_OK) goto done;
    int max_rows = k3c_engine_max_rows(e), greedy = s->temperature <= 0;
    int32_t next = 0; /* greedy: the token the last step chose */
    double t0 = now_s();
    for (int done_n = 0; done_n < n_prompt;) {
        /* cut where batch invariance allows (k3c.h); max_rows >= the grid, so n >= 1 */
        int n = k3c_engine_prompt_piece(e, done_n, n_prompt, max_rows);
        k3c_step_item it = {.request = id, .tokens = prompt + done_n, .n = n};
        if ((greedy ? k3c_engine_step_greedy(e, &it, 1, &next, logits) : k3c_engine_step(e, &it, 1, logits)) != K3C_OK)
            goto done;
        done_n += n;
    }
    st.prefill_seconds = now_s() - t0;
    double t1 = now_s();
    for (int i = 0; i < max_new; i++) {
        int32_t tok = greedy ? next : k3c_sampler_sample(smp, logits);
        st.generated++;
        if (on_token && on_token(user, tok)) break;
        if (i + 1 == max_new) break;
        k3c_step_item it = {.request = id, .tokens = &tok, .n = 1};
        if ((greedy ? k3c_engine_step_greedy(e, &it, 1, &next, logits) : k3c_engine_step(e, &it, 1, logits)) != K3C_OK)
            goto done;
    }
    st.decode_seconds = now_s() - t1;
    rc = K3C_OK;
done:
    if (id >= 0 && k3c_request_close(e, id) != K3C_OK && rc == K3C_OK) rc = K3C_ERR;
    k3c_sampler_free(smp);
    k3c_engine_logits_free(e, logits);
    if (stats) *stats = st;
    return rc;
}
