/* Rank lookup and the two merge loops. Both apply tiktoken's rule exactly: among the current adjacent
 * pairs, merge the one whose joined bytes have the lowest rank, the leftmost on a tie (a tie means the
 * same byte string at two places); a pair whose joined bytes are no token never merges. The scan loop is
 * tiktoken's (parts as an array, every pair rescanned after a merge); the heap loop keeps (rank, start)
 * entries with lazy deletion. An entry is stale exactly when its part's pair rank changed: a part's pair
 * only ever grows, so a byte string (and so a rank) never comes back to the same start.
 *
 * A merged part's id is the rank of the pair that made it (rank = id), so the loops carry ids along and
 * never look a part up again; single bytes and pairs of bytes come from direct tables, longer strings
 * from the hash. */
#include "text/bpe.h"

#include <stdlib.h>
#include <string.h>

#include "util/error.h"

#define NO_RANK UINT32_MAX

static inline uint64_t load64(const uint8_t *p) {
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}

static inline uint32_t load32(const uint8_t *p) {
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

static inline uint64_t mix(uint64_t h) {
    h ^= h >> 29;
    h *= 0xBF58476D1CE4E5B9ull;
    return h ^ (h >> 32);
}

/* Reads only s[0 .. n): short keys as two overlapping words (first and last), never past the end. */
static inline uint64_t hash_bytes(const uint8_t *s, size_t n) {
    uint64_t h = 0x9E3779B97F4A7C15ull ^ (uint64_t)n;
    if (n >= 8) {
        while (n > 16) {
            h = (h ^ load64(s)) * 0x94D049BB133111EBull;
            h ^= h >> 31;
            s += 8, n -= 8;
        }
        h = (h ^ load64(s)) * 0x94D049BB133111EBull;
        h = (h ^ load64(s + n - 8)) * 0xBF58476D1CE4E5B9ull;
    } else if (n >= 4) {
        h = (h ^ ((uint64_t)load32(s) << 32 | load32(s + n - 4))) * 0x94D049BB133111EBull;
    } else if (n) {
        h = (h ^ ((uint64_t)s[0] << 16 | (uint64_t)s[n / 2] << 8 | s[n - 1])) * 0x94D049BB133111EBull;
    }
    return mix(h);
}

/* s[0 .. min(n, 8)) as a little-endian word, zero above, reading nothing past s[n - 1] */
static inline uint64_t head_of(const uint8_t *s, size_t n) {
    if (n >= 8) return load64(s);
    if (n >= 4) return (uint64_t)load32(s) | (uint64_t)load32(s + n - 4) << (8 * (n - 4));
    uint64_t h = 0;
    for (size_t i = 0; i < n; i++) h |= (uint64_t)s[i] << (8 * i);
    return h;
}

static inline uint8_t tag_of(uint64_t h) { return (uint8_t)(0x80 | h >> 57); }

static int32_t hash_lookup(const k3c_bpe *bpe, const uint8_t *s, size_t len) {
    uint64_t h = hash_bytes(s, len), head = head_of(s, len);
    uint8_t tag = tag_of(h);
    for (uint64_t i = h & bpe->mask;; i = (i + 1) & bpe->mask) {
        uint8_t t = bpe->tags[i];
        if (!t) return -1;
        if (t != tag) continue;
        const k3c_bpe_slot *e = &bpe->slots[i];
        if (e->head != head || e->len != len) continue;
        uint32_t id = e->id_plus1 - 1;
        if (len <= 8 || !memcmp(bpe->blob + bpe->off[id] + 8, s + 8, len - 8)) return (int32_t)id;
    }
}

int k3c_bpe_index(k3c_bpe *bpe, int pairs, uint32_t dup[2]) {
    uint64_t size = 16;
    while (size < 2 * (uint64_t)bpe->n) size <<= 1;
    bpe->slots = calloc(size, sizeof *bpe->slots);
    bpe->tags = calloc(size, 1);
    if (!bpe->slots || !bpe->tags) return k3c_errorf("out of memory for the hash of %u tokens", bpe->n);
    bpe->mask = size - 1;
    for (uint32_t id = 0; id < bpe->n; id++) {
        const uint8_t *s = bpe->blob + bpe->off[id];
        size_t len = bpe->off[id + 1] - bpe->off[id];
        int32_t other = hash_lookup(bpe, s, len);
        if (other >= 0) {
            if (dup) dup[0] = (uint32_t)other, dup[1] = id;
            return k3c_errorf("tokens %d and %u have the same bytes", other, id);
        }
        uint64_t h = hash_bytes(s, len), i = h & bpe->mask;
        while (bpe->tags[i]) i = (i + 1) & bpe->mask;
        bpe->tags[i] = tag_of(h);
        bpe->slots[i] = (k3c_bpe_slot){head_of(s, len), id + 1, (uint32_t)len};
    }
    for (int b = 0; b < 256; b++) {
        uint8_t c = (uint8_t)b;
        bpe->byte_id[b] = hash_lookup(bpe, &c, 1);
    }
    if (pairs) {
        bpe->pair_id = malloc(sizeof *bpe->pair_id * 65536);
        if (!bpe->pair_id) return k3c_errorf("out of memory for the pair table");
        for (int i = 0; i < 65536; i++) bpe->pair_id[i] = -1;
        for (uint32_t id = 0; id < bpe->n; id++)
            if (bpe->off[id + 1] - bpe->off[id] == 2) {
                const uint8_t *s = bpe->blob + bpe->off[id];
                bpe->pair_id[s[0] << 8 | s[1]] = (int32_t)id;
            }
    }
    return K3C_OK;
}

void k3c_bpe_free(k3c_bpe *bpe) {
    free(bpe->blob);
    free(bpe->off);
    free(bpe->slots);
    free(bpe->tags);
    free(bpe->pair_id);
    memset(bpe, 0, sizeof *bpe);
}

int32_t k3c_bpe_rank(const k3c_bpe *bpe, const uint8_t *s, size_t len) {
    if (len == 1) return bpe->byte_id[s[0]];
    if (len == 2 && bpe->pair_id) return bpe->pair_id[s[0] << 8 | s[1]];
    return hash_lookup(bpe, s, len);
}

static inline uint32_t rank_of(const k3c_bpe *bpe, const uint8_t *s, size_t len) {
    int32_t r = k3c_bpe_rank(bpe, s, len);
    return r < 0 ? NO_RANK : (uint32_t)r;
}

size_t k3c_bpe_scratch_words(size_t len) { return len <= K3C_BPE_SCAN_MAX ? 3 * (len + 1) : 12 * (len + 1); }

size_t k3c_bpe_merge_scan(const k3c_bpe *bpe, const uint8_t *piece, size_t len, int32_t *out, uint32_t *scratch) {
    /* parts (one memmove per merge): start, the rank of the pair (part i, part i + 1), the part's own id;
     * the last entry is the end sentinel */
    typedef struct part {
        uint32_t start, rank, id;
    } part;
    part *p = (part *)scratch;
    size_t m = len + 1;
    for (size_t i = 0; i < len; i++)
        p[i] = (part){(uint32_t)i, i + 1 < len ? rank_of(bpe, piece + i, 2) : NO_RANK, (uint32_t)bpe->byte_id[piece[i]]};
    p[len] = (part){(uint32_t)len, NO_RANK, 0};
    for (;;) {
        uint32_t best = NO_RANK;
        size_t at = 0;
        for (size_t i = 0; i + 1 < m; i++)
            if (p[i].rank < best) best = p[i].rank, at = i;
        if (best == NO_RANK) break;
        /* p[at + 1] is still there: the new pairs end at p[at + 2] (left) and p[at + 3] */
        if (at > 0)
            p[at - 1].rank = at + 2 < m ? rank_of(bpe, piece + p[at - 1].start, p[at + 2].start - p[at - 1].start) : NO_RANK;
        p[at].rank = at + 3 < m ? rank_of(bpe, piece + p[at].start, p[at + 3].start - p[at].start) : NO_RANK;
        p[at].id = best;
        memmove(p + at + 1, p + at + 2, (m - at - 2) * sizeof *p);
        m--;
    }
    for (size_t i = 0; i + 1 < m; i++) out[i] = (int32_t)p[i].id;
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
     * prev[s] the preceding one, rank[s] the rank of the pair (s, next[s]) or NO_RANK, id[s] the part's id */
    uint32_t *next = scratch, *prev = scratch + len + 1, *rank = scratch + 2 * (len + 1), *id = scratch + 3 * (len + 1);
    uint64_t *heap = (uint64_t *)(scratch + 4 * (len + 1)); /* 4 (len + 1) words: 8-byte aligned */
    size_t hn = 0;
    for (size_t i = 0; i < len; i++) {
        next[i] = (uint32_t)i + 1;
        prev[i] = (uint32_t)i - 1; /* UINT32_MAX for the first */
        id[i] = (uint32_t)bpe->byte_id[piece[i]];
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
        id[s] = r;
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
    for (uint32_t s = 0; s < len; s = next[s]) out[n++] = (int32_t)id[s];
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
