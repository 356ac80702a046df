/* Data-channel message headers as a receiving stage sees them: 32 header
 * bytes as the peer wrote them into the shared segment, then the
 * receiver's geometry (rows per micro-batch, bytes per row). The checks
 * (mmp_msg_check, then mmp_peer_check_rows) must never crash, and whatever
 * they accept must be readable the way the worker reads it: n rows of data,
 * the text mask after them and the n valid flags last, all inside a slot of
 * exactly mb_max rows (ASan sees any read past it). */
#include "stages/peer.h"
#include "tests/fuzz/fuzz.h"
#include "transport/channel.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fuzz_quiet();
    mmp_msg_header h;
    uint8_t geo[3] = {0};
    if (size < sizeof h) {
        return 0;
    }
    memcpy(&h, data, sizeof h);
    memcpy(geo, data + sizeof h, size - sizeof h < sizeof geo ? size - sizeof h : sizeof geo);
    int mb_max = 1 + geo[0] % 64;
    size_t row_floats = 1 + geo[1] % 32;
    size_t mask_floats = geo[2] % 2 ? geo[2] % 16 : 0; /* text: T mask floats per row */
    size_t row_bytes = (row_floats + mask_floats + 1) * sizeof(float);
    size_t slot = row_bytes * (size_t)mb_max;
    if (mmp_msg_check("fuzz", &h, slot) != MMP_OK ||
        mmp_peer_check_rows(0, &h, mb_max, row_bytes) != MMP_OK) {
        return 0;
    }
    float *payload = calloc(slot ? slot / sizeof(float) : 1, sizeof(float));
    if (!payload) {
        return 0;
    }
    size_t n = (size_t)h.n;
    volatile float sum = 0;
    const float *mask = payload + n * row_floats; /* payload_mask */
    const float *valid = mask + n * mask_floats;  /* payload_valid */
    for (size_t i = 0; i < n; i++) {
        sum += payload[i * row_floats + row_floats - 1];
        if (mask_floats) {
            sum += mask[i * mask_floats + mask_floats - 1];
        }
        sum += valid[i];
    }
    (void)sum;
    free(payload);
    return 0;
}
