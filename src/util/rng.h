/* Deterministic random numbers (splitmix64 seeding a xoshiro256**): synthesized weights depend only on
 * the seed and the tensor's name, never on the order tensors are generated in. */
#ifndef K3C_UTIL_RNG_H
#define K3C_UTIL_RNG_H

#include <math.h>
#include <stdint.h>

typedef struct k3c_rng {
    uint64_t s[4];
} k3c_rng;

static inline uint64_t k3c_splitmix64(uint64_t *x) {
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static inline void k3c_rng_seed(k3c_rng *r, uint64_t seed) {
    for (int i = 0; i < 4; i++) r->s[i] = k3c_splitmix64(&seed);
}

/* FNV-1a of a string, to derive a per-tensor stream from (seed, name). */
static inline uint64_t k3c_hash_str(const char *s) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (; *s; s++) h = (h ^ (uint8_t)*s) * 0x100000001b3ull;
    return h;
}

static inline uint64_t k3c_rng_next(k3c_rng *r) {
    uint64_t *s = r->s, result = ((s[1] * 5) << 7 | (s[1] * 5) >> 57) * 9, t = s[1] << 17;
    s[2] ^= s[0]; s[3] ^= s[1]; s[1] ^= s[2]; s[0] ^= s[3]; s[2] ^= t;
    s[3] = (s[3] << 45) | (s[3] >> 19);
    return result;
}

/* Advances the stream by `steps` calls of k3c_rng_next (util/rng.c; thread-safe, O(popcount(steps)) matrix
 * applications after a one-time table of 512 KiB): a thread can start generating at any position of a
 * tensor's stream and produce exactly the values a single sequential pass would. */
void k3c_rng_jump(k3c_rng *r, uint64_t steps);

/* Uniform in [0, 1). */
static inline double k3c_rng_uniform(k3c_rng *r) { return (double)(k3c_rng_next(r) >> 11) * 0x1.0p-53; }

/* Standard normal (Box-Muller; one value per call, simplicity over speed). */
static inline double k3c_rng_normal(k3c_rng *r) {
    double u1 = k3c_rng_uniform(r), u2 = k3c_rng_uniform(r);
    if (u1 < 1e-300) u1 = 1e-300;
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

#endif
