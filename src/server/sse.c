/* The JSON of OpenAI's streamed chunks and their server-sent-event framing:
 *   data: {"id": ..., "object": "chat.completion.chunk" | "text_completion", "created", "model", "choices": [...]}
 * one event per line pair, a stable id throughout, the usage chunk with "choices": [], then data: [DONE]. */
#include <stdlib.h>
#include <string.h>

#include "server/request.h"

cJSON *srv_chunk_new(const srv_req *r) {
    cJSON *c = cJSON_CreateObject();
    cJSON_AddStringToObject(c, "id", r->id);
    cJSON_AddStringToObject(c, "object", r->p.kind == SRV_CHAT ? "chat.completion.chunk" : "text_completion");
    cJSON_AddNumberToObject(c, "created", (double)r->created);
    cJSON_AddStringToObject(c, "model", r->model_name);
    cJSON_AddArrayToObject(c, "choices");
    return c;
}

cJSON *srv_chunk_choice(cJSON *chunk, const srv_req *r, int index) {
    cJSON *ch = cJSON_CreateObject();
    cJSON_AddNumberToObject(ch, "index", index);
    if (r->p.kind == SRV_CHAT) cJSON_AddObjectToObject(ch, "delta");
    else cJSON_AddStringToObject(ch, "text", "");
    cJSON_AddNullToObject(ch, "logprobs");
    cJSON_AddNullToObject(ch, "finish_reason");
    cJSON_AddItemToArray(cJSON_GetObjectItemCaseSensitive(chunk, "choices"), ch);
    return ch;
}

void srv_sse_put(srv_buf *out, cJSON *obj) {
    char *s = obj ? cJSON_PrintUnformatted(obj) : NULL;
    cJSON_Delete(obj);
    if (!s) {
        out->failed = 1;
        return;
    }
    srv_buf_puts(out, "data: ");
    srv_buf_puts(out, s);
    srv_buf_puts(out, "\n\n");
    cJSON_free(s);
}

void srv_sse_done(srv_buf *out) { srv_buf_puts(out, "data: [DONE]\n\n"); }

cJSON *srv_usage(const srv_req *r) {
    long prompt = 0, completion = 0, cached = 0;
    for (int i = 0; i < r->n_prompts; i++) prompt += r->prompt_len[i];
    /* cached tokens per prompt: the least any of its choices found (its first sample may find none, the
     * others then hit the blocks it left) */
    for (int pi = 0; pi < r->n_prompts; pi++) {
        long least = -1;
        for (int i = 0; i < r->n_choices; i++)
            if (r->choices[i].prompt == pi && (least < 0 || r->choices[i].cached_tokens < least))
                least = r->choices[i].cached_tokens;
        if (least > 0) cached += least;
    }
    for (int i = 0; i < r->n_choices; i++) completion += r->choices[i].tokens;
    cJSON *u = cJSON_CreateObject();
    cJSON_AddNumberToObject(u, "prompt_tokens", (double)prompt);
    cJSON_AddNumberToObject(u, "total_tokens", (double)(prompt + completion));
    cJSON_AddNumberToObject(u, "completion_tokens", (double)completion);
    cJSON *d = cJSON_AddObjectToObject(u, "prompt_tokens_details");
    cJSON_AddNumberToObject(d, "cached_tokens", (double)cached);
    return u;
}

cJSON *srv_token_string(const k3c_tokenizer *t, int32_t id) {
    char *s = NULL;
    size_t n = 0;
    if (k3c_tokenizer_decode(t, &id, 1, &s, &n) != K3C_OK) return cJSON_CreateString("");
    cJSON *j = srv_json_text(s, n);
    free(s);
    return j;
}

cJSON *srv_token_bytes(const k3c_tokenizer *t, int32_t id) {
    size_t n = 0;
    const char *b = k3c_tokenizer_token(t, id, &n);
    cJSON *a = cJSON_CreateArray();
    for (size_t i = 0; b && i < n; i++) cJSON_AddItemToArray(a, cJSON_CreateNumber((unsigned char)b[i]));
    return a;
}

/* -9999.0 stands for -inf, as vLLM writes it (JSON has no infinity) */
static double finite_lp(float lp) { return lp > -9999.0f ? (double)lp : -9999.0; }

cJSON *srv_chat_logprob(const k3c_tokenizer *t, int32_t id, float lp, int n_top, const int32_t *top_ids,
                        const float *top_lps, int want_top) {
    cJSON *e = cJSON_CreateObject();
    cJSON_AddItemToObject(e, "token", srv_token_string(t, id));
    cJSON_AddNumberToObject(e, "logprob", finite_lp(lp));
    cJSON_AddItemToObject(e, "bytes", srv_token_bytes(t, id));
    cJSON *tops = cJSON_AddArrayToObject(e, "top_logprobs");
    for (int i = 0; i < n_top && i < want_top; i++) {
        cJSON *x = cJSON_CreateObject();
        cJSON_AddItemToObject(x, "token", srv_token_string(t, top_ids[i]));
        cJSON_AddNumberToObject(x, "logprob", finite_lp(top_lps[i]));
        cJSON_AddItemToObject(x, "bytes", srv_token_bytes(t, top_ids[i]));
        cJSON_AddItemToArray(tops, x);
    }
    return e;
}

cJSON *srv_completion_logprobs_new(void) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddArrayToObject(o, "tokens");
    cJSON_AddArrayToObject(o, "token_logprobs");
    cJSON_AddArrayToObject(o, "top_logprobs");
    cJSON_AddArrayToObject(o, "text_offset");
    return o;
}

void srv_completion_logprob(cJSON *obj, const k3c_tokenizer *t, int32_t id, float lp, int n_top,
                            const int32_t *top_ids, const float *top_lps, int want_top, long offset) {
    cJSON_AddItemToArray(cJSON_GetObjectItemCaseSensitive(obj, "tokens"), srv_token_string(t, id));
    cJSON_AddItemToArray(cJSON_GetObjectItemCaseSensitive(obj, "token_logprobs"), cJSON_CreateNumber(finite_lp(lp)));
    cJSON *tops = cJSON_CreateObject();
    for (int i = 0; i < n_top && i < want_top; i++) {
        char *s = NULL;
        size_t n = 0;
        if (k3c_tokenizer_decode(t, &top_ids[i], 1, &s, &n) != K3C_OK) continue;
        /* two ids with one text: the first (the more likely) keeps the key; a key is a C string, so a
         * token holding a NUL byte is cut there */
        if (!cJSON_GetObjectItemCaseSensitive(tops, s)) cJSON_AddNumberToObject(tops, s, finite_lp(top_lps[i]));
        free(s);
    }
    cJSON_AddItemToArray(cJSON_GetObjectItemCaseSensitive(obj, "top_logprobs"), tops);
    cJSON_AddItemToArray(cJSON_GetObjectItemCaseSensitive(obj, "text_offset"), cJSON_CreateNumber((double)offset));
}
