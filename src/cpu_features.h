/* Run-time CPU features and build facts, read by gguflm._ext.system (the one place that decides
 * which ISA runs, see dispatch.h).
 *
 * An instruction set is usable only when the CPU has it (CPUID) and the OS saves its registers
 * across context switches (XCR0, read with XGETBV, which is itself legal only once CPUID reports
 * OSXSAVE): a hypervisor or kernel may advertise AVX-512 or AMX in CPUID and still leave their
 * state disabled, and then the instructions fault. The decision is one pure function of the CPUID
 * and XCR0 words (gguflm_cpu_decide), so tests can hand it any machine; gguflm_cpu_read gathers
 * the words of this one. AMX needs a third yes on Linux: the kernel's permission to use the tile
 * data state (arch_prctl ARCH_REQ_XCOMP_PERM), without which the first tile instruction kills the
 * process with SIGILL.
 */
#ifndef GGUFLM_CPU_FEATURES_H
#define GGUFLM_CPU_FEATURES_H

#include <stdint.h>
#include "dispatch.h"

#if defined(__x86_64__) || defined(__i386__)
#define GGUFLM_X86 1
#include <cpuid.h>
#else
#define GGUFLM_X86 0
#endif

/* the words the decision reads */
typedef struct {
    uint32_t max_leaf;          /* CPUID.0:EAX, the highest basic leaf */
    uint32_t vendor[3];         /* CPUID.0:EBX, EDX, ECX: "GenuineIntel", "AuthenticAMD", ... */
    uint32_t ecx1;              /* CPUID.1:ECX */
    uint32_t ebx7, ecx7, edx7;  /* CPUID.(EAX=7, ECX=0) */
    uint32_t eax7_1;            /* CPUID.(EAX=7, ECX=1); only read when CPUID.(7,0):EAX says it exists */
    uint64_t xcr0;              /* XGETBV(ECX=0); only read, and only meaningful, with OSXSAVE */
} gguflm_cpuid_words;

/* features, one bit each */
enum {
    GGUFLM_CPU_AVX = 1 << 0,
    GGUFLM_CPU_FMA = 1 << 1,
    GGUFLM_CPU_F16C = 1 << 2,
    GGUFLM_CPU_AVX2 = 1 << 3,
    GGUFLM_CPU_AVX512F = 1 << 4,
    GGUFLM_CPU_AVX512DQ = 1 << 5,
    GGUFLM_CPU_AVX512BW = 1 << 6,
    GGUFLM_CPU_AVX512VL = 1 << 7,
    GGUFLM_CPU_AVX512_VNNI = 1 << 8,
    GGUFLM_CPU_AMX_TILE = 1 << 9,
    GGUFLM_CPU_AMX_INT8 = 1 << 10,
    GGUFLM_CPU_AMX_BF16 = 1 << 11,
    GGUFLM_CPU_AVX512_BF16 = 1 << 12,
    GGUFLM_CPU_AVX512_FP16 = 1 << 13,
    GGUFLM_CPU_AVX512_VBMI = 1 << 14,
    GGUFLM_CPU_GFNI = 1 << 15,
    GGUFLM_CPU_AVX512_BITALG = 1 << 16,
    GGUFLM_CPU_FEATURE_COUNT = 17,
};
static const char *const gguflm_cpu_feature_names[GGUFLM_CPU_FEATURE_COUNT] = {
    "avx", "fma", "f16c", "avx2", "avx512f", "avx512dq", "avx512bw", "avx512vl", "avx512_vnni",
    "amx_tile", "amx_int8", "amx_bf16", "avx512_bf16", "avx512_fp16", "avx512vbmi", "gfni", "avx512_bitalg"};

/* CPU makers whose native builds GCC tunes differently (see gguflm_arith_native) */
enum { GGUFLM_VENDOR_OTHER = 0, GGUFLM_VENDOR_INTEL = 1, GGUFLM_VENDOR_AMD = 2, GGUFLM_VENDOR_COUNT = 3 };
static const char *const gguflm_vendor_names[GGUFLM_VENDOR_COUNT] = {"other", "intel", "amd"};

/* register states the OS enables in XCR0 */
enum { GGUFLM_OS_AVX = 1 << 0, GGUFLM_OS_AVX512 = 1 << 1, GGUFLM_OS_AMX = 1 << 2 };

/* XCR0 bits: 1 SSE, 2 AVX (upper YMM); 5 opmask, 6 ZMM_Hi256, 7 Hi16_ZMM; 17 XTILECFG, 18 XTILEDATA */
#define GGUFLM_XCR0_AVX ((uint64_t)0x6)
#define GGUFLM_XCR0_AVX512 ((uint64_t)0xe0 | GGUFLM_XCR0_AVX)
#define GGUFLM_XCR0_AMX ((uint64_t)0x60000)

