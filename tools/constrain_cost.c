/* The CPU cost of constrained decoding per generated token (process CPU time on one engine thread, so a loaded
 * machine distorts it far less than wall time), on the embedded trained model or any K3 checkpoint:
 *   cc -O2 -std=gnu11 -Iinclude -Isrc tools/constrain_cost.c build/libk3c.a -lcjson -lpcre2-8 -lm -pthread \
 *       -o build/constrain_cost
 *   build/constrain_cost [MODEL_DIR=models/k3-fortune] [REPS=5] [DEVICE=cpu]
 *   build/constrain_cost preset:NAME [REPS=5]   (the choice alone, over the preset tokenizer's vocabulary)
 * (a CUDA-enabled libk3c.a also needs the CUDA link flags of the Makefile's LDLIBS). DEVICE cuda: the engine on
 * the GPU and every time wall time (the constraint is host work on the scheduler thread either way).
 *
 * Two measurements, each the best of REPS:
 *   - the choice alone (runtime/constrained.h, k3c_constrained_next on random logits rows over the model's
 *     vocabulary): microseconds per token along whole outputs of a named tool call and of a json_object
 *     content, greedy (best logits checked first) and sampled (the whole vocabulary masked);
 *   - end to end through the scheduler, one request at a time: a named tool call (greedy) against the same
 *     prompt unconstrained for the same number of tokens (ignore_eos), CPU milliseconds per token of each,
 *     prompt included in both (the same prompt, so the difference is the constraint's). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "constrain/grammar.h"
#include "k3c.h"
#include "runtime/constrained.h"
#include "runtime/sampler.h"
#include "util/rng.h"

static int wall; /* DEVICE cuda: wall time, else process CPU time */

