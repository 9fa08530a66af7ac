/* Byte-level BPE over a tiktoken rank table: the rank of a byte string is both its token id and its
 * merge priority (tiktoken lib.rs `_byte_pair_merge`). */
#ifndef K3C_TEXT_BPE_H
#define K3C_TEXT_BPE_H

#include <stddef.h>
#include <stdint.h>

/* A hash slot: the token's first 8 bytes (zero-padded) and length kept in the slot, so a lookup of a
 * token of up to 8 bytes (most of them) touches one cache line. id_plus1 = 0: empty. */
typedef struct k3c_bpe_slot {
    uint64_t head;
    uint32_t id_plus1;
    uint32_t len;
} k3c_bpe_slot;

/* The ranks: token bytes by id, and an open-addressing hash from bytes to id built once at load. */
typedef struct k3c_bpe {
    uint8_t *blob;      /* every token's bytes, back to back */
    uint32_t *off;      /* [n + 1]: token id i is blob[off[i] .. off[i + 1]) */
    uint32_t n;         /* tokens (ranks 0 .. n - 1) */
    struct k3c_bpe_slot *slots; /* [mask + 1], open addressing */
    uint8_t *tags;              /* [mask + 1]: 0 empty, else 0x80 | 7 hash bits: most misses end here,
                                 * in a table 16x smaller than the slots */
    uint64_t mask;
    /* direct tables for the lookups a merge makes most (-1 = no token): one byte, and (with pairs) two */
    int32_t byte_id[256];
    int32_t *pair_id;   /* [65536] by b0 << 8 | b1, or NULL */
} k3c_bpe;

/* Builds the lookups over bpe->blob / off / n (already filled; ids in 0 .. n - 1, their byte strings
 * distinct): the hash, byte_id and, with pairs, the 256 KiB table of two-byte tokens; K3C_ERR on a
 * duplicate (the two ids in dup, when not NULL: the earlier first) or out of memory. */
int k3c_bpe_index(k3c_bpe *bpe, int pairs, uint32_t dup[2]);
void k3c_bpe_free(k3c_bpe *bpe);

/* The id of the byte string s[0 .. len), or -1. */
int32_t k3c_bpe_rank(const k3c_bpe *bpe, const uint8_t *s, size_t len);

/* Appends the ids of piece[0 .. len) (len >= 1) to out: the piece's own id when it is a token, else the
 * merges of tiktoken's `byte_pair_encode` (repeatedly the adjacent pair whose joined bytes have the lowest
 * rank, the leftmost among equal ranks). out has room for len ids; returns the count. Every single byte
 * must have a rank (checked at load). scratch: k3c_bpe_scratch_words(len) uint32, 8-byte aligned. */
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
