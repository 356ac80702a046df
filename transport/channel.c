/* Choosing a data-channel transport, the channel handle that carries its ops
 * (every call goes through it: direction and slot bounds checked here), and
 * the coordinator's crash clean-up of shm names.
 *
 * The choice depends only on can_connect() of each transport in priority
 * order, never on whether a setup happened to fail, so both ends of an edge
 * always pick the same transport. Must never: fall back to a later transport
 * after an earlier one failed to set up (the peer would not follow). */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "common/cuda_module.h"
#include "transport/channel.h"
#include "transport/reduce_nccl.h"
#include "transport/sock.h"

/* Highest priority first: nccl and cuda_ipc (the CUDA module's, build with
 * CUDA only), then shm and tcp. nccl and cuda_ipc accept only cfgs with
 * on_gpu set, so a host channel never looks at them: it reaches shm without
 * loading the module or touching the driver. shm and cuda_ipc take POSIX
 * names ("/..."), tcp and nccl "host:port": the address says which of each
 * two. */
static const char *const gpu_transports[] = {"mmp_transport_nccl", "mmp_transport_cuda_ipc"};
enum { N_GPU = sizeof gpu_transports / sizeof gpu_transports[0] };
static const mmp_transport *const host_transports[] = {
    &mmp_transport_shm,
    &mmp_transport_tcp,
};
enum { N_HOST = sizeof host_transports / sizeof host_transports[0] };

/* The transports a cfg's walk visits, in priority order, into list (room
 * for N_GPU + N_HOST); *n their count. An on_gpu edge in a CUDA build needs
 * the module: when it cannot load, that is the error (both ends of an edge
 * must see the same list, and a GPU stage has loaded it already for its
 * backend, so this is a broken install, not a choice). */
static mmp_err walk_list(const mmp_channel_cfg *cfg, const mmp_transport **list, size_t *n)
{
    *n = 0;
    if (cfg && cfg->on_gpu && mmp_cuda_module_built()) {
        for (int i = 0; i < N_GPU; i++) {
            MMP_TRY(mmp_transport_gpu(gpu_transports[i], &list[*n]));
            (*n)++;
        }
    }
    for (int i = 0; i < N_HOST; i++) {
        list[(*n)++] = host_transports[i];
    }
    return MMP_OK;
}

mmp_err mmp_channel_check_endpoint(const char *address)
{
    char hp[MMP_SOCK_ADDR_MAX], host[MMP_SOCK_ADDR_MAX];
    unsigned char id[MMP_NCCL_ID_BYTES];
    const char *a = address ? address : "";
    if (strstr(a, "#nccl")) {
        MMP_TRY(mmp_nccl_parse_address(a, hp, sizeof hp, id));
        a = hp;
    }
    int port = 0;
    if (mmp_sock_parse("endpoint", a, host, sizeof host, &port) != MMP_OK || port == 0) {
        return mmp_errorf(MMP_ERR_PROTO, "endpoint '%.300s': not host:port with a port 1..65535",
                          address ? address : "(null)");
    }
    return MMP_OK;
}

/* The handle: the transport's table travels with its state. */
struct mmp_channel {
    const mmp_transport *ops;
    mmp_channel_impl *impl;
    int send;
    size_t slot_bytes;
    unsigned char *acquired; /* sender: the acquired slot, NULL when none */
    char address[320];       /* cfg's, for messages */
};

static mmp_err wrong_end(const mmp_channel *ch, const char *call)
{
    return mmp_errorf(MMP_ERR_INVALID, "%s %s: %s on the %s end", ch->ops->name, ch->address, call,
                      ch->send ? "sending" : "receiving");
}

mmp_err mmp_channel_open_with(mmp_channel **out, const mmp_transport *t, const mmp_channel_cfg *cfg,
                              int creator)
{
    *out = NULL;
    if (!t || !cfg) {
        return mmp_errorf(MMP_ERR_INVALID, "channel open: no %s", t ? "cfg" : "transport");
    }
    mmp_channel *ch = calloc(1, sizeof *ch);
    if (!ch) {
        return mmp_errorf(MMP_ERR_NOMEM, "channel %s: handle",
                          cfg->address ? cfg->address : "(no address)");
    }
    mmp_err e = creator ? t->setup(&ch->impl, cfg) : t->connect(&ch->impl, cfg);
    if (e != MMP_OK) {
        free(ch);
        return e;
    }
    ch->ops = t;
    ch->send = cfg->send != 0;
    ch->slot_bytes = t->slot_bytes(ch->impl);
    const char *reported = t->address ? t->address(ch->impl) : NULL;
    snprintf(ch->address, sizeof ch->address, "%s",
             reported       ? reported
             : cfg->address ? cfg->address
                            : "(no address)");
    *out = ch;
    return MMP_OK;
}

