/* A checkpoint directory as HF publishes it: config.json, then either model.safetensors.index.json with its
 * shards, or a single model.safetensors. Tensors are mapped, never copied. */
#ifndef K3C_FORMAT_CHECKPOINT_H
#define K3C_FORMAT_CHECKPOINT_H

#include <stddef.h>

#include "format/safetensors.h"

/* model.safetensors.index.json, parsed. */
typedef struct k3c_index {
    char **names;          /* tensor names, sorted */
    int *shard_of;         /* per name: index into shard_files */
    size_t num_names;
    char **shard_files;    /* distinct file names, in first-seen order */
    int num_shards;
    unsigned long long total_size; /* metadata.total_size, 0 when absent */
} k3c_index;

/* Parses and validates an index (weight_map must be an object of string -> string; file names may not
 * contain '/' or ".."). `where` names the file in errors. */
int k3c_index_parse(const char *json, size_t len, const char *where, k3c_index *out);
void k3c_index_free(k3c_index *ix);

typedef struct k3c_checkpoint {
    char *dir;
    k3c_st_file *shards;
    int num_shards;
    /* name -> tensor, over all shards, sorted by name */
    const k3c_st_tensor **tensors;
    size_t num_tensors;
    unsigned long long file_bytes; /* sum of shard file sizes */
} k3c_checkpoint;

/* Opens every shard (index checked against the shard headers: every indexed name is in its shard, every
 * shard tensor is indexed, no name in two shards). */
int k3c_checkpoint_open(k3c_checkpoint *ck, const char *dir);
void k3c_checkpoint_close(k3c_checkpoint *ck);
const k3c_st_tensor *k3c_checkpoint_find(const k3c_checkpoint *ck, const char *name);
/* Position of name in ck->tensors, or -1 when absent. */
long k3c_checkpoint_index(const k3c_checkpoint *ck, const char *name);
/* Path of the shard whose header holds t (a record of ck->tensors), for messages; "?" for a foreign record. */
const char *k3c_checkpoint_shard_path(const k3c_checkpoint *ck, const k3c_st_tensor *t);

#endif
