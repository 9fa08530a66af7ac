/* k3c plan: what each rank of a parallel layout (TP, PP, DP, EP over hosts) holds and whether it fits, from
 * a config alone (k3c_layout_plan: no weights are read), and the bandwidth floor of a decode step per rank. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/commands.h"

/* The H200's memory as nvidia-smi lists it (143771 MiB), and its device copy rate measured by k3c bench
 * (docs/BENCHMARKS.md: 4225-4238 GB/s read + write, 2026-11-30): the defaults of the fit test and the floor. */
#define H200_MEM ((uint64_t)143771 << 20)
#define H200_COPY_GBPS 4200.0

static const char usage_text[] =
    "usage: k3c plan (--config FILE|DIR | --preset NAME) [--tp N] [--pp N] [--dp N] [--ep N] [--dcp N] [--hosts N]\n"
    "                [--gpu-mem BYTES] [--context N] [--requests N] [--kv-cache bf16|fp8] [--hbm GB/s]\n"
    "  per rank of tp x pp x dp ranks (TP inside a host, PP across hosts): weight bytes as published, the MLA\n"
    "  latent cache per token and for --requests x --context tokens per DP rank, the KDA slot bytes per\n"
    "  request, whether it fits in --gpu-mem (default 143771 MiB, an H200), and the floor of a decode step of\n"
    "  --requests rows at --hbm GB/s (default 4200, the H200's measured copy rate). --ep tp x dp places the\n"
    "  routed experts whole over a stage's ranks (else TP splits each expert's intermediate dimension).\n"
    "  --dcp N (a divisor of --tp): decode context parallel, the MLA cache sharded by position over N TP ranks\n"
    "  (each holds ceil(context / N) of a request's tokens): the MLA GB and MLA tok columns are the rank's share.\n";

static double gb(double bytes) { return bytes / 1e9; }

