/* GIF decoding (data/gif.c: giflib's low-level reader, the first frame on
 * the logical screen, colour maps, the pixel limit), and the dispatcher's
 * sniffing (data/image.c): bytes the GIF sniffer takes no other one does. */
#include "data/codecs.h"
#include "tests/fuzz/fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fuzz_quiet();
    if (mmp_gif_sniff(data, size) && (mmp_jpeg_sniff(data, size) || mmp_webp_sniff(data, size))) {
        __builtin_trap(); /* two decoders claim the same bytes */
    }
    fuzz_check_decode(mmp_gif_decode, "fuzz.gif", data, size);
    return 0;
}
