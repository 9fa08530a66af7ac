/* k3c bench --device cuda: decode step time of the stock path on the GPU against its memory floor
 * (its bytes over the copy bandwidth), on a device-synthetic model (weights generated in GPU memory: no checkpoint).
 *
 * Per batch size b: each of b requests holds `context` prefilled tokens; after warm-up, every decode step
 * (one token per request, logits of every request downloaded, as the engine API does) is timed on the host
 * around k3c_engine_step, which ends with a stream sync; the median of `steps` steps is reported. Verify
 * widths q > 1 (--verify): every request verifies q tokens (logits of all q rows downloaded) and then commits
 * q - 1 of them (the KDA fold included in the timed step), as a speculative step that accepts all but one
 * draft would; the step's tokens/s counts the q verified tokens.
 *
 * Bytes the step must move: every non-expert weight once (all matrices and vectors except the routed
 * experts, the embedding counted as its b rows), the routed experts the step selects (distinct experts over
 * the batch, ESTIMATED as E (1 - (1 - k/E)^b) per MoE layer, i.e. uniform routing), the MLA latent cache
 * rows each request attends (read) and writes, each request's KDA state and conv window (read + written, f32).
 * Activations are not counted. Floor = bytes / copy bandwidth, the bandwidth of a 1 GiB device-to-device
 * cudaMemcpy measured in the same run (read + write bytes). The logits download (b x vocab floats into
 * k3c_engine_logits_alloc's page-locked memory; malloc'ed with K3C_BENCH_PAGEABLE=1, or where page-locked
 * memory is refused: the engine's warning on stderr says so) is inside the step time; its own time is
 * measured separately and printed (d2h_ms).
 *
 * The same engine runs both paths: k3c_engine_set_specialized(e, 0) for the STEP rows, 1 for SPEC and
 * SPECID (k3c_engine_step_greedy: token ids instead of logits); the warm-up steps let the engine capture
 * the shape's graph (the second step of a shape captures it), and a row whose timed steps did not all run
 * on the executor says so. On several ranks (--tp, --pp, --dp [--ep]: threads of this process or one process
 * per GPU) each rank shards the device-synthetic model and generates only its own tensors on its device; the
 * bytes and floor are rank 0's share (bytes_for), and with pp or dp only STEP rows run (the executor runs
 * under tp only). Uses include/k3c.h only. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli/commands.h"

#define PROF_STAMPED 5 /* K3C_CUDA_PROFILE=2: stamped specialized steps per shape (one sample each) */
#define PREPARED_Q_MAX 8 /* the executor's largest verify width (k3c.h: routing) */

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Read + write bytes per second of a 1 GiB device-to-device copy, best of 5 (0 where it fails). */
static double copy_bandwidth(void) {
    double bw = 0;
    return k3c_device_copy_bandwidth("cuda", &bw) == K3C_OK ? bw : 0;
}

/* K3C_BENCH_PAGEABLE=1: the logits go to malloc'ed memory (the engine API's any-buffer case, and this
 * bench before 2026-11-30) instead of k3c_engine_logits_alloc's page-locked buffer; an A/B of the download. */
static int bench_pageable(void) {
    const char *v = getenv("K3C_BENCH_PAGEABLE");
    return v && v[0] == '1';
}

/* Seconds of one device -> host copy of `bytes` (median of 5) into memory of the kind the steps' logits go to
 * (page-locked, or malloc'ed under K3C_BENCH_PAGEABLE=1), as the engine's logits download. */