#define GGUFLM_CPU_AVX_FAMILY (GGUFLM_CPU_AVX | GGUFLM_CPU_FMA | GGUFLM_CPU_F16C | GGUFLM_CPU_AVX2)
#define GGUFLM_CPU_AVX512_FAMILY (GGUFLM_CPU_AVX512F | GGUFLM_CPU_AVX512DQ | GGUFLM_CPU_AVX512BW | \
                                  GGUFLM_CPU_AVX512VL | GGUFLM_CPU_AVX512_VNNI)
/* what the VBMI grid i-quant kernels execute besides the AVX-512 ISA's (gguflm_vbmi_runs) */
#define GGUFLM_CPU_VBMI_SET (GGUFLM_CPU_AVX512_VBMI | GGUFLM_CPU_GFNI | GGUFLM_CPU_AVX512_BITALG)
/* everything that runs on the AVX-512 register state (the kernels need only the family above;
 * the VBMI set also picks faster grid i-quant kernels, see gguflm_vbmi_runs; GFNI counts here
 * because the kernels use its 512-bit form) */
#define GGUFLM_CPU_AVX512_STATE (GGUFLM_CPU_AVX512_FAMILY | GGUFLM_CPU_AVX512_BF16 | GGUFLM_CPU_AVX512_FP16 | \
                                 GGUFLM_CPU_VBMI_SET)
#define GGUFLM_CPU_AMX_FAMILY (GGUFLM_CPU_AMX_TILE | GGUFLM_CPU_AMX_INT8 | GGUFLM_CPU_AMX_BF16)

typedef struct {
    uint32_t cpu;     /* GGUFLM_CPU_*: what CPUID advertises */
    uint32_t os;      /* GGUFLM_OS_*: the register states XCR0 enables (none without OSXSAVE) */
    uint32_t usable;  /* GGUFLM_CPU_*: what the CPU has and the OS enables (AMX: before permission) */
    int vendor;       /* GGUFLM_VENDOR_* */
} gguflm_cpu_features;

/* the 12 vendor bytes of CPUID leaf 0 (EBX, EDX, ECX) */
static inline int gguflm_vendor_is(const uint32_t v[3], const char name[12]) {
    for (int i = 0; i < 12; ++i)
        if ((char)(v[i / 4] >> (8 * (i % 4))) != name[i]) return 0;
    return 1;
}

static inline uint32_t gguflm_bit(uint32_t word, int bit) { return (word >> bit) & 1u; }

/* Where CPUID reports each feature (Intel SDM vol. 2A, CPUID): CPUID.1:ECX (12 FMA, 28 AVX, 29
 * F16C); CPUID.(7,0):EBX (5 AVX2, 16 AVX512F, 17 AVX512DQ, 30 AVX512BW, 31 AVX512VL), ECX (1
 * AVX512_VBMI, 8 GFNI, 11 AVX512_VNNI, 12 AVX512_BITALG), EDX (22 AMX-BF16, 23 AVX512_FP16, 24
 * AMX-TILE, 25 AMX-INT8); CPUID.(7,1):EAX (5 AVX512_BF16). Indexed like gguflm_cpu_feature_names. */
enum { GGUFLM_WORD_ECX1, GGUFLM_WORD_EBX7, GGUFLM_WORD_ECX7, GGUFLM_WORD_EDX7, GGUFLM_WORD_EAX7_1 };
static const struct { uint8_t word, bit; } gguflm_cpuid_bits[GGUFLM_CPU_FEATURE_COUNT] = {
    {GGUFLM_WORD_ECX1, 28}, {GGUFLM_WORD_ECX1, 12}, {GGUFLM_WORD_ECX1, 29}, {GGUFLM_WORD_EBX7, 5},
    {GGUFLM_WORD_EBX7, 16}, {GGUFLM_WORD_EBX7, 17}, {GGUFLM_WORD_EBX7, 30}, {GGUFLM_WORD_EBX7, 31},
    {GGUFLM_WORD_ECX7, 11}, {GGUFLM_WORD_EDX7, 24}, {GGUFLM_WORD_EDX7, 25}, {GGUFLM_WORD_EDX7, 22},
    {GGUFLM_WORD_EAX7_1, 5}, {GGUFLM_WORD_EDX7, 23}, {GGUFLM_WORD_ECX7, 1}, {GGUFLM_WORD_ECX7, 8},
    {GGUFLM_WORD_ECX7, 12}};

static inline uint32_t *gguflm_cpuid_word(gguflm_cpuid_words *w, int word) {
    uint32_t *words[] = {&w->ecx1, &w->ebx7, &w->ecx7, &w->edx7, &w->eax7_1};
    return words[word];
}

