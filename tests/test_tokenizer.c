/* The tokenizer against Python tiktoken 0.14 (goldens from tools/tokenizer/make_goldens.py over five rank
 * files, every case id for id), and its parts against references written here from the definitions:
 * UTF-8 replacement from Unicode Table 3-7, the merges as a list of byte strings, the chunking rule as
 * tokenization_kimi.py states it. Plus loading errors, special layouts, the embedded default, threads
 * and the CLI. */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "test.h"
#include "text/bpe.h"
#include "text/tokenizer.h"
#include "text/utf8.h"
#include "util/error.h"
#include "util/file.h"
#include "util/rng.h"

#define FIX "tests/fixtures/tokenizer"

/* ------------------------------------------------------------------ golden file parsing ---- */

static int hexval(char c) {
    return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
}

/* Appends to a growing byte buffer. */
typedef struct bytes {
    uint8_t *p;
    size_t n, cap;
} bytes;

static int bytes_put(bytes *b, const uint8_t *s, size_t n) {
    if (b->cap - b->n < n) {
        size_t c = b->cap ? b->cap : 256;
        while (c - b->n < n) c *= 2;
        uint8_t *q = realloc(b->p, c);
        if (!q) return -1;
        b->p = q;
        b->cap = c;
    }
    if (s) memcpy(b->p + b->n, s, n);
    b->n += n;
    return 0;
}

/* Words of hex, each optionally `*N` (the word repeated N times). */
static int parse_hex_field(const char *s, const char *end, bytes *out) {
    while (s < end) {
        while (s < end && *s == ' ') s++;
        if (s >= end) break;
        size_t from = out->n;
        while (s + 1 < end && hexval(s[0]) >= 0 && hexval(s[1]) >= 0) {
            uint8_t b = (uint8_t)(hexval(s[0]) << 4 | hexval(s[1]));
            if (bytes_put(out, &b, 1)) return -1;
            s += 2;
        }
        long rep = 1;
        if (s < end && *s == '*') rep = strtol(s + 1, (char **)&s, 10);
        if (s < end && *s != ' ') return -1;
        size_t u = out->n - from;
        for (long r = 1; r < rep; r++) {
            if (bytes_put(out, NULL, u)) return -1; /* room first: the source moves with a realloc */
            memcpy(out->p + out->n - u, out->p + from, u);
        }
    }
    return 0;
}

/* Words `a` or `a,b,c*N`. */
static int parse_ids_field(const char *s, const char *end, k3c_tokens *out) {
    while (s < end) {
        while (s < end && *s == ' ') s++;
        if (s >= end) break;
        int32_t unit[32];
        int u = 0;
        for (;;) {
            char *e;
            long v = strtol(s, &e, 10);
            if (e == s || u == 32) return -1;
            unit[u++] = (int32_t)v;
            s = e;
            if (s < end && *s == ',') {
                s++;
                continue;
            }
            break;
        }
        long rep = 1;
        if (s < end && *s == '*') rep = strtol(s + 1, (char **)&s, 10);
        for (long r = 0; r < rep; r++)
            for (int k = 0; k < u; k++) {
                if (out->n == out->cap) {
                    size_t c = out->cap ? out->cap * 2 : 256;
                    int32_t *q = realloc(out->ids, c * sizeof *q);
                    if (!q) return -1;
                    out->ids = q;
                    out->cap = c;
                }
                out->ids[out->n++] = unit[k];
            }
    }
    return 0;
}

/* The tab-separated fields of one line: up to max of them, [start, end) each. */
static int split_tabs(const char *line, const char *end, const char **f, const char **fe, int max) {
    int n = 0;
    const char *s = line;
    while (n < max) {
        const char *t = memchr(s, '\t', (size_t)(end - s));
        f[n] = s;
        fe[n] = t ? t : end;
        n++;
        if (!t) break;
        s = t + 1;
    }
    return n;
}

typedef struct gcase {
    char name[64];
    bytes in;
} gcase;

static int load_cases(gcase **out, int *n) {
    char *text;
    size_t len;
    if (k3c_read_file(FIX "/cases.txt", 1 << 26, &text, &len) != K3C_OK) return -1;
    int cap = 0, cnt = 0;
    gcase *c = NULL;
    for (char *line = text; line < text + len;) {
        char *nl = memchr(line, '\n', (size_t)(text + len - line));
        char *end = nl ? nl : text + len;
        if (line[0] != '#' && end > line) {
            const char *f[3], *fe[3];
            if (split_tabs(line, end, f, fe, 3) != 3) goto bad;
            if (cnt == cap) {
                gcase *q = realloc(c, sizeof *c * (size_t)(cap = cap ? 2 * cap : 64));
                if (!q) goto bad;
                c = q;
            }
            memset(&c[cnt], 0, sizeof c[cnt]);
            snprintf(c[cnt].name, sizeof c[cnt].name, "%.*s", (int)(fe[0] - f[0]), f[0]);
            if (parse_hex_field(f[2], fe[2], &c[cnt].in)) goto bad;
            cnt++;
        }
        line = nl ? nl + 1 : end;
    }
    free(text);
    *out = c;
    *n = cnt;
    return 0;
bad:
    free(text);
    for (int i = 0; i < cnt; i++) free(c[i].in.p);
    free(c);
    return -1;
}

static const gcase *find_case(const gcase *c, int n, const char *name, size_t len) {
    for (int i = 0; i < n; i++)
        if (strlen(c[i].name) == len && !memcmp(c[i].name, name, len)) return &c[i];
    return NULL;
}

