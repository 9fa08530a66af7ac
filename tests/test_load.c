/* The CPU engine's load (cpu/resident.h): the mapped weights faulted in at init, counted, and reported with
 * bytes, seconds and GB/s on the progress line (models of 256 MB and more). The checkpoint: mini's config
 * written fast (tests/fast_checkpoint.h), 0.44 GB. */
#include <stdlib.h>
#include <string.h>

#include "fast_checkpoint.h"
#include "cpu/ops.h"
#include "cpu/resident.h"
#include "k3c.h"
#include "model/model.h"
#include "model/presets.h"
#include "test.h"
#include "util/file.h"

TEST(cpu_load_reports_gbs) {
    k3c_config c;
    CHECK_OK(k3c_preset_config("mini", &c));
    char dir[1024], log[1100], bin[1024], cmd[4096];
    snprintf(dir, sizeof dir, "%s/load-mini", test_tmpdir());
    CHECK_OK(fast_checkpoint_write(&c, dir));
    /* the bytes faulted in: every matrix and MXFP4 tensor of the inventory (vectors are owned f32 copies) */
    k3c_model *m = NULL;
    CHECK_OK(k3c_load(dir, &m));
    uint64_t want = 0;
    for (size_t i = 0; i < m->inventory.count; i++)
        if (m->inventory.specs[i].cls != K3C_TENSOR_VECTOR) want += k3c_tensor_spec_bytes(&m->inventory.specs[i]);
    k3c_pool *pool = k3c_pool_create(2);
    CHECK(pool);
    uint64_t bytes = 0;
    double secs = -1;
    CHECK_OK(k3c_cpu_make_resident(pool, m, &bytes, &secs));
    k3c_pool_free(pool);
    CHECKF(bytes == want && want > (256u << 20), "%llu bytes resident, expected %llu", (unsigned long long)bytes,
           (unsigned long long)want);
    CHECK(secs >= 0 && secs < 60);
    k3c_free(m);

    /* the CLI's line, as a user sees it */
    CHECK(test_k3c_binary(bin, sizeof bin));
    snprintf(log, sizeof log, "%s/load-mini.err", test_tmpdir());
    snprintf(cmd, sizeof cmd, "%s generate --model %s -n 1 --prompt-ids 1 --threads 2 >/dev/null 2>%s", bin, dir, log);
    CHECK(test_run_status(cmd) == 0);
    char *err = NULL;
    size_t len = 0;
    CHECK_OK(k3c_read_file(log, 1 << 20, &err, &len));
    char want_line[96];
    snprintf(want_line, sizeof want_line, "cpu: weights %.2f GB resident in ", want / 1e9);
    const char *at = strstr(err, want_line);
    CHECKF(at && strstr(at, " GB/s (2 threads"), "stderr lacks \"%s... GB/s\": %s", want_line, err);
    double s = -1, gbs = -1;
    CHECK(sscanf(at + strlen(want_line), "%lf s: %lf GB/s", &s, &gbs) == 2);
    /* the GB/s is bytes over the unrounded seconds: within the rounding of the printed %.3f */
    double lo = want / 1e9 / (s + 0.0005), hi = s > 0.0005 ? want / 1e9 / (s - 0.0005) : 1e30;
    CHECKF(s > 0 && gbs >= 0.99 * lo - 0.01 && gbs <= 1.01 * hi + 0.01, "%.3f s and %.2f GB/s for %.2f GB", s, gbs,
           want / 1e9);
    free(err);
    fast_checkpoint_remove(dir, c.num_layers);
    k3c_config_free(&c);
}
