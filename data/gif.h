/* GIF files as 8-bit RGB pixels (giflib): the first frame, as PIL gives it.
 *
 * The GIF half of data/image.h's decoding, beside data/png.h and
 * data/jpeg.h: same pixel layout, same error style ("<name>: <reason>",
 * MMP_ERR_DATA). What PIL's Image.open(p).convert("RGB") gives for a GIF is
 * its first frame on a canvas of the logical screen's size (grown when the
 * frame reaches past it); canvas pixels the frame does not cover hold the
 * frame's transparent index when it has one, else index 0; every index is
 * looked up in the frame's local colour table, else the global one (a GIF
 * with neither is grey: the index is the level); transparency itself is
 * dropped. Interlaced frames are put back in row order. Later frames are
 * never read (an animation costs what its first frame costs). */
#ifndef MMP_DATA_GIF_H
#define MMP_DATA_GIF_H

#include <stddef.h>

#include "common/err.h"
#include "data/png.h"

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

#endif