/* A tokenizer from a rank file and a config file (paths from the golden header). */
static int load_pair(const char *ranks_path, const char *config_path, int slots, k3c_tokenizer **t) {
    char *r = NULL, *c = NULL;
    size_t rl, cl;
    int rc = k3c_read_file(ranks_path, 1 << 26, &r, &rl);
    if (rc == K3C_OK) rc = k3c_read_file(config_path, 1 << 20, &c, &cl);
    if (rc == K3C_OK) {
        k3c_tokenizer_source src = {r, rl, ranks_path, c, cl, config_path, slots};
        rc = k3c_tokenizer_from_source(&src, t);
    }
    free(r);
    free(c);
    return rc;
}

static int run_golden(const char *name, const gcase *cases, int ncases, int *enc_eq, int *enc_n, int *dec_eq,
                      int *dec_n) {
    char path[256];
    snprintf(path, sizeof path, FIX "/%s.golden", name);
    char *text;
    size_t len;
    if (k3c_read_file(path, 1 << 26, &text, &len) != K3C_OK) {
        test_fail(__FILE__, __LINE__, "%s", k3c_error_message());
        return -1;
    }
    char ranks[256] = "", config[256] = "";
    int slots = 0, shown = 0;
    k3c_tokenizer *t = NULL;
    k3c_detokenizer *d = NULL;
    *enc_eq = *enc_n = *dec_eq = *dec_n = 0;
    for (char *line = text; line < text + len;) {
        char *nl = memchr(line, '\n', (size_t)(text + len - line));
        char *end = nl ? nl : text + len;
        *end = 0;
        if (!strncmp(line, "ranks ", 6)) snprintf(ranks, sizeof ranks, "%s", line + 6);
        if (!strncmp(line, "config ", 7)) snprintf(config, sizeof config, "%s", line + 7);
        if (!strncmp(line, "slots ", 6)) slots = atoi(line + 6);
        if ((line[0] == 'E' || line[0] == 'D') && line[1] == '\t' && !t) {
            if (load_pair(ranks, config, slots, &t) != K3C_OK || k3c_detokenizer_create(t, &d) != K3C_OK) {
                test_fail(__FILE__, __LINE__, "%s: %s", name, k3c_error_message());
                break;
            }
        }
        const char *f[5], *fe[5];
        if (line[0] == 'E' && line[1] == '\t' && split_tabs(line, end, f, fe, 4) == 4) {
            const gcase *gc = find_case(cases, ncases, f[1], (size_t)(fe[1] - f[1]));
            k3c_tokens want = {0}, got = {0};
            int ok = gc && !parse_ids_field(f[3], fe[3], &want) &&
                     k3c_tokenizer_encode(t, (const char *)gc->in.p, gc->in.n, f[2][0] == '1', &got) == K3C_OK &&
                     got.n == want.n && (!got.n || !memcmp(got.ids, want.ids, got.n * sizeof *got.ids));
            (*enc_n)++;
            *enc_eq += ok;
            if (!ok && shown++ < 3) {
                size_t k = 0;
                while (k < got.n && k < want.n && got.ids[k] == want.ids[k]) k++;
                fprintf(stderr, "  %s: encode %.*s (specials %c): %zu ids, tiktoken %zu; first difference at %zu: %d vs %d\n",
                        name, (int)(fe[1] - f[1]), f[1], f[2][0], got.n, want.n, k, k < got.n ? got.ids[k] : -1,
                        k < want.n ? want.ids[k] : -1);
            }
            k3c_tokens_free(&want);
            k3c_tokens_free(&got);
        } else if (line[0] == 'D' && line[1] == '\t' && split_tabs(line, end, f, fe, 5) == 5) {
            k3c_tokens ids = {0};
            bytes want_b = {0}, want_t = {0}, streamed = {0};
            char *got_b = NULL, *got_t = NULL;
            size_t lb = 0, lt = 0;
            int ok = !parse_ids_field(f[2], fe[2], &ids) && !parse_hex_field(f[3], fe[3], &want_b) &&
                     !parse_hex_field(f[4], fe[4], &want_t) &&
                     k3c_tokenizer_decode_bytes(t, ids.ids, ids.n, &got_b, &lb) == K3C_OK &&
                     k3c_tokenizer_decode(t, ids.ids, ids.n, &got_t, &lt) == K3C_OK && lb == want_b.n &&
                     !memcmp(got_b, want_b.p, lb) && lt == want_t.n && !memcmp(got_t, want_t.p, lt);
            /* the stream, one id at a time, joins to the same text; every piece is valid UTF-8 */
            for (size_t i = 0; ok && i <= ids.n; i++) {
                const char *s;
                size_t l;
                ok = (i < ids.n ? k3c_detokenizer_push(d, ids.ids[i], &s, &l) : k3c_detokenizer_finish(d, &s, &l)) ==
                         K3C_OK &&
                     k3c_utf8_valid((const uint8_t *)s, l) && k3c_detokenizer_pending(d) <= 3 &&
                     !bytes_put(&streamed, (const uint8_t *)s, l);
            }
            ok = ok && streamed.n == want_t.n && !memcmp(streamed.p, want_t.p, streamed.n);
            (*dec_n)++;
            *dec_eq += ok;
            if (!ok && shown++ < 3) fprintf(stderr, "  %s: decode %.*s differs\n", name, (int)(fe[1] - f[1]), f[1]);
            free(got_b);
            free(got_t);
            free(want_b.p);
            free(want_t.p);
            free(streamed.p);
            k3c_tokens_free(&ids);
        }
        line = nl ? nl + 1 : end;
    }
    k3c_detokenizer_free(d);
    k3c_tokenizer_free(t);
    free(text);
    return 0;
}