mmp_err mmp_channel_open(mmp_channel **out, const char *name, const mmp_channel_cfg *cfg,
                         int creator)
{
    const char *addr = cfg && cfg->address ? cfg->address : "(no address)";
    int any = !name || !*name;
    *out = NULL;
    const mmp_transport *list[N_GPU + N_HOST];
    size_t n = 0;
    mmp_err le = walk_list(cfg, list, &n);
    if (le != MMP_OK) {
        return mmp_error_prefix(le, "channel %s (on the GPU)", addr);
    }
    for (size_t i = 0; i < n; i++) {
        const mmp_transport *t = list[i];
        const char *why = NULL;
        if (!any && strcmp(name, t->name) != 0) {
            MMP_DEBUG("channel %s: transport %s passed over: %s was asked for", addr, t->name,
                      name);
            continue;
        }
        if (!t->can_connect(cfg, &why)) {
            MMP_INFO("channel %s: transport %s passed over: %s", addr, t->name,
                     why ? why : "(no reason given)");
            continue;
        }
        mmp_err e = mmp_channel_open_with(out, t, cfg, creator);
        if (e != MMP_OK) {
            return mmp_error_prefix(e, "channel %s (%s %s)", addr, t->name,
                                    creator ? "setup" : "connect");
        }
        MMP_DEBUG("channel %s: %s %s, %d slots of %zu bytes", addr, t->name,
                  creator ? "set up" : "connected", cfg->slots, cfg->slot_bytes);
        return MMP_OK;
    }
    return mmp_errorf(MMP_ERR_UNSUPPORTED, "channel %s: no transport%s%s can join it", addr,
                      any ? "" : " named ", any ? "" : name);
}

void mmp_channel_close(mmp_channel *ch)
{
    if (!ch) {
        return;
    }
    ch->ops->close(ch->impl);
    free(ch);
}

const mmp_transport *mmp_channel_transport(const mmp_channel *ch)
{
    return ch->ops;
}

size_t mmp_channel_slot_bytes(const mmp_channel *ch)
{
    return ch->slot_bytes;
}

const char *mmp_channel_address(const mmp_channel *ch)
{
    const char *a = ch->ops->address ? ch->ops->address(ch->impl) : NULL;
    return a ? a : ch->address;
}

int mmp_channel_sends(const mmp_channel *ch)
{
    return ch->send;
}

/* ---- the sending half ---- */

mmp_err mmp_channel_acquire(mmp_channel *ch, void **slot)
{
    *slot = NULL;
    if (!ch->send) {
        return wrong_end(ch, "acquire");
    }
    void *p = NULL;
    MMP_TRY(ch->ops->acquire(ch->impl, &p));
    ch->acquired = p;
    *slot = p;
    return MMP_OK;
}

mmp_err mmp_channel_try_acquire(mmp_channel *ch, void **slot)
{
    *slot = NULL;
    if (!ch->send) {
        return wrong_end(ch, "acquire");
    }
    if (!ch->ops->try_acquire) {
        return MMP_ERR_TIMEOUT;
    }
    void *p = NULL;
    MMP_TRY(ch->ops->try_acquire(ch->impl, &p));
    ch->acquired = p;
    *slot = p;
    return MMP_OK;
}

int mmp_channel_host_slots(const mmp_channel *ch)
{
    return (ch->ops->caps & MMP_TRANSPORT_DEVICE_SLOTS) == 0;
}

