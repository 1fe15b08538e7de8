/* A file mapped read-only and truncated (or a network drive gone) while the engine reads it: the
 * next touch of a page past the new end raises SIGBUS, which by default kills the process, the
 * window with it. The guard keeps a table of the mapped ranges (engine/files/mapped.py registers each
 * mapping); its SIGBUS handler, for a fault inside one of them, maps a page of zeros over the
 * faulting page (so the instruction that faulted reads zeros and the step ends, with a wrong result)
 * and counts the fault against the range; the engine reads the count after each step and reports
 * the model's file as changed on disk, unloading it. A fault anywhere else goes to the handler that
 * was there before (Python's faulthandler, or the default: the crash it always was).
 *
 * mmap is not on POSIX's list of async-signal-safe functions, but it is a system call with no user
 * state, and mapping over the faulting page from the handler is what JVMs and databases do. */
#define _DEFAULT_SOURCE 1  /* sigaction, SA_*, MAP_ANONYMOUS under -std=c11 */
#include "mdk.h"

#if !defined(_WIN32)
#include <signal.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define MDK_GUARD_MAX 64
typedef struct { volatile uintptr_t lo, hi; volatile int faults; } mdk_range;
static mdk_range ranges[MDK_GUARD_MAX];
static struct sigaction previous;

static void on_sigbus(int sig, siginfo_t *info, void *uctx) {
    uintptr_t a = (uintptr_t)info->si_addr;
    for (int i = 0; i < MDK_GUARD_MAX; i++) {
        if (ranges[i].hi && a >= ranges[i].lo && a < ranges[i].hi) {
            long page = sysconf(_SC_PAGESIZE);
            void *p = (void *)(a & ~(uintptr_t)(page - 1));
            if (mmap(p, (size_t)page, PROT_READ, MAP_FIXED | MAP_PRIVATE | MAP_ANONYMOUS, -1, 0) != MAP_FAILED) {
                __atomic_add_fetch(&ranges[i].faults, 1, __ATOMIC_SEQ_CST);
                return;  /* the faulting load runs again and reads zeros */
            }
            break;
        }
    }
    /* not ours (or the page could not be replaced): what was there before */
    if (previous.sa_flags & SA_SIGINFO) {
        if (previous.sa_sigaction) { previous.sa_sigaction(sig, info, uctx); return; }
    } else if (previous.sa_handler != SIG_DFL && previous.sa_handler != SIG_IGN && previous.sa_handler) {
        previous.sa_handler(sig);
        return;
    }
    signal(SIGBUS, SIG_DFL);
    raise(SIGBUS);
}

static int install(void) {
    struct sigaction cur;
    if (sigaction(SIGBUS, NULL, &cur)) return -1;
    if ((cur.sa_flags & SA_SIGINFO) && cur.sa_sigaction == on_sigbus) return 0;  /* ours is the one */
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_sigbus;
    sa.sa_flags = SA_SIGINFO | SA_NODEFER;
    sigemptyset(&sa.sa_mask);
    if (sigaction(SIGBUS, &sa, &previous)) return -1;
    return 0;
}

/* Watch [base, base + len): the slot (>= 0) to read faults from, or -1 (table full, no handler). */
MDK_API int mdk_guard_add(const void *base, size_t len) {
    if (install()) return -1;
    for (int i = 0; i < MDK_GUARD_MAX; i++) {
        if (!ranges[i].hi) {
            ranges[i].faults = 0;
            ranges[i].lo = (uintptr_t)base;
            __atomic_store_n(&ranges[i].hi, (uintptr_t)base + len, __ATOMIC_SEQ_CST);
            return i;
        }
    }
    return -1;
}

MDK_API void mdk_guard_remove(int slot) {
    if (slot >= 0 && slot < MDK_GUARD_MAX) __atomic_store_n(&ranges[slot].hi, 0, __ATOMIC_SEQ_CST);
}

MDK_API int mdk_guard_faults(int slot) {
    return slot >= 0 && slot < MDK_GUARD_MAX ? __atomic_load_n(&ranges[slot].faults, __ATOMIC_SEQ_CST) : 0;
}

/* Install the handler again if another replaced it since (faulthandler enabled later): that one is
 * then the one chained to. */
MDK_API int mdk_guard_reinstall(void) { return install(); }
#else
MDK_API int mdk_guard_add(const void *base, size_t len) { (void)base; (void)len; return -1; }
MDK_API void mdk_guard_remove(int slot) { (void)slot; }
MDK_API int mdk_guard_faults(int slot) { (void)slot; return 0; }
MDK_API int mdk_guard_reinstall(void) { return -1; }
#endif
