/* The mailbox kernels (comm/mailbox_dev.h: the region layout and the block pairing; comm/mailbox.h: the
 * protocol, whose host-thread model tests/test_mailbox.c runs). Each kernel runs `blocks` blocks of
 * K3C_MBX_THREADS threads per rank and is instantiated per rank count (2 .. 8), so the loops over ranks
 * unroll and a thread issues all its ranks' loads before its sums:
 *   one-shot   push x into every peer's slot; flags; wait; sum the slots in rank order (and round)
 *   two-shot   push each shard's piece to the shard's owner; flags; wait; the owner sums its shard in rank
 *              order into x and every peer's ag slot; flags; wait; copy the other shards in
 *   exchange   a gather or a broadcast: push; flags; wait; copy
 *   finish     a one-shot whose push a product's epilogue made: flags; wait; sum (and round)
 *   reduce_norm a one-shot over whole rows: push; flags; wait; sum, round and RMSNorm each row
 *
 * Memory order: a block's threads store their data (st.global.cg, not allocated in L1; over NVLink where
 * the peer is another GPU), each thread then fences (__threadfence_system: fence.sc.sys), the block meets
 * (bar.sync), and thread p stores peer p's flag: count and op relaxed, then the epoch with st.release.sys.
 * In the reader, thread p spins on ld.acquire.sys of the flag from peer p until it holds the call's
 * epoch, the block meets, and then its threads read the slots with ld.global.cg (from L2, which the
 * writes went through: never a stale L1 line left from the slot's use two calls before). System scope
 * throughout: a peer may be another GPU or another process.
 *
 * Sums: element i is ((v_0 + v_1) + v_2) + ... in f32, v_p rank p's value, rank 0 first: the same
 * expression on every rank (one-shot), or computed once by the shard's owner and copied (two-shot), so
 * every rank ends with the same bits, the one-shot and the two-shot the same bits as each other, and
 * -0 + -0 stays -0 (the sum starts from rank 0's value, not from +0). No value is a sentinel: any bits.
 *
 * Waits are bounded: a spin reads %globaltimer every 64 polls and gives up after the timeout; it also
 * ends when the abort word of this rank's region is set (a peer gave up) or another block of this rank
 * has failed. The first failing block of a rank reports into the rank's host-mapped status (code last),
 * sets the rank's failed word (its later calls return at once) and, for a timeout or a mismatch, writes
 * its rank into every peer's abort word (their waits end now instead of at their own timeouts). */
#include "comm/mailbox_dev.h"

#include <cuda_runtime.h>

#include "comm/mailbox_order.cuh"
#include "cuda/check.h"

