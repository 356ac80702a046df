/* The CUDA emulator's module has no NCCL (tests/cuda_emu): its nccl
 * transport joins nothing, so the channel walk (transport/channel.c) moves
 * on to cuda_ipc, which the emulator runs, and to the host transports. */
#include "transport/channel.h"

static int never(const mmp_channel_cfg *cfg, const char **why_not)
{
    (void)cfg;
    *why_not = "the CUDA emulator has no NCCL";
    return 0;
}

const mmp_transport mmp_transport_nccl = {
    .name = "nccl",
    .caps = MMP_TRANSPORT_DEVICE_SLOTS | MMP_TRANSPORT_NETWORK,
    .can_connect = never,
};
