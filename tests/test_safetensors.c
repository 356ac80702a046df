/* The safetensors reader and writer: a round trip keeps names, dtypes,
 * shapes, bytes and metadata; every cut of a good file and every forged
 * header is refused with an error naming the file (and the tensor where
 * there is one), never a crash or an allocation sized by the file. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/safetensors.h"
#include "tests/harness.h"

static char dir[512];

static const char *path_in(const char *name)
{
    static char p[1024];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    return p;
}

/* A file of the 8-byte length of header, header, then data_len bytes. */
static void write_raw(const char *path, const char *header, size_t data_len)
{
    FILE *f = fopen(path, "wb");
    uint64_t n = strlen(header);
    fwrite(&n, 8, 1, f); /* the test host is little-endian (x86, arm64) */
    fwrite(header, 1, n, f);
    for (size_t i = 0; i < data_len; i++) {
        fputc((int)(i & 0xff), f);
    }
    fclose(f);
}

/* Reading path fails and the message contains want. */
static void refused(const char *what, const char *path, const char *want)
{
    mmp_ckpt c = {0};
    mmp_err e = mmp_safetensors_read(&c, path, NULL);
    mmp_test_checks++;
    if (e == MMP_OK || !strstr(mmp_last_error(), want) || c.count != 0) {
        mmp_test_failures++;
        fprintf(stderr, "FAIL %s: err %d, message '%s' (wanted '%s'), %d entries\n", what, e,
                e == MMP_OK ? "" : mmp_last_error(), want, c.count);
    }
    mmp_ckpt_fini(&c);
}

static void test_round_trip(void)
{
    mmp_tensor w, ids, empty;
    int64_t ws[3] = {2, 3, 4}, is[1] = {5}, es[2] = {0, 7};
    CHECK_OK(mmp_tensor_init(&w, MMP_F32, 3, ws));
    CHECK_OK(mmp_tensor_init(&ids, MMP_I32, 1, is));
    CHECK_OK(mmp_tensor_init(&empty, MMP_F32, 2, es));
    mmp_test_fill(w.data, 24, -2, 2, 7);
    for (int i = 0; i < 5; i++) {
        ((int32_t *)ids.data)[i] = i * 1000 - 3;
    }
    mmp_st_meta meta = {0};
    CHECK_OK(mmp_st_meta_set(&meta, "format", "mmpipe-test"));
    CHECK_OK(mmp_st_meta_set(&meta, "note", "quote \" and \\ survive"));
    mmp_st_item items[] = {{"image.layer1.0.conv1.weight", &w}, {"batch.ids", &ids}, {"e", &empty}};
    const char *p = path_in("rt.safetensors");
    CHECK_OK(mmp_safetensors_write(p, items, 3, &meta));

    mmp_ckpt c = {0};
    mmp_st_meta got = {0};
    CHECK_OK(mmp_safetensors_read(&c, p, &got));
    CHECK(c.count == 3);
    const mmp_ckpt_entry *ew = mmp_ckpt_find(&c, "image.layer1.0.conv1.weight");
    const mmp_ckpt_entry *ei = mmp_ckpt_find(&c, "batch.ids");
    const mmp_ckpt_entry *ee = mmp_ckpt_find(&c, "e");
    CHECK(ew && ew->t.dtype == MMP_F32 && ew->t.ndim == 3 && ew->t.shape[2] == 4 &&
          memcmp(ew->t.data, w.data, 24 * sizeof(float)) == 0);
    CHECK(ei && ei->t.dtype == MMP_I32 && memcmp(ei->t.data, ids.data, 5 * sizeof(int32_t)) == 0);
    CHECK(ee && ee->t.ndim == 2 && mmp_tensor_numel(&ee->t) == 0);
    CHECK(c.count == 3 && strcmp(c.entries[0].name, "batch.ids") == 0); /* sorted by name */
    const char *fmt = mmp_st_meta_get(&got, "format"), *note = mmp_st_meta_get(&got, "note");
    CHECK(fmt && strcmp(fmt, "mmpipe-test") == 0);
    CHECK(note && strcmp(note, "quote \" and \\ survive") == 0);
    /* a second read of the same names into the same set is refused, and
     * leaves the set as it was */
    CHECK(mmp_safetensors_read(&c, p, NULL) != MMP_OK && c.count == 3);
    mmp_ckpt_fini(&c);

    /* every cut of the good file is refused */
    FILE *f = fopen(p, "rb");
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    rewind(f);
    unsigned char *all = malloc((size_t)size);
    CHECK(fread(all, 1, (size_t)size, f) == (size_t)size);
    fclose(f);
    int cuts = 0, refusals = 0;
    for (long cut = 0; cut < size; cut += cut < 200 ? 1 : 13) {
        const char *q = path_in("cut.safetensors");
        f = fopen(q, "wb");
        fwrite(all, 1, (size_t)cut, f);
        fclose(f);
        mmp_ckpt cc = {0};
        cuts++;
        refusals += mmp_safetensors_read(&cc, q, NULL) != MMP_OK && cc.count == 0;
        mmp_ckpt_fini(&cc);
    }
    CHECK(refusals == cuts);
    refused("truncated in the data", path_in("cut.safetensors"), "outside the");
    free(all);
    mmp_tensor_fini(&w);
    mmp_tensor_fini(&ids);
    mmp_tensor_fini(&empty);
}

