/* Command lines that start stage processes (contract: coordinator/launcher.h).
 * Nothing here runs a program or reads the environment; it must never put a
 * secret on a line, nor an unchecked value. */
#include "coordinator/launcher.h"

#include <stdarg.h>
#include <ctype.h>
#include <stdio.h>
#include <string.h>

/* A value that may stand as a word: printable, no leading '-'. */
static int word_ok(const char *s)
{
    if (!s || !*s || s[0] == '-') {
        return 0;
    }
    for (; *s; s++) {
        if ((unsigned char)*s < 0x20 || *s == 0x7f) {
            return 0;
        }
    }
    return 1;
}

static mmp_err push(mmp_launch_line *l, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static mmp_err push(mmp_launch_line *l, const char *fmt, ...)
{
    if (l->argc >= MMP_LAUNCH_ARGV_MAX) {
        return mmp_errorf(MMP_ERR_INVALID, "launcher: more than %d words", MMP_LAUNCH_ARGV_MAX);
    }
    va_list ap;
    va_start(ap, fmt);
    size_t room = sizeof l->buf - l->used;
    int n = vsnprintf(l->buf + l->used, room, fmt, ap);
    va_end(ap);
    if (n < 0 || (size_t)n >= room) {
        return mmp_errorf(MMP_ERR_INVALID, "launcher: command line longer than %zu bytes",
                          sizeof l->buf);
    }
    l->argv[l->argc++] = l->buf + l->used;
    l->argv[l->argc] = NULL;
    l->used += (size_t)n + 1;
    return MMP_OK;
}

/* Appends s single-quoted for a POSIX shell to out (at *o, of n). */
static int quote(char *out, size_t n, size_t *o, const char *s)
{
    if (*o + 1 >= n) {
        return 0;
    }
    out[(*o)++] = '\'';
    for (; *s; s++) {
        const char *piece = *s == '\'' ? "'\\''" : NULL;
        size_t len = piece ? 4 : 1;
        if (*o + len + 2 >= n) {
            return 0;
        }
        if (piece) {
            memcpy(out + *o, piece, 4);
        } else {
            out[*o] = *s;
        }
        *o += len;
    }
    out[(*o)++] = '\'';
    out[*o] = 0;
    return 1;
}

/* The words after the binary: stage --connect EP ... */
static mmp_err stage_words(mmp_launch_line *l, const mmp_launch_stage *s, int secrets)
{
    MMP_TRY(push(l, "stage"));
    MMP_TRY(push(l, "--connect"));
    MMP_TRY(push(l, "%s", s->endpoint));
    MMP_TRY(push(l, "--stage"));
    MMP_TRY(push(l, "%s", s->stage));
    MMP_TRY(push(l, "--replica"));
    MMP_TRY(push(l, "%d", s->replica));
    MMP_TRY(push(l, "--shm-prefix"));
    MMP_TRY(push(l, "%s", s->shm_prefix));
    if (secrets) {
        MMP_TRY(push(l, "--secrets"));
        MMP_TRY(push(l, "stdin"));
    }
    if (s->pinned) {
        MMP_TRY(push(l, "--pin-index"));
        MMP_TRY(push(l, "%d", s->pin_index));
    }
    if (s->nice > 0) {
        MMP_TRY(push(l, "--nice"));
        MMP_TRY(push(l, "%d", s->nice));
    }
    return MMP_OK;
}

static const char *const forwarded[] = {"OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE"};

/* Whether "NAME=VALUE" names a forwarded variable with a value of
 * [A-Za-z0-9_.-] (what such values are), nothing else on a command line. */
static int forwardable(const char *kv)
{
    const char *eq = kv ? strchr(kv, '=') : NULL;
    if (!eq || !eq[1]) {
        return 0;
    }
    int known = 0;
    for (size_t i = 0; i < sizeof forwarded / sizeof forwarded[0]; i++) {
        known |= strlen(forwarded[i]) == (size_t)(eq - kv) &&
                 strncmp(kv, forwarded[i], (size_t)(eq - kv)) == 0;
    }
    for (const char *c = eq + 1; known && *c; c++) {
        known = isalnum((unsigned char)*c) || *c == '_' || *c == '.' || *c == '-';
    }
    return known && strlen(eq + 1) < 64;
}

int mmp_launch_forward_env(char *const *envp, const char **out, int cap)
{
    int n = 0;
    for (int i = 0; envp && envp[i] && n + 1 < cap; i++) {
        if (forwardable(envp[i])) {
            out[n++] = envp[i];
        }
    }
    if (cap > 0) {
        out[n] = NULL;
    }
    return n;
}

static mmp_err env_word(mmp_launch_line *l, const char *kv)
{
    if (!forwardable(kv)) {
        return mmp_errorf(MMP_ERR_INVALID, "launcher: '%.80s' is not a variable to forward", kv);
    }
    return push(l, "%s", kv);
}

/* Replaces {address} and {name} in one template word. */
static mmp_err template_word(mmp_launch_line *l, const char *w, size_t len, const mmp_host *h)
{
    char out[1024];
    size_t o = 0;
    for (size_t i = 0; i < len;) {
        const char *val = NULL;
        size_t skip = 1;
        if (strncmp(w + i, "{address}", 9) == 0 && i + 9 <= len) {
            val = h->address[0] ? h->address : h->name;
            skip = 9;
        } else if (strncmp(w + i, "{name}", 6) == 0 && i + 6 <= len) {
            val = h->name;
            skip = 6;
        }
        if (val && (!mmp_plan_address_ok(val))) {
            return mmp_errorf(MMP_ERR_INVALID,
                              "launcher_command: host '%s': '%s' cannot stand on a command line",
                              h->name, val);
        }
        size_t add = val ? strlen(val) : 1;
        if (o + add + 1 >= sizeof out) {
            return mmp_errorf(MMP_ERR_INVALID, "launcher_command: a word is too long");
        }
        memcpy(out + o, val ? val : w + i, add);
        o += add;
        i += skip;
    }
    out[o] = 0;
    return push(l, "%s", out);
}

/* The command a remote shell runs for stage s (ssh, agent): cd 'DIR' &&
 * exec [env 'K=V'...] 'BIN' stage ... --secrets stdin, every word quoted. */
static mmp_err remote_command(const mmp_launch_stage *s, const char *bin, const char *dir,
                              char *cmd, size_t cap)
{
    mmp_launch_line inner;
    memset(&inner, 0, sizeof inner);
    if (s->env && s->env[0]) {
        MMP_TRY(push(&inner, "env"));
        for (int i = 0; s->env[i]; i++) {
            MMP_TRY(env_word(&inner, s->env[i]));
        }
    }
    MMP_TRY(push(&inner, "%s", bin));
    MMP_TRY(stage_words(&inner, s, 1));
    size_t o = 0;
    int ok = snprintf(cmd, cap, "cd ") < (int)cap;
    o = 3;
    ok = ok && quote(cmd, cap, &o, dir);
    const char *mid = " && exec";
    ok = ok && o + strlen(mid) < cap;
    if (ok) {
        memcpy(cmd + o, mid, strlen(mid) + 1);
        o += strlen(mid);
    }
    for (int i = 0; ok && i < inner.argc; i++) {
        ok = o + 1 < cap;
        if (ok) {
            cmd[o++] = ' ';
            ok = quote(cmd, cap, &o, inner.argv[i]);
        }
    }
    if (!ok) {
        return mmp_errorf(MMP_ERR_INVALID, "launcher: remote command longer than %zu bytes", cap);
    }
    return MMP_OK;
}

mmp_err mmp_launch_line_build(mmp_launch_line *l, const mmp_plan *p, int host,
                              const mmp_launch_stage *s)
{
    memset(l, 0, sizeof *l);
    if (host < 0 || host >= p->n_hosts) {
        return mmp_errorf(MMP_ERR_INVALID, "launcher: no host %d", host);
    }
    const mmp_host *h = &p->hosts[host];
    const char *bin = h->binary[0] ? h->binary : s->exe;
    const char *dir = h->workdir[0] ? h->workdir : s->cwd;
    const char *checked[] = {s->endpoint, s->stage, s->shm_prefix, bin, dir};
    for (int i = 0; i < 5; i++) {
        if (!word_ok(checked[i])) {
            return mmp_errorf(MMP_ERR_INVALID,
                              "launcher: host '%s': '%s' cannot stand on a "
                              "command line",
                              h->name, checked[i] ? checked[i] : "(none)");
        }
    }
    if (s->replica < 0) {
        return mmp_errorf(MMP_ERR_INVALID, "launcher: replica %d", s->replica);
    }
    switch (p->launcher) {
    case MMP_LAUNCH_LOCAL:
        MMP_TRY(push(l, "%s", s->exe));
        return stage_words(l, s, s->secrets_stdin);
    case MMP_LAUNCH_SSH: {
        const char *t = p->launcher_command;
        while (*t) {
            while (*t == ' ') {
                t++;
            }
            size_t len = strcspn(t, " ");
            if (len) {
                MMP_TRY(template_word(l, t, len, h));
            }
            t += len;
        }
        if (l->argc == 0) {
            return mmp_errorf(MMP_ERR_INVALID, "launcher_command: empty");
        }
        char cmd[4096];
        MMP_TRY(remote_command(s, bin, dir, cmd, sizeof cmd));
        return push(l, "%s", cmd);
    }
    case MMP_LAUNCH_AGENT: {
        const char *addr = h->address[0] ? h->address : h->name;
        if (!mmp_plan_address_ok(addr) || !word_ok(p->agent.key_file)) {
            return mmp_errorf(MMP_ERR_INVALID,
                              "launcher: agent: host '%s' or key file '%s' cannot "
                              "stand on a command line",
                              addr, p->agent.key_file);
        }
        char cmd[4096];
        MMP_TRY(remote_command(s, bin, dir, cmd, sizeof cmd));
        MMP_TRY(push(l, "%s", s->exe));
        MMP_TRY(push(l, "rexec"));
        MMP_TRY(push(l, "--key-file"));
        MMP_TRY(push(l, "%s", p->agent.key_file));
        MMP_TRY(push(l, strchr(addr, ':') ? "[%s]:%d" : "%s:%d", addr, p->agent.port));
        return push(l, "%s", cmd);
    }
    case MMP_LAUNCH_SLURM: {
        const char *addr = h->address[0] ? h->address : h->name;
        if (!mmp_plan_address_ok(addr)) {
            return mmp_errorf(MMP_ERR_INVALID, "launcher: slurm: host '%s' is not a node name",
                              addr);
        }
        MMP_TRY(push(l, "srun"));
        MMP_TRY(push(l, "--nodes=1"));
        MMP_TRY(push(l, "--ntasks=1"));
        MMP_TRY(push(l, "--nodelist=%s", addr));
        MMP_TRY(push(l, "--overlap"));
        MMP_TRY(push(l, "--kill-on-bad-exit=1"));
        MMP_TRY(push(l, "--quiet"));
        MMP_TRY(push(l, "--job-name=mmpipe-%s", s->stage));
        MMP_TRY(push(l, "--chdir=%s", dir));
        MMP_TRY(push(l, "%s", bin));
        return stage_words(l, s, 1);
    }
    }
    return mmp_errorf(MMP_ERR_INVALID, "launcher %d", (int)p->launcher);
}

const char *mmp_launch_line_text(const mmp_launch_line *l, char *buf, size_t n)
{
    size_t o = 0;
    if (n == 0) {
        return buf;
    }
    buf[0] = 0;
    for (int i = 0; i < l->argc && o + 1 < n; i++) {
        int w = snprintf(buf + o, n - o, "%s%s", i ? " " : "", l->argv[i]);
        if (w < 0) {
            break;
        }
        o += (size_t)w;
    }
    return buf;
}

/* ---- the secrets line ---------------------------------------------------- */

#define KEY_LEN (MMP_CTL_KEY_CHARS - 1)

static const char Z85[] = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                          ".-:+=^!/*?&<>()[]{}@%$#";

/* The length of the run of characters of set at s. */
static size_t run_of(const char *s, const char *set)
{
    return strspn(s, set);
}

static int is_key(const char *s)
{
    return s && strlen(s) == KEY_LEN && run_of(s, Z85) == KEY_LEN;
}

mmp_err mmp_launch_secrets_format(const char *token, const mmp_ctl_keys *k, char *buf, size_t n)
{
    size_t tl = token ? strlen(token) : 0;
    if (tl == 0 || run_of(token, "0123456789abcdef") != tl || !is_key(k->server_public) ||
        !is_key(k->client_public) || !is_key(k->client_secret)) {
        return mmp_errorf(MMP_ERR_INVALID,
                          "secrets line: a token of [0-9a-f] and Z85 keys of %d "
                          "characters are needed",
                          KEY_LEN);
    }
    int w = snprintf(buf, n, "%s %s %s %s %s\n", MMP_LAUNCH_SECRETS_TAG, token, k->server_public,
                     k->client_public, k->client_secret);
    if (w < 0 || (size_t)w >= n) {
        return mmp_errorf(MMP_ERR_INVALID, "secrets line: %d bytes, more than %zu", w, n);
    }
    return MMP_OK;
}

mmp_err mmp_launch_secrets_parse(const char *line, char *token, size_t token_n, mmp_ctl_keys *k)
{
    static const char tag[] = MMP_LAUNCH_SECRETS_TAG " ";
    const char *s = line ? line : "";
    if (strncmp(s, tag, sizeof tag - 1) != 0) {
        return mmp_errorf(MMP_ERR_PROTO, "secrets line: does not start with '%s'", tag);
    }
    s += sizeof tag - 1;
    size_t tl = run_of(s, "0123456789abcdef");
    if (tl == 0 || tl >= token_n || s[tl] != ' ') {
        return mmp_errorf(MMP_ERR_PROTO,
                          "secrets line: the token is not 1..%zu characters [0-9a-f] then a space",
                          token_n ? token_n - 1 : 0);
    }
    const char *key[3];
    const char *p = s + tl + 1;
    for (int i = 0; i < 3; i++) {
        key[i] = p;
        if (run_of(p, Z85) != KEY_LEN || p[KEY_LEN] != (i < 2 ? ' ' : '\0')) {
            return mmp_errorf(MMP_ERR_PROTO,
                              "secrets line: key %d is not %d Z85 characters followed by %s", i + 1,
                              KEY_LEN, i < 2 ? "a space" : "the end of the line");
        }
        p += KEY_LEN + 1;
    }
    memcpy(token, s, tl);
    token[tl] = 0;
    char *dst[3] = {k->server_public, k->client_public, k->client_secret};
    for (int i = 0; i < 3; i++) {
        memcpy(dst[i], key[i], KEY_LEN);
        dst[i][KEY_LEN] = 0;
    }
    return MMP_OK;
}
