/* k3c serve: the OpenAI-compatible server (src/server/). This file only parses the options. */
#include <stdio.h>
#include <string.h>

#include "cli/commands.h"
#include "server/server.h"

static void serve_usage(FILE *f) {
    fprintf(f,
            "usage: k3c serve [--model DIR | --preset NAME] [--served-model-name NAME] [--host 127.0.0.1] [--port 8000]\n"
            "                 [--device cpu|cuda] [--threads N] [--api-key KEY] [--max-seqs N]\n"
            "                 [--max-batched-tokens N] [--max-queue N] [--max-context N] [--memory-limit BYTES]\n"
            "                 [--kv-blocks N] [--spec D] [--scheduling-policy fcfs|priority] [--no-prefix-caching]\n"
            "                 [--snapshot-memory BYTES] [--snapshot-interval N] [--max-body BYTES] [--grace S]\n"
            "                 [--max-connections N] [--port-file PATH] [--exact-f32] [--tp N]\n"
            "                 [--rank R --world-size W --rendezvous PATH] [--rank-timeout S]\n"
            "endpoints: POST /v1/chat/completions, /v1/completions, /tokenize, /detokenize; GET /v1/models,\n"
            "  /health (503 until the model is loaded), /metrics (Prometheus, k3c: prefix), /version\n"
            "--max-seqs: requests running at once (default 32); --max-batched-tokens: tokens per step (512);\n"
            "  --max-queue: requests waiting before 429 (1024); --max-context: tokens one request may hold\n"
            "  (default 4096, or the model's context if shorter); --kv-blocks: MLA cache blocks of 16 tokens\n"
            "  (default: max-seqs full contexts; fewer makes the scheduler preempt); --spec D: prompt-lookup\n"
            "  drafts per verify; --scheduling-policy priority: requests' 'priority' (lower first) orders\n"
            "  admission and picks the preempted (default fcfs, which refuses a non-zero priority);\n"
            "  --snapshot-memory: KDA state snapshots the prefix cache may keep (default 256M);\n"
            "  --snapshot-interval N: a snapshot every N prefix grids of a prompt (default 1), besides the\n"
            "  prompt's last grid boundary and its shared prefix (docs/SERVING.md); --api-key: required\n"
            "  as 'Authorization: Bearer KEY' on /v1/; --max-body:\n"
            "  larger request bodies are refused with 413 (default 16M); --grace: seconds running requests\n"
            "  get after SIGTERM (default 10); --port 0 takes a free port (--port-file writes it);\n"
            "  --exact-f32: a diagnostic, activations kept in f32 (the engine's exact_f32)\n"
            CLI_PARALLEL_HELP
            "  (a rank other than 0 of a multi-process launch serves no HTTP: it follows rank 0's steps)\n"
            "without --model, the embedded default model (k3-fortune, served under that name) from a temporary\n"
            "  directory removed at exit; --preset NAME synthesizes that preset's random weights instead (one without weights on disk, such as kimi-linear-48b, has its\n"
            "  weights generated in device memory: --device cuda)\n");
}

static int load_model(const srv_config *c, k3c_model **m) {
    int rc = !c->model_dir && c->preset && !k3c_preset_has_weights(c->preset)
                 ? k3c_model_synthesize_device(c->preset, 0, m)
                 : cli_load_model(c->model_dir, c->preset, 0, m);
    if (rc == K3C_OK) return K3C_OK;
    srv_errorf("%s", cli_error());
    return K3C_ERR;
}

