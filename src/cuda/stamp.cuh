/* Block stamps, the device side (cuda/stamp.h says what they are for). A kernel is stamped by two lines:
 *
 *     K3C_STAMP_BLOCK_BEGIN(K3C_KID_RMSNORM);   first statement: thread 0 stamps BEGIN
 *     ...
 *     K3C_STAMP_BLOCK_END(K3C_KID_RMSNORM);     last statement, and before a return that ends the kernel's
 *                                               main path: lane 0 of each warp stamps END
 *
 * and k3c_pdl_wait (common.cuh) stamps WAIT (thread 0) after griddepcontrol.wait returns. Guards that send
 * idle threads or blocks home early (`if (row >= rows) return;`) get no END: a block without one ends, for
 * the report, at its last other stamp. (A scope guard stamping END at every return was tried: the END at
 * early guard exits cost kda_conv_kernel 16 registers, 32 -> 48, occupancy included.) The translation unit
 * ends with K3C_STAMP_TU(name), its host binding (declared in cuda/stamp.h).
 *
 * Off, a stamp is one read of the __constant__ pointer and a uniform branch not taken: no store, no change
 * to the kernel's arithmetic or shared memory. On, a stamping thread reads the timer first, then claims a
 * slot with one atomicAdd on its region's counter and stores 16 bytes: the returned slot makes that warp
 * wait one L2 round trip (~0.5 us) at its start or end, which the report measures (the stamped step
 * against the plain one). */
#ifndef K3C_CUDA_STAMP_CUH
#define K3C_CUDA_STAMP_CUH

#include "cuda/stamp.h"

/* Compiled in only where the build asks (make STAMPS=1, -DK3C_STAMPS=1: tools/gpu-measure.sh builds that way):
 * switched off, a stamp still costs its constant load and branch, and on the H200 (2026-12-02, tools/gpu-ab.sh,
 * same machine) the decode step with the stamps compiled in and off was 1.4-4.3 % slower (kimi-linear-48b b=1
 * 2.867 against 2.750 ms, k3-slice b=1 6.098 against 5.992). Without K3C_STAMPS every stamp is nothing, the
 * kernels are the ones without stamps, and K3C_CUDA_PROFILE=3 says the build has none. */
#if K3C_STAMPS
/* one copy per translation unit (no relocatable device code): each TU's K3C_STAMP_TU binds its own. The
 * stamp's PTX names it (its PTX symbol is this name: a mangled one would fail ptxas, not go wrong). */
static __constant__ k3c_stamp_ctl k3c_stamp_ctl_;
static_assert(offsetof(k3c_stamp_ctl, rec) == 0 && offsetof(k3c_stamp_ctl, count) == 8 &&
                  offsetof(k3c_stamp_ctl, cap) == 16 && sizeof(k3c_stamp_rec) == 16,
              "K3C_STAMP_PUT's PTX reads the control block and writes the record at these offsets");

/* The stamp in PTX, opaque to the compiler: its registers are its own block's (a few, where the kernel has
 * few live: start, wait, end), and nothing of it is hoisted into the kernel's body. Written in C, the same
 * code (tools/moe_emu's emulation of it, inc/emu.h emu_stamp_put) made the compiler keep values live across
 * the kernel: gemv_t1_kernel went from 57 to 70 registers, fewer resident blocks, another split of its rows.
 * Threads whose linear index t has t & MASK != 0 do nothing (MASK ~0: thread 0; 31: lane 0 of each warp).
 * HI: kid << 24 | kind << 22 (K3C_STAMP_INFO). With the pointer NULL (off) it is one constant load and a
 * uniform branch. On: the timer first, then the slot (atomicAdd on the region's counter), then the record. */
