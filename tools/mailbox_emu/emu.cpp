/* The runtime of inc/cuda_runtime_api.h on the host: streams as worker threads with ordered queues, launches
 * as OS threads per CUDA thread, capture into graphs, device memory as aligned host memory. EMU_SMS (16) and
 * EMU_BPS (1) give the multiprocessors and the blocks of a mailbox kernel one holds (so the co-residency
 * rule picks few blocks: 16 / ranks), EMU_DEVICES (1) the devices visible. */
#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

#include <fcntl.h>
#include <map>
#include <sys/mman.h>
#include <unistd.h>

#include "emu_device.h"

thread_local dim3 threadIdx, blockIdx, blockDim, gridDim;
thread_local emu_block *emu_cur;
int emu_blocks_per_sm = 1;

static int env_int(const char *name, int def) {
    const char *s = getenv(name);
    return s && atoi(s) > 0 ? atoi(s) : def;
}
static int emu_sms(void) { return env_int("EMU_SMS", 16); }
static int emu_devices(void) { return env_int("EMU_DEVICES", 1); }
__attribute__((constructor)) static void emu_init(void) { emu_blocks_per_sm = env_int("EMU_BPS", 1); }

void emu_check_align(const void *p, size_t a, const char *what) {
    if ((uintptr_t)p % a) {
        fprintf(stderr, "emu: %s at %p: not %zu-byte aligned\n", what, p, a);
        abort();
    }
}

struct CUgraph_st {
    std::vector<std::function<void()>> ops;
};
struct CUgraphExec_st {
    std::vector<std::function<void()>> ops;
};

struct CUstream_st {
    std::mutex mu;
    std::condition_variable cv;
    std::deque<std::function<void()>> q;
    bool busy = false, stop = false;
    unsigned flags = 0;
    CUgraph_st *capture = nullptr;
    std::thread worker;
};

static std::mutex streams_mu;
static std::set<CUstream_st *> streams;

static void worker_main(CUstream_st *s) {
    std::unique_lock<std::mutex> lk(s->mu);
    for (;;) {
        s->cv.wait(lk, [&] { return !s->q.empty() || s->stop; });
        if (s->q.empty() && s->stop) break;
        std::function<void()> f = std::move(s->q.front());
        s->q.pop_front();
        s->busy = true;
        lk.unlock();
        f();
        lk.lock();
        s->busy = false;
        s->cv.notify_all();
    }
    lk.unlock();
    delete s;
}

/* runs f in stream order (the legacy stream NULL: now, on the calling thread); during capture, records it */
static void enqueue(cudaStream_t s, std::function<void()> f) {
    if (!s) {
        f();
        return;
    }
    std::lock_guard<std::mutex> g(s->mu);
    if (s->capture) {
        s->capture->ops.push_back(std::move(f));
        return;
    }
    s->q.push_back(std::move(f));
    s->cv.notify_all();
}

static void drain(cudaStream_t s) {
    if (!s) return;
    std::unique_lock<std::mutex> lk(s->mu);
    s->cv.wait(lk, [&] { return s->q.empty() && !s->busy; });
}

void emu_launch_fn(int grid, int block, cudaStream_t s, std::function<void()> body) {
    enqueue(s, [grid, block, body]() {
        std::vector<emu_block> blocks((size_t)grid);
        std::vector<std::barrier<> *> bars;
        std::vector<std::thread> th;
        for (int b = 0; b < grid; b++) {
            blocks[(size_t)b].bar = new std::barrier<>(block);
            memset(blocks[(size_t)b].shared, 0xff, sizeof blocks[(size_t)b].shared);
        }
        for (int b = 0; b < grid; b++)
            for (int t = 0; t < block; t++)
                th.emplace_back([&, b, t]() {
                    emu_cur = &blocks[(size_t)b];
                    blockIdx.x = (unsigned)b;
                    threadIdx.x = (unsigned)t;
                    blockDim.x = (unsigned)block;
                    gridDim.x = (unsigned)grid;
                    body();
                    emu_cur->bar->arrive_and_drop();
                });
        for (auto &t : th) t.join();
        for (auto &b : blocks) delete b.bar;
    });
}

/* an event: the time its record ran at, once it has */
struct CUevent_st {
    std::atomic<int> done{1};
    std::atomic<double> t{0};
};
static double host_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec * 1e-6;
}

static thread_local int cur_device;

