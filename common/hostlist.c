/* SLURM hostlist expansion and the allocation's environment (the contract
 * is in common/hostlist.h). Everything here reads text a user or the
 * scheduler wrote: every index is bounded, nothing is trusted. */
#include "common/hostlist.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct expander {
    const char *list; /* the whole list, for columns in messages */
    char (*names)[MMP_HOSTLIST_NAME_MAX];
    int max, n;
} expander;

static int name_char(char ch)
{
    return isalnum((unsigned char)ch) || ch == '-' || ch == '_' || ch == '.';
}

static mmp_err bad(const expander *e, const char *at, const char *what)
{
    return mmp_errorf(MMP_ERR_INVALID, "hostlist '%s', column %d: %s", e->list,
                      (int)(at - e->list) + 1, what);
}

static mmp_err add(expander *e, const char *name, const char *at)
{
    if (e->n >= e->max) {
        return mmp_errorf(MMP_ERR_INVALID, "hostlist '%s': more than %d hosts", e->list, e->max);
    }
    if (!*name) {
        return bad(e, at, "empty host name");
    }
    snprintf(e->names[e->n++], MMP_HOSTLIST_NAME_MAX, "%s", name);
    return MMP_OK;
}

/* A decimal number of at most 9 digits at s; its digit count in *width. */
/* s[0..w) is a device UUID as CUDA_VISIBLE_DEVICES takes one: "GPU-<hex and
 * dashes>", "MIG-<hex and dashes>" or "MIG-GPU-<uuid>/<gi>/<ci>". */
static int uuid_entry(const char *s, size_t w)
{
    if (w <= 4 || (strncmp(s, "GPU-", 4) != 0 && strncmp(s, "MIG-", 4) != 0)) {
        return 0;
    }
    for (size_t i = 4; i < w; i++) {
        if (!isxdigit((unsigned char)s[i]) && !strchr("-/GPU", s[i])) {
            return 0;
        }
    }
    return 1;
}

static int number(const char *s, long *v, int *width)
{
    int w = 0;
    long x = 0;
    while (isdigit((unsigned char)s[w]) && w < 10) {
        x = x * 10 + (s[w] - '0');
        w++;
    }
    if (w == 0 || w > 9) {
        return 0;
    }
    *v = x;
    *width = w;
    return 1;
}

/* Expands item[0..len) after `prefix` (already expanded, plen bytes). */
static mmp_err expand(expander *e, char *prefix, size_t plen, const char *item, size_t len)
{
    size_t i = 0;
    while (i < len && item[i] != '[') {
        if (!name_char(item[i])) {
            return bad(e, item + i, "character not allowed in a host name");
        }
        if (plen + 1 >= MMP_HOSTLIST_NAME_MAX) {
            return bad(e, item + i, "host name too long");
        }
        prefix[plen++] = item[i++];
    }
    prefix[plen] = 0;
    if (i == len) {
        return add(e, prefix, item);
    }
    const char *open = item + i;
    const char *close = memchr(open, ']', len - i);
    if (!close) {
        return bad(e, open, "'[' without ']'");
    }
    if (close == open + 1) {
        return bad(e, open, "empty brackets");
    }
    const char *rest = close + 1;
    size_t rest_len = len - (size_t)(rest - item);
    /* each comma-separated range inside the brackets */
    const char *r = open + 1;
    while (r < close) {
        long lo, hi;
        int wlo, whi;
        if (!number(r, &lo, &wlo)) {
            return bad(e, r, "expected a number (at most 9 digits) in brackets");
        }
        const char *p = r + wlo;
        hi = lo;
        if (*p == '-') {
            if (!number(p + 1, &hi, &whi)) {
                return bad(e, p + 1, "expected a number after '-'");
            }
            p += 1 + whi;
            if (hi < lo) {
                return bad(e, r, "range end below its start");
            }
        }
        if (p != close && *p != ',') {
            return bad(e, p, "expected ',' or ']' in brackets");
        }
        if (hi - lo >= (long)e->max) {
            return mmp_errorf(MMP_ERR_INVALID, "hostlist '%s': more than %d hosts", e->list,
                              e->max);
        }
        for (long v = lo; v <= hi; v++) {
            char num[16];
            int w = snprintf(num, sizeof num, "%0*ld", wlo, v);
            if (plen + (size_t)w + 1 >= MMP_HOSTLIST_NAME_MAX) {
                return bad(e, r, "host name too long");
            }
            memcpy(prefix + plen, num, (size_t)w + 1);
            MMP_TRY(expand(e, prefix, plen + (size_t)w, rest, rest_len));
        }
        r = p == close ? close : p + 1;
        if (r == close && p != close) {
            return bad(e, r, "empty range after ','");
        }
    }
    return MMP_OK;
}