TEST(tokenizer_goldens) {
    static const char *files[] = {"bytes-gpt2", "train-512-rawbytes", "train-4096", "shuffled-2048", "default-32512"};
    gcase *cases;
    int ncases;
    CHECKF(load_cases(&cases, &ncases) == 0, "cannot read " FIX "/cases.txt: %s", k3c_error_message());
    int all_equal = 1;
    for (size_t i = 0; i < sizeof files / sizeof *files; i++) {
        int ee, en, de, dn;
        if (run_golden(files[i], cases, ncases, &ee, &en, &de, &dn) != 0) {
            all_equal = 0;
            break;
        }
        printf("  tokenizer goldens %-18s encode %d/%d equal, decode %d/%d equal (stream too)\n", files[i], ee, en, de, dn);
        all_equal &= ee == en && de == dn && en > 200 && dn > 20;
    }
    for (int i = 0; i < ncases; i++) free(cases[i].in.p);
    free(cases);
    CHECKF(all_equal, "a tokenizer golden differs from tiktoken (above)");
}

/* ---------------------------------------------------------------------------- UTF-8 ---- */

/* The code point ranges of well-formed sequences of each length (Table 3-7): [lo, hi], surrogates out. */
static int prefix_possible(const uint8_t *s, size_t k, size_t *need) {
    uint8_t b = s[0];
    size_t L = b < 0x80 ? 1 : (b & 0xE0) == 0xC0 ? 2 : (b & 0xF0) == 0xE0 ? 3 : (b & 0xF8) == 0xF0 ? 4 : 0;
    *need = L;
    if (!L || k > L) return 0;
    for (size_t i = 1; i < k; i++)
        if ((s[i] & 0xC0) != 0x80) return 0;
    /* the smallest and largest code point any completion of s[0 .. k) could encode */
    uint32_t lo = L == 1 ? b : (uint32_t)(b & (0x7F >> L)), hi = lo;
    for (size_t i = 1; i < L; i++) {
        uint32_t c = i < k ? (uint32_t)(s[i] & 0x3F) : 0;
        lo = lo << 6 | c;
        hi = hi << 6 | (i < k ? c : 0x3F);
    }
    static const uint32_t min_cp[5] = {0, 0, 0x80, 0x800, 0x10000}, max_cp[5] = {0, 0x7F, 0x7FF, 0xFFFF, 0x10FFFF};
    if (lo < min_cp[L]) lo = min_cp[L];
    if (hi > max_cp[L]) hi = max_cp[L];
    if (lo > hi) return 0;
    /* some value in [lo, hi] outside the surrogates */
    return lo < 0xD800 || hi > 0xDFFF;
}

static size_t ref_replace(const uint8_t *s, size_t n, uint8_t *out) {
    size_t i = 0, o = 0;
    while (i < n) {
        size_t k = 0, need = 0;
        for (size_t t = 1; t <= 4 && i + t <= n; t++) {
            size_t nd;
            if (prefix_possible(s + i, t, &nd)) k = t, need = nd;
            else break;
        }
        if (k && k == need) {
            memcpy(out + o, s + i, k);
            o += k;
            i += k;
        } else {
            out[o++] = 0xEF, out[o++] = 0xBF, out[o++] = 0xBD;
            i += k ? k : 1;
        }
    }
    return o;
}

TEST(tokenizer_utf8_replace) {
    k3c_rng r;
    k3c_rng_seed(&r, test_seed() ^ 0x7574663820ull);
    uint8_t in[64], want[256], got[256], streamed[256];
    for (int iter = 0; iter < 20000; iter++) {
        size_t n = 1 + k3c_rng_next(&r) % 24;
        for (size_t i = 0; i < n; i++) {
            /* bias toward the bytes that decide: leads, continuations, and the edges of their ranges */
            static const uint8_t pick[] = {0x41, 0x80, 0x8F, 0x90, 0x9F, 0xA0, 0xBF, 0xC0, 0xC1, 0xC2, 0xDF, 0xE0,
                                           0xE1, 0xEC, 0xED, 0xEE, 0xEF, 0xF0, 0xF1, 0xF3, 0xF4, 0xF5, 0xFF, 0x00};
            uint64_t v = k3c_rng_next(&r);
            in[i] = v & 1 ? pick[(v >> 8) % sizeof pick] : (uint8_t)(v >> 16);
        }
        size_t wn = ref_replace(in, n, want), gn = k3c_utf8_replace(in, n, got, 1, NULL);
        CHECKF(wn == gn && !memcmp(want, got, gn), "utf8 replace differs from the Table 3-7 reference (seed %llu, iter %d)",
               (unsigned long long)test_seed(), iter);
        CHECK(k3c_utf8_valid(got, gn));
        CHECK(k3c_utf8_valid(in, n) == (gn == n && !memcmp(in, got, n))); /* replacement only where ill-formed */
        /* streamed in random cuts: the same output */
        size_t at = 0, sn = 0, carry = 0;
        uint8_t buf[64];
        while (at < n) {
            size_t step = 1 + k3c_rng_next(&r) % 5;
            if (step > n - at) step = n - at;
            memcpy(buf + carry, in + at, step);
            at += step;
            size_t used;
            sn += k3c_utf8_replace(buf, carry + step, streamed + sn, 0, &used);
            CHECK(carry + step - used <= 3);
            memmove(buf, buf + used, carry + step - used);
            carry = carry + step - used;
        }
        sn += k3c_utf8_replace(buf, carry, streamed + sn, 1, NULL);
        CHECKF(sn == gn && !memcmp(streamed, got, gn), "streamed utf8 replace differs (iter %d)", iter);
    }
}

/* --------------------------------------------------------------------------- merges ---- */

static k3c_tokenizer *default_tokenizer(void) {
    k3c_tokenizer *t = NULL;
    if (k3c_tokenizer_load_preset("mini", &t) != K3C_OK) return NULL; /* all 32 512 ranks */
    return t;
}

