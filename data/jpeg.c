/* JPEG decoding through libjpeg-turbo.
 *
 * libjpeg reports fatal errors by calling error_exit, which must not return:
 * ours longjmps back to mmp_jpeg_decode, which destroys the decoder and
 * returns MMP_ERR_DATA. Its default handlers print to stderr and exit(); none
 * of them may ever run here (library code never exits or prints). The memory
 * source turns running out of data into a fake EOI plus a "premature end of
 * JPEG file" warning and would hand back grey pixels for the missing part; we
 * make that warning fatal so a truncated file is an error, not a picture.
 * CMYK and YCCK files are converted to RGB as PIL does (cmyk_to_rgb). */
#include "data/codecs.h"

#include <setjmp.h>
#include <stdint.h>
#include <stdio.h> /* before jpeglib.h, which uses FILE */
#include <stdlib.h>
#include <string.h>

#include <jpeglib.h>
#include <jerror.h> /* the message codes: JWRN_JPEG_EOF, ... */

/* jpeg_mem_src takes the length as unsigned long. */
_Static_assert(sizeof(unsigned long) >= sizeof(size_t), "unsigned long narrower than size_t");

/* Libjpeg hands our callbacks &pub, so pub must be the first member. */
typedef struct decoder {
    struct jpeg_error_mgr pub;
    jmp_buf escape;
    const char *name;
    mmp_err err;      /* what mmp_jpeg_decode returns after the longjmp */
    uint8_t *scratch; /* CMYK rows; freed by mmp_jpeg_decode on every path */
} decoder;

static _Noreturn void bail(j_common_ptr cinfo, mmp_err err)
{
    decoder *d = (decoder *)cinfo->err;
    d->err = err;
    longjmp(d->escape, 1);
}

static _Noreturn void on_error(j_common_ptr cinfo)
{
    decoder *d = (decoder *)cinfo->err;
    if (cinfo->err->msg_code == JERR_OUT_OF_MEMORY) {
        bail(cinfo, mmp_errorf(MMP_ERR_NOMEM, "%s: out of memory decoding JPEG", d->name));
    }
    char reason[JMSG_LENGTH_MAX];
    cinfo->err->format_message(cinfo, reason);
    bail(cinfo, mmp_errorf(MMP_ERR_DATA, "%s: bad or unsupported JPEG: %s", d->name, reason));
}

/* level < 0 is a warning about the data; other levels are trace output. */
static void on_message(j_common_ptr cinfo, int level)
{
    decoder *d = (decoder *)cinfo->err;
    if (level >= 0) {
        return;
    }
    if (cinfo->err->msg_code == JWRN_JPEG_EOF) {
        bail(cinfo, mmp_errorf(MMP_ERR_DATA, "%s: truncated JPEG", d->name));
    }
    /* Recoverable corruption (extraneous bytes, a bad Huffman code) decodes
     * to slightly wrong pixels, as in PIL; count it and go on. */
    cinfo->err->num_warnings++;
}

static void on_output(j_common_ptr cinfo)
{
    (void)cinfo;
}

static void on_progress(j_common_ptr cinfo)
{
    decoder *d = (decoder *)cinfo->err;
    j_decompress_ptr dinfo = (j_decompress_ptr)cinfo;
    if (dinfo->input_scan_number > MMP_JPEG_MAX_SCANS) {
        bail(cinfo, mmp_errorf(MMP_ERR_DATA, "%s: progressive JPEG with more than %d scans",
                               d->name, MMP_JPEG_MAX_SCANS));
    }
}

int mmp_jpeg_sniff(const void *buf, size_t len)
{
    const unsigned char *b = buf;
    return len >= 3 && b[0] == 0xFF && b[1] == 0xD8 && b[2] == 0xFF;
}

/* PIL's CMYK to RGB (libImaging/Convert.c cmyk2rgb) on what libjpeg hands
 * out for a CMYK or YCCK file. PIL reads every CMYK JPEG as Adobe writes it,
 * inverted ("CMYK;I": the ink is 255 - the stored byte), then takes
 * r = nk - c * nk / 255 with nk = 255 - k and its rounded integer divide.
 * There is no colour profile in this (nor in PIL's convert): the colours are
 * the naive ones, but they are the ones a PIL pipeline trains on. */
static uint8_t muldiv255(int a, int b)
{
    int t = a * b + 128;
    return (uint8_t)(((t >> 8) + t) >> 8);
}

static void cmyk_to_rgb(const uint8_t *cmyk, int width, uint8_t *rgb)
{
    for (int x = 0; x < width; x++, cmyk += 4, rgb += 3) {
        int nk = cmyk[3]; /* 255 - k, with k = 255 - stored */
        for (int c = 0; c < 3; c++) {
            int v = nk - muldiv255(255 - cmyk[c], nk);
            rgb[c] = (uint8_t)(v < 0 ? 0 : v);
        }
    }
}

