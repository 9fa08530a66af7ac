/* The specialized decode's prepared step shapes: fully specialized steps run
 * b = requests x q rows with b in the prepared batch set {1, 2, 4, 8, 16, 24, 32, 48, 64} (PREPARED_MAX = 64)
 * and q = 1 (decode) or q = 2 .. q_max (uniform verify, every request verifies q tokens). A shape is one
 * (rows, q) pair; the CUDA executor captures one graph per shape. Plain C: the table and its tests do not
 * need a GPU. */
#ifndef K3C_DECODE_PREPARED_H
#define K3C_DECODE_PREPARED_H

#define K3C_PREPARED_MAX 64
#define K3C_PREPARED_NUM_BATCHES 9
#define K3C_PREPARED_Q_MAX 8
/* The wide route's most rows (decode/executor_cuda.h: the attention providers' buffers and the step metadata
 * hold max(PREPARED_MAX, this) rows; the nominal plan table's wide cap, decode/plan.c). */
#define K3C_WIDE_MAX 256

extern const int k3c_prepared_batches[K3C_PREPARED_NUM_BATCHES];

/* 1 when (rows, q) is a prepared shape for an engine whose verify windows hold at most q_max tokens and
 * that runs at most max_requests requests per step. */
int k3c_prepared_shape(int rows, int q, int q_max, int max_requests);
/* Every prepared shape, rows ascending then q ascending, into out[i][0] = rows, out[i][1] = q (at most cap);
 * returns the count. */
int k3c_prepared_shapes(int q_max, int max_requests, int (*out)[2], int cap);

#endif
