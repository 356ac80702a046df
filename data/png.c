/* PNG read/write through libspng.
 *
 * Files are read whole and decoded from memory: the images mmpipe trains on
 * are small, and a whole buffer lets us tell "not a PNG" and "truncated"
 * apart from other corruption before libspng sees it. Never resizes. */
#include "data/png.h"

#include <errno.h>
#include <spng.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/fsutil.h"

static const unsigned char png_signature[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};

void mmp_image_fini(mmp_image *img)
{
    if (!img) {
        return;
    }
    free(img->rgb);
    memset(img, 0, sizeof *img);
}

mmp_err mmp_image_check_size(const char *name, long long width, long long height,
                             long long max_pixels, mmp_image *img)
{
    memset(img, 0, sizeof *img);
    if (max_pixels <= 0) {
        max_pixels = MMP_IMAGE_MAX_PIXELS;
    }
    if (width <= 0 || height <= 0) {
        return mmp_errorf(MMP_ERR_DATA, "%s: zero-size image", name);
    }
    if (width > MMP_PNG_MAX_SIDE || height > MMP_PNG_MAX_SIDE) {
        return mmp_errorf(MMP_ERR_DATA, "%s: image larger than %d pixels on a side (%lldx%lld)",
                          name, MMP_PNG_MAX_SIDE, width, height);
    }
    if (width * height > max_pixels) {
        img->width = (int)width;
        img->height = (int)height;
        return mmp_errorf(MMP_ERR_DATA,
                          "%s: %lldx%lld image has %lld pixels, more than the limit of %lld "
                          "(data.max_image_pixels)",
                          name, width, height, width * height, max_pixels);
    }
    return MMP_OK;
}

mmp_err mmp_image_decode_start(const char *name, const void *buf, size_t len,
                               int (*sniff)(const void *buf, size_t len), const char *format,
                               mmp_image *img)
{
    memset(img, 0, sizeof *img);
    if (len == 0) {
        return mmp_errorf(MMP_ERR_DATA, "%s: empty file (0 bytes)", name);
    }
    if (!sniff(buf, len)) {
        return mmp_errorf(MMP_ERR_DATA, "%s: not a %s", name, format);
    }
    return MMP_OK;
}

int mmp_image_too_large(const mmp_image *img)
{
    return !img->rgb && img->width > 0 && img->height > 0;
}

static mmp_err spng_error(const char *name, int rc)
{
    /* libspng reports running out of input as SPNG_IO_EOF; SPNG_EOF is an
     * IEND seen where more data was required. */
    if (rc == SPNG_IO_EOF || rc == SPNG_IO_ERROR || rc == SPNG_EOF) {
        return mmp_errorf(MMP_ERR_DATA, "%s: truncated PNG", name);
    }
    if (rc == SPNG_EWIDTH || rc == SPNG_EHEIGHT) {
        return mmp_errorf(MMP_ERR_DATA, "%s: zero-size or invalid image dimensions", name);
    }
    if (rc == SPNG_EUSER_WIDTH || rc == SPNG_EUSER_HEIGHT) {
        return mmp_errorf(MMP_ERR_DATA, "%s: image larger than %d pixels on a side", name,
                          MMP_PNG_MAX_SIDE);
    }
    if (rc == SPNG_EMEM) {
        return mmp_errorf(MMP_ERR_NOMEM, "%s: out of memory decoding PNG", name);
    }
    return mmp_errorf(MMP_ERR_DATA, "%s: corrupt PNG: %s", name, spng_strerror(rc));
}

static int png_sniff(const void *buf, size_t len)
{
    return len >= sizeof png_signature && memcmp(buf, png_signature, sizeof png_signature) == 0;
}

