/* The public API (include/k3c.h): thin wrappers over the library's internal calls. */
#include "k3c.h"

#include "model/config.h"
#include "model/model.h"
#include "model/presets.h"
#include "model/synth.h"
#include "text/tokenizer.h"
#include "util/error.h"

const char *k3c_last_error(void) { return k3c_error_message(); }

int k3c_load(const char *dir, k3c_model **out) { return k3c_model_load(dir, out); }

void k3c_free(k3c_model *m) { k3c_model_free(m); }

int k3c_synthesize(const char *preset, uint64_t seed, const char *dir) {
    k3c_config c;
    K3C_TRY(k3c_preset_config(preset, &c));
    int rc = k3c_synth_write(&c, preset, seed, dir);
    k3c_config_free(&c);
    return rc;
}

int k3c_tokenizer_load_preset(const char *preset, k3c_tokenizer **out) {
    *out = NULL;
    k3c_config c;
    K3C_TRY(k3c_preset_config(preset, &c));
    int rc = k3c_tokenizer_default(c.family == K3C_FAMILY_K3, c.vocab_size, out);
    k3c_config_free(&c);
    return rc != K3C_OK ? k3c_error_context("preset %s", preset) : K3C_OK;
}
