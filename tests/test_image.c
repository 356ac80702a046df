/* data/image.h: decoding, resize/crop/flip, normalisation.
 *
 * The resize and geometry are checked against tests/image/reference.bin,
 * computed by PIL and NumPy (tests/image/gen_reference.py); the tolerance is
 * the one the reference states, in 8-bit levels. Error cases must come back
 * as MMP_ERR_DATA naming the file, never a crash. Run from the repo root. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/err.h"
#include "common/rng.h"
#include "data/image.h"
#include "data/codecs.h"
#include "data/png.h"
#include "tests/harness.h"

#define DIR "tests/image/"
#define REGEN "regenerate with: python3 tests/image/gen_reference.py"
#define REF_VERSION 1
/* PNG vs JPEG q95 of the same picture, in 8-bit levels: quantisation costs
 * about a level on average, 4:2:0 chroma subsampling tens of levels at sharp
 * colour edges (gen_reference.py checks PIL's decode meets these too). */
#define JPEG_MEAN_ABS_BOUND 2.5
#define JPEG_MAX_ABS_BOUND 48

static const mmp_image_prep imagenet = {
    .size = 24,
    .mean = {0.485f, 0.456f, 0.406f},
    .std = {0.229f, 0.224f, 0.225f},
};

static void spill(const char *path, const void *buf, size_t len)
{
    FILE *f = fopen(path, "wb");
    CHECK(f != NULL);
    if (f) {
        CHECK(fwrite(buf, 1, len, f) == len);
        fclose(f);
    }
}

/* ---- the PIL/NumPy reference ------------------------------------------- */

typedef struct ref_case {
    char file[128], mode[16];
    int size, flip;
    unsigned long long seed, stream;
    float mean[3], std[3];
    mmp_image_geometry g;
    size_t offset; /* of its 3 * size * size floats in the data */
} ref_case;