#define K3C_STAMP_PUT(HI, MASK)                                                                                    \
    asm volatile("{\n\t"                                                                                           \
                 ".reg .pred p;\n\t.reg .b32 r<8>;\n\t.reg .b64 d<6>;\n\t"                                         \
                 "ld.const.u64 d0, [k3c_stamp_ctl_];\n\t"                                                          \
                 "setp.eq.u64 p, d0, 0;\n\t"                                                                       \
                 "@p bra.uni K3C_STAMP_DONE;\n\t"                                                                  \
                 "mov.u32 r0, %%tid.x;\n\tmov.u32 r1, %%tid.y;\n\tmov.u32 r2, %%tid.z;\n\t"                        \
                 "mov.u32 r3, %%ntid.x;\n\tmov.u32 r4, %%ntid.y;\n\t"                                              \
                 "mad.lo.u32 r1, r2, r4, r1;\n\tmad.lo.u32 r0, r1, r3, r0;\n\t"                                    \
                 "and.b32 r0, r0, %1;\n\tsetp.ne.u32 p, r0, 0;\n\t"                                                \
                 "@p bra K3C_STAMP_DONE;\n\t"                                                                      \
                 "mov.u64 d1, %%globaltimer;\n\t"                                                                  \
                 "mov.u64 d2, %%gridid;\n\t"                                                                       \
                 "mov.u32 r0, %%smid;\n\tmov.u32 r1, %%warpid;\n\t"                                                \
                 "and.b32 r0, r0, 255;\n\tand.b32 r1, r1, 3;\n\tshl.b32 r0, r0, 2;\n\tor.b32 r0, r0, r1;\n\t"      \
                 "ld.const.u64 d3, [k3c_stamp_ctl_+8];\n\tcvta.to.global.u64 d3, d3;\n\t"                          \
                 "mul.wide.u32 d4, r0, 4;\n\tadd.u64 d3, d3, d4;\n\t"                                              \
                 "atom.global.add.u32 r1, [d3], 1;\n\t"                                                            \
                 "ld.const.u32 r2, [k3c_stamp_ctl_+16];\n\t"                                                       \
                 "setp.ge.u32 p, r1, r2;\n\t"                                                                      \
                 "@p bra K3C_STAMP_DONE;\n\t"                                                                      \
                 "mul.wide.u32 d4, r0, r2;\n\tcvt.u64.u32 d5, r1;\n\tadd.u64 d4, d4, d5;\n\tshl.b64 d4, d4, 4;\n\t" \
                 "cvta.to.global.u64 d0, d0;\n\tadd.u64 d0, d0, d4;\n\t"                                           \
                 "mov.u32 r3, %%ctaid.x;\n\tmov.u32 r4, %%ctaid.y;\n\tmov.u32 r5, %%ctaid.z;\n\t"                  \
                 "mov.u32 r6, %%nctaid.x;\n\tmov.u32 r7, %%nctaid.y;\n\t"                                          \
                 "mad.lo.u32 r4, r5, r7, r4;\n\tmad.lo.u32 r3, r4, r6, r3;\n\t"                                    \
                 "and.b32 r3, r3, 4194303;\n\tor.b32 r3, r3, %0;\n\t"                                              \
                 "cvt.u32.u64 r4, d2;\n\t"                                                                         \
                 "st.global.u64 [d0], d1;\n\tst.global.v2.u32 [d0+8], {r4, r3};\n\t"                               \
                 "K3C_STAMP_DONE:\n\t}" ::"n"(HI), "n"(MASK) : "memory")

#define K3C_STAMP_TU(name)                                                                                         \
    extern "C" int k3c_stamp_bind_##name(const k3c_stamp_ctl *c, void *stream) {                                   \
        return cudaMemcpyToSymbolAsync(k3c_stamp_ctl_, c, sizeof *c, 0, cudaMemcpyHostToDevice,                    \
                                       (cudaStream_t)stream) == cudaSuccess ? 0 : -1;                              \
    }

#else
#define K3C_STAMP_PUT(HI, MASK) \
    do {                        \
    } while (0)
#define K3C_STAMP_TU(name)                                                                                         \
    extern "C" int k3c_stamp_bind_##name(const k3c_stamp_ctl *c, void *stream) {                                   \
        (void)c;                                                                                                   \
        (void)stream;                                                                                              \
        return -1;                                                                                                 \
    }
#endif

#define K3C_STAMP_BLOCK_BEGIN(kid) K3C_STAMP_PUT(((unsigned)(kid) << 24) | (K3C_STAMP_BEGIN << 22), 0xffffffff)
#define K3C_STAMP_BLOCK_END(kid) K3C_STAMP_PUT(((unsigned)(kid) << 24) | (K3C_STAMP_END << 22), 31)
#define K3C_STAMP_WAITED() K3C_STAMP_PUT((K3C_STAMP_WAIT << 22), 0xffffffff)

#endif
