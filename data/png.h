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
 * corrupt header cannot ask for gigabytes. */
#define MMP_PNG_MAX_SIDE 16384

typedef struct mmp_image {
    int width, height;
    uint8_t *rgb; /* (height, width, 3), malloc'd, owned by the image */
} mmp_image;

/* Frees img's pixels and zeroes it. NULL-safe, idempotent. */
void mmp_image_fini(mmp_image *img);

/* Decodes the PNG in buf[0..len) into *img (which the caller then owns and
 * frees with mmp_image_fini). name is used only in error messages. On
 * failure *img is zeroed and MMP_ERR_DATA says "name: not a PNG", "name:
 * truncated PNG", "name: empty file (0 bytes)", or libspng's reason. */
mmp_err mmp_png_decode(const char *name, const void *buf, size_t len, mmp_image *img);

/* Reads and decodes the file at path (see mmp_png_decode); MMP_ERR_IO when it
 * cannot be opened or read. */
mmp_err mmp_png_read(const char *path, mmp_image *img);

/* Encodes rgb (height, width, 3) as an 8-bit truecolor PNG into a malloc'd
 * buffer *out of *len bytes (the caller frees it). Deterministic: the same
 * pixels always give the same bytes. */
mmp_err mmp_png_encode(const uint8_t *rgb, int width, int height, void **out, size_t *len);

/* Encodes rgb and writes it to path (created or truncated). */
mmp_err mmp_png_write(const char *path, const uint8_t *rgb, int width, int height);

#endif
