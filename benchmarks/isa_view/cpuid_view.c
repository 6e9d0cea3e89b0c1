/* cpuid_view: answer CPUID as an AVX2-only x86 CPU would (no AVX-512, no VNNI, no BF16, no AMX), or,
 * built with -DVIEW_NO_AMX, as the same CPU without AMX only (an AVX-512 VNNI CPU of an older generation).
 *
 * Loaded with LD_PRELOAD into a process whose libraries were prepared by make_view.py: there every
 * CPUID instruction (bytes 0F A2) of the chosen shared objects was rewritten as INT3 + NOP (CC 90).
 * The INT3 raises SIGTRAP; the handler below runs the real CPUID for the leaf and subleaf in EAX and
 * ECX, clears the feature bits of the extensions an AVX2-only CPU lacks, writes the four registers
 * back and steps over the NOP. Code that reads CPUID anywhere else (the dynamic loader, numpy) sees
 * the real CPU; that is why the libraries are patched rather than the process. XGETBV is left as it
 * is: the OS still enables the AVX-512 register state, but code that finds no AVX512F in CPUID does
 * not use it.
 *
 * Build: cc -O2 -shared -fPIC -o cpuid_view.so cpuid_view.c                   (the AVX2-only view)
 *        cc -O2 -shared -fPIC -DVIEW_NO_AMX -o cpuid_view.so cpuid_view.c     (the no-AMX view)
 * Check: CPUID_VIEW_LOG=1 prints one line per emulated CPUID to stderr.
 */
#define _GNU_SOURCE
#include <cpuid.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <ucontext.h>
#include <unistd.h>

#define BIT(n) (1u << (n))

static int log_calls;

#ifdef VIEW_NO_AMX
/* Only the AMX family: leaf 7 subleaf 0 EDX AMX_BF16, AMX_TILE, AMX_INT8; subleaf 1 EAX AMX_FP16. */
static const uint32_t L7_EBX_OFF = 0;
static const uint32_t L7_ECX_OFF = 0;
static const uint32_t L7_EDX_OFF = BIT(22) | BIT(24) | BIT(25);
static const uint32_t L71_EAX_OFF = BIT(21);
static const uint32_t L71_EDX_OFF = 0;
#else
/* Leaf 7 subleaf 0, EBX: AVX512F, DQ, IFMA, PF, ER, CD, BW, VL. */
static const uint32_t L7_EBX_OFF = BIT(16) | BIT(17) | BIT(21) | BIT(26) | BIT(27) | BIT(28) | BIT(30) | BIT(31);
/* Leaf 7 subleaf 0, ECX: AVX512_VBMI, AVX512_VBMI2, GFNI, AVX512_VNNI, AVX512_BITALG, AVX512_VPOPCNTDQ. */
static const uint32_t L7_ECX_OFF = BIT(1) | BIT(6) | BIT(8) | BIT(11) | BIT(12) | BIT(14);
/* Leaf 7 subleaf 0, EDX: AVX512_4VNNIW, AVX512_4FMAPS, VP2INTERSECT, AMX_BF16, AVX512_FP16, AMX_TILE, AMX_INT8. */
static const uint32_t L7_EDX_OFF = BIT(2) | BIT(3) | BIT(8) | BIT(22) | BIT(23) | BIT(24) | BIT(25);
/* Leaf 7 subleaf 1, EAX: AVX_VNNI, AVX512_BF16, AMX_FP16, AVX_IFMA. EDX: AVX_VNNI_INT8, AVX_NE_CONVERT, AVX10. */
static const uint32_t L71_EAX_OFF = BIT(4) | BIT(5) | BIT(21) | BIT(23);
static const uint32_t L71_EDX_OFF = BIT(4) | BIT(5) | BIT(19);
#endif

static void mask(uint32_t leaf, uint32_t sub, uint32_t r[4])
{
    if (leaf == 7 && sub == 0) {
        r[1] &= ~L7_EBX_OFF;
        r[2] &= ~L7_ECX_OFF;
        r[3] &= ~L7_EDX_OFF;
    } else if (leaf == 7 && sub == 1) {
        r[0] &= ~L71_EAX_OFF;
        r[3] &= ~L71_EDX_OFF;
    }
}

static void on_trap(int sig, siginfo_t *info, void *context)
{
    (void) info;
    ucontext_t *uc = context;
    greg_t *g = uc->uc_mcontext.gregs;
    const unsigned char *rip = (const unsigned char *) g[REG_RIP];
    if (rip[-1] != 0xCC || rip[0] != 0x90) {
        /* Not a rewritten CPUID: behave as if this handler were not here. */
        signal(sig, SIG_DFL);
        raise(sig);
        return;
    }
    uint32_t leaf = (uint32_t) g[REG_RAX], sub = (uint32_t) g[REG_RCX], r[4];
    __cpuid_count(leaf, sub, r[0], r[1], r[2], r[3]);
    mask(leaf, sub, r);
    if (log_calls) {
        char line[128];
        int n = snprintf(line, sizeof line, "cpuid_view: leaf %#x.%u -> %08x %08x %08x %08x\n",
                         leaf, sub, r[0], r[1], r[2], r[3]);
        if (n > 0) write(2, line, (size_t) n);
    }
    g[REG_RAX] = r[0];
    g[REG_RBX] = r[1];
    g[REG_RCX] = r[2];
    g[REG_RDX] = r[3];
    g[REG_RIP] += 1; /* step over the NOP that follows the INT3 */
}

__attribute__((constructor)) static void install(void)
{
    log_calls = getenv("CPUID_VIEW_LOG") != NULL;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_trap;
    sa.sa_flags = SA_SIGINFO | SA_NODEFER;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTRAP, &sa, NULL);
}
