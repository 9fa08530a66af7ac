/* k3c bench (cpu; --device cuda is bench_cuda.c): decode ms/token of synthesized presets (tiny, mini) next to the machine's memory bandwidth
 * measured in the same run (a memcpy of a large buffer: bytes read + written per second, one thread), and
 * the fraction of it a decode step reaches: (bytes one decode step must read) / time / bandwidth.
 *
 * Bytes a decode step must read: every weight a token touches once (all bf16 matrices except the
 * embedding, of which one row is read, and of the routed experts only the k selected per MoE layer,
 * counted as k/E of the expert bytes), the KDA states (read and written, f32) and the MLA latent rows of
 * the context (at the backend's element size is not known here: counted as 4 bytes, the CPU layout). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli/commands.h"

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void bench_usage(FILE *f) {
    fprintf(f, "usage: k3c bench [--device cpu] [--preset tiny|mini] [--steps N] [--threads N]\n"
               "       k3c bench --device cuda --preset NAME [--batches 1,2,4,8,16,32,64] [--verify 1,2,4,8] [--context N]\n"
               "                 [--steps N]\n"
               "       k3c bench --prefix N [--device cpu|cuda] [--preset NAME] [--rounds R] [--threads N]\n"
               "cpu: without --preset both tiny and mini are measured (synthesized checkpoints)\n"
               "cuda: any preset (k3-slice, kimi-linear-48b, ...) as a device-synthetic model (weights generated in\n"
               "GPU memory); each request holds --context prefilled tokens (default 512); --steps timed decode\n"
               "steps per batch size (default 20, median reported); --verify: verify widths q per batch (default 1 =\n"
               "decode only; q > 1: verify q tokens, commit q - 1)\n"
               "--prefix: time to first token through the serving scheduler of requests sharing an N-token system\n"
               "prompt: prefix caching off, the first request (a miss), the R later ones (hits; default R = 5;\n"
               "preset default mini)\n");
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

static int bench_preset(const char *preset, const char *device, int threads, int steps, double bw) {
    k3c_model *m = NULL;
    k3c_engine *e = NULL;
    int rc = K3C_ERR, id = -1, prompt = 16;
    double t_load = now_s();
    if (cli_load_model(NULL, preset, 1, &m) != K3C_OK) goto done;
    t_load = now_s() - t_load;
    k3c_engine_options o;
    k3c_engine_options_default(&o);
    o.device = device;
    o.threads = threads;
    o.max_requests = 1;
    o.max_context = prompt + steps + 1;
    if (k3c_engine_create(m, &o, &e) != K3C_OK) goto done;
    int V = k3c_engine_vocab(e);
    float *lg = malloc(sizeof(float) * V);
    int32_t ids[16];
    for (int i = 0; i < prompt; i++) ids[i] = (int32_t)((i * 7919 + 13) % V);
    if (!lg) {
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
           "memcpy %.1f GB/s   [synth+load %.1f s]\n",
           preset, device, ms, 1e3 / ms, bytes / 1e6, reached / 1e9, bw > 0 ? 100 * reached / bw : 0, bw / 1e9,
           t_load);
    rc = K3C_OK;
free_lg:
    free(lg);
done:
    if (e && id >= 0) k3c_request_close(e, id);
    k3c_engine_free(e);
    if (m) k3c_free(m);
    return rc;
}

int cmd_bench(int argc, char **argv) {
    const char *device = "cpu", *preset = NULL, *batches = NULL, *verify = NULL;
    long steps = -1, threads = 0, context = 512, prefix = 0, rounds = 5;
    for (int i = 1; i < argc; i++) {
        const char *v;
        int bad = 0;
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            bench_usage(stdout);
            return 0;
        } else if ((v = cli_option(argc, argv, &i, "--device"))) bad = cli_check_device(device = v);
        else if ((v = cli_option(argc, argv, &i, "--preset"))) bad = cli_str("--preset", preset = v);
        else if ((v = cli_option(argc, argv, &i, "--batches"))) bad = cli_str("--batches", batches = v);
        else if ((v = cli_option(argc, argv, &i, "--verify"))) bad = cli_str("--verify", verify = v);
        else if ((v = cli_option(argc, argv, &i, "--context"))) bad = cli_int("--context", v, 1, 1 << 20, &context);
        else if ((v = cli_option(argc, argv, &i, "--steps"))) bad = cli_int("--steps", v, 1, 100000, &steps);
        else if ((v = cli_option(argc, argv, &i, "--threads"))) bad = cli_int("--threads", v, 0, 4096, &threads);
        else if ((v = cli_option(argc, argv, &i, "--prefix"))) bad = cli_int("--prefix", v, 16, 1 << 20, &prefix);
        else if ((v = cli_option(argc, argv, &i, "--rounds"))) bad = cli_int("--rounds", v, 1, 63, &rounds);
        else bad = cli_unexpected(argv[i]);
        if (bad) {
            fprintf(stderr, "k3c bench: %s\n", cli_error());
            bench_usage(stderr);
            return 2;
        }
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
        return bench_cuda(preset, batches, verify, (int)context, steps > 0 ? (int)steps : 20);
    }
    if (batches || verify || (preset && strcmp(preset, "tiny") && strcmp(preset, "mini"))) {
        fprintf(stderr, "k3c bench: on the cpu only --preset tiny or mini, without --batches or --verify\n");
        bench_usage(stderr);
        return 2;
    }
    if (steps <= 0) steps = 32;
    double bw = memcpy_bandwidth();
    printf("memory bandwidth (memcpy 256 MiB, read + write, 1 thread): %.1f GB/s\n", bw / 1e9);
    const char *presets[2] = {preset ? preset : "tiny", preset ? NULL : "mini"};
    for (int i = 0; i < 2 && presets[i]; i++)
        if (bench_preset(presets[i], device, (int)threads, (int)steps, bw) != K3C_OK) {
            fprintf(stderr, "k3c bench: %s: %s\n", presets[i], cli_error());
            return 1;
        }
    return 0;
}
