/* A complete program against the installed library (include/k3c.h only): synthesizes the `tiny` preset
 * into a temporary directory (or loads the checkpoint given as argv[1]), prints what the model is,
 * generates a few greedy tokens on an engine and prints them, with the engine's routing counts.
 *
 *   cc examples/generate.c $(pkg-config --cflags --libs --static k3c) -o generate
 *   ./generate [CHECKPOINT_DIR] [--device cpu|cuda] [-n N]
 *
 * (`make example-check` does exactly that against a fresh `make install PREFIX=...`.) */
#define _POSIX_C_SOURCE 200809L /* mkdtemp */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <k3c.h>

/* The library's warnings and notes, tagged with their level (the default would print them to stderr). */
static void on_log(void *user, k3c_log_level level, const char *msg) {
    (void)user;
    fprintf(stderr, "[k3c %s] %s\n", k3c_log_level_name(level), msg);
}

static int on_token(void *user, int32_t token) {
    int *count = user;
    printf("%s%d", (*count)++ ? " " : "", token);
    fflush(stdout);
    return 0; /* nonzero would stop generation */
}

/* Removes the files of a flat directory, then the directory (what k3c_synthesize wrote). */
static void remove_dir(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *e;
    char path[4096 + 256];
    while ((e = readdir(d)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) {
            snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
            unlink(path);
        }
    closedir(d);
    rmdir(dir);
}

static int fail(const char *what) {
    /* the kind says whose the failure is: a server would answer K3C_ERROR_INPUT with a 4xx */
    fprintf(stderr, "generate: %s: %s (%s)\n", what, k3c_last_error(), k3c_error_kind_name(k3c_last_error_kind()));
    return 1;
}

int main(int argc, char **argv) {
    const char *dir = NULL, *device = "cpu";
    int n = 8;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--device") && i + 1 < argc) device = argv[++i];
        else if (!strcmp(argv[i], "-n") && i + 1 < argc) n = atoi(argv[++i]);
        else dir = argv[i];
    }
    if (strcmp(k3c_version(), K3C_VERSION_STRING) != 0) {
        fprintf(stderr, "generate: header %s, library %s\n", K3C_VERSION_STRING, k3c_version());
        return 1;
    }
    printf("k3c %s%s\n", k3c_version(), k3c_has_cuda() ? " (with cuda)" : "");
    k3c_set_log(on_log, NULL);

    char tmp[] = "/tmp/k3c-example-XXXXXX";
    if (!dir) {
        if (!mkdtemp(tmp)) {
            perror("mkdtemp");
            return 1;
        }
        if (k3c_synthesize("tiny", 7, tmp) != K3C_OK) {
            remove_dir(tmp);
            return fail("synthesize");
        }
    }
    k3c_model *m = NULL;
    int rc = k3c_load(dir ? dir : tmp, &m);
    if (!dir) remove_dir(tmp); /* the model maps the files: unlinked, the mapping stays valid */
    if (rc != K3C_OK) return fail("load");

    k3c_model_info info;
    if (k3c_model_info_get(m, &info) != K3C_OK) return fail("inspect");
    printf("%s: hidden %d, vocab %d, context %d, %d layers (%d KDA, %d MLA; %d MoE of %d experts, top-%d)\n",
           info.family, info.hidden_size, info.vocab_size, info.max_position_embeddings, info.num_layers,
           info.num_kda_layers, info.num_mla_layers, info.num_moe_layers, info.num_experts,
           info.num_experts_per_token);
    printf("schedule:");
    for (int l = 0; l < info.num_layers; l++)
        printf(" %s/%s", k3c_model_layer_attention(m, l) == K3C_LAYER_KDA ? "KDA" : "MLA",
               k3c_model_layer_ffn(m, l) == K3C_LAYER_MOE ? "moe" : "dense");
    printf("\n%.0f parameters (%.0f active per token), %.1f MB of weights, %llu cache bytes per token\n",
           (double)info.params_total, info.params_active, info.weight_bytes / 1e6,
           (unsigned long long)info.mla_cache_bytes_per_token);

    k3c_engine_options o;
    k3c_engine_options_default(&o);
    o.device = device;
    o.max_requests = 1;
    o.max_context = 64 + n;
    k3c_engine *e = NULL;
    if (k3c_engine_create(m, &o, &e) != K3C_OK) {
        k3c_free(m);
        return fail("engine");
    }
    int32_t prompt[] = {info.bos_token_id >= 0 ? info.bos_token_id : 1, 17, 42};
    k3c_sampling greedy = {.temperature = 0, .top_p = 1};
    k3c_generate_stats st;
    int count = 0;
    printf("tokens: ");
    rc = k3c_generate(e, prompt, 3, n, &greedy, on_token, &count, &st);
    printf("\n");
    if (rc == K3C_OK) {
        k3c_engine_stats es;
        k3c_engine_stats_get(e, &es);
        printf("%d tokens; %ld steps: %ld planned %s, %ld on the specialized executor (%s)\n", st.generated, es.steps,
               es.route_steps[1], k3c_route_name(1), es.executor_steps,
               es.specialized ? "built" : "none on this device");
    }
    k3c_engine_free(e);
    k3c_free(m);
    return rc == K3C_OK && count == n ? 0 : fail("generate");
}
