/* The tokenizer of synthesized models: a 32 512-rank file trained by tools/tokenizer/make_goldens.py on
 * text Debian packages ship (src/text/data/default-32512.tiktoken, embedded below), cut to the first
 * vocab - slots ranks so that base ranks + special slots fill the model's vocabulary exactly where it
 * can (tiny: 768 + 256 = 1024), with the special slots of the model's family named as the published
 * checkpoints name them (spec tokenizer-chat.md 1.1). The same ranks and config are what `k3c synth`
 * writes beside the weights, so a synthesized directory and k3c_tokenizer_load_preset agree. */
#include <cjson/cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "text/tokenizer.h"
#include "util/error.h"

/* The rank file, embedded at build time (the Makefile makes this object depend on it). */
__asm__(".section .rodata\n"
        ".balign 16\n"
        ".global k3c_default_ranks_begin\n"
        ".hidden k3c_default_ranks_begin\n"
        "k3c_default_ranks_begin:\n"
        ".incbin \"src/text/data/default-32512.tiktoken\"\n"
        ".global k3c_default_ranks_end\n"
        ".hidden k3c_default_ranks_end\n"
        "k3c_default_ranks_end:\n"
        ".previous\n");
extern const char k3c_default_ranks_begin[], k3c_default_ranks_end[];

typedef struct named_slot {
    int offset; /* after the base ranks */
    const char *name;
} named_slot;

static const named_slot k2_names[] = {
    {0, "[BOS]"}, {1, "[EOS]"}, {2, "<|im_end|>"}, {3, "<|im_user|>"}, {4, "<|im_assistant|>"},
    {6, "<|start_header_id|>"}, {7, "<|end_header_id|>"}, {9, "[EOT]"}, {10, "<|im_system|>"},
    {11, "<|tool_calls_section_begin|>"}, {12, "<|tool_calls_section_end|>"}, {13, "<|tool_call_begin|>"},
    {14, "<|tool_call_argument_begin|>"}, {15, "<|tool_call_end|>"}, {17, "<|im_middle|>"},
    {18, "<|media_start|>"}, {19, "<|media_content|>"}, {20, "<|media_end|>"}, {21, "<|media_pad|>"},
    {22, "<think>"}, {23, "</think>"}, {254, "[UNK]"}, {255, "[PAD]"},
};
static const named_slot k3_names[] = {
    {0, "[BOS]"}, {1, "[EOS]"}, {2, "<|end_of_msg|>"}, {3, "<|open|>"}, {4, "<|close|>"}, {5, "<|sep|>"},
    {6, "[start_header_id]"}, {7, "[end_header_id]"}, {9, "[EOT]"}, {254, "[UNK]"}, {255, "[PAD]"},
};

/* The first n lines of the embedded file (its lines are ranks 0, 1, 2, ... in order). */
static size_t ranks_prefix(uint32_t n) {
    const char *p = k3c_default_ranks_begin, *end = k3c_default_ranks_end;
    for (uint32_t i = 0; i < n && p < end; i++) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        p = nl ? nl + 1 : end;
    }
    return (size_t)(p - k3c_default_ranks_begin);
}

static uint32_t embedded_ranks(void) {
    uint32_t n = 0;
    for (const char *p = k3c_default_ranks_begin; p < k3c_default_ranks_end; p++) n += *p == '\n';
    return n;
}

int k3c_tokenizer_default_files(int k3_layout, int32_t vocab, const char **ranks, size_t *ranks_len,
                                char **config) {
    int slots = k3_layout ? K3C_TOKENIZER_SLOTS_K3 : K3C_TOKENIZER_SLOTS_K2;
    *ranks = NULL;
    *config = NULL;
    if (vocab < slots + 256) return K3C_OK; /* no room for the 256 byte ranks: the model runs on ids */
    uint32_t avail = embedded_ranks(), n = (uint32_t)(vocab - slots) < avail ? (uint32_t)(vocab - slots) : avail;
    const named_slot *names = k3_layout ? k3_names : k2_names;
    size_t count = k3_layout ? sizeof k3_names / sizeof *k3_names : sizeof k2_names / sizeof *k2_names;
    cJSON *root = cJSON_CreateObject(), *added = cJSON_AddObjectToObject(root, "added_tokens_decoder");
    int ok = root && added;
    for (size_t i = 0; ok && i < count; i++) {
        char key[16];
        snprintf(key, sizeof key, "%u", n + (uint32_t)names[i].offset);
        cJSON *e = cJSON_AddObjectToObject(added, key);
        ok = e && cJSON_AddStringToObject(e, "content", names[i].name) && cJSON_AddFalseToObject(e, "lstrip") &&
             cJSON_AddFalseToObject(e, "normalized") && cJSON_AddFalseToObject(e, "rstrip") &&
             cJSON_AddFalseToObject(e, "single_word") && cJSON_AddTrueToObject(e, "special");
    }
    ok = ok && cJSON_AddStringToObject(root, "bos_token", "[BOS]") && cJSON_AddStringToObject(root, "eos_token", "[EOS]") &&
         cJSON_AddStringToObject(root, "pad_token", "[PAD]") && cJSON_AddStringToObject(root, "unk_token", "[UNK]") &&
         cJSON_AddStringToObject(root, "tokenizer_class", "TikTokenTokenizer");
    char *json = ok ? cJSON_Print(root) : NULL;
    cJSON_Delete(root);
    if (!json) return k3c_errorf("out of memory writing the default tokenizer's config");
    *ranks = k3c_default_ranks_begin;
    *ranks_len = ranks_prefix(n);
    *config = json;
    return K3C_OK;
}

