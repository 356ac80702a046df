/* WebP decoding through libwebp's animation decoder (data/codecs.h), which is
 * what PIL uses for every WebP: one code path for still and animated files,
 * and the same bytes as PIL by construction. The size is read from the
 * headers first (WebPGetFeatures) because WebPAnimDecoderNew allocates the
 * whole RGBA canvas. Must never print or exit. */
#include "data/codecs.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <webp/decode.h>
#include <webp/demux.h>

int mmp_webp_sniff(const void *buf, size_t len)
{
    const uint8_t *b = buf;
    return len >= 12 && memcmp(b, "RIFF", 4) == 0 && memcmp(b + 8, "WEBP", 4) == 0;
}

mmp_err mmp_webp_decode(const char *name, const void *buf, size_t len, long long max_pixels,
                        mmp_image *img)
{
    mmp_err ret = MMP_OK;
    WebPAnimDecoder *dec = NULL;
    MMP_TRY(mmp_image_decode_start(name, buf, len, mmp_webp_sniff, "WebP", img));
    WebPBitstreamFeatures f;
    VP8StatusCode st = WebPGetFeatures(buf, len, &f);
    if (st == VP8_STATUS_NOT_ENOUGH_DATA) {
        return mmp_errorf(MMP_ERR_DATA, "%s: truncated WebP", name);
    }
    if (st != VP8_STATUS_OK) {
        return mmp_errorf(MMP_ERR_DATA, "%s: bad WebP (libwebp status %d)", name, (int)st);
    }
    MMP_TRY(mmp_image_check_size(name, f.width, f.height, max_pixels, img));
    WebPAnimDecoderOptions opt;
    if (!WebPAnimDecoderOptionsInit(&opt)) {
        return mmp_errorf(MMP_ERR_INTERNAL, "%s: libwebp version mismatch", name);
    }
    opt.color_mode = MODE_RGBA; /* as PIL: unpremultiplied, alpha then dropped */
    opt.use_threads = 0;
    WebPData data = {.bytes = buf, .size = len};
    dec = WebPAnimDecoderNew(&data, &opt);
    WebPAnimInfo info;
    if (!dec || !WebPAnimDecoderGetInfo(dec, &info)) {
        /* The headers parsed above, so what is left is the chunk layout. */
        ret = mmp_errorf(MMP_ERR_DATA, "%s: truncated or bad WebP (its chunks do not parse)", name);
        goto exit;
    }
    if ((long long)info.canvas_width != f.width || (long long)info.canvas_height != f.height) {
        ret = mmp_errorf(MMP_ERR_DATA, "%s: bad WebP: canvas %ux%u but header %dx%d", name,
                         info.canvas_width, info.canvas_height, f.width, f.height);
        goto exit;
    }
    uint8_t *rgba = NULL;
    int timestamp;
    if (!WebPAnimDecoderHasMoreFrames(dec) || !WebPAnimDecoderGetNext(dec, &rgba, &timestamp)) {
        ret = mmp_errorf(MMP_ERR_DATA,
                         "%s: truncated or bad WebP (its first frame does not decode)", name);
        goto exit;
    }
    size_t n = (size_t)f.width * (size_t)f.height;
    img->rgb = malloc(n * 3);
    if (!img->rgb) {
        ret = mmp_errorf(MMP_ERR_NOMEM, "%s: %zu bytes for pixels", name, n * 3);
        goto exit;
    }
    for (size_t i = 0; i < n; i++) {
        memcpy(img->rgb + 3 * i, rgba + 4 * i, 3);
    }
    img->width = f.width;
    img->height = f.height;
exit:
    WebPAnimDecoderDelete(dec);
    if (ret != MMP_OK) {
        mmp_image_fini(img);
    }
    return ret;
}