int cmd_serve(int argc, char **argv) {
    srv_config c = {
        .host = "127.0.0.1",
        .port = 8000,
        .device = "cpu",
        .max_seqs = 32,
        .max_batched_tokens = 512,
        .max_queue = 1024,
        .prefix_caching = 1,
        .max_body = (size_t)16 << 20,
        .grace_s = 10,
        .max_connections = 4096,
    };
    k3c_engine_options par; /* the parallel options */
    k3c_engine_options_default(&par);
    for (int i = 1; i < argc; i++) {
        const char *v;
        long l = 0;
        double d = 0;
        int bad = 0;
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            serve_usage(stdout);
            return 0;
        } else if (!strcmp(argv[i], "--no-prefix-caching")) c.prefix_caching = 0;
        else if (!strcmp(argv[i], "--exact-f32")) c.exact_f32 = 1;
        else if ((v = cli_option(argc, argv, &i, "--model"))) bad = cli_str("--model", c.model_dir = v);
        else if ((v = cli_option(argc, argv, &i, "--preset"))) bad = cli_str("--preset", c.preset = v);
        else if ((v = cli_option(argc, argv, &i, "--served-model-name"))) bad = cli_str("--served-model-name", c.served_name = v);
        else if ((v = cli_option(argc, argv, &i, "--host"))) bad = cli_str("--host", c.host = v);
        else if ((v = cli_option(argc, argv, &i, "--port"))) bad = cli_int("--port", v, 0, 65535, &l), c.port = (int)l;
        else if ((v = cli_option(argc, argv, &i, "--device"))) bad = cli_check_device(c.device = v);
        else if ((v = cli_option(argc, argv, &i, "--threads"))) bad = cli_int("--threads", v, 0, 4096, &l), c.threads = (int)l;
        else if ((v = cli_option(argc, argv, &i, "--api-key"))) bad = cli_str("--api-key", c.api_key = v);
        else if ((v = cli_option(argc, argv, &i, "--max-seqs"))) bad = cli_int("--max-seqs", v, 1, 65536, &l), c.max_seqs = (int)l;
        else if ((v = cli_option(argc, argv, &i, "--max-batched-tokens")))
            bad = cli_int("--max-batched-tokens", v, 1, 1 << 20, &l), c.max_batched_tokens = (int)l;
        else if ((v = cli_option(argc, argv, &i, "--max-queue"))) bad = cli_int("--max-queue", v, 1, 1 << 24, &l), c.max_queue = (int)l;
        else if ((v = cli_option(argc, argv, &i, "--max-context")))
            bad = cli_int("--max-context", v, 2, 1 << 30, &l), c.max_context = (int)l;
        else if ((v = cli_option(argc, argv, &i, "--memory-limit"))) bad = cli_bytes("--memory-limit", v, &c.memory_limit);
        else if ((v = cli_option(argc, argv, &i, "--kv-blocks"))) bad = cli_int("--kv-blocks", v, 1, 1 << 30, &l), c.kv_blocks = (int)l;
        else if ((v = cli_option(argc, argv, &i, "--spec"))) bad = cli_int("--spec", v, 0, 63, &l), c.spec = (int)l;
        else if ((v = cli_option(argc, argv, &i, "--scheduling-policy"))) {
            if (!strcmp(v, "fcfs") || !strcmp(v, "priority")) c.priority_policy = !strcmp(v, "priority");
            else bad = cli_errorf("--scheduling-policy: '%s' is not fcfs or priority", v);
        } else if ((v = cli_option(argc, argv, &i, "--snapshot-memory")))
            bad = cli_bytes("--snapshot-memory", v, &c.snapshot_bytes);
        else if ((v = cli_option(argc, argv, &i, "--snapshot-interval")))
            bad = cli_int("--snapshot-interval", v, 1, 1 << 20, &l), c.snapshot_interval = (int)l;
        else if ((v = cli_option(argc, argv, &i, "--max-body"))) bad = cli_bytes("--max-body", v, &c.max_body);
        else if ((v = cli_option(argc, argv, &i, "--grace"))) bad = cli_float("--grace", v, 0, 86400, 0, &d), c.grace_s = d;
        else if ((v = cli_option(argc, argv, &i, "--max-connections")))
            bad = cli_int("--max-connections", v, 1, 1 << 20, &l), c.max_connections = (int)l;
        else if ((v = cli_option(argc, argv, &i, "--port-file"))) bad = cli_str("--port-file", c.port_file = v);
        else if (cli_parallel_option(argc, argv, &i, &par, &bad)) { /* into par; bad on a bad value */ }
        else bad = cli_unexpected(argv[i]);
        if (!bad && c.model_dir && c.preset) bad = cli_errorf("--model and --preset: give one of them");
        if (bad) {
            fprintf(stderr, "k3c serve: %s\n", cli_error());
            serve_usage(stderr);
            return 2;
        }
    }
    if (cli_parallel_finish(&par)) {
        fprintf(stderr, "k3c serve: %s\n", cli_error());
        return 2;
    }
    c.layout = par.layout;
    c.rank = par.rank;
    c.world_size = par.world_size;
    c.rendezvous = par.rendezvous;
    c.rank_timeout_ms = par.rank_timeout_ms;
    /* no --model and no --preset: the embedded default model, from a temporary directory that lives as long
     * as the server (its tokenizer and chat template are read after the weights) */
    char dir[4096];
    int temp = !c.model_dir && !c.preset;
    if (temp) {
        if (cli_default_model_dir(dir, sizeof dir) != K3C_OK) {
            fprintf(stderr, "k3c serve: the embedded default model: %s\n", cli_error());
            return 1;
        }
        c.model_dir = dir;
        if (!c.served_name) c.served_name = "k3-fortune";
    }
    int rc = (c.rank > 0 ? srv_follow(&c, load_model) : srv_run(&c, load_model)) == 0 ? 0 : 1;
    if (temp) cli_default_model_dir_done();
    return rc;
}
