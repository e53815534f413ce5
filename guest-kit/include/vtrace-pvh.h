/*
 * vtrace-pvh.h: the ELF note that makes a kernel bootable through PVH
 * (XEN_ELFNOTE_PHYS32_ENTRY), for assembly sources. Use once per image:
 *
 *     #include "vtrace-pvh.h"
 *     VTRACE_PVH_NOTE(start)
 *
 * `start` is entered in 32-bit protected mode, paging off, with EBX
 * pointing at the hvm_start_info structure.
 */
#ifndef VTRACE_PVH_H
#define VTRACE_PVH_H

#define XEN_ELFNOTE_PHYS32_ENTRY 18

#define VTRACE_PVH_NOTE(entry)                  \
    .pushsection .note.Xen, "a", @note;         \
    .balign 4;                                  \
    .long 4, 4, XEN_ELFNOTE_PHYS32_ENTRY;       \
    .asciz "Xen";                               \
    .balign 4;                                  \
    .long entry;                                \
    .popsection

#endif
