/* Block stamps (K3C_CUDA_PROFILE=3, a diagnostic): every stamped CTA of a kernel writes a record with the GPU's
 * global timer (%globaltimer, ns, one clock for all SMs) when it starts, when its griddepcontrol.wait returns
 * (k3c_pdl_wait) and when each of its warps ends. From them a replayed step gives, per launch, the spread of
 * block arrivals (the launch ramp), of block ends (the drain) and the gaps between launches: the phase costs a
 * persistent decode kernel would remove (docs/decode-limits.md). cuda/stamp.cuh holds the device side (a line
 * at a kernel's start and one at its end); this header the record layout shared with the host report
 * (decode/stamp_report.h), plain C.
 *
 * Records go to K3C_STAMP_REGIONS regions of `cap` records, one region per (SM, warp slot mod 4), each with
 * its own counter, so that the atomic that claims a slot is shared by few warps. Launches are told apart by
 * %gridid (a per-launch number of the context, in launch order); blocks by their linear index. Only a build
 * with STAMPS=1 (-DK3C_STAMPS=1) has them; there, off, each stamped kernel reads one __constant__ pointer at
 * its start, at its wait and at its end (1.4-4.3 % of a decode step: cuda/stamp.cuh). */
#ifndef K3C_CUDA_STAMP_H
#define K3C_CUDA_STAMP_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define K3C_STAMP_REGIONS 1024 /* (smid & 255) * 4 + (warpid & 3): H200's 132 SMs use 528 */

/* 16 bytes. info: kid << 24 | kind << 22 | block index (low 22 bits: grids of up to 4M blocks are told apart). */
typedef struct k3c_stamp_rec {
    uint64_t t;    /* %globaltimer, ns */
    uint32_t grid; /* %gridid, low 32 bits */
    uint32_t info;
} k3c_stamp_rec;

enum { K3C_STAMP_BEGIN = 0, K3C_STAMP_WAIT = 1, K3C_STAMP_END = 2 };
#define K3C_STAMP_INFO(kid, kind, block) (((uint32_t)(kid) << 24) | ((uint32_t)(kind) << 22) | ((uint32_t)(block) & 0x3fffffu))
#define K3C_STAMP_KID(info) ((int)((info) >> 24))
#define K3C_STAMP_KIND(info) ((int)(((info) >> 22) & 3u))
#define K3C_STAMP_BLOCKID(info) ((uint32_t)((info) & 0x3fffffu))

/* What the device reads (one __constant__ copy per translation unit, cuda/stamp.cuh): rec NULL = off. */
typedef struct k3c_stamp_ctl {
    k3c_stamp_rec *rec;    /* device, [K3C_STAMP_REGIONS * cap] */
    unsigned int *count;   /* device, [K3C_STAMP_REGIONS]: records claimed (may pass cap: those are dropped) */
    unsigned int cap;      /* records per region */
    unsigned int pad;
} k3c_stamp_ctl;

/* The stamped kernels (kid). WAIT records carry K3C_KID_NONE (the wait does not know its kernel); the launch
 * they belong to is found by grid. A new stamped kernel adds its name here and in decode/stamp_report.c. */
typedef enum k3c_stamp_kid {
    K3C_KID_NONE = 0,
    K3C_KID_GEMV_T1, K3C_KID_GEMV_T1_GROUP, K3C_KID_GEMV_MMA, K3C_KID_GEMV_MMA_GROUP, K3C_KID_GEMV_SCALAR,
    K3C_KID_F32_TO_BF16,
    K3C_KID_RMSNORM, K3C_KID_ADD_RMSNORM, K3C_KID_GATED_ACT, K3C_KID_EMBED, K3C_KID_ADD, K3C_KID_ROUND,
    K3C_KID_SIGMOID, K3C_KID_MUL_SIGMOID,
    K3C_KID_ATTNRES_MIX,
    K3C_KID_ROUTE, K3C_KID_ROUTE_ACT,
    K3C_KID_ARGMAX,
    K3C_KID_COPY_BATCH,
    K3C_KID_KDA_CONV, K3C_KID_KDA_GATE, K3C_KID_KDA_QK_NORM, K3C_KID_KDA_RECURRENT, K3C_KID_KDA_CHUNKED,
    K3C_KID_KDA_GATED_NORM, K3C_KID_KDA_DECODE_FUSED,
    K3C_KID_MLA_CACHE_WRITE, K3C_KID_MLA_ABSORB_Q, K3C_KID_MLA_ABSORB_Q_V, K3C_KID_MLA_ABSORB_O_V,
    K3C_KID_MLA_ABSORB_O, K3C_KID_MLA_ATTEND, K3C_KID_MLA_ATTEND_BF16V, K3C_KID_MLA_ATTEND_HG,
    K3C_KID_MLA_ATTEND_MERGE,
    K3C_KID_MOE_MMA, K3C_KID_MOE_COMBINE,
    K3C_KID_MOE_PAIR_GATE_UP, K3C_KID_MOE_PAIR_DOWN, K3C_KID_MOE_PAIR_MX, K3C_KID_MOE_BAND_LISTS, K3C_KID_MOE_BAND,
    K3C_KID_COUNT
} k3c_stamp_kid;

