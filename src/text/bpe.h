/* Byte-level BPE over a tiktoken rank table: the rank of a byte string is both its token id and its
 * merge priority (tiktoken lib.rs `_byte_pair_merge`). */
#ifndef K3C_TEXT_BPE_H
#define K3C_TEXT_BPE_H

#include <stddef.h>
#include <stdint.h>

/* The ranks: token bytes by id, and an open-addressing hash from bytes to id built once at load. */
typedef struct k3c_bpe {
    uint8_t *blob;   /* every token's bytes, back to back */
    uint32_t *off;   /* [n + 1]: token id i is blob[off[i] .. off[i + 1]) */
    uint32_t n;      /* tokens (ranks 0 .. n - 1) */
    uint64_t *slots; /* [mask + 1]: (hash high 32 bits << 32) | (id + 1); 0 = empty */
    uint64_t mask;
} k3c_bpe;

/* Builds the hash over bpe->blob / off / n (already filled; ids in 0 .. n - 1, their byte strings
 * distinct); K3C_ERR on a duplicate (naming the two ids) or out of memory. */
int k3c_bpe_index(k3c_bpe *bpe);
void k3c_bpe_free(k3c_bpe *bpe);

/* The id of the byte string s[0 .. len), or -1. */
int32_t k3c_bpe_rank(const k3c_bpe *bpe, const uint8_t *s, size_t len);

/* Appends the ids of piece[0 .. len) (len >= 1) to out: the piece's own id when it is a token, else the
 * merges of tiktoken's `byte_pair_encode` (repeatedly the adjacent pair whose joined bytes have the lowest
 * rank, the leftmost among equal ranks). out has room for len ids; returns the count. Every single byte
 * must have a rank (checked at load). scratch: 2 * (len + 1) uint32 for pieces up to K3C_BPE_SCAN_MAX
 * bytes, else as k3c_bpe_scratch_words says. */
size_t k3c_bpe_encode(const k3c_bpe *bpe, const uint8_t *piece, size_t len, int32_t *out, uint32_t *scratch);

/* Pieces up to this many bytes merge by rescanning all pairs (tiktoken's own loop, fastest for the short
 * pieces of ordinary text); longer ones through a heap, O(n log n) instead of O(n^2). */
#define K3C_BPE_SCAN_MAX 64
/* uint32 words of scratch k3c_bpe_encode needs for a piece of len bytes. */
size_t k3c_bpe_scratch_words(size_t len);

/* The two merge loops, exposed so a test can hold them to each other on the same pieces. */
size_t k3c_bpe_merge_scan(const k3c_bpe *bpe, const uint8_t *piece, size_t len, int32_t *out, uint32_t *scratch);
size_t k3c_bpe_merge_heap(const k3c_bpe *bpe, const uint8_t *piece, size_t len, int32_t *out, uint32_t *scratch);

#endif