extern "C" {
cudaError_t cudaGetDevice(int *d) { *d = cur_device; return cudaSuccess; }
cudaError_t cudaSetDevice(int d) {
    if (d < 0 || d >= emu_devices()) return cudaErrorInvalidDevice;
    cur_device = d;
    return cudaSuccess;
}
cudaError_t cudaGetDeviceCount(int *n) { *n = emu_devices(); return cudaSuccess; }
cudaError_t cudaDeviceGetAttribute(int *v, enum cudaDeviceAttr a, int d) {
    (void)a, (void)d;
    *v = emu_sms();
    return cudaSuccess;
}
cudaError_t cudaDeviceGetPCIBusId(char *id, int len, int d) { snprintf(id, (size_t)len, "0000:%02x:00.0", d); return cudaSuccess; }
cudaError_t cudaDeviceCanAccessPeer(int *can, int d, int peer) { (void)d, (void)peer; *can = 1; return cudaSuccess; }
static std::set<std::pair<int, int>> peers;
cudaError_t cudaDeviceEnablePeerAccess(int peer, unsigned flags) {
    (void)flags;
    std::lock_guard<std::mutex> g(streams_mu);
    return peers.insert({cur_device, peer}).second ? cudaSuccess : cudaErrorPeerAccessAlreadyEnabled;
}
cudaError_t cudaDeviceSynchronize(void) {
    std::vector<CUstream_st *> all;
    {
        std::lock_guard<std::mutex> g(streams_mu);
        all.assign(streams.begin(), streams.end());
    }
    for (auto *s : all) drain(s);
    return cudaSuccess;
}
/* Device memory: shared mappings of memfd files, so that another process can map an allocation through
 * its "IPC handle" (pid, fd, bytes: /proc/pid/fd/fd), as cudaIpcOpenMemHandle maps a peer's. */
struct emu_map {
    int fd;
    size_t bytes;
};
static std::mutex maps_mu;
static std::map<void *, emu_map> maps, opened;
struct emu_ipc {
    int pid, fd;
    size_t bytes;
};
cudaError_t cudaMalloc(void **p, size_t n) {
    size_t bytes = (n + 4095) / 4096 * 4096 + 4096;
    int fd = memfd_create("emu_device", 0);
    if (fd < 0 || ftruncate(fd, (off_t)bytes) != 0) return cudaErrorMemoryAllocation;
    void *m = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (m == MAP_FAILED) return cudaErrorMemoryAllocation;
    std::lock_guard<std::mutex> g(maps_mu);
    maps[m] = {fd, bytes};
    *p = m;
    return cudaSuccess;
}
cudaError_t cudaFree(void *p) {
    cudaDeviceSynchronize(); /* as cudaFree does */
    std::lock_guard<std::mutex> g(maps_mu);
    auto it = maps.find(p);
    if (it == maps.end()) return p ? cudaErrorInvalidValue : cudaSuccess;
    munmap(p, it->second.bytes);
    close(it->second.fd);
    maps.erase(it);
    return cudaSuccess;
}
cudaError_t cudaMemset(void *p, int v, size_t n) { memset(p, v, n); return cudaSuccess; }
cudaError_t cudaMemcpy(void *d, const void *s, size_t n, enum cudaMemcpyKind k) { (void)k; memcpy(d, s, n); return cudaSuccess; }
cudaError_t cudaMemcpyAsync(void *d, const void *s, size_t n, enum cudaMemcpyKind k, cudaStream_t st) {
    (void)k;
    enqueue(st, [d, s, n]() { memcpy(d, s, n); });
    return cudaSuccess;
}
cudaError_t cudaHostAlloc(void **p, size_t n, unsigned flags) {
    (void)flags;
    *p = aligned_alloc(256, (n + 255) / 256 * 256 + 256);
    return *p ? cudaSuccess : cudaErrorMemoryAllocation;
}
cudaError_t cudaMallocHost(void **p, size_t n) { return cudaHostAlloc(p, n, 0); }
cudaError_t cudaFreeHost(void *p) {
    cudaDeviceSynchronize();
    free(p);
    return cudaSuccess;
}
cudaError_t cudaHostGetDevicePointer(void **d, void *h, unsigned flags) { (void)flags; *d = h; return cudaSuccess; }
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned flags) {
    CUstream_st *x = new CUstream_st;
    x->flags = flags;
    x->worker = std::thread(worker_main, x);
    x->worker.detach();
    std::lock_guard<std::mutex> g(streams_mu);
    streams.insert(x);
    *s = x;
    return cudaSuccess;
}
cudaError_t cudaStreamCreate(cudaStream_t *s) { return cudaStreamCreateWithFlags(s, cudaStreamDefault); }
cudaError_t cudaStreamDestroy(cudaStream_t s) {
    {
        std::lock_guard<std::mutex> g(streams_mu);
        streams.erase(s);
    }
    std::lock_guard<std::mutex> g(s->mu); /* the worker frees it once its queue is done */
    s->stop = true;
    s->cv.notify_all();
    return cudaSuccess;
}
cudaError_t cudaStreamGetFlags(cudaStream_t s, unsigned *flags) { *flags = s ? s->flags : 0; return cudaSuccess; }
cudaError_t cudaStreamSynchronize(cudaStream_t s) { drain(s); return cudaSuccess; }
cudaError_t cudaStreamQuery(cudaStream_t s) {
    if (!s) return cudaSuccess;
    std::lock_guard<std::mutex> g(s->mu);
    if (s->capture) return cudaErrorStreamCaptureUnsupported;
    return s->q.empty() && !s->busy ? cudaSuccess : cudaErrorNotReady;
}
cudaError_t cudaStreamBeginCapture(cudaStream_t s, enum cudaStreamCaptureMode m) {
    (void)m;
    if (!s) return cudaErrorInvalidValue;
    std::lock_guard<std::mutex> g(s->mu);
    if (s->capture) return cudaErrorInvalidValue;
    s->capture = new CUgraph_st;
    return cudaSuccess;
}
cudaError_t cudaStreamIsCapturing(cudaStream_t s, enum cudaStreamCaptureStatus *status) {
    if (!s) {
        *status = cudaStreamCaptureStatusNone;
        return cudaSuccess;
    }
    std::lock_guard<std::mutex> g(s->mu);
    *status = s->capture ? cudaStreamCaptureStatusActive : cudaStreamCaptureStatusNone;
    return cudaSuccess;
}
cudaError_t cudaStreamEndCapture(cudaStream_t s, cudaGraph_t *gr) {
    std::lock_guard<std::mutex> g(s->mu);
    if (!s->capture) return cudaErrorInvalidValue;
    *gr = s->capture;
    s->capture = nullptr;
    return cudaSuccess;
}
cudaError_t cudaGraphInstantiate(cudaGraphExec_t *e, cudaGraph_t g, unsigned long long flags) {
    (void)flags;
    *e = new CUgraphExec_st{g->ops};
    return cudaSuccess;
}
cudaError_t cudaGraphLaunch(cudaGraphExec_t e, cudaStream_t s) {
    for (auto &f : e->ops) enqueue(s, f);
    return cudaSuccess;
}
cudaError_t cudaGraphDestroy(cudaGraph_t g) { delete g; return cudaSuccess; }
cudaError_t cudaGraphExecDestroy(cudaGraphExec_t e) { delete e; return cudaSuccess; }
cudaError_t cudaIpcGetMemHandle(cudaIpcMemHandle_t *h, void *p) {
    std::lock_guard<std::mutex> g(maps_mu);
    auto it = maps.find(p);
    if (it == maps.end()) return cudaErrorInvalidValue; /* only an allocation's base, as CUDA's */
    emu_ipc x = {(int)getpid(), it->second.fd, it->second.bytes};
    memset(h, 0, sizeof *h);
    memcpy(h->reserved, &x, sizeof x);
    return cudaSuccess;
}
cudaError_t cudaIpcOpenMemHandle(void **p, cudaIpcMemHandle_t h, unsigned flags) {
    (void)flags;
    emu_ipc x;
    memcpy(&x, h.reserved, sizeof x);
    if (x.pid == (int)getpid()) return cudaErrorInvalidValue; /* CUDA refuses one's own handles too */
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/fd/%d", x.pid, x.fd);
    int fd = open(path, O_RDWR);
    if (fd < 0) return cudaErrorInvalidValue;
    void *m = mmap(NULL, x.bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (m == MAP_FAILED) return cudaErrorMemoryAllocation;
    std::lock_guard<std::mutex> g(maps_mu);
    opened[m] = {-1, x.bytes};
    *p = m;
    return cudaSuccess;
}
cudaError_t cudaIpcCloseMemHandle(void *p) {
    std::lock_guard<std::mutex> g(maps_mu);
    auto it = opened.find(p);
    if (it == opened.end()) return cudaErrorInvalidValue;
    munmap(p, it->second.bytes);
    opened.erase(it);
    return cudaSuccess;
}
cudaError_t cudaEventCreate(cudaEvent_t *e) { *e = new CUevent_st; return cudaSuccess; }
cudaError_t cudaEventDestroy(cudaEvent_t e) { delete e; return cudaSuccess; }
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s) {
    e->done = 0;
    enqueue(s, [e]() { e->t = host_ms(); e->done = 1; });
    return cudaSuccess;
}
cudaError_t cudaEventSynchronize(cudaEvent_t e) {
    while (!e->done) sched_yield();
    return cudaSuccess;
}
cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t a, cudaEvent_t b) { *ms = (float)(b->t - a->t); return cudaSuccess; }
cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *p, int d) {
    snprintf(p->name, sizeof p->name, "emulated device %d", d);
    return cudaSuccess;
}
cudaError_t cudaGetLastError(void) { return cudaSuccess; }
const char *cudaGetErrorString(cudaError_t e) { return e == cudaSuccess ? "no error" : "emulated error"; }
const char *cudaGetErrorName(cudaError_t e) { return e == cudaSuccess ? "cudaSuccess" : "cudaErrorEmulated"; }
}