mmp_err mmp_channel_fill(mmp_channel *ch, void *dst, const void *src, size_t bytes)
{
    if (!ch->send) {
        return wrong_end(ch, "fill");
    }
    if (!ch->acquired) {
        return mmp_errorf(MMP_ERR_INVALID, "%s %s: fill without an acquired slot", ch->ops->name,
                          ch->address);
    }
    const unsigned char *d = dst;
    if (d < ch->acquired || (size_t)(d - ch->acquired) > ch->slot_bytes ||
        bytes > ch->slot_bytes - (size_t)(d - ch->acquired)) {
        return mmp_errorf(MMP_ERR_INVALID,
                          "%s %s: fill of %zu bytes outside the acquired %zu-byte slot",
                          ch->ops->name, ch->address, bytes, ch->slot_bytes);
    }
    if (bytes == 0) {
        return MMP_OK;
    }
    if (!src) {
        return mmp_errorf(MMP_ERR_INVALID, "%s %s: fill of %zu bytes from NULL", ch->ops->name,
                          ch->address, bytes);
    }
    if (ch->ops->fill) {
        return ch->ops->fill(ch->impl, dst, src, bytes);
    }
    memcpy(dst, src, bytes);
    return MMP_OK;
}

mmp_err mmp_channel_post(mmp_channel *ch, const mmp_msg_header *h)
{
    if (!ch->send) {
        return wrong_end(ch, "post");
    }
    MMP_TRY(ch->ops->post(ch->impl, h));
    ch->acquired = NULL;
    return MMP_OK;
}

mmp_err mmp_channel_send(mmp_channel *ch, const mmp_msg_header *h, const void *payload)
{
    if (!ch->send) {
        return wrong_end(ch, "send");
    }
    size_t cap = ch->slot_bytes;
    if (h->bytes > cap) {
        return mmp_errorf(MMP_ERR_INVALID, "channel send: %llu bytes into %zu-byte slots",
                          (unsigned long long)h->bytes, cap);
    }
    if (h->bytes > 0 && !payload) {
        return mmp_errorf(MMP_ERR_INVALID, "channel send: %llu bytes from a NULL payload",
                          (unsigned long long)h->bytes);
    }
    void *slot;
    MMP_TRY(mmp_channel_acquire(ch, &slot));
    MMP_TRY(mmp_channel_fill(ch, slot, payload, (size_t)h->bytes));
    return mmp_channel_post(ch, h);
}

mmp_err mmp_channel_sendv(mmp_channel *ch, const char *what, mmp_msg_header h,
                          const mmp_channel_seg *segs, int n_segs)
{
    if (!ch->send) {
        return wrong_end(ch, "send");
    }
    size_t cap = ch->slot_bytes, total = 0;
    for (int i = 0; i < n_segs; i++) {
        if (segs[i].bytes > cap - total) {
            return mmp_errorf(MMP_ERR_INVALID,
                              "channel %s send: step %d micro-batch %d: segment %d takes the "
                              "message past the %zu-byte slot",
                              what, h.step, h.mb, i, cap);
        }
        if (segs[i].bytes > 0 && !segs[i].p) {
            return mmp_errorf(MMP_ERR_INVALID, "channel %s send: segment %d is NULL", what, i);
        }
        total += segs[i].bytes;
    }
    h.bytes = total;
    void *slot;
    MMP_TRY(mmp_channel_acquire(ch, &slot));
    size_t off = 0;
    for (int i = 0; i < n_segs; i++) {
        if (segs[i].bytes == 0) {
            continue;
        }
        MMP_TRY(mmp_channel_fill(ch, (unsigned char *)slot + off, segs[i].p, segs[i].bytes));
        off += segs[i].bytes;
    }
    return mmp_channel_post(ch, &h);
}

/* ---- the receiving half ---- */

mmp_err mmp_channel_recv(mmp_channel *ch, mmp_msg_header *h, const void **payload)
{
    *payload = NULL;
    if (ch->send) {
        return wrong_end(ch, "recv");
    }
    return ch->ops->recv(ch->impl, h, payload);
}

mmp_err mmp_channel_read(mmp_channel *ch, void *dst, const void *src, size_t bytes)
{
    if (ch->send) {
        return wrong_end(ch, "read");
    }
    if (bytes == 0) {
        return MMP_OK;
    }
    if (!dst || !src) {
        return mmp_errorf(MMP_ERR_INVALID, "%s %s: read of %zu bytes %s NULL", ch->ops->name,
                          ch->address, bytes, dst ? "from" : "into");
    }
    if (ch->ops->read) {
        return ch->ops->read(ch->impl, dst, src, bytes);
    }
    memcpy(dst, src, bytes);
    return MMP_OK;
}

