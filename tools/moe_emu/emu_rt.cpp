/* The emulator's runtime: the CUDA runtime calls on host memory (allocations registered and fenced by
 * canaries, checked after every launch), the H200 device properties, and the fiber scheduler of emu.h. */
#include <algorithm>
#include <atomic>
#include <cstdarg>
#include <mutex>
#include <thread>
/* the generated kernels: moe.cu by default; another tool names its own (or "emu.h" and links them apart) */
#ifndef EMU_KERNELS
#define EMU_KERNELS "moe_emu.cpp"
#endif
#include EMU_KERNELS

thread_local dim3 threadIdx, blockIdx;
dim3 blockDim, gridDim;
thread_local emu_block *emu_blk;
thread_local emu_fiber *emu_fib;
int emu_force_wpr, emu_cp_delay, emu_shuffle, emu_mma_f32seq, emu_mma_trunc;
/* EMU_CP=delay for every driver: moe_emu and mla_emu set it from their main; the kernels emulator's test runner
 * (tools/kernels_emu/gpu_tests.sh, tests/test_main.c) has no main of its own, so it is read here, before main */
__attribute__((constructor)) static void emu_cp_from_env(void) {
    const char *e = getenv("EMU_CP");
    if (e) emu_cp_delay = strcmp(e, "delay") == 0;
}
long emu_blocks_run, emu_launches;
/* bytes moved by 16-byte weight loads (ld.global.nc.v4) and 16-byte cp.async copies: emu.h; read by main.c */
unsigned long long emu_stream_bytes;