static void test_forged(void)
{
    const char *p = path_in("forged.safetensors");
    const char *ok = "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}";
    write_raw(p, ok, 8);
    mmp_ckpt c = {0};
    CHECK_OK(mmp_safetensors_read(&c, p, NULL)); /* the forgeries below differ from this */
    mmp_ckpt_fini(&c);

    write_raw(p, "{}", 0); /* no tensors at all is a valid file */
    CHECK_OK(mmp_safetensors_read(&c, p, NULL));
    CHECK(c.count == 0);
    mmp_ckpt_fini(&c);

    FILE *f = fopen(p, "wb");
    uint64_t huge = 1ull << 60;
    fwrite(&huge, 8, 1, f);
    fclose(f);
    refused("header length beyond the file", p, "header length");

    /* header, the data bytes that follow it, what the forgery is, the refusal */
    static const struct {
        const char *header;
        size_t data;
        const char *what, *why;
    } forged[] = {
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}", 8,
         "shape and offsets disagree",
         "tensor a: shape and dtype make 12 bytes, data_offsets span 8"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296],\"data_offsets\":[0,8]}}", 8,
         "shape product overflows", "more bytes than the file holds"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296,0],\"data_offsets\":[0,0]}}",
         0, "an empty tensor whose other dims overflow", "more bytes than the file holds"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,16]}}", 8,
         "offsets past the end", "tensor a: data_offsets"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
         "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}",
         12, "overlapping tensors", "tensor b: data starts at 4, expected 8"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}", 12,
         "a gap before the data", "tensor a: data starts at 4"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 12,
         "bytes after the last tensor", "4 bytes after the last"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
         "\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}",
         8, "a name twice", "tensor a appears twice"},
        {"{\"a\":{\"dtype\":\"F64\",\"shape\":[1],\"data_offsets\":[0,8]}}", 8, "an unknown dtype",
         "tensor a: dtype"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[-2],\"data_offsets\":[0,8]}}", 8,
         "a negative dimension", "tensor a: negative"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2]}}", 8, "no data_offsets",
         "tensor a: entry lacks"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8],\"x\":1}}", 8,
         "an unknown key", "tensor a: unknown"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}", 8,
         "an unterminated object", "forged.safetensors:"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}x", 8,
         "junk after the object", "bytes after the JSON"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,1,2],\"data_offsets\":[0,8]}}", 8,
         "too many dimensions", "more than 6"},
    };
    for (size_t i = 0; i < sizeof forged / sizeof forged[0]; i++) {
        write_raw(p, forged[i].header, forged[i].data);
        refused(forged[i].what, p, forged[i].why);
    }
    char longname[400];
    memset(longname, 'n', sizeof longname);
    longname[sizeof longname - 1] = 0;
    char hdr[600];
    snprintf(hdr, sizeof hdr, "{\"%s\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}",
             longname);
    write_raw(p, hdr, 8);
    refused("a name longer than an entry holds", p, "string too long");
    /* the error says where: the entry of a bad tensor starts at byte 8 + 1 */
    write_raw(p, "{\"a\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}", 8);
    refused("the offset is named", p, "forged.safetensors:9: tensor a");
}

static const mmp_test_case CASES[] = {
    MMP_TEST_CASE(test_round_trip),
    MMP_TEST_CASE(test_forged),
};

int main(int argc, char **argv)
{
    snprintf(dir, sizeof dir, "%s", mmp_test_tmpdir("test_safetensors"));
    return MMP_TEST_MAIN("test_safetensors", CASES, argc, argv);
}
