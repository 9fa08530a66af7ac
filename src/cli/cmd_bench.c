/* k3c bench (cpu; --device cuda is bench_cuda.c): decode ms/token and prefill tokens/s of synthesized presets
 * (tiny, mini), each row printed as soon as it is measured, next to two limits measured in the same run:
 *
 * Decode against the memory bandwidth (a memcpy of a large buffer: bytes read + written per second, one
 * thread): the fraction of it a decode step reaches, (bytes one decode step must read) / time / bandwidth.
 * Bytes a decode step must read: every weight a token touches once (all bf16 matrices except the
 * embedding, of which one row is read, and of the routed experts only the k selected per MoE layer,
 * counted as k/E of the expert bytes), the KDA states (read and written, f32) and the MLA latent rows of
 * the context (at the backend's element size is not known here: counted as 4 bytes, the CPU layout).
 *
 * Prefill against the peak rate of the instruction the products run on, measured on one thread and on the
 * engine's threads at once: on a build for AVX512-BF16 the bf16 dot product (VDPBF16PS, 24 independent
 * chains per thread: the bf16 forward's products multiply in it, cpu/matmul.c), with the f32 FMA peak (24
 * chains of 16-lane FMAs) beside it; elsewhere the f32 FMA peak alone. A prompt of N tokens from a fresh
 * request, in steps of at most max_rows (256) tokens as generate feeds it, logits of the last row only, best
 * of --runs. GFLOP/s counts 2 flops per matrix weight each prompt token multiplies (every matrix except the
 * embedding and the LM head, routed experts at k/E); attention, the delta rule and the elementwise ops are
 * not counted, so the fraction is a lower bound of how busy the multiply units are.
 *
 * --model DIR measures a checkpoint folder instead of the presets (tools/llama-cpu-compare.sh: the same
 * weights as another engine), with the same rows. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli/commands.h"

#if defined(__AVX512BF16__) && defined(__AVX512F__)
#include <immintrin.h>
#define BENCH_DP 1 /* the library's products of bf16 activations run on VDPBF16PS (same build flags) */
#endif

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* CPU seconds of the whole process (all threads, spinning workers included): next to the wall time it shows
 * how much of the machine a run had on a shared host. */
static double cpu_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void bench_usage(FILE *f) {
    fprintf(f, "usage: k3c bench [--device cpu] [--preset tiny|mini | --model DIR] [--steps N] [--threads N]\n"
               "                 [--prefill 256,1024] [--runs N] [--tp N] [--rank-timeout S]\n"
               "       k3c bench --device cuda --preset NAME [--batches 1,2,4,8,16,32,64] [--verify 1,2,4,8] [--context N]\n"
               "                 [--steps N] [--tp N] [--pp N] [--dp N [--ep]] [--world-size N --rank R --rendezvous PATH]\n"
               "       k3c bench --prefix N [--device cpu|cuda] [--preset NAME] [--rounds R] [--threads N]\n"
               "cpu: without --preset both tiny and mini are measured (synthesized checkpoints), with --model DIR that\n"
               "checkpoint: decode (--steps timed steps, default 32), then a prompt of each --prefill length (tokens,\n"
               "default 256,1024; 0 = none), best of --runs (default 2); --tp N: on N tensor-parallel CPU ranks in this\n"
               "process (--threads, default one per core, shared among them; docs/PARALLEL.md)\n"
               "cuda: any preset (k3-slice, kimi-linear-48b, ...) as a device-synthetic model (weights generated in\n"
               "GPU memory); each request holds --context prefilled tokens (default 512); --steps timed decode\n"
               "steps per batch size (default 20, median reported); --verify: verify widths q per batch (default 1 =\n"
               "decode only; q > 1: verify q tokens, commit q - 1); --tp N: N tensor-parallel ranks, threads of this\n"
               "process (rank r on GPU r mod the visible GPUs) or one process per GPU (--world-size), each generating\n"
               "only its shard of the weights on its device; floor_ms is then rank 0's share; also --pp N and\n"
               "--dp N [--ep] (STEP rows only: the executor runs under tp only)\n"
               "--prefix: time to first token through the serving scheduler of requests sharing an N-token system\n"
               "prompt: prefix caching off, the first request (a miss), the R later ones (hits; default R = 5;\n"
               "preset default mini)\n"
               "bench measures model sizes, so without --model it runs synthesized presets, never the embedded\n"
               "default model that generate, chat and run use without --model\n");
}

