/* One HTTP generation request while it runs: its choices (one scheduler request each), the text pipeline
 * of every choice, and the bytes waiting for the client.
 *
 * Lifetime: reference counted. The connection holds one reference until MHD reports it completed (the
 * client got everything, or left); every choice queued in the scheduler holds one until its FINISHED
 * event (the scheduler keeps the choice as its `user` pointer until then); a streaming response object
 * holds one until MHD frees it. The last unref frees the request.
 *
 * Threads: the scheduler thread alone runs the choices' text pipelines (output.c); `out`, `body`, the
 * flags and `conn` are guarded by `mu`, shared with the MHD thread (which drains `out` or sends `body`) and
 * the ticker (which adds heartbeats and notices a client that left). */
#ifndef K3C_SERVER_REQUEST_H
#define K3C_SERVER_REQUEST_H

#include <pthread.h>
#include <stdint.h>

#include "k3c.h"
#include "server/buf.h"
#include "server/metrics.h"
#include "server/openai.h"
#include "server/stop.h"
#include "server/text.h"

struct srv_req;

/* A tool call of a chat choice, as streamed (the non-streaming message lists the complete ones). */
typedef struct srv_call {
    int index;
    char *id, *name;
    srv_buf args;
    int complete, voided;
} srv_call;

typedef struct srv_choice {
    struct srv_req *req;
    int index;               /* the OpenAI choice index: prompt * n + sample */
    int prompt;              /* which prompt */
    uint64_t sched_id;
    int submitted;           /* queued in the scheduler (set by the submitter, never cleared): sched_id is valid */
    /* text pipeline (scheduler thread) */
    k3c_detokenizer *detok;  /* completions (a chat parser decodes inside) */
    srv_stop stop;
    srv_tparser *parser;     /* chat only */
    srv_buf text;            /* non-streaming: completions' text, chat's content */
    srv_buf reasoning;       /* non-streaming chat */
    srv_call *calls;         /* non-streaming chat */
    int n_calls;
    cJSON *lp;               /* non-streaming logprobs: chat content array / completions object */
    long text_offset;        /* completions logprobs' text_offset */
    int tokens;              /* completion tokens counted for this choice */
    int done;                /* the output is settled (a stop string, a stop token, the limit, an error) */
    srv_finish finish;
    int n_tool_calls;        /* complete calls seen (reported: not with tool_choice none) */
    int cached_tokens;
    double t_first, t_last;  /* seconds (monotonic) of the first and the latest token */
} srv_choice;

typedef struct srv_req {
    pthread_mutex_t mu;
    int refs;
    void *server;            /* struct srv_server (opaque here) */
    srv_params p;
    const srv_text *text;
    srv_metrics *metrics;
    char id[48];
    long created;
    const char *model_name;
    /* prompts: ids per prompt, and (completions echo) their text */
    int n_prompts;
    int32_t **prompt_ids;
    int *prompt_len;
    int prefix_hint;         /* prompt tokens later requests will likely share (chat: the turns before the
                              * last message; n > 1: the whole prompt) */
    k3c_grammar *grammar;    /* chat: the constrained output (tool_choice required / named, response_format
                              * json), shared by the choices; NULL: none */
    int32_t *stop_ids;       /* the stop token ids given to the scheduler: the request's, the chat format's
                              * end of message and the tokenizer's eos (unless ignore_eos) */
    int n_stop_ids;
    int n_choices;
    srv_choice *choices;
    int n_open;              /* choices whose FINISHED event has not come (scheduler thread) */
    double t_arrival;
    /* shared with the MHD thread and the ticker (mu) */
    srv_buf out;             /* streaming: SSE bytes not yet sent */
    char *body;              /* non-streaming: the response, once complete */
    size_t body_len;
    int status;
    int complete;            /* everything is in out / body */
    int suspended;           /* the connection waits for a resume */
    int gone;                /* the client left (or never got an answer): no more output is wanted */
    void *conn;              /* struct MHD_Connection *, NULL once MHD reported it completed */
    double t_last_write;
    /* the server's list of live requests (the ticker walks it) */
    struct srv_req *prev, *next;
} srv_req;

double srv_now(void); /* CLOCK_MONOTONIC seconds */

/* ---- output.c: the text pipeline of a choice, and the response's JSON (scheduler thread) ---- */
/* Prepares choice c (detokenizer, stop strings, parser). */
int srv_choice_init(srv_req *r, srv_choice *c);
void srv_choice_free(srv_choice *c);
/* One generated token; appends SSE events to out when streaming. Returns 1 when it settled the output (a
 * stop string matched, or a stop token: the caller aborts the scheduler request if it still runs), 0 when
 * the output goes on, -1 on allocation failure. */
int srv_choice_token(srv_choice *c, int32_t token, float logprob, int n_top, const int32_t *top_ids,
                     const float *top_lps, srv_buf *out);
/* The scheduler finished the choice (reason as the scheduler says, unless the output was settled before)
 * with its counts (completion_tokens counts a stop id, as vLLM's usage does) and its queue time; appends
 * the closing events of the choice (streaming) and observes its latencies. */
void srv_choice_finished(srv_choice *c, srv_finish reason, int cached_tokens, int completion_tokens, double queue_s,
                         srv_buf *out);
/* Streaming: the first chunks, before any token (chat: the role chunk of every choice; completions with
 * echo: the prompt's text). */
void srv_req_stream_start(srv_req *r, srv_buf *out);
/* Every choice finished: streaming, the usage chunk (if asked) and [DONE] into out; otherwise the body. */
void srv_req_finalize(srv_req *r, srv_buf *out);
/* A failure while the request ran (an engine error): ends the stream with an error event, or makes the
 * body an error. */
void srv_req_fail(srv_req *r, const srv_error *e, srv_buf *out);

/* ---- sse.c: chunk shapes ---- */
cJSON *srv_chunk_new(const srv_req *r);                         /* id, object, created, model, choices [] */
cJSON *srv_chunk_choice(cJSON *chunk, const srv_req *r, int index); /* a choice with an empty delta / text */
void srv_sse_put(srv_buf *out, cJSON *obj);                     /* "data: <json>\n\n", frees obj */
void srv_sse_done(srv_buf *out);                                /* "data: [DONE]\n\n" */
cJSON *srv_usage(const srv_req *r);                             /* prompt/completion/total + cached_tokens */
/* The text of one token as valid UTF-8 (U+FFFD for a partial character) and its raw bytes (JSON array). */
cJSON *srv_token_string(const k3c_tokenizer *t, int32_t id);
cJSON *srv_token_bytes(const k3c_tokenizer *t, int32_t id);
/* A chat logprobs "content" entry: token, logprob, bytes, top_logprobs. */
cJSON *srv_chat_logprob(const k3c_tokenizer *t, int32_t id, float lp, int n_top, const int32_t *top_ids,
                        const float *top_lps, int want_top);
/* Completions logprobs: appends one token to {tokens, token_logprobs, top_logprobs, text_offset}. */
void srv_completion_logprob(cJSON *obj, const k3c_tokenizer *t, int32_t id, float lp, int n_top,
                            const int32_t *top_ids, const float *top_lps, int want_top, long offset);
cJSON *srv_completion_logprobs_new(void);

#endif
