/* The CUDA emulator (include/mmp_cuda_emu.h says what it models and what
 * it finds): device memory, the runtime calls, the kernel launcher with its
 * fibers, and cuBLAS's and cuDNN's calls as plain loops. */
#include "mmp_cuda_emu.h"

#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <fcntl.h>
#include <sys/mman.h>
#if !defined(__x86_64__)
#include <ucontext.h>
#endif
#include <unistd.h>

#include <deque>
#include <mutex>
#include <map>
#include <vector>

/* EMU_ASAN: the process runs under AddressSanitizer (this file itself is
 * built without it there: its loops are the emulated libraries', which the
 * allocation checks here cover). */
#if defined(__SANITIZE_ADDRESS__) || defined(MMP_EMU_ASAN)
#define EMU_ASAN 1
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#else
#define EMU_ASAN 0
#endif

uint3 threadIdx, blockIdx;
dim3 blockDim, gridDim;

namespace
{

/* What the emulator is doing, for its reports: a kernel's name or an API
 * call's. */
const char *doing = "host code";
/* The thread running, while a kernel runs (else -1). */
int cur_thread = -1;

[[noreturn]] void die(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "cuda emulator: ");
    if (cur_thread >= 0) {
        fprintf(stderr, "kernel %s, block (%u,%u,%u), thread (%u,%u,%u): ", doing, blockIdx.x,
                blockIdx.y, blockIdx.z, threadIdx.x, threadIdx.y, threadIdx.z);
    } else {
        fprintf(stderr, "%s: ", doing);
    }
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    abort();
}

/* ---- device memory --------------------------------------------------------
 * Without AddressSanitizer each allocation has pages of its own, its bytes
 * ending 256-byte aligned just before a page nothing may touch, and every
 * allocation is PROT_NONE outside the emulator's calls: host code that
 * reads device memory, and a kernel that runs past an allocation's end by
 * more than its rounding, fault at once (the SIGSEGV handler names where).
 * Under AddressSanitizer allocations are malloc's, with its red zones. */
struct allocation {
    size_t bytes;   /* as asked */
    char *map;      /* the mapping (no ASan) */
    size_t map_len; /* its length, the guard page included */
    int fd;         /* the memfd behind the data pages (no ASan; -1 once imported) */
    bool imported;  /* mapped from another process's handle (cudaIpcOpenMemHandle) */
};
std::map<uintptr_t, allocation> device; /* by base */
int access_depth;                       /* > 0 while the emulator may touch device memory */
const size_t page = (size_t)sysconf(_SC_PAGESIZE);

void protect(const allocation &a, int prot)
{
    if (!EMU_ASAN && mprotect(a.map, a.map_len - page, prot) != 0) {
        die("mprotect: %s", strerror(errno));
    }
}

/* One thread in the emulator at a time (a stage's loader thread uploads
 * while its main thread computes): every entry takes this. */
std::recursive_mutex emu_lock;

/* `doing` names call `what` for the life of one of these (the reports'). */
struct in_call {
    explicit in_call(const char *what) : saved(doing)
    {
        doing = what;
    }
    ~in_call()
    {
        doing = saved;
    }
    const char *saved;
};

/* Device memory readable and writable for the life of one of these. */
struct device_access {
    explicit device_access(const char *what) : hold(emu_lock), call(what)
    {
        if (access_depth++ == 0) {
            for (auto &d : device) {
                protect(d.second, PROT_READ | PROT_WRITE);
            }
        }
    }
    ~device_access()
    {
        if (--access_depth == 0) {
            for (auto &d : device) {
                protect(d.second, PROT_NONE);
            }
        }
    }
    std::lock_guard<std::recursive_mutex> hold;
    in_call call;
};

/* The allocation holding [p, p + bytes), or NULL; *base (when given) its
 * start. */
const allocation *device_range(const void *p, size_t bytes, uintptr_t *base = nullptr)
{
    const uintptr_t u = (uintptr_t)p;
    auto it = device.upper_bound(u);
    if (it == device.begin()) {
        return nullptr;
    }
    --it;
    if (u - it->first > it->second.bytes || bytes > it->second.bytes - (u - it->first)) {
        return nullptr;
    }
    if (base) {
        *base = it->first;
    }
    return &it->second;
}
bool is_device(const void *p)
{
    return device_range(p, 0) != nullptr;
}

thread_local cudaError_t last_error = cudaSuccess;
cudaError_t fail(cudaError_t e, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "cuda emulator: %s: ", doing);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    last_error = e;
    return e;
}

void on_segv(int sig, siginfo_t *si, void *)
{
    char msg[512];
    const uintptr_t a = (uintptr_t)si->si_addr;
    const char *near = "";
    for (auto &d : device) {
        const uintptr_t end = d.first + d.second.bytes;
        if (a >= end && a < end + page) {
            near = " (just past the end of a device allocation)";
        } else if (a >= d.first && a < end) {
            near = " (device memory, read outside a kernel or an emulated call: host code "
                   "touched device memory)";
        }
    }
    int n;
    if (cur_thread >= 0) {
        n = snprintf(msg, sizeof msg,
                     "cuda emulator: kernel %s, block (%u,%u,%u), thread (%u,%u,%u): invalid "
                     "address %p%s\n",
                     doing, blockIdx.x, blockIdx.y, blockIdx.z, threadIdx.x, threadIdx.y,
                     threadIdx.z, si->si_addr, near);
    } else {
        n = snprintf(msg, sizeof msg, "cuda emulator: %s: invalid address %p%s\n", doing,
                     si->si_addr, near);
    }
    if (n > 0) {
        ssize_t w = write(2, msg, (size_t)n < sizeof msg ? (size_t)n : sizeof msg - 1);
        (void)w;
    }
    signal(sig, SIG_DFL);
    raise(sig);
}

void install_segv(void)
{
    static bool done;
    if (done || EMU_ASAN) {
        return;
    }
    done = true;
    static char alt[1 << 16];
    stack_t ss = {};
    ss.ss_sp = alt;
    ss.ss_size = sizeof alt;
    sigaltstack(&ss, nullptr);
    struct sigaction sa = {};
    sa.sa_sigaction = on_segv;
    sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
    sigaction(SIGSEGV, &sa, nullptr);
    sigaction(SIGBUS, &sa, nullptr);
}

/* Maps the data pages of an allocation of bytes: `fd`'s pages (shared, an
 * IPC handle's importer maps them too) ending one page before a guard page,
 * base 256-byte aligned so that the bytes end where the rounding to 256
 * does. */