static double cpu_s(void) {
    struct timespec ts;
    clock_gettime(wall ? CLOCK_MONOTONIC : CLOCK_PROCESS_CPUTIME_ID, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

#define TOOLS                                                                                                      \
    "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"parameters\":{\"type\":\"object\"," \
    "\"properties\":{\"city\":{\"type\":\"string\"},\"unit\":{\"type\":\"string\",\"enum\":[\"celsius\","          \
    "\"fahrenheit\"]},\"days\":{\"type\":\"integer\"}},\"required\":[\"city\",\"unit\"]}}},{\"type\":\"function\"," \
    "\"function\":{\"name\":\"get_time\",\"parameters\":{\"type\":\"object\",\"properties\":{\"zone\":{\"type\":"   \
    "\"string\"}},\"required\":[\"zone\"]}}}]"

static const char *const requests[2] = {
    "{\"messages\":[{\"role\":\"user\",\"content\":\"What is the weather in Paris?\"}]," TOOLS ",\"tool_choice\":"
    "{\"type\":\"function\",\"function\":{\"name\":\"get_weather\"}},\"chat_template_kwargs\":{\"thinking\":false}}",
    "{\"messages\":[{\"role\":\"user\",\"content\":\"A fortune, as JSON\"}],\"response_format\":{\"type\":"
    "\"json_object\"},\"chat_template_kwargs\":{\"thinking\":false}}",
};
static const char *const names[2] = {"named tool call", "json_object"};

/* Microseconds per token of k3c_constrained_next along whole outputs (budget 300 tokens each). */
static double choice_us(const k3c_grammar *g, int V, float temperature, int reps, int *tokens) {
    k3c_rng r;
    k3c_rng_seed(&r, 1);
    float *row = malloc(sizeof *row * (size_t)V);
    k3c_constrained_scratch w;
    k3c_constrained_scratch_init(&w, V);
    double best = 1e30;
    for (int rep = 0; rep < reps; rep++) {
        double spent = 0;
        int n = 0;
        for (int out = 0; out < 20; out++) {
            k3c_sampling sp = {.temperature = temperature, .seed = (uint64_t)out};
            k3c_sampler *s;
            k3c_gmatch *m;
            k3c_sampler_create(&sp, V, &s);
            k3c_gmatch_create(g, &m);
            for (int t = 0; t < 300 && !k3c_gmatch_done(m); t++) {
                for (int i = 0; i < V; i++) row[i] = 4.0f * (float)((k3c_rng_next(&r) >> 11) * (1.0 / 9007199254740992.0));
                int32_t tok;
                double t0 = cpu_s();
                if (k3c_constrained_next(s, m, row, 300 - t, &w, &tok) != K3C_OK) {
                    fprintf(stderr, "constrained choice: %s\n", k3c_last_error());
                    exit(1);
                }
                spent += cpu_s() - t0;
                n++;
            }
            k3c_gmatch_free(m);
            k3c_sampler_free(s);
        }
        if (spent / n < best) best = spent / n;
        *tokens = n;
    }
    k3c_constrained_scratch_release(&w);
    free(row);
    return best * 1e6;
}

/* CPU seconds of one request through a fresh scheduler; *n: the tokens it generated. */
static double one_request(k3c_engine *e, const k3c_tokens *p, const k3c_grammar *g, int max_new, int32_t stop,
                          int *n) {
    k3c_scheduler *s;
    if (k3c_scheduler_create(e, NULL, &s) != K3C_OK) {
        fprintf(stderr, "scheduler: %s\n", k3c_last_error());
        exit(1);
    }
    k3c_sched_request q = {.prompt = p->ids, .n_prompt = (int)p->n, .max_new = max_new, .grammar = g,
                           .ignore_eos = !g, .stop_ids = g ? &stop : NULL, .n_stop_ids = g ? 1 : 0};
    uint64_t id;
    double t0 = cpu_s();
    if (k3c_scheduler_submit(s, &q, &id) != 0) {
        fprintf(stderr, "submit: %s\n", k3c_last_error());
        exit(1);
    }
    *n = 0;
    for (int busy = 1; busy;) {
        const k3c_sched_event *ev;
        int n_ev;
        if (k3c_scheduler_step(s, &ev, &n_ev, &busy) != K3C_OK) {
            fprintf(stderr, "step: %s\n", k3c_last_error());
            exit(1);
        }
        for (int i = 0; i < n_ev; i++) *n += ev[i].kind == K3C_SCHED_TOKEN || (ev[i].kind == K3C_SCHED_FINISHED &&
                                                                                ev[i].finish == K3C_FINISH_STOP);
    }
    double t = cpu_s() - t0;
    k3c_scheduler_free(s);
    return t;
}

/* The choice alone over a preset tokenizer's vocabulary (K3's format where it has <|open|>, else Kimi Linear's). */
static int preset_only(const char *name, int reps) {
    k3c_tokenizer *tok;
    k3c_chat_template *t;
    k3c_grammar_vocab *v;
    if (k3c_tokenizer_load_preset(name, &tok) ||
        k3c_chat_template_from_name(k3c_tokenizer_special_id(tok, "<|open|>") >= 0 ? "kimi-k3" : "kimi-linear", &t) ||
        k3c_grammar_vocab_create(tok, &v)) {
        fprintf(stderr, "%s: %s\n", name, k3c_last_error());
        return 1;
    }
    int V = k3c_tokenizer_vocab(tok);
    printf("preset %s's tokenizer (%s format): vocabulary %d (%d text tokens, %d special)\n", name,
           k3c_chat_template_name(t), V, v->n_sorted, v->n_specials);
    printf("| output | greedy us/token | sampled (T = 1) us/token |\n|---|---|---|\n");
    for (int k = 0; k < 2; k++) {
        k3c_grammar *g;
        if (k3c_chat_grammar_create(t, tok, v, requests[k], strlen(requests[k]), &g)) {
            fprintf(stderr, "grammar: %s\n", k3c_last_error());
            return 1;
        }
        int n;
        double gr = choice_us(g, V, 0, reps, &n), sa = choice_us(g, V, 1, reps, &n);
        printf("| %s | %.1f | %.1f |\n", names[k], gr, sa);
        k3c_grammar_free(g);
    }
    k3c_grammar_vocab_free(v);
    k3c_chat_template_free(t);
    k3c_tokenizer_free(tok);
    return 0;
}

int main(int argc, char **argv) {
    const char *dir = argc > 1 ? argv[1] : "models/k3-fortune";
    int reps = argc > 2 ? atoi(argv[2]) : 5;
    const char *device = argc > 3 ? argv[3] : "cpu";
    wall = !strcmp(device, "cuda");
    if (!strncmp(dir, "preset:", 7)) return preset_only(dir + 7, reps);
    k3c_model *m;
    k3c_tokenizer *tok;
    k3c_chat_template *t;
    k3c_grammar_vocab *v;
    k3c_model_info info;
    if (k3c_load(dir, &m) || k3c_model_info_get(m, &info) || k3c_tokenizer_load(dir, &tok) ||
        k3c_chat_template_load(dir, info.family, &t) || k3c_grammar_vocab_create(tok, &v)) {
        fprintf(stderr, "%s: %s\n", dir, k3c_last_error());
        return 1;
    }
    k3c_engine_options o;
    k3c_engine_options_default(&o);
    o.device = device;
    o.threads = 1;
    o.max_requests = 1;
    o.max_context = 1024;
    k3c_engine *e;
    if (k3c_engine_create(m, &o, &e)) {
        fprintf(stderr, "engine: %s\n", k3c_last_error());
        return 1;
    }
    int V = k3c_engine_vocab(e);
    int32_t ends[8];
    k3c_chat_stop_ids(t, tok, ends, 8);
    printf("%s: vocabulary %d (%d text tokens, %d special), %s\n", dir, V, v->n_sorted, v->n_specials,
           wall ? "the engine on cuda, wall time" : "one engine thread, process CPU time");
    printf("\nthe choice alone (k3c_constrained_next, random logits), us per token:\n");
    printf("| output | greedy | sampled (T = 1) | tokens per output (greedy) |\n|---|---|---|---|\n");
    k3c_grammar *g[2];
    for (int k = 0; k < 2; k++) {
        if (k3c_chat_grammar_create(t, tok, v, requests[k], strlen(requests[k]), &g[k])) {
            fprintf(stderr, "grammar: %s\n", k3c_last_error());
            return 1;
        }
        int n0, n1;
        double gr = choice_us(g[k], V, 0, reps, &n0), sa = choice_us(g[k], V, 1, reps, &n1);
        printf("| %s | %.1f | %.1f | %.0f |\n", names[k], gr, sa, n0 / 20.0);
    }
    printf("\nend to end (the scheduler, one request, prompt included), %s ms per generated token:\n", wall ? "wall" : "CPU");
    printf("| output | tokens | constrained | unconstrained, same prompt and length | difference per token |\n"
           "|---|---|---|---|---|\n");
    for (int k = 0; k < 2; k++) {
        k3c_tokens p = {0};
        if (k3c_chat_encode(t, tok, requests[k], strlen(requests[k]), &p)) {
            fprintf(stderr, "encode: %s\n", k3c_last_error());
            return 1;
        }
        double bc = 1e30, bu = 1e30;
        int n = 0, nu = 0;
        for (int rep = 0; rep < reps; rep++) {
            double c = one_request(e, &p, g[k], 400, ends[0], &n);
            double u = one_request(e, &p, NULL, n, ends[0], &nu);
            if (c < bc) bc = c;
            if (u < bu) bu = u;
        }
        printf("| %s | %d | %.3f | %.3f | %+.3f |\n", names[k], n, 1e3 * bc / n, 1e3 * bu / nu, 1e3 * (bc - bu) / n);
        k3c_tokens_free(&p);
        k3c_grammar_free(g[k]);
    }
    k3c_engine_free(e);
    k3c_grammar_vocab_free(v);
    k3c_chat_template_free(t);
    k3c_tokenizer_free(tok);
    k3c_free(m);
    return 0;
}
