/* The server's text side: k3c.h's tokenizer and chat API, loaded once per server. */
#include "server/text.h"

#include <stdlib.h>
#include <string.h>

struct srv_text {
    k3c_tokenizer *tok;
    k3c_chat_template *tmpl;
    k3c_grammar_vocab *vocab; /* the tokenizer's tokens for grammars, built once */
    int32_t end_ids[8];
    int n_end;
};

int srv_text_create(const char *model_dir, const char *preset, const char *family, srv_text **out) {
    *out = NULL;
    srv_text *t = calloc(1, sizeof *t);
    if (!t) return K3C_ERR;
    int rc = model_dir && k3c_tokenizer_present(model_dir) ? k3c_tokenizer_load(model_dir, &t->tok)
                                                             : k3c_tokenizer_load_preset(preset ? preset : "tiny", &t->tok);
    if (rc == K3C_OK) rc = k3c_chat_template_load(model_dir, family, &t->tmpl);
    if (rc == K3C_OK) rc = k3c_grammar_vocab_create(t->tok, &t->vocab);
    if (rc == K3C_OK) {
        t->n_end = k3c_chat_stop_ids(t->tmpl, t->tok, t->end_ids, 8);
        if (t->n_end < 0) rc = K3C_ERR;
        else if (t->n_end > 8) t->n_end = 8;
    }
    if (rc != K3C_OK) {
        srv_text_free(t);
        return K3C_ERR;
    }
    *out = t;
    return K3C_OK;
}

void srv_text_free(srv_text *t) {
    if (!t) return;
    k3c_grammar_vocab_free(t->vocab);
    k3c_chat_template_free(t->tmpl);
    k3c_tokenizer_free(t->tok);
    free(t);
}

const k3c_tokenizer *srv_text_tokenizer(const srv_text *t) { return t->tok; }
const char *srv_text_format_name(const srv_text *t) { return k3c_chat_template_name(t->tmpl); }

const int32_t *srv_text_end_ids(const srv_text *t, int *n) {
    *n = t->n_end;
    return t->end_ids;
}

int srv_text_chat_encode(const srv_text *t, const char *json, size_t len, k3c_tokens *out, srv_error *e) {
    if (k3c_chat_encode(t->tmpl, t->tok, json, len, out) == K3C_OK) return 0;
    if (k3c_last_error_kind() == K3C_ERROR_INPUT) return srv_fail(e, 400, NULL, NULL, "messages", "%s", k3c_last_error());
    return srv_fail(e, 500, "server_error", NULL, NULL, "%s", k3c_last_error());
}

int srv_text_grammar(const srv_text *t, const char *json, size_t len, k3c_grammar **out, srv_error *e) {
    if (k3c_chat_grammar_create(t->tmpl, t->tok, t->vocab, json, len, out) == K3C_OK) return 0;
    const char *msg = k3c_last_error();
    const char *param = !strncmp(msg, "response_format", 15) ? "response_format"
                        : !strncmp(msg, "tools", 5)           ? "tools"
                                                              : "tool_choice";
    if (k3c_last_error_kind() == K3C_ERROR_INPUT) return srv_fail(e, 400, NULL, NULL, param, "%s", msg);
    return srv_fail(e, 500, "server_error", NULL, NULL, "%s", msg);
}

int srv_tparser_create(const srv_text *t, const char *json, size_t len, srv_tparser **out) {
    return k3c_chat_parser_create(t->tmpl, t->tok, json, len, out);
}

void srv_tparser_free(srv_tparser *p) { k3c_chat_parser_free(p); }
