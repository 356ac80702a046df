/* Image formats decoded as PIL's Image.open(p).convert("RGB") does: CMYK and
 * YCCK JPEG, GIF (first frame), WebP (lossy, lossless, alpha, animated),
 * palette / alpha / 16-bit / low-depth PNG.
 *
 * tests/image/formats/formats.ref holds PIL's RGB bytes of every file beside
 * it (tests/image/make_refs.py made both, with the Pillow, libjpeg-turbo and
 * libwebp named in its header); each case states its tolerance in 8-bit
 * levels (0 for lossless formats and CMYK arithmetic, 1 for lossy decoders
 * of another build). Also: the pixel limit refuses every format before
 * decoding, naming the file and data.max_image_pixels; cut files are errors,
 * not pictures. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "data/codecs.h"
#include "data/image.h"
#include "data/png.h"
#include "tests/harness.h"

#define DIR "tests/image/formats/"
#define REGEN "regenerate with: /usr/bin/python3 tests/image/make_refs.py"
#define REF_VERSION 1
#define MAX_CASES 64

typedef struct ref_case {
    char file[128], mode[16];
    int width, height, tolerance;
    size_t offset; /* of its H * W * 3 bytes in the data */
} ref_case;

typedef struct refs {
    unsigned char *buf;
    size_t len;
    const unsigned char *data;
    ref_case cases[MAX_CASES];
    int n;
} refs;

/* Parses formats.ref; 0 (with the reason printed) when it is not usable. */
static int load_refs(refs *r)
{
    memset(r, 0, sizeof *r);
    r->buf = mmp_test_slurp(DIR "formats.ref", &r->len);
    if (!r->buf) {
        fprintf(stderr, "  cannot read " DIR "formats.ref; " REGEN "\n");
        return 0;
    }
    const char *end = NULL;
    for (size_t i = 0; i + 6 <= r->len; i++) {
        if (memcmp(r->buf + i, "\ndata\n", 6) == 0) {
            end = (const char *)r->buf + i + 1;
            break;
        }
    }
    int version = 0;
    if (!end || sscanf((const char *)r->buf, "MMPFMTREF %d", &version) != 1 ||
        version != REF_VERSION) {
        fprintf(stderr, "  " DIR "formats.ref: bad magic or version %d (want %d); " REGEN "\n",
                version, REF_VERSION);
        return 0;
    }
    size_t hlen = (size_t)(end - (const char *)r->buf);
    char *header = malloc(hlen + 1);
    if (!header) {
        return 0;
    }
    memcpy(header, r->buf, hlen);
    header[hlen] = 0;
    size_t bytes = 0;
    int ok = 1;
    for (char *save = NULL, *line = strtok_r(header, "\n", &save); line;
         line = strtok_r(NULL, "\n", &save)) {
        if (strncmp(line, "case ", 5) != 0) {
            continue;
        }
        ref_case *c = &r->cases[r->n];
        if (r->n == MAX_CASES || sscanf(line, "case %127s %d %d %d %15s", c->file, &c->width,
                                        &c->height, &c->tolerance, c->mode) != 5) {
            fprintf(stderr, "  bad reference line: %s; " REGEN "\n", line);
            ok = 0;
            break;
        }
        c->offset = bytes;
        bytes += (size_t)c->width * c->height * 3;
        r->n++;
    }
    free(header);
    r->data = (const unsigned char *)end + 5;
    if (ok && (size_t)(r->data - r->buf) + bytes != r->len) {
        fprintf(stderr, "  " DIR "formats.ref: %zu data bytes, header says %zu; " REGEN "\n",
                r->len - (size_t)(r->data - r->buf), bytes);
        ok = 0;
    }
    return ok && r->n > 0;
}

static int ends_with(const char *s, const char *suffix)
{
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && strcmp(s + n - k, suffix) == 0;
}

/* Every file decodes to PIL's bytes within its tolerance. Prints each
 * case's max difference and the max per format (the figures the README
 * quotes). */