namespace {

__device__ __forceinline__ k3c_mbx_state *state_of(const k3c_mbx_args &a, int rank) {
    return (k3c_mbx_state *)a.region[rank];
}

/* The rank's first failure: the report (code last), the failed word, the peers told (not for an abort:
 * the aborting rank told them itself). */
__device__ void mbx_fail(const k3c_mbx_args &a, uint32_t code, int peer, uint32_t e, uint32_t seen, uint32_t count,
                         uint32_t op, uint32_t peer_count, uint32_t peer_op) {
    if (atomicCAS(&state_of(a, a.rank)->failed, 0u, 1u) != 0u) return; /* reported before */
    if (code != K3C_MBX_ERR_ABORTED)
        for (int p = 0; p < a.lay.ranks; p++) {
            uint32_t *w = &state_of(a, p)->abort;
            if (p != a.rank && ld_relaxed_sys(w) == 0) st_relaxed_sys(w, (uint32_t)a.rank + 1);
        }
    volatile k3c_mbx_status *s = a.status;
    s->peer = (uint32_t)peer;
    s->epoch = e;
    s->seen = seen;
    s->count = count;
    s->op = op;
    s->peer_count = peer_count;
    s->peer_op = peer_op;
    s->block = blockIdx.x;
    __threadfence_system();
    st_release_sys(&a.status->code, code);
}

/* Thread 0 at a call's start: false when this rank failed before (it reported then) or was aborted. */
__device__ bool mbx_live(const k3c_mbx_args &a, uint32_t e, uint32_t count, uint32_t op) {
    k3c_mbx_state *st = state_of(a, a.rank);
    if (*(volatile uint32_t *)&st->failed) return false;
    uint32_t ab = ld_relaxed_sys(&st->abort);
    if (ab) {
        mbx_fail(a, K3C_MBX_ERR_ABORTED, (int)ab - 1, e, 0, count, op, 0, 0);
        return false;
    }
    return true;
}

/* Spins until flag f (from `peer`) holds epoch e, then checks the peer made the same call; false (after
 * the report) on a timeout, an abort, a mismatch, or another block's failure. */
__device__ bool mbx_wait(const k3c_mbx_args &a, const k3c_mbx_flag *f, int peer, uint32_t e, uint32_t count,
                         uint32_t op) {
    k3c_mbx_state *st = state_of(a, a.rank);
    unsigned long long t0 = 0;
    uint32_t v;
    for (unsigned k = 1; (v = ld_acquire_sys(&f->epoch)) != e; k++) {
        if (k % 64) continue;
        if (*(volatile uint32_t *)&st->failed) return false;
        uint32_t ab = ld_relaxed_sys(&st->abort);
        if (ab) {
            mbx_fail(a, K3C_MBX_ERR_ABORTED, (int)ab - 1, e, v, count, op, 0, 0);
            return false;
        }
        unsigned long long t = now_ns();
        if (!t0)
            t0 = t;
        else if (t - t0 > a.timeout_ns) {
            mbx_fail(a, K3C_MBX_ERR_TIMEOUT, peer, e, v, count, op, 0, 0);
            return false;
        }
        if (k > 4096) __nanosleep(100); /* a long wait (a slow or missing peer): poll the flag less hard */
    }
    uint32_t pc = ld_relaxed_sys(&f->count), po = ld_relaxed_sys(&f->op);
    if (pc != count || po != op) {
        mbx_fail(a, K3C_MBX_ERR_MISMATCH, peer, e, v, count, op, pc, po);
        return false;
    }
    return true;
}

struct mbx_block {
    uint32_t e;
    int ok;
};

/* Every thread: the block's epoch in sh->e; false when the call must not run (see mbx_live). */
__device__ bool mbx_begin(const k3c_mbx_args &a, mbx_block *sh, uint32_t count, uint32_t op) {
    if (threadIdx.x == 0) {
        sh->e = state_of(a, a.rank)->epoch[blockIdx.x];
        sh->ok = mbx_live(a, sh->e, count, op);
    }
    __syncthreads();
    return sh->ok;
}

/* After the block's data stores: each thread's fence, the block's barrier, then thread p posts this block's
 * flag (e, count, op) into peer p's flag array `at`. */
__device__ void mbx_post_all(const k3c_mbx_args &a, size_t at, uint32_t e, uint32_t count, uint32_t op) {
    __threadfence_system();
    __syncthreads();
    const int p = threadIdx.x;
    if (p < a.lay.ranks && p != a.rank) {
        k3c_mbx_flag *f = k3c_mbx_flag_at(a.region[p], at, &a.lay, e & 1, blockIdx.x, a.rank);
        st_relaxed_sys(&f->count, count);
        st_relaxed_sys(&f->op, op);
        st_release_sys(&f->epoch, e);
    }
}

/* Thread p waits for peer p's flag in this rank's array `at`; then the block meets. Every thread: true when
 * every peer's flag came and matched. (sh->ok is read after this barrier and written again only after the
 * next one, which mbx_post_all or the kernel's end puts between.) */
__device__ bool mbx_wait_all(const k3c_mbx_args &a, mbx_block *sh, size_t at, uint32_t e, uint32_t count,
                             uint32_t op) {
    const int p = threadIdx.x;
    if (p < a.lay.ranks && p != a.rank &&
        !mbx_wait(a, k3c_mbx_flag_at(a.region[a.rank], at, &a.lay, e & 1, blockIdx.x, p), p, e, count, op))
        sh->ok = 0;
    __syncthreads();
    return sh->ok;
}

__device__ __forceinline__ void mbx_end(const k3c_mbx_args &a, uint32_t e) {
    if (threadIdx.x == 0) state_of(a, a.rank)->epoch[blockIdx.x] = k3c_mbx_next_epoch(e);
}

__device__ __forceinline__ bool aligned16(const void *p) { return ((uintptr_t)p & 15) == 0; }

/* dst[p][lo, hi) = x[lo, hi) for the peers p != me of R (only: that one peer; -1: all of them), dst[p]
 * rank p's slot (b, me) of the slot array `at`. lo is a multiple of 4 (k3c_mbx_part). */
template <int R>
__device__ void push(const k3c_mbx_args &a, size_t at, uint32_t b, const float *x, size_t lo, size_t hi, int only) {
    const int me = a.rank;
    float *d[R];
#pragma unroll
    for (int p = 0; p < R; p++) d[p] = k3c_mbx_slot_at(a.region[p], at, &a.lay, b, me);
    size_t i0 = lo;
    if (aligned16(x)) {
        const size_t hi4 = hi / 4;
        for (size_t j = lo / 4 + threadIdx.x; j < hi4; j += blockDim.x) {
            const float4 v = __ldcg(reinterpret_cast<const float4 *>(x) + j);
#pragma unroll
            for (int p = 0; p < R; p++)
                if (p != me && (only < 0 || p == only)) __stcg(reinterpret_cast<float4 *>(d[p]) + j, v);
        }
        i0 = hi4 * 4;
    }
    for (size_t i = i0 + threadIdx.x; i < hi; i += blockDim.x) {
        const float v = __ldcg(x + i);
#pragma unroll
        for (int p = 0; p < R; p++)
            if (p != me && (only < 0 || p == only)) __stcg(d[p] + i, v);
    }
}

__device__ __forceinline__ float4 add4(float4 s, float4 v) {
    s.x += v.x, s.y += v.y, s.z += v.z, s.w += v.w;
    return s;
}

/* f32 -> the nearest bf16 value (round to nearest even, NaN kept quiet), as an f32: the bits of
 * cuda/common.cuh's k3c_dev_bf16(k3c_dev_to_bf16(v)), the backend's rounding (k3c_cuda_round_bf16), written
 * out here so that the CPU emulation (tools/mailbox_emu) needs no backend header. */
__device__ __forceinline__ float round_bf16(float v) {
    uint32_t u = __float_as_uint(v);
    if ((u & 0x7fffffffu) > 0x7f800000u) return __uint_as_float((u | 0x400000u) & 0xffff0000u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return __uint_as_float(u & 0xffff0000u);
}

__device__ __forceinline__ float4 round4(float4 v) {
    v.x = round_bf16(v.x), v.y = round_bf16(v.y), v.z = round_bf16(v.z), v.w = round_bf16(v.w);
    return v;
}

/* x[lo, hi) = the rank-order sum of x (rank me's values) and this rank's slots (b, p) of the peers (with
 * round, each sum rounded to bf16 after it is complete: the backend's rounding pass after the sum); with
 * to_ag, each sum is also stored into every peer's ag slot (b, me). */
template <int R>
__device__ void reduce(const k3c_mbx_args &a, uint32_t b, float *x, size_t lo, size_t hi, bool to_ag,
                       bool round = false) {
    const int me = a.rank;
    const float *s[R];
    float *g[R];
#pragma unroll
    for (int p = 0; p < R; p++) {
        s[p] = p == me ? x : k3c_mbx_slot_at(a.region[me], a.lay.slots, &a.lay, b, p);
        g[p] = k3c_mbx_slot_at(a.region[p], a.lay.ag, &a.lay, b, me);
    }
    size_t i0 = lo;
    if (aligned16(x)) {
        const size_t hi4 = hi / 4;
        for (size_t j = lo / 4 + threadIdx.x; j < hi4; j += blockDim.x) {
            float4 v[R];
#pragma unroll
            for (int p = 0; p < R; p++) v[p] = __ldcg(reinterpret_cast<const float4 *>(s[p]) + j);
            float4 acc = v[0];
#pragma unroll
            for (int p = 1; p < R; p++) acc = add4(acc, v[p]);
            if (round) acc = round4(acc);
            reinterpret_cast<float4 *>(x)[j] = acc;
            if (to_ag)
#pragma unroll
                for (int p = 0; p < R; p++)
                    if (p != me) __stcg(reinterpret_cast<float4 *>(g[p]) + j, acc);
        }
        i0 = hi4 * 4;
    }
    for (size_t i = i0 + threadIdx.x; i < hi; i += blockDim.x) {
        float v[R];
#pragma unroll
        for (int p = 0; p < R; p++) v[p] = __ldcg(s[p] + i);
        float acc = v[0];
#pragma unroll
        for (int p = 1; p < R; p++) acc += v[p];
        if (round) acc = round_bf16(acc);
        x[i] = acc;
        if (to_ag)
#pragma unroll
            for (int p = 0; p < R; p++)
                if (p != me) __stcg(g[p] + i, acc);
    }
}

/* dst[lo, hi) = src[lo, hi), src read from L2 (bytes, or floats through the byte offsets x 4). */
__device__ void copy_bytes(unsigned char *dst, const unsigned char *src, size_t lo, size_t hi) {
    size_t i0 = lo;
    if (aligned16(dst) && aligned16(src) && lo % 16 == 0) {
        const size_t hi16 = hi / 16;
        for (size_t j = lo / 16 + threadIdx.x; j < hi16; j += blockDim.x)
            __stcg(reinterpret_cast<uint4 *>(dst) + j, __ldcg(reinterpret_cast<const uint4 *>(src) + j));
        i0 = hi16 * 16 > lo ? hi16 * 16 : lo;
    }
    for (size_t i = i0 + threadIdx.x; i < hi; i += blockDim.x) __stcg(dst + i, __ldcg(src + i));
}

/* round: each sum rounded to bf16 (the rounding pass after the all-reduce, in the same launch). */
template <int R>
__global__ void __launch_bounds__(K3C_MBX_THREADS, 2) mbx_one_shot(k3c_mbx_args a, float *x, uint32_t n, int round) {
    __shared__ mbx_block sh;
    const uint32_t op = K3C_MBX_OP_ONE_SHOT;
    if (!mbx_begin(a, &sh, n, op)) return;
    const uint32_t e = sh.e, b = e & 1;
    size_t lo, hi;
    k3c_mbx_part(n, 4, blockIdx.x, gridDim.x, &lo, &hi);
    push<R>(a, a.lay.slots, b, x, lo, hi, -1);
    mbx_post_all(a, a.lay.f1, e, n, op);
    if (!mbx_wait_all(a, &sh, a.lay.f1, e, n, op)) return;
    reduce<R>(a, b, x, lo, hi, false, round != 0);
    mbx_end(a, e);
}

/* The one-shot's second half, after a product's epilogue made its push (comm/mailbox.h: the pushed one-shot):
 * every peer's slot (b, me) already holds x[0 .. n), written by a kernel that completed before this one
 * started (stream order: this kernel is not PDL-launched) and fenced there, so this block's flag covers its
 * part as the one-shot's own push would. The same flags, op and part of n as the one-shot (a peer making a
 * plain one-shot of the same n exchanges the same data: the two are interchangeable call for call); with
 * round, the sums are rounded to bf16 (the rounding pass the unfused sequence runs after the all-reduce). */
template <int R>
__global__ void __launch_bounds__(K3C_MBX_THREADS, 2) mbx_finish(k3c_mbx_args a, float *x, uint32_t n, int round) {
    __shared__ mbx_block sh;
    const uint32_t op = K3C_MBX_OP_ONE_SHOT;
    if (!mbx_begin(a, &sh, n, op)) return;
    const uint32_t e = sh.e, b = e & 1;
    size_t lo, hi;
    k3c_mbx_part(n, 4, blockIdx.x, gridDim.x, &lo, &hi);
    mbx_post_all(a, a.lay.f1, e, n, op);
    if (!mbx_wait_all(a, &sh, a.lay.f1, e, n, op)) return;
    reduce<R>(a, b, x, lo, hi, false, round != 0);
    mbx_end(a, e);
}

/* The RMSNorm's reduction (cuda/elementwise.cu rmsnorm_kernel) of one row, reproduced by this block: the
 * norm kernel runs one block of B = min(1024, n rounded up to 32) threads a row, thread t accumulating
 * v[t], v[t + B], ... by fmaf in index order, then k3c_block_sum: the warp butterfly (xor 16, 8, 4, 2, 1),
 * the warp sums in warp order into red, and the butterfly again over red[lane] (0 past the warps). Here
 * each of the block's threads plays virtual threads t + j * blockDim.x (j < NORM_J) of that block: the
 * same partials (a virtual thread's lane is its real thread's lane, so the shuffles pair the same partials),
 * the same trees, so the same bits. */
#define NORM_MAX_B 1024
#define NORM_J (NORM_MAX_B / K3C_MBX_THREADS)
static_assert(K3C_MBX_THREADS % 32 == 0 && NORM_MAX_B % K3C_MBX_THREADS == 0, "virtual norm threads");

__device__ __forceinline__ float warp_sum(float v) { /* cuda/common.cuh k3c_warp_sum */
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

struct mbx_norm_smem {
    float red[32];
};

/* All-reduce + round + RMSNorm of rows [T, n] (stock/forward.c moe_tp's sum, round and latent norm, in one
 * launch). Block k owns rows part k of T (whole rows: the norm needs a row's every element), pushes them,
 * posts its flags, waits for block k of every peer (which pushed the same rows), and per row: v[i] = the
 * rank-order sum rounded to bf16 (one-shot's sum, then the rounding pass), into x; the sum of squares in
 * the norm kernel's order (above); x[i] = bf16(v[i] * r * w[i]), r = rsqrtf(ss / n + eps): rmsnorm_kernel's
 * operations on the rounded row, so bitwise the unfused all-reduce, k3c_cuda_round_bf16 and
 * k3c_cuda_rmsnorm(round 1). n is a multiple of 4 (the row boundaries stay 16-byte aligned). op carries
 * the row count (a peer splitting the same floats into other rows exchanges other parts: a mismatch). */
template <int R>
__global__ void __launch_bounds__(K3C_MBX_THREADS, 2) mbx_reduce_norm(k3c_mbx_args a, float *x, uint32_t T,
                                                                   uint32_t n, const float *w, float eps) {
    __shared__ mbx_block sh;
    __shared__ mbx_norm_smem nm;
    const uint32_t count = T * n, op = (uint32_t)K3C_MBX_OP_REDUCE_NORM | T << 8;
    if (!mbx_begin(a, &sh, count, op)) return;
    const uint32_t e = sh.e, b = e & 1;
    const int me = a.rank;
    size_t r0, r1;
    k3c_mbx_part(T, 1, blockIdx.x, gridDim.x, &r0, &r1);
    push<R>(a, a.lay.slots, b, x, r0 * n, r1 * n, -1);
    mbx_post_all(a, a.lay.f1, e, count, op);
    if (!mbx_wait_all(a, &sh, a.lay.f1, e, count, op)) return;
    const float *s[R];
#pragma unroll
    for (int p = 0; p < R; p++) s[p] = p == me ? x : k3c_mbx_slot_at(a.region[me], a.lay.slots, &a.lay, b, p);
    const unsigned B = n >= NORM_MAX_B ? NORM_MAX_B : (n + 31) / 32 * 32, nw = B / 32;
    const unsigned t = threadIdx.x, lane = t & 31, warp = t >> 5, bd = blockDim.x;
    for (size_t row = r0; row < r1; row++) {
        const size_t o = row * n;
        float ss[NORM_J];
#pragma unroll
        for (int j = 0; j < NORM_J; j++) {
            ss[j] = 0.0f;
            for (size_t i = t + j * bd; t + j * bd < B && i < n; i += B) {
                float v[R];
#pragma unroll
                for (int p = 0; p < R; p++) v[p] = __ldcg(s[p] + o + i);
                float acc = v[0];
#pragma unroll
                for (int p = 1; p < R; p++) acc += v[p];
                acc = round_bf16(acc);
                x[o + i] = acc; /* read back below by this thread only */
                ss[j] = fmaf(acc, acc, ss[j]);
            }
        }
        __syncthreads(); /* red of the row before is read */
#pragma unroll
        for (int j = 0; j < NORM_J; j++) {
            const float ws = warp_sum(ss[j]);
            const unsigned vw = warp + j * (bd / 32);
            if (lane == 0 && vw < nw) nm.red[vw] = ws;
        }
        __syncthreads();
        const float tot = warp_sum(lane < nw ? nm.red[lane] : 0.0f);
        const float r = rsqrtf(tot / n + eps);
#pragma unroll
        for (int j = 0; j < NORM_J; j++)
            for (size_t i = t + j * bd; t + j * bd < B && i < n; i += B) x[o + i] = round_bf16(x[o + i] * r * w[i]);
    }
    mbx_end(a, e);
}

template <int R>
__global__ void __launch_bounds__(K3C_MBX_THREADS, 2) mbx_two_shot(k3c_mbx_args a, float *x, uint32_t n) {
    __shared__ mbx_block sh;
    const uint32_t op = K3C_MBX_OP_TWO_SHOT;
    if (!mbx_begin(a, &sh, n, op)) return;
    const uint32_t e = sh.e, b = e & 1;
    const int me = a.rank, k = blockIdx.x, G = gridDim.x;
    const unsigned parts = (unsigned)(R * G);
    size_t lo, hi;
    /* 1. reduce-scatter: this block's piece of every other rank's shard, to the shard's owner */
#pragma unroll
    for (int s = 0; s < R; s++) {
        if (s == me) continue;
        k3c_mbx_part(n, 4, (unsigned)(s * G + k), parts, &lo, &hi);
        push<R>(a, a.lay.slots, b, x, lo, hi, s);
    }
    mbx_post_all(a, a.lay.f1, e, n, op);
    if (!mbx_wait_all(a, &sh, a.lay.f1, e, n, op)) return;
    /* 2. this block's piece of this rank's shard: the sum in rank order, into x and every peer's ag slot */
    k3c_mbx_part(n, 4, (unsigned)(me * G + k), parts, &lo, &hi);
    reduce<R>(a, b, x, lo, hi, true);
    mbx_post_all(a, a.lay.f2, e, n, op);
    if (!mbx_wait_all(a, &sh, a.lay.f2, e, n, op)) return;
    /* 3. all-gather: this block's piece of every other shard, as its owner summed it */
#pragma unroll
    for (int s = 0; s < R; s++) {
        if (s == me) continue;
        k3c_mbx_part(n, 4, (unsigned)(s * G + k), parts, &lo, &hi);
        copy_bytes(reinterpret_cast<unsigned char *>(x),
                   reinterpret_cast<const unsigned char *>(k3c_mbx_slot_at(a.region[me], a.lay.ag, &a.lay, b, s)),
                   4 * lo, 4 * hi);
    }
    mbx_end(a, e);
}

template <int R>
__global__ void __launch_bounds__(K3C_MBX_THREADS, 2) mbx_exchange(k3c_mbx_args a, const unsigned char *src,
                                                                unsigned char *dst, uint32_t bytes, int root) {
    __shared__ mbx_block sh;
    const uint32_t op = root < 0 ? (uint32_t)K3C_MBX_OP_GATHER : (uint32_t)K3C_MBX_OP_BROADCAST | (uint32_t)root << 8;
    if (!mbx_begin(a, &sh, bytes, op)) return;
    const uint32_t e = sh.e, b = e & 1;
    const int me = a.rank;
    size_t lo, hi;
    k3c_mbx_part(bytes, 16, blockIdx.x, gridDim.x, &lo, &hi);
    if (root < 0 || root == me)
#pragma unroll
        for (int p = 0; p < R; p++)
            if (p != me)
                copy_bytes(reinterpret_cast<unsigned char *>(k3c_mbx_slot_at(a.region[p], a.lay.slots, &a.lay, b, me)),
                           src, lo, hi);
    mbx_post_all(a, a.lay.f1, e, bytes, op);
    if (!mbx_wait_all(a, &sh, a.lay.f1, e, bytes, op)) return;
    if (root < 0) {
#pragma unroll
        for (int p = 0; p < R; p++) {
            unsigned char *d = dst + (size_t)p * bytes;
            if (p != me)
                copy_bytes(d, reinterpret_cast<const unsigned char *>(
                                  k3c_mbx_slot_at(a.region[me], a.lay.slots, &a.lay, b, p)),
                           lo, hi);
            else if (d != src)
                copy_bytes(d, src, lo, hi);
        }
    } else if (me != root) {
        copy_bytes(dst, reinterpret_cast<const unsigned char *>(k3c_mbx_slot_at(a.region[me], a.lay.slots, &a.lay, b, root)),
                   lo, hi);
    }
    mbx_end(a, e);
}

__global__ void mbx_abort_kernel(k3c_mbx_args a) {
    for (int p = 0; p < a.lay.ranks; p++) st_relaxed_sys(&state_of(a, p)->abort, (uint32_t)a.rank + 1);
    __threadfence_system();
}

template <int R>
void launch_reduce(const k3c_mbx_args &a, float *x, uint32_t n, int two_shot, int round, cudaStream_t st) {
    if (two_shot)
        mbx_two_shot<R><<<a.lay.blocks, K3C_MBX_THREADS, 0, st>>>(a, x, n);
    else
        mbx_one_shot<R><<<a.lay.blocks, K3C_MBX_THREADS, 0, st>>>(a, x, n, round);
}

template <int R>
void launch_finish(const k3c_mbx_args &a, float *x, uint32_t n, int round, cudaStream_t st) {
    mbx_finish<R><<<a.lay.blocks, K3C_MBX_THREADS, 0, st>>>(a, x, n, round);
}

template <int R>
void launch_reduce_norm(const k3c_mbx_args &a, float *x, uint32_t T, uint32_t n, const float *w, float eps,
                        cudaStream_t st) {
    mbx_reduce_norm<R><<<a.lay.blocks, K3C_MBX_THREADS, 0, st>>>(a, x, T, n, w, eps);
}

template <int R>
void launch_exchange(const k3c_mbx_args &a, const void *src, void *dst, uint32_t bytes, int root, cudaStream_t st) {
    mbx_exchange<R><<<a.lay.blocks, K3C_MBX_THREADS, 0, st>>>(a, (const unsigned char *)src, (unsigned char *)dst,
                                                               bytes, root);
}

template <int R>
cudaError_t occupancy(int *out) {
    int o[5] = {0, 0, 0, 0, 0};
    cudaError_t e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&o[0], mbx_one_shot<R>, K3C_MBX_THREADS, 0);
    if (e == cudaSuccess) e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&o[1], mbx_two_shot<R>, K3C_MBX_THREADS, 0);
    if (e == cudaSuccess) e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&o[2], mbx_exchange<R>, K3C_MBX_THREADS, 0);
    if (e == cudaSuccess) e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&o[3], mbx_finish<R>, K3C_MBX_THREADS, 0);
    if (e == cudaSuccess)
        e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&o[4], mbx_reduce_norm<R>, K3C_MBX_THREADS, 0);
    *out = o[0];
    for (int i = 1; i < 5; i++)
        if (o[i] < *out) *out = o[i];
    return e;
}

} // namespace

