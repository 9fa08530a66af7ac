/* Prompt-lookup drafting (runtime/drafter.h). A backward scan per suffix length: O(n_hist * n) per call,
 * which for the histories a request holds (thousands of tokens) is microseconds beside a forward step. */
#include "runtime/drafter.h"

static int suffix_at(const int32_t *hist, int n_hist, int n, int i) {
    for (int k = 0; k < n; k++)
        if (hist[i + k] != hist[n_hist - n + k]) return 0;
    return 1;
}

int k3c_draft_ngram(const int32_t *hist, int n_hist, int d, int32_t *out) {
    if (!hist || n_hist <= 1 || d <= 0) return 0;
    for (int n = K3C_DRAFT_NGRAM_MAX; n >= 1; n--) {
        if (n >= n_hist) continue;
        for (int i = n_hist - n - 1; i >= 0; i--) {
            if (!suffix_at(hist, n_hist, n, i)) continue;
            /* seq = hist ++ out: position p < n_hist reads the history, later ones the drafts so far
             * (p - n_hist < k always holds since i + n < n_hist) */
            for (int k = 0; k < d; k++) {
                int p = i + n + k;
                out[k] = p < n_hist ? hist[p] : out[p - n_hist];
            }
            return d;
        }
    }
    return 0;
}