mmp_err mmp_channel_release(mmp_channel *ch)
{
    if (ch->send) {
        return wrong_end(ch, "release");
    }
    return ch->ops->release(ch->impl);
}

mmp_err mmp_msg_check(const char *what, const mmp_msg_header *h, size_t slot_bytes)
{
    const int32_t known = MMP_MSG_EVAL | MMP_MSG_STOP | MMP_MSG_ALL_VALID;
    if (h->bytes > slot_bytes) {
        return mmp_errorf(MMP_ERR_PROTO,
                          "channel %s: header field bytes = %llu, over the %zu-byte slot", what,
                          (unsigned long long)h->bytes, slot_bytes);
    }
    if (h->flags & ~known) {
        return mmp_errorf(MMP_ERR_PROTO,
                          "channel %s: header field flags = %#x, unknown bits (known %#x)", what,
                          (unsigned)h->flags, (unsigned)known);
    }
    if ((h->flags & MMP_MSG_STOP) && h->bytes != 0) {
        return mmp_errorf(MMP_ERR_PROTO,
                          "channel %s: header field bytes = %llu on a STOP message (limit 0)", what,
                          (unsigned long long)h->bytes);
    }
    if (h->step < 0 || h->mb < 0 || h->n < 0) {
        const char *f = h->step < 0 ? "step" : h->mb < 0 ? "mb" : "n";
        int v = h->step < 0 ? h->step : h->mb < 0 ? h->mb : h->n;
        return mmp_errorf(MMP_ERR_PROTO, "channel %s: header field %s = %d, below 0", what, f, v);
    }
    return MMP_OK;
}

/* getdents64's record (linux/dirent.h names it linux_dirent64) */
struct shm_dirent64 {
    unsigned long long ino;
    long long off;
    unsigned short reclen;
    unsigned char type;
    char name[];
};

/* The /dev/shm name prefix of a segment prefix (glibc's shm_open("/x") is
 * /dev/shm/x), or NULL for one that is empty (it would remove every segment
 * on the host) or holds another '/'. Signal-safe (strchr). */
static const char *shm_file_prefix(const char *prefix)
{
    const char *p = prefix && prefix[0] == '/' ? prefix + 1 : prefix;
    return p && *p && !strchr(p, '/') ? p : NULL;
}

void mmp_shm_unlink_prefix_signal_safe(const char *prefix)
{
    const char *p = shm_file_prefix(prefix);
    if (!p) {
        return;
    }
    const size_t n = strlen(p);
    int dir = open("/dev/shm", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dir < 0) {
        return;
    }
    char buf[4096] __attribute__((aligned(8)));
    long got;
    while ((got = syscall(SYS_getdents64, dir, buf, sizeof buf)) > 0) {
        for (long at = 0; at < got;) {
            const struct shm_dirent64 *d = (const struct shm_dirent64 *)(buf + at);
            if (strncmp(d->name, p, n) == 0) {
                (void)unlinkat(dir, d->name, 0);
            }
            at += d->reclen;
        }
    }
    close(dir);
}

int mmp_shm_unlink_prefix(const char *prefix)
{
    const char *p = shm_file_prefix(prefix);
    if (!p) {
        MMP_WARN("shm clean-up: refusing prefix '%s'", prefix ? prefix : "(null)");
        return 0;
    }
    DIR *d = opendir("/dev/shm");
    if (!d) {
        MMP_WARN("shm clean-up: /dev/shm: %s", strerror(errno));
        return 0;
    }
    size_t n = strlen(p);
    int removed = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (strncmp(e->d_name, p, n) != 0) {
            continue;
        }
        char name[sizeof e->d_name + 1];
        snprintf(name, sizeof name, "/%s", e->d_name);
        if (shm_unlink(name) == 0) {
            MMP_INFO("shm clean-up: removed %s", name);
            removed++;
        } else if (errno != ENOENT) {
            MMP_WARN("shm clean-up: %s: %s", name, strerror(errno));
        }
    }
    closedir(d);
    return removed;
}