/* An id lookup independent of bpe.c's hash: the tokens sorted by their bytes, binary search. */
typedef struct sorted_vocab {
    const k3c_tokenizer *t;
    int32_t *ids;
    int32_t n;
} sorted_vocab;

static const k3c_tokenizer *sort_t;
static int by_bytes(const void *a, const void *b) {
    size_t la, lb;
    const char *pa = k3c_tokenizer_token(sort_t, *(const int32_t *)a, &la), *pb = k3c_tokenizer_token(sort_t, *(const int32_t *)b, &lb);
    int c = memcmp(pa, pb, la < lb ? la : lb);
    return c ? c : (la > lb) - (la < lb);
}

static int32_t sorted_find(const sorted_vocab *v, const uint8_t *s, size_t n) {
    int32_t lo = 0, hi = v->n - 1;
    while (lo <= hi) {
        int32_t mid = (lo + hi) / 2;
        size_t l;
        const char *p = k3c_tokenizer_token(v->t, v->ids[mid], &l);
        int c = memcmp(p, s, l < n ? l : n);
        if (!c) c = (l > n) - (l < n);
        if (!c) return v->ids[mid];
        if (c < 0) lo = mid + 1;
        else hi = mid - 1;
    }
    return -1;
}

/* The merge rule from its statement: parts as byte strings; merge the adjacent pair of lowest rank,
 * the leftmost on a tie, until no adjacent pair is a token. */
static size_t ref_merge(const sorted_vocab *v, const uint8_t *p, size_t n, int32_t *out) {
    size_t *st = malloc(sizeof *st * (n + 1)), m = n + 1; /* m part starts, the last one the end */
    for (size_t i = 0; i <= n; i++) st[i] = i;
    for (;;) {
        int32_t best = -1;
        size_t at = 0;
        for (size_t i = 0; i + 2 < m; i++) {
            int32_t r = sorted_find(v, p + st[i], st[i + 2] - st[i]);
            if (r >= 0 && (best < 0 || r < best)) best = r, at = i;
        }
        if (best < 0) break;
        memmove(st + at + 1, st + at + 2, (m - at - 2) * sizeof *st);
        m--;
    }
    for (size_t i = 0; i + 1 < m; i++) out[i] = sorted_find(v, p + st[i], st[i + 1] - st[i]);
    free(st);
    return m - 1;
}

TEST(tokenizer_bpe_merges) {
    k3c_tokenizer *t = default_tokenizer();
    CHECKF(t, "%s", k3c_error_message());
    sorted_vocab sv = {t, malloc(sizeof(int32_t) * (size_t)k3c_tokenizer_num_base(t)), k3c_tokenizer_num_base(t)};
    CHECK(sv.ids);
    for (int32_t i = 0; i < sv.n; i++) sv.ids[i] = i;
    sort_t = t;
    qsort(sv.ids, (size_t)sv.n, sizeof *sv.ids, by_bytes);
    k3c_rng g;
    k3c_rng_seed(&g, test_seed() ^ 0x627065ull);
    /* pieces from real words (most merge far) and random bytes; some long enough for the heap loop */
    static const char *words[] = {" the", " licence", "ation", " 文件", "ing", " Software", "が", "ПО", " a", "e", "\xe4"};
    uint8_t piece[400];
    int32_t a[400], b[400], c[400];
    uint32_t *scratch = malloc(sizeof *scratch * k3c_bpe_scratch_words(sizeof piece));
    CHECK(scratch);
    const k3c_bpe *bpe = k3c_tokenizer_bpe(t);
    for (int iter = 0; iter < 300; iter++) {
        size_t n = 0, target = iter < 250 ? 2 + k3c_rng_next(&g) % 40 : 100 + k3c_rng_next(&g) % 300;
        while (n < target) {
            if (k3c_rng_next(&g) % 4) {
                const char *w = words[k3c_rng_next(&g) % (sizeof words / sizeof *words)];
                size_t l = strlen(w);
                if (n + l > target) break;
                memcpy(piece + n, w, l);
                n += l;
            } else {
                piece[n++] = (uint8_t)k3c_rng_next(&g);
            }
        }
        if (n < 2) continue;
        size_t na = k3c_bpe_merge_scan(bpe, piece, n, a, scratch);
        size_t nb = k3c_bpe_merge_heap(bpe, piece, n, b, scratch);
        CHECKF(na == nb && !memcmp(a, b, na * sizeof *a), "scan and heap merges differ (seed %llu, iter %d, %zu bytes)",
               (unsigned long long)test_seed(), iter, n);
        size_t nc = ref_merge(&sv, piece, n, c);
        CHECKF(nc == na && !memcmp(a, c, na * sizeof *a), "merges differ from the reference (iter %d)", iter);
    }
    free(scratch);
    free(sv.ids);
    k3c_tokenizer_free(t);
}

/* ------------------------------------------------------------------------- chunking ---- */

typedef struct cuts {
    size_t at[64];
    int n;
} cuts;

static int record_cut(void *ctx, size_t start, size_t end) {
    cuts *c = ctx;
    if (c->n < 64) c->at[c->n++] = end;
    (void)start;
    return 0;
}

