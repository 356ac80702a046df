/* JPEG decoding through libjpeg-turbo.
 *
 * libjpeg reports fatal errors by calling error_exit, which must not return:
 * ours longjmps back to mmp_jpeg_decode, which destroys the decoder and
 * returns MMP_ERR_DATA. Its default handlers print to stderr and exit(); none
 * of them may ever run here (library code never exits or prints). The memory
 * source turns running out of data into a fake EOI plus a "premature end of
 * JPEG file" warning and would hand back grey pixels for the missing part; we
 * make that warning fatal so a truncated file is an error, not a picture. */
#include "data/jpeg.h"

#include <setjmp.h>
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
    mmp_err err; /* what mmp_jpeg_decode returns after the longjmp */
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

/* Everything that can longjmp happens in here, below mmp_jpeg_decode's
 * setjmp. Returns an error itself for what libjpeg accepts and we do not. */
static mmp_err read_pixels(j_decompress_ptr cinfo, const char *name, mmp_image *img)
{
    jpeg_read_header(cinfo, TRUE);
    if (cinfo->image_width > MMP_PNG_MAX_SIDE || cinfo->image_height > MMP_PNG_MAX_SIDE) {
        return mmp_errorf(MMP_ERR_DATA, "%s: image larger than %d pixels on a side (%ux%u)", name,
                          MMP_PNG_MAX_SIDE, cinfo->image_width, cinfo->image_height);
    }
    switch (cinfo->jpeg_color_space) {
    case JCS_GRAYSCALE:
    case JCS_YCbCr:
    case JCS_RGB:
        break;
    case JCS_CMYK:
    case JCS_YCCK:
        return mmp_errorf(MMP_ERR_DATA, "%s: CMYK JPEG is not supported", name);
    default:
        return mmp_errorf(MMP_ERR_DATA, "%s: JPEG colour space %d (%d components) is not supported",
                          name, (int)cinfo->jpeg_color_space, cinfo->num_components);
    }
    cinfo->out_color_space = JCS_RGB; /* libjpeg-turbo replicates grayscale */
    jpeg_start_decompress(cinfo);
    if (cinfo->output_components != 3 || cinfo->output_width != cinfo->image_width ||
        cinfo->output_height != cinfo->image_height) {
        return mmp_errorf(MMP_ERR_INTERNAL, "%s: libjpeg gave %ux%ux%d for a %ux%u RGB image", name,
                          cinfo->output_width, cinfo->output_height, cinfo->output_components,
                          cinfo->image_width, cinfo->image_height);
    }
    size_t stride = (size_t)cinfo->output_width * 3;
    img->rgb = malloc(stride * cinfo->output_height);
    if (!img->rgb) {
        return mmp_errorf(MMP_ERR_NOMEM, "%s: %zu bytes for pixels", name,
                          stride * cinfo->output_height);
    }
    while (cinfo->output_scanline < cinfo->output_height) {
        JSAMPROW rows[16];
        unsigned n = cinfo->output_height - cinfo->output_scanline;
        n = n < 16 ? n : 16;
        for (unsigned i = 0; i < n; i++) {
            rows[i] = img->rgb + (size_t)(cinfo->output_scanline + i) * stride;
        }
        /* The memory source never suspends, so no progress means no data. */
        if (jpeg_read_scanlines(cinfo, rows, n) == 0) {
            return mmp_errorf(MMP_ERR_DATA, "%s: truncated JPEG", name);
        }
    }
    jpeg_finish_decompress(cinfo);
    img->width = (int)cinfo->output_width;
    img->height = (int)cinfo->output_height;
    return MMP_OK;
}

mmp_err mmp_jpeg_decode(const char *name, const void *buf, size_t len, mmp_image *img)
{
    memset(img, 0, sizeof *img);
    if (len == 0) {
        return mmp_errorf(MMP_ERR_DATA, "%s: empty file (0 bytes)", name);
    }
    if (!mmp_jpeg_sniff(buf, len)) {
        return mmp_errorf(MMP_ERR_DATA, "%s: not a JPEG", name);
    }
    struct jpeg_decompress_struct cinfo;
    struct jpeg_progress_mgr progress = {.progress_monitor = on_progress};
    decoder d = {.name = name, .err = MMP_OK};
    memset(&cinfo, 0, sizeof cinfo);
    cinfo.err = jpeg_std_error(&d.pub);
    d.pub.error_exit = on_error;
    d.pub.emit_message = on_message;
    d.pub.output_message = on_output;
    /* cinfo and img live in memory that libjpeg and we reach through
     * pointers, so they are valid after the longjmp. */
    if (setjmp(d.escape)) {
        jpeg_destroy_decompress(&cinfo);
        mmp_image_fini(img);
        return d.err;
    }
    jpeg_create_decompress(&cinfo);
    cinfo.progress = &progress;
    jpeg_mem_src(&cinfo, buf, (unsigned long)len);
    mmp_err ret = read_pixels(&cinfo, name, img);
    jpeg_destroy_decompress(&cinfo);
    if (ret != MMP_OK) {
        mmp_image_fini(img);
    }
    return ret;
}
