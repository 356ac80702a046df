/* SLURM's environment (common/hostlist.c): the input's first line is
 * SLURM_JOB_NODELIST, expanded with room for 64 names and for 3 (each in a
 * heap block of exactly that many, so a write past the end is caught);
 * the next lines are SLURM_GPUS_ON_NODE, CUDA_VISIBLE_DEVICES,
 * SLURM_NTASKS_PER_NODE, SLURM_JOB_ID, SLURM_GPUS_PER_NODE and SLURM_GPUS
 * for mmp_hostlist_from_slurm. */
#include "common/hostlist.h"
#include "tests/fuzz/fuzz.h"

static const char *const vars[] = {"SLURM_JOB_NODELIST",
                                   "SLURM_GPUS_ON_NODE",
                                   "CUDA_VISIBLE_DEVICES",
                                   "SLURM_NTASKS_PER_NODE",
                                   "SLURM_JOB_ID",
                                   "SLURM_GPUS_PER_NODE",
                                   "SLURM_GPUS"};
#define N_VARS (sizeof vars / sizeof vars[0])
static const char *values[N_VARS];

static const char *fake_getenv(const char *name)
{
    for (size_t i = 0; i < N_VARS; i++) {
        if (strcmp(name, vars[i]) == 0) {
            return values[i];
        }
    }
    return NULL;
}

static int name_ok(const char *s)
{
    size_t n = strnlen(s, MMP_HOSTLIST_NAME_MAX);
    return n > 0 && n < MMP_HOSTLIST_NAME_MAX &&
           strspn(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-") == n;
}

/* Expands list into a heap block of exactly max names; *names is the
 * caller's to free. */
static mmp_err expand(const char *list, int max, char (**names)[MMP_HOSTLIST_NAME_MAX], int *n)
{
    *names = malloc((size_t)max * MMP_HOSTLIST_NAME_MAX);
    if (!*names) {
        *n = -1;
        return MMP_ERR_NOMEM;
    }
    return mmp_hostlist_expand(list, *names, max, n);
}

static void check_list(const char *list)
{
    char(*big)[MMP_HOSTLIST_NAME_MAX] = NULL, (*small)[MMP_HOSTLIST_NAME_MAX] = NULL;
    int n = -1, m = -1;
    mmp_err e = expand(list, 64, &big, &n);
    mmp_err f = expand(list, 3, &small, &m);
    if (e == MMP_ERR_NOMEM || f == MMP_ERR_NOMEM) {
        goto out;
    }
    if (e != MMP_OK) {
        if (n != 0 || f == MMP_OK || !strstr(mmp_last_error(), "hostlist")) {
            __builtin_trap(); /* a refusal with names, or one that does not say where */
        }
        goto out;
    }
    if (n < 1 || n > 64) {
        __builtin_trap();
    }
    /* the limit is exact: room for 3 takes the same names or refuses */
    if ((n <= 3) != (f == MMP_OK) || (f == MMP_OK && m != n)) {
        __builtin_trap();
    }
    /* every name is a host name; joined by commas they expand to themselves */
    char joined[64 * MMP_HOSTLIST_NAME_MAX];
    size_t at = 0;
    for (int k = 0; k < n; k++) {
        if (!name_ok(big[k]) || (k < m && strcmp(big[k], small[k]) != 0)) {
            __builtin_trap();
        }
        at += (size_t)snprintf(joined + at, sizeof joined - at, "%s%s", k ? "," : "", big[k]);
    }
    char(*again)[MMP_HOSTLIST_NAME_MAX] = NULL;
    int r = -1;
    if (expand(joined, 64, &again, &r) != MMP_OK || r != n) {
        __builtin_trap();
    }
    for (int k = 0; k < n; k++) {
        if (strcmp(again[k], big[k]) != 0) {
            __builtin_trap();
        }
    }
    free(again);
    /* without brackets, expansion is splitting at commas */
    if (!strchr(list, '[')) {
        int commas = 0;
        for (const char *p = list; *p; p++) {
            commas += *p == ',';
        }
        if (n != commas + 1) {
            __builtin_trap();
        }
    }
out:
    free(big);
    free(small);
}

static void check_env(void)
{
    mmp_slurm_env *env = malloc(sizeof *env);
    if (!env) {
        return;
    }
    if (mmp_hostlist_from_slurm(env, fake_getenv) == MMP_OK) {
        if (env->n_nodes < 1 || env->n_nodes > MMP_HOSTLIST_MAX_NODES || env->gpus < 0 ||
            env->gpus > 64 || env->cpu_slots < 1 || env->cpu_slots > 64 ||
            strspn(env->job_id, "0123456789_") != strlen(env->job_id)) {
            __builtin_trap();
        }
        for (int i = 0; i < env->n_nodes; i++) {
            if (!name_ok(env->nodes[i])) {
                __builtin_trap();
            }
        }
        for (int i = 0; i < env->gpus; i++) {
            if (env->gpu[i] != i) { /* the ordinals a stage sees */
                __builtin_trap();
            }
        }
    } else if (!strstr(mmp_last_error(), "hosts: slurm")) {
        __builtin_trap(); /* an error that does not name the allocation */
    }
    free(env);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fuzz_quiet();
    char *text = malloc(size + 1);
    if (!text) {
        return 0;
    }
    memcpy(text, data, size);
    text[size] = 0;
    /* lines (a NUL ends the text, as it ends an environment value) */
    char *line = text;
    for (size_t i = 0; i < N_VARS; i++) {
        values[i] = line;
        char *nl = line ? strchr(line, '\n') : NULL;
        if (nl) {
            *nl = 0;
        }
        line = nl ? nl + 1 : NULL;
    }
    check_list(values[0]);
    check_env();
    free(text);
    return 0;
}
