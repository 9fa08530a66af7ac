/* OpenAI request bodies -> validated parameters, and OpenAI-shaped errors. Pure functions over the body
 * text (no engine, no tokenizer), so the libFuzzer target (tests/fuzz/fuzz_server_request.c) runs them
 * alone. What the model's context or tokenizer decides (prompt length, token ids in range) is checked
 * later, by the routes, with the same error shape. */
#ifndef K3C_SERVER_OPENAI_H
#define K3C_SERVER_OPENAI_H

#include <cjson/cJSON.h>
#include <stddef.h>
#include <stdint.h>

/* {"error": {"message", "type", "param", "code"}}: OpenAI's shape (vLLM's too), with the HTTP status. */
typedef struct srv_error {
    int status;          /* 400, 401, 404, 413, 429, 500, 503 */
    const char *type;    /* "invalid_request_error", "authentication_error", ... (static) */
    const char *code;    /* "context_length_exceeded", "model_not_found", ... or NULL (JSON null) */
    char param[64];      /* the field at fault, "" = null */
    char message[1024];
} srv_error;

/* Fills *e (status 400, invalid_request_error unless told otherwise); returns -1 for `return srv_fail(...)`. */
int srv_fail(srv_error *e, int status, const char *type, const char *code, const char *param, const char *fmt, ...)
    __attribute__((format(printf, 6, 7)));
/* The error's JSON body (malloc'd). */
char *srv_error_json(const srv_error *e);

typedef enum srv_kind { SRV_CHAT = 1, SRV_COMPLETION = 2 } srv_kind;
typedef enum srv_tool_choice { SRV_TOOLS_AUTO = 0, SRV_TOOLS_NONE, SRV_TOOLS_REQUIRED, SRV_TOOLS_NAMED } srv_tool_choice;

/* A completions prompt: text, or token ids. */
typedef struct srv_prompt {
    const char *text; /* inside the parsed tree (NULL for ids) */
    size_t len;
    int32_t *ids;     /* malloc'd */
    int n_ids;
} srv_prompt;

typedef struct srv_params {
    srv_kind kind;
    cJSON *root;               /* the parsed body (owned); strings below point into it */
    const char *model;         /* NULL: the server's model */
    int stream, include_usage, continuous_usage;
    long max_tokens;           /* -1: up to the context */
    float temperature, top_p, min_p;
    int top_k;                 /* 0: off */
    float presence_penalty, frequency_penalty, repetition_penalty;
    int has_seed;
    uint64_t seed;
    const char **stop;         /* [n_stop] (malloc'd array of pointers into root) */
    int n_stop;
    int32_t *stop_token_ids;   /* malloc'd */
    int n_stop_token_ids;
    int n;                     /* choices per prompt */
    int logprobs;              /* 1: the chosen tokens' logprobs */
    int top_logprobs;          /* alternatives per position */
    int ignore_eos, echo, include_stop_str, skip_special_tokens;
    int thinking_given;        /* a thinking switch was in the request (the chat_json needs it spelled out) */
    int priority;
    /* completions */
    srv_prompt *prompts;
    int n_prompts;
    /* chat */
    const cJSON *messages, *tools;
    srv_tool_choice tool_choice;
    const char *tool_name;     /* SRV_TOOLS_NAMED */
    int json_output;           /* response_format json_object or json_schema */
    int add_generation_prompt;
    int no_thinking;           /* chat_template_kwargs.thinking false, or reasoning_effort none / minimal */
    const char *thinking_effort; /* "low" | "high" | "max", or NULL */
    char *chat_json;           /* the body for the chat encoder and parser (malloc'd): as sent, with the thinking
                                * switches as chat_template_kwargs at its end when they came from elsewhere
                                * (reasoning_effort, enable_thinking) */
    size_t chat_json_len;
} srv_params;

/* Most stop strings, n, and top logprobs one request may ask for. */
#define SRV_MAX_STOP 16
#define SRV_MAX_N 128
#define SRV_MAX_TOP_LOGPROBS 20
#define SRV_MAX_PROMPTS 256

/* Parses and validates a /v1/chat/completions or /v1/completions body: malformed JSON, a field of the wrong
 * type or range, and a field the OpenAI API does not have (nor vLLM's extras, listed in openai.c) are errors
 * (400) naming the field. 0 or -1 with *e filled; on failure *p holds nothing to free. */
int srv_parse_request(srv_kind kind, const char *body, size_t len, srv_params *p, srv_error *e);
void srv_params_free(srv_params *p);

/* /tokenize: {"prompt": str} or {"messages": [...]} (+ add_special_tokens, add_generation_prompt, model);
 * /detokenize: {"tokens": [ints]} (+ model). */
typedef struct srv_tokenize_params {
    cJSON *root;
    const char *model;
    const char *prompt;        /* text, or NULL when messages */
    size_t prompt_len;
    const cJSON *messages, *tools;
    int add_special_tokens, add_generation_prompt;
    int32_t *tokens;           /* detokenize (malloc'd) */
    int n_tokens;
} srv_tokenize_params;
int srv_parse_tokenize(const char *body, size_t len, int detokenize, srv_tokenize_params *p, srv_error *e);
void srv_tokenize_params_free(srv_tokenize_params *p);

#endif