static void test_reference(void)
{
    size_t len = 0;
    unsigned char *buf = mmp_test_slurp(DIR "reference.bin", &len);
    CHECK(buf != NULL);
    if (!buf) {
        fprintf(stderr, "  cannot read " DIR "reference.bin; " REGEN "\n");
        return;
    }
    const char *end = NULL;
    for (size_t i = 0; i + 6 <= len; i++) {
        if (memcmp(buf + i, "\ndata\n", 6) == 0) {
            end = (const char *)buf + i + 1;
            break;
        }
    }
    int version = 0;
    if (!end || sscanf((const char *)buf, "MMPIMGREF %d", &version) != 1 ||
        version != REF_VERSION) {
        fprintf(stderr, "  " DIR "reference.bin: bad magic or version %d (want %d); " REGEN "\n",
                version, REF_VERSION);
        CHECK(!"reference header");
        free(buf);
        return;
    }
    ref_case cases[32];
    int n = 0, levels = -1;
    size_t floats = 0;
    char header[8192];
    size_t hlen = (size_t)(end - (const char *)buf);
    CHECK(hlen < sizeof header);
    memcpy(header, buf, hlen < sizeof header ? hlen : sizeof header - 1);
    header[hlen < sizeof header ? hlen : sizeof header - 1] = 0;
    for (char *save = NULL, *line = strtok_r(header, "\n", &save); line;
         line = strtok_r(NULL, "\n", &save)) {
        ref_case *c = &cases[n];
        if (sscanf(line, "tolerance_levels %d", &levels) == 1) {
            continue;
        }
        if (strncmp(line, "case ", 5) != 0) {
            continue;
        }
        mmp_image_geometry *g = &c->g;
        int got = sscanf(
            line, "case %127s %15s %d %llu %llu %f %f %f %f %f %f %d %d %d %d %d %d %d %d %d",
            c->file, c->mode, &c->size, &c->seed, &c->stream, &c->mean[0], &c->mean[1], &c->mean[2],
            &c->std[0], &c->std[1], &c->std[2], &g->x, &g->y, &g->w, &g->h, &g->rw, &g->rh, &g->ox,
            &g->oy, &g->flip);
        CHECK(got == 20);
        if (got != 20 || n == 32) {
            fprintf(stderr, "  bad reference line: %s; " REGEN "\n", line);
            free(buf);
            return;
        }
        c->offset = floats;
        floats += (size_t)3 * c->size * c->size;
        n++;
    }
    size_t expect_len = hlen + 5 + floats * sizeof(float);
    CHECK(levels >= 0 && n >= 10 && len == expect_len);
    if (len != expect_len) {
        fprintf(stderr, "  reference.bin is %zu bytes, header says %zu; " REGEN "\n", len,
                expect_len);
        free(buf);
        return;
    }
    /* The floats follow "data\n" after a header of any length: copy them
     * out to aligned memory. */
    float *all = malloc(floats * sizeof(float) + 1);
    memcpy(all, end + 5, floats * sizeof(float));
    for (int i = 0; i < n; i++) {
        ref_case *c = &cases[i];
        char path[256];
        snprintf(path, sizeof path, DIR "%.127s", c->file);
        mmp_image_prep prep = {.size = c->size, .augment = strcmp(c->mode, "random") == 0};
        memcpy(prep.mean, c->mean, sizeof prep.mean);
        memcpy(prep.std, c->std, sizeof prep.std);
        mmp_rng rng;
        mmp_rng_seed(&rng, c->seed, c->stream);

        /* Geometry first: a wrong crop would show as a wall of pixel diffs. */
        mmp_image img = {0};
        mmp_image_geometry g;
        CHECK_OK(mmp_image_read(path, 0, &img));
        CHECK_OK(mmp_image_choose_geometry(img.width, img.height, &prep, &rng, &g));
        mmp_image_fini(&img);
        int same = g.x == c->g.x && g.y == c->g.y && g.w == c->g.w && g.h == c->g.h &&
                   g.rw == c->g.rw && g.rh == c->g.rh && g.ox == c->g.ox && g.oy == c->g.oy &&
                   g.flip == c->g.flip;
        CHECK(same);
        if (!same) {
            fprintf(stderr,
                    "  %s %s %d: geometry (%d,%d %dx%d -> %dx%d at %d,%d flip %d), want (%d,%d "
                    "%dx%d -> %dx%d at %d,%d flip %d)\n",
                    c->file, c->mode, c->size, g.x, g.y, g.w, g.h, g.rw, g.rh, g.ox, g.oy, g.flip,
                    c->g.x, c->g.y, c->g.w, c->g.h, c->g.rw, c->g.rh, c->g.ox, c->g.oy, c->g.flip);
        }

        size_t plane = (size_t)c->size * c->size;
        float *out = malloc(sizeof(float) * 3 * plane);
        const float *want = all + c->offset;
        mmp_rng_seed(&rng, c->seed, c->stream);
        CHECK_OK(mmp_image_load(path, &prep, &rng, out));
        double worst = 0; /* in levels */
        for (int ch = 0; ch < 3; ch++) {
            char label[200];
            snprintf(label, sizeof label, "%.127s %.15s size %d seed %llu channel %d", c->file,
                     c->mode, c->size, c->seed, ch);
            double atol = levels / (255.0 * c->std[ch]) + 1e-5;
            CHECK_CLOSE(label, out + ch * plane, want + ch * plane, plane, atol, 0.0);
            for (size_t q = 0; q < plane; q++) {
                double d =
                    fabs((double)out[ch * plane + q] - want[ch * plane + q]) * 255.0 * c->std[ch];
                worst = d > worst ? d : worst;
            }
        }
        printf("  reference %-22s %-6s size %2d: max diff %.3f levels (tolerance %d)\n", c->file,
               c->mode, c->size, worst, levels);
        free(out);
    }
    free(all);
    free(buf);
}

/* ---- decoding ------------------------------------------------------------ */