cudaError_t map_pages(allocation &a, int fd, size_t bytes, char **base)
{
    const size_t rounded = (bytes + 255) & ~(size_t)255;
    const size_t data_pages = (rounded + page - 1) / page * page;
    a.map_len = data_pages + page;
    a.map = (char *)mmap(nullptr, a.map_len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (a.map == MAP_FAILED) {
        return fail(cudaErrorMemoryAllocation, "%zu bytes: mmap: %s", bytes, strerror(errno));
    }
    const int prot = access_depth > 0 ? PROT_READ | PROT_WRITE : PROT_NONE;
    if (mmap(a.map, data_pages, prot, MAP_SHARED | MAP_FIXED, fd, 0) == MAP_FAILED) {
        const int e = errno;
        munmap(a.map, a.map_len);
        return fail(cudaErrorMemoryAllocation, "%zu bytes: mmap of the memfd: %s", bytes,
                    strerror(e));
    }
    *base = a.map + data_pages - rounded;
    return cudaSuccess;
}

cudaError_t device_alloc(void **p, size_t bytes)
{
    std::lock_guard<std::recursive_mutex> hold(emu_lock);
    *p = nullptr;
    install_segv();
    if (bytes > ((size_t)1 << 40)) {
        return fail(cudaErrorMemoryAllocation,
                    "cudaMalloc(%zu bytes): more than the emulator holds", bytes);
    }
    const size_t rounded = (bytes + 255) & ~(size_t)255;
    allocation a = {bytes, nullptr, 0, -1, false};
    char *base;
    if (EMU_ASAN) {
        /* exactly bytes: a read one past them is ASan's to report (as
         * compute-sanitizer's memcheck would) */
        void *m = nullptr;
        if (posix_memalign(&m, 256, bytes ? bytes : 1) != 0) {
            return fail(cudaErrorMemoryAllocation, "cudaMalloc(%zu bytes)", bytes);
        }
        base = (char *)m;
    } else {
        const size_t data_pages = (rounded + page - 1) / page * page;
        a.fd = memfd_create("mmpipe-cuda-emu", MFD_CLOEXEC);
        if (a.fd < 0 || ftruncate(a.fd, (off_t)(data_pages ? data_pages : page)) != 0) {
            const int e = errno;
            if (a.fd >= 0) {
                close(a.fd);
            }
            return fail(cudaErrorMemoryAllocation, "cudaMalloc(%zu bytes): memfd: %s", bytes,
                        strerror(e));
        }
        cudaError_t ce = map_pages(a, a.fd, bytes ? bytes : 1, &base);
        if (ce != cudaSuccess) {
            close(a.fd);
            return ce;
        }
    }
    device[(uintptr_t)base] = a;
    {
        device_access rw(doing);
        memset(base, 0xff, EMU_ASAN ? bytes : rounded); /* what nothing wrote reads as NaN */
    }
    *p = base;
    return cudaSuccess;
}

cudaError_t device_free(void *p)
{
    std::lock_guard<std::recursive_mutex> hold(emu_lock);
    if (!p) {
        return cudaSuccess;
    }
    auto it = device.find((uintptr_t)p);
    if (it == device.end() || it->second.imported) {
        return fail(cudaErrorInvalidValue, "cudaFree(%p): not a device allocation%s", p,
                    it != device.end() ? " of this process (cudaIpcCloseMemHandle unmaps it)"
                    : is_device(p)     ? " (inside one, not its start)"
                                       : "");
    }
    if (EMU_ASAN) {
        free(p);
    } else {
        munmap(it->second.map, it->second.map_len);
        close(it->second.fd);
    }
    device.erase(it);
    return cudaSuccess;
}

/* ---- fibers and the launcher ------------------------------------------------
 * A thread of a block is a fiber: a stack of its own, switched to and from
 * by mmp_emu_switch (x86-64: callee-saved registers and the FPU/SSE control
 * words, no system call), or by ucontext elsewhere. The scheduler, on the
 * process's own stack, resumes the lowest runnable thread (the highest, in
 * a descending block) until none is left; a thread runs until it waits at a
 * barrier or a warp operation, or ends. */
enum fiber_state { RUNNABLE, WAIT_BAR, WAIT_WARP, DONE };
struct fiber {
    fiber() = default;
    fiber(const fiber &) = delete;
    ~fiber()
    {
        free(stack);
    }
    char *stack = nullptr;
    fiber_state state;
#if defined(__x86_64__)
    void *sp; /* saved while it is not running */
#else
    ucontext_t ctx;
#endif
#if EMU_ASAN
    void *fake_stack;
#endif
};
struct warp {
    unsigned mask;    /* of the operation under way */
    unsigned arrived; /* lanes that reached it */
    unsigned exited;
    uint64_t slot[32];
};

const size_t stack_bytes = EMU_ASAN ? (256u << 10) : (64u << 10);
/* a deque: elements never move (a ucontext_t points into itself) */
std::deque<fiber> fibers;
std::vector<warp> warps;
std::vector<uint64_t> runnable; /* one bit per thread of the block */
int n_threads, alive, bar_arrived;
bool descending;
void (*cur_body)(void *);
void *cur_arg;
#if EMU_ASAN
const void *main_stack;
size_t main_stack_size;
#endif

unsigned long long block_epoch; /* counts blocks run, for shared_poison */
std::map<void *, unsigned long long> shared_seen;

#if defined(__x86_64__)
/* mmp_emu_switch(&save, to): saves the caller's callee-saved registers, its
 * MXCSR and x87 control word on its stack and its stack pointer in *save,
 * then resumes the stack `to` (saved the same way, or made by first_frame). */
extern "C" void mmp_emu_switch(void **save, void *to);
asm(R"(
    .text
    .p2align 4
    .type mmp_emu_switch, @function
mmp_emu_switch:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    subq $8, %rsp
    stmxcsr (%rsp)
    fnstcw 4(%rsp)
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    ldmxcsr (%rsp)
    fldcw 4(%rsp)
    addq $8, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
    .size mmp_emu_switch, .-mmp_emu_switch
)");
void *sched_sp;
#else
ucontext_t sched;
#endif

void fiber_main(void);

/* Makes f start fiber_main when next resumed. */
void fiber_reset(fiber &f)
{
#if EMU_ASAN
    /* The frames of the thread that ran here last are gone. Those that
     * returned took their red zones with them; the ones that never return
     * (fiber_main's, fiber_leave's) are the stack's first few hundred
     * bytes, so the top 8 KiB is all that can still be poisoned. */
    __asan_unpoison_memory_region(f.stack + stack_bytes - 8192, 8192);
#endif
#if defined(__x86_64__)
    /* what mmp_emu_switch pops: control words, six registers, then the
     * return address, fiber_main, entered as if called (rsp = 8 mod 16) */
    uintptr_t top = ((uintptr_t)f.stack + stack_bytes) & ~(uintptr_t)15;
    uint64_t *frame = (uint64_t *)(top - 72);
    memset(frame, 0, 72);
    const uint32_t mxcsr = 0x1f80;
    const uint16_t fcw = 0x037f;
    memcpy(frame, &mxcsr, 4);
    memcpy((char *)frame + 4, &fcw, 2);
    frame[7] = (uint64_t)(uintptr_t)fiber_main;
    f.sp = frame;
#else
    f.ctx.uc_stack.ss_sp = f.stack;
    f.ctx.uc_stack.ss_size = stack_bytes;
    f.ctx.uc_link = nullptr;
    makecontext(&f.ctx, fiber_main, 0);
#endif
}

/* The scheduler runs fiber f until it waits or ends. */
void fiber_resume(fiber &f)
{
#if EMU_ASAN
    void *save = nullptr;
    __sanitizer_start_switch_fiber(&save, f.stack, stack_bytes);
#endif
#if defined(__x86_64__)
    mmp_emu_switch(&sched_sp, f.sp);
#else
    swapcontext(&sched, &f.ctx);
#endif
#if EMU_ASAN
    __sanitizer_finish_switch_fiber(save, nullptr, nullptr);
#endif
}

/* The running fiber f goes back to the scheduler: to be resumed (done
 * false) or never again (done true). */
void fiber_leave(fiber &f, bool done)
{
#if EMU_ASAN
    __sanitizer_start_switch_fiber(done ? nullptr : &f.fake_stack, main_stack, main_stack_size);
#endif
#if defined(__x86_64__)
    (void)done;
    mmp_emu_switch(&f.sp, sched_sp);
#else
    if (done) {
        setcontext(&sched);
    }
    swapcontext(&f.ctx, &sched);
#endif
#if EMU_ASAN
    __sanitizer_finish_switch_fiber(f.fake_stack, nullptr, nullptr);
#endif
}

void set_state(int t, fiber_state s)
{
    fibers[(size_t)t].state = s;
    uint64_t &word = runnable[(size_t)t / 64];
    const uint64_t bit = (uint64_t)1 << (t % 64);
    word = s == RUNNABLE ? word | bit : word & ~bit;
}

/* The next thread to run, or -1. */
int next_runnable(void)
{
    const int words = (int)runnable.size();
    for (int i = 0; i < words; i++) {
        const int w = descending ? words - 1 - i : i;
        const uint64_t v = runnable[(size_t)w];
        if (v) {
            return 64 * w + (descending ? 63 - __builtin_clzll(v) : __builtin_ctzll(v));
        }
    }
    return -1;
}

void bar_check(void)
{
    if (bar_arrived > 0 && bar_arrived == alive) {
        for (int t = 0; t < n_threads; t++) {
            if (fibers[(size_t)t].state == WAIT_BAR) {
                set_state(t, RUNNABLE);
            }
        }
        bar_arrived = 0;
    }
}

/* Lanes of warp w that exist (the last warp of a block may be partial). */
unsigned lanes_of(int w)
{
    const int n = n_threads - 32 * w;
    return n >= 32 ? 0xffffffffu : (1u << n) - 1;
}

void fiber_main(void)
{
#if EMU_ASAN
    __sanitizer_finish_switch_fiber(nullptr, &main_stack, &main_stack_size);
#endif
    cur_body(cur_arg);
    set_state(cur_thread, DONE);
    alive--;
    warp &w = warps[(size_t)cur_thread / 32];
    const unsigned bit = 1u << (cur_thread % 32);
    w.exited |= bit;
    if (w.arrived && (w.mask & bit)) {
        die("exited while lanes of its warp wait for it in a warp operation (mask %08x)", w.mask);
    }
    bar_check();
    fiber_leave(fibers[(size_t)cur_thread], true);
    die("a thread that ended was resumed");
}

/* The calling thread waits (its state already says for what). */
void yield(void)
{
    fiber_leave(fibers[(size_t)cur_thread], false);
}

void set_ids(int t)
{
    const unsigned bx = blockDim.x, by = blockDim.y;
    threadIdx.x = (unsigned)t % bx;
    threadIdx.y = (unsigned)t / bx % by;
    threadIdx.z = (unsigned)t / (bx * by);
}

/* Runs the block blockIdx: the lowest runnable thread first (the highest,
 * descending), so a thread and its warp run as far ahead of the others as
 * the barriers let them, and a write that one barrier too few separates
 * from another thread's read lands before that read. */
void run_block(bool desc)
{
    block_epoch++;
    descending = desc;
    alive = n_threads;
    bar_arrived = 0;
    runnable.assign((size_t)(n_threads + 63) / 64, 0);
    for (int t = 0; t < n_threads; t++) {
        fiber_reset(fibers[(size_t)t]);
        set_state(t, RUNNABLE);
    }
    for (auto &w : warps) {
        w = warp{};
    }
    for (int t; (t = next_runnable()) >= 0;) {
        cur_thread = t;
        set_ids(t);
        fiber_resume(fibers[(size_t)t]);
    }
    if (alive > 0) {
        int at_bar = 0, at_warp = 0, first = -1;
        for (int t = 0; t < n_threads; t++) {
            at_bar += fibers[(size_t)t].state == WAIT_BAR;
            at_warp += fibers[(size_t)t].state == WAIT_WARP;
            if (first < 0 && fibers[(size_t)t].state != DONE) {
                first = t;
            }
        }
        cur_thread = first;
        set_ids(first);
        die("deadlock: %d threads wait at __syncthreads and %d in warp operations, %d exited, "
            "none can go on (a barrier not every thread reaches?)",
            at_bar, at_warp, n_threads - at_bar - at_warp);
    }
    cur_thread = -1;
}

/* The calling thread waits until every lane of mask has called this (two
 * calls of an exchange: its values are written, then read). */
void warp_sync(unsigned mask)
{
    if (cur_thread < 0) {
        die("a warp operation outside a kernel");
    }
    const int lane = cur_thread % 32, wi = cur_thread / 32;
    warp &w = warps[(size_t)wi];
    const unsigned bit = 1u << lane;
    if (!(mask & bit)) {
        die("a warp operation with mask %08x, which leaves out its own lane %d", mask, lane);
    }
    if (mask & ~lanes_of(wi)) {
        die("a warp operation with mask %08x names lanes the block does not have (%08x exist)",
            mask, lanes_of(wi));
    }
    if (mask & w.exited) {
        die("a warp operation with mask %08x names lanes that exited (%08x)", mask,
            mask & w.exited);
    }
    if (w.arrived && w.mask != mask) {
        die("lanes of one warp call a warp operation with different masks (%08x, %08x)", w.mask,
            mask);
    }
    w.mask = mask;
    w.arrived |= bit;
    if (w.arrived == mask) {
        for (int l = 0; l < 32; l++) {
            fiber &f = fibers[(size_t)(32 * wi + l)];
            if ((mask >> l & 1u) && f.state == WAIT_WARP) {
                set_state(32 * wi + l, RUNNABLE);
            }
        }
        w.arrived = 0;
        return;
    }
    set_state(cur_thread, WAIT_WARP);
    yield();
}

cudaError_t check_config(const mmp_emu::config &c)
{
    const dim3 &g = c.grid, &b = c.block;
    const unsigned long long threads = (unsigned long long)b.x * b.y * b.z;
    if (g.x == 0 || g.y == 0 || g.z == 0 || b.x == 0 || b.y == 0 || b.z == 0) {
        return fail(cudaErrorInvalidConfiguration, "grid (%u,%u,%u), block (%u,%u,%u): empty", g.x,
                    g.y, g.z, b.x, b.y, b.z);
    }
    if (threads > 1024 || b.x > 1024 || b.y > 1024 || b.z > 64) {
        return fail(cudaErrorInvalidConfiguration, "block (%u,%u,%u): over the hardware's limits",
                    b.x, b.y, b.z);
    }
    if (g.x > 2147483647u || g.y > 65535 || g.z > 65535) {
        return fail(cudaErrorInvalidConfiguration, "grid (%u,%u,%u): over the hardware's limits",
                    g.x, g.y, g.z);
    }
    if (c.smem > 48 * 1024) {
        return fail(cudaErrorInvalidConfiguration,
                    "%zu bytes of dynamic shared memory without cudaFuncSetAttribute", c.smem);
    }
    return cudaSuccess;
}

/* ---- host waits -----------------------------------------------------------
 * What makes a GPU's host thread wait for the device: stream, event and
 * device synchronisation (cudaFree's too), the blocking cudaMemcpy, and an "async" copy whose
 * host side is pageable (not cudaHostAlloc memory: the driver stages it and
 * the call returns only when the copy is done). Counted per kind; with
 * MMP_EMU_HOST_WAITS=FILE each process appends one line there at exit,
 * naming its stage (its --stage and --replica arguments; "-" for another
 * process), so a test can hold a stage's waits per step to a bound. */
enum wait_kind { WAIT_STREAM, WAIT_EVENT, WAIT_DEVICE, WAIT_MEMCPY, WAIT_PAGEABLE, WAIT_KINDS };
long host_waits[WAIT_KINDS];
std::map<uintptr_t, size_t> pinned; /* cudaHostAlloc memory: base -> bytes */

bool is_pinned(const void *p)
{
    uintptr_t a = (uintptr_t)p;
    auto it = pinned.upper_bound(a);
    return it != pinned.begin() && a < (--it)->first + it->second;
}

void host_wait(wait_kind k)
{
    std::lock_guard<std::recursive_mutex> hold(emu_lock);
    host_waits[k]++;
}

/* This process's stage, "image.0/1", from its command line; "-" for none. */
void stage_name(char *out, size_t n)
{
    char args[4096] = {0}, stage[64] = "-", replica[16] = "0";
    int fd = open("/proc/self/cmdline", O_RDONLY | O_CLOEXEC);
    ssize_t len = fd >= 0 ? read(fd, args, sizeof args - 1) : -1;
    if (fd >= 0) {
        close(fd);
    }
    for (ssize_t i = 0; i < len;) {
        const char *a = args + i;
        size_t al = strlen(a);
        const char *next = i + (ssize_t)al + 1 < len ? a + al + 1 : "";
        if (strcmp(a, "--stage") == 0) {
            snprintf(stage, sizeof stage, "%s", next);
        } else if (strcmp(a, "--replica") == 0) {
            snprintf(replica, sizeof replica, "%s", next);
        }
        i += (ssize_t)al + 1;
    }
    snprintf(out, n, strcmp(stage, "-") ? "%s/%s" : "%s", stage, replica);
}

struct wait_report {
    ~wait_report()
    {
        const char *path = getenv("MMP_EMU_HOST_WAITS");
        if (!path || !path[0]) {
            return;
        }
        char name[96];
        stage_name(name, sizeof name);
        int fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0600);
        if (fd >= 0) {
            dprintf(fd, "stage=%s pid=%d stream=%ld event=%ld device=%ld memcpy=%ld pageable=%ld\n",
                    name, (int)getpid(), host_waits[WAIT_STREAM], host_waits[WAIT_EVENT],
                    host_waits[WAIT_DEVICE], host_waits[WAIT_MEMCPY], host_waits[WAIT_PAGEABLE]);
            close(fd);
        }
    }
} report_at_exit;

} // namespace