TEST(tokenizer_chunking) {
    /* tokenization_kimi.py's rule with small limits (window 7 code points, runs of 3), over code points
     * of 1 to 3 bytes, against the statement reimplemented on a code point array */
    k3c_rng g;
    k3c_rng_seed(&g, test_seed() ^ 0x63687532ull);
    static const char *alphabet[] = {"a", " ", "\xc3\xa9", "\xe3\x80\x80", "\x1c", "\n", "\xe4\xbd\xa0"};
    static const int space[] = {0, 1, 0, 1, 1, 1, 0};
    for (int iter = 0; iter < 2000; iter++) {
        int cp[40], n = 1 + (int)(k3c_rng_next(&g) % 40);
        uint8_t text[200];
        size_t off[41], len = 0;
        for (int i = 0; i < n; i++) {
            cp[i] = (int)(k3c_rng_next(&g) % 7);
            if (k3c_rng_next(&g) % 3) cp[i] = i ? cp[i - 1] : cp[i]; /* runs */
            off[i] = len;
            memcpy(text + len, alphabet[cp[i]], strlen(alphabet[cp[i]]));
            len += strlen(alphabet[cp[i]]);
        }
        off[n] = len;
        cuts want = {.n = 0}, got = {.n = 0};
        for (int w = 0; w < n; w += 7) {
            int e = w + 7 < n ? w + 7 : n, run = 0, is_space = space[cp[w]], start = w;
            for (int i = w; i < e; i++) {
                int now = space[cp[i]];
                if (is_space ^ now) {
                    run = 1;
                    is_space = now;
                } else if (++run > 3) {
                    want.at[want.n++] = off[i];
                    start = i;
                    run = 1;
                }
            }
            (void)start;
            want.at[want.n++] = off[e];
        }
        k3c_tokenizer_chunks(text, len, 7, 3, record_cut, &got);
        CHECKF(got.n == want.n && !memcmp(got.at, want.at, sizeof *got.at * (size_t)got.n),
               "chunk cuts differ (seed %llu, iter %d)", (unsigned long long)test_seed(), iter);
    }
}

/* -------------------------------------------------------------------------- loading ---- */

static int write_text(const char *dir, const char *name, const char *text) {
    char path[4200];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    if (!f) return -1;
    fputs(text, f);
    return fclose(f);
}

/* A rank file of the 256 bytes (rank = byte value) and then `extra` lines as given. */
static char *byte_ranks(const char *extra) {
    static const char b64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    size_t cap = 256 * 16 + strlen(extra) + 1;
    char *s = malloc(cap), *p = s;
    for (int b = 0; b < 256; b++) p += sprintf(p, "%c%c== %d\n", b64[b >> 2], b64[(b & 3) << 4], b);
    strcpy(p, extra);
    return s;
}

static int load_expect_error(const char *dir, const char *must_contain) {
    k3c_tokenizer *t = NULL;
    if (k3c_tokenizer_load(dir, &t) == K3C_OK) {
        k3c_tokenizer_free(t);
        return -1;
    }
    if (!strstr(k3c_error_message(), must_contain)) {
        fprintf(stderr, "  error \"%s\" lacks \"%s\"\n", k3c_error_message(), must_contain);
        return -1;
    }
    return 0;
}

