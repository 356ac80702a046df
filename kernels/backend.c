/* Backend instances: creation, the shared CPU instance, the sticky error.
 * The implementations themselves are the tables in kernels/cpu/backend.c and
 * kernels/cuda/backend.c (in the CUDA module, common/cuda_module.h); nothing
 * here knows a device. */
#include "kernels/backend.h"

#include <stdio.h>
#include <stdlib.h>

#include "common/cuda_module.h"

static mmp_backend cpu_instance = {.ops = &mmp_backend_cpu_ops, .ctx = NULL, .err = MMP_OK};

size_t mmp_backend_lp_bytes(mmp_precision prec)
{
    return prec == MMP_PREC_FP32 ? 4 : 2;
}

mmp_backend *mmp_backend_cpu(void)
{
    return &cpu_instance;
}

mmp_err mmp_backend_create(mmp_backend **out, const mmp_backend_ops *ops, int device)
{
    *out = NULL;
    mmp_backend *be = calloc(1, sizeof *be);
    if (!be) {
        return mmp_errorf(MMP_ERR_NOMEM, "backend %s", ops->name);
    }
    be->ops = ops;
    if (ops->open) {
        mmp_err e = ops->open(&be->ctx, device);
        if (e != MMP_OK) {
            free(be);
            return mmp_error_prefix(e, "backend %s on device %d", ops->name, device);
        }
    }
    *out = be;
    return MMP_OK;
}

mmp_err mmp_backend_create_cuda(mmp_backend **out, int device)
{
    *out = NULL;
    void *ops = NULL;
    MMP_TRY(mmp_cuda_module_sym("mmp_backend_cuda_ops", &ops));
    return mmp_backend_create(out, ops, device);
}

void mmp_backend_destroy(mmp_backend *be)
{
    if (!be || be == &cpu_instance) {
        return;
    }
    if (be->ops->close) {
        be->ops->close(be->ctx);
    }
    free(be);
}

mmp_err mmp_backend_error(const mmp_backend *be)
{
    if (be->err != MMP_OK) {
        (void)mmp_errorf(be->err, "%s", be->err_msg);
    }
    return be->err;
}

void mmp_backend_clear_error(mmp_backend *be)
{
    be->err = MMP_OK;
    be->err_msg[0] = '\0';
}

void mmp_backend_fail(mmp_backend *be, mmp_err e)
{
    if (e != MMP_OK && be->err == MMP_OK) {
        be->err = e;
        snprintf(be->err_msg, sizeof be->err_msg, "%s", mmp_last_error());
    }
}

void *mmp_backend_stream(mmp_backend *be)
{
    return be->ops->stream ? be->ops->stream(be) : NULL;
}

size_t mmp_backend_device_bytes(mmp_backend *be)
{
    return be->ops->device_bytes ? be->ops->device_bytes(be) : 0;
}

void *mmp_backend_host_alloc(mmp_backend *be, size_t bytes)
{
    if (be->ops->host_alloc) {
        return be->ops->host_alloc(be, bytes);
    }
    return calloc(1, bytes ? bytes : 1);
}

void mmp_backend_host_free(mmp_backend *be, void *p)
{
    if (be->ops->host_free) {
        be->ops->host_free(be, p);
    } else {
        free(p);
    }
}

int mmp_backend_is_host(const mmp_backend *be)
{
    return be->ops == &mmp_backend_cpu_ops;
}

void mmp_backend_upload(mmp_backend *be, void *dst, const void *src_host, size_t bytes)
{
    if (be->ops->upload) {
        be->ops->upload(be, dst, src_host, bytes);
    } else {
        be->ops->to_device(be, dst, src_host, bytes);
    }
}

void mmp_backend_upload_wait(mmp_backend *be)
{
    if (be->ops->upload_wait) {
        be->ops->upload_wait(be);
    }
}