static void test_png_vs_jpeg(void)
{
    mmp_image png = {0}, jpg = {0};
    CHECK_OK(mmp_image_read(DIR "same_96x64.png", 0, &png));
    CHECK_OK(mmp_image_read(DIR "same_96x64_q95.jpg", 0, &jpg));
    CHECK(png.width == 96 && png.height == 64 && jpg.width == 96 && jpg.height == 64);
    if (png.rgb && jpg.rgb && png.width == jpg.width && png.height == jpg.height) {
        size_t n = (size_t)png.width * png.height * 3;
        double sum = 0;
        int max = 0;
        for (size_t i = 0; i < n; i++) {
            int d = abs((int)png.rgb[i] - (int)jpg.rgb[i]);
            sum += d;
            max = d > max ? d : max;
        }
        printf("  png vs jpeg q95: mean abs %.3f, max abs %d levels (bounds %.1f, %d)\n", sum / n,
               max, JPEG_MEAN_ABS_BOUND, JPEG_MAX_ABS_BOUND);
        CHECK(sum / n <= JPEG_MEAN_ABS_BOUND);
        CHECK(max <= JPEG_MAX_ABS_BOUND);
        CHECK(sum / n > 0.1); /* they are different files: a decoder that read the PNG twice */
    }
    mmp_image_fini(&png);
    mmp_image_fini(&jpg);
    mmp_image_fini(&jpg); /* idempotent */
}

static void test_gray_and_progressive(void)
{
    mmp_image img = {0};
    CHECK_OK(mmp_image_read(DIR "gray_40x30.jpg", 0, &img));
    CHECK(img.width == 40 && img.height == 30 && img.rgb);
    int replicated = 1, varied = 0;
    for (int i = 0; img.rgb && i < img.width * img.height; i++) {
        const uint8_t *p = img.rgb + 3 * i;
        replicated &= p[0] == p[1] && p[1] == p[2];
        varied |= p[0] != img.rgb[0];
    }
    CHECK(replicated);
    CHECK(varied);
    mmp_image_fini(&img);

    CHECK_OK(mmp_image_read(DIR "progressive_48x40.jpg", 0, &img));
    CHECK(img.width == 48 && img.height == 40 && img.rgb);
    mmp_image_fini(&img);

    /* Detection is by content: a JPEG named .png still decodes. */
    const char *tmp = mmp_test_tmpdir("image_named");
    char path[1100];
    size_t len = 0;
    unsigned char *buf = mmp_test_slurp(DIR "same_96x64_q95.jpg", &len);
    CHECK(buf != NULL);
    snprintf(path, sizeof path, "%s/photo.png", tmp);
    spill(path, buf, len);
    CHECK_OK(mmp_image_read(path, 0, &img));
    CHECK(img.width == 96 && img.height == 64);
    mmp_image_fini(&img);
    free(buf);
}

/* path must fail with MMP_ERR_DATA, a message naming path and containing
 * reason, and leave out untouched. */
static void expect_bad(const char *path, const char *reason)
{
    mmp_image img = {.width = 7};
    mmp_err e = mmp_image_read(path, 0, &img);
    const char *msg = mmp_last_error();
    int ok = e == MMP_ERR_DATA && strstr(msg, path) == msg && strstr(msg, reason) &&
             img.rgb == NULL && img.width == 0;
    CHECK(ok);
    if (!ok) {
        fprintf(stderr, "  %s: got %s \"%s\", want data \"%s: ...%s...\"\n", path, mmp_err_name(e),
                msg, path, reason);
    }
    float out[3 * 24 * 24];
    for (size_t i = 0; i < sizeof out / sizeof *out; i++) {
        out[i] = 12345.0f;
    }
    mmp_rng rng;
    mmp_rng_seed(&rng, 1, 2);
    mmp_image_prep prep = imagenet;
    prep.augment = 1;
    e = mmp_image_load(path, &prep, &rng, out);
    CHECK(e == MMP_ERR_DATA && strstr(mmp_last_error(), reason));
    int untouched = 1;
    for (size_t i = 0; i < sizeof out / sizeof *out; i++) {
        untouched &= out[i] == 12345.0f;
    }
    CHECK(untouched);
}

