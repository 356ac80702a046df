/* The CUDA emulator's stand-in for <cuda_runtime.h>: tests/cuda_emu/include/mmp_cuda_emu.h. */
#include "mmp_cuda_emu.h"
