/* The CUDA emulator's stand-in for <cuda_bf16.h>: tests/cuda_emu/include/mmp_cuda_emu.h. */
#include "mmp_cuda_emu.h"
