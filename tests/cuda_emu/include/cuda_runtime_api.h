/* The CUDA emulator's stand-in for <cuda_runtime_api.h>: tests/cuda_emu/include/mmp_cuda_emu.h. */
#include "mmp_cuda_emu.h"
