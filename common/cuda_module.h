/* The CUDA module: in a CUDA build, everything that links the CUDA runtime,
 * cuBLAS, cuDNN and NCCL (kernels/cuda/, transport/cuda/) is one shared
 * object, libmmpcuda.so, beside the mmpipe binary. A process loads it the
 * first time it needs a GPU (a stage or single process placed on cuda:N, a
 * GPU channel, the NCCL reduce, `mmpipe devices`) and never otherwise: the
 * coordinator, CPU stages and every other command start without those
 * libraries (their loading alone costs a process ~0.1 s and ~200 MB).
 *
 * The module's code calls back into the process's own mmp_* functions (the
 * binary exports them), so it is never linked into a second copy of them.
 * It exports tables and functions the callers look up by name:
 *   mmp_backend_cuda_ops       kernels/backend.h   (kernels/cuda/backend.c)
 *   mmp_transport_cuda_ipc     transport/channel.h (transport/cuda/cuda_ipc.c)
 *   mmp_transport_nccl         transport/channel.h (transport/cuda/nccl.c)
 *   mmp_reduce_nccl_ops_cuda   transport/reduce_nccl.h (transport/cuda/reduce_nccl.c)
 *   mmp_cuda_device_count, mmp_cuda_device_info   kernels/cuda.h
 * and mmp_cuda_module_abi (= MMP_CUDA_MODULE_ABI), checked at load so a
 * module of another build is refused rather than misread. Bump the number
 * when one of those tables or signatures changes.
 *
 * Where it is looked for: a copy already in the process (an executable that
 * links it, as the GPU tests do); beside the running binary; one folder up
 * (build/tests/, build/bench/); the build folder the binary was built in. */
#ifndef MMP_COMMON_CUDA_MODULE_H
#define MMP_COMMON_CUDA_MODULE_H

#include "common/err.h"

#define MMP_CUDA_MODULE_ABI 1u
#define MMP_CUDA_MODULE_FILE "libmmpcuda.so"

/* Whether this build has the module (it was configured with CUDA). */
int mmp_cuda_module_built(void);

/* *out: the address of the module's exported symbol `name`, loading the
 * module first (once per process; thread-safe; never unloaded). Errors:
 * MMP_ERR_UNSUPPORTED in a build without CUDA; MMP_ERR_CUDA when the module
 * cannot be loaded (each place tried, with the loader's reason), is of
 * another build (its ABI number), or has no such symbol. *out NULL then. */
mmp_err mmp_cuda_module_sym(const char *name, void **out);

#endif