#define MBX_BY_RANKS(R, call)                                                                                     \
    switch (R) {                                                                                                   \
    case 2: call(2); break;                                                                                        \
    case 3: call(3); break;                                                                                        \
    case 4: call(4); break;                                                                                        \
    case 5: call(5); break;                                                                                        \
    case 6: call(6); break;                                                                                        \
    case 7: call(7); break;                                                                                        \
    case 8: call(8); break;                                                                                        \
    default: return k3c_errorf_kind(K3C_ERROR_INTERNAL, "mailbox: %d ranks (2 .. %d)", R, K3C_MBX_MAX_RANKS);   \
    }

extern "C" int k3c_mbx_all_reduce(const k3c_mbx_args *a, float *x, size_t n, int two_shot, void *stream) {
    if (n > a->lay.slot_floats)
        return k3c_errorf_kind(K3C_ERROR_INTERNAL, "mailbox: %zu floats past the slots' %zu", n, a->lay.slot_floats);
#define CALL(R) launch_reduce<R>(*a, x, (uint32_t)n, two_shot, 0, (cudaStream_t)stream)
    MBX_BY_RANKS(a->lay.ranks, CALL)
#undef CALL
    K3C_CUDA_LAUNCHED(two_shot ? "the two-shot mailbox all-reduce" : "the one-shot mailbox all-reduce");
    return K3C_OK;
}

