/* Kimi's tokenizer: loading tiktoken.model + tokenizer_config.json, encode, decode, streaming decode.
 *
 * Encode follows tokenization_kimi.py's encode on tiktoken 0.14 step for step (spec tokenizer-chat.md 1.2):
 *  1. the text is cut into windows of 400 000 code points and each window where a run of str.isspace()
 *     or of other characters would pass 25 000; each piece is encoded on its own, so nothing (a special,
 *     a regex match, a merge) spans a cut;
 *  2. with specials allowed, the leftmost special text in the piece is found (tiktoken's special regex);
 *     the text before it is pre-split and BPE'd as a subject of its own (a lookahead sees its end, not
 *     the special), then the special's id follows;
 *  3. pre-split: every match of the pattern (src/text/pretok_pattern.h) in turn; a match that is a token
 *     is one id, anything else goes through the merges (text/bpe.c).
 * Ill-formed UTF-8 input is replaced first, as Python's bytes.decode("utf-8", "replace") does, since the
 * reference encodes a str. */
#include "text/tokenizer.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "text/base64.h"
#include "text/bpe.h"
#include "text/pretok.h"
#include "text/pretok_pattern.h"
#include "text/regex.h"
#include "text/utf8.h"
#include "util/error.h"
#include "util/file.h"

struct k3c_tokenizer {
    k3c_bpe bpe;          /* the base ranks: ids 0 .. num_base - 1 */
    k3c_bpe special;      /* the special texts: index i is id num_base + i */
    uint32_t num_base, slots;
    int32_t bos, eos, pad, unk;
    k3c_regex *split;     /* the pre-split pattern */
    k3c_regex *specials;  /* every special text, longest first */
};

/* The largest tokenizer file accepted (the published tiktoken.model is 2.5 MB): a guard, not a format limit. */
#define MAX_FILE_BYTES ((size_t)1 << 30)

/* ======================================================================================================
 * tiktoken.model
 * ====================================================================================================== */

static int is_blank(char c) { return c == ' ' || c == '\t' || c == '\v' || c == '\f'; }

/* One `<base64> <rank>` per non-empty line (\n or \r\n), as tiktoken's load_tiktoken_bpe reads it; the
 * ranks must be exactly 0 .. N - 1 (Kimi's specials start at N = the number of ranks) and every one of
 * the 256 bytes a token of its own (tiktoken has no byte fallback). */
