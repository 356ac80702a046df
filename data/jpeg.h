/* JPEG files as 8-bit RGB pixels (libjpeg-turbo).
 *
 * The JPEG half of data/image.h's decoding, beside data/png.h: same pixel
 * layout (row-major (H, W, 3) bytes in an mmp_image), same error style
 * ("<name>: <reason>", MMP_ERR_DATA). Baseline and progressive files decode
 * with libjpeg's defaults (accurate integer IDCT, fancy chroma upsampling), so
 * the pixels equal those PIL gets from the same file. Grayscale is replicated
 * to RGB. CMYK and YCCK files decode as PIL's Image.open(p).convert("RGB"):
 * the stored values read as Adobe-inverted CMYK, then PIL's naive CMYK to RGB
 * (no colour profile, as PIL), equal to PIL's bytes on tests/image/formats/. */
#ifndef MMP_DATA_JPEG_H
#define MMP_DATA_JPEG_H

#include <stddef.h>

#include "common/err.h"
#include "data/png.h"

/* Progressive files with more scans than this are refused: each scan costs a
 * pass over the whole coefficient buffer, so a crafted file with thousands of
 * tiny scans would stall a loader thread (libjpeg-turbo's own advice). */
#define MMP_JPEG_MAX_SCANS 500

/* 1 when buf starts like a JPEG (SOI then a marker: FF D8 FF), else 0. */
int mmp_jpeg_sniff(const void *buf, size_t len);

/* Decodes the JPEG in buf[0..len) into *img (which the caller then owns and
 * frees with mmp_image_fini). name is used only in error messages. Never
 * prints. On failure *img is zeroed and MMP_ERR_DATA says "name: empty file
 * (0 bytes)", "name: not a JPEG", "name: truncated JPEG" (the data ends
 * before the EOI marker), mmp_image_check_size's errors (side and
 * max_pixels limits, checked before any pixel allocation), or "name: bad or
 * unsupported JPEG: <libjpeg's reason>". MMP_ERR_NOMEM when the pixels
 * cannot be allocated. Thread-safe. */
mmp_err mmp_jpeg_decode(const char *name, const void *buf, size_t len, long long max_pixels,
                        mmp_image *img);

#endif