int cmd_plan(int argc, char **argv) {
    const char *config = NULL, *preset = NULL, *v;
    k3c_layout l = {.tp = 1, .pp = 1, .dp = 1, .ep = 1, .hosts = 1, .gpu_mem = H200_MEM, .context = 8192,
                    .requests = 1, .hbm_bytes_per_s = H200_COPY_GBPS * 1e9};
    for (int i = 1; i < argc; i++) {
        long x = 0;
        double d = 0;
        size_t bytes = 0;
        int bad = 0;
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            fputs(usage_text, stdout);
            return 0;
        } else if ((v = cli_option(argc, argv, &i, "--config"))) {
            bad = cli_str("--config", v);
            config = v;
        } else if ((v = cli_option(argc, argv, &i, "--preset"))) {
            bad = cli_str("--preset", v);
            preset = v;
        } else if ((v = cli_option(argc, argv, &i, "--tp"))) {
            bad = cli_int("--tp", v, 1, 4096, &x);
            l.tp = (int)x;
        } else if ((v = cli_option(argc, argv, &i, "--pp"))) {
            bad = cli_int("--pp", v, 1, 4096, &x);
            l.pp = (int)x;
        } else if ((v = cli_option(argc, argv, &i, "--dp"))) {
            bad = cli_int("--dp", v, 1, 4096, &x);
            l.dp = (int)x;
        } else if ((v = cli_option(argc, argv, &i, "--ep"))) {
            bad = cli_int("--ep", v, 1, 1 << 20, &x);
            l.ep = (int)x;
        } else if ((v = cli_option(argc, argv, &i, "--dcp"))) {
            bad = cli_int("--dcp", v, 1, 4096, &x);
            l.dcp = (int)x;
        } else if ((v = cli_option(argc, argv, &i, "--hosts"))) {
            bad = cli_int("--hosts", v, 1, 4096, &x);
            l.hosts = (int)x;
        } else if ((v = cli_option(argc, argv, &i, "--gpu-mem"))) {
            bad = cli_bytes("--gpu-mem", v, &bytes);
            l.gpu_mem = bytes;
        } else if ((v = cli_option(argc, argv, &i, "--context"))) {
            bad = cli_int("--context", v, 0, 1 << 30, &x);
            l.context = (int)x;
        } else if ((v = cli_option(argc, argv, &i, "--requests"))) {
            bad = cli_int("--requests", v, 1, 1 << 20, &x);
            l.requests = (int)x;
        } else if ((v = cli_option(argc, argv, &i, "--kv-cache"))) {
            bad = cli_str("--kv-cache", v);
            if (!bad && strcmp(v, "bf16") && strcmp(v, "fp8")) bad = cli_errorf("--kv-cache: '%s' is not bf16 or fp8", v);
            l.kv_fp8 = !bad && !strcmp(v, "fp8");
        } else if ((v = cli_option(argc, argv, &i, "--hbm"))) {
            bad = cli_float("--hbm", v, 0, 1e9, 1, &d);
            l.hbm_bytes_per_s = d * 1e9;
        } else {
            bad = cli_unexpected(argv[i]);
        }
        if (bad) {
            fprintf(stderr, "k3c plan: %s\n%s", cli_error(), usage_text);
            return 2;
        }
    }
    if (!config == !preset) {
        fprintf(stderr, "k3c plan: give --config or --preset (one of them)\n%s", usage_text);
        return 2;
    }
    long long ranks = (long long)l.tp * l.pp * l.dp;
    if (ranks > 1 << 20) {
        fprintf(stderr, "k3c plan: tp %d x pp %d x dp %d = %lld ranks, at most %d\n", l.tp, l.pp, l.dp, ranks, 1 << 20);
        return 2;
    }
    int world = (int)ranks, n = 0;
    k3c_layout_rank *r = calloc((size_t)world, sizeof *r);
    if (!r) {
        fprintf(stderr, "k3c plan: out of memory for %d ranks\n", world);
        return 1;
    }
    if (k3c_layout_plan(config, preset, &l, r, world, &n) != K3C_OK) {
        fprintf(stderr, "k3c plan: %s\n", cli_error());
        free(r);
        return 1;
    }
    printf("k3c plan: %s %s: tp %d x pp %d x dp %d = %d ranks on %d host%s (%d a host), routed experts %s\n",
           config ? "config" : "preset", config ? config : preset, l.tp, l.pp, l.dp, n, l.hosts,
           l.hosts == 1 ? "" : "s", n / l.hosts, l.ep > 1 ? "whole over each stage's ranks (ep)" : "split by TP");
    printf("caches: %d request%s x %d tokens per DP rank, MLA latent %s; GPU memory %.2f GB; decode floor of %d "
           "row%s per DP rank at %.0f GB/s (HBM bytes only, collectives not counted)\n",
           l.requests, l.requests == 1 ? "" : "s", l.context, l.kv_fp8 ? "fp8" : "bf16", gb((double)l.gpu_mem),
           l.requests, l.requests == 1 ? "" : "s", l.hbm_bytes_per_s / 1e9);
    if (l.dcp > 1)
        printf("decode context parallel: dcp %d, the MLA cache sharded by position over %d TP ranks (position p on "
               "DCP rank p %% %d): each rank holds %llu of the %llu MLA token positions, %d times the tokens per "
               "GB of cache of tp without dcp\n", l.dcp, l.dcp, l.dcp, (unsigned long long)r[0].mla_tokens,
               (unsigned long long)l.requests * (unsigned long long)l.context, l.dcp);
    printf("\n%4s %4s %3s %3s %3s %9s %16s %9s %8s %11s %9s %9s %9s %9s %9s %4s %9s\n", "rank", "host", "tp", "pp",
           "dp", "layers", "weight bytes", "weight GB", "MLA B/tok", "MLA tok", "MLA GB", "KDA MB/rq", "KDA GB",
           "total GB", "free GB", "fits", "floor ms");
    double step_ms = 0, stage_max = 0;
    int all_fit = 1;
    for (int i = 0; i < n; i++) {
        const k3c_layout_rank *k = &r[i];
        char layers[32];
        snprintf(layers, sizeof layers, "%d-%d", k->layer_first, k->layer_first + k->num_layers - 1);
        printf("%4d %4d %3d %3d %3d %9s %16llu %9.2f %8llu %11llu %9.2f %9.2f %9.2f %9.2f %9.2f %4s %9.3f\n", k->rank,
               k->host, k->tp_rank, k->pp_stage, k->dp_rank, layers, (unsigned long long)k->weight_bytes,
               gb((double)k->weight_bytes), (unsigned long long)k->mla_bytes_per_token,
               (unsigned long long)k->mla_tokens, gb((double)k->mla_cache_bytes),
               (double)k->kda_bytes_per_request / 1e6, gb((double)k->kda_bytes), gb((double)k->total_bytes),
               gb((double)l.gpu_mem - (double)k->total_bytes), k->fits ? "yes" : "NO", k->floor_ms);
        all_fit &= k->fits;
        if (k->floor_ms > stage_max) stage_max = k->floor_ms;
        if (i + 1 == n || r[i + 1].pp_stage != k->pp_stage) { /* a token passes the stages one after another */
            step_ms += stage_max;
            stage_max = 0;
        }
    }
    printf("\nfits: %s; decode step floor %.3f ms (%s), %.1f tokens/s per request at that floor\n",
           all_fit ? "every rank" : "NOT on every rank (fits NO above)", step_ms,
           l.pp > 1 ? "the slowest rank of each stage, stages in sequence" : "the slowest rank", 1e3 / step_ms);
    free(r);
    return cli_flush_stdout() ? 1 : 0;
}
