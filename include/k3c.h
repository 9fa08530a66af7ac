/* k3c: an inference engine for Kimi K3 and the Kimi Linear family.
 *
 * The public API is a set of opaque handles: a model (config + loaded weights), and, on top of it, an
 * engine that runs steps. Front ends (the CLI, a server) use only this header. Every call returns 0 on
 * success or -1 with a message from k3c_last_error(). */
#ifndef K3C_H
#define K3C_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct k3c_model k3c_model;

/* The message of the last failed call on this thread. */
const char *k3c_last_error(void);

/* Loads a checkpoint directory (HF config.json + safetensors, sharded or not). */
int k3c_load(const char *dir, k3c_model **out);
void k3c_free(k3c_model *m);

/* Writes a synthetic checkpoint of a named preset (tiny, mini, kimi-linear-tiny, ...) to dir, in the
 * published layout, deterministic per seed. */
int k3c_synthesize(const char *preset, uint64_t seed, const char *dir);

#ifdef __cplusplus
}
#endif
#endif
