/* What the CUDA backend shows to the specialized decode executor (decode/executor_cuda.c), which reads the
 * backend's weights in place (it never copies or modifies them) and checks them in its tests. */
#ifndef K3C_CUDA_BACKEND_CUDA_H
#define K3C_CUDA_BACKEND_CUDA_H

#include <stddef.h>

#include "cuda/op_profile.h"
#include "cuda/upload.h"
#include "backend/backend.h"

/* 1 when be is an initialised CUDA backend. */
int k3c_backend_is_cuda(const k3c_backend *be);
/* The device copy of the weight whose host view is (or contains) host, or NULL when it was not uploaded
 * (also for the MoE expert arrays: their device k3c_cuda_expert table). */
void *k3c_backend_cuda_weight(k3c_backend *be, const void *host);
/* The weight arena: every backbone weight lives in [*base, *base + *bytes). */
void k3c_backend_cuda_arena(k3c_backend *be, void **base, size_t *bytes);
/* The backend's CUDA device. */
int k3c_backend_cuda_device(const k3c_backend *be);
/* 1 when the exact f32 diagnostic is on (no bf16 rounding): the executor then plans every step stock. */
int k3c_backend_cuda_exact(const k3c_backend *be);
/* The backend's stream (a cudaStream_t): every op is queued on it; a communicator whose collectives the stock
 * forward runs between the ops (comm/comm.h stream_ordered) is made for this stream. */
void *k3c_backend_cuda_stream(const k3c_backend *be);
/* The weight upload of init (bytes, seconds and how: what its progress line printed). */
void k3c_backend_cuda_load_stats(const k3c_backend *be, k3c_cuda_upload_stats *out);
/* The per-op profile of the stock path (cuda/op_profile.h), or NULL when K3C_CUDA_PROFILE was not set. */
k3c_op_profile *k3c_backend_cuda_profile(k3c_backend *be);

#endif