static void test_bad_files(void)
{
    const char *tmp = mmp_test_tmpdir("image_bad");
    char path[1100];

    /* CMYK decodes now (as PIL: tests/test_formats.c checks its pixels). */
    mmp_image cmyk = {0};
    CHECK_OK(mmp_image_read(DIR "cmyk_16x16.jpg", 0, &cmyk));
    CHECK(cmyk.width == 16 && cmyk.height == 16);
    mmp_image_fini(&cmyk);
    expect_bad(DIR "truncated.jpg", "truncated JPEG");

    snprintf(path, sizeof path, "%s/empty.jpg", tmp);
    spill(path, "", 0);
    expect_bad(path, "empty file (0 bytes)");

    snprintf(path, sizeof path, "%s/notes.jpg", tmp);
    const char *text = "this is a caption, not a picture\n";
    spill(path, text, strlen(text));
    expect_bad(path, "not a PNG, JPEG, GIF or WebP image");

    /* A file past the size an image of max_pixels pixels may have (16 bytes a
     * pixel + 64 MiB) is refused before it is read: a sparse PNG-headed file
     * one byte over the bound for 100 pixels, and one byte under it, which is
     * read and then fails in the PNG decoder instead. */
    for (int over = 1; over >= 0; over--) {
        snprintf(path, sizeof path, "%s/huge%d.png", tmp, over);
        spill(path, "\x89PNG\r\n\x1a\n", 8);
        CHECK(truncate(path, (off_t)(16 * 100 + (64 << 20) + over)) == 0);
        mmp_image img = {.width = 7};
        mmp_err e = mmp_image_read(path, 100, &img);
        CHECK(e == MMP_ERR_DATA && img.rgb == NULL && img.width == 0);
        int says_size = strstr(mmp_last_error(), "bytes this file may have") != NULL;
        CHECK(says_size == over);
        if (says_size != over) {
            fprintf(stderr, "  %s: %s\n", path, mmp_last_error());
        }
        unlink(path);
    }

    snprintf(path, sizeof path, "%s/missing.jpg", tmp);
    expect_bad(path, "No such file");
    expect_bad(tmp, "not a regular file");

    /* Truncations of a progressive and a baseline file at several points,
     * down to a bare SOI marker and up to a missing EOI only. */
    const char *sources[] = {DIR "progressive_48x40.jpg", DIR "same_96x64_q95.jpg"};
    for (int s = 0; s < 2; s++) {
        size_t len = 0;
        unsigned char *buf = mmp_test_slurp(sources[s], &len);
        CHECK(buf != NULL && len > 100);
        if (!buf) {
            continue;
        }
        size_t cuts[] = {3, 20, len / 4, len / 2, len - 2};
        for (int k = 0; k < 5; k++) {
            snprintf(path, sizeof path, "%s/cut%d_%zu.jpg", tmp, s, cuts[k]);
            spill(path, buf, cuts[k]);
            expect_bad(path, "JPEG");
        }
        snprintf(path, sizeof path, "%s/cut%d_eoi.jpg", tmp, s);
        spill(path, buf, len - 2);
        expect_bad(path, "truncated JPEG");

        /* An SOF claiming 20000 x 20000 must be refused before any
         * allocation: patch the first SOFn's height and width. */
        for (size_t i = 2; i + 9 < len; i++) {
            if (buf[i] == 0xFF && (buf[i + 1] == 0xC0 || buf[i + 1] == 0xC2)) {
                buf[i + 5] = 20000 >> 8;
                buf[i + 6] = 20000 & 0xFF;
                buf[i + 7] = 20000 >> 8;
                buf[i + 8] = 20000 & 0xFF;
                break;
            }
        }
        snprintf(path, sizeof path, "%s/huge%d.jpg", tmp, s);
        spill(path, buf, len);
        expect_bad(path, "larger than 16384 pixels");
        free(buf);

        /* Garbage after a valid start: an error, never a crash. */
        buf = mmp_test_slurp(sources[s], &len);
        CHECK(buf != NULL);
        if (!buf) {
            continue;
        }
        for (size_t i = len / 3; i < len; i += 7) {
            buf[i] ^= 0x5A;
        }
        snprintf(path, sizeof path, "%s/garbled%d.jpg", tmp, s);
        spill(path, buf, len);
        mmp_image img = {0};
        mmp_err e = mmp_image_read(path, 0, &img);
        /* libjpeg may decode past recoverable corruption; either way no crash
         * and no leak, and an error is MMP_ERR_DATA. */
        CHECK(e == MMP_OK || e == MMP_ERR_DATA);
        mmp_image_fini(&img);
        free(buf);
    }

    /* A truncated PNG goes through the same entry point. */
    size_t len = 0;
    unsigned char *buf = mmp_test_slurp(DIR "grad_64x48.png", &len);
    CHECK(buf != NULL);
    snprintf(path, sizeof path, "%s/cut.png", tmp);
    spill(path, buf, len / 2);
    expect_bad(path, "truncated PNG");
    free(buf);
}

