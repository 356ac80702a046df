/* PNG decoding (data/png.c, libspng under our limits). The harness first
 * rewrites every chunk's CRC to match its bytes (a copy of the input), so
 * mutations reach the decoder instead of dying at the CRC check. */
#include "data/png.h"
#include "tests/fuzz/fuzz.h"

static uint32_t crc32_of(const uint8_t *p, size_t n)
{
    static uint32_t table[256];
    if (!table[1]) {
        for (uint32_t i = 0; i < 256; i++) {
            uint32_t c = i;
            for (int k = 0; k < 8; k++) {
                c = c & 1 ? 0xEDB88320u ^ (c >> 1) : c >> 1;
            }
            table[i] = c;
        }
    }
    uint32_t c = 0xFFFFFFFFu;
    for (size_t i = 0; i < n; i++) {
        c = table[(c ^ p[i]) & 0xFF] ^ (c >> 8);
    }
    return c ^ 0xFFFFFFFFu;
}

/* Chunks after the 8-byte signature: length (4, big-endian), type (4),
 * data (length), CRC (4) over type and data. */
static void fix_crcs(uint8_t *p, size_t n)
{
    size_t off = 8;
    while (off + 12 <= n) {
        size_t len =
            (size_t)p[off] << 24 | (size_t)p[off + 1] << 16 | (size_t)p[off + 2] << 8 | p[off + 3];
        if (len > n - off - 12) {
            break;
        }
        uint32_t c = crc32_of(p + off + 4, len + 4);
        uint8_t *at = p + off + 8 + len;
        at[0] = (uint8_t)(c >> 24), at[1] = (uint8_t)(c >> 16), at[2] = (uint8_t)(c >> 8),
        at[3] = (uint8_t)c;
        off += len + 12;
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fuzz_quiet();
    uint8_t *copy = fuzz_copy(data, size);
    if (!copy) {
        return 0;
    }
    fix_crcs(copy, size);
    mmp_image img = {0};
    if (mmp_png_decode("fuzz.png", copy, size, 0, &img) == MMP_OK) {
        size_t n = (size_t)img.width * (size_t)img.height * 3;
        volatile uint8_t last = img.rgb[n - 1]; /* the whole buffer is there */
        (void)last;
    }
    mmp_image_fini(&img);
    free(copy);
    return 0;
}
