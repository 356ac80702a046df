/* mmpipe devices: what this build can compute on here. Lists the CPU and
 * every CUDA device this process sees (name, memory), or says the build has
 * no CUDA. Exit 0 either way (1 when the build's CUDA module does not load:
 * common/cuda_module.h); scripts and the gpu tests grep "^cuda:". */
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "cli/cli.h"
#include "common/cuda_module.h"

static const char USAGE[] = "usage: mmpipe devices\n"
                            "\n"
                            "Lists the devices a plan can name in hosts[].devices on this host:\n"
                            "  cpu        the CPU (its online cores)\n"
                            "  cuda:N     each CUDA device this process sees, with its memory\n"
                            "A build without CUDA says so.\n";

int mmp_cmd_devices(int argc, char **argv)
{
    for (int i = 1; i < argc; i++) {
        if (mmp_cli_help(argv[i], USAGE)) {
            return 0;
        }
        fprintf(stderr, "mmpipe devices: unknown argument '%s'\n\n%s", argv[i], USAGE);
        return 2;
    }
    printf("cpu       %ld cores\n", sysconf(_SC_NPROCESSORS_ONLN));
    if (!mmp_cuda_module_built()) {
        printf("(built without CUDA: -DMMP_CUDA=ON where nvcc, cuDNN and NCCL are installed)\n");
        return 0;
    }
    /* kernels/cuda.h's mmp_cuda_device_count and mmp_cuda_device_info, from
     * the CUDA module (loading it is what this command is for: a module
     * that does not load is an error, with the loader's reason) */
    void *count_sym = NULL, *info_sym = NULL;
    if (mmp_cuda_module_sym("mmp_cuda_device_count", &count_sym) != MMP_OK ||
        mmp_cuda_module_sym("mmp_cuda_device_info", &info_sym) != MMP_OK) {
        fprintf(stderr, "mmpipe devices: %s\n", mmp_last_error());
        return 1;
    }
    int (*device_count)(void);
    mmp_err (*device_info)(int, char *, size_t, size_t *);
    /* POSIX: a dlsym'd object pointer converts to a function pointer */
    memcpy(&device_count, &count_sym, sizeof device_count);
    memcpy(&device_info, &info_sym, sizeof device_info);
    int n = device_count();
    for (int d = 0; d < n; d++) {
        char name[256];
        size_t bytes = 0;
        if (device_info(d, name, sizeof name, &bytes) == MMP_OK) {
            printf("cuda:%-5d %s, %.1f GiB\n", d, name, (double)bytes / (1 << 30));
        }
    }
    if (n == 0) {
        printf("(built with CUDA; no CUDA device is visible)\n");
    }
    return 0;
}
