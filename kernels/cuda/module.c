/* The CUDA module's mark (common/cuda_module.h): the ABI number the loader
 * checks before it takes any table of this shared object. */
#include "common/cuda_module.h"

const unsigned mmp_cuda_module_abi = MMP_CUDA_MODULE_ABI;
