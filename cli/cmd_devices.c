/* mmpipe devices: what this build can compute on here. Lists the CPU and
 * every CUDA device this process sees (name, memory), or says the build has
 * no CUDA. Exit 0 either way; scripts and the gpu tests grep "^cuda:". */
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "cli/cli.h"
#ifdef MMP_HAVE_CUDA
#include "kernels/cuda.h"
#endif

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
#ifdef MMP_HAVE_CUDA
    int n = mmp_cuda_device_count();
    for (int d = 0; d < n; d++) {
        char name[256];
        size_t bytes = 0;
        if (mmp_cuda_device_info(d, name, sizeof name, &bytes) == MMP_OK) {
            printf("cuda:%-5d %s, %.1f GiB\n", d, name, (double)bytes / (1 << 30));
        }
    }
    if (n == 0) {
        printf("(built with CUDA; no CUDA device is visible)\n");
    }
#else
    printf("(built without CUDA: -DMMP_CUDA=ON where nvcc, cuDNN and NCCL are installed)\n");
#endif
    return 0;
}
