/* The transport/cuda/ pieces as the rest of the code reaches them: from the
 * CUDA module (common/cuda_module.h), loaded on first use. Nothing here
 * calls CUDA or NCCL. */
#include <stddef.h>

#include "common/cuda_module.h"
#include "transport/channel.h"
#include "transport/reduce_nccl.h"

mmp_err mmp_reduce_nccl_load(const mmp_reduce_nccl_ops **out)
{
    void *p = NULL;
    *out = NULL;
    mmp_err e = mmp_cuda_module_sym("mmp_reduce_nccl_ops_cuda", &p);
    if (e != MMP_OK) {
        return mmp_error_prefix(e, "replicas' reduce over nccl");
    }
    *out = p;
    return MMP_OK;
}

mmp_err mmp_transport_gpu(const char *name, const mmp_transport **out)
{
    void *p = NULL;
    *out = NULL;
    MMP_TRY(mmp_cuda_module_sym(name, &p));
    *out = p;
    return MMP_OK;
}
