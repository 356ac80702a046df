/* WebP files as 8-bit RGB pixels (libwebp): the first frame, as PIL gives it.
 *
 * The WebP part of data/image.h's decoding, beside data/png.h: same pixel
 * layout, same error style ("<name>: <reason>", MMP_ERR_DATA). PIL decodes
 * every WebP, still or animated, through libwebp's animation decoder in RGBA
 * and convert("RGB") drops the alpha; we do the same, so lossy, lossless,
 * with or without alpha, the RGB bytes are libwebp's (the colour of a fully
 * transparent pixel included, never composited). An animation gives its first
 * frame on the canvas; later frames are never decoded. */
#ifndef MMP_DATA_WEBP_H
#define MMP_DATA_WEBP_H

#include <stddef.h>

#include "common/err.h"
#include "data/png.h"

/* 1 when buf starts like a WebP ("RIFF", 4 bytes of size, "WEBP"), else 0. */
int mmp_webp_sniff(const void *buf, size_t len);

/* Decodes the first frame of the WebP in buf[0..len) into *img (the
 * caller's then; free with mmp_image_fini). name is used only in error
 * messages. Never prints; thread-safe. On failure *img is zeroed (but see
 * mmp_image_check_size for the pixel limit; max_pixels <= 0 = the default)
 * and MMP_ERR_DATA says "name: empty file (0 bytes)", "name: not a WebP",
 * "name: truncated WebP" or "name: bad WebP (libwebp status N)";
 * MMP_ERR_NOMEM when memory runs out. */
mmp_err mmp_webp_decode(const char *name, const void *buf, size_t len, long long max_pixels,
                        mmp_image *img);

#endif
