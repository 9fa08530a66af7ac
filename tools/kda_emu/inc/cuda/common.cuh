/* emulator shim of src/cuda/common.cuh: the same device helpers as host code; CUDA threads are std::threads
 * (emu.h), warp shuffles go through a per-warp slot array and barrier. */
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>
#include "emu.h"
/* the block stamps (src/cuda/stamp.cuh) are not emulated here (tools/moe_emu's runtime does them) */
#define K3C_STAMP_BLOCK_BEGIN(kid) ((void)0)
#define K3C_STAMP_BLOCK_END(kid) ((void)0)
#define K3C_STAMP_TU(name)
static inline uint32_t __float_as_uint(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static inline float __uint_as_float(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }
static inline float k3c_dev_bf16(uint16_t h) { return __uint_as_float((uint32_t)h << 16); }
static inline uint16_t k3c_dev_to_bf16(float f) {
    uint32_t u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}
static inline float k3c_warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
static inline float k3c_dev_sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }
static inline float k3c_dev_silu(float x) { return x / (1.0f + expf(-x)); }