/* bytes/s of memcpy (read + write) over a 256 MiB buffer, best of 5 */
static double memcpy_bandwidth(void) {
    size_t n = (size_t)256 << 20;
    char *a = malloc(n), *b = malloc(n);
    if (!a || !b) {
        free(a);
        free(b);
        return 0;
    }
    memset(a, 1, n);
    memset(b, 2, n);
    double best = 0;
    for (int r = 0; r < 5; r++) {
        double t = now_s();
        memcpy(r & 1 ? a : b, r & 1 ? b : a, n);
        t = now_s() - t;
        if (t > 0 && 2.0 * n / t > best) best = 2.0 * n / t;
    }
    volatile char sink = a[n / 2] + b[n / 3];
    (void)sink;
    free(a);
    free(b);
    return best;
}

/* The peak f32 FMA rate: each thread runs 24 independent chains of 16-lane a = a * m + c (the compiler
 * contracts them into FMAs, -ffp-contract=fast) for FMA_REPS rounds; flops / wall time, best of 3. */
typedef float fma_v16 __attribute__((vector_size(64)));
#define FMA_CHAINS 24
#define FMA_REPS 4000000L

static void *fma_loop(void *arg) {
    fma_v16 a[FMA_CHAINS], m = (fma_v16){0} + 1.0000001f, c = (fma_v16){0} + 1e-7f;
    for (int i = 0; i < FMA_CHAINS; i++) a[i] = (fma_v16){0} + (float)i;
    for (long r = 0; r < FMA_REPS; r++) {
#pragma GCC unroll 24
        for (int i = 0; i < FMA_CHAINS; i++) a[i] = a[i] * m + c;
    }
    fma_v16 s = {0};
    for (int i = 0; i < FMA_CHAINS; i++) s += a[i];
    *(float *)arg = s[0] + s[15]; /* keeps every chain live */
    return NULL;
}

#if defined(BENCH_DP)
/* The peak bf16 dot-product rate: each thread runs 24 independent chains of VDPBF16PS (32 multiply-adds of
 * bf16 pairs into 16 f32 lanes each) for FMA_REPS rounds; flops / wall time, best of 3. */
static void *dp_loop(void *arg) {
    __m512 a[FMA_CHAINS];
    __m512bh w = (__m512bh)_mm512_set1_epi16(0x3f80), x = (__m512bh)_mm512_set1_epi16(0x3300); /* 1, 3e-8 */
    for (int i = 0; i < FMA_CHAINS; i++) a[i] = _mm512_set1_ps((float)i);
    for (long r = 0; r < FMA_REPS; r++) {
#pragma GCC unroll 24
        for (int i = 0; i < FMA_CHAINS; i++) a[i] = _mm512_dpbf16_ps(a[i], w, x);
        __asm__ volatile("" : "+v"(x)); /* one operand opaque: the loop cannot be folded */
    }
    __m512 s = _mm512_setzero_ps();
    for (int i = 0; i < FMA_CHAINS; i++) s = _mm512_add_ps(s, a[i]);
    *(float *)arg = _mm512_reduce_add_ps(s);
    return NULL;
}
#endif

/* GFLOP/s of `threads` threads at once running loop (flops_rep per round), best of 3. */
static double loop_peak(int threads, void *(*loop)(void *), double flops_rep) {
    float sink[threads];
    pthread_t tid[threads];
    double best = 0;
    for (int rep = 0; rep < 3; rep++) {
        int started = 1;
        double t = now_s();
        for (int i = 1; i < threads; i++, started++)
            if (pthread_create(&tid[i], NULL, loop, &sink[i]) != 0) break;
        loop(&sink[0]);
        for (int i = 1; i < started; i++) pthread_join(tid[i], NULL);
        t = now_s() - t;
        double flops = flops_rep * FMA_REPS * started;
        if (t > 0 && flops / t > best) best = flops / t;
    }
    return best / 1e9;
}

