/* Helpers shared by the commands that run the model (generate, logits, bench): option parsing, token-id
 * lists, loading a checkpoint or synthesizing a preset into a temporary directory. */
#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/commands.h"
#include "model/config.h"
#include "model/presets.h"
#include "model/synth.h"
#include "util/error.h"

const char *cli_option(int argc, char **argv, int *i, const char *name) {
    size_t n = strlen(name);
    if (strncmp(argv[*i], name, n) != 0) return NULL;
    if (argv[*i][n] == '=') return argv[*i] + n + 1;
    if (argv[*i][n] != '\0') return NULL;
    if (*i + 1 >= argc) return NULL;
    return argv[++*i];
}

int cli_parse_int(const char *s, long lo, long hi, long *out) {
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || !*s || *end || v < lo || v > hi) return -1;
    *out = v;
    return 0;
}

int cli_parse_float(const char *s, double *out) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || !*s || *end || !isfinite(v)) return -1; /* strtod takes "nan" and "inf" */
    *out = v;
    return 0;
}

int cli_parse_ids(const char *s, int32_t **ids, int *n) {
    int cap = 16, cnt = 0;
    int32_t *v = malloc(sizeof *v * cap);
    if (!v) return -1;
    const char *p = s;
    while (*p) {
        char *end;
        errno = 0;
        long x = strtol(p, &end, 10);
        if (end == p || errno || x < 0 || x > INT32_MAX || (*end && *end != ',')) {
            free(v);
            return -1;
        }
        if (cnt == cap) {
            int32_t *nv = realloc(v, sizeof *v * (cap *= 2));
            if (!nv) {
                free(v);
                return -1;
            }
            v = nv;
        }
        v[cnt++] = (int32_t)x;
        p = *end ? end + 1 : end;
        if (*end == ',' && !*p) {
            free(v);
            return -1;
        }
    }
    if (cnt == 0) {
        free(v);
        return -1;
    }
    *ids = v;
    *n = cnt;
    return 0;
}

static void remove_tree(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *e;
    char path[4096 + 512];
    while ((e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        if ((size_t)snprintf(path, sizeof path, "%s/%s", dir, e->d_name) < sizeof path) unlink(path);
    }
    closedir(d);
    rmdir(dir);
}

/* k3c_synthesize with the progress line of k3c synth. */
static int cli_synthesize(const char *preset, uint64_t seed, const char *dir) {
    k3c_config c;
    K3C_TRY(k3c_preset_config(preset, &c));
    char what[128];
    snprintf(what, sizeof what, "synthesizing preset %s", preset);
    cli_synth_meter prog;
    cli_synth_progress_init(&prog, what);
    k3c_synth_options so = {.progress = cli_synth_progress, .progress_ctx = &prog};
    int rc = k3c_synth_write_opts(&c, preset, seed, dir, &so);
    k3c_config_free(&c);
    return rc;
}

int cli_load_model(const char *dir, const char *preset, uint64_t seed, k3c_model **m) {
    if (dir) return k3c_load(dir, m);
    const char *tmp = getenv("TMPDIR");
    char path[4096];
    snprintf(path, sizeof path, "%s/k3c-%s-XXXXXX", tmp && *tmp ? tmp : "/tmp", preset);
    if (!mkdtemp(path)) return k3c_errorf("cannot create a temporary directory %s: %s", path, strerror(errno));
    /* synth refuses a non-empty dir without its marker; the fresh dir is empty */
    int rc = cli_synthesize(preset, seed, path);
    if (rc == K3C_OK) rc = k3c_load(path, m);
    /* the loader maps the files; unlinking them keeps the mapping valid and leaves nothing behind */
    remove_tree(path);
    return rc;
}

int cli_check_device(const char *device) {
    return !strcmp(device, "cpu") || !strcmp(device, "cuda") ? 0 : -1;
}

int cli_engine_option(int argc, char **argv, int *i, k3c_engine_options *o, int *bad) {
    const char *v;
    long l = 0;
    if ((v = cli_option(argc, argv, i, "--device"))) {
        *bad = cli_check_device(v);
        o->device = v;
    } else if ((v = cli_option(argc, argv, i, "--threads"))) {
        *bad = cli_parse_int(v, 0, 4096, &l);
        o->threads = (int)l;
    } else if ((v = cli_option(argc, argv, i, "--kv-cache"))) {
        *bad = strcmp(v, "bf16") && strcmp(v, "fp8");
        o->kv_fp8 = !strcmp(v, "fp8");
    } else {
        return 0;
    }
    return 1;
}

int cli_sampling_option(int argc, char **argv, int *i, k3c_sampling *s, int *bad) {
    const char *v;
    double d = 0;
    long l = 0;
    if ((v = cli_option(argc, argv, i, "--temperature"))) {
        *bad = cli_parse_float(v, &d) || d < 0;
        s->temperature = (float)d;
    } else if ((v = cli_option(argc, argv, i, "--top-k"))) {
        *bad = cli_parse_int(v, 0, 1 << 30, &l);
        s->top_k = (int)l;
    } else if ((v = cli_option(argc, argv, i, "--top-p"))) {
        *bad = cli_parse_float(v, &d) || d <= 0 || d > 1;
        s->top_p = (float)d;
    } else if ((v = cli_option(argc, argv, i, "--seed"))) {
        *bad = cli_parse_int(v, 0, 0x7fffffffffffffffL, &l);
        s->seed = (uint64_t)l;
    } else {
        return 0;
    }
    return 1;
}
