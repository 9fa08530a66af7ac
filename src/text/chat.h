/* Chat rendering: an OpenAI-shaped chat request (cJSON, as the server receives it) -> the prompt in one of the
 * Kimi chat formats, natively (no Jinja engine). docs/TEXT.md describes the formats and what is refused.
 *
 * The output is text plus segments that say how to tokenize each piece:
 *   - K2 family: one MIXED segment, the whole string, encoded with every special token allowed (what
 *     transformers does with the rendered template: special-token text inside user content becomes control
 *     tokens there too);
 *   - K3: Moonshot's segment renderer (encoding_k3.py): SPECIAL segments are exactly one special token's text
 *     (<|open|>, <|close|>, <|sep|>, <|end_of_msg|>), TEXT segments are encoded with specials NOT allowed
 *     and on their own (no BPE merge across segments), so special-token text inside content stays text.
 * The concatenated text equals what the published Jinja template renders (tests/test_chat.c checks it byte
 * for byte against tests/fixtures/chat/goldens.json). */
#ifndef K3C_TEXT_CHAT_H
#define K3C_TEXT_CHAT_H

#include <cjson/cJSON.h>
#include <stddef.h>

#include "model/config.h" /* k3c_family, for the default format */

#ifdef __cplusplus
extern "C" {
#endif

/* The chat templates k3c renders; each value names the template text it reproduces. */
typedef enum k3c_chat_format {
    K3C_CHAT_NONE = 0,
    /* llama.cpp models/templates/Kimi-K2-Instruct.jinja: default system prompt, tool-call ids rewritten to
     * functions.NAME:N (a counter over the conversation), tool results take those ids in order */
    K3C_CHAT_K2_INSTRUCT,
    /* llama.cpp models/templates/Kimi-K2-Thinking.jinja: as above plus <think> blocks; the "history" split
     * falls after the FIRST assistant turn without tool calls (the template's loop has no break) */
    K3C_CHAT_K2_THINKING,
    /* Moonshot's Kimi-K2-Thinking chat_template (llama.cpp models/templates/moonshotai-Kimi-K2-Thinking.jinja):
     * ids as given (tool_calls[].id, tool_call_id), history split after the LAST plain assistant turn */
    K3C_CHAT_K2_THINKING_MOONSHOT,
    /* Kimi Linear's format where its checkpoint ships no template: the K2-Instruct body with no default
     * system prompt and compact tool JSON (tokenizer-chat.md §3.2, lines 1-25 of the template, and the
     * transformers test ids), ids as given. Never chosen by fingerprint: the full template is not known. */
    K3C_CHAT_KIMI_LINEAR,
    /* Kimi K3: Moonshot's encoding_k3.py (vLLM vllm/tokenizers/encoding_k3.py @2ec5134c); llama.cpp's
     * models/templates/Kimi-K3.jinja renders the same text */
    K3C_CHAT_K3,
} k3c_chat_format;

/* "kimi-k2-instruct", "kimi-k2-thinking", "kimi-k2-thinking-moonshot", "kimi-linear", "kimi-k3"; NULL otherwise. */
const char *k3c_chat_format_name(k3c_chat_format f);
/* The inverse of k3c_chat_format_name (an explicit --chat-format choice); K3C_ERR naming the known names. */
int k3c_chat_format_from_name(const char *name, k3c_chat_format *out);
/* The format used when a checkpoint ships no template: K3 for K3, Kimi Linear's for Kimi Linear. */
k3c_chat_format k3c_chat_format_default(k3c_family family);

/* Identifies a template by the FNV-1a 64 hash of its text with line ends normalised to LF and leading and
 * trailing whitespace removed (whitespace inside a template changes what it renders, so it counts).
 * `source` names where the text came from, for the error: a template k3c does not know is refused, never
 * rendered approximately. */
int k3c_chat_format_detect(const char *text, size_t len, const char *source, k3c_chat_format *out);

/* The format of a model directory: DIR/chat_template.jinja if present (transformers prefers it), else the
 * `chat_template` string of DIR/tokenizer_config.json, else k3c_chat_format_default(family). `source`
 * (optional, `source_n` bytes) receives the file it came from, or "default for <family>". K3C_ERR for an
 * unknown template, a template list (named templates), or an unreadable file. */
int k3c_chat_format_load(const char *model_dir, k3c_family family, k3c_chat_format *out, char *source,
                         size_t source_n);

/* The request, as the OpenAI chat API spells it. Only `messages` is required. */
typedef struct k3c_chat_request {
    const cJSON *messages;       /* array of {role, content, name, tool_calls, tool_call_id, reasoning_content} */
    const cJSON *tools;          /* array of tool schemas, or NULL */
    int add_generation_prompt;   /* end with the assistant's opening (and K3's think/response channel) */
    /* K3 only (the K2 templates have no such switches) */
    int no_thinking;             /* thinking=False: no think channel, no effort message */
    const char *thinking_effort; /* "low" | "high" | "max"; NULL = "max" */
    const cJSON *tool_choice;    /* "required" / "none" add a system message; anything else nothing */
    const cJSON *response_format; /* {"type": "json_object"} or {"type": "json_schema", "json_schema": {...}} */
} k3c_chat_request;

typedef enum k3c_chat_seg_kind {
    K3C_CHAT_SEG_TEXT = 0,    /* encode with special tokens NOT allowed */
    K3C_CHAT_SEG_SPECIAL = 1, /* exactly one special token's text: look its id up by name */
    K3C_CHAT_SEG_MIXED = 2,   /* encode with all special tokens allowed */
} k3c_chat_seg_kind;

typedef struct k3c_chat_segment {
    size_t off, len; /* bytes of k3c_chat_prompt.text */
    k3c_chat_seg_kind kind;
} k3c_chat_segment;

typedef struct k3c_chat_prompt {
    char *text; /* NUL-terminated; len bytes */
    size_t len;
    k3c_chat_segment *segs; /* in order, covering text exactly, none empty */
    size_t n_segs;
} k3c_chat_prompt;

/* Renders the request. K3C_ERR (nothing allocated in *out) for input the format cannot express or that the
 * template itself rejects: a message without a string role, content that is not a string / list of text
 * parts / null, image parts (k3c has no vision input), a tool call without a function name, a K3 tool result
 * whose tool cannot be resolved, an unknown K3 role, a thinking_effort other than low/high/max. The message
 * names the message index and field. Numbers in tools and arguments keep their JSON text only if the tree
 * came from k3c_pyjson_parse (or had k3c_pyjson_keep_literals applied). */
int k3c_chat_render(k3c_chat_format format, const k3c_chat_request *req, k3c_chat_prompt *out);
void k3c_chat_prompt_free(k3c_chat_prompt *p);

#ifdef __cplusplus
}
#endif

#endif
