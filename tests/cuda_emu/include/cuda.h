/* The CUDA emulator's stand-in for <cuda.h> (the driver types cuda_ipc.c takes):
 * tests/cuda_emu/include/mmp_cuda_emu.h. */
#include "mmp_cuda_emu.h"