static int online_cores(void) {
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}

static double decode_bytes(const k3c_model *m, int context) {
    k3c_model_info f;
    if (k3c_model_info_get(m, &f) != K3C_OK) return 0;
    double total = (double)f.weight_bytes;
    total -= (double)f.embedding_bytes;
    total += 2.0 * f.hidden_size;
    if (f.tie_word_embeddings) total += (double)f.embedding_bytes; /* the LM head reads it whole */
    double experts = f.num_experts > 0 ? (double)f.routed_expert_bytes * (1.0 - (double)f.num_experts_per_token /
                                                                                  f.num_experts)
                                       : 0;
    total += (double)f.num_kda_layers * 2.0 * f.kda_state_bytes;
    total += 2.0 * context * (double)f.mla_cache_bytes_per_token; /* f32 on the cpu: twice the bf16 bytes */
    return total - experts;
}

/* Matrix weights one prompt token multiplies: every matrix but the embedding and the LM head (which runs
 * for the last row of a step only), the routed experts at k/E. */
static double prefill_weights(const k3c_model *m) {
    k3c_model_info f;
    if (k3c_model_info_get(m, &f) != K3C_OK) return 0;
    /* params_active: routed experts at k/E, the embedding only as a tied LM head; minus the LM head */
    return f.params_active - (double)f.vocab_size * f.hidden_size;
}

/* One prompt of n tokens into a fresh request, in steps of at most max_rows tokens; seconds, < 0 on error.
 * *cpu: the process CPU seconds it took. */
static double prefill_once(k3c_engine *e, const int32_t *ids, int n, float *lg, double *cpu) {
    int id = -1, chunk = k3c_engine_max_rows(e);
    if (k3c_request_open(e, &id) != K3C_OK) return -1;
    double t = now_s(), c = cpu_s();
    for (int p = 0; p < n; p += chunk) {
        k3c_step_item it = {.request = id, .tokens = ids + p, .n = n - p < chunk ? n - p : chunk};
        if (k3c_engine_step(e, &it, 1, lg) != K3C_OK) {
            k3c_request_close(e, id);
            return -1;
        }
    }
    t = now_s() - t;
    *cpu = cpu_s() - c;
    k3c_request_close(e, id);
    return t;
}

/* The limits a prefill row is set against (GFLOP/s on the engine's threads): dp, the bf16 dot-product peak
 * (0 on a build without it), and fma, the f32 FMA peak. */
typedef struct bench_peaks {
    double dp, fma;
} bench_peaks;

