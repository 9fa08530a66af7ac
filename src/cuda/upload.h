/* Host bytes into device memory at the rate of the host's reads: util/staging.h's pipeline with a few pinned
 * staging buffers (allocated for one upload, freed after it), reader threads copying the sources into them
 * (memcpy from the checkpoint mapping faults the page cache in) while cudaMemcpyAsync on one stream uploads
 * the buffers filled before, and an event per buffer to recycle it. One H2D stream is enough: copies in one
 * direction share one copy engine, and back-to-back 64 MiB copies keep it busy.
 *
 * Where cudaHostAlloc is refused, the buffers are pageable (malloc) with a one-line warning: cudaMemcpyAsync
 * from pageable memory returns once the driver has staged the bytes, so the same pipeline stays correct at
 * the driver's pageable rate. */
#ifndef K3C_CUDA_UPLOAD_H
#define K3C_CUDA_UPLOAD_H

#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime_api.h>

#include "util/staging.h"

typedef struct k3c_cuda_upload_opts {
    int readers;         /* reader threads; 0: k3c_stage_default_readers(); -1: none, the calling thread fills
                          * each buffer before queueing it (the previous upload's shape, for comparison) */
    int buffers;         /* staging buffers; 0: 4 */
    size_t buffer_bytes; /* each; 0: 64 MiB */
    int pageable;        /* 1: malloc'd staging, as when cudaHostAlloc is refused (tests, benchmark) */
} k3c_cuda_upload_opts;

typedef struct k3c_cuda_upload_stats {
    k3c_stage_stats run; /* the pipeline (payload bytes, its seconds, waits) */
    double seconds;      /* the whole upload: staging allocated, pipeline, stream drained, staging freed */
    double alloc_s;      /* allocating (and freeing) the staging buffers */
    int buffers;
    size_t buffer_bytes;
    int pinned;          /* 0: the pageable fallback */
} k3c_cuda_upload_stats;

/* Called on the calling thread once the last copy of extent i is queued on the stream (e.g. to queue an
 * in-place conversion kernel after it), and with the payload bytes queued after each staging buffer. */
typedef struct k3c_cuda_upload_hooks {
    void *ctx;
    int (*extent_done)(void *ctx, size_t extent, cudaStream_t stream);
    void (*queued)(void *ctx, uint64_t bytes);
} k3c_cuda_upload_hooks;

/* Copies ex[i].bytes from ex[i].src to dst_base + ex[i].dst for every extent (sorted by dst, not
 * overlapping; gaps shorter than 256 bytes are written as zeros) on `stream`; returns with every copy
 * complete and the stream drained. opts, hooks, stats may be NULL. */
int k3c_cuda_upload(uint8_t *dst_base, const k3c_stage_extent *ex, size_t n, cudaStream_t stream,
                    const k3c_cuda_upload_opts *opts, const k3c_cuda_upload_hooks *hooks,
                    k3c_cuda_upload_stats *stats);

#endif
