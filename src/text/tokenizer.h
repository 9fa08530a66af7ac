/* Kimi's tokenizer (include/k3c.h, "tokenizer"): the internal side, for the loaders of embedded data
 * and the tests. */
#ifndef K3C_TEXT_TOKENIZER_H
#define K3C_TEXT_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

#include "k3c.h"

/* Special slots after the base ranks (spec tokenizer-chat.md 1.1). */
#define K3C_TOKENIZER_SLOTS_K2 258 /* Kimi Linear, K2: range(num_base, num_base + 256 + 2) */
#define K3C_TOKENIZER_SLOTS_K3 256

/* Kimi's encode: windows of this many code points, cut so that no run of str.isspace() (or of other)
 * characters is longer than the second number; every piece is encoded on its own. */
#define K3C_TOKENIZER_WINDOW 400000
#define K3C_TOKENIZER_RUN 25000

/* A tokenizer from the two files' contents. names label errors ("DIR/tiktoken.model"); slots 0 decides
 * from the names (K3's <|open|> / <|end_of_msg|> -> 256, else 258). */
typedef struct k3c_tokenizer_source {
    const char *ranks;       /* tiktoken.model text */
    size_t ranks_len;
    const char *ranks_name;
    const char *config;      /* tokenizer_config.json text */
    size_t config_len;
    const char *config_name;
    int slots;
} k3c_tokenizer_source;

int k3c_tokenizer_from_source(const k3c_tokenizer_source *src, k3c_tokenizer **out);

/* The tokenizer of synthesized models (tokenizer_default.c): the embedded trained ranks cut to
 * min(32 512, vocab - slots) and a tokenizer_config.json naming the family's specials (k3_layout: K3's 256
 * slots, else Kimi Linear's 258). *ranks points into the embedded data; *config is cJSON-allocated
 * (cJSON_free). Both NULL (K3C_OK) when vocab has no room for 256 byte ranks and the slots. */
int k3c_tokenizer_default_files(int k3_layout, int32_t vocab, const char **ranks, size_t *ranks_len, char **config);
int k3c_tokenizer_default(int k3_layout, int32_t vocab, k3c_tokenizer **out);
/* The ids the default tokenizer gives [BOS], [EOS] and [PAD] when it fills the vocabulary exactly (base ranks
 * + special slots == vocab: tiny, mini, kimi-linear-tiny): 1, and those ids, which `k3c synth` writes into
 * config.json so that the config and the tokenizer beside it agree. 0 (ids -1) where the vocabulary is larger
 * than the embedded ranks and the slots (a published model's vocabulary, whose config keeps its own ids) or too
 * small for a tokenizer. */
int k3c_tokenizer_default_ids(int k3_layout, int32_t vocab, int32_t *bos, int32_t *eos, int32_t *pad);
/* Writes DIR/tiktoken.model and DIR/tokenizer_config.json (each to a .tmp, then renamed); nothing when the
 * vocabulary has no room for a tokenizer. */
int k3c_tokenizer_write_default(const char *dir, int k3_layout, int32_t vocab);

/* The base ranks' table (for the merge tests). */
struct k3c_bpe;
const struct k3c_bpe *k3c_tokenizer_bpe(const k3c_tokenizer *t);

/* The pre-split pieces of valid UTF-8 s[0 .. n) (one subject): piece(ctx, start, end) for each in order;
 * fast = 0 asks PCRE2 for every match (the test holds the ASCII fast path to it). K3C_ERR when piece
 * returns non-zero or a search fails. */
int k3c_tokenizer_split(const k3c_tokenizer *t, const uint8_t *s, size_t n, int fast,
                        int (*piece)(void *ctx, size_t start, size_t end), void *ctx);

/* The chunk boundaries of Kimi's encode over valid UTF-8 text: calls piece(ctx, start, end) for every
 * piece in order (byte offsets); stops at and returns the first non-zero return. Exposed for the test. */
int k3c_tokenizer_chunks(const uint8_t *s, size_t len, size_t window, size_t run,
                         int (*piece)(void *ctx, size_t start, size_t end), void *ctx);

#endif