/* One model's rows: the preset synthesized (dir NULL) or the checkpoint folder dir; name starts each row. */
static int bench_model(const char *name, const char *dir, const char *preset, const char *device, int threads,
                       const k3c_engine_options *par, int steps, double bw, const int *prefill, int nprefill, int runs, bench_peaks peak) {
    k3c_model *m = NULL;
    k3c_engine *e = NULL;
    int32_t *ids = NULL;
    int rc = K3C_ERR, id = -1, prompt = 16, longest = prompt;
    for (int i = 0; i < nprefill; i++)
        if (prefill[i] > longest) longest = prefill[i];
    printf("%-6s %s ...\n", name, dir ? "loading" : "synthesizing and loading");
    fflush(stdout);
    double t_load = now_s();
    if (cli_load_model(dir, preset, 1, &m) != K3C_OK) goto done;
    t_load = now_s() - t_load;
    k3c_model_info f;
    if (k3c_model_info_get(m, &f) != K3C_OK) goto done;
    printf("%-6s %s, %.1f M parameters, %.1f M active per token, %d threads\n", name, f.family, f.params_total / 1e6,
           f.params_active / 1e6, threads > 0 ? threads : online_cores());
    k3c_engine_options o;
    k3c_engine_options_default(&o);
    o.device = device;
    o.threads = threads;
    o.max_requests = 1;
    o.max_context = longest + steps + 1;
    o.layout = par->layout;
    o.rank_timeout_ms = par->rank_timeout_ms;
    if (k3c_engine_create(m, &o, &e) != K3C_OK) goto done;
    /* with ranks the bytes are every rank's together (each reads its shard), the bandwidth one thread's */
    char where[64];
    const k3c_layout *pl = &par->layout;
    if (k3c_engine_world_size(e) == 1) snprintf(where, sizeof where, "%s", device);
    else if (pl->pp <= 1 && pl->dp <= 1) snprintf(where, sizeof where, "%s tp%d", device, k3c_engine_world_size(e));
    else
        snprintf(where, sizeof where, "%s tp%dpp%ddp%d%s", device, pl->tp > 0 ? pl->tp : 1, pl->pp > 0 ? pl->pp : 1,
                 pl->dp > 0 ? pl->dp : 1, pl->ep > 1 ? "ep" : "");
    int V = k3c_engine_vocab(e);
    float *lg = malloc(sizeof(float) * V);
    ids = malloc(sizeof(int32_t) * longest);
    if (ids)
        for (int i = 0; i < longest; i++) ids[i] = (int32_t)((i * 7919 + 13) % V);
    if (!lg || !ids) {
        cli_errorf("out of memory");
        goto done;
    }
    if (k3c_request_open(e, &id) != K3C_OK) goto free_lg;
    k3c_step_item it = {.request = id, .tokens = ids, .n = prompt};
    if (k3c_engine_step(e, &it, 1, lg) != K3C_OK) goto free_lg;
    /* one warm-up decode step, then the timed ones (greedy feedback) */
    int32_t tok = ids[0];
    double t = 0;
    for (int s = 0; s <= steps; s++) {
        int best = 0;
        for (int v = 1; v < V; v++)
            if (lg[v] > lg[best]) best = v;
        tok = best;
        k3c_step_item d = {.request = id, .tokens = &tok, .n = 1};
        double t0 = now_s();
        if (k3c_engine_step(e, &d, 1, lg) != K3C_OK) goto free_lg;
        if (s > 0) t += now_s() - t0;
    }
    double ms = 1e3 * t / steps, bytes = decode_bytes(m, prompt + steps / 2);
    double reached = bytes / (t / steps);
    printf("%-6s %-5s decode %8.3f ms/token (%7.1f tok/s)  reads %8.2f MB/token  -> %7.2f GB/s = %5.1f%% of "
           "memcpy %.1f GB/s   [%s %.1f s]\n",
           name, where, ms, 1e3 / ms, bytes / 1e6, reached / 1e9, bw > 0 ? 100 * reached / bw : 0, bw / 1e9,
           dir ? "load" : "synth+load", t_load);
    fflush(stdout);
    k3c_request_close(e, id);
    id = -1;
    /* prefill: best of `runs` prompts (the first also warms the caches and the page tables) */
    double flops_tok = 2.0 * prefill_weights(m);
    for (int i = 0; i < nprefill; i++) {
        double best = -1, best_cpu = 0;
        for (int r = 0; r < runs; r++) {
            double cpu, s = prefill_once(e, ids, prefill[i], lg, &cpu);
            if (s < 0) goto free_lg;
            if (best < 0 || s < best) best = s, best_cpu = cpu;
        }
        double tps = prefill[i] / best, gf = tps * flops_tok / 1e9;
        char of[160];
        if (peak.dp > 0)
            snprintf(of, sizeof of, "%5.1f%% of the bf16 dot-product peak %.0f (%.1f%% of the f32 FMA peak %.0f)",
                     100 * gf / peak.dp, peak.dp, peak.fma > 0 ? 100 * gf / peak.fma : 0, peak.fma);
        else
            snprintf(of, sizeof of, "%5.1f%% of the f32 FMA peak %.0f", peak.fma > 0 ? 100 * gf / peak.fma : 0,
                     peak.fma);
        printf("%-6s %-5s prefill %5d tokens %8.1f ms (%7.1f tok/s)  %7.1f MFLOP/tok -> %6.1f GFLOP/s = %s   "
               "[process cpu %.2f s]\n",
               name, where, prefill[i], 1e3 * best, tps, flops_tok / 1e6, gf, of, best_cpu);
        fflush(stdout);
    }
    rc = K3C_OK;
free_lg:
    free(lg);
done:
    free(ids);
    if (e && id >= 0) k3c_request_close(e, id);
    k3c_engine_free(e);
    if (m) k3c_free(m);
    return rc;
}