namespace mmp_emu
{

void run_grid(const char *kernel, const config &c, void (*body)(void *), void *arg)
{
    if (cur_thread >= 0) {
        die("a launch from inside a kernel");
    }
    device_access rw(kernel);
    if (check_config(c) != cudaSuccess) {
        return;
    }
    gridDim = c.grid;
    blockDim = c.block;
    n_threads = (int)(c.block.x * c.block.y * c.block.z);
    while (fibers.size() < (size_t)n_threads) {
        fibers.emplace_back();
        fiber &f = fibers.back();
        f.stack = (char *)malloc(stack_bytes);
        if (!f.stack) {
            die("no memory for a thread's stack");
        }
#if !defined(__x86_64__)
        if (getcontext(&f.ctx) != 0) {
            die("getcontext: %s", strerror(errno));
        }
#endif
    }
    warps.resize((size_t)(n_threads + 31) / 32);
    cur_body = body;
    cur_arg = arg;
    /* Blocks from the last to the first: a GPU tends to start them in
     * order, so a block that reads what a lower block writes, which nothing
     * orders, tends to work there; here it reads what that block has not
     * written yet. */
    const unsigned long long blocks = (unsigned long long)c.grid.x * c.grid.y * c.grid.z;
    for (unsigned long long b = blocks; b-- > 0;) {
        blockIdx = uint3{(unsigned)(b % c.grid.x), (unsigned)(b / c.grid.x % c.grid.y),
                         (unsigned)(b / ((unsigned long long)c.grid.x * c.grid.y))};
        run_block(b % 2 == 1);
    }
}

int lane_id(void)
{
    if (cur_thread < 0) {
        die("a warp operation outside a kernel");
    }
    return cur_thread % 32;
}

void warp_exchange(unsigned mask, const void *v, void *out, size_t bytes, int src)
{
    warp &w = warps[(size_t)cur_thread / 32];
    uint64_t mine = 0;
    memcpy(&mine, v, bytes);
    w.slot[cur_thread % 32] = mine;
    warp_sync(mask);
    if (src < 0 || src > 31 || !(mask >> src & 1u)) {
        die("a shuffle reads lane %d, outside its mask %08x", src, mask);
    }
    memcpy(out, &w.slot[src], bytes);
    warp_sync(mask);
}

void shared_poison(void *p, size_t bytes)
{
    unsigned long long &seen = shared_seen[p];
    if (seen != block_epoch) {
        memset(p, 0xff, bytes);
        seen = block_epoch;
    }
}

} // namespace mmp_emu

void __syncthreads(void)
{
    if (cur_thread < 0) {
        die("__syncthreads outside a kernel");
    }
    bar_arrived++;
    set_state(cur_thread, WAIT_BAR);
    bar_check();
    if (fibers[(size_t)cur_thread].state != RUNNABLE) {
        yield();
    }
}

void __syncwarp(unsigned mask)
{
    warp_sync(mask);
}

int __any_sync(unsigned mask, int pred)
{
    int any = 0;
    const int flag = pred != 0;
    for (int l = 0; l < 32; l++) {
        if (mask >> l & 1u) {
            int v;
            mmp_emu::warp_exchange(mask, &flag, &v, sizeof v, l);
            any |= v;
        }
    }
    return any;
}

/* ---- runtime ------------------------------------------------------------- */
struct mmp_emu_stream {
    int unused;
};
struct mmp_emu_event {
    int unused;
};

cudaError_t cudaGetDeviceCount(int *n)
{
    *n = 1;
    return cudaSuccess;
}

cudaError_t cudaSetDevice(int d)
{
    return d == 0 ? cudaSuccess : fail(cudaErrorInvalidDevice, "cudaSetDevice(%d): one device", d);
}

cudaError_t cudaGetDeviceProperties(cudaDeviceProp *p, int d)
{
    if (d != 0) {
        return fail(cudaErrorInvalidDevice, "cudaGetDeviceProperties(%d): one device", d);
    }
    memset(p, 0, sizeof *p);
    snprintf(p->name, sizeof p->name, "mmpipe CUDA emulator (CPU)");
    p->totalGlobalMem = (size_t)16 << 30;
    p->major = 9;
    p->multiProcessorCount = 132;
    return cudaSuccess;
}

cudaError_t cudaDeviceGetAttribute(int *v, cudaDeviceAttr a, int d)
{
    if (d != 0) {
        return fail(cudaErrorInvalidDevice, "cudaDeviceGetAttribute(device %d): one device", d);
    }
    switch (a) {
    case cudaDevAttrComputeCapabilityMajor:
        *v = 9;
        return cudaSuccess;
    case cudaDevAttrMemoryPoolsSupported:
        *v = 1;
        return cudaSuccess;
    }
    return fail(cudaErrorInvalidValue, "cudaDeviceGetAttribute(%d): not emulated", (int)a);
}

cudaError_t cudaStreamCreate(cudaStream_t *s)
{
    *s = new mmp_emu_stream();
    return cudaSuccess;
}

cudaError_t cudaStreamDestroy(cudaStream_t s)
{
    delete s;
    return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t)
{
    host_wait(WAIT_STREAM);
    return cudaSuccess;
}

cudaError_t cudaMalloc(void **p, size_t bytes)
{
    return device_alloc(p, bytes);
}

cudaError_t cudaMallocAsync(void **p, size_t bytes, cudaStream_t)
{
    return device_alloc(p, bytes);
}

cudaError_t cudaFree(void *p)
{
    if (p) {
        host_wait(WAIT_DEVICE); /* cudaFree waits for the whole device */
    }
    return device_free(p);
}

cudaError_t cudaFreeAsync(void *p, cudaStream_t)
{
    return device_free(p);
}

cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind,
                            cudaStream_t)
{
    std::lock_guard<std::recursive_mutex> hold(emu_lock);
    if (bytes == 0) {
        return cudaSuccess;
    }
    const bool dst_dev = kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToDevice;
    const bool src_dev = kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyDeviceToDevice;
    if (kind != cudaMemcpyDefault) {
        if (dst_dev ? !device_range(dst, bytes) : is_device(dst)) {
            return fail(cudaErrorInvalidValue,
                        "cudaMemcpy kind %d: destination %p (%zu bytes) is %s", (int)kind, dst,
                        bytes, dst_dev ? "not inside one device allocation" : "device memory");
        }
        if (src_dev ? !device_range(src, bytes) : is_device(src)) {
            return fail(cudaErrorInvalidValue, "cudaMemcpy kind %d: source %p (%zu bytes) is %s",
                        (int)kind, src, bytes,
                        src_dev ? "not inside one device allocation" : "device memory");
        }
    }
    /* a pageable host side makes the call wait for the copy */
    const bool to_host = kind == cudaMemcpyDeviceToHost ||
                         (kind == cudaMemcpyDefault && !is_device(dst) && is_device(src));
    const bool from_host = kind == cudaMemcpyHostToDevice ||
                           (kind == cudaMemcpyDefault && is_device(dst) && !is_device(src));
    if ((to_host && !is_pinned(dst)) || (from_host && !is_pinned(src))) {
        host_waits[WAIT_PAGEABLE]++;
    }
    device_access rw("cudaMemcpy");
    memmove(dst, src, bytes);
    return cudaSuccess;
}

cudaError_t cudaMemcpy(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind)
{
    host_wait(WAIT_MEMCPY);
    return cudaMemcpyAsync(dst, src, bytes, kind, nullptr);
}

cudaError_t cudaMemsetAsync(void *dst, int value, size_t bytes, cudaStream_t)
{
    std::lock_guard<std::recursive_mutex> hold(emu_lock);
    if (bytes == 0) {
        return cudaSuccess;
    }
    if (!device_range(dst, bytes)) {
        return fail(cudaErrorInvalidValue,
                    "cudaMemset(%p, %zu bytes): not inside one device "
                    "allocation",
                    dst, bytes);
    }
    device_access rw("cudaMemset");
    memset(dst, value, bytes);
    return cudaSuccess;
}

cudaError_t cudaHostAlloc(void **p, size_t bytes, unsigned)
{
    std::lock_guard<std::recursive_mutex> hold(emu_lock);
    *p = malloc(bytes ? bytes : 1);
    if (!*p) {
        return fail(cudaErrorMemoryAllocation, "cudaHostAlloc(%zu bytes)", bytes);
    }
    pinned[(uintptr_t)*p] = bytes ? bytes : 1;
    return cudaSuccess;
}

cudaError_t cudaFreeHost(void *p)
{
    std::lock_guard<std::recursive_mutex> hold(emu_lock);
    if (is_device(p)) {
        return fail(cudaErrorInvalidValue, "cudaFreeHost(%p): device memory", p);
    }
    pinned.erase((uintptr_t)p);
    free(p);
    return cudaSuccess;
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned)
{
    *e = new mmp_emu_event();
    return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t)
{
    return e ? cudaSuccess : fail(cudaErrorInvalidValue, "cudaEventRecord(NULL)");
}

cudaError_t cudaEventSynchronize(cudaEvent_t e)
{
    host_wait(WAIT_EVENT);
    return e ? cudaSuccess : fail(cudaErrorInvalidValue, "cudaEventSynchronize(NULL)");
}

cudaError_t cudaEventDestroy(cudaEvent_t e)
{
    delete e;
    return cudaSuccess;
}

cudaError_t cudaGetLastError(void)
{
    cudaError_t e = last_error;
    last_error = cudaSuccess;
    return e;
}

const char *cudaGetErrorString(cudaError_t e)
{
    switch (e) {
    case cudaSuccess:
        return "no error";
    case cudaErrorInvalidValue:
        return "invalid argument";
    case cudaErrorMemoryAllocation:
        return "out of memory";
    case cudaErrorInvalidConfiguration:
        return "invalid configuration argument";
    case cudaErrorInvalidDevice:
        return "invalid device ordinal";
    }
    return "unknown error";
}

