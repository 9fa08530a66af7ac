/* Rank lookup and the two merge loops. Both apply tiktoken's rule exactly: among the current adjacent
 * pairs, merge the one whose joined bytes have the lowest rank, the leftmost on a tie (a tie means the
 * same byte string at two places); a pair whose joined bytes are no token never merges. The scan loop is
 * tiktoken's (parts as an array, every pair rescanned after a merge); the heap loop keeps (rank, start)
 * entries with lazy deletion. An entry is stale exactly when its part's pair rank changed: a part's pair
 * only ever grows, so a byte string (and so a rank) never comes back to the same start. */
#include "text/bpe.h"

#include <stdlib.h>
#include <string.h>

#include "util/error.h"

#define NO_RANK UINT32_MAX

static inline uint64_t hash_bytes(const uint8_t *s, size_t n) {
    uint64_t h = 0x9E3779B97F4A7C15ull ^ (uint64_t)n;
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, s, 8);
        h = (h ^ w) * 0xBF58476D1CE4E5B9ull;
        h ^= h >> 31;
        s += 8, n -= 8;
    }
    uint64_t w = 0;
    memcpy(&w, s, n);
    h = (h ^ w) * 0x94D049BB133111EBull;
    h ^= h >> 29;
    h *= 0xBF58476D1CE4E5B9ull;
    return h ^ (h >> 32);
}

int k3c_bpe_index(k3c_bpe *bpe) {
    uint64_t size = 16;
    while (size < 2 * (uint64_t)bpe->n) size <<= 1;
    bpe->slots = calloc(size, sizeof *bpe->slots);
    if (!bpe->slots) return k3c_errorf("out of memory for the hash of %u tokens", bpe->n);
    bpe->mask = size - 1;
    for (uint32_t id = 0; id < bpe->n; id++) {
        const uint8_t *s = bpe->blob + bpe->off[id];
        size_t len = bpe->off[id + 1] - bpe->off[id];
        uint64_t h = hash_bytes(s, len), tag = h >> 32 << 32;
        for (uint64_t i = h & bpe->mask;; i = (i + 1) & bpe->mask) {
            uint64_t e = bpe->slots[i];
            if (!e) {
                bpe->slots[i] = tag | (id + 1);
                break;
            }
            uint32_t other = (uint32_t)e - 1;
            if ((e >> 32 << 32) == tag && bpe->off[other + 1] - bpe->off[other] == len &&
                !memcmp(bpe->blob + bpe->off[other], s, len))
                return k3c_errorf("tokens %u and %u have the same bytes", other, id);
        }
    }
    return K3C_OK;
}

void k3c_bpe_free(k3c_bpe *bpe) {
    free(bpe->blob);
    free(bpe->off);
    free(bpe->slots);
    memset(bpe, 0, sizeof *bpe);
}

int32_t k3c_bpe_rank(const k3c_bpe *bpe, const uint8_t *s, size_t len) {
    uint64_t h = hash_bytes(s, len), tag = h >> 32 << 32;
    for (uint64_t i = h & bpe->mask;; i = (i + 1) & bpe->mask) {
        uint64_t e = bpe->slots[i];
        if (!e) return -1;
        if ((e >> 32 << 32) != tag) continue;
        uint32_t id = (uint32_t)e - 1;
        if (bpe->off[id + 1] - bpe->off[id] == len && !memcmp(bpe->blob + bpe->off[id], s, len)) return (int32_t)id;
    }
}

static inline uint32_t rank_of(const k3c_bpe *bpe, const uint8_t *s, size_t len) {
    int32_t r = k3c_bpe_rank(bpe, s, len);
    return r < 0 ? NO_RANK : (uint32_t)r;
}

size_t k3c_bpe_scratch_words(size_t len) { return len <= K3C_BPE_SCAN_MAX ? 2 * (len + 1) : 10 * (len + 1); }