static double d2h_seconds(size_t bytes) {
    double t = 0;
    return k3c_device_download_seconds("cuda", bytes, bench_pageable(), &t) == K3C_OK ? t : 0;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

typedef struct step_bytes {
    double dense, experts, kv, kda, distinct;
} step_bytes;

/* The layout a bench runs on (tp, pp, dp >= 1; ep 1 or tp x dp). */
typedef struct bench_layout {
    int tp, pp, dp, ep;
} bench_layout;

/* Bytes one decode step of batch b at mean context ctx must move (see the file comment); on several ranks the
 * share of rank 0 (about: the split's replicated vectors and, in the hybrid, its whole MoE side counted as
 * split): its stage's 1 / pp of the layers; its DP rank's ceil(b / dp) requests (the engine places the batch
 * least loaded first); the weights split tp ways and the routed experts, with EP, tp x dp ways, those of every
 * DP rank's rows reaching them; the KDA state split tp ways, the MLA latent cache replicated (its one KV head). */
static step_bytes bytes_for(const k3c_model_info *f, int b, int q, double ctx, const bench_layout *l) {
    step_bytes s = {0};
    int ep = l->ep > 1, br = (b + l->dp - 1) / l->dp;
    s.dense = (double)(f->weight_bytes - f->routed_expert_bytes);
    if (!f->tie_word_embeddings) s.dense += 2.0 * br * f->hidden_size - (double)f->embedding_bytes;
    double expert_layer = f->num_moe_layers > 0 ? (double)f->routed_expert_bytes / f->num_moe_layers : 0;
    double E = f->num_experts, k = f->num_experts_per_token;
    /* over the rows that reach the rank's experts: every DP rank's with EP, else its own */
    s.distinct = E > 0 ? E * (1.0 - pow(1.0 - k / E, (double)(ep ? b : br) * q)) : 0;
    s.experts = f->num_moe_layers * expert_layer * (E > 0 ? s.distinct / E : 0);
    double lat = f->kv_lora_rank + f->qk_rope_head_dim, P = (double)f->kda_num_heads * f->kda_head_dim;
    double state = (double)f->kda_state_bytes;
    double window = 3.0 * (f->kda_conv_kernel - 1) * P * 4;
    /* each request reads its cache once for its q rows (ctx + q positions) and writes q rows */
    s.kv = f->num_mla_layers * (br * (ctx + q) * lat * 2 + br * q * lat * 2);
    s.kda = f->num_kda_layers * (br * 2 * (state + window));
    s.dense /= (double)l->tp * l->pp;
    s.experts /= (double)(ep ? l->tp * l->dp : l->tp) * l->pp;
    s.kv /= l->pp;
    s.kda /= (double)l->tp * l->pp;
    return s;
}

static int parse_list(const char *s, int hi, int *b, int *n) {
    *n = 0;
    while (*s) {
        char *end;
        long v = strtol(s, &end, 10);
        if (end == s || v < 1 || v > hi || *n >= 16 || (*end && *end != ',')) return -1;
        b[(*n)++] = (int)v;
        s = *end ? end + 1 : end;
    }
    return *n > 0 ? 0 : -1;
}

/* Times warm + steps steps of b requests x q tokens (q = 1 decode, q > 1 verify + commit of q - 1) through
 * the engine on the path it is set to (k3c_engine_set_specialized); ids non-NULL: k3c_engine_step_greedy
 * (token ids instead of logits where the executor runs). *med: median step seconds, *ctx_mean: mean tokens
 * each request held before a timed step, *exec: timed steps the executor ran. */
static int time_steps(k3c_engine *e, const int *id, int b, int q, int warm, int steps, int V, float *lg,
                      int32_t *ids, double *t, double *med, double *ctx_mean, long *exec) {
    int32_t tok[64 * PREPARED_Q_MAX];
    k3c_step_item it[64];
    double ctx_sum = 0;
    k3c_engine_stats st;
    long exec0 = 0;
    for (int s = 0; s < warm + steps; s++) {
        for (int i = 0; i < b; i++) {
            for (int j = 0; j < q; j++) tok[i * q + j] = (int32_t)((s * 7919 + i * 104729 + j * 31 + 3) % V);
            it[i] = (k3c_step_item){.request = id[i], .tokens = &tok[i * q], .n = q, .verify = q > 1};
        }
        if (s >= warm)
            for (int i = 0; i < b; i++) ctx_sum += k3c_request_length(e, id[i]);
        if (s == warm) {
            k3c_engine_stats_get(e, &st);
            exec0 = st.executor_steps;
        }
        double a = now_s();
        if ((ids ? k3c_engine_step_greedy(e, it, b, ids, lg) : k3c_engine_step(e, it, b, lg)) != K3C_OK)
            return K3C_ERR;
        for (int i = 0; i < b && q > 1; i++)
            if (k3c_request_commit(e, id[i], q - 1) != K3C_OK) return K3C_ERR;
        double dt = now_s() - a;
        if (s >= warm) t[s - warm] = dt;
    }
    k3c_engine_stats_get(e, &st);
    *exec = st.executor_steps - exec0;
    qsort(t, (size_t)steps, sizeof *t, cmp_double);
    *med = t[steps / 2];
    *ctx_mean = ctx_sum / ((double)steps * b);
    return K3C_OK;
}

static void print_row(const char *path, const char *preset, const k3c_model_info *f, const bench_layout *l, int b,
                      int q, double med, double ctx, double bw) {
    step_bytes sb = bytes_for(f, b, q, ctx, l);
    double bytes = sb.dense + sb.experts + sb.kv + sb.kda;
    double floor_s = bw > 0 ? bytes / bw : 0;
    printf("%s %-11s %5d %2d %9.3f %9.3f %9.3f %9.3f %8.0f %10.1f %9.1f %9.3f\n", path, preset, b, q, med * 1e3,
           bytes / 1e9, floor_s * 1e3, med > 0 ? floor_s / med : 0, b * q / med, sb.distinct, (sb.kv + sb.kda) / 1e6,
           d2h_seconds(sizeof(float) * (size_t)b * q * f->vocab_size) * 1e3);
    fflush(stdout);
}

int bench_cuda(const char *preset, const char *batches_s, const char *verify_s, int context, int steps,
               const k3c_engine_options *par) {
    int batches[16], nb = 0, maxb = 0, qs[16], nq = 0, maxq = 0, qsum = 0, rc = 1;
    const k3c_layout *pl = &par->layout;
    bench_layout bl = {pl->tp > 1 ? pl->tp : 1, pl->pp > 1 ? pl->pp : 1, pl->dp > 1 ? pl->dp : 1,
                       pl->ep > 1 ? pl->ep : 1};
    int stock_only = bl.pp > 1 || bl.dp > 1; /* the executor runs under tp only */
    if (parse_list(batches_s ? batches_s : "1,2,4,8,16,32,64", 64, batches, &nb) != 0) {
        fprintf(stderr, "k3c bench: --batches wants a comma-separated list of 1..64\n");
        return 2;
    }
    if (parse_list(verify_s ? verify_s : "1", PREPARED_Q_MAX, qs, &nq) != 0) {
        fprintf(stderr, "k3c bench: --verify wants a comma-separated list of 1..%d\n", PREPARED_Q_MAX);
        return 2;
    }
    if (!k3c_has_cuda()) {
        fprintf(stderr, "k3c bench: %s: this build has no CUDA backend (built without nvcc)\n", preset);
        return 1;
    }
    for (int i = 0; i < nb; i++) maxb = batches[i] > maxb ? batches[i] : maxb;
    for (int i = 0; i < nq; i++) maxq = qs[i] > maxq ? qs[i] : maxq, qsum += qs[i] > 1 ? qs[i] - 1 : 1;
    const int warm = 3;
    k3c_model *m = NULL;
    k3c_model_info f;
    k3c_engine *e = NULL;
    float *lg = NULL;
    int32_t *ids = NULL;
    int id[64];
    double *t = NULL, ms1[2][16] = {{0}}; /* q = 1 step times per batch (stock, spec), for the RATIO lines */
    if (k3c_model_synthesize_device(preset, 1, &m) != K3C_OK || k3c_model_info_get(m, &f) != K3C_OK) goto fail;
    double bw = par->rank == 0 ? copy_bandwidth() : 0; /* rank 0 prints the rows */
    int V = f.vocab_size;
    char ranks[320] = "";
    int world = bl.tp * bl.pp * bl.dp;
    if (world > 1)
        snprintf(ranks, sizeof ranks, ", tp %d x pp %d x dp %d%s (%s; each rank generates its shard on its device; "
                 "floor_ms rank 0's share%s)", bl.tp, bl.pp, bl.dp, bl.ep > 1 ? " + ep" : "",
                 par->world_size > 0 ? "one process per rank" : "threads of this process",
                 stock_only ? "; the executor runs under tp only: STEP rows alone" : "");
    /* one process per rank: the others follow rank 0's steps and print nothing */
    if (par->rank == 0) {
        printf("bench %s: device cuda, device-synthetic weights %.2f GB, %d layers, context %d tokens per request, "
               "copy bandwidth %.0f GB/s (1 GiB D2D, read + write)%s\n",
               preset, f.weight_bytes / 1e9, f.num_layers, context, bw / 1e9, ranks);
        fflush(stdout);
    }

    k3c_engine_options o;
    k3c_engine_options_default(&o);
    o.device = "cuda";
    o.specialized = stock_only ? K3C_SPECIALIZED_OFF : K3C_SPECIALIZED_ON;
    o.layout = par->layout;
    o.world_size = par->world_size;
    o.rank = par->rank;
    o.rendezvous = par->rendezvous;
    o.rank_timeout_ms = par->rank_timeout_ms;
    o.max_requests = 64;
    int per_step = 512 / context > 0 ? 512 / context : 1;
    o.max_rows = per_step * context > 64 ? per_step * context : 64;
    if (o.max_rows < maxb * maxq) o.max_rows = maxb * maxq;
    /* every (batch, q) runs warm + steps stock steps, then as many specialized ones (SPEC) and as many
     * returning token ids (SPECID); each adds max(1, q - 1) tokens to every request */
    o.max_context = context + 3 * nb * (warm + steps) * qsum + (1 + PROF_STAMPED) * nb * nq * maxq + maxq +
                    8; /* + the profiled steps (K3C_CUDA_PROFILE: 1 stock and up to PROF_STAMPED specialized) */
    o.q_max = maxq;
    double t0 = now_s();
    if (k3c_engine_create(m, &o, &e) != K3C_OK) goto fail;
    if (k3c_engine_rank(e) > 0) { /* a rank of its own process: rank 0 leads every step */
        rc = cli_follow("bench", e);
        goto done;
    }
    fprintf(stderr, "engine ready in %.1f s\n", now_s() - t0);
    lg = bench_pageable() ? malloc(sizeof(float) * (size_t)o.max_rows * V) : k3c_engine_logits_alloc(e, o.max_rows);
    ids = malloc(sizeof(int32_t) * (size_t)maxb * context);
    t = malloc(sizeof(double) * (size_t)steps);
    if (!lg || !ids || !t) {
        cli_errorf("out of host memory");
        goto fail;
    }
    for (int i = 0; i < maxb * context; i++) ids[i] = (int32_t)(((uint64_t)i * 2654435761u + 17) % (uint64_t)V);
    /* prefill: per_step requests of `context` tokens per step */
    t0 = now_s();
    for (int i = 0; i < maxb; i++)
        if (k3c_request_open(e, &id[i]) != K3C_OK) goto fail;
    for (int i0 = 0; i0 < maxb; i0 += per_step) {
        k3c_step_item it[64];
        int n = 0;
        for (int i = i0; i < maxb && i < i0 + per_step; i++)
            it[n++] = (k3c_step_item){.request = id[i], .tokens = ids + (size_t)i * context, .n = context};
        if (k3c_engine_step(e, it, n, lg) != K3C_OK) goto fail;
    }
    double t_prefill = now_s() - t0;
    printf("prefill: %d requests x %d tokens in %.2f s (%.0f tok/s)\n", maxb, context, t_prefill,
           maxb * context / t_prefill);
    int profiling = k3c_engine_profile(e, K3C_PROFILE_QUERY, NULL, 0);
    if (profiling == 1 || profiling == 2) { /* GPU time per op of the prefill steps above (stock: always timed) */
        printf("PROF %s prefill: %d requests x %d tokens, %d a step\n", preset, maxb, context, per_step);
        if (k3c_engine_profile(e, K3C_PROFILE_REPORT_STOCK, stdout, t_prefill * 1e3) != K3C_OK ||
            k3c_engine_profile(e, K3C_PROFILE_RESET, NULL, 0) != K3C_OK)
            goto fail;
    }
    printf("%-16s %5s %2s %9s %9s %9s %9s %8s %10s %9s %9s\n", "STEP preset", "batch", "q", "step_ms", "GB_moved",
           "floor_ms", "of_floor", "tok/s", "experts_L", "kv+kda_MB", "d2h_ms");
    for (int bi = 0; bi < nb; bi++) {
        int b = batches[bi];
        for (int qi = 0; qi < nq; qi++) {
            int q = qs[qi];
            double med, ctx;
            long exec;
            if (k3c_engine_set_specialized(e, 0) != K3C_OK) goto fail;
            if (time_steps(e, id, b, q, warm, steps, V, lg, NULL, t, &med, &ctx, &exec) != K3C_OK) goto fail;
            print_row("STEP", preset, &f, &bl, b, q, med, ctx, bw);
            if (profiling == 1 || profiling == 2) { /* GPU time per op of one more stock step of this shape */
                double pmed, pctx;
                if (k3c_engine_profile(e, K3C_PROFILE_RESET, NULL, 0) != K3C_OK ||
                    time_steps(e, id, b, q, 0, 1, V, lg, NULL, t, &pmed, &pctx, &exec) != K3C_OK)
                    goto fail;
                printf("PROF %s batch %d q %d: one stock step\n", preset, b, q);
                if (k3c_engine_profile(e, K3C_PROFILE_REPORT_STOCK, stdout, pmed * 1e3) != K3C_OK ||
                    k3c_engine_profile(e, K3C_PROFILE_RESET, NULL, 0) != K3C_OK)
                    goto fail;
            }
            if (q == 1) ms1[0][bi] = med;
            if (q == 4 && ms1[0][bi] > 0) printf("RATIO %-10s %5d q=4/q=1 stock %.3f\n", preset, b, med / ms1[0][bi]);
            if (stock_only) continue;
            /* the same steps through the specialized executor (one captured graph per shape, captured by the
             * engine during the warm-up steps) */
            if (k3c_engine_set_specialized(e, 1) != K3C_OK) goto fail;
            if (time_steps(e, id, b, q, warm, steps, V, lg, NULL, t, &med, &ctx, &exec) != K3C_OK) goto fail;
            if (exec < steps) {
                printf("SPEC %-11s %5d %2d (rows %d: %ld of %d timed steps on the executor; not a prepared shape, "
                       "runs stock)\n", preset, b, q, b * q, exec, steps);
                continue;
            }
            print_row("SPEC", preset, &f, &bl, b, q, med, ctx, bw);
            int32_t row_ids[64 * PREPARED_Q_MAX];
            double imed, ictx;
            /* the same steps returning greedy token ids (what a greedy runner step downloads) */
            if (time_steps(e, id, b, q, warm, steps, V, lg, row_ids, t, &imed, &ictx, &exec) != K3C_OK) goto fail;
            print_row("SPECID", preset, &f, &bl, b, q, imed, ictx, bw);
            if (profiling == 3) { /* K3C_CUDA_PROFILE=3: one more greedy step (SPECID's), its graph replayed with
                                   * block stamps; the report against SPECID's median */
                double pmed, pctx;
                if (k3c_engine_profile(e, K3C_PROFILE_NEXT, NULL, 0) != K3C_OK ||
                    time_steps(e, id, b, q, 0, 1, V, lg, row_ids, t, &pmed, &pctx, &exec) != K3C_OK)
                    goto fail;
                printf("PROF %s batch %d q %d: one greedy specialized step replayed with block stamps: %.3f ms wall "
                       "(plain: SPEC %.3f, SPECID %.3f ms, medians above)\n", preset, b, q, pmed * 1e3, med * 1e3,
                       imed * 1e3);
                /* a shape without a report (its step did not run stamped) is said, not fatal to the others */
                if (k3c_engine_profile(e, K3C_PROFILE_REPORT_SPECIALIZED, stdout, imed * 1e3) != K3C_OK)
                    printf("PROF %s batch %d q %d: no block-stamp report: %s\n", preset, b, q, cli_error());
                fflush(stdout);
            } else if (profiling > 0) { /* K3C_CUDA_PROFILE=1: one more step of the specialized path, its launches run
                                  * eagerly; =2: PROF_STAMPED more, each replayed from a graph with a stamp after
                                  * every op */
                double pmed, pctx, pms = 0;
                int stamped = profiling == 2, nprof = stamped ? PROF_STAMPED : 1;
                if (k3c_engine_profile(e, K3C_PROFILE_RESET, NULL, 0) != K3C_OK) goto fail;
                for (int i = 0; i < nprof; i++) {
                    if (k3c_engine_profile(e, K3C_PROFILE_NEXT, NULL, 0) != K3C_OK ||
                        time_steps(e, id, b, q, 0, 1, V, lg, NULL, t, &pmed, &pctx, &exec) != K3C_OK)
                        goto fail;
                    pms += pmed * 1e3;
                }
                if (stamped)
                    printf("PROF %s batch %d q %d: %d specialized steps, each replayed from a graph with a time stamp "
                           "after every op (totals of the %d)\n", preset, b, q, nprof, nprof);
                else
                    printf("PROF %s batch %d q %d: one specialized step, run eagerly (not replayed)\n", preset, b, q);
                if (k3c_engine_profile(e, K3C_PROFILE_REPORT_SPECIALIZED, stdout, pms) != K3C_OK ||
                    k3c_engine_profile(e, K3C_PROFILE_RESET, NULL, 0) != K3C_OK)
                    goto fail;
            }
            if (q == 1) ms1[1][bi] = med;
            if (q == 4 && ms1[1][bi] > 0) printf("RATIO %-10s %5d q=4/q=1 spec  %.3f\n", preset, b, med / ms1[1][bi]);
        }
    }
    printf("(SPEC: the same steps replayed by the specialized decode executor, one graph per (rows, q) shape; "
           "q > 1: verify of q tokens + commit of q - 1, tok/s counts verified tokens; RATIO needs q=1 before "
           "q=4 in --verify; SPECID: the same steps returning greedy token ids, the arg-max taken on the device "
           "and 4 bytes a row downloaded instead of the logits (its d2h_ms column is still the logits' estimate))\n");
    printf("(experts_L: distinct routed experts per MoE layer, estimated E(1-(1-k/E)^(b q)); GB_moved: non-expert "
           "weights + those experts + KV/KDA state; the step time includes the logits download d2h_ms)\n");
    rc = 0;
    goto done;
fail:
    fprintf(stderr, "k3c bench: %s: %s\n", preset, cli_error());
done:
    if (bench_pageable()) free(lg);
    else if (e) k3c_engine_logits_free(e, lg);
    k3c_engine_free(e);
    if (m) k3c_free(m);
    free(ids);
    free(t);
    return rc;
}