static std::mutex fail_mu;
void emu_fail(const char *fmt, ...) {
    std::lock_guard<std::mutex> l(fail_mu);
    va_list ap;
    va_start(ap, fmt);
    fputs("EMU FAULT: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    exit(3);
}

/* gemm.cu's cuBLASLt bracket for the block stamps (cuda/stamp.cu is not emulated): never counting */
extern "C" long k3c_cuda_stamp_foreign_begin(void *) { return -1; }
extern "C" void k3c_cuda_stamp_foreign_end(void *, long) {}

/* ---- device memory: host allocations with 64-byte canary fences ---- */
#define GUARD 64
static std::map<uintptr_t, size_t> allocs; /* user base -> bytes */
static void guard_check(uintptr_t b, size_t n, const char *when) {
    const unsigned char *p = (const unsigned char *)b;
    for (int i = 0; i < GUARD; i++)
        if (p[-1 - i] != 0xa5 || p[n + i] != 0xa5) emu_fail("%s: write outside the allocation %p (+%zu)", when, p, n);
}
void emu_check_global(const void *p, size_t n, size_t align, const char *what) {
    uintptr_t a = (uintptr_t)p;
    if (a % align) emu_fail("%s: %p not %zu-aligned", what, p, align);
    auto it = allocs.upper_bound(a);
    if (it == allocs.begin() || a + n > std::prev(it)->first + std::prev(it)->second)
        emu_fail("%s: [%p, +%zu) outside every allocation", what, p, n);
}
extern "C" {
cudaError_t cudaMalloc(void **p, size_t n) {
    unsigned char *b = (unsigned char *)aligned_alloc(256, (n + 2 * GUARD + 255) / 256 * 256 + 256);
    if (!b) return 2;
    b += 256 - GUARD;
    memset(b, 0xa5, GUARD);
    memset(b + GUARD + n, 0xa5, GUARD);
    memset(b + GUARD, 0xcd, n); /* cudaMalloc memory is garbage */
    *p = b + GUARD;
    allocs[(uintptr_t)*p] = n;
    return 0;
}
cudaError_t cudaFree(void *p) {
    if (!p) return 0;
    auto it = allocs.find((uintptr_t)p);
    if (it == allocs.end()) emu_fail("cudaFree(%p): not allocated", p);
    guard_check(it->first, it->second, "cudaFree");
    allocs.erase(it);
    free((unsigned char *)p - 256);
    return 0;
}
cudaError_t cudaMemcpy(void *d, const void *s, size_t n, enum cudaMemcpyKind) { memcpy(d, s, n); return 0; }
cudaError_t cudaMemset(void *d, int v, size_t n) { memset(d, v, n); return 0; }
cudaError_t cudaDeviceSynchronize(void) { return 0; }
cudaError_t cudaGetLastError(void) { return 0; }
cudaError_t cudaGetDevice(int *d) { *d = 0; return 0; }
cudaError_t cudaDeviceGetAttribute(int *v, enum cudaDeviceAttr a, int) {
    if (a == cudaDevAttrMaxSharedMemoryPerBlockOptin) return *v = 232448, 0;
    if (a != cudaDevAttrMultiProcessorCount) return cudaErrorInvalidValue;
    *v = 132;
    return 0;
}
const char *cudaGetErrorName(cudaError_t) { return "emu"; }
const char *cudaGetErrorString(cudaError_t) { return "emu"; }
}

/* H200: 228 KB shared memory per SM, at most 227 KB (232448 bytes) per block (opt-in above 48 KB), 1 KB
 * reserved per resident block, 2048 threads and 32 blocks per SM. Registers are not modelled. */
static std::map<const void *, int> max_dyn;
cudaError_t emu_func_set_attribute(const void *f, int attr, int v) {
    if (attr != cudaFuncAttributeMaxDynamicSharedMemorySize) return cudaErrorInvalidValue;
    if (v < 0 || v > 232448) emu_fail("cudaFuncSetAttribute: %d bytes of dynamic shared memory > 227 KB", v);
    max_dyn[f] = v;
    return 0;
}
cudaError_t emu_occupancy(int *blocks, const void *, int threads, size_t dyn) {
    int b = std::min(2048 / threads, 32);
    b = std::min(b, (int)(233472 / (dyn + 1024)));
    *blocks = b;
    return 0;
}

/* ---- the fiber scheduler ---- */
#define STACK (128 << 10)
thread_local const std::function<void()> *emu_body;
static void fiber_entry(void) {
    (*emu_body)();
    emu_fiber *f = emu_fib;
    f->done = true;
    size_t pending = f->open.size();
    for (auto &g : f->groups) pending += g.size();
    if (pending) emu_fail("thread %u of block %u exits with %zu cp.async copies not waited for", f->tid.x, blockIdx.x, pending);
    emu_bar_drop(emu_blk->block);
    emu_bar_drop(emu_blk->warp[f->tid.x / 32]);
    emu_blk->progress++;
    /* returning resumes uc_link: the scheduler */
}

static void run_block(dim3 bid, dim3 block, size_t smem, const void *kernel, const std::function<void()> &body,
                      std::vector<char> &stacks, unsigned seed) {
    unsigned nt = block.x * block.y * block.z;
    if (block.y != 1 || block.z != 1) emu_fail("2D/3D blocks not emulated");
    emu_block b;
    b.rng.seed(seed);
    b.f.resize(nt);
    b.block.expected = nt;
    unsigned nw = (nt + 31) / 32;
    b.warp.resize(nw);
    for (unsigned w = 0; w < nw; w++) b.warp[w].expected = std::min(32u, nt - 32 * w);
    b.xch.assign((size_t)nw * 32 * 16, 0);
    size_t dyn_alloc = (smem + 256 + 127) / 128 * 128;
    b.dyn = (unsigned char *)aligned_alloc(128, dyn_alloc);
    memset(b.dyn, 0xff, smem);
    memset(b.dyn + smem, 0x5a, dyn_alloc - smem);
    b.dyn_bytes = smem;
    emu_blk = &b;
    blockIdx = bid;
    emu_body = &body;
    for (unsigned t = 0; t < nt; t++) {
        emu_fiber &f = b.f[t];
        f.tid = dim3(t, 0, 0);
        getcontext(&f.ctx);
        f.ctx.uc_stack.ss_sp = stacks.data() + (size_t)t * STACK;
        f.ctx.uc_stack.ss_size = STACK;
        f.ctx.uc_link = &b.sched;
        makecontext(&f.ctx, fiber_entry, 0);
    }
    std::vector<unsigned> order(nt);
    for (unsigned t = 0; t < nt; t++) order[t] = t;
    /* EMU_SHUFFLE: besides the random order, a warp (or a single lane) sometimes sleeps for up to 256
     * rounds, so warps drift apart as on a GPU and a missing barrier between warps shows */
    std::vector<long> sleep_w(nw, 0), sleep_t(nt, 0);
    for (long round = 0;; round++) {
        if (emu_shuffle) {
            std::shuffle(order.begin(), order.end(), b.rng);
            for (unsigned w = 0; w < nw; w++)
                if (b.rng() % 16 == 0) sleep_w[w] = round + b.rng() % 128;
            for (unsigned t = 0; t < nt; t++)
                if (b.rng() % 1024 == 0) sleep_t[t] = round + b.rng() % 64;
        }
        int live = 0, ran = 0, asleep = 0;
        long before = b.progress;
        for (unsigned t : order) {
            emu_fiber &f = b.f[t];
            if (f.done) continue;
            live++;
            if (f.wbar && f.wbar->gen == f.wgen) continue; /* still waiting */
            if (sleep_w[t / 32] > round || sleep_t[t] > round) {
                asleep++;
                continue;
            }
            ran++;
            emu_fib = &f;
            threadIdx = f.tid;
            swapcontext(&b.sched, &f.ctx);
        }
        if (!live) break;
        if (!ran && !asleep && b.progress == before)
            emu_fail("deadlock in block (%u, %u): %d threads wait on barriers nobody else reaches", bid.x, bid.y, live);
    }
    for (size_t i = smem; i < dyn_alloc; i++)
        if (b.dyn[i] != 0x5a) emu_fail("block (%u, %u) wrote past its %zu bytes of dynamic shared memory", bid.x, bid.y, smem);
    size_t stat = 0;
    for (auto &kv : b.stat) stat += kv.second.size() - 16;
    auto it = max_dyn.find(kernel);
    int lim = it == max_dyn.end() ? 49152 : it->second;
    if (smem > (size_t)lim) emu_fail("launch with %zu bytes of dynamic shared memory, the kernel's limit is %d", smem, lim);
    if (smem + stat > 232448) emu_fail("launch: %zu dynamic + %zu static bytes of shared memory > 227 KB", smem, stat);
    free(b.dyn);
    emu_blk = nullptr;
}

void emu_run_grid(dim3 grid, dim3 block, size_t smem, const void *kernel, const std::function<void()> &body) {
    blockDim = block;
    gridDim = grid;
    emu_launches++;
    long nb = (long)grid.x * grid.y * grid.z;
    static int nthreads;
    if (!nthreads) {
        const char *e = getenv("EMU_THREADS");
        nthreads = e ? atoi(e) : (int)std::thread::hardware_concurrency();
        if (nthreads < 1) nthreads = 1;
    }
    std::atomic<long> next(0);
    unsigned nt = block.x * block.y * block.z;
    auto worker = [&] {
        std::vector<char> stacks((size_t)nt * STACK);
        for (long i; (i = next++) < nb;) {
            dim3 bid((unsigned)(i % grid.x), (unsigned)(i / grid.x % grid.y), (unsigned)(i / grid.x / grid.y));
            run_block(bid, block, smem, kernel, body, stacks, (unsigned)(emu_shuffle * 7919u + i));
        }
    };
    std::vector<std::thread> th;
    for (int t = 0; t < nthreads - 1; t++) th.emplace_back(worker);
    worker();
    for (auto &t : th) t.join();
    emu_blocks_run += nb;
    for (auto &kv : allocs) guard_check(kv.first, kv.second, "after a launch");
}

/* EMU_MMA for the kernels emulator's test runner (no main of its own; the drivers' main sets it again) */
__attribute__((constructor)) static void emu_mma_from_env(void) {
    const char *e = getenv("EMU_MMA");
    if (e) {
        emu_mma_f32seq = strcmp(e, "f32seq") == 0;
        emu_mma_trunc = strcmp(e, "trunc") == 0;
    }
}
