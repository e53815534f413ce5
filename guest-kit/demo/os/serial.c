/* Polled driver for the 16550 UART on COM1. */
#include "kernel.h"
#include "vtrace.h"

#define COM1 0x3f8

void serial_init(void)
{
    outb(COM1 + 1, 0x00);  /* no UART interrupts: output is polled */
    outb(COM1 + 3, 0x80);  /* DLAB */
    outb(COM1 + 0, 0x01);  /* 115200 baud */
    outb(COM1 + 1, 0x00);
    outb(COM1 + 3, 0x03);  /* 8N1 */
    outb(COM1 + 2, 0xc7);  /* FIFO on */
    outb(COM1 + 4, 0x03);  /* DTR, RTS */
}

static void serial_putc(char c)
{
    while (!(inb(COM1 + 5) & 0x20))
        ;
    outb(COM1, (u8)c);
}

void serial_write(const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        if (s[i] == '\n')
            serial_putc('\r');
        serial_putc(s[i]);
    }
}

void panic(const char *why, struct frame *f)
{
    kprintf("\nPANIC: %s\n", why);
    if (f)
        kprintf("  vector %lu error %lx rip %lx rsp %lx cr2 %lx\n", f->vector, f->error,
                f->rip, f->rsp, read_cr2());
    vtrace_log(why, strlen(why));
    vtrace_exit(3);
    for (;;)
        __asm__ volatile("cli; hlt");
}
