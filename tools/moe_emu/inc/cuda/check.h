/* emulator shim of src/cuda/check.h: the same macros (launch faults abort inside the emulator) */
#pragma once
#include <cuda_runtime_api.h>
#include "util/error.h"
#define K3C_CUDA_TRY(call) do { if ((call) != cudaSuccess) return k3c_errorf("emu: %s failed", #call); } while (0)
#define K3C_CUDA_LAUNCHED(what) do { if (cudaGetLastError() != cudaSuccess) return k3c_errorf("emu: launching %s", what); } while (0)