/* ---- interprocess memory and events; driver entry points ---------------------- */
namespace
{

const uint64_t IPC_MAGIC = 0x314350494d554d4dull; /* "MMUMIPC1" */
struct ipc_mem {
    uint64_t magic;
    int32_t pid, fd; /* the exporter's memfd: /proc/PID/fd/FD */
    uint64_t bytes;  /* the allocation's size as asked */
    uint64_t reserved[5];
};
static_assert(sizeof(ipc_mem) <= sizeof(cudaIpcMemHandle_t), "an IPC handle holds 64 bytes");

CUresult drv_range(CUdeviceptr *base, size_t *size, CUdeviceptr p)
{
    std::lock_guard<std::recursive_mutex> hold(emu_lock);
    uintptr_t at = 0;
    const allocation *a = device_range((const void *)(uintptr_t)p, 0, &at);
    if (!a || (uintptr_t)p - at >= (a->bytes ? a->bytes : 1)) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    if (base) {
        *base = (CUdeviceptr)at;
    }
    if (size) {
        *size = a->bytes;
    }
    return CUDA_SUCCESS;
}

CUresult drv_write32(CUstream, CUdeviceptr addr, cuuint32_t value, unsigned)
{
    device_access rw("cuStreamWriteValue32");
    if (!device_range((const void *)(uintptr_t)addr, 4)) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    __atomic_store_n((uint32_t *)(uintptr_t)addr, value, __ATOMIC_SEQ_CST);
    return CUDA_SUCCESS;
}

/* A stream's work is done when its call returns, so a wait is for a value
 * the other process wrote before telling this one to wait: it is there, or
 * soon (the bound only keeps a protocol error from hanging a test). */
CUresult drv_wait32(CUstream, CUdeviceptr addr, cuuint32_t value, unsigned)
{
    for (long i = 0; i < 200000; i++) {
        {
            device_access rw("cuStreamWaitValue32");
            if (!device_range((const void *)(uintptr_t)addr, 4)) {
                return CUDA_ERROR_INVALID_VALUE;
            }
            const uint32_t v = __atomic_load_n((uint32_t *)(uintptr_t)addr, __ATOMIC_SEQ_CST);
            if ((int32_t)(v - value) >= 0) {
                return CUDA_SUCCESS;
            }
        }
        usleep(100);
    }
    fprintf(stderr, "cuda emulator: cuStreamWaitValue32: %u never reached in 20 s\n", value);
    return CUDA_ERROR_INVALID_VALUE;
}

} // namespace

cudaError_t cudaIpcGetMemHandle(cudaIpcMemHandle_t *h, void *p)
{
    std::lock_guard<std::recursive_mutex> hold(emu_lock);
    auto it = device.find((uintptr_t)p);
    if (it == device.end() || it->second.imported || it->second.fd < 0) {
        return fail(cudaErrorInvalidValue, "cudaIpcGetMemHandle(%p): %s", p,
                    EMU_ASAN ? "no IPC in the sanitizer build"
                             : "not the start of this process's device allocation");
    }
    ipc_mem m = {};
    m.magic = IPC_MAGIC;
    m.pid = (int32_t)getpid();
    m.fd = it->second.fd;
    m.bytes = it->second.bytes;
    memset(h, 0, sizeof *h);
    memcpy(h, &m, sizeof m);
    return cudaSuccess;
}

cudaError_t cudaIpcOpenMemHandle(void **p, cudaIpcMemHandle_t h, unsigned)
{
    std::lock_guard<std::recursive_mutex> hold(emu_lock);
    *p = nullptr;
    ipc_mem m;
    memcpy(&m, &h, sizeof m);
    if (m.magic != IPC_MAGIC || m.pid <= 0 || m.fd < 0) {
        return fail(cudaErrorInvalidValue, "cudaIpcOpenMemHandle: not a handle of this emulator");
    }
    if (m.pid == (int32_t)getpid()) {
        return fail(cudaErrorInvalidValue, "cudaIpcOpenMemHandle: a handle of this process");
    }
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/fd/%d", (int)m.pid, (int)m.fd);
    const int fd = open(path, O_RDWR | O_CLOEXEC);
    if (fd < 0) {
        return fail(cudaErrorInvalidValue, "cudaIpcOpenMemHandle: %s: %s", path, strerror(errno));
    }
    allocation a = {(size_t)m.bytes, nullptr, 0, -1, true};
    char *base = nullptr;
    cudaError_t ce = map_pages(a, fd, m.bytes ? m.bytes : 1, &base);
    close(fd);
    if (ce != cudaSuccess) {
        return ce;
    }
    device[(uintptr_t)base] = a;
    *p = base;
    return cudaSuccess;
}

cudaError_t cudaIpcCloseMemHandle(void *p)
{
    std::lock_guard<std::recursive_mutex> hold(emu_lock);
    auto it = device.find((uintptr_t)p);
    if (it == device.end() || !it->second.imported) {
        return fail(cudaErrorInvalidValue, "cudaIpcCloseMemHandle(%p): not an opened handle", p);
    }
    munmap(it->second.map, it->second.map_len);
    device.erase(it);
    return cudaSuccess;
}

cudaError_t cudaIpcGetEventHandle(cudaIpcEventHandle_t *h, cudaEvent_t e)
{
    if (!e) {
        return fail(cudaErrorInvalidValue, "cudaIpcGetEventHandle(NULL)");
    }
    memset(h, 0, sizeof *h);
    memcpy(h, &IPC_MAGIC, sizeof IPC_MAGIC);
    return cudaSuccess;
}

cudaError_t cudaIpcOpenEventHandle(cudaEvent_t *e, cudaIpcEventHandle_t h)
{
    if (memcmp(&h, &IPC_MAGIC, sizeof IPC_MAGIC) != 0) {
        *e = nullptr;
        return fail(cudaErrorInvalidValue, "cudaIpcOpenEventHandle: not a handle of this emulator");
    }
    return cudaEventCreateWithFlags(e, cudaEventInterprocess | cudaEventDisableTiming);
}

cudaError_t cudaStreamWaitEvent(cudaStream_t, cudaEvent_t e, unsigned)
{
    return e ? cudaSuccess : fail(cudaErrorInvalidValue, "cudaStreamWaitEvent(NULL)");
}

cudaError_t cudaMemset(void *p, int value, size_t bytes)
{
    return cudaMemsetAsync(p, value, bytes, nullptr);
}

cudaError_t cudaDeviceSynchronize(void)
{
    host_wait(WAIT_DEVICE);
    return cudaSuccess;
}

const char *cudaGetErrorName(cudaError_t e)
{
    switch (e) {
    case cudaSuccess:
        return "cudaSuccess";
    case cudaErrorInvalidValue:
        return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation:
        return "cudaErrorMemoryAllocation";
    case cudaErrorInvalidConfiguration:
        return "cudaErrorInvalidConfiguration";
    case cudaErrorInvalidDevice:
        return "cudaErrorInvalidDevice";
    }
    return "cudaErrorUnknown";
}

cudaError_t cudaGetDriverEntryPointByVersion(const char *symbol, void **f, unsigned,
                                             unsigned long long,
                                             cudaDriverEntryPointQueryResult *status)
{
    *f = nullptr;
    if (strcmp(symbol, "cuMemGetAddressRange") == 0) {
        *f = (void *)drv_range;
    } else if (strcmp(symbol, "cuStreamWriteValue32") == 0) {
        *f = (void *)drv_write32;
    } else if (strcmp(symbol, "cuStreamWaitValue32") == 0) {
        *f = (void *)drv_wait32;
    }
    if (status) {
        *status = *f ? cudaDriverEntryPointSuccess : cudaDriverEntryPointSymbolNotFound;
    }
    return cudaSuccess;
}

/* ---- numbers ------------------------------------------------------------- */
namespace
{

/* x rounded to TF32 (10 mantissa bits, to nearest even). */
float tf32(float x)
{
    unsigned u = __float_as_uint(x);
    if ((u & 0x7f800000u) == 0x7f800000u) {
        return x;
    }
    u = (u + 0xfffu + ((u >> 13) & 1u)) & ~0x1fffu;
    return __uint_as_float(u);
}

float load(const void *p, cudaDataType t, size_t i)
{
    switch (t) {
    case CUDA_R_32F:
        return ((const float *)p)[i];
    case CUDA_R_16F:
        return __half2float(__ushort_as_half(((const unsigned short *)p)[i]));
    case CUDA_R_16BF:
        return __uint_as_float((unsigned)((const unsigned short *)p)[i] << 16);
    }
    return NAN;
}

size_t type_bytes(cudaDataType t)
{
    return t == CUDA_R_32F ? 4 : 2;
}

} // namespace

/* ---- cuBLAS ---------------------------------------------------------------- */
struct mmp_emu_cublas {
    cublasMath_t math;
};

namespace
{

struct gemm_args {
    const char *call;
    cublasOperation_t ta, tb;
    int m, n, k;
    float alpha, beta;
    cudaDataType at, bt, ct;
    int lda, ldb, ldc;
    bool tf32;
};

cublasStatus_t blas_fail(cublasStatus_t s, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "cuda emulator: %s: ", doing);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    return s;
}

cublasStatus_t gemm_check(const gemm_args &g)
{
    const int a_rows = g.ta == CUBLAS_OP_N ? g.m : g.k, b_rows = g.tb == CUBLAS_OP_N ? g.k : g.n;
    if (g.m < 0 || g.n < 0 || g.k < 0) {
        return blas_fail(CUBLAS_STATUS_INVALID_VALUE, "m %d, n %d, k %d", g.m, g.n, g.k);
    }
    if (g.lda < (a_rows > 1 ? a_rows : 1) || g.ldb < (b_rows > 1 ? b_rows : 1) ||
        g.ldc < (g.m > 1 ? g.m : 1)) {
        return blas_fail(CUBLAS_STATUS_INVALID_VALUE,
                         "lda %d (A has %d rows), ldb %d (B has %d rows), ldc %d (C has %d rows)",
                         g.lda, a_rows, g.ldb, b_rows, g.ldc, g.m);
    }
    if (g.ct != CUDA_R_32F || (g.at != g.bt)) {
        return blas_fail(CUBLAS_STATUS_NOT_SUPPORTED, "types A %d, B %d, C %d", (int)g.at,
                         (int)g.bt, (int)g.ct);
    }
    return CUBLAS_STATUS_SUCCESS;
}

/* Whether the column-major (rows, cols) matrix at p with leading dimension
 * ld lies inside one device allocation. */
bool matrix_on_device(const void *p, cudaDataType t, int rows, int cols, int ld)
{
    if (rows == 0 || cols == 0) {
        return true;
    }
    const size_t elems = (size_t)(cols - 1) * (size_t)ld + (size_t)rows;
    return device_range(p, elems * type_bytes(t)) != nullptr;
}

