#pragma once
#include <cuda_runtime_api.h>
#include "util/error.h"
#define K3C_CUDA_TRY(call) do { if ((call) != cudaSuccess) return k3c_errorf("emu: %s", #call); } while (0)
#define K3C_CUDA_LAUNCHED(what) do { } while (0)