static void test_parity(void)
{
    refs r;
    int ok = load_refs(&r);
    CHECK(ok);
    if (!ok) {
        free(r.buf);
        return;
    }
    const char *formats[] = {".jpg", ".gif", ".webp", ".png"};
    int worst[4] = {0};
    int seen[4] = {0};
    for (int i = 0; i < r.n; i++) {
        const ref_case *c = &r.cases[i];
        char path[256];
        snprintf(path, sizeof path, DIR "%s", c->file);
        mmp_image img = {0};
        mmp_err e = mmp_image_read(path, 0, &img);
        CHECK(e == MMP_OK);
        if (e != MMP_OK) {
            fprintf(stderr, "  %s: %s\n", c->file, mmp_last_error());
            continue;
        }
        CHECK(img.width == c->width && img.height == c->height);
        if (img.width != c->width || img.height != c->height) {
            fprintf(stderr, "  %s: %dx%d, PIL %dx%d\n", c->file, img.width, img.height, c->width,
                    c->height);
            mmp_image_fini(&img);
            continue;
        }
        const unsigned char *want = r.data + c->offset;
        size_t n = (size_t)c->width * c->height * 3, over = 0, first = n;
        int max = 0;
        for (size_t k = 0; k < n; k++) {
            int d = abs((int)img.rgb[k] - (int)want[k]);
            max = d > max ? d : max;
            if (d > c->tolerance && over++ == 0) {
                first = k;
            }
        }
        CHECK(over == 0);
        if (over) {
            size_t px = first / 3;
            fprintf(stderr,
                    "  %s (PIL mode %s): %zu of %zu values off by more than %d, max %d; first at "
                    "x=%zu y=%zu channel %zu: got %d, PIL %d\n",
                    c->file, c->mode, over, n, c->tolerance, max, px % (size_t)c->width,
                    px / (size_t)c->width, first % 3, img.rgb[first], want[first]);
        }
        printf("  %-32s %-5s %3dx%-3d max diff %d (tolerance %d)\n", c->file, c->mode, c->width,
               c->height, max, c->tolerance);
        for (int f = 0; f < 4; f++) {
            if (ends_with(c->file, formats[f])) {
                worst[f] = max > worst[f] ? max : worst[f];
                seen[f]++;
            }
        }
        mmp_image_fini(&img);
    }
    for (int f = 0; f < 4; f++) {
        CHECK(seen[f] >= 2); /* every format is covered */
        printf("  %-5s %d files, max diff vs PIL %d levels\n", formats[f] + 1, seen[f], worst[f]);
    }
    free(r.buf);
}

/* One pixel over the limit is refused before decoding, in every format,
 * naming the file and the key; exactly at the limit decodes. */
static void test_pixel_limit(void)
{
    const char *files[] = {"cmyk_40x30.jpg",   "rgb_33x21.jpg",    "palette_32x24.gif",
                           "offset_20x16.gif", "lossy_34x26.webp", "anim_20x14.webp",
                           "rgb16_19x13.png"};
    for (size_t i = 0; i < sizeof files / sizeof *files; i++) {
        char path[256];
        snprintf(path, sizeof path, DIR "%s", files[i]);
        mmp_image img = {0};
        CHECK_OK(mmp_image_read(path, 0, &img));
        long long pixels = (long long)img.width * img.height;
        int w = img.width, h = img.height;
        mmp_image_fini(&img);
        CHECK(mmp_image_read(path, pixels - 1, &img) == MMP_ERR_DATA);
        const char *msg = mmp_last_error();
        int named = strstr(msg, path) == msg && strstr(msg, "data.max_image_pixels") &&
                    strstr(msg, "more than the limit");
        CHECK(named);
        CHECK(mmp_image_too_large(&img) && img.width == w && img.height == h);
        if (!named) {
            fprintf(stderr, "  %s: \"%s\"\n", files[i], msg);
        }
        mmp_image_fini(&img);
        CHECK_OK(mmp_image_read(path, pixels, &img));
        CHECK(!mmp_image_too_large(&img));
        mmp_image_fini(&img);
        /* A broken file is not "too large". */
        CHECK(mmp_image_read(DIR "missing.gif", 1, &img) == MMP_ERR_DATA);
        CHECK(!mmp_image_too_large(&img));
    }
    /* The loader path: mmp_image_load honours prep.max_pixels. */
    mmp_image_prep prep = {.size = 8, .mean = {0, 0, 0}, .std = {1, 1, 1}, .max_pixels = 100};
    float out[3 * 8 * 8];
    CHECK(mmp_image_load(DIR "lossy_34x26.webp", &prep, NULL, out) == MMP_ERR_DATA);
    CHECK(strstr(mmp_last_error(), "884 pixels, more than the limit of 100") != NULL);
    prep.max_pixels = 0;
    CHECK_OK(mmp_image_load(DIR "lossy_34x26.webp", &prep, NULL, out));
}

typedef mmp_err (*decode_fn)(const char *, const void *, size_t, long long, mmp_image *);

/* Every prefix of a file is an error (never a picture, never a crash). The
 * files have one frame: a GIF cut after its first frame is a picture, as in
 * PIL. */