extern "C" int k3c_mbx_one_shot_round(const k3c_mbx_args *a, float *x, size_t n, void *stream) {
    if (n > a->lay.slot_floats)
        return k3c_errorf_kind(K3C_ERROR_INTERNAL, "mailbox: %zu floats past the slots' %zu", n, a->lay.slot_floats);
#define CALL(R) launch_reduce<R>(*a, x, (uint32_t)n, 0, 1, (cudaStream_t)stream)
    MBX_BY_RANKS(a->lay.ranks, CALL)
#undef CALL
    K3C_CUDA_LAUNCHED("the one-shot mailbox all-reduce, rounded");
    return K3C_OK;
}

extern "C" int k3c_mbx_finish(const k3c_mbx_args *a, float *x, size_t n, int round, void *stream) {
    if (n > a->lay.slot_floats)
        return k3c_errorf_kind(K3C_ERROR_INTERNAL, "mailbox: %zu floats past the slots' %zu", n, a->lay.slot_floats);
#define CALL(R) launch_finish<R>(*a, x, (uint32_t)n, round, (cudaStream_t)stream)
    MBX_BY_RANKS(a->lay.ranks, CALL)
#undef CALL
    K3C_CUDA_LAUNCHED("the mailbox one-shot's finish");
    return K3C_OK;
}

