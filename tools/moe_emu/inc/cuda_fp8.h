/* emulator shim: common.cuh's FP8 helpers compile but must not run (no emulation of the conversions) */
#pragma once
#include <cstdint>
#include <cstdio>
#include <cstdlib>
typedef uint8_t __nv_fp8_storage_t;
struct __half_raw { unsigned short x; };
struct __half { __half(__half_raw) {} };
enum { __NV_SATFINITE, __NV_E4M3 };
static inline uint8_t __nv_cvt_float_to_fp8(float, int, int) { fputs("emu: fp8 not emulated\n", stderr); abort(); }
static inline __half_raw __nv_cvt_fp8_to_halfraw(__nv_fp8_storage_t, int) { fputs("emu: fp8 not emulated\n", stderr); abort(); }
static inline float __half2float(__half) { abort(); }
