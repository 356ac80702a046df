/* GIF decoding through giflib's low-level reader (data/codecs.h).
 *
 * DGifSlurp would decode every frame of an animation; we walk records up to
 * the first image descriptor, keep the graphics control block that precedes
 * it (its transparent index), and read that one frame's lines. Input comes
 * from memory through DGifOpen's read callback, so a short file reads as
 * "truncated", never past the buffer. Must never print or exit. */
#include "data/codecs.h"

#include <gif_lib.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef struct source {
    const uint8_t *p;
    size_t left;
} source;

static int read_mem(GifFileType *gif, GifByteType *out, int n)
{
    source *s = gif->UserData;
    size_t k = n < 0 ? 0 : (size_t)n;
    k = k < s->left ? k : s->left;
    memcpy(out, s->p, k);
    s->p += k;
    s->left -= k;
    return (int)k;
}

int mmp_gif_sniff(const void *buf, size_t len)
{
    return len >= 6 && (memcmp(buf, "GIF87a", 6) == 0 || memcmp(buf, "GIF89a", 6) == 0);
}

static mmp_err gif_error(const char *name, int code)
{
    if (code == D_GIF_ERR_READ_FAILED || code == D_GIF_ERR_EOF_TOO_SOON) {
        return mmp_errorf(MMP_ERR_DATA, "%s: truncated GIF", name);
    }
    if (code == D_GIF_ERR_NOT_ENOUGH_MEM) {
        return mmp_errorf(MMP_ERR_NOMEM, "%s: out of memory decoding GIF", name);
    }
    const char *why = GifErrorString(code);
    return mmp_errorf(MMP_ERR_DATA, "%s: bad GIF: %s", name, why ? why : "unknown error");
}

/* Skips records up to the first image descriptor (read, in gif->Image);
 * *transparent is the index its graphics control block names, or -1. */
static mmp_err find_first_frame(GifFileType *gif, const char *name, int *transparent)
{
    *transparent = -1;
    for (;;) {
        GifRecordType type;
        if (DGifGetRecordType(gif, &type) == GIF_ERROR) {
            return gif_error(name, gif->Error);
        }
        if (type == IMAGE_DESC_RECORD_TYPE) {
            if (DGifGetImageDesc(gif) == GIF_ERROR) {
                return gif_error(name, gif->Error);
            }
            return MMP_OK;
        }
        if (type == TERMINATE_RECORD_TYPE) {
            return mmp_errorf(MMP_ERR_DATA, "%s: GIF has no image", name);
        }
        if (type != EXTENSION_RECORD_TYPE) {
            return mmp_errorf(MMP_ERR_DATA, "%s: bad GIF: record type %d", name, (int)type);
        }
        int code;
        GifByteType *ext;
        if (DGifGetExtension(gif, &code, &ext) == GIF_ERROR) {
            return gif_error(name, gif->Error);
        }
        if (code == GRAPHICS_EXT_FUNC_CODE && ext) {
            GraphicsControlBlock gcb;
            if (DGifExtensionToGCB(ext[0], ext + 1, &gcb) == GIF_OK) {
                *transparent = gcb.TransparentColor; /* NO_TRANSPARENT_COLOR is -1 */
            }
        }
        while (ext) {
            if (DGifGetExtensionNext(gif, &ext) == GIF_ERROR) {
                return gif_error(name, gif->Error);
            }
        }
    }
}

/* Reads the frame's rows into the index canvas (cw wide) at its offset. */
static mmp_err read_frame(GifFileType *gif, const char *name, uint8_t *canvas, int cw)
{
    static const int start[4] = {0, 4, 2, 1}, step[4] = {8, 8, 4, 2};
    const GifImageDesc *d = &gif->Image;
    int passes = d->Interlace ? 4 : 1;
    for (int pass = 0; pass < passes; pass++) {
        int y0 = d->Interlace ? start[pass] : 0, dy = d->Interlace ? step[pass] : 1;
        for (int y = y0; y < d->Height; y += dy) {
            uint8_t *row = canvas + (size_t)(d->Top + y) * (size_t)cw + (size_t)d->Left;
            if (DGifGetLine(gif, row, d->Width) == GIF_ERROR) {
                return gif_error(name, gif->Error);
            }
        }
    }
    return MMP_OK;
}

mmp_err mmp_gif_decode(const char *name, const void *buf, size_t len, long long max_pixels,
                       mmp_image *img)
{
    mmp_err ret = MMP_OK;
    uint8_t *canvas = NULL;
    GifFileType *gif = NULL;
    MMP_TRY(mmp_image_decode_start(name, buf, len, mmp_gif_sniff, "GIF", img));
    source src = {.p = buf, .left = len};
    int code = 0;
    gif = DGifOpen(&src, read_mem, &code);
    if (!gif) {
        return gif_error(name, code);
    }
    int transparent;
    MMP_TRY_GOTO(find_first_frame(gif, name, &transparent), ret, fail);
    const GifImageDesc *d = &gif->Image;
    if (d->Width <= 0 || d->Height <= 0 || d->Left < 0 || d->Top < 0) {
        ret = mmp_errorf(MMP_ERR_DATA, "%s: bad GIF: frame %dx%d at (%d, %d)", name, d->Width,
                         d->Height, d->Left, d->Top);
        goto fail;
    }
    /* PIL grows the canvas to hold a frame that reaches past the screen. */
    long long w = (long long)d->Left + d->Width, h = (long long)d->Top + d->Height;
    w = w > gif->SWidth ? w : gif->SWidth;
    h = h > gif->SHeight ? h : gif->SHeight;
    ret = mmp_image_check_size(name, w, h, max_pixels, img);
    if (ret != MMP_OK) {
        goto exit; /* keeps the size check's img */
    }
    size_t n = (size_t)w * (size_t)h;
    canvas = malloc(n);
    img->rgb = malloc(n * 3);
    if (!canvas || !img->rgb) {
        ret = mmp_errorf(MMP_ERR_NOMEM, "%s: %zu bytes for pixels", name, n * 4);
        goto fail;
    }
    memset(canvas, transparent >= 0 ? transparent : 0, n);
    MMP_TRY_GOTO(read_frame(gif, name, canvas, (int)w), ret, fail);
    const ColorMapObject *map = d->ColorMap ? d->ColorMap : gif->SColorMap;
    for (size_t i = 0; i < n; i++) {
        uint8_t k = canvas[i], *px = img->rgb + 3 * i;
        if (map && k < map->ColorCount) {
            px[0] = map->Colors[k].Red;
            px[1] = map->Colors[k].Green;
            px[2] = map->Colors[k].Blue;
        } else {
            /* no table, or an index past it: grey at the index's level, as
             * PIL (its palettes start as a grey ramp) */
            px[0] = px[1] = px[2] = k;
        }
    }
    img->width = (int)w;
    img->height = (int)h;
exit:
    free(canvas);
    DGifCloseFile(gif, &code);
    return ret;
fail:
    mmp_image_fini(img);
    goto exit;
}
