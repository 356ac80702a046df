/* JPEG, GIF and WebP files as 8-bit RGB pixels: the decoders data/image.h
 * picks from by sniffing, beside data/png.h. Every one keeps PNG's pixel
 * layout (row-major (H, W, 3) bytes in an mmp_image, freed with
 * mmp_image_fini) and error style ("<name>: <reason>", MMP_ERR_DATA; name is
 * used only in messages), starts with mmp_image_decode_start, checks the
 * declared size with mmp_image_check_size before any pixel allocation,
 * never prints and is thread-safe.
 *
 * JPEG (libjpeg-turbo). Baseline and progressive files decode with libjpeg's defaults (accurate
 * integer IDCT, fancy chroma upsampling), so the pixels equal those PIL gets from the same file.
 * Grayscale is replicated to RGB. CMYK and YCCK files decode as PIL's Image.open(p).convert("RGB"):
 * the stored values read as Adobe-inverted CMYK, then PIL's naive CMYK to RGB
 * (no colour profile, as PIL), equal to PIL's bytes on tests/image/formats/.
 *
 * GIF (giflib): what PIL's Image.open(p).convert("RGB") gives for a GIF is its
 * first frame on a canvas of the logical screen's size (grown when the
 * frame reaches past it); canvas pixels the frame does not cover hold the
 * frame's transparent index when it has one, else index 0; every index is
 * looked up in the frame's local colour table, else the global one (a GIF
 * with neither, or an index past the table, is grey: the index is the
 * level, as PIL's palettes start as a grey ramp); transparency itself is
 * dropped. Interlaced frames are put back in row order. Later frames are
 * never read (an animation costs what its first frame costs).
 *
 * WebP (libwebp): the first frame, as PIL gives it. PIL decodes every WebP, still or animated,
 * through libwebp's animation decoder in RGBA and convert("RGB") drops the alpha; we do the same,
 * so lossy, lossless, with or without alpha, the RGB bytes are libwebp's (the colour of a fully
 * transparent pixel included, never composited). An animation gives its first
 * frame on the canvas; later frames are never decoded. */
#ifndef MMP_DATA_CODECS_H
#define MMP_DATA_CODECS_H

#include <stddef.h>

#include "common/err.h"
#include "data/png.h"

/* ---- JPEG ---------------------------------------------------------------- */
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

/* ---- GIF ------------------------------------------------------------------ */
/* 1 when buf starts like a GIF ("GIF87a" or "GIF89a"), else 0. */
int mmp_gif_sniff(const void *buf, size_t len);

/* Decodes the first frame of the GIF in buf[0..len) into *img (the caller's
 * then; free with mmp_image_fini). name is used only in error messages.
 * Never prints; thread-safe. On failure *img is zeroed (but see
 * mmp_image_check_size for the pixel limit, max_pixels <= 0 = the default)
 * and MMP_ERR_DATA says "name: empty file (0 bytes)", "name: not a GIF",
 * "name: truncated GIF", "name: GIF has no image", or "name: bad GIF:
 * <giflib's reason>"; MMP_ERR_NOMEM when memory runs out. */
mmp_err mmp_gif_decode(const char *name, const void *buf, size_t len, long long max_pixels,
                       mmp_image *img);

/* ---- WebP ----------------------------------------------------------------- */
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