/* Everything that can longjmp happens in here, below mmp_jpeg_decode's
 * setjmp. Returns an error itself for what libjpeg accepts and we do not.
 * *cmyk_rows (the decoder's scratch) is freed by the caller: libjpeg may
 * longjmp past us while it is allocated. */
static mmp_err read_pixels(j_decompress_ptr cinfo, const char *name, long long max_pixels,
                           mmp_image *img, uint8_t **cmyk_rows)
{
    jpeg_read_header(cinfo, TRUE);
    MMP_TRY(mmp_image_check_size(name, cinfo->image_width, cinfo->image_height, max_pixels, img));
    int components = 3;
    switch (cinfo->jpeg_color_space) {
    case JCS_GRAYSCALE:
    case JCS_YCbCr:
    case JCS_RGB:
        cinfo->out_color_space = JCS_RGB; /* libjpeg-turbo replicates grayscale */
        break;
    case JCS_CMYK:
    case JCS_YCCK:
        cinfo->out_color_space = JCS_CMYK; /* libjpeg turns YCCK into CMYK */
        components = 4;
        break;
    default:
        return mmp_errorf(MMP_ERR_DATA, "%s: JPEG colour space %d (%d components) is not supported",
                          name, (int)cinfo->jpeg_color_space, cinfo->num_components);
    }
    jpeg_start_decompress(cinfo);
    if (cinfo->output_components != components || cinfo->output_width != cinfo->image_width ||
        cinfo->output_height != cinfo->image_height) {
        return mmp_errorf(MMP_ERR_INTERNAL, "%s: libjpeg gave %ux%ux%d for a %ux%u image", name,
                          cinfo->output_width, cinfo->output_height, cinfo->output_components,
                          cinfo->image_width, cinfo->image_height);
    }
    size_t stride = (size_t)cinfo->output_width * 3;
    img->rgb = malloc(stride * cinfo->output_height);
    if (components == 4) {
        *cmyk_rows = malloc((size_t)cinfo->output_width * 4 * 16);
    }
    if (!img->rgb || (components == 4 && !*cmyk_rows)) {
        return mmp_errorf(MMP_ERR_NOMEM, "%s: %zu bytes for pixels", name,
                          stride * cinfo->output_height);
    }
    while (cinfo->output_scanline < cinfo->output_height) {
        JSAMPROW rows[16];
        unsigned first = cinfo->output_scanline;
        unsigned n = cinfo->output_height - first;
        n = n < 16 ? n : 16;
        for (unsigned i = 0; i < n; i++) {
            rows[i] = components == 4 ? *cmyk_rows + (size_t)i * cinfo->output_width * 4
                                      : img->rgb + (size_t)(first + i) * stride;
        }
        /* The memory source never suspends, so no progress means no data. */
        unsigned got = jpeg_read_scanlines(cinfo, rows, n);
        if (got == 0) {
            return mmp_errorf(MMP_ERR_DATA, "%s: truncated JPEG", name);
        }
        for (unsigned i = 0; components == 4 && i < got; i++) {
            cmyk_to_rgb(rows[i], (int)cinfo->output_width, img->rgb + (size_t)(first + i) * stride);
        }
    }
    jpeg_finish_decompress(cinfo);
    img->width = (int)cinfo->output_width;
    img->height = (int)cinfo->output_height;
    return MMP_OK;
}

mmp_err mmp_jpeg_decode(const char *name, const void *buf, size_t len, long long max_pixels,
                        mmp_image *img)
{
    MMP_TRY(mmp_image_decode_start(name, buf, len, mmp_jpeg_sniff, "JPEG", img));
    struct jpeg_decompress_struct cinfo;
    struct jpeg_progress_mgr progress = {.progress_monitor = on_progress};
    decoder d = {.name = name, .err = MMP_OK};
    memset(&cinfo, 0, sizeof cinfo);
    cinfo.err = jpeg_std_error(&d.pub);
    d.pub.error_exit = on_error;
    d.pub.emit_message = on_message;
    d.pub.output_message = on_output;
    /* cinfo, d and img live in memory that libjpeg and we reach through
     * pointers, so they are valid after the longjmp. */
    if (setjmp(d.escape)) {
        jpeg_destroy_decompress(&cinfo);
        free(d.scratch);
        mmp_image_fini(img);
        return d.err;
    }
    jpeg_create_decompress(&cinfo);
    cinfo.progress = &progress;
    jpeg_mem_src(&cinfo, buf, (unsigned long)len);
    mmp_err ret = read_pixels(&cinfo, name, max_pixels, img, &d.scratch);
    jpeg_destroy_decompress(&cinfo);
    free(d.scratch);
    if (ret != MMP_OK && !mmp_image_too_large(img)) {
        mmp_image_fini(img);
    }
    return ret;
}