cublasStatus_t gemm_one(const gemm_args &g, const void *A, const void *B, void *Cv)
{
    const int a_rows = g.ta == CUBLAS_OP_N ? g.m : g.k, a_cols = g.ta == CUBLAS_OP_N ? g.k : g.m;
    const int b_rows = g.tb == CUBLAS_OP_N ? g.k : g.n, b_cols = g.tb == CUBLAS_OP_N ? g.n : g.k;
    if (!matrix_on_device(A, g.at, g.k ? a_rows : 0, a_cols, g.lda) ||
        !matrix_on_device(B, g.bt, g.k ? b_rows : 0, b_cols, g.ldb) ||
        !matrix_on_device(Cv, g.ct, g.m, g.n, g.ldc)) {
        return blas_fail((cublasStatus_t)13,
                         "an operand reaches outside its device allocation (A %p %dx%d lda %d, B "
                         "%p %dx%d ldb %d, C %p %dx%d ldc %d)",
                         A, a_rows, a_cols, g.lda, B, b_rows, b_cols, g.ldb, Cv, g.m, g.n, g.ldc);
    }
    /* op(A) as m rows of k values, op(B)^T as n rows of k: contiguous dots */
    std::vector<float> a((size_t)g.m * g.k), b((size_t)g.n * g.k);
    for (int i = 0; i < g.m; i++) {
        for (int l = 0; l < g.k; l++) {
            const float v = g.ta == CUBLAS_OP_N ? load(A, g.at, (size_t)l * g.lda + i)
                                                : load(A, g.at, (size_t)i * g.lda + l);
            a[(size_t)i * g.k + l] = g.tf32 ? tf32(v) : v;
        }
    }
    for (int j = 0; j < g.n; j++) {
        for (int l = 0; l < g.k; l++) {
            const float v = g.tb == CUBLAS_OP_N ? load(B, g.bt, (size_t)j * g.ldb + l)
                                                : load(B, g.bt, (size_t)l * g.ldb + j);
            b[(size_t)j * g.k + l] = g.tf32 ? tf32(v) : v;
        }
    }
    float *C = (float *)Cv;
    for (int j = 0; j < g.n; j++) {
        const float *bj = &b[(size_t)j * g.k];
        for (int i = 0; i < g.m; i++) {
            const float *ai = &a[(size_t)i * g.k];
            double acc[4] = {0, 0, 0, 0};
            int l = 0;
            for (; l + 4 <= g.k; l += 4) {
                for (int u = 0; u < 4; u++) {
                    acc[u] += (double)ai[l + u] * bj[l + u];
                }
            }
            for (; l < g.k; l++) {
                acc[0] += (double)ai[l] * bj[l];
            }
            const double sum = (acc[0] + acc[1]) + (acc[2] + acc[3]);
            float &c = C[(size_t)j * g.ldc + i];
            c = g.beta == 0.0f ? g.alpha * (float)sum : g.alpha * (float)sum + g.beta * c;
        }
    }
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t gemm_strided(cublasHandle_t h, gemm_args g, const void *A, long long sa,
                            const void *B, long long sb, void *C, long long sc, int batch)
{
    if (!h) {
        return CUBLAS_STATUS_NOT_INITIALIZED;
    }
    device_access rw(g.call);
    cublasStatus_t s = gemm_check(g);
    if (s != CUBLAS_STATUS_SUCCESS || batch < 0) {
        return s != CUBLAS_STATUS_SUCCESS ? s : CUBLAS_STATUS_INVALID_VALUE;
    }
    for (int i = 0; i < batch && s == CUBLAS_STATUS_SUCCESS; i++) {
        s = gemm_one(g, (const char *)A + (size_t)(sa * i) * type_bytes(g.at),
                     (const char *)B + (size_t)(sb * i) * type_bytes(g.bt),
                     (char *)C + (size_t)(sc * i) * type_bytes(g.ct));
    }
    return s;
}

cublasStatus_t compute_ok(cublasComputeType_t c)
{
    return c == CUBLAS_COMPUTE_32F || c == CUBLAS_COMPUTE_32F_FAST_TF32
               ? CUBLAS_STATUS_SUCCESS
               : blas_fail(CUBLAS_STATUS_NOT_SUPPORTED, "compute type %d", (int)c);
}

} // namespace