static int parse_ranks(const char *text, size_t len, const char *name, k3c_bpe *bpe) {
    size_t lines = 1;
    for (size_t i = 0; i < len; i++) lines += text[i] == '\n';
    /* per line: decoded offset and length in a staging blob, and the rank */
    uint32_t *loff = malloc(sizeof *loff * lines), *llen = malloc(sizeof *llen * lines);
    uint32_t *lrank = malloc(sizeof *lrank * lines), *lline = malloc(sizeof *lline * lines);
    uint8_t *stage = malloc(len / 4 * 3 + 4);
    int rc = K3C_ERR;
    if (!loff || !llen || !lrank || !lline || !stage) {
        k3c_errorf("%s: out of memory reading %zu bytes", name, len);
        goto done;
    }
    size_t n = 0, used = 0, line = 0;
    for (size_t at = 0; at < len;) {
        line++;
        const char *s = text + at, *nl = memchr(s, '\n', len - at);
        size_t l = nl ? (size_t)(nl - s) : len - at;
        at += l + (nl != NULL);
        if (l && s[l - 1] == '\r') l--;
        size_t a = 0;
        while (a < l && is_blank(s[a])) a++;
        if (a == l) continue; /* an empty line */
        size_t b = a;
        while (b < l && !is_blank(s[b])) b++;
        size_t c = b;
        while (c < l && is_blank(s[c])) c++;
        size_t d = c;
        while (d < l && !is_blank(s[d])) d++;
        size_t e = d;
        while (e < l && is_blank(s[e])) e++;
        if (c == l || e != l) {
            k3c_errorf("%s:%zu: expected `<base64 token> <rank>`, got \"%.*s\"", name, line, (int)(l < 60 ? l : 60), s);
            goto done;
        }
        long got = k3c_base64_decode(s + a, b - a, stage + used);
        if (got <= 0) {
            k3c_errorf("%s:%zu: \"%.*s\" is not a base64 token (padded standard alphabet, at least one byte)", name,
                       line, (int)(b - a < 60 ? b - a : 60), s + a);
            goto done;
        }
        unsigned long long r = 0;
        for (size_t i = c; i < d; i++) {
            if (s[i] < '0' || s[i] > '9' || r > UINT32_MAX) {
                k3c_errorf("%s:%zu: rank \"%.*s\" is not a non-negative integer", name, line, (int)(d - c), s + c);
                goto done;
            }
            r = r * 10 + (unsigned)(s[i] - '0');
        }
        loff[n] = (uint32_t)used;
        llen[n] = (uint32_t)got;
        lrank[n] = (uint32_t)r;
        lline[n] = (uint32_t)line;
        used += (size_t)got;
        n++;
    }
    if (n == 0) {
        k3c_errorf("%s: no tokens", name);
        goto done;
    }
    /* the blob in id order, so that token i is blob[off[i] .. off[i + 1]) */
    bpe->off = calloc(n + 1, sizeof *bpe->off);
    bpe->blob = malloc(used ? used : 1);
    uint32_t *line_of = malloc(sizeof *line_of * n);
    if (!bpe->off || !bpe->blob || !line_of) {
        free(line_of);
        k3c_errorf("%s: out of memory for %zu tokens", name, n);
        goto done;
    }
    for (size_t i = 0; i < n; i++) line_of[i] = UINT32_MAX;
    for (size_t k = 0; k < n; k++) {
        if (lrank[k] >= n) {
            k3c_errorf("%s:%u: rank %u: the ranks must be 0 .. %zu for the %zu tokens of the file", name, lline[k],
                       lrank[k], n - 1, n);
            free(line_of);
            goto done;
        }
        if (line_of[lrank[k]] != UINT32_MAX) {
            k3c_errorf("%s:%u: rank %u was given before, on line %u", name, lline[k], lrank[k],
                       lline[line_of[lrank[k]]]);
            free(line_of);
            goto done;
        }
        line_of[lrank[k]] = (uint32_t)k;
    }
    uint32_t o = 0;
    for (size_t id = 0; id < n; id++) {
        uint32_t k = line_of[id];
        bpe->off[id] = o;
        memcpy(bpe->blob + o, stage + loff[k], llen[k]);
        o += llen[k];
    }
    bpe->off[n] = o;
    bpe->n = (uint32_t)n;
    uint32_t dup[2] = {UINT32_MAX, UINT32_MAX};
    if (k3c_bpe_index(bpe, 1, dup) != K3C_OK) {
        if (dup[0] != UINT32_MAX)
            k3c_errorf("%s:%u: the token of rank %u has the same bytes as rank %u on line %u", name,
                       lline[line_of[dup[1]]], dup[1], dup[0], lline[line_of[dup[0]]]);
        else
            k3c_error_context("%s", name);
        free(line_of);
        goto done;
    }
    free(line_of);
    for (int b = 0; b < 256; b++) {
        uint8_t byte = (uint8_t)b;
        if (k3c_bpe_rank(bpe, &byte, 1) < 0) {
            k3c_errorf("%s: byte 0x%02X has no rank: every single byte must be a token (tiktoken has no byte "
                       "fallback)", name, b);
            goto done;
        }
    }
    rc = K3C_OK;
done:
    free(loff);
    free(llen);
    free(lrank);
    free(lline);
    free(stage);
    if (rc != K3C_OK) k3c_bpe_free(bpe);
    return rc;
}

/* ======================================================================================================
 * tokenizer_config.json
 * ====================================================================================================== */

static size_t line_at(const char *text, size_t len, const char *p) {
    size_t line = 1;
    if (!p || p < text) return line;
    for (const char *q = text; q < p && q < text + len; q++) line += *q == '\n';
    return line;
}