mmp_err mmp_hostlist_expand(const char *list, char (*names)[MMP_HOSTLIST_NAME_MAX], int max, int *n)
{
    expander e = {.list = list ? list : "", .names = names, .max = max, .n = 0};
    *n = 0;
    const char *s = e.list;
    if (!*s) {
        return mmp_errorf(MMP_ERR_INVALID, "hostlist is empty");
    }
    while (*s) {
        /* an item ends at a comma outside brackets */
        const char *end = s;
        int depth = 0;
        while (*end && (*end != ',' || depth > 0)) {
            if (*end == '[') {
                if (depth++) {
                    return bad(&e, end, "nested '['");
                }
            } else if (*end == ']') {
                if (!depth--) {
                    return bad(&e, end, "']' without '['");
                }
            }
            end++;
        }
        if (end == s) {
            return bad(&e, s, "empty item");
        }
        char prefix[MMP_HOSTLIST_NAME_MAX];
        MMP_TRY(expand(&e, prefix, 0, s, (size_t)(end - s)));
        s = *end ? end + 1 : end;
        if (*end && !*s) {
            return bad(&e, end, "empty item after ','");
        }
    }
    *n = e.n;
    return MMP_OK;
}

/* A non-negative integer from variable `var`'s value; 0 when it is not one. */
static int parse_count(const char *v, long *out)
{
    char *end;
    if (!v || !isdigit((unsigned char)v[0])) {
        return 0;
    }
    long x = strtol(v, &end, 10);
    /* SLURM_NTASKS_PER_NODE may read "2(x3)" on uneven allocations: take the first */
    if (x < 0 || x > 100000 || (*end && *end != '(')) {
        return 0;
    }
    *out = x;
    return 1;
}

/* SLURM_GPUS_PER_NODE, as --gpus-per-node gave it: "[type:]count" items,
 * comma-separated ("2", "a100:2", "gpu:a100:2", "a100:1,v100:1"); the
 * counts summed.
 * 1 and *out on a well-formed value, else 0. */
static int gpus_per_node(const char *v, long *out)
{
    long total = 0;
    while (*v) {
        size_t w = strcspn(v, ",");
        const char *colon = NULL; /* the last one: "gpu:a100:2" too */
        for (size_t k = 0; k < w; k++) {
            colon = v[k] == ':' ? v + k : colon;
        }
        const char *num = colon ? colon + 1 : v;
        size_t nw = w - (size_t)(num - v);
        long c;
        int digits;
        if (w == 0 || nw == 0 || !number(num, &c, &digits) || (size_t)digits != nw) {
            return 0;
        }
        for (const char *t = v; colon && t < colon; t++) {
            if (!isalnum((unsigned char)*t) && *t != '_' && *t != '-' && *t != ':') {
                return 0;
            }
        }
        total += c;
        if (total > 100000) {
            return 0;
        }
        v += w + (v[w] == ',');
        if (v[-1] == ',' && !*v) {
            return 0;
        }
    }
    *out = total;
    return 1;
}