mmp_err mmp_png_decode(const char *name, const void *buf, size_t len, long long max_pixels,
                       mmp_image *img)
{
    mmp_err ret = MMP_OK;
    spng_ctx *ctx = NULL;
    MMP_TRY(mmp_image_decode_start(name, buf, len, png_sniff, "PNG", img));
    ctx = spng_ctx_new(0);
    if (!ctx) {
        return mmp_errorf(MMP_ERR_NOMEM, "%s: cannot create a PNG decoder", name);
    }
    int rc = spng_set_image_limits(ctx, MMP_PNG_MAX_SIDE, MMP_PNG_MAX_SIDE);
    if (rc == 0) {
        rc = spng_set_png_buffer(ctx, buf, len);
    }
    struct spng_ihdr ihdr;
    if (rc == 0) {
        rc = spng_get_ihdr(ctx, &ihdr);
    }
    size_t out_len = 0;
    if (rc == 0) {
        rc = spng_decoded_image_size(ctx, SPNG_FMT_RGB8, &out_len);
    }
    if (rc != 0) {
        ret = spng_error(name, (int)rc);
        goto fail;
    }
    ret = mmp_image_check_size(name, ihdr.width, ihdr.height, max_pixels, img);
    if (ret != MMP_OK) {
        goto exit; /* keeps the size check's img */
    }
    if (out_len != (size_t)ihdr.width * ihdr.height * 3) {
        ret = mmp_errorf(MMP_ERR_INTERNAL, "%s: libspng RGB8 size %zu for %ux%u", name, out_len,
                         ihdr.width, ihdr.height);
        goto fail;
    }
    img->rgb = malloc(out_len);
    if (!img->rgb) {
        ret = mmp_errorf(MMP_ERR_NOMEM, "%s: %zu bytes for pixels", name, out_len);
        goto fail;
    }
    rc = spng_decode_image(ctx, img->rgb, out_len, SPNG_FMT_RGB8, 0);
    if (rc != 0) {
        ret = spng_error(name, rc);
        goto fail;
    }
    img->width = (int)ihdr.width;
    img->height = (int)ihdr.height;
exit:
    spng_ctx_free(ctx);
    return ret;
fail:
    mmp_image_fini(img);
    goto exit;
}

mmp_err mmp_png_read(const char *path, mmp_image *img)
{
    unsigned char *buf = NULL;
    size_t len = 0;
    memset(img, 0, sizeof *img);
    MMP_TRY(mmp_fs_read_file(path, MMP_ERR_IO, SIZE_MAX, &buf, &len));
    mmp_err ret = mmp_png_decode(path, buf, len, 0, img);
    free(buf);
    return ret;
}

mmp_err mmp_png_encode(const uint8_t *rgb, int width, int height, void **out, size_t *len)
{
    mmp_err ret = MMP_OK;
    *out = NULL;
    *len = 0;
    if (width <= 0 || height <= 0 || width > MMP_PNG_MAX_SIDE || height > MMP_PNG_MAX_SIDE) {
        return mmp_errorf(MMP_ERR_INVALID, "PNG size %dx%d out of range [1, %d]", width, height,
                          MMP_PNG_MAX_SIDE);
    }
    spng_ctx *ctx = spng_ctx_new(SPNG_CTX_ENCODER);
    if (!ctx) {
        return mmp_errorf(MMP_ERR_NOMEM, "cannot create a PNG encoder");
    }
    struct spng_ihdr ihdr = {
        .width = (uint32_t)width,
        .height = (uint32_t)height,
        .bit_depth = 8,
        .color_type = SPNG_COLOR_TYPE_TRUECOLOR,
    };
    int rc = spng_set_option(ctx, SPNG_ENCODE_TO_BUFFER, 1);
    if (rc == 0) {
        /* No row filters: libspng's adaptive choice costs more than the
         * deflate itself and saves ~7% on the noisy images we write. */
        rc = spng_set_option(ctx, SPNG_FILTER_CHOICE, SPNG_FILTER_CHOICE_NONE);
    }
    if (rc == 0) {
        rc = spng_set_ihdr(ctx, &ihdr);
    }
    if (rc == 0) {
        size_t n = (size_t)width * (size_t)height * 3;
        rc = spng_encode_image(ctx, rgb, n, SPNG_FMT_PNG, SPNG_ENCODE_FINALIZE);
    }
    if (rc == 0) {
        *out = spng_get_png_buffer(ctx, len, &rc);
    }
    if (rc != 0 || !*out) {
        ret =
            mmp_errorf(MMP_ERR_INTERNAL, "PNG encode %dx%d: %s", width, height, spng_strerror(rc));
        free(*out);
        *out = NULL;
        *len = 0;
    }
    spng_ctx_free(ctx);
    return ret;
}

mmp_err mmp_png_write(const char *path, const uint8_t *rgb, int width, int height)
{
    void *buf = NULL;
    size_t len = 0;
    mmp_err ret = mmp_png_encode(rgb, width, height, &buf, &len);
    if (ret != MMP_OK) {
        return mmp_error_prefix(ret, "%s", path);
    }
    FILE *f = fopen(path, "wb");
    if (!f) {
        ret = mmp_errorf(MMP_ERR_IO, "%s: %s", path, strerror(errno));
        goto exit;
    }
    size_t wrote = fwrite(buf, 1, len, f);
    int closed = fclose(f);
    if (wrote != len || closed != 0) {
        ret = mmp_errorf(MMP_ERR_IO, "%s: write failed: %s", path, strerror(errno));
    }
exit:
    free(buf);
    return ret;
}
