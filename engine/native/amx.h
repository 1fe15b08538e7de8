/* AMX tiles (Intel Xeon since Sapphire Rapids), as inline assembly with a memory clobber: the compilers'
 * own _tile_loadd/_tile_stored macros pass only the address, so a store the tile is to read (or a load of
 * what it wrote) may be moved across them. Tile numbers are literals (the instructions encode them).
 * Only where the assembler and OS have AMX: x86-64 Linux with GCC or clang (cpu.c asks the kernel for
 * the tile state; mdk_has_amx says whether it may be used). Tile configuration is per thread: a task
 * loads its own (amx_config) and releases the tiles at its end. */
#ifndef MDK_AMX_H
#define MDK_AMX_H

#include "mdk.h"

#if MDK_X86 && defined(__linux__) && (defined(__GNUC__) || defined(__clang__))
#define MDK_AMX 1
#include <string.h>

#define TLOAD(t, base, stride) \
    __asm__ volatile("tileloadd (%0,%1,1), %%tmm" #t ::"r"((const void *)(base)), "r"((long)(stride)) : "memory")
#define TSTORE(t, base, stride) \
    __asm__ volatile("tilestored %%tmm" #t ", (%0,%1,1)" ::"r"((void *)(base)), "r"((long)(stride)) : "memory")
#define TZERO(t) __asm__ volatile("tilezero %%tmm" #t ::)
#define TDP_BF16(c, a, b) __asm__ volatile("tdpbf16ps %%tmm" #b ", %%tmm" #a ", %%tmm" #c ::)  /* c += a . b */
#define TDP_BUSD(c, a, b) __asm__ volatile("tdpbusd %%tmm" #b ", %%tmm" #a ", %%tmm" #c ::)    /* u8 a . s8 b */
#define TRELEASE() __asm__ volatile("tilerelease" ::)

/* Palette 1 with every tile rows x 64 bytes (what these kernels use: 16 x 16 fp32/int32 results, 16
 * rows of 32 bf16 or 64 int8 operands). */
static inline void amx_config(int rows) {
    struct {
        uint8_t palette, start_row, reserved[14];
        uint16_t colsb[16];
        uint8_t rows[16];
    } __attribute__((aligned(64))) cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette = 1;
    for (int t = 0; t < 8; t++) {
        cfg.colsb[t] = 64;
        cfg.rows[t] = (uint8_t)rows;
    }
    __asm__ volatile("ldtilecfg %0" ::"m"(cfg) : "memory");
}
#else
#define MDK_AMX 0
#endif

#endif
