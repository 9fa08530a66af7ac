/* The prompt-lookup (n-gram) drafter: proposes the tokens that followed the most recent earlier occurrence
 * of the history's last n tokens. It needs no model and no state beyond the request's own token history,
 * so it is deterministic and costs nothing next to a forward step. */
#ifndef K3C_RUNTIME_DRAFTER_H
#define K3C_RUNTIME_DRAFTER_H

#include <stdint.h>

/* Longest suffix the lookup tries first (then n - 1, ..., 1). */
#define K3C_DRAFT_NGRAM_MAX 3

/* hist[0..n_hist): the request's tokens so far (prompt + generated, the last one included). Writes up to d
 * drafts to out and returns how many (0 when no suffix of length 1..K3C_DRAFT_NGRAM_MAX occurs earlier).
 *
 * For n = 3, 2, 1 the first n whose suffix hist[n_hist-n..n_hist) occurs at an earlier start i < n_hist - n
 * wins, taking the largest such i (the most recent occurrence). The drafts are the tokens after it,
 * seq[i+n], seq[i+n+1], ..., where seq is the history followed by the drafts already proposed: once the
 * copy reaches the end of the history it continues from its own output, i.e. it assumes the repeat goes on
 * (a loop of period p shorter than d still yields d drafts). So it always returns d when it matches. */
int k3c_draft_ngram(const int32_t *hist, int n_hist, int d, int32_t *out);

#endif
