/* Reading a small file (config.json, model.safetensors.index.json) whole into memory. */
#ifndef K3C_UTIL_FILE_H
#define K3C_UTIL_FILE_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Reads the regular file at path into a malloc'd buffer with a NUL after the last byte (*out; the caller
 * frees it) and its length (*len, the NUL not counted). Refuses a path that is not a regular file and a file
 * larger than max_bytes (a guard against reading an absurd file, not a format limit). K3C_ERR with a message
 * naming the path (and errno's text where a system call failed); *out and *len are untouched on failure. */
int k3c_read_file(const char *path, size_t max_bytes, char **out, size_t *len);

#ifdef __cplusplus
}
#endif

#endif
