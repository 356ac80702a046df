/* Reading metrics.jsonl records (libfyaml parses JSON): shared by simulate
 * --costs and bench. */
#include <libfyaml.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"

int mmp_cli_json_number(struct fy_node *node, const char *key, double *out)
{
    struct fy_node *v =
        node ? fy_node_mapping_lookup_value_by_simple_key(node, key, strlen(key)) : NULL;
    if (!v) {
        return 0;
    }
    size_t len;
    const char *text = fy_node_is_scalar(v) ? fy_node_get_scalar(v, &len) : NULL;
    char buf[64];
    if (!text || len == 0 || len >= sizeof buf) {
        return -1;
    }
    memcpy(buf, text, len);
    buf[len] = 0;
    char *end;
    *out = strtod(buf, &end);
    return *end == 0 && isfinite(*out) ? 1 : -1;
}

void mmp_cli_json_quiet(struct fy_diag *diag, void *user, const char *buf, size_t len)
{
    (void)diag, (void)user, (void)buf, (void)len;
}