static void cut_everywhere(const char *file, decode_fn decode, const char *want)
{
    char path[256];
    snprintf(path, sizeof path, DIR "%s", file);
    size_t len = 0;
    unsigned char *buf = mmp_test_slurp(path, &len);
    CHECK(buf != NULL);
    if (!buf) {
        return;
    }
    int bad = 0, named = 0;
    for (size_t cut = 0; cut < len; cut += 1 + cut / 16) {
        mmp_image img = {.width = 3};
        mmp_err e = decode(file, buf, cut, 0, &img);
        if (e != MMP_ERR_DATA || img.rgb != NULL) {
            if (bad++ == 0) {
                fprintf(stderr, "  %s cut at %zu of %zu: %s %s\n", file, cut, len, mmp_err_name(e),
                        e == MMP_OK ? "(decoded)" : mmp_last_error());
            }
        }
        named += e == MMP_ERR_DATA && strstr(mmp_last_error(), want) != NULL;
        mmp_image_fini(&img);
    }
    CHECK(bad == 0);
    CHECK(named > 0);
    mmp_image img = {0};
    CHECK_OK(decode(file, buf, len, 0, &img));
    mmp_image_fini(&img);
    free(buf);
}

static void test_cut_files(void)
{
    cut_everywhere("palette_32x24.gif", mmp_gif_decode, "truncated GIF");
    cut_everywhere("local_palette_12x9.gif", mmp_gif_decode, "truncated GIF");
    cut_everywhere("lossy_34x26.webp", mmp_webp_decode, "truncated");
    cut_everywhere("anim_20x14.webp", mmp_webp_decode, "truncated");
    cut_everywhere("ycck_37x29.jpg", mmp_jpeg_decode, "truncated JPEG");
}

/* Sniffing goes by content: a WebP named .png decodes; other formats'
 * decoders refuse it by name. */
static void test_sniff(void)
{
    size_t len = 0;
    unsigned char *webp = mmp_test_slurp(DIR "lossy_34x26.webp", &len);
    CHECK(webp && mmp_webp_sniff(webp, len) && !mmp_gif_sniff(webp, len) &&
          !mmp_jpeg_sniff(webp, len));
    mmp_image img = {0};
    CHECK(mmp_gif_decode("x.gif", webp, len, 0, &img) == MMP_ERR_DATA);
    CHECK(strstr(mmp_last_error(), "x.gif: not a GIF") != NULL);
    CHECK(mmp_webp_decode("y.webp", "GIF89a", 6, 0, &img) == MMP_ERR_DATA);
    CHECK(strstr(mmp_last_error(), "y.webp: not a WebP") != NULL);
    const char *tmp = mmp_test_tmpdir("formats_sniff");
    char path[1100];
    snprintf(path, sizeof path, "%s/photo.png", tmp);
    FILE *f = fopen(path, "wb");
    CHECK(f && fwrite(webp, 1, len, f) == len);
    if (f) {
        fclose(f);
    }
    CHECK_OK(mmp_image_read(path, 0, &img));
    CHECK(img.width == 34 && img.height == 26);
    mmp_image_fini(&img);
    free(webp);
}

/* A GIF index past its colour table reads as PIL gives it: grey at the
 * index's level (Pillow's palettes start as a grey ramp). A 2x2 frame with a
 * local table of 2 entries (over a global one of 4) and indices 0..3; the
 * pixels are PIL 9.4's Image.open(p).convert("RGB"). Found while seeding
 * fuzz_gif (tests/fuzz/corpus/gif/grows_transparent.gif). */
static void test_gif_short_table(void)
{
    static const unsigned char gif[] = {0x47, 0x49, 0x46, 0x38, 0x39, 0x61, 0x02, 0x00, 0x02, 0x00,
                                        0x81, 0x00, 0x00, 0x09, 0x09, 0x09, 0x08, 0x08, 0x08, 0x07,
                                        0x07, 0x07, 0x06, 0x06, 0x06, 0x2c, 0x00, 0x00, 0x00, 0x00,
                                        0x02, 0x00, 0x02, 0x00, 0x80, 0x0a, 0x14, 0x1e, 0x28, 0x32,
                                        0x3c, 0x02, 0x04, 0x04, 0x43, 0x71, 0x05, 0x00, 0x3b};
    static const unsigned char want[] = {10, 20, 30, 40, 50, 60, 2, 2, 2, 3, 3, 3};
    mmp_image img = {0};
    CHECK_OK(mmp_gif_decode("short.gif", gif, sizeof gif, 0, &img));
    CHECK(img.width == 2 && img.height == 2 && img.rgb && memcmp(img.rgb, want, sizeof want) == 0);
    mmp_image_fini(&img);
}

MMP_TEST_LIST("test_formats", MMP_TEST_CASE(test_parity), MMP_TEST_CASE(test_pixel_limit),
              MMP_TEST_CASE(test_cut_files), MMP_TEST_CASE(test_sniff),
              MMP_TEST_CASE(test_gif_short_table))
