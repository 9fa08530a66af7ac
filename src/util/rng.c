/* Skipping ahead in the xoshiro256 stream (util/rng.h). Its state update is linear over GF(2): the state
 * after n steps is M^n times the state, M a 256 x 256 bit matrix. The matrices M^(2^k) are built once by
 * squaring (columns: the images of the unit vectors), and a jump of n applies those of n's set bits. */
#include <pthread.h>

#include "util/rng.h"

#define JUMP_LEVELS 64

/* jump_m[k][j]: M^(2^k) applied to unit vector j (bit j % 64 of word j / 64). 64 x 256 x 32 bytes. */
static uint64_t jump_m[JUMP_LEVELS][256][4];
static pthread_once_t jump_once = PTHREAD_ONCE_INIT;

/* One step of k3c_rng_next's state update, without the output. */
static void step_state(uint64_t s[4]) {
    uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = (s[3] << 45) | (s[3] >> 19);
}

static void apply(const uint64_t m[256][4], const uint64_t v[4], uint64_t out[4]) {
    uint64_t r[4] = {0, 0, 0, 0};
    for (int j = 0; j < 256; j++)
        if (v[j / 64] >> (j % 64) & 1)
            for (int w = 0; w < 4; w++) r[w] ^= m[j][w];
    for (int w = 0; w < 4; w++) out[w] = r[w];
}

static void build_jumps(void) {
    for (int j = 0; j < 256; j++) {
        uint64_t *c = jump_m[0][j];
        c[0] = c[1] = c[2] = c[3] = 0;
        c[j / 64] = 1ull << (j % 64);
        step_state(c);
    }
    for (int k = 1; k < JUMP_LEVELS; k++)
        for (int j = 0; j < 256; j++) apply(jump_m[k - 1], jump_m[k - 1][j], jump_m[k][j]);
}

void k3c_rng_jump(k3c_rng *r, uint64_t steps) {
    pthread_once(&jump_once, build_jumps);
    for (int k = 0; k < JUMP_LEVELS && steps; k++, steps >>= 1)
        if (steps & 1) apply(jump_m[k], r->s, r->s);
}
