/* PNG files as 8-bit RGB pixels (libspng).
 *
 * Every image mmpipe reads or writes goes through here, so decode errors all
 * read "<path>: <reason>" with MMP_ERR_DATA. Pixels are row-major (H, W, 3)
 * bytes. Reading converts any PNG colour type and bit depth to RGB8 (gray is
 * replicated, palettes expanded, 16-bit scaled, alpha dropped without
 * compositing). Resizing and normalisation belong to the dataset, not here. */
#ifndef MMP_DATA_PNG_H
#define MMP_DATA_PNG_H

#include <stddef.h>
#include <stdint.h>

#include "common/err.h"

/* Images wider or taller than this are refused before any allocation, so a
 * corrupt header cannot ask for gigabytes (every decoder, every format). */
#define MMP_PNG_MAX_SIDE 16384

/* The default pixel limit (data.max_image_pixels): PIL's
 * Image.MAX_IMAGE_PIXELS, 1 GiB / 4 / 3 pixels. PIL warns above it (and
 * refuses above twice it); mmpipe refuses, before allocating the pixels. */
#define MMP_IMAGE_MAX_PIXELS 89478485LL

typedef struct mmp_image {
    int width, height;
    uint8_t *rgb; /* (height, width, 3), malloc'd, owned by the image */
} mmp_image;

/* Frees img's pixels and zeroes it. NULL-safe, idempotent. */
void mmp_image_fini(mmp_image *img);

/* The size check every decoder makes on the declared width x height before
 * it allocates pixels. max_pixels <= 0 means MMP_IMAGE_MAX_PIXELS. Returns
 * MMP_ERR_DATA with "name: zero-size image", "name: image larger than 16384
 * pixels on a side (WxH)", or "name: WxH image has N pixels, more than the
 * limit of M (data.max_image_pixels)". Only in that last case it sets
 * img->width and img->height to the declared size (img->rgb stays NULL), so
 * a caller can tell "too large" from "broken" (mmp_image_too_large); every
 * other failure leaves img zeroed. */
mmp_err mmp_image_check_size(const char *name, long long width, long long height,
                             long long max_pixels, mmp_image *img);

/* The start every decoder makes: zeroes *img, then refuses an empty buffer
 * ("name: empty file (0 bytes)") and one sniff does not recognise ("name: not
 * a <format>"), both MMP_ERR_DATA. */
mmp_err mmp_image_decode_start(const char *name, const void *buf, size_t len,
                               int (*sniff)(const void *buf, size_t len), const char *format,
                               mmp_image *img);

/* 1 when a decode that failed did so on the pixel limit (img->rgb NULL and
 * a size set), else 0. */
int mmp_image_too_large(const mmp_image *img);

/* Decodes the PNG in buf[0..len) into *img (which the caller then owns and
 * frees with mmp_image_fini). name is used only in error messages. On
 * failure *img is zeroed (but see mmp_image_check_size, whose errors apply
 * with max_pixels) and MMP_ERR_DATA says "name: not a PNG", "name:
 * truncated PNG", "name: empty file (0 bytes)", or libspng's reason.
 * Conversions are PIL's Image.convert("RGB") ones: 16-bit samples keep their
 * high byte, alpha (and a palette's tRNS) is dropped, low bit depths are
 * scaled to 0..255; one exception, 16-bit gray keeps its high byte where PIL
 * clips the 16-bit value to 255 (tests/image/make_refs.py). */
mmp_err mmp_png_decode(const char *name, const void *buf, size_t len, long long max_pixels,
                       mmp_image *img);

/* Reads and decodes the file at path (see mmp_png_decode, with the default
 * pixel limit); MMP_ERR_IO when it cannot be opened or read. */
mmp_err mmp_png_read(const char *path, mmp_image *img);

/* Encodes rgb (height, width, 3) as an 8-bit truecolor PNG into a malloc'd
 * buffer *out of *len bytes (the caller frees it). Deterministic: the same
 * pixels always give the same bytes. */
mmp_err mmp_png_encode(const uint8_t *rgb, int width, int height, void **out, size_t *len);

/* Encodes rgb and writes it to path (created or truncated). */
mmp_err mmp_png_write(const char *path, const uint8_t *rgb, int width, int height);

#endif
