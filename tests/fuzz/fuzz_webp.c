/* WebP decoding (data/webp.c: libwebp's headers, then its animation decoder
 * for the first frame, the pixel limit, RGBA to RGB), and the dispatcher's
 * sniffing (data/image.c): bytes the WebP sniffer takes no other one does. */
#include "data/codecs.h"
#include "tests/fuzz/fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fuzz_quiet();
    if (mmp_webp_sniff(data, size) && (mmp_jpeg_sniff(data, size) || mmp_gif_sniff(data, size))) {
        __builtin_trap(); /* two decoders claim the same bytes */
    }
    fuzz_check_decode(mmp_webp_decode, "fuzz.webp", data, size);
    return 0;
}