/* ---- geometry and normalisation ----------------------------------------- */

static void test_augment_determinism(void)
{
    const char *path = DIR "grad_64x48.png";
    mmp_image_prep prep = imagenet;
    prep.augment = 1;
    size_t n = 3 * (size_t)prep.size * prep.size;
    float *a = malloc(sizeof(float) * n), *b = malloc(sizeof(float) * n);
    mmp_rng r1, r2;
    mmp_rng_seed(&r1, 42, 3);
    mmp_rng_seed(&r2, 42, 3);
    CHECK_OK(mmp_image_load(path, &prep, &r1, a));
    CHECK_OK(mmp_image_load(path, &prep, &r2, b));
    CHECK(memcmp(a, b, sizeof(float) * n) == 0);
    CHECK(memcmp(&r1, &r2, sizeof r1) == 0); /* the same draws were taken */

    /* Different seeds: different crops and both flips within a few draws. */
    int differ = 0, flips[2] = {0, 0};
    for (unsigned seed = 43; seed < 59; seed++) {
        mmp_rng_seed(&r2, seed, 3);
        CHECK_OK(mmp_image_load(path, &prep, &r2, b));
        differ += memcmp(a, b, sizeof(float) * n) != 0;
        mmp_image_geometry g;
        mmp_rng_seed(&r2, seed, 3);
        CHECK_OK(mmp_image_choose_geometry(64, 48, &prep, &r2, &g));
        flips[g.flip]++;
        CHECK(g.x >= 0 && g.y >= 0 && g.x + g.w <= 64 && g.y + g.h <= 48 && g.rw == prep.size);
    }
    CHECK(differ == 16);
    CHECK(flips[0] > 0 && flips[1] > 0);

    /* A second draw from the same rng continues the stream: not a repeat. */
    mmp_rng_seed(&r1, 42, 3);
    CHECK_OK(mmp_image_load(path, &prep, &r1, a));
    CHECK_OK(mmp_image_load(path, &prep, &r1, b));
    CHECK(memcmp(a, b, sizeof(float) * n) != 0);
    free(a);
    free(b);
}

static void test_flip(void)
{
    mmp_image img = {0};
    CHECK_OK(mmp_image_read(DIR "grad_64x48.png", 0, &img));
    if (!img.rgb) {
        return;
    }
    mmp_image_prep prep = imagenet;
    const int S = prep.size;
    const size_t plane = (size_t)S * S, n = 3 * plane;
    /* The whole image resized to S x S, as a random crop that is the image. */
    mmp_image_geometry g = {.w = img.width, .h = img.height, .rw = S, .rh = S};
    float *plain = malloc(sizeof(float) * n), *flipped = malloc(sizeof(float) * n);
    float *mirror_src = malloc(sizeof(float) * n), *want = malloc(sizeof(float) * n);
    CHECK_OK(mmp_image_transform(&img, &prep, &g, plain));
    g.flip = 1;
    CHECK_OK(mmp_image_transform(&img, &prep, &g, flipped));

    /* flip = 1 is the plain output mirrored left-right, exactly... */
    for (int c = 0; c < 3; c++) {
        for (int y = 0; y < S; y++) {
            for (int x = 0; x < S; x++) {
                want[c * plane + (size_t)y * S + x] = plain[c * plane + (size_t)y * S + S - 1 - x];
            }
        }
    }
    CHECK_CLOSE("flip vs mirrored plain", flipped, want, n, 0.0, 0.0);
    CHECK(memcmp(plain, flipped, sizeof(float) * n) != 0); /* the picture is not symmetric */

    /* ...and (within the filter's rounding) what the mirrored picture gives
     * unflipped: catches a flip of the wrong axis or of the source crop. */
    mmp_image m = {.width = img.width, .height = img.height};
    m.rgb = malloc((size_t)img.width * img.height * 3);
    for (int y = 0; y < img.height; y++) {
        for (int x = 0; x < img.width; x++) {
            memcpy(m.rgb + ((size_t)y * img.width + x) * 3,
                   img.rgb + ((size_t)y * img.width + img.width - 1 - x) * 3, 3);
        }
    }
    g.flip = 0;
    CHECK_OK(mmp_image_transform(&m, &prep, &g, mirror_src));
    CHECK_CLOSE("flip vs mirrored source", flipped, mirror_src, n, 1.0 / (255 * 0.224) + 1e-5, 0.0);

    /* A geometry outside the image is refused, not read. */
    g.x = 1;
    CHECK(mmp_image_transform(&img, &prep, &g, plain) == MMP_ERR_INVALID);
    mmp_image_fini(&m);
    mmp_image_fini(&img);
    free(plain);
    free(flipped);
    free(mirror_src);
    free(want);
}

