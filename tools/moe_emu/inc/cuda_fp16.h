/* emulator shim: nothing of cuda_fp16.h is used by the emulated kernels */
#pragma once
