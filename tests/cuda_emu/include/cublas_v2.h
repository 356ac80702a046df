/* The CUDA emulator's stand-in for <cublas_v2.h>: tests/cuda_emu/include/mmp_cuda_emu.h. */
#include "mmp_cuda_emu.h"