static gguflm_cpu_features gguflm_cpu_decide(const gguflm_cpuid_words *w) {
    gguflm_cpu_features f = {0, 0, 0, GGUFLM_VENDOR_OTHER};
    gguflm_cpuid_words c = *w;
    int osxsave = 0;
    if (gguflm_vendor_is(w->vendor, "GenuineIntel")) f.vendor = GGUFLM_VENDOR_INTEL;
    else if (gguflm_vendor_is(w->vendor, "AuthenticAMD")) f.vendor = GGUFLM_VENDOR_AMD;
    if (w->max_leaf >= 1) osxsave = (int)gguflm_bit(w->ecx1, 27);  /* CPUID.1:ECX.OSXSAVE */
    for (int i = 0; i < GGUFLM_CPU_FEATURE_COUNT; i++) {
        const int word = gguflm_cpuid_bits[i].word;
        if (w->max_leaf >= (word == GGUFLM_WORD_ECX1 ? 1u : 7u) &&
            gguflm_bit(*gguflm_cpuid_word(&c, word), gguflm_cpuid_bits[i].bit))
            f.cpu |= 1u << i;
    }
    if (osxsave) {
        f.os |= (w->xcr0 & GGUFLM_XCR0_AVX) == GGUFLM_XCR0_AVX ? GGUFLM_OS_AVX : 0;
        f.os |= (w->xcr0 & GGUFLM_XCR0_AVX512) == GGUFLM_XCR0_AVX512 ? GGUFLM_OS_AVX512 : 0;
        f.os |= (w->xcr0 & GGUFLM_XCR0_AMX) == GGUFLM_XCR0_AMX ? GGUFLM_OS_AMX : 0;
    }
    /* VEX-encoded FMA and F16C need the AVX state as AVX does */
    f.usable = f.cpu & ~(uint32_t)(GGUFLM_CPU_AVX_FAMILY | GGUFLM_CPU_AVX512_STATE | GGUFLM_CPU_AMX_FAMILY);
    f.usable |= (f.os & GGUFLM_OS_AVX) ? f.cpu & GGUFLM_CPU_AVX_FAMILY : 0;
    f.usable |= (f.os & GGUFLM_OS_AVX512) ? f.cpu & GGUFLM_CPU_AVX512_STATE : 0;
    f.usable |= (f.os & GGUFLM_OS_AMX) ? f.cpu & GGUFLM_CPU_AMX_FAMILY : 0;
    return f;
}

/* w as CPUID and XCR0 would read on a machine with only the features `keep` (GGUFLM_CPU_*) of
 * w's: the others' bits cleared, and the register states none of the kept features needs off (a
 * CPU without AVX-512 has no such states for the OS to enable) */
static gguflm_cpuid_words gguflm_cpu_keep(const gguflm_cpuid_words *w, uint32_t keep) {
    gguflm_cpuid_words c = *w;
    for (int i = 0; i < GGUFLM_CPU_FEATURE_COUNT; i++)
        if (!(keep >> i & 1u)) *gguflm_cpuid_word(&c, gguflm_cpuid_bits[i].word) &= ~(1u << gguflm_cpuid_bits[i].bit);
    if (!(keep & GGUFLM_CPU_AVX512_STATE)) c.xcr0 &= ~(GGUFLM_XCR0_AVX512 & ~GGUFLM_XCR0_AVX);
    if (!(keep & GGUFLM_CPU_AMX_FAMILY)) c.xcr0 &= ~GGUFLM_XCR0_AMX;
    return c;
}

/* what each kernel variant executes (quants_simd.h's target regions: avx2,fma,f16c; the AVX-512
 * one adds avx512f/bw/vl/dq/vnni, the AVX512_BF16 one avx512bf16) */
static const uint32_t gguflm_isa_needs[GGUFLM_ISA_COUNT] = {
    [GGUFLM_ISA_SCALAR] = 0,
    [GGUFLM_ISA_AVX2] = GGUFLM_CPU_AVX_FAMILY,
    [GGUFLM_ISA_AVX512] = GGUFLM_CPU_AVX_FAMILY | GGUFLM_CPU_AVX512_FAMILY,
    [GGUFLM_ISA_AVX512BF16] = GGUFLM_CPU_AVX_FAMILY | GGUFLM_CPU_AVX512_FAMILY | GGUFLM_CPU_AVX512_BF16,
};

static inline int gguflm_isa_runs(const gguflm_cpu_features *f, int isa) {
    return isa >= 0 && isa < GGUFLM_ISA_COUNT && (f->usable & gguflm_isa_needs[isa]) == gguflm_isa_needs[isa];
}

