#include "decode/prepared.h"

const int k3c_prepared_batches[K3C_PREPARED_NUM_BATCHES] = {1, 2, 4, 8, 16, 24, 32, 48, 64};

int k3c_prepared_shape(int rows, int q, int q_max, int max_requests) {
    if (q < 1 || q > K3C_PREPARED_Q_MAX || q > q_max || rows % q) return 0;
    if (rows / q > max_requests) return 0;
    for (int i = 0; i < K3C_PREPARED_NUM_BATCHES; i++)
        if (k3c_prepared_batches[i] == rows) return 1;
    return 0;
}

int k3c_prepared_shapes(int q_max, int max_requests, int (*out)[2], int cap) {
    int n = 0;
    for (int i = 0; i < K3C_PREPARED_NUM_BATCHES; i++)
        for (int q = 1; q <= K3C_PREPARED_Q_MAX; q++)
            if (k3c_prepared_shape(k3c_prepared_batches[i], q, q_max, max_requests)) {
                if (n < cap) {
                    out[n][0] = k3c_prepared_batches[i];
                    out[n][1] = q;
                }
                n++;
            }
    return n;
}
