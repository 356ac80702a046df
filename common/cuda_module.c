/* Loads the CUDA module (common/cuda_module.h). Never touches CUDA itself:
 * it only finds, opens and checks the shared object. */
#include "common/cuda_module.h"

#include <dlfcn.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#ifndef MMP_CUDA_MODULE_DIR
#define MMP_CUDA_MODULE_DIR "" /* the build folder (CMake sets it in a CUDA build) */
#endif

static pthread_once_t once = PTHREAD_ONCE_INIT;
static void *handle;       /* the module, once loaded */
static char failure[2048]; /* why it could not be, once tried */

int mmp_cuda_module_built(void)
{
#ifdef MMP_HAVE_CUDA
    return 1;
#else
    return 0;
#endif
}

/* Appends "; PATH: REASON" to failure (cut at its end). */
static void note(const char *path, const char *reason)
{
    size_t n = strlen(failure);
    snprintf(failure + n, sizeof failure - n, "%s%.900s: %.300s", n ? "; " : "", path, reason);
}

/* Opens path unless a copy is open already; checks its ABI number. */
static void *try_open(const char *path)
{
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        const char *e = dlerror();
        note(path, e ? e : "not loaded");
        return NULL;
    }
    const unsigned *abi = dlsym(h, "mmp_cuda_module_abi");
    if (!abi || *abi != MMP_CUDA_MODULE_ABI) {
        char why[96];
        if (abi) {
            snprintf(why, sizeof why, "of another build (ABI %u, this binary wants %u)", *abi,
                     MMP_CUDA_MODULE_ABI);
        } else {
            snprintf(why, sizeof why, "not an mmpipe CUDA module (no mmp_cuda_module_abi)");
        }
        note(path, why);
        dlclose(h);
        return NULL;
    }
    return h;
}

static void load(void)
{
    if (!mmp_cuda_module_built()) {
        return;
    }
    /* linked into this executable already (the GPU tests): that copy */
    handle = dlopen(MMP_CUDA_MODULE_FILE, RTLD_NOW | RTLD_NOLOAD);
    if (handle) {
        return;
    }
    /* beside the binary, then one folder up (a test or bench binary in
     * build/tests, build/bench): the first file there is the one to use,
     * or to fail on */
    char exe[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    char path[PATH_MAX + 64];
    exe[n > 0 ? n : 0] = 0;
    for (int up = 0; up < 2; up++) {
        char *slash = strrchr(exe, '/');
        if (!slash) {
            break;
        }
        *slash = 0;
        snprintf(path, sizeof path, "%s/%s", exe, MMP_CUDA_MODULE_FILE);
        if (access(path, F_OK) == 0) {
            handle = try_open(path);
            return;
        }
        note(path, "no such file");
    }
    if (MMP_CUDA_MODULE_DIR[0]) {
        snprintf(path, sizeof path, "%s/%s", MMP_CUDA_MODULE_DIR, MMP_CUDA_MODULE_FILE);
        handle = try_open(path);
    }
}

mmp_err mmp_cuda_module_sym(const char *name, void **out)
{
    *out = NULL;
    if (!mmp_cuda_module_built()) {
        return mmp_errorf(MMP_ERR_UNSUPPORTED,
                          "%s: this mmpipe was built without CUDA (configure with -DMMP_CUDA=ON "
                          "where nvcc, cuDNN and NCCL are installed)",
                          name);
    }
    pthread_once(&once, load);
    if (!handle) {
        return mmp_errorf(MMP_ERR_CUDA, "the CUDA module %s could not be loaded: %s",
                          MMP_CUDA_MODULE_FILE, failure[0] ? failure : "not found");
    }
    void *p = dlsym(handle, name);
    if (!p) {
        return mmp_errorf(MMP_ERR_CUDA, "the CUDA module %s has no %s", MMP_CUDA_MODULE_FILE, name);
    }
    *out = p;
    return MMP_OK;
}
