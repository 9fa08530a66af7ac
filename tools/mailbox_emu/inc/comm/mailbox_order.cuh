/* comm/mailbox_order.cuh on the host (tools/mailbox_emu): the system-scope loads and stores as C++ atomics,
 * the global timer as CLOCK_MONOTONIC; an acquire load (only the spins use one) yields the core first, since
 * hundreds of emulated threads share a few cores. */
#pragma once
#include <sched.h>
#include <stdint.h>
#include <time.h>

static inline uint32_t ld_acquire_sys(const uint32_t *p) {
    sched_yield();
    return __atomic_load_n(p, __ATOMIC_ACQUIRE);
}
static inline uint32_t ld_relaxed_sys(const uint32_t *p) { return __atomic_load_n(p, __ATOMIC_RELAXED); }
static inline void st_release_sys(uint32_t *p, uint32_t v) { __atomic_store_n(p, v, __ATOMIC_RELEASE); }
static inline void st_relaxed_sys(uint32_t *p, uint32_t v) { __atomic_store_n(p, v, __ATOMIC_RELAXED); }
static inline unsigned long long now_ns() {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (unsigned long long)ts.tv_sec * 1000000000ull + (unsigned long long)ts.tv_nsec;
}