size_t k3c_bpe_merge_scan(const k3c_bpe *bpe, const uint8_t *piece, size_t len, int32_t *out, uint32_t *scratch) {
    /* parts: start[i] and the rank of the pair (part i, part i + 1); the last entry is the end sentinel */
    uint32_t *start = scratch, *rank = scratch + len + 1;
    size_t m = len + 1;
    for (size_t i = 0; i <= len; i++) start[i] = (uint32_t)i;
    for (size_t i = 0; i + 2 <= len; i++) rank[i] = rank_of(bpe, piece + i, 2);
    rank[len - 1] = NO_RANK;
    for (;;) {
        uint32_t best = NO_RANK;
        size_t at = 0;
        for (size_t i = 0; i + 1 < m; i++)
            if (rank[i] < best) best = rank[i], at = i;
        if (best == NO_RANK) break;
        /* parts[at + 1] is still there: the new pairs end at start[at + 2] (left) and start[at + 3] */
        if (at > 0) rank[at - 1] = at + 2 < m ? rank_of(bpe, piece + start[at - 1], start[at + 2] - start[at - 1]) : NO_RANK;
        rank[at] = at + 3 < m ? rank_of(bpe, piece + start[at], start[at + 3] - start[at]) : NO_RANK;
        memmove(start + at + 1, start + at + 2, (m - at - 2) * sizeof *start);
        memmove(rank + at + 1, rank + at + 2, (m - at - 2) * sizeof *rank);
        m--;
    }
    for (size_t i = 0; i + 1 < m; i++) out[i] = (int32_t)rank_of(bpe, piece + start[i], start[i + 1] - start[i]);
    return m - 1;
}

/* min-heap of (rank << 32 | start): the lowest rank first, then the leftmost start */
static void heap_push(uint64_t *h, size_t *n, uint64_t v) {
    size_t i = (*n)++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (h[p] <= v) break;
        h[i] = h[p];
        i = p;
    }
    h[i] = v;
}

static uint64_t heap_pop(uint64_t *h, size_t *n) {
    uint64_t top = h[0], v = h[--*n];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= *n) break;
        if (c + 1 < *n && h[c + 1] < h[c]) c++;
        if (v <= h[c]) break;
        h[i] = h[c];
        i = c;
    }
    if (*n) h[i] = v;
    return top;
}

size_t k3c_bpe_merge_heap(const k3c_bpe *bpe, const uint8_t *piece, size_t len, int32_t *out, uint32_t *scratch) {
    /* parts are named by their start byte: next[s] is the start of the following part (len at the end),
     * prev[s] the preceding one, rank[s] the rank of the pair (s, next[s]) or NO_RANK */
    uint32_t *next = scratch, *prev = scratch + len + 1, *rank = scratch + 2 * (len + 1);
    uint64_t *heap = (uint64_t *)(scratch + 3 * (len + 1) + ((len + 1) & 1));
    size_t hn = 0;
    for (size_t i = 0; i < len; i++) {
        next[i] = (uint32_t)i + 1;
        prev[i] = (uint32_t)i - 1; /* UINT32_MAX for the first */
        rank[i] = i + 1 < len ? rank_of(bpe, piece + i, 2) : NO_RANK;
        if (rank[i] != NO_RANK) heap_push(heap, &hn, (uint64_t)rank[i] << 32 | i);
    }
    while (hn) {
        uint64_t e = heap_pop(heap, &hn);
        uint32_t s = (uint32_t)e, r = (uint32_t)(e >> 32);
        if (rank[s] != r) continue;
        uint32_t gone = next[s], after = next[gone];
        rank[gone] = NO_RANK;
        next[s] = after;
        if (after < len) prev[after] = s;
        rank[s] = after < len ? rank_of(bpe, piece + s, next[after] - s) : NO_RANK;
        if (rank[s] != NO_RANK) heap_push(heap, &hn, (uint64_t)rank[s] << 32 | s);
        uint32_t p = prev[s];
        if (p != UINT32_MAX) {
            rank[p] = rank_of(bpe, piece + p, after - p);
            if (rank[p] != NO_RANK) heap_push(heap, &hn, (uint64_t)rank[p] << 32 | p);
        }
    }
    size_t n = 0;
    for (uint32_t s = 0; s < len; s = next[s]) out[n++] = (int32_t)rank_of(bpe, piece + s, next[s] - s);
    return n;
}

size_t k3c_bpe_encode(const k3c_bpe *bpe, const uint8_t *piece, size_t len, int32_t *out, uint32_t *scratch) {
    int32_t id = k3c_bpe_rank(bpe, piece, len);
    if (id >= 0) {
        out[0] = id;
        return 1;
    }
    if (len <= K3C_BPE_SCAN_MAX) return k3c_bpe_merge_scan(bpe, piece, len, out, scratch);
    return k3c_bpe_merge_heap(bpe, piece, len, out, scratch);
}
