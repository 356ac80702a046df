/* JSON string output (common/json.h). */
#include "common/json.h"

#include <string.h>

/* c as it stands inside a JSON string, into out (at most 7 bytes + NUL);
 * returns its length. */
static int escaped(unsigned char c, char out[8])
{
    if (c == '"' || c == '\\') {
        out[0] = '\\', out[1] = (char)c, out[2] = 0;
        return 2;
    }
    if (c < 0x20) {
        return snprintf(out, 8, "\\u%04x", c);
    }
    out[0] = (char)c, out[1] = 0;
    return 1;
}

void mmp_json_put_string(FILE *f, const char *s)
{
    char e[8];
    fputc('"', f);
    for (; *s; s++) {
        fwrite(e, 1, (size_t)escaped((unsigned char)*s, e), f);
    }
    fputc('"', f);
}

const char *mmp_json_escape(const char *s, char *buf, size_t n)
{
    size_t k = 0;
    char e[8];
    for (; *s; s++) {
        size_t len = (size_t)escaped((unsigned char)*s, e);
        if (k + len >= n) {
            break;
        }
        memcpy(buf + k, e, len);
        k += len;
    }
    if (n > 0) {
        buf[k] = 0;
    }
    return buf;
}