/* "bos_token": "[BOS]" or {"content": "[BOS]", ...} or null / absent (NULL). */
static int token_name(const cJSON *root, const char *key, const char *where, const char **name) {
    *name = NULL;
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, key);
    if (!v || cJSON_IsNull(v)) return K3C_OK;
    if (cJSON_IsObject(v)) v = cJSON_GetObjectItemCaseSensitive(v, "content");
    if (!cJSON_IsString(v) || !v->valuestring)
        return k3c_errorf("%s: %s: expected a token text or an object with a \"content\" text", where, key);
    *name = v->valuestring;
    return K3C_OK;
}

static int parse_id_key(const char *s, unsigned long long *id) {
    if (!*s) return -1;
    unsigned long long v = 0;
    for (; *s; s++) {
        if (*s < '0' || *s > '9' || v > UINT32_MAX) return -1;
        v = v * 10 + (unsigned)(*s - '0');
    }
    *id = v;
    return 0;
}

static int has_name(const cJSON *added, const char *name) {
    for (const cJSON *e = added ? added->child : NULL; e; e = e->next) {
        const cJSON *c = cJSON_GetObjectItemCaseSensitive(e, "content");
        if (cJSON_IsString(c) && c->valuestring && !strcmp(c->valuestring, name)) return 1;
    }
    return 0;
}

/* The special slots' texts, in id order, into t->special; then bos / eos / pad / unk. */
static int load_specials(k3c_tokenizer *t, const char *json, size_t len, const char *where, int slots) {
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(json, len, &end, 0);
    if (!root)
        return k3c_errorf("%s:%zu: not valid JSON (near byte %zu)", where, line_at(json, len, end),
                          end && end >= json ? (size_t)(end - json) : 0);
    int rc = K3C_ERR;
    char **names = NULL;
    if (!cJSON_IsObject(root)) {
        k3c_errorf("%s: the top level is not a JSON object", where);
        goto done;
    }
    const cJSON *added = cJSON_GetObjectItemCaseSensitive(root, "added_tokens_decoder");
    if (added && !cJSON_IsNull(added) && !cJSON_IsObject(added)) {
        k3c_errorf("%s: added_tokens_decoder: expected an object of id -> token", where);
        goto done;
    }
    if (!slots) slots = has_name(added, "<|open|>") || has_name(added, "<|end_of_msg|>") ? K3C_TOKENIZER_SLOTS_K3
                                                                                          : K3C_TOKENIZER_SLOTS_K2;
    t->slots = (uint32_t)slots;
    names = calloc((size_t)slots, sizeof *names);
    if (!names) {
        k3c_errorf("%s: out of memory", where);
        goto done;
    }
    /* named slots; entries outside the slot range are not specials of the encoding (TK-L reads only the range) */
    for (const cJSON *e = added ? added->child : NULL; e; e = e->next) {
        unsigned long long id;
        if (parse_id_key(e->string, &id) != 0) {
            k3c_errorf("%s: added_tokens_decoder: key \"%s\" is not a token id", where, e->string);
            goto done;
        }
        const cJSON *c = cJSON_IsObject(e) ? cJSON_GetObjectItemCaseSensitive(e, "content") : NULL;
        if (!cJSON_IsString(c) || !c->valuestring || !c->valuestring[0]) {
            k3c_errorf("%s: added_tokens_decoder.%s: expected an object with a non-empty \"content\" text", where,
                       e->string);
            goto done;
        }
        if (id < t->num_base || id >= (unsigned long long)t->num_base + t->slots) continue;
        if (!k3c_utf8_valid((const uint8_t *)c->valuestring, strlen(c->valuestring))) {
            k3c_errorf("%s: added_tokens_decoder.%s: the content is not valid UTF-8", where, e->string);
            goto done;
        }
        free(names[id - t->num_base]);
        if (!(names[id - t->num_base] = strdup(c->valuestring))) {
            k3c_errorf("%s: out of memory", where);
            goto done;
        }
    }
    size_t total = 0;
    for (int i = 0; i < slots; i++) {
        if (!names[i]) {
            char buf[48];
            snprintf(buf, sizeof buf, "<|reserved_token_%u|>", t->num_base + (uint32_t)i);
            if (!(names[i] = strdup(buf))) {
                k3c_errorf("%s: out of memory", where);
                goto done;
            }
        }
        total += strlen(names[i]);
    }
    k3c_bpe *sp = &t->special;
    sp->off = calloc((size_t)slots + 1, sizeof *sp->off);
    sp->blob = malloc(total ? total : 1);
    if (!sp->off || !sp->blob) {
        k3c_errorf("%s: out of memory", where);
        goto done;
    }
    uint32_t o = 0;
    for (int i = 0; i < slots; i++) {
        size_t l = strlen(names[i]);
        sp->off[i] = o;
        memcpy(sp->blob + o, names[i], l);
        o += (uint32_t)l;
    }
    sp->off[slots] = o;
    sp->n = (uint32_t)slots;
    uint32_t dup[2] = {UINT32_MAX, UINT32_MAX};
    if (k3c_bpe_index(sp, 0, dup) != K3C_OK) {
        /* two slots with one text: the reference's name -> id map would keep only one of them */
        if (dup[0] != UINT32_MAX)
            k3c_errorf("%s: added_tokens_decoder: ids %u and %u are both \"%s\" (a special text names one id)", where,
                       t->num_base + dup[0], t->num_base + dup[1], names[dup[1]]);
        goto done;
    }
    const char *keys[4] = {"bos_token", "eos_token", "pad_token", "unk_token"};
    int32_t *ids[4] = {&t->bos, &t->eos, &t->pad, &t->unk};
    for (int k = 0; k < 4; k++) {
        const char *name;
        if (token_name(root, keys[k], where, &name) != K3C_OK) goto done;
        *ids[k] = -1;
        if (!name) continue;
        int32_t i = k3c_bpe_rank(sp, (const uint8_t *)name, strlen(name));
        if (i < 0) {
            k3c_errorf("%s: %s \"%s\" is not one of the special tokens (ids %u .. %u)", where, keys[k], name,
                       t->num_base, t->num_base + t->slots - 1);
            goto done;
        }
        *ids[k] = (int32_t)t->num_base + i;
    }
    rc = K3C_OK;
done:
    if (names)
        for (int i = 0; i < slots; i++) free(names[i]);
    free(names);
    cJSON_Delete(root);
    return rc;
}

