/* bf16 / f16 / f32 conversions. bf16 is the upper half of an IEEE f32; rounding is to nearest-even,
 * NaN stays NaN (quiet bit forced so rounding never turns it into Inf). */
#ifndef K3C_UTIL_BF16_H
#define K3C_UTIL_BF16_H

#include <stdint.h>
#include <string.h>

typedef uint16_t k3c_bf16;

static inline float bf16_to_f32(k3c_bf16 h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline k3c_bf16 f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (k3c_bf16)((u >> 16) | 0x40u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (k3c_bf16)(u >> 16);
}

/* Round an f32 to the nearest bf16 value and back: the rounding a bf16 store applies. */
static inline float bf16_round(float f) { return bf16_to_f32(f32_to_bf16(f)); }

static inline float f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, man = h & 0x3ffu, u;
    if (exp == 0) {
        if (man == 0) {
            u = sign;
        } else { /* subnormal: normalise */
            exp = 127 - 15 + 1;
            while (!(man & 0x400u)) { man <<= 1; exp--; }
            u = sign | (exp << 23) | ((man & 0x3ffu) << 13);
        }
    } else if (exp == 31) {
        u = sign | 0x7f800000u | (man << 13);
    } else {
        u = sign | ((exp + 127 - 15) << 23) | (man << 13);
    }
    float f;
    memcpy(&f, &u, 4);
    return f;
}

#endif
