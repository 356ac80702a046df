/* Data-plane addresses another process reports (Endpoints over the control
 * plane, forwarded by the coordinator to the connecting stage): "host:port"
 * (transport/sock.c mmp_sock_parse, which the tcp channel and reduce use),
 * a nccl creator's "host:port#nccl:<256 hex digits>"
 * (mmp_nccl_parse_address) and the check a stage makes before it takes one
 * (mmp_channel_check_endpoint). fuzz_control reaches only the envelope's
 * length check of these strings; this reaches their parsers. */
#include "transport/channel.h"
#include "transport/reduce_nccl.h"
#include "transport/sock.h"
#include "tests/fuzz/fuzz.h"

#define CAP MMP_SOCK_ADDR_MAX /* as mmp_channel_check_endpoint */

/* "host:port" parsed; traps unless its parts print back to an address that
 * parses to the same parts. 1 when it parsed, *port set. */
static int check_host_port(const char *a, int *port)
{
    char host[MMP_SOCK_ADDR_MAX], again[MMP_SOCK_ADDR_MAX], text[MMP_SOCK_ADDR_MAX + 16];
    if (mmp_sock_parse("fuzz", a, host, sizeof host, port) != MMP_OK) {
        return 0;
    }
    size_t hl = strlen(host);
    if (hl == 0 || hl >= sizeof host || *port < 0 || *port > 65535) {
        __builtin_trap();
    }
    snprintf(text, sizeof text, strchr(host, ':') ? "[%s]:%d" : "%s:%d", host, *port);
    int p2 = -1;
    if (mmp_sock_parse("fuzz", text, again, sizeof again, &p2) != MMP_OK || p2 != *port ||
        strcmp(again, host) != 0) {
        __builtin_trap(); /* host and port do not say the address again */
    }
    return 1;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fuzz_quiet();
    char *a = malloc(size + 1);
    if (!a) {
        return 0;
    }
    memcpy(a, data, size);
    a[size] = 0; /* a protobuf string: ends at the first NUL for C */
    int port = -1;
    int plain = check_host_port(a, &port);

    char hp[CAP];
    unsigned char id[MMP_NCCL_ID_BYTES];
    int nccl = mmp_nccl_parse_address(a, hp, sizeof hp, id) == MMP_OK;
    int nccl_port = -1;
    if (nccl) {
        /* hp, the tag and the id in hex are the address again */
        static const char hexd[] = "0123456789abcdef";
        size_t hl = strlen(hp);
        const char *rest = a + hl;
        if (hl == 0 || hl >= sizeof hp || strncmp(a, hp, hl) != 0 ||
            strncmp(rest, "#nccl:", 6) != 0 || strlen(rest + 6) != 2 * MMP_NCCL_ID_BYTES) {
            __builtin_trap();
        }
        for (size_t i = 0; i < MMP_NCCL_ID_BYTES; i++) {
            const char *d = rest + 6 + 2 * i;
            if ((d[0] | 0x20) != hexd[id[i] >> 4] || (d[1] | 0x20) != hexd[id[i] & 15]) {
                __builtin_trap();
            }
        }
        check_host_port(hp, &nccl_port);
    }

    /* what a stage takes: a network address with a real port, never a name */
    int taken = mmp_channel_check_endpoint(a) == MMP_OK;
    int want = strstr(a, "#nccl") ? nccl && nccl_port > 0 : plain && port > 0;
    if (taken != want || (taken && a[0] == '/')) {
        __builtin_trap();
    }
    free(a);
    return 0;
}