mmp_err mmp_hostlist_from_slurm(mmp_slurm_env *out, const char *(*getenv_fn)(const char *))
{
    memset(out, 0, sizeof *out);
    const char *list = getenv_fn("SLURM_JOB_NODELIST");
    if (!list || !*list) {
        return mmp_errorf(MMP_ERR_INVALID,
                          "hosts: slurm: not inside a SLURM allocation (SLURM_JOB_NODELIST is not "
                          "set; run mmpipe launch from an sbatch script or an salloc shell)");
    }
    const int max_nodes = (int)(sizeof out->nodes / sizeof out->nodes[0]);
    if (mmp_hostlist_expand(list, out->nodes, max_nodes, &out->n_nodes) != MMP_OK) {
        return mmp_error_prefix(MMP_ERR_INVALID, "hosts: slurm: SLURM_JOB_NODELIST");
    }
    const char *id = getenv_fn("SLURM_JOB_ID");
    if (id && strlen(id) < sizeof out->job_id && strspn(id, "0123456789_") == strlen(id)) {
        snprintf(out->job_id, sizeof out->job_id, "%s", id);
    }
    const int max_gpus = (int)(sizeof out->gpu / sizeof out->gpu[0]);
    const char *gpn = getenv_fn("SLURM_GPUS_ON_NODE");
    const char *cvd = getenv_fn("CUDA_VISIBLE_DEVICES");
    long g = 0;
    if (gpn && *gpn) {
        if (!parse_count(gpn, &g) || g > max_gpus) {
            return mmp_errorf(MMP_ERR_INVALID,
                              "hosts: slurm: SLURM_GPUS_ON_NODE='%.40s' is not a count 0..%d", gpn,
                              max_gpus);
        }
        out->gpus = (int)g;
        for (int i = 0; i < out->gpus; i++) {
            out->gpu[i] = i; /* srun renumbers the node's GPUs from 0 in each step */
        }
    } else if (cvd && *cvd && strcmp(cvd, "NoDevFiles") != 0) {
        /* What the stages see: they inherit this variable (posix_spawn, srun's
         * --export=ALL), and CUDA numbers the devices it lists from 0, so
         * "2,3" is cuda:0 and cuda:1 in every stage. Entries are ordinals or
         * GPU-/MIG- UUIDs; SLURM's "NoDevFiles" means none. */
        const char *s = cvd;
        while (*s) {
            size_t w = strcspn(s, ",");
            long v;
            int nw;
            int ordinal = number(s, &v, &nw) && (size_t)nw == w && v <= 1023;
            if (out->gpus >= max_gpus || w == 0 || !(ordinal || uuid_entry(s, w))) {
                return mmp_errorf(MMP_ERR_INVALID,
                                  "hosts: slurm: CUDA_VISIBLE_DEVICES='%.60s' is not a list of at "
                                  "most %d GPU ordinals or GPU-/MIG- UUIDs",
                                  cvd, max_gpus);
            }
            out->gpu[out->gpus] = out->gpus;
            out->gpus++;
            s += w + (s[w] == ',');
        }
    }
    const char *req = getenv_fn("SLURM_GPUS_PER_NODE");
    if (out->gpus == 0 && !(gpn && *gpn) && req && *req) {
        /* salloc's shell runs on the login node, where SLURM sets neither
         * of the above: the request says how many each node has */
        if (!gpus_per_node(req, &g) || g > max_gpus) {
            return mmp_errorf(MMP_ERR_INVALID,
                              "hosts: slurm: SLURM_GPUS_PER_NODE='%.40s' is not [type:]count "
                              "items with 0..%d GPUs in all",
                              req, max_gpus);
        }
        out->gpus = (int)g;
        for (int i = 0; i < out->gpus; i++) {
            out->gpu[i] = i;
        }
    }
    if (out->gpus == 0 && !(gpn && *gpn)) {
        /* GPUs asked for in a way that leaves each node's count unknown here */
        static const char *const asked[] = {"SLURM_GPUS", "SLURM_GPUS_PER_TASK",
                                            "SLURM_GPUS_PER_SOCKET"};
        for (size_t i = 0; i < sizeof asked / sizeof asked[0]; i++) {
            const char *v = getenv_fn(asked[i]);
            if (v && *v && strcmp(v, "0") != 0) {
                return mmp_errorf(MMP_ERR_INVALID,
                                  "hosts: slurm: the allocation asks for GPUs (%s=%.40s) but how "
                                  "many each node has is not known here: allocate with "
                                  "--gpus-per-node=N, or run mmpipe launch on the allocation's "
                                  "first node (an sbatch script, srun --pty)",
                                  asked[i], v);
            }
        }
    }
    long t = 1;
    const char *tpn = getenv_fn("SLURM_NTASKS_PER_NODE");
    if (tpn && *tpn && (!parse_count(tpn, &t) || t < 1 || t > 64)) {
        return mmp_errorf(MMP_ERR_INVALID,
                          "hosts: slurm: SLURM_NTASKS_PER_NODE='%.40s' is not a count 1..64", tpn);
    }
    out->cpu_slots = (int)t;
    return MMP_OK;
}