int cmd_bench(int argc, char **argv) {
    const char *device = "cpu", *preset = NULL, *dir = NULL, *batches = NULL, *verify = NULL, *prefill_list = "256,1024";
    long steps = -1, threads = 0, context = 512, prefix = 0, rounds = 5, runs = 2;
    k3c_engine_options par; /* the parallel options (cpu ranks; cuda: --tp, --world-size) */
    k3c_engine_options_default(&par);
    for (int i = 1; i < argc; i++) {
        const char *v;
        int bad = 0;
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            bench_usage(stdout);
            return 0;
        } else if ((v = cli_option(argc, argv, &i, "--device"))) bad = cli_check_device(device = v);
        else if (cli_model_option(argc, argv, &i, &dir, &preset, &bad)) { /* bad on a bad value */ }
        else if ((v = cli_option(argc, argv, &i, "--batches"))) bad = cli_str("--batches", batches = v);
        else if ((v = cli_option(argc, argv, &i, "--verify"))) bad = cli_str("--verify", verify = v);
        else if ((v = cli_option(argc, argv, &i, "--context"))) bad = cli_int("--context", v, 1, 1 << 20, &context);
        else if ((v = cli_option(argc, argv, &i, "--steps"))) bad = cli_int("--steps", v, 1, 100000, &steps);
        else if ((v = cli_option(argc, argv, &i, "--threads"))) bad = cli_int("--threads", v, 0, 4096, &threads);
        else if ((v = cli_option(argc, argv, &i, "--prefill"))) bad = cli_str("--prefill", prefill_list = v);
        else if ((v = cli_option(argc, argv, &i, "--prefix"))) bad = cli_int("--prefix", v, 16, 1 << 20, &prefix);
        else if ((v = cli_option(argc, argv, &i, "--rounds"))) bad = cli_int("--rounds", v, 1, 63, &rounds);
        else if ((v = cli_option(argc, argv, &i, "--runs"))) bad = cli_int("--runs", v, 1, 1000, &runs);
        else if (cli_parallel_option(argc, argv, &i, &par, &bad)) { /* into par; bad on a bad value */ }
        else bad = cli_unexpected(argv[i]);
        if (bad) {
            fprintf(stderr, "k3c bench: %s\n", cli_error());
            bench_usage(stderr);
            return 2;
        }
    }
    if (cli_parallel_finish(&par)) {
        fprintf(stderr, "k3c bench: %s\n", cli_error());
        return 2;
    }
    int parallel = par.layout.tp > 1 || par.layout.pp > 1 || par.layout.dp > 1 || par.layout.ep > 1 || par.world_size;
    if (parallel && (prefix > 0 || (par.world_size && strcmp(device, "cuda") != 0))) {
        fprintf(stderr, "k3c bench: the parallel options run on bench --device cpu (CPU ranks in this process) or "
                        "--device cuda (--tp; --world-size: one process per rank), not with --prefix\n");
        return 2;
    }
    if (dir && (prefix > 0 || strcmp(device, "cpu"))) {
        fprintf(stderr, "k3c bench: --model %s: only the cpu rows (decode and prefill) measure a checkpoint folder; "
                        "--prefix and --device cuda take --preset\n", dir);
        bench_usage(stderr);
        return 2;
    }
    if (prefix > 0) {
        if (bench_prefix(preset ? preset : "mini", device, (int)threads, (int)prefix, (int)rounds) != K3C_OK) {
            fprintf(stderr, "k3c bench: --prefix: %s\n", cli_error());
            return 1;
        }
        return cli_flush_stdout() == 0 ? 0 : 1;
    }
    if (!strcmp(device, "cuda")) {
        if (!preset) {
            fprintf(stderr, "k3c bench: --device cuda needs --preset\n");
            bench_usage(stderr);
            return 2;
        }
        return bench_cuda(preset, batches, verify, (int)context, steps > 0 ? (int)steps : 20, &par);
    }
    if (batches || verify || (preset && strcmp(preset, "tiny") && strcmp(preset, "mini"))) {
        fprintf(stderr, "k3c bench: on the cpu only --preset tiny or mini, without --batches or --verify\n");
        bench_usage(stderr);
        return 2;
    }
    int32_t *prefill = NULL;
    int nprefill = 0;
    if (cli_parse_ids(prefill_list, &prefill, &nprefill) != 0) {
        fprintf(stderr, "k3c bench: --prefill '%s': expected prompt lengths in tokens, like 256,1024\n", prefill_list);
        return 2;
    }
    int np = 0;
    for (int i = 0; i < nprefill; i++) /* 0 = none; the engine's context bounds the rest */
        if (prefill[i] > 0) {
            if (prefill[i] > (1 << 20)) {
                fprintf(stderr, "k3c bench: --prefill %d: at most %d tokens\n", (int)prefill[i], 1 << 20);
                free(prefill);
                return 2;
            }
            prefill[np++] = prefill[i];
        }
    if (steps <= 0) steps = 32;
    double bw = memcpy_bandwidth();
    printf("memory bandwidth (memcpy 256 MiB, read + write, 1 thread): %.1f GB/s\n", bw / 1e9);
    fflush(stdout);
    int nt = threads > 0 ? (int)threads : online_cores();
    bench_peaks peak = {0, 0};
    double fma1 = loop_peak(1, fma_loop, 2.0 * 16 * FMA_CHAINS);
    peak.fma = nt > 1 ? loop_peak(nt, fma_loop, 2.0 * 16 * FMA_CHAINS) : fma1;
    printf("peak f32 FMA rate (24 chains of 16-lane FMAs per thread): %.1f GFLOP/s on 1 thread, %.1f on %d\n", fma1,
           peak.fma, nt);