TEST(tokenizer_load_errors) {
    char dir[4096];
    snprintf(dir, sizeof dir, "%s/tok_errors", test_tmpdir());
    CHECK(mkdir(dir, 0755) == 0 || errno == EEXIST);
    static const char config[] = "{\"added_tokens_decoder\": {\"256\": {\"content\": \"[BOS]\"}}, \"bos_token\": \"[BOS]\"}";
    CHECK(!k3c_tokenizer_present(dir));
    CHECK(load_expect_error(dir, "has no tokenizer") == 0);
    char *ok = byte_ranks("");
    CHECK(write_text(dir, "tiktoken.model", ok) == 0);
    CHECK(k3c_tokenizer_present(dir));
    CHECK(load_expect_error(dir, "tokenizer_config.json: cannot open") == 0);
    CHECK(write_text(dir, "tokenizer_config.json", config) == 0);
    k3c_tokenizer *t;
    CHECK_OK(k3c_tokenizer_load(dir, &t));
    CHECK(k3c_tokenizer_num_base(t) == 256 && k3c_tokenizer_vocab(t) == 256 + 258 && k3c_tokenizer_bos(t) == 256);
    CHECK(k3c_tokenizer_eos(t) == -1 && k3c_tokenizer_special_id(t, "<|reserved_token_513|>") == 513);
    k3c_tokenizer_free(t);
    free(ok);
    struct {
        const char *extra, *error;
    } bad[] = {
        {"YWI= 256\nYWJj 257\n!!!! 258\n", "tiktoken.model:259: \"!!!!\" is not a base64 token"},
        {"YWI= 256\nYWI 257\n", "tiktoken.model:258:"},
        {"YWI= 256\nYWJj x\n", "tiktoken.model:258: rank \"x\""},
        {"YWI= 256\nYWJj 256\n", "tiktoken.model:258: rank 256 was given before, on line 257"},
        {"YWI= 300\n", "tiktoken.model:257: rank 300: the ranks must be 0 .. 256"},
        {"YWI= 256 7\n", "tiktoken.model:257: expected"},
        {"YWI= 256\nYWI= 257\n", "tiktoken.model:258: the token of rank 257 has the same bytes as rank 256 on line 257"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        char *r = byte_ranks(bad[i].extra);
        CHECK(write_text(dir, "tiktoken.model", r) == 0);
        free(r);
        CHECKF(load_expect_error(dir, bad[i].error) == 0, "case %zu: no \"%s\"", i, bad[i].error);
    }
    /* a missing byte: no byte fallback */
    char *r = byte_ranks("");
    char *line = strstr(r, "QQ== 65\n"); /* 'A' */
    CHECK(line);
    memcpy(line, "YWI= 65\n", 8);
    CHECK(write_text(dir, "tiktoken.model", r) == 0);
    free(r);
    CHECK(load_expect_error(dir, "byte 0x41 has no rank") == 0);
    r = byte_ranks("");
    CHECK(write_text(dir, "tiktoken.model", r) == 0);
    free(r);
    /* the config: syntax (with its line), names, specials */
    CHECK(write_text(dir, "tokenizer_config.json", "{\n\"added_tokens_decoder\": {\n\"256\": {\"content\": }\n}}") == 0);
    CHECK(load_expect_error(dir, "tokenizer_config.json:3: not valid JSON") == 0);
    CHECK(write_text(dir, "tokenizer_config.json", "{\"bos_token\": \"[NOPE]\"}") == 0);
    CHECK(load_expect_error(dir, "bos_token \"[NOPE]\" is not one of the special tokens (ids 256 .. 513)") == 0);
    CHECK(write_text(dir, "tokenizer_config.json", "{\"added_tokens_decoder\": {\"x1\": {\"content\": \"a\"}}}") == 0);
    CHECK(load_expect_error(dir, "key \"x1\" is not a token id") == 0);
    CHECK(write_text(dir, "tokenizer_config.json",
                     "{\"added_tokens_decoder\": {\"256\": {\"content\": \"[A]\"}, \"300\": {\"content\": \"[A]\"}}}") == 0);
    CHECK(load_expect_error(dir, "added_tokens_decoder: ids 256 and 300 are both \"[A]\"") == 0);
    /* regular files only: a FIFO is refused at once, not waited on */
    char path[4200];
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
    unlink(path);
    CHECK(mkfifo(path, 0644) == 0);
    CHECK(load_expect_error(dir, "not a regular file") == 0);
    unlink(path);
    CHECK(mkdir(path, 0755) == 0);
    CHECK(load_expect_error(dir, "not a regular file") == 0);
    rmdir(path);
}

/* ------------------------------------------------------------------- special layouts ---- */

TEST(tokenizer_special_layouts) {
    k3c_tokenizer *k3, *k2;
    CHECK_OK(load_pair(FIX "/bytes-gpt2.tiktoken", FIX "/bytes-gpt2.config.json", 0, &k3));
    CHECK_OK(load_pair(FIX "/train-512-rawbytes.tiktoken", FIX "/train-512-rawbytes.config.json", 0, &k2));
    /* the slot count follows the names: K3's <|open|> -> 256, else 258 */
    CHECK(k3c_tokenizer_vocab(k3) == 256 + 256 && k3c_tokenizer_vocab(k2) == 512 + 258);
    CHECK(k3c_tokenizer_special_id(k3, "<|open|>") == 256 + 3 && k3c_tokenizer_special_id(k3, "<|sep|>") == 256 + 5);
    CHECK(k3c_tokenizer_special_id(k3, "<|end_of_msg|>") == 258 && k3c_tokenizer_special_id(k3, "[PAD]") == 511);
    CHECK(k3c_tokenizer_special_id(k2, "<|im_end|>") == 514 && k3c_tokenizer_special_id(k2, "<|im_middle|>") == 529);
    CHECK(k3c_tokenizer_special_id(k2, "<think>") == 534 && k3c_tokenizer_special_id(k2, "<|reserved_token_769|>") == 769);
    CHECK(k3c_tokenizer_special_id(k2, "<|reserved_token_770|>") == -1 && k3c_tokenizer_special_id(k3, "<|im_end|>") == -1);
    CHECK(k3c_tokenizer_bos(k3) == 256 && k3c_tokenizer_eos(k3) == 257 && k3c_tokenizer_pad(k3) == 511);
    CHECK(k3c_tokenizer_unk(k2) == 512 + 254 && k3c_tokenizer_is_special(k2, 769) && !k3c_tokenizer_is_special(k2, 770));
    CHECK(!k3c_tokenizer_is_special(k2, 511) && !k3c_tokenizer_token(k2, 770, &(size_t){0}));
    /* GPT-2 byte order (spec 1.2.4): '<' 27, '|' 91, '\n' 198, ' ' 220; <|open|> as text is 27 91 . 91 29 */
    k3c_tokens v = {0};
    CHECK_OK(k3c_tokenizer_encode(k3, "<|open|>", 8, 0, &v));
    CHECK(v.n == 8 && v.ids[0] == 27 && v.ids[1] == 91 && v.ids[6] == 91 && v.ids[7] == 29);
    v.n = 0;
    static const char sp[] = "<|open|>\n <|reserved_token_300|>";
    CHECK_OK(k3c_tokenizer_encode(k3, sp, sizeof sp - 1, 1, &v));
    CHECK(v.n == 4 && v.ids[0] == 259 && v.ids[1] == 198 && v.ids[2] == 220 && v.ids[3] == 300);
    size_t l;
    const char *s = k3c_tokenizer_token(k3, 300, &l);
    CHECK(s && l == 22 && !memcmp(s, "<|reserved_token_300|>", 22));
    k3c_tokens_free(&v);
    k3c_tokenizer_free(k3);
    k3c_tokenizer_free(k2);
}

/* ---------------------------------------------------------------- the embedded default ---- */

TEST(tokenizer_default_presets) {
    static const struct {
        const char *preset;
        int base, vocab;
    } want[] = {{"tiny", 768, 1024}, {"kimi-linear-tiny", 766, 1024}, {"mini", 32512, 32768}, {"k3", 32512, 32768}};
    for (size_t i = 0; i < sizeof want / sizeof *want; i++) {
        k3c_tokenizer *t;
        CHECK_OK(k3c_tokenizer_load_preset(want[i].preset, &t));
        CHECKF(k3c_tokenizer_num_base(t) == want[i].base && k3c_tokenizer_vocab(t) == want[i].vocab,
               "%s: %d base ranks, vocab %d", want[i].preset, k3c_tokenizer_num_base(t), k3c_tokenizer_vocab(t));
        CHECK(k3c_tokenizer_bos(t) == want[i].base && k3c_tokenizer_eos(t) == want[i].base + 1);
        k3c_tokenizer_free(t);
    }
    /* what synth writes is what the preset loads */
    char dir[4096];
    snprintf(dir, sizeof dir, "%s/tok_synth_tiny", test_tmpdir());
    CHECK_OK(k3c_synthesize("tiny", 1, dir));
    k3c_tokenizer *a, *b;
    CHECK(k3c_tokenizer_present(dir));
    CHECK_OK(k3c_tokenizer_load(dir, &a));
    CHECK_OK(k3c_tokenizer_load_preset("tiny", &b));
    static const char text[] = "The Software is provided \"as is\". 你好，世界！<|open|>x<|close|> 12345";
    k3c_tokens va = {0}, vb = {0};
    CHECK_OK(k3c_tokenizer_encode(a, text, sizeof text - 1, 1, &va));
    CHECK_OK(k3c_tokenizer_encode(b, text, sizeof text - 1, 1, &vb));
    CHECK(va.n == vb.n && va.n > 10 && !memcmp(va.ids, vb.ids, va.n * sizeof *va.ids));
    CHECK(k3c_tokenizer_vocab(a) == 1024 && k3c_tokenizer_special_id(a, "<|open|>") == 771);
    for (size_t i = 0; i < va.n; i++) CHECK(va.ids[i] >= 0 && va.ids[i] < 1024);
    char *back;
    size_t bl;
    CHECK_OK(k3c_tokenizer_decode(a, va.ids, va.n, &back, &bl));
    CHECK(bl == sizeof text - 1 && !memcmp(back, text, bl));
    free(back);
    k3c_tokens_free(&va);
    k3c_tokens_free(&vb);
    k3c_tokenizer_free(a);
    k3c_tokenizer_free(b);
}

/* ------------------------------------------------------------------------ streaming ---- */

TEST(tokenizer_stream_random) {
    k3c_tokenizer *t;
    CHECK_OK(k3c_tokenizer_load_preset("tiny", &t));
    k3c_detokenizer *d;
    CHECK_OK(k3c_detokenizer_create(t, &d));
    k3c_rng g;
    k3c_rng_seed(&g, test_seed() ^ 0x73747265ull);
    int32_t ids[64];
    for (int iter = 0; iter < 3000; iter++) {
        size_t n = 1 + k3c_rng_next(&g) % 64;
        for (size_t i = 0; i < n; i++) ids[i] = (int32_t)(k3c_rng_next(&g) % 1024);
        char *want;
        size_t wl;
        CHECK_OK(k3c_tokenizer_decode(t, ids, n, &want, &wl));
        bytes got = {0};
        for (size_t i = 0; i <= n; i++) {
            const char *s;
            size_t l;
            CHECK_OK(i < n ? k3c_detokenizer_push(d, ids[i], &s, &l) : k3c_detokenizer_finish(d, &s, &l));
            CHECK(k3c_utf8_valid((const uint8_t *)s, l) && k3c_detokenizer_pending(d) <= 3);
            CHECK(!bytes_put(&got, (const uint8_t *)s, l));
        }
        CHECKF(got.n == wl && !memcmp(got.p, want, wl), "stream differs from decode (seed %llu, iter %d)",
               (unsigned long long)test_seed(), iter);
        free(got.p);
        free(want);
    }
    const char *s;
    size_t l;
    CHECK(k3c_detokenizer_push(d, 1024, &s, &l) != K3C_OK && strstr(k3c_error_message(), "outside the vocabulary"));
    int32_t bad[] = {5, -1};
    char *out;
    CHECK(k3c_tokenizer_decode(t, bad, 2, &out, &l) != K3C_OK && strstr(k3c_error_message(), "id -1 (position 1)"));
    k3c_detokenizer_free(d);
    k3c_tokenizer_free(t);
}

/* -------------------------------------------------------------------------- threads ---- */

typedef struct job {
    const k3c_tokenizer *t;
    const char *text;
    size_t len;
    k3c_tokens out;
    int rc;
} job;

static void *encode_job(void *p) {
    job *j = p;
    for (int rep = 0; rep < 5 && j->rc == 0; rep++) {
        j->out.n = 0;
        j->rc = k3c_tokenizer_encode(j->t, j->text, j->len, 1, &j->out);
    }
    return NULL;
}

TEST(tokenizer_threads) {
    k3c_tokenizer *t = default_tokenizer();
    CHECKF(t, "%s", k3c_error_message());
    char *text;
    size_t len;
    CHECK_OK(k3c_read_file(FIX "/cases.txt", 1 << 26, &text, &len)); /* hex and names: plenty of pieces */
    job jobs[4];
    pthread_t th[4];
    for (int i = 0; i < 4; i++) {
        jobs[i] = (job){t, text, len, {0}, 0};
        CHECK(pthread_create(&th[i], NULL, encode_job, &jobs[i]) == 0);
    }
    for (int i = 0; i < 4; i++) pthread_join(th[i], NULL);
    k3c_tokens one = {0};
    CHECK_OK(k3c_tokenizer_encode(t, text, len, 1, &one));
    for (int i = 0; i < 4; i++) {
        CHECK(jobs[i].rc == 0 && jobs[i].out.n == one.n && !memcmp(jobs[i].out.ids, one.ids, one.n * sizeof *one.ids));
        k3c_tokens_free(&jobs[i].out);
    }
    k3c_tokens_free(&one);
    free(text);
    k3c_tokenizer_free(t);
}

/* ------------------------------------------------------------------------------ CLI ---- */

TEST(tokenizer_cli) {
    char k3c[2048], cmd[12400], out[2048];
    CHECKF(test_k3c_binary(k3c, sizeof k3c), "no k3c binary beside the tests");
    snprintf(out, sizeof out, "%s/tok_cli.txt", test_tmpdir());
    char *got;
    size_t gl;
    k3c_tokenizer *t = NULL;
    k3c_tokens v = {0};
    /* no --model: the embedded default model's tokenizer (models/k3-fortune); --preset tiny: the tiny preset's;
     * ids on one line */
    for (int preset = 0; preset < 2; preset++) {
        const char *opt = preset ? " --preset tiny" : "";
        snprintf(cmd, sizeof cmd, "%s tokenize%s 'hello <|open|>' > %s", k3c, opt, out);
        CHECK(test_run_status(cmd) == 0);
        CHECK_OK(k3c_read_file(out, 1 << 20, &got, &gl));
        k3c_tokenizer_free(t);
        k3c_tokens_free(&v);
        CHECK_OK(preset ? k3c_tokenizer_load_preset("tiny", &t) : k3c_tokenizer_load("models/k3-fortune", &t));
        CHECK_OK(k3c_tokenizer_encode(t, "hello <|open|>", 14, 1, &v));
        char want[4096];
        size_t wl = 0;
        for (size_t i = 0; i < v.n; i++) wl += (size_t)snprintf(want + wl, sizeof want - wl, i ? " %d" : "%d", v.ids[i]);
        wl += (size_t)snprintf(want + wl, sizeof want - wl, "\n");
        CHECKF(gl == wl && !memcmp(got, want, wl), "k3c tokenize%s printed \"%s\", want \"%s\"", opt, got, want);
        free(got);
        /* and back */
        char list[4096];
        size_t ll = 0;
        for (size_t i = 0; i < v.n; i++) ll += (size_t)snprintf(list + ll, sizeof list - ll, i ? ",%d" : "%d", v.ids[i]);
        snprintf(cmd, sizeof cmd, "%s detokenize%s --ids %s > %s", k3c, opt, list, out);
        CHECK(test_run_status(cmd) == 0);
        CHECK_OK(k3c_read_file(out, 1 << 20, &got, &gl));
        CHECK(gl == 15 && !memcmp(got, "hello <|open|>\n", 15));
        free(got);
    }
    /* the two tokenizers differ (4096 ids against tiny's 1024), so the default is not the preset's */
    CHECK(k3c_tokenizer_vocab(t) != 4096);
    /* a model directory without tokenizer files says so */
    snprintf(cmd, sizeof cmd, "%s tokenize --model %s hello 2> %s", k3c, test_tmpdir(), out);
    CHECK(test_run_status(cmd) == 1);
    CHECK_OK(k3c_read_file(out, 1 << 20, &got, &gl));
    CHECK(strstr(got, "has no tokenizer"));
    free(got);
    k3c_tokens_free(&v);
    k3c_tokenizer_free(t);
}

/* ------------------------------------------------------------- the ASCII fast path ---- */

typedef struct pieces {
    size_t at[512];
    int n;
} pieces;

static int record_piece(void *ctx, size_t start, size_t end) {
    pieces *p = ctx;
    if (p->n >= 510) return 1;
    p->at[p->n++] = start;
    p->at[p->n++] = end;
    return 0;
}

TEST(tokenizer_pretok_ascii) {
    /* random text over every ASCII class and the non-ASCII characters that change an ASCII decision
     * (letters, U+0085 / U+00A0 / U+3000 spaces, a digit, ſ after an apostrophe, Han, a mark): the pieces
     * with the fast path equal PCRE2's alone */
    k3c_tokenizer *t;
    CHECK_OK(k3c_tokenizer_load_preset("tiny", &t));
    static const char *alpha[] = {"a", "b", "s", "t", "e", "l", "d", "Z", "S", "L", "R", "E", "V", "M", "D", "'",
                                  "0", "7", " ", " ", "\t", "\n", "\r", "\v", "\f", ".", "!", "(", "\x1c", "\x7f",
                                  "\xc3\xa9", "\xc3\x89", "\xc5\xbf", "\xc2\x85", "\xc2\xa0", "\xe3\x80\x80",
                                  "\xd9\xa3", "\xe4\xbd\xa0", "\xcc\x81", "\xe2\x80\x94", "\xef\xbc\x8c"};
    k3c_rng g;
    k3c_rng_seed(&g, test_seed() ^ 0x61736369ull);
    uint8_t text[256];
    for (int iter = 0; iter < 20000; iter++) {
        size_t n = 0, want_chars = 1 + k3c_rng_next(&g) % 24;
        int non_ascii = (int)(k3c_rng_next(&g) % 4); /* a quarter of the strings all ASCII */
        for (size_t c = 0; c < want_chars; c++) {
            size_t k = k3c_rng_next(&g) % (sizeof alpha / sizeof *alpha);
            if (!non_ascii && (unsigned char)alpha[k][0] >= 0x80) k %= 30;
            if (k3c_rng_next(&g) % 3 == 0 && n) k = (size_t)(k3c_rng_next(&g) % 30); /* more ASCII */
            size_t l = strlen(alpha[k]);
            memcpy(text + n, alpha[k], l);
            n += l;
        }
        pieces fast = {.n = 0}, slow = {.n = 0};
        CHECK_OK(k3c_tokenizer_split(t, text, n, 1, record_piece, &fast));
        CHECK_OK(k3c_tokenizer_split(t, text, n, 0, record_piece, &slow));
        CHECKF(fast.n == slow.n && !memcmp(fast.at, slow.at, sizeof *fast.at * (size_t)fast.n),
               "fast path pieces differ from PCRE2's (seed %llu, iter %d)", (unsigned long long)test_seed(), iter);
    }
    k3c_tokenizer_free(t);
}