extern "C" int k3c_mbx_reduce_rmsnorm(const k3c_mbx_args *a, float *x, int rows, int n, const float *w, float eps,
                                      void *stream) {
    if (rows < 1 || n < 4 || n % 4 || rows >= (1 << 24) || (size_t)rows * n > a->lay.slot_floats)
        return k3c_errorf_kind(K3C_ERROR_INTERNAL, "mailbox: reduce + rmsnorm of %d rows of %d floats (rows of a "
                               "multiple of 4, within the slots' %zu)", rows, n, a->lay.slot_floats);
#define CALL(R) launch_reduce_norm<R>(*a, x, (uint32_t)rows, (uint32_t)n, w, eps, (cudaStream_t)stream)
    MBX_BY_RANKS(a->lay.ranks, CALL)
#undef CALL
    K3C_CUDA_LAUNCHED("the mailbox all-reduce + rmsnorm");
    return K3C_OK;
}

extern "C" int k3c_mbx_exchange(const k3c_mbx_args *a, const void *src, void *dst, size_t bytes, int root,
                                void *stream) {
    if (bytes > a->lay.slot_floats * sizeof(float))
        return k3c_errorf_kind(K3C_ERROR_INTERNAL, "mailbox: %zu bytes past the slots' %zu", bytes,
                               a->lay.slot_floats * sizeof(float));
#define CALL(R) launch_exchange<R>(*a, src, dst, (uint32_t)bytes, root, (cudaStream_t)stream)
    MBX_BY_RANKS(a->lay.ranks, CALL)
#undef CALL
    K3C_CUDA_LAUNCHED(root < 0 ? "the mailbox gather" : "the mailbox broadcast");
    return K3C_OK;
}

extern "C" int k3c_mbx_abort(const k3c_mbx_args *a, void *stream) {
    mbx_abort_kernel<<<1, 1, 0, (cudaStream_t)stream>>>(*a);
    K3C_CUDA_LAUNCHED("the mailbox abort");
    return K3C_OK;
}

extern "C" int k3c_mbx_blocks_per_sm(int ranks, int *out) {
    *out = 0;
#define CALL(R) K3C_CUDA_TRY(occupancy<R>(out))
    MBX_BY_RANKS(ranks, CALL)
#undef CALL
    return K3C_OK;
}
