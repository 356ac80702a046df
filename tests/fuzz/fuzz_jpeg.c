/* JPEG decoding (data/jpeg.c, libjpeg-turbo under our limits). */
#include "data/codecs.h"
#include "data/png.h"
#include "tests/fuzz/fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fuzz_quiet();
    mmp_image img = {0};
    if (mmp_jpeg_decode("fuzz.jpg", data, size, 0, &img) == MMP_OK) {
        size_t n = (size_t)img.width * (size_t)img.height * 3;
        volatile uint8_t last = img.rgb[n - 1];
        (void)last;
    }
    mmp_image_fini(&img);
    return 0;
}