/* The alternation of every special text, each escaped, longest first: two specials that start at one
 * place are matched as the longer (tiktoken's order there is a hash map's; no Kimi special is a prefix
 * of another, so this only settles a case the published files never reach). */
static int compile_specials(k3c_tokenizer *t) {
    const k3c_bpe *sp = &t->special;
    uint32_t *order = malloc(sizeof *order * sp->n);
    char *pat = malloc(2 * (size_t)sp->off[sp->n] + sp->n + 1);
    if (!order || !pat) {
        free(order);
        free(pat);
        return k3c_errorf("out of memory for the special tokens' pattern");
    }
    for (uint32_t i = 0; i < sp->n; i++) order[i] = i;
    /* insertion sort by length, descending (a few hundred entries, once) */
    for (uint32_t i = 1; i < sp->n; i++) {
        uint32_t v = order[i], lv = sp->off[v + 1] - sp->off[v], j = i;
        while (j > 0 && sp->off[order[j - 1] + 1] - sp->off[order[j - 1]] < lv) {
            order[j] = order[j - 1];
            j--;
        }
        order[j] = v;
    }
    size_t n = 0;
    for (uint32_t k = 0; k < sp->n; k++) {
        if (k) pat[n++] = '|';
        for (uint32_t b = sp->off[order[k]]; b < sp->off[order[k] + 1]; b++) {
            uint8_t c = sp->blob[b];
            int alnum = (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
            if (c < 0x80 && !alnum) pat[n++] = '\\'; /* backslash + non-alphanumeric ASCII is that character */
            pat[n++] = (char)c;
        }
    }
    int rc = k3c_regex_compile(pat, n, 0, "the special tokens", &t->specials);
    free(order);
    free(pat);
    return rc;
}

int k3c_tokenizer_from_source(const k3c_tokenizer_source *src, k3c_tokenizer **out) {
    *out = NULL;
    k3c_tokenizer *t = calloc(1, sizeof *t);
    if (!t) return k3c_errorf("out of memory for a tokenizer");
    if (parse_ranks(src->ranks, src->ranks_len, src->ranks_name, &t->bpe) != K3C_OK) goto fail;
    t->num_base = t->bpe.n;
    if (load_specials(t, src->config, src->config_len, src->config_name, src->slots) != K3C_OK) goto fail;
    if (compile_specials(t) != K3C_OK) goto fail;
    if (k3c_regex_compile(k3c_pretok_pattern, strlen(k3c_pretok_pattern), 1, "the pre-split pattern", &t->split) !=
        K3C_OK)
        goto fail;
    *out = t;
    return K3C_OK;
fail:
    k3c_tokenizer_free(t);
    return K3C_ERR;
}

/* ======================================================================================================
 * Public: loading
 * ====================================================================================================== */

/* stat before opening: a FIFO would block the open itself */
static int read_regular(const char *path, char **buf, size_t *len) {
    struct stat st;
    if (stat(path, &st) != 0) return k3c_errorf("%s: cannot open: %s", path, strerror(errno));
    if (!S_ISREG(st.st_mode)) return k3c_errorf("%s: not a regular file", path);
    return k3c_read_file(path, MAX_FILE_BYTES, buf, len);
}

int k3c_tokenizer_present(const char *dir) {
    char path[4096];
    struct stat st;
    if (!dir || (size_t)snprintf(path, sizeof path, "%s/tiktoken.model", dir) >= sizeof path) return 0;
    return stat(path, &st) == 0;
}

int k3c_tokenizer_load(const char *dir, k3c_tokenizer **out) {
    *out = NULL;
    if (!dir || !*dir) return k3c_errorf("tokenizer: no directory given");
    char rpath[4096], cpath[4096];
    if ((size_t)snprintf(rpath, sizeof rpath, "%s/tiktoken.model", dir) >= sizeof rpath ||
        (size_t)snprintf(cpath, sizeof cpath, "%s/tokenizer_config.json", dir) >= sizeof cpath)
        return k3c_errorf("tokenizer: directory path too long: %.80s...", dir);
    struct stat st;
    if (stat(rpath, &st) != 0 && errno == ENOENT)
        return k3c_errorf("%s has no tokenizer (no tiktoken.model): the model runs on token ids only", dir);
    char *ranks = NULL, *config = NULL;
    size_t rlen = 0, clen = 0;
    int rc = read_regular(rpath, &ranks, &rlen);
    if (rc == K3C_OK) rc = read_regular(cpath, &config, &clen);
    if (rc == K3C_OK) {
        k3c_tokenizer_source src = {ranks, rlen, rpath, config, clen, cpath, 0};
        rc = k3c_tokenizer_from_source(&src, out);
    }
    free(ranks);
    free(config);
    return rc;
}

void k3c_tokenizer_free(k3c_tokenizer *t) {
    if (!t) return;
    k3c_bpe_free(&t->bpe);
    k3c_bpe_free(&t->special);
    k3c_regex_free(t->split);
    k3c_regex_free(t->specials);
    free(t);
}

/* ======================================================================================================
 * Public: encode
 * ====================================================================================================== */

void k3c_tokens_free(k3c_tokens *v) {
    if (!v) return;
    free(v->ids);
    v->ids = NULL;
    v->n = v->cap = 0;
}

static int tokens_reserve(k3c_tokens *v, size_t more) {
    if (v->cap - v->n >= more) return K3C_OK;
    size_t cap = v->cap ? v->cap : 64;
    while (cap - v->n < more) cap *= 2;
    int32_t *p = realloc(v->ids, cap * sizeof *p);
    if (!p) return k3c_errorf("out of memory for %zu token ids", cap);
    v->ids = p;
    v->cap = cap;
    return K3C_OK;
}

/* str.isspace() of the code point at s[i], and its length in *len (valid UTF-8) */
static inline int space_at(const uint8_t *s, size_t i, size_t *len) {
    uint8_t b = s[i];
    if (b < 0x80) {
        *len = 1;
        return (b >= 0x09 && b <= 0x0D) || (b >= 0x1C && b <= 0x20);
    }
    *len = k3c_utf8_lead_len(b);
    return k3c_py_isspace(k3c_utf8_decode(s + i, *len));
}

int k3c_tokenizer_chunks(const uint8_t *s, size_t len, size_t window, size_t run_max,
                         int (*piece)(void *ctx, size_t start, size_t end), void *ctx) {
    size_t i = 0;
    while (i < len) {
        /* one window: _split_whitespaces_or_nonwhitespaces(text[w : w + window], run_max) */
        size_t slice = i, cps = 0, run = 0, l;
        int is_space = space_at(s, i, &l);
        while (i < len && cps < window) {
            int now = space_at(s, i, &l);
            if (is_space ^ now) {
                run = 1;
                is_space = now;
            } else if (++run > run_max) {
                int r = piece(ctx, slice, i);
                if (r) return r;
                slice = i;
                run = 1;
            }
            i += l;
            cps++;
        }
        int r = piece(ctx, slice, i);
        if (r) return r;
    }
    return 0;
}

/* One encode call's working state. */
typedef struct encoder {
    const k3c_tokenizer *t;
    const uint8_t *text;
    int allow_special;
    k3c_tokens *out;
    k3c_regex_state *split, *specials;
    uint32_t *scratch; /* the merges' working arrays */
    size_t scratch_words;
} encoder;

/* The next match of the pre-split pattern at or after `from` in s[0 .. n): the ASCII fast path where it
 * decides, PCRE2 otherwise. 1 with [*ms, *me), 0 at the end, K3C_ERR. */
static int next_match(const k3c_tokenizer *t, k3c_regex_state *st, int fast, const uint8_t *s, size_t n, size_t from,
                      size_t *ms, size_t *me) {
    size_t end = fast ? k3c_pretok_ascii(s, n, from) : 0;
    if (end) {
        *ms = from;
        *me = end;
        return 1;
    }
    return k3c_regex_find(t->split, st, (const char *)s, n, from, ms, me);
}

static int encode_ordinary_span(encoder *e, const uint8_t *s, size_t n) {
    size_t from = 0, ms, me;
    int found;
    while (from < n && (found = next_match(e->t, e->split, 1, s, n, from, &ms, &me)) != 0) {
        if (found < 0) return K3C_ERR;
        if (me <= ms) { /* the pattern cannot match empty; should it, step over one character */
            from = ms + k3c_utf8_lead_len(s[ms]);
            continue;
        }
        size_t plen = me - ms;
        size_t need = k3c_bpe_scratch_words(plen);
        if (need > e->scratch_words) {
            uint32_t *p = realloc(e->scratch, need * sizeof *p);
            if (!p) return k3c_errorf("out of memory merging a piece of %zu bytes", plen);
            e->scratch = p;
            e->scratch_words = need;
        }
        e->out->n += k3c_bpe_encode(&e->t->bpe, s + ms, plen, e->out->ids + e->out->n, e->scratch);
        from = me;
    }
    return K3C_OK;
}

int k3c_tokenizer_split(const k3c_tokenizer *t, const uint8_t *s, size_t n, int fast,
                        int (*piece)(void *ctx, size_t start, size_t end), void *ctx) {
    k3c_regex_state *st;
    K3C_TRY(k3c_regex_state_create(t->split, &st));
    size_t from = 0, ms, me;
    int found, rc = K3C_OK;
    while (from < n && (found = next_match(t, st, fast, s, n, from, &ms, &me)) != 0) {
        if (found < 0 || piece(ctx, ms, me)) {
            rc = K3C_ERR;
            break;
        }
        from = me > ms ? me : ms + k3c_utf8_lead_len(s[ms]);
    }
    k3c_regex_state_free(st);
    return rc;
}

static int encode_piece(void *ctx, size_t start, size_t end) {
    encoder *e = ctx;
    const uint8_t *s = e->text + start;
    size_t n = end - start, pos = 0;
    /* at most one id per byte: reserved once, the merges write in place */
    if (tokens_reserve(e->out, n) != K3C_OK) return K3C_ERR;
    for (;;) {
        size_t ss = n, se = n;
        int found = 0;
        if (e->allow_special) {
            found = k3c_regex_find(e->t->specials, e->specials, (const char *)s, n, pos, &ss, &se);
            if (found < 0) return K3C_ERR;
        }
        if (encode_ordinary_span(e, s + pos, (found ? ss : n) - pos) != K3C_OK) return K3C_ERR;
        if (!found) return K3C_OK;
        int32_t i = k3c_bpe_rank(&e->t->special, s + ss, se - ss);
        if (i < 0) return k3c_errorf("tokenizer: the special pattern matched a text that is no special"); /* unreachable */
        e->out->ids[e->out->n++] = (int32_t)e->t->num_base + i;
        pos = se;
    }
}

int k3c_tokenizer_encode(const k3c_tokenizer *t, const char *text, size_t len, int allow_special, k3c_tokens *out) {
    if (len && !text) return k3c_errorf("tokenizer: encode of %zu bytes from a NULL text", len);
    if (!len) return K3C_OK;
    uint8_t *fixed = NULL;
    const uint8_t *s = (const uint8_t *)text;
    if (!k3c_utf8_valid(s, len)) {
        if (len > SIZE_MAX / 3 || !(fixed = malloc(3 * len))) return k3c_errorf("out of memory encoding %zu bytes", len);
        len = k3c_utf8_replace(s, len, fixed, 1, NULL);
        s = fixed;
    }
    encoder e = {.t = t, .text = s, .allow_special = allow_special, .out = out};
    size_t n0 = out->n;
    int rc = k3c_regex_state_create(t->split, &e.split);
    if (rc == K3C_OK && allow_special) rc = k3c_regex_state_create(t->specials, &e.specials);
    if (rc == K3C_OK && k3c_tokenizer_chunks(s, len, K3C_TOKENIZER_WINDOW, K3C_TOKENIZER_RUN, encode_piece, &e) != 0)
        rc = K3C_ERR;
    if (rc != K3C_OK) out->n = n0; /* nothing half-appended */
    k3c_regex_state_free(e.split);
    k3c_regex_state_free(e.specials);
    free(e.scratch);
    free(fixed);
    return rc;
}

int k3c_tokenizer_encode_ordinary(const k3c_tokenizer *t, const char *text, size_t len, k3c_tokens *out) {
    return k3c_tokenizer_encode(t, text, len, 0, out);
}

/* ======================================================================================================
 * Public: ids, decode
 * ====================================================================================================== */

const char *k3c_tokenizer_token(const k3c_tokenizer *t, int32_t id, size_t *len) {
    const k3c_bpe *b = &t->bpe;
    uint32_t i = (uint32_t)id;
    if (id < 0) return NULL;
    if (i >= t->num_base) {
        b = &t->special;
        i -= t->num_base;
        if (i >= t->slots) return NULL;
    }
    *len = b->off[i + 1] - b->off[i];
    return (const char *)b->blob + b->off[i];
}

int32_t k3c_tokenizer_special_id(const k3c_tokenizer *t, const char *name) {
    int32_t i = k3c_bpe_rank(&t->special, (const uint8_t *)name, strlen(name));
    return i < 0 ? -1 : (int32_t)t->num_base + i;
}

int k3c_tokenizer_is_special(const k3c_tokenizer *t, int32_t id) {
    return id >= 0 && (uint32_t)id >= t->num_base && (uint32_t)id < t->num_base + t->slots;
}

const k3c_bpe *k3c_tokenizer_bpe(const k3c_tokenizer *t) { return &t->bpe; }

int32_t k3c_tokenizer_vocab(const k3c_tokenizer *t) { return (int32_t)(t->num_base + t->slots); }
int32_t k3c_tokenizer_num_base(const k3c_tokenizer *t) { return (int32_t)t->num_base; }
int32_t k3c_tokenizer_bos(const k3c_tokenizer *t) { return t->bos; }
int32_t k3c_tokenizer_eos(const k3c_tokenizer *t) { return t->eos; }
int32_t k3c_tokenizer_pad(const k3c_tokenizer *t) { return t->pad; }
int32_t k3c_tokenizer_unk(const k3c_tokenizer *t) { return t->unk; }

static int unknown_id(const k3c_tokenizer *t, size_t at, int32_t id) {
    return k3c_errorf("decode: id %d (position %zu) is outside the vocabulary 0 .. %d", id, at,
                      k3c_tokenizer_vocab(t) - 1);
}

int k3c_tokenizer_decode_bytes(const k3c_tokenizer *t, const int32_t *ids, size_t n, char **out, size_t *len) {
    size_t total = 0, l;
    for (size_t i = 0; i < n; i++) {
        if (!k3c_tokenizer_token(t, ids[i], &l)) return unknown_id(t, i, ids[i]);
        total += l;
    }
    char *buf = malloc(total + 1);
    if (!buf) return k3c_errorf("out of memory decoding %zu ids", n);
    size_t o = 0;
    for (size_t i = 0; i < n; i++) {
        const char *p = k3c_tokenizer_token(t, ids[i], &l);
        memcpy(buf + o, p, l);
        o += l;
    }
    buf[o] = 0;
    *out = buf;
    *len = o;
    return K3C_OK;
}

int k3c_tokenizer_decode(const k3c_tokenizer *t, const int32_t *ids, size_t n, char **out, size_t *len) {
    char *raw;
    size_t rlen;
    K3C_TRY(k3c_tokenizer_decode_bytes(t, ids, n, &raw, &rlen));
    if (k3c_utf8_valid((const uint8_t *)raw, rlen)) {
        *out = raw;
        *len = rlen;
        return K3C_OK;
    }
    char *text = malloc(3 * rlen + 1);
    if (!text) {
        free(raw);
        return k3c_errorf("out of memory decoding %zu ids", n);
    }
    size_t o = k3c_utf8_replace((const uint8_t *)raw, rlen, (uint8_t *)text, 1, NULL);
    text[o] = 0;
    free(raw);
    *out = text;
    *len = o;
    return K3C_OK;
}

/* ======================================================================================================
 * Public: streaming decode
 * ====================================================================================================== */

struct k3c_detokenizer {
    const k3c_tokenizer *t;
    uint8_t pending[4]; /* a well-formed prefix cut by the end of the ids so far */
    size_t npending;
    uint8_t *in, *out;  /* pending + the new token's bytes; their replaced text */
    size_t in_cap, out_cap;
};

int k3c_detokenizer_create(const k3c_tokenizer *t, k3c_detokenizer **out) {
    *out = NULL;
    k3c_detokenizer *d = calloc(1, sizeof *d);
    if (!d) return k3c_errorf("out of memory for a detokenizer");
    d->t = t;
    *out = d;
    return K3C_OK;
}

static int grow(uint8_t **p, size_t *cap, size_t need) {
    if (*cap >= need) return K3C_OK;
    size_t c = *cap ? *cap : 64;
    while (c < need) c *= 2;
    uint8_t *q = realloc(*p, c);
    if (!q) return k3c_errorf("out of memory for %zu bytes of decoded text", c);
    *p = q;
    *cap = c;
    return K3C_OK;
}

static int detok_run(k3c_detokenizer *d, const uint8_t *bytes, size_t n, int final, const char **text, size_t *len) {
    size_t total = d->npending + n;
    K3C_TRY(grow(&d->in, &d->in_cap, total + 1));
    K3C_TRY(grow(&d->out, &d->out_cap, 3 * total + 1));
    memcpy(d->in, d->pending, d->npending);
    if (n) memcpy(d->in + d->npending, bytes, n);
    size_t used;
    size_t o = k3c_utf8_replace(d->in, total, d->out, final, &used);
    d->npending = total - used;
    memcpy(d->pending, d->in + used, d->npending);
    d->out[o] = 0;
    *text = (const char *)d->out;
    *len = o;
    return K3C_OK;
}

int k3c_detokenizer_push(k3c_detokenizer *d, int32_t id, const char **text, size_t *len) {
    size_t l;
    const char *p = k3c_tokenizer_token(d->t, id, &l);
    if (!p) return k3c_errorf("decode: id %d is outside the vocabulary 0 .. %d", id, k3c_tokenizer_vocab(d->t) - 1);
    return detok_run(d, (const uint8_t *)p, l, 0, text, len);
}

int k3c_detokenizer_finish(k3c_detokenizer *d, const char **text, size_t *len) {
    return detok_run(d, NULL, 0, 1, text, len);
}

size_t k3c_detokenizer_pending(const k3c_detokenizer *d) { return d->npending; }

void k3c_detokenizer_free(k3c_detokenizer *d) {
    if (!d) return;
    free(d->in);
    free(d->out);
    free(d);
}