/* Host side (cuda/stamp.cu; CUDA builds only). */
typedef struct k3c_cuda_stamps k3c_cuda_stamps;
/* Device buffers for `records` records in all (0: 24M, 384 MiB: a k3-slice b=64 step should write ~6M, mostly the
 * cuBLASLt products' staging and rounding kernels, in 528 of the 1024 regions on an H200), the globaltimer's
 * tick measured once and the stamp checked on the device (a self-test kernel). */
int k3c_cuda_stamps_create(size_t records, k3c_cuda_stamps **out);
void k3c_cuda_stamps_free(k3c_cuda_stamps *s);
/* On: zeroes the counters and points every stamped translation unit at the buffers, in stream order on s.
 * Off: NULL pointers again (in stream order). */
int k3c_cuda_stamps_on(k3c_cuda_stamps *s, void *stream);
int k3c_cuda_stamps_off(k3c_cuda_stamps *s, void *stream);
/* After s is idle: the records into a host array it owns (valid until the next download or free), their
 * count, and how many were dropped (regions full). */
int k3c_cuda_stamps_download(k3c_cuda_stamps *s, const k3c_stamp_rec **rec, size_t *n, size_t *dropped);
/* The globaltimer's smallest step seen by one thread (ns), measured at create. */
double k3c_cuda_stamps_tick_ns(const k3c_cuda_stamps *s);

/* Kernel nodes in the graph `stream` is capturing into, or -1 when it is not capturing (or cannot be read).
 * The executor counts them around each op of a step it records, to map launches to ops. */
long k3c_cuda_capture_kernel_nodes(void *stream);
/* Kernel nodes captured by launches k3c does not stamp (cuBLASLt), summed since the process started, while
 * counting is on: gemm.cu brackets its cuBLASLt call with begin (returns the node count, or -1 when not
 * counting) and end. */
void k3c_cuda_stamp_counting(int on);
long k3c_cuda_stamp_foreign_begin(void *stream);
void k3c_cuda_stamp_foreign_end(void *stream, long begin);
long k3c_cuda_stamp_foreign_nodes(void);

/* Per translation unit with stamped kernels (K3C_STAMP_TU in cuda/stamp.cuh): copies *c into its __constant__
 * copy in stream order. */
int k3c_stamp_bind_attnres(const k3c_stamp_ctl *c, void *stream);
int k3c_stamp_bind_decode_copy(const k3c_stamp_ctl *c, void *stream);
int k3c_stamp_bind_elementwise(const k3c_stamp_ctl *c, void *stream);
int k3c_stamp_bind_gemm(const k3c_stamp_ctl *c, void *stream);
int k3c_stamp_bind_kda(const k3c_stamp_ctl *c, void *stream);
int k3c_stamp_bind_mla(const k3c_stamp_ctl *c, void *stream);
int k3c_stamp_bind_moe(const k3c_stamp_ctl *c, void *stream);
int k3c_stamp_bind_moe_pair(const k3c_stamp_ctl *c, void *stream);
int k3c_stamp_bind_router(const k3c_stamp_ctl *c, void *stream);
int k3c_stamp_bind_sample(const k3c_stamp_ctl *c, void *stream);

#ifdef __cplusplus
}
#endif

#endif