static int slot_of(const named_slot *names, size_t count, const char *name) {
    for (size_t i = 0; i < count; i++)
        if (!strcmp(names[i].name, name)) return names[i].offset;
    return -1; /* unreachable: both tables name [BOS], [EOS] and [PAD] */
}

int k3c_tokenizer_default_ids(int k3_layout, int32_t vocab, int32_t *bos, int32_t *eos, int32_t *pad) {
    int slots = k3_layout ? K3C_TOKENIZER_SLOTS_K3 : K3C_TOKENIZER_SLOTS_K2;
    *bos = *eos = *pad = -1;
    if (vocab < slots + 256) return 0;
    uint32_t avail = embedded_ranks();
    if ((uint32_t)(vocab - slots) > avail) return 0; /* the specials would not end the vocabulary */
    const named_slot *names = k3_layout ? k3_names : k2_names;
    size_t count = k3_layout ? sizeof k3_names / sizeof *k3_names : sizeof k2_names / sizeof *k2_names;
    int32_t base = vocab - slots;
    *bos = base + slot_of(names, count, "[BOS]");
    *eos = base + slot_of(names, count, "[EOS]");
    *pad = base + slot_of(names, count, "[PAD]");
    return 1;
}

int k3c_tokenizer_default(int k3_layout, int32_t vocab, k3c_tokenizer **out) {
    *out = NULL;
    const char *ranks;
    size_t rlen;
    char *config;
    K3C_TRY(k3c_tokenizer_default_files(k3_layout, vocab, &ranks, &rlen, &config));
    if (!ranks) return k3c_errorf("a vocabulary of %d ids has no room for a tokenizer (256 byte ranks + %d special slots)",
                                  vocab, k3_layout ? K3C_TOKENIZER_SLOTS_K3 : K3C_TOKENIZER_SLOTS_K2);
    k3c_tokenizer_source src = {ranks,   rlen, "(embedded) tiktoken.model", config, strlen(config),
                                "(embedded) tokenizer_config.json", k3_layout ? K3C_TOKENIZER_SLOTS_K3 : K3C_TOKENIZER_SLOTS_K2};
    int rc = k3c_tokenizer_from_source(&src, out);
    cJSON_free(config);
    return rc;
}

/* path + ".tmp", written whole, then renamed: no half-written file under the real name */
static int write_atomic(const char *path, const char *data, size_t len) {
    char tmp[4200];
    if ((size_t)snprintf(tmp, sizeof tmp, "%s.tmp", path) >= sizeof tmp) return k3c_errorf("path too long: %s", path);
    FILE *f = fopen(tmp, "wb");
    if (!f) return k3c_errorf("cannot create %s: %s", tmp, strerror(errno));
    size_t put = fwrite(data, 1, len, f);
    int bad = put != len || fflush(f) != 0;
    if (fclose(f) != 0 || bad) {
        remove(tmp);
        return k3c_errorf("writing %s failed", tmp);
    }
    if (rename(tmp, path) != 0) {
        int e = errno;
        remove(tmp);
        return k3c_errorf("renaming %s to %s: %s", tmp, path, strerror(e));
    }
    return K3C_OK;
}

int k3c_tokenizer_write_default(const char *dir, int k3_layout, int32_t vocab) {
    const char *ranks;
    size_t rlen;
    char *config;
    K3C_TRY(k3c_tokenizer_default_files(k3_layout, vocab, &ranks, &rlen, &config));
    if (!ranks) return K3C_OK;
    char path[4096];
    int rc = K3C_OK;
    if ((size_t)snprintf(path, sizeof path, "%s/tiktoken.model", dir) >= sizeof path)
        rc = k3c_errorf("tokenizer: directory path too long: %.80s...", dir);
    if (rc == K3C_OK) rc = write_atomic(path, ranks, rlen);
    if (rc == K3C_OK) {
        snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
        size_t clen = strlen(config);
        config[clen] = '\n'; /* cJSON_Print leaves no newline at the end: one line more, in place of the NUL */
        rc = write_atomic(path, config, clen + 1);
    }
    cJSON_free(config);
    return rc;
}