static void test_constant_normalisation(void)
{
    const char *tmp = mmp_test_tmpdir("image_constant");
    char path[1100];
    snprintf(path, sizeof path, "%s/constant.png", tmp);
    const int W = 37, H = 23;
    const uint8_t value[3] = {200, 100, 7};
    uint8_t *rgb = malloc((size_t)W * H * 3);
    for (int i = 0; i < W * H; i++) {
        memcpy(rgb + 3 * i, value, 3);
    }
    CHECK_OK(mmp_png_write(path, rgb, W, H));
    free(rgb);

    mmp_image_prep prep = {.size = 16, .mean = {0.25f, 0.5f, 0.75f}, .std = {0.5f, 0.25f, 2.0f}};
    const size_t plane = 16 * 16;
    float out[3 * 16 * 16];
    for (int augment = 0; augment < 2; augment++) {
        prep.augment = augment;
        mmp_rng rng;
        mmp_rng_seed(&rng, 9, 9);
        CHECK_OK(mmp_image_load(path, &prep, &rng, out));
        for (int c = 0; c < 3; c++) {
            float want = ((float)value[c] / 255.0f - prep.mean[c]) / prep.std[c];
            double sum = 0, sq = 0;
            int exact = 1;
            for (size_t q = 0; q < plane; q++) {
                float v = out[c * plane + q];
                exact &= v == want;
                sum += v;
                sq += (double)v * v;
            }
            double mean = sum / plane, var = sq / plane - mean * mean;
            CHECK(exact);
            CHECK(fabs(mean - want) < 1e-6 && var < 1e-10);
            if (!exact) {
                fprintf(stderr, "  constant channel %d augment %d: mean %.9g want %.9g\n", c,
                        augment, mean, (double)want);
            }
        }
    }
}

static void test_bad_prep(void)
{
    float out[3 * 24 * 24];
    mmp_image_prep prep = imagenet;
    prep.size = 0;
    CHECK(mmp_image_load(DIR "grad_64x48.png", &prep, NULL, out) == MMP_ERR_INVALID);
    prep = imagenet;
    prep.std[1] = 0.0f;
    CHECK(mmp_image_load(DIR "grad_64x48.png", &prep, NULL, out) == MMP_ERR_INVALID);
    prep = imagenet;
    prep.augment = 1;
    CHECK(mmp_image_load(DIR "grad_64x48.png", &prep, NULL, out) == MMP_ERR_INVALID);
    CHECK(strstr(mmp_last_error(), "rng") != NULL);
}

MMP_TEST_LIST("test_image", MMP_TEST_CASE(test_reference), MMP_TEST_CASE(test_png_vs_jpeg),
              MMP_TEST_CASE(test_gray_and_progressive), MMP_TEST_CASE(test_bad_files),
              MMP_TEST_CASE(test_augment_determinism), MMP_TEST_CASE(test_flip),
              MMP_TEST_CASE(test_constant_normalisation), MMP_TEST_CASE(test_bad_prep))