cublasStatus_t cublasCreate(cublasHandle_t *h)
{
    *h = new mmp_emu_cublas{CUBLAS_DEFAULT_MATH};
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasDestroy(cublasHandle_t h)
{
    delete h;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetStream(cublasHandle_t h, cudaStream_t)
{
    return h ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_NOT_INITIALIZED;
}

cublasStatus_t cublasSetMathMode(cublasHandle_t h, cublasMath_t m)
{
    if (!h) {
        return CUBLAS_STATUS_NOT_INITIALIZED;
    }
    h->math = m;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetWorkspace(cublasHandle_t h, void *ws, size_t bytes)
{
    if (!h) {
        return CUBLAS_STATUS_NOT_INITIALIZED;
    }
    std::lock_guard<std::recursive_mutex> hold(emu_lock);
    if (bytes && !device_range(ws, bytes)) {
        const in_call call("cublasSetWorkspace");
        blas_fail(CUBLAS_STATUS_INVALID_VALUE, "%zu bytes at %p: not device memory", bytes, ws);
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    /* The emulated GEMMs never use it: its pages go (nothing to protect and
     * unprotect around every call). */
    auto it = device.find((uintptr_t)ws);
    if (it != device.end() && it->second.fd >= 0) {
        (void)fallocate(it->second.fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 0,
                        (off_t)(it->second.map_len - page));
    }
    return CUBLAS_STATUS_SUCCESS;
}

const char *cublasGetStatusString(cublasStatus_t s)
{
    switch (s) {
    case CUBLAS_STATUS_SUCCESS:
        return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED:
        return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_INVALID_VALUE:
        return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_NOT_SUPPORTED:
        return "CUBLAS_STATUS_NOT_SUPPORTED";
    }
    return s == 13 ? "CUBLAS_STATUS_EXECUTION_FAILED" : "CUBLAS_STATUS_UNKNOWN";
}

cublasStatus_t cublasSgemmStridedBatched(cublasHandle_t h, cublasOperation_t ta,
                                         cublasOperation_t tb, int m, int n, int k,
                                         const float *alpha, const float *A, int lda, long long sa,
                                         const float *B, int ldb, long long sb, const float *beta,
                                         float *C, int ldc, long long sc, int batch)
{
    const bool tf = h && h->math == CUBLAS_TF32_TENSOR_OP_MATH;
    gemm_args g = {"cublasSgemm", ta,         tb,         m,   n,   k,   *alpha, *beta,
                   CUDA_R_32F,    CUDA_R_32F, CUDA_R_32F, lda, ldb, ldc, tf};
    return gemm_strided(h, g, A, sa, B, sb, C, sc, batch);
}

cublasStatus_t cublasSgemm(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m,
                           int n, int k, const float *alpha, const float *A, int lda,
                           const float *B, int ldb, const float *beta, float *C, int ldc)
{
    return cublasSgemmStridedBatched(h, ta, tb, m, n, k, alpha, A, lda, 0, B, ldb, 0, beta, C, ldc,
                                     0, 1);
}

cublasStatus_t cublasGemmStridedBatchedEx(cublasHandle_t h, cublasOperation_t ta,
                                          cublasOperation_t tb, int m, int n, int k,
                                          const void *alpha, const void *A, cudaDataType at,
                                          int lda, long long sa, const void *B, cudaDataType bt,
                                          int ldb, long long sb, const void *beta, void *C,
                                          cudaDataType ct, int ldc, long long sc, int batch,
                                          cublasComputeType_t compute, cublasGemmAlgo_t)
{
    const in_call call("cublasGemmEx");
    cublasStatus_t s = compute_ok(compute);
    if (s != CUBLAS_STATUS_SUCCESS) {
        return s;
    }
    const bool tf = compute == CUBLAS_COMPUTE_32F_FAST_TF32 ||
                    (at == CUDA_R_32F && h && h->math == CUBLAS_TF32_TENSOR_OP_MATH);
    gemm_args g = {"cublasGemmEx",
                   ta,
                   tb,
                   m,
                   n,
                   k,
                   *(const float *)alpha,
                   *(const float *)beta,
                   at,
                   bt,
                   ct,
                   lda,
                   ldb,
                   ldc,
                   tf};
    return gemm_strided(h, g, A, sa, B, sb, C, sc, batch);
}

cublasStatus_t cublasGemmEx(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m,
                            int n, int k, const void *alpha, const void *A, cudaDataType at,
                            int lda, const void *B, cudaDataType bt, int ldb, const void *beta,
                            void *C, cudaDataType ct, int ldc, cublasComputeType_t compute,
                            cublasGemmAlgo_t algo)
{
    return cublasGemmStridedBatchedEx(h, ta, tb, m, n, k, alpha, A, at, lda, 0, B, bt, ldb, 0, beta,
                                      C, ct, ldc, 0, 1, compute, algo);
}

cublasStatus_t cublasGemmBatchedEx(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb,
                                   int m, int n, int k, const void *alpha, const void *const A[],
                                   cudaDataType at, int lda, const void *const B[], cudaDataType bt,
                                   int ldb, const void *beta, void *const C[], cudaDataType ct,
                                   int ldc, int batch, cublasComputeType_t compute,
                                   cublasGemmAlgo_t)
{
    if (!h) {
        return CUBLAS_STATUS_NOT_INITIALIZED;
    }
    device_access rw("cublasGemmBatchedEx");
    cublasStatus_t s = compute_ok(compute);
    if (s != CUBLAS_STATUS_SUCCESS) {
        return s;
    }
    if (batch < 0) {
        return blas_fail(CUBLAS_STATUS_INVALID_VALUE, "batch %d", batch);
    }
    const size_t pbytes = sizeof(void *) * (size_t)batch;
    if (batch > 0 && (!device_range(A, pbytes) || !device_range(B, pbytes) ||
                      !device_range((const void *)C, pbytes))) {
        return blas_fail(CUBLAS_STATUS_INVALID_VALUE,
                         "the arrays of %d pointers must be device memory", batch);
    }
    gemm_args g = {"cublasGemmBatchedEx",
                   ta,
                   tb,
                   m,
                   n,
                   k,
                   *(const float *)alpha,
                   *(const float *)beta,
                   at,
                   bt,
                   ct,
                   lda,
                   ldb,
                   ldc,
                   compute == CUBLAS_COMPUTE_32F_FAST_TF32};
    s = gemm_check(g);
    for (int i = 0; i < batch && s == CUBLAS_STATUS_SUCCESS; i++) {
        /* cuBLAS cannot see these pointers before its kernels run: the
         * tensor-core kernels it picks by the matrices' shape assume them
         * 16-byte aligned for 16-bit types (as its documentation says) */
        if (at != CUDA_R_32F &&
            ((uintptr_t)A[i] % 16 || (uintptr_t)B[i] % 16 || (uintptr_t)C[i] % 16)) {
            return blas_fail((cublasStatus_t)13,
                             "product %d: pointers A %p, B %p, C %p not all on 16 bytes", i, A[i],
                             B[i], C[i]);
        }
        s = gemm_one(g, A[i], B[i], C[i]);
    }
    return s;
}

/* ---- cuDNN ------------------------------------------------------------------ */
struct mmp_emu_cudnn {
    unsigned long long calls; /* orders the sums of the non-deterministic algorithms */
};
struct mmp_emu_tensor {
    bool set;
    int n, c, h, w;
};
struct mmp_emu_filter {
    bool set;
    int k, c, h, w;
};
struct mmp_emu_conv {
    bool set;
    int ph, pw, u, v, dh, dw;
    cudnnConvolutionMode_t mode;
    cudnnMathType_t math;
};

namespace
{

cudnnStatus_t dnn_fail(cudnnStatus_t s, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "cuda emulator: %s: ", doing);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    return s;
}

/* How an algorithm's products are formed here (include/mmp_cuda_emu.h):
 * exact fp32, TF32 operands, fp16 operands (a down-conversion), bf16
 * operands (the larger error of a transform: FFT, Winograd); and whether
 * its sums' order changes from call to call (a non-deterministic one). */
enum operand_rounding { EXACT, TF32, FP16, LOSSY };
struct conv_math {
    operand_rounding r;
    bool nondet;
};

float round_operand(float x, operand_rounding r)
{
    switch (r) {
    case EXACT:
        return x;
    case TF32:
        return tf32(x);
    case FP16:
        return __half2float(__float2half_rn(x));
    case LOSSY:
        return __bfloat162float(__float2bfloat16_rn(x));
    }
    return x;
}

operand_rounding math_rounding(cudnnMathType_t m)
{
    switch (m) {
    case CUDNN_FMA_MATH:
        return EXACT;
    case CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION:
        return FP16;
    case CUDNN_DEFAULT_MATH: /* TF32 allowed for fp32 data on Ampere and later */
    case CUDNN_TENSOR_OP_MATH:
        return TF32;
    }
    return EXACT;
}

/* The shapes of one convolution, checked against each other. */
struct conv_geom {
    int N, C, H, W, K, KH, KW, OH, OW;
    const mmp_emu_conv *cv;
    size_t nx() const /* input elements */
    {
        return (size_t)N * C * H * W;
    }
    size_t nw() const /* filter elements */
    {
        return (size_t)K * C * KH * KW;
    }
    size_t ny() const /* output elements */
    {
        return (size_t)N * K * OH * OW;
    }
};

cudnnStatus_t geom(const mmp_emu_tensor *x, const mmp_emu_filter *w, const mmp_emu_conv *cv,
                   const mmp_emu_tensor *y, conv_geom *g)
{
    if (!x || !w || !cv || !y || !x->set || !w->set || !cv->set || !y->set) {
        return dnn_fail(CUDNN_STATUS_BAD_PARAM, "a descriptor is NULL or was never set");
    }
    if (x->c != w->c) {
        return dnn_fail(CUDNN_STATUS_BAD_PARAM, "input channels %d, filter channels %d", x->c,
                        w->c);
    }
    const int oh = 1 + (x->h + 2 * cv->ph - ((w->h - 1) * cv->dh + 1)) / cv->u;
    const int ow = 1 + (x->w + 2 * cv->pw - ((w->w - 1) * cv->dw + 1)) / cv->v;
    if (y->n != x->n || y->c != w->k || y->h != oh || y->w != ow) {
        return dnn_fail(CUDNN_STATUS_BAD_PARAM, "output (%d,%d,%d,%d), expected (%d,%d,%d,%d)",
                        y->n, y->c, y->h, y->w, x->n, w->k, oh, ow);
    }
    *g = conv_geom{x->n, x->c, x->h, x->w, w->k, w->h, w->w, oh, ow, cv};
    return CUDNN_STATUS_SUCCESS;
}

size_t elems(int a, int b, int c, int d)
{
    return (size_t)a * b * c * d;
}

/* The bytes each algorithm asks for (invented, the same for every call). */
size_t fwd_ws(const conv_geom &g, cudnnConvolutionFwdAlgo_t a)
{
    switch (a) {
    case CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM:
        return 0;
    case CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM:
        return 4096;
    case CUDNN_CONVOLUTION_FWD_ALGO_GEMM:
        return elems(g.N * g.C, g.KH * g.KW, g.OH, g.OW) * 4;
    default:
        return elems(g.N, g.C + g.K, g.H + 8, g.W + 8) * 4;
    }
}
size_t bwd_data_ws(const conv_geom &g, cudnnConvolutionBwdDataAlgo_t a)
{
    return a == CUDNN_CONVOLUTION_BWD_DATA_ALGO_0   ? 0
           : a == CUDNN_CONVOLUTION_BWD_DATA_ALGO_1 ? 2048
                                                    : elems(g.N, g.C + g.K, g.H + 8, g.W + 8) * 4;
}
size_t bwd_filter_ws(const conv_geom &g, cudnnConvolutionBwdFilterAlgo_t a)
{
    return a == CUDNN_CONVOLUTION_BWD_FILTER_ALGO_0   ? 0
           : a == CUDNN_CONVOLUTION_BWD_FILTER_ALGO_1 ? elems(g.K, g.C, g.KH, g.KW) * 4
           : a == CUDNN_CONVOLUTION_BWD_FILTER_ALGO_3 ? 8192
                                                      : elems(g.N, g.C + g.K, g.H + 8, g.W + 8) * 4;
}

bool fwd_transform(cudnnConvolutionFwdAlgo_t a)
{
    return a >= CUDNN_CONVOLUTION_FWD_ALGO_FFT;
}
bool bwd_data_transform(cudnnConvolutionBwdDataAlgo_t a)
{
    return a >= CUDNN_CONVOLUTION_BWD_DATA_ALGO_FFT;
}
bool bwd_filter_transform(cudnnConvolutionBwdFilterAlgo_t a)
{
    return a == CUDNN_CONVOLUTION_BWD_FILTER_ALGO_FFT ||
           a >= CUDNN_CONVOLUTION_BWD_FILTER_ALGO_WINOGRAD;
}

/* The math a call runs with: the descriptor's, the algorithm's kind. */
conv_math call_math(const mmp_emu_conv *cv, bool transform, bool nondet)
{
    return conv_math{transform ? LOSSY : math_rounding(cv->math), nondet};
}

/* Adds the terms of one output in a fixed order (deterministic) or from a
 * start that moves with every call (non-deterministic: the bits move). */
struct summer {
    std::vector<float> terms;
    bool nondet;
    unsigned long long call;
    void clear()
    {
        terms.clear();
    }
    float sum() const
    {
        if (!nondet) {
            double s = 0;
            for (float t : terms) {
                s += t;
            }
            return (float)s;
        }
        float s = 0;
        const size_t n = terms.size();
        for (size_t i = 0; i < n; i++) {
            s += terms[(i + call) % n];
        }
        return s;
    }
};

void blend(float *out, float v, float alpha, float beta)
{
    *out = beta == 0.0f ? alpha * v : alpha * v + beta * *out;
}

/* The workspace a call was given, checked, then scribbled over, as the
 * algorithm would (an input that shares it reads garbage). */
cudnnStatus_t take_ws(void *ws, size_t have, size_t need)
{
    if (need == 0) {
        return CUDNN_STATUS_SUCCESS;
    }
    if (!ws || have < need) {
        return dnn_fail(CUDNN_STATUS_BAD_PARAM,
                        "the algorithm needs %zu bytes of workspace, "
                        "given %zu at %p",
                        need, have, ws);
    }
    if (!device_range(ws, need)) {
        return dnn_fail(CUDNN_STATUS_BAD_PARAM, "workspace %p (%zu bytes) is not device memory", ws,
                        need);
    }
    memset(ws, 0xff, need);
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t on_device(const void *p, size_t n_floats, const char *what)
{
    if (!device_range(p, n_floats * sizeof(float))) {
        return dnn_fail(CUDNN_STATUS_BAD_PARAM,
                        "%s %p (%zu floats) is not inside one device "
                        "allocation",
                        what, p, n_floats);
    }
    return CUDNN_STATUS_SUCCESS;
}

/* What a convolution call checks after its descriptors, as cuDNN does: the
 * algorithm, its input-, filter- and output-shaped operands (named for
 * messages) inside device memory, and the workspace it needs. */
cudnnStatus_t conv_operands(const conv_geom &g, bool known_algo, int algo, const void *x,
                            const char *xn, const void *w, const char *wn, const void *y,
                            const char *yn, void *ws, size_t have, size_t need)
{
    cudnnStatus_t s;
    if (!known_algo) {
        return dnn_fail(CUDNN_STATUS_NOT_SUPPORTED, "algorithm %d", algo);
    }
    if ((s = on_device(x, g.nx(), xn)) || (s = on_device(w, g.nw(), wn)) ||
        (s = on_device(y, g.ny(), yn))) {
        return s;
    }
    return take_ws(ws, have, need);
}

/* Index of filter tap (kh, kw): flipped for a true convolution. */
size_t tap(const conv_geom &g, int k, int c, int kh, int kw)
{
    if (g.cv->mode == CUDNN_CONVOLUTION) {
        kh = g.KH - 1 - kh, kw = g.KW - 1 - kw;
    }
    return (((size_t)k * g.C + c) * g.KH + kh) * g.KW + kw;
}

std::vector<float> rounded(const float *p, size_t n, operand_rounding r)
{
    std::vector<float> v(p, p + n);
    for (float &x : v) {
        x = round_operand(x, r);
    }
    return v;
}

template <typename Perf> void rank(Perf *out, int want, int *got, const std::vector<Perf> &list)
{
    *got = 0;
    for (const Perf &p : list) {
        if (*got < want) {
            out[(*got)++] = p;
        }
    }
}

template <typename Perf>
Perf perf(decltype(Perf::algo) a, cudnnStatus_t s, size_t mem, bool det, cudnnMathType_t m)
{
    Perf p = {};
    p.algo = a;
    p.status = s;
    p.time = 1.0f;
    p.memory = mem;
    p.determinism = det ? CUDNN_DETERMINISTIC : CUDNN_NON_DETERMINISTIC;
    p.mathType = m;
    return p;
}

/* The math type cuDNN reports for an algorithm under the descriptor's
 * math: FMA stays FMA; otherwise tensor ops. */
cudnnMathType_t reported(const mmp_emu_conv *cv)
{
    return cv->math == CUDNN_FMA_MATH ? CUDNN_FMA_MATH : CUDNN_TENSOR_OP_MATH;
}

} // namespace

cudnnStatus_t cudnnCreate(cudnnHandle_t *h)
{
    *h = new mmp_emu_cudnn{0};
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnDestroy(cudnnHandle_t h)
{
    delete h;
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnSetStream(cudnnHandle_t h, cudaStream_t)
{
    return h ? CUDNN_STATUS_SUCCESS : CUDNN_STATUS_NOT_INITIALIZED;
}

const char *cudnnGetErrorString(cudnnStatus_t s)
{
    switch (s) {
    case CUDNN_STATUS_SUCCESS:
        return "CUDNN_STATUS_SUCCESS";
    case CUDNN_STATUS_NOT_INITIALIZED:
        return "CUDNN_STATUS_NOT_INITIALIZED";
    case CUDNN_STATUS_BAD_PARAM:
        return "CUDNN_STATUS_BAD_PARAM";
    case CUDNN_STATUS_NOT_SUPPORTED:
        return "CUDNN_STATUS_NOT_SUPPORTED";
    }
    return "CUDNN_STATUS_UNKNOWN";
}

cudnnStatus_t cudnnCreateTensorDescriptor(cudnnTensorDescriptor_t *d)
{
    *d = new mmp_emu_tensor();
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnDestroyTensorDescriptor(cudnnTensorDescriptor_t d)
{
    delete d;
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnSetTensor4dDescriptor(cudnnTensorDescriptor_t d, cudnnTensorFormat_t f,
                                         cudnnDataType_t t, int n, int c, int h, int w)
{
    const in_call call("cudnnSetTensor4dDescriptor");
    cudnnStatus_t s = CUDNN_STATUS_SUCCESS;
    if (f != CUDNN_TENSOR_NCHW || t != CUDNN_DATA_FLOAT) {
        s = dnn_fail(CUDNN_STATUS_NOT_SUPPORTED, "format %d, type %d (NCHW fp32 emulated)", (int)f,
                     (int)t);
    } else if (n <= 0 || c <= 0 || h <= 0 || w <= 0) {
        s = dnn_fail(CUDNN_STATUS_BAD_PARAM, "(%d,%d,%d,%d)", n, c, h, w);
    } else {
        *d = mmp_emu_tensor{true, n, c, h, w};
    }
    return s;
}

cudnnStatus_t cudnnCreateFilterDescriptor(cudnnFilterDescriptor_t *d)
{
    *d = new mmp_emu_filter();
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnDestroyFilterDescriptor(cudnnFilterDescriptor_t d)
{
    delete d;
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnSetFilter4dDescriptor(cudnnFilterDescriptor_t d, cudnnDataType_t t,
                                         cudnnTensorFormat_t f, int k, int c, int h, int w)
{
    const in_call call("cudnnSetFilter4dDescriptor");
    cudnnStatus_t s = CUDNN_STATUS_SUCCESS;
    if (f != CUDNN_TENSOR_NCHW || t != CUDNN_DATA_FLOAT) {
        s = dnn_fail(CUDNN_STATUS_NOT_SUPPORTED, "format %d, type %d (NCHW fp32 emulated)", (int)f,
                     (int)t);
    } else if (k <= 0 || c <= 0 || h <= 0 || w <= 0) {
        s = dnn_fail(CUDNN_STATUS_BAD_PARAM, "(%d,%d,%d,%d)", k, c, h, w);
    } else {
        *d = mmp_emu_filter{true, k, c, h, w};
    }
    return s;
}

cudnnStatus_t cudnnCreateConvolutionDescriptor(cudnnConvolutionDescriptor_t *d)
{
    *d = new mmp_emu_conv();
    (*d)->math = CUDNN_DEFAULT_MATH;
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnDestroyConvolutionDescriptor(cudnnConvolutionDescriptor_t d)
{
    delete d;
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnSetConvolution2dDescriptor(cudnnConvolutionDescriptor_t d, int pad_h, int pad_w,
                                              int u, int v, int dil_h, int dil_w,
                                              cudnnConvolutionMode_t mode, cudnnDataType_t t)
{
    if (pad_h < 0 || pad_w < 0 || u <= 0 || v <= 0 || dil_h <= 0 || dil_w <= 0 ||
        t != CUDNN_DATA_FLOAT) {
        const in_call call("cudnnSetConvolution2dDescriptor");
        cudnnStatus_t s = dnn_fail(CUDNN_STATUS_BAD_PARAM,
                                   "pad %d,%d stride %d,%d dilation %d,%d "
                                   "type %d",
                                   pad_h, pad_w, u, v, dil_h, dil_w, (int)t);
        return s;
    }
    const cudnnMathType_t math = d->math;
    *d = mmp_emu_conv{true, pad_h, pad_w, u, v, dil_h, dil_w, mode, math};
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnSetConvolutionMathType(cudnnConvolutionDescriptor_t d, cudnnMathType_t m)
{
    d->math = m;
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnGetConvolution2dForwardOutputDim(cudnnConvolutionDescriptor_t cv,
                                                    cudnnTensorDescriptor_t x,
                                                    cudnnFilterDescriptor_t w, int *n, int *c,
                                                    int *h, int *wd)
{
    if (!cv->set || !x->set || !w->set || x->c != w->c) {
        const in_call call("cudnnGetConvolution2dForwardOutputDim");
        cudnnStatus_t s = dnn_fail(CUDNN_STATUS_BAD_PARAM, "descriptors unset or channels differ");
        return s;
    }
    *n = x->n;
    *c = w->k;
    *h = 1 + (x->h + 2 * cv->ph - ((w->h - 1) * cv->dh + 1)) / cv->u;
    *wd = 1 + (x->w + 2 * cv->pw - ((w->w - 1) * cv->dw + 1)) / cv->v;
    return CUDNN_STATUS_SUCCESS;
}

/* The heuristics rank what a careful caller must pass over first: an
 * algorithm that cannot run, transforms (FFT, Winograd), a non-
 * deterministic one, a down-conversion to fp16; then usable ones. */
cudnnStatus_t cudnnGetConvolutionForwardAlgorithm_v7(cudnnHandle_t, cudnnTensorDescriptor_t x,
                                                     cudnnFilterDescriptor_t w,
                                                     cudnnConvolutionDescriptor_t cv,
                                                     cudnnTensorDescriptor_t y, int want, int *got,
                                                     cudnnConvolutionFwdAlgoPerf_t *out)
{
    const in_call call("cudnnGetConvolutionForwardAlgorithm_v7");
    conv_geom g = {};
    cudnnStatus_t s = geom(x, w, cv, y, &g);
    if (s != CUDNN_STATUS_SUCCESS) {
        return s;
    }
    const cudnnMathType_t m = reported(cv);
    typedef cudnnConvolutionFwdAlgoPerf_t P;
    std::vector<P> list = {
        perf<P>(CUDNN_CONVOLUTION_FWD_ALGO_DIRECT, CUDNN_STATUS_NOT_SUPPORTED, 0, true, m),
        perf<P>(CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD_NONFUSED, CUDNN_STATUS_SUCCESS,
                fwd_ws(g, CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD_NONFUSED), true, m),
        perf<P>(CUDNN_CONVOLUTION_FWD_ALGO_FFT, CUDNN_STATUS_SUCCESS,
                fwd_ws(g, CUDNN_CONVOLUTION_FWD_ALGO_FFT), true, m),
    };
    if (cv->math != CUDNN_FMA_MATH) {
        list.push_back(perf<P>(CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM,
                               CUDNN_STATUS_SUCCESS,
                               fwd_ws(g, CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM), true,
                               CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION));
    }
    list.push_back(perf<P>(CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM, CUDNN_STATUS_SUCCESS,
                           fwd_ws(g, CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM), true, m));
    list.push_back(perf<P>(CUDNN_CONVOLUTION_FWD_ALGO_GEMM, CUDNN_STATUS_SUCCESS,
                           fwd_ws(g, CUDNN_CONVOLUTION_FWD_ALGO_GEMM), true, m));
    list.push_back(
        perf<P>(CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM, CUDNN_STATUS_SUCCESS, 0, true, m));
    rank(out, want, got, list);
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnGetConvolutionBackwardDataAlgorithm_v7(cudnnHandle_t, cudnnFilterDescriptor_t w,
                                                          cudnnTensorDescriptor_t dy,
                                                          cudnnConvolutionDescriptor_t cv,
                                                          cudnnTensorDescriptor_t dx, int want,
                                                          int *got,
                                                          cudnnConvolutionBwdDataAlgoPerf_t *out)
{
    const in_call call("cudnnGetConvolutionBackwardDataAlgorithm_v7");
    conv_geom g = {};
    cudnnStatus_t s = geom(dx, w, cv, dy, &g);
    if (s != CUDNN_STATUS_SUCCESS) {
        return s;
    }
    const cudnnMathType_t m = reported(cv);
    rank(out, want, got,
         std::vector<cudnnConvolutionBwdDataAlgoPerf_t>{
             perf<cudnnConvolutionBwdDataAlgoPerf_t>(CUDNN_CONVOLUTION_BWD_DATA_ALGO_0,
                                                     CUDNN_STATUS_SUCCESS, 0, false, m),
             perf<cudnnConvolutionBwdDataAlgoPerf_t>(
                 CUDNN_CONVOLUTION_BWD_DATA_ALGO_WINOGRAD_NONFUSED, CUDNN_STATUS_SUCCESS,
                 bwd_data_ws(g, CUDNN_CONVOLUTION_BWD_DATA_ALGO_WINOGRAD_NONFUSED), true, m),
             perf<cudnnConvolutionBwdDataAlgoPerf_t>(
                 CUDNN_CONVOLUTION_BWD_DATA_ALGO_1, CUDNN_STATUS_SUCCESS,
                 bwd_data_ws(g, CUDNN_CONVOLUTION_BWD_DATA_ALGO_1), true, m),
         });
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnGetConvolutionBackwardFilterAlgorithm_v7(
    cudnnHandle_t, cudnnTensorDescriptor_t x, cudnnTensorDescriptor_t dy,
    cudnnConvolutionDescriptor_t cv, cudnnFilterDescriptor_t dw, int want, int *got,
    cudnnConvolutionBwdFilterAlgoPerf_t *out)
{
    const in_call call("cudnnGetConvolutionBackwardFilterAlgorithm_v7");
    conv_geom g = {};
    cudnnStatus_t s = geom(x, dw, cv, dy, &g);
    if (s != CUDNN_STATUS_SUCCESS) {
        return s;
    }
    const cudnnMathType_t m = reported(cv);
    rank(out, want, got,
         std::vector<cudnnConvolutionBwdFilterAlgoPerf_t>{
             perf<cudnnConvolutionBwdFilterAlgoPerf_t>(
                 CUDNN_CONVOLUTION_BWD_FILTER_ALGO_3, CUDNN_STATUS_SUCCESS,
                 bwd_filter_ws(g, CUDNN_CONVOLUTION_BWD_FILTER_ALGO_3), false, m),
             perf<cudnnConvolutionBwdFilterAlgoPerf_t>(CUDNN_CONVOLUTION_BWD_FILTER_ALGO_0,
                                                       CUDNN_STATUS_SUCCESS, 0, false, m),
             perf<cudnnConvolutionBwdFilterAlgoPerf_t>(
                 CUDNN_CONVOLUTION_BWD_FILTER_ALGO_FFT_TILING, CUDNN_STATUS_SUCCESS,
                 bwd_filter_ws(g, CUDNN_CONVOLUTION_BWD_FILTER_ALGO_FFT_TILING), true, m),
             perf<cudnnConvolutionBwdFilterAlgoPerf_t>(
                 CUDNN_CONVOLUTION_BWD_FILTER_ALGO_1, CUDNN_STATUS_SUCCESS,
                 bwd_filter_ws(g, CUDNN_CONVOLUTION_BWD_FILTER_ALGO_1), true, m),
         });
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnGetConvolutionForwardWorkspaceSize(cudnnHandle_t, cudnnTensorDescriptor_t x,
                                                      cudnnFilterDescriptor_t w,
                                                      cudnnConvolutionDescriptor_t cv,
                                                      cudnnTensorDescriptor_t y,
                                                      cudnnConvolutionFwdAlgo_t a, size_t *bytes)
{
    conv_geom g = {};
    const in_call call("cudnnGetConvolutionForwardWorkspaceSize");
    cudnnStatus_t s = geom(x, w, cv, y, &g);
    *bytes = s == CUDNN_STATUS_SUCCESS ? fwd_ws(g, a) : 0;
    return s;
}

cudnnStatus_t cudnnGetConvolutionBackwardDataWorkspaceSize(cudnnHandle_t, cudnnFilterDescriptor_t w,
                                                           cudnnTensorDescriptor_t dy,
                                                           cudnnConvolutionDescriptor_t cv,
                                                           cudnnTensorDescriptor_t dx,
                                                           cudnnConvolutionBwdDataAlgo_t a,
                                                           size_t *bytes)
{
    conv_geom g = {};
    const in_call call("cudnnGetConvolutionBackwardDataWorkspaceSize");
    cudnnStatus_t s = geom(dx, w, cv, dy, &g);
    *bytes = s == CUDNN_STATUS_SUCCESS ? bwd_data_ws(g, a) : 0;
    return s;
}

cudnnStatus_t cudnnGetConvolutionBackwardFilterWorkspaceSize(
    cudnnHandle_t, cudnnTensorDescriptor_t x, cudnnTensorDescriptor_t dy,
    cudnnConvolutionDescriptor_t cv, cudnnFilterDescriptor_t dw, cudnnConvolutionBwdFilterAlgo_t a,
    size_t *bytes)
{
    conv_geom g = {};
    const in_call call("cudnnGetConvolutionBackwardFilterWorkspaceSize");
    cudnnStatus_t s = geom(x, dw, cv, dy, &g);
    *bytes = s == CUDNN_STATUS_SUCCESS ? bwd_filter_ws(g, a) : 0;
    return s;
}

cudnnStatus_t cudnnConvolutionForward(cudnnHandle_t h, const void *alpha,
                                      cudnnTensorDescriptor_t xd, const void *xv,
                                      cudnnFilterDescriptor_t wd, const void *wv,
                                      cudnnConvolutionDescriptor_t cv, cudnnConvolutionFwdAlgo_t a,
                                      void *ws, size_t ws_bytes, const void *beta,
                                      cudnnTensorDescriptor_t yd, void *yv)
{
    device_access rw("cudnnConvolutionForward");
    conv_geom g = {};
    cudnnStatus_t s;
    const bool known =
        a <= CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD_NONFUSED && a != CUDNN_CONVOLUTION_FWD_ALGO_DIRECT;
    if ((s = geom(xd, wd, cv, yd, &g)) || (s = conv_operands(g, known, (int)a, xv, "x", wv, "w", yv,
                                                             "y", ws, ws_bytes, fwd_ws(g, a)))) {
        return s;
    }
    const conv_math m = call_math(cv, fwd_transform(a), false);
    const std::vector<float> x = rounded((const float *)xv, g.nx(), m.r),
                             w = rounded((const float *)wv, g.nw(), m.r);
    float *y = (float *)yv;
    summer sum{{}, m.nondet, h->calls++};
    for (int n = 0; n < g.N; n++) {
        for (int k = 0; k < g.K; k++) {
            for (int oh = 0; oh < g.OH; oh++) {
                for (int ow = 0; ow < g.OW; ow++) {
                    sum.clear();
                    for (int c = 0; c < g.C; c++) {
                        for (int kh = 0; kh < g.KH; kh++) {
                            const int ih = oh * cv->u - cv->ph + kh * cv->dh;
                            for (int kw = 0; kw < g.KW; kw++) {
                                const int iw = ow * cv->v - cv->pw + kw * cv->dw;
                                if (ih >= 0 && ih < g.H && iw >= 0 && iw < g.W) {
                                    sum.terms.push_back(
                                        x[(((size_t)n * g.C + c) * g.H + ih) * g.W + iw] *
                                        w[tap(g, k, c, kh, kw)]);
                                }
                            }
                        }
                    }
                    blend(&y[(((size_t)n * g.K + k) * g.OH + oh) * g.OW + ow], sum.sum(),
                          *(const float *)alpha, *(const float *)beta);
                }
            }
        }
    }
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnConvolutionBackwardData(cudnnHandle_t h, const void *alpha,
                                           cudnnFilterDescriptor_t wd, const void *wv,
                                           cudnnTensorDescriptor_t dyd, const void *dyv,
                                           cudnnConvolutionDescriptor_t cv,
                                           cudnnConvolutionBwdDataAlgo_t a, void *ws,
                                           size_t ws_bytes, const void *beta,
                                           cudnnTensorDescriptor_t dxd, void *dxv)
{
    device_access rw("cudnnConvolutionBackwardData");
    conv_geom g = {};
    cudnnStatus_t s;
    if ((s = geom(dxd, wd, cv, dyd, &g)) ||
        (s = conv_operands(g, a < CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT, (int)a, dxv, "dx", wv, "w",
                           dyv, "dy", ws, ws_bytes, bwd_data_ws(g, a)))) {
        return s;
    }
    const conv_math m =
        call_math(cv, bwd_data_transform(a), a == CUDNN_CONVOLUTION_BWD_DATA_ALGO_0);
    const std::vector<float> w = rounded((const float *)wv, g.nw(), m.r),
                             dy = rounded((const float *)dyv, g.ny(), m.r);
    float *dx = (float *)dxv;
    summer sum{{}, m.nondet, h->calls++};
    for (int n = 0; n < g.N; n++) {
        for (int c = 0; c < g.C; c++) {
            for (int ih = 0; ih < g.H; ih++) {
                for (int iw = 0; iw < g.W; iw++) {
                    sum.clear();
                    for (int k = 0; k < g.K; k++) {
                        for (int kh = 0; kh < g.KH; kh++) {
                            const int th = ih + cv->ph - kh * cv->dh;
                            if (th < 0 || th % cv->u || th / cv->u >= g.OH) {
                                continue;
                            }
                            for (int kw = 0; kw < g.KW; kw++) {
                                const int tw = iw + cv->pw - kw * cv->dw;
                                if (tw < 0 || tw % cv->v || tw / cv->v >= g.OW) {
                                    continue;
                                }
                                sum.terms.push_back(
                                    dy[(((size_t)n * g.K + k) * g.OH + th / cv->u) * g.OW +
                                       tw / cv->v] *
                                    w[tap(g, k, c, kh, kw)]);
                            }
                        }
                    }
                    blend(&dx[(((size_t)n * g.C + c) * g.H + ih) * g.W + iw], sum.sum(),
                          *(const float *)alpha, *(const float *)beta);
                }
            }
        }
    }
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnConvolutionBackwardFilter(cudnnHandle_t h, const void *alpha,
                                             cudnnTensorDescriptor_t xd, const void *xv,
                                             cudnnTensorDescriptor_t dyd, const void *dyv,
                                             cudnnConvolutionDescriptor_t cv,
                                             cudnnConvolutionBwdFilterAlgo_t a, void *ws,
                                             size_t ws_bytes, const void *beta,
                                             cudnnFilterDescriptor_t dwd, void *dwv)
{
    device_access rw("cudnnConvolutionBackwardFilter");
    conv_geom g = {};
    cudnnStatus_t s;
    if ((s = geom(xd, dwd, cv, dyd, &g)) ||
        (s = conv_operands(g, a < CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT, (int)a, xv, "x", dwv,
                           "dw", dyv, "dy", ws, ws_bytes, bwd_filter_ws(g, a)))) {
        return s;
    }
    const conv_math m = call_math(cv, bwd_filter_transform(a),
                                  a == CUDNN_CONVOLUTION_BWD_FILTER_ALGO_0 ||
                                      a == CUDNN_CONVOLUTION_BWD_FILTER_ALGO_3);
    const std::vector<float> x = rounded((const float *)xv, g.nx(), m.r),
                             dy = rounded((const float *)dyv, g.ny(), m.r);
    float *dw = (float *)dwv;
    summer sum{{}, m.nondet, h->calls++};
    for (int k = 0; k < g.K; k++) {
        for (int c = 0; c < g.C; c++) {
            for (int kh = 0; kh < g.KH; kh++) {
                for (int kw = 0; kw < g.KW; kw++) {
                    sum.clear();
                    for (int n = 0; n < g.N; n++) {
                        for (int oh = 0; oh < g.OH; oh++) {
                            const int ih = oh * cv->u - cv->ph + kh * cv->dh;
                            if (ih < 0 || ih >= g.H) {
                                continue;
                            }
                            for (int ow = 0; ow < g.OW; ow++) {
                                const int iw = ow * cv->v - cv->pw + kw * cv->dw;
                                if (iw >= 0 && iw < g.W) {
                                    sum.terms.push_back(
                                        x[(((size_t)n * g.C + c) * g.H + ih) * g.W + iw] *
                                        dy[(((size_t)n * g.K + k) * g.OH + oh) * g.OW + ow]);
                                }
                            }
                        }
                    }
                    blend(&dw[tap(g, k, c, kh, kw)], sum.sum(), *(const float *)alpha,
                          *(const float *)beta);
                }
            }
        }
    }
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnConvolutionBackwardBias(cudnnHandle_t, const void *alpha,
                                           cudnnTensorDescriptor_t dyd, const void *dyv,
                                           const void *beta, cudnnTensorDescriptor_t dbd, void *dbv)
{
    device_access rw("cudnnConvolutionBackwardBias");
    if (!dyd->set || !dbd->set || dbd->n != 1 || dbd->c != dyd->c || dbd->h != 1 || dbd->w != 1) {
        return dnn_fail(CUDNN_STATUS_BAD_PARAM, "db (%d,%d,%d,%d) for dy (%d,%d,%d,%d)", dbd->n,
                        dbd->c, dbd->h, dbd->w, dyd->n, dyd->c, dyd->h, dyd->w);
    }
    const size_t ny = elems(dyd->n, dyd->c, dyd->h, dyd->w);
    cudnnStatus_t s;
    if ((s = on_device(dyv, ny, "dy")) || (s = on_device(dbv, (size_t)dyd->c, "db"))) {
        return s;
    }
    const float *dy = (const float *)dyv;
    float *db = (float *)dbv;
    const size_t hw = (size_t)dyd->h * dyd->w;
    for (int c = 0; c < dyd->c; c++) {
        double acc = 0;
        for (int n = 0; n < dyd->n; n++) {
            for (size_t i = 0; i < hw; i++) {
                acc += dy[((size_t)n * dyd->c + c) * hw + i];
            }
        }
        blend(&db[c], (float)acc, *(const float *)alpha, *(const float *)beta);
    }
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnAddTensor(cudnnHandle_t, const void *alpha, cudnnTensorDescriptor_t ad,
                             const void *Av, const void *beta, cudnnTensorDescriptor_t cd, void *Cv)
{
    device_access rw("cudnnAddTensor");
    const int adims[4] = {ad->n, ad->c, ad->h, ad->w}, cdims[4] = {cd->n, cd->c, cd->h, cd->w};
    for (int i = 0; i < 4; i++) {
        if (!ad->set || !cd->set || (adims[i] != cdims[i] && adims[i] != 1)) {
            return dnn_fail(CUDNN_STATUS_BAD_PARAM,
                            "A (%d,%d,%d,%d) does not broadcast to C "
                            "(%d,%d,%d,%d)",
                            ad->n, ad->c, ad->h, ad->w, cd->n, cd->c, cd->h, cd->w);
        }
    }
    cudnnStatus_t s;
    if ((s = on_device(Av, elems(ad->n, ad->c, ad->h, ad->w), "A")) ||
        (s = on_device(Cv, elems(cd->n, cd->c, cd->h, cd->w), "C"))) {
        return s;
    }
    const float *A = (const float *)Av;
    float *C = (float *)Cv;
    for (int n = 0; n < cd->n; n++) {
        for (int c = 0; c < cd->c; c++) {
            for (int hh = 0; hh < cd->h; hh++) {
                for (int ww = 0; ww < cd->w; ww++) {
                    const size_t ai =
                        (((size_t)(ad->n == 1 ? 0 : n) * ad->c + (ad->c == 1 ? 0 : c)) * ad->h +
                         (ad->h == 1 ? 0 : hh)) *
                            ad->w +
                        (ad->w == 1 ? 0 : ww);
                    blend(&C[(((size_t)n * cd->c + c) * cd->h + hh) * cd->w + ww], A[ai],
                          *(const float *)alpha, *(const float *)beta);
                }
            }
        }
    }
    return CUDNN_STATUS_SUCCESS;
}
