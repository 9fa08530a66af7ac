/* The emulated E4M3 conversions (inc/cuda_fp8.h, from the PTX semantics) against the host codec util/fp8.h
 * on every f32 bit pattern and every byte: the two must agree except for the sign of a NaN byte (the
 * hardware's canonical NaN is 0x7f; util/fp8.h writes 0xff for a negative NaN; both decode to NaN). */
#include <atomic>
#include <cstdio>
#include <cstring>
#include <thread>
#include <vector>
#include "cuda_fp8.h"
#include "util/fp8.h"

extern "C" int emu_fp8_selfcheck(void) {
    std::atomic<long> bad(0), nan_sign(0);
    unsigned nt = std::thread::hardware_concurrency();
    if (nt < 1) nt = 1;
    auto work = [&](unsigned k) {
        long b = 0, ns = 0;
        for (uint64_t u = k; u < (1ull << 32); u += nt) {
            uint32_t w = (uint32_t)u;
            float f;
            memcpy(&f, &w, 4);
            uint8_t dev = __nv_cvt_float_to_fp8(f, __NV_SATFINITE, __NV_E4M3), host = k3c_f32_to_e4m3(f);
            if (dev != host) {
                if (std::isnan(f) && dev == 0x7f && host == 0xff) ns++;
                else if (b++ < 4) printf("fp8 encode %08x (%g): emulated %02x, util/fp8.h %02x\n", w, f, dev, host);
            }
        }
        bad += b, nan_sign += ns;
    };
    std::vector<std::thread> th;
    for (unsigned k = 0; k < nt; k++) th.emplace_back(work, k);
    for (auto &t : th) t.join();
    long dbad = 0;
    for (int c = 0; c < 256; c++) {
        float dev = __half2float(__half(__nv_cvt_fp8_to_halfraw((uint8_t)c, __NV_E4M3))), host = k3c_e4m3_to_f32((uint8_t)c);
        bool same = std::isnan(dev) ? std::isnan(host) : memcmp(&dev, &host, 4) == 0;
        if (!same && dbad++ < 4) printf("fp8 decode %02x: emulated %g, util/fp8.h %g\n", c, dev, host);
    }
    printf("fp8: encode of all 2^32 f32: %ld differ (+ %ld negative NaNs: 0x7f vs 0xff); decode of 256 bytes: %ld "
           "differ\n", bad.load(), nan_sign.load(), dbad);
    return bad != 0 || dbad != 0;
}