#if defined(BENCH_DP)
    double dp1 = loop_peak(1, dp_loop, 2.0 * 32 * FMA_CHAINS);
    peak.dp = nt > 1 ? loop_peak(nt, dp_loop, 2.0 * 32 * FMA_CHAINS) : dp1;
    printf("peak bf16 dot-product rate (24 chains of VDPBF16PS per thread, what the products run on): %.1f GFLOP/s on "
           "1 thread, %.1f on %d\n",
           dp1, peak.dp, nt);
#endif
    fflush(stdout);
    int rc = 0;
    if (dir) {
        const char *name = dir + strlen(dir);
        while (name > dir && name[-1] == '/') name--;
        const char *end = name;
        while (name > dir && name[-1] != '/') name--;
        char label[256];
        snprintf(label, sizeof label, "%.*s", (int)(end - name), name);
        if (bench_model(label[0] ? label : dir, dir, NULL, device, (int)threads, &par, (int)steps, bw, (const int *)prefill,
                        np, (int)runs, peak) != K3C_OK) {
            fprintf(stderr, "k3c bench: %s: %s\n", dir, cli_error());
            rc = 1;
        }
    }
    const char *presets[2] = {preset ? preset : "tiny", preset ? NULL : "mini"};
    for (int i = 0; i < 2 && presets[i] && !dir; i++)
        if (bench_model(presets[i], NULL, presets[i], device, (int)threads, &par, (int)steps, bw, (const int *)prefill, np,
                        (int)runs, peak) != K3C_OK) {
            fprintf(stderr, "k3c bench: %s: %s\n", presets[i], cli_error());
            rc = 1;
            break;
        }
    free(prefill);
    return rc;
}