/* whether f runs the VBMI grid i-quant kernels (an AVX-512 ISA's kernels with AVX512_VBMI, GFNI
 * and AVX512_BITALG: every CPU with the first since Ice Lake and Zen 4 has all three) */
static inline int gguflm_vbmi_runs(const gguflm_cpu_features *f) {
    return gguflm_isa_runs(f, GGUFLM_ISA_AVX512) && (f->usable & GGUFLM_CPU_VBMI_SET) == GGUFLM_CPU_VBMI_SET;
}

/* the most capable ISA f runs */
static inline int gguflm_isa_best(const gguflm_cpu_features *f) {
    int isa = GGUFLM_ISA_COUNT - 1;
    while (isa > GGUFLM_ISA_SCALAR && !gguflm_isa_runs(f, isa)) --isa;
    return isa;
}

/* the ggml-cpu build llama.cpp compiles natively for f: -march=native turns on __AVX512F__, and with
 * it ggml's 16-float vectors, wherever the compiler sees usable AVX-512F; __AVX512BF16__ where it
 * sees AVX512_BF16; and GCC tunes its auto-vectorizer for 256-bit vectors on Intel's AVX-512
 * cores (x86-tune.def: avx256_optimal), for 512-bit ones on AMD's (the only AVX-512 CPUs it
 * knows without that tuning all have AVX512_BF16) */
static inline int gguflm_arith_native(const gguflm_cpu_features *f) {
    if (!(f->usable & GGUFLM_CPU_AVX512F)) return GGUFLM_ARITH_AVX2;
    if (!(f->usable & GGUFLM_CPU_AVX512_BF16)) return GGUFLM_ARITH_AVX512;
    return f->vendor == GGUFLM_VENDOR_AMD ? GGUFLM_ARITH_ZEN4 : GGUFLM_ARITH_AVX512BF16;
}

#if GGUFLM_X86
static inline uint64_t gguflm_xgetbv0(void) {
    uint32_t lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return ((uint64_t)hi << 32) | lo;
}
#endif

/* this machine's words */
static gguflm_cpuid_words gguflm_cpu_read(void) {
    gguflm_cpuid_words w = {0, {0, 0, 0}, 0, 0, 0, 0, 0, 0};
#if GGUFLM_X86
    unsigned a, b, c, d;
    w.max_leaf = __get_cpuid_max(0, 0);  /* 0 where there is no CPUID (old 32-bit CPUs) */
    if (w.max_leaf >= 1) {
        __cpuid(0, a, b, c, d);
        w.vendor[0] = b, w.vendor[1] = d, w.vendor[2] = c;
        __cpuid(1, a, b, c, d);
        w.ecx1 = c;
    }
    if (w.max_leaf >= 7) {
        __cpuid_count(7, 0, a, b, c, d);
        w.ebx7 = b, w.ecx7 = c, w.edx7 = d;
        if (a >= 1) {  /* CPUID.(7,0):EAX is the highest subleaf of leaf 7 */
            __cpuid_count(7, 1, a, b, c, d);
            w.eax7_1 = a;
        }
    }
    if (gguflm_bit(w.ecx1, 27)) w.xcr0 = gguflm_xgetbv0();  /* without OSXSAVE, XGETBV is #UD */
#endif
    return w;
}

/* ---- AMX tile data permission (Linux >= 5.16; elsewhere never granted) ---- */
#if GGUFLM_X86 && defined(__x86_64__) && defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#define GGUFLM_ARCH_GET_XCOMP_PERM 0x1022
#define GGUFLM_ARCH_REQ_XCOMP_PERM 0x1023
#define GGUFLM_XFEATURE_XTILEDATA 18

/* whether this process may use the tile data state now (asks for nothing) */
static int gguflm_amx_permitted(void) {
    unsigned long bits = 0;
    return syscall(SYS_arch_prctl, GGUFLM_ARCH_GET_XCOMP_PERM, &bits) == 0 &&
           ((bits >> GGUFLM_XFEATURE_XTILEDATA) & 1);
}

/* ask the kernel for the tile data state for the whole process; 1 when granted */
static int gguflm_amx_request(void) {
    return syscall(SYS_arch_prctl, GGUFLM_ARCH_REQ_XCOMP_PERM, GGUFLM_XFEATURE_XTILEDATA) == 0;
}
#else
static int gguflm_amx_permitted(void) { return 0; }
static int gguflm_amx_request(void) { return 0; }
#endif

#if defined(__clang__)
#define GGUFLM_COMPILER "clang " __clang_version__
#elif defined(__GNUC__)
#define GGUFLM_COMPILER "gcc " __VERSION__
#else
#define GGUFLM_COMPILER "unknown"
#endif

#endif
