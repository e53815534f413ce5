//! The I/O APIC (82093AA) of a machine of several CPUs: 24 pins, ISA IRQ n
//! on pin n (the MADT names no override), each pin's redirection entry
//! sending its vector to the local APICs it names. The PIC stays wired to
//! CPU 0 as well, as on a PC: the guest masks the one it does not use.
//!
//! Only edge-triggered delivery is modelled: the machine's devices (the
//! PIT, the serial port) raise edges, and no PCI device shares a level
//! line. An entry set to level is delivered on each edge the same way, and
//! its remote IRR never sets (no EOI needs to reach the I/O APIC).

use super::lapic::Destination;

/// Its registers' guest-physical base (IOREGSEL; IOWIN at +0x10).
pub const BASE: u64 = 0xfec0_0000;
/// The MMIO window it claims.
pub const SIZE: u64 = 0x20;
/// Pins, one redirection entry each.
pub const PINS: u8 = 24;

const IOREGSEL: u64 = 0x00;
const IOWIN: u64 = 0x10;
const REG_ID: u8 = 0x00;
const REG_VERSION: u8 = 0x01;
const REG_ARBITRATION: u8 = 0x02;
const REG_TABLE: u8 = 0x10;
/// Version 0x11 (the 82093AA), the highest entry's index in bits 16-23.
const VERSION: u32 = 0x11 | ((PINS as u32 - 1) << 16);
const ENTRY_MASKED: u64 = 1 << 16;
const ENTRY_LOGICAL: u64 = 1 << 11;
/// The bits a guest may write: vector, delivery mode, destination mode,
/// polarity, trigger mode, mask, destination (not delivery status or
/// remote IRR, which are read-only).
const ENTRY_WRITABLE: u64 = 0xff00_0000_0001_afff;

/// An interrupt a pin sends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Delivery {
    /// The vector.
    pub vector: u8,
    /// The local APICs it goes to.
    pub destination: Destination,
    /// Lowest priority: one CPU of the destination takes it (the first, so
    /// that traces repeat), rather than each.
    pub lowest_priority: bool,
}

/// The I/O APIC's state.
#[derive(Clone, Debug)]
pub struct IoApic {
    id: u8,
    select: u8,
    table: [u64; PINS as usize],
}

impl IoApic {
    /// Its power-on state: ID `id`, every pin masked.
    pub fn new(id: u8) -> IoApic {
        IoApic {
            id,
            select: 0,
            table: [ENTRY_MASKED; PINS as usize],
        }
    }

    /// A 32-bit read at `offset` in its window.
    pub fn read(&self, offset: u64) -> u32 {
        match offset {
            IOREGSEL => u32::from(self.select),
            IOWIN => self.register(self.select),
            _ => 0,
        }
    }

    /// A 32-bit write at `offset` in its window.
    pub fn write(&mut self, offset: u64, value: u32) {
        match offset {
            IOREGSEL => self.select = value.to_le_bytes()[0],
            IOWIN => self.set_register(self.select, value),
            _ => {}
        }
    }

    fn register(&self, index: u8) -> u32 {
        match index {
            REG_ID | REG_ARBITRATION => u32::from(self.id & 0xf) << 24,
            REG_VERSION => VERSION,
            _ => match self.entry_half(index) {
                Some((pin, high)) => {
                    let entry = self.table[pin];
                    (if high { entry >> 32 } else { entry }) as u32
                }
                None => 0,
            },
        }
    }

    fn set_register(&mut self, index: u8, value: u32) {
        if index == REG_ID {
            self.id = value.to_le_bytes()[3] & 0xf;
            return;
        }
        let Some((pin, high)) = self.entry_half(index) else {
            return;
        };
        let entry = &mut self.table[pin];
        let written = if high {
            (*entry & 0xffff_ffff) | (u64::from(value) << 32)
        } else {
            (*entry & !0xffff_ffff) | u64::from(value)
        };
        *entry = (*entry & !ENTRY_WRITABLE) | (written & ENTRY_WRITABLE);
    }

    /// The pin and the half (high: bits 32-63) a table register holds.
    fn entry_half(&self, index: u8) -> Option<(usize, bool)> {
        let n = index.checked_sub(REG_TABLE)?;
        let pin = usize::from(n / 2);
        (pin < self.table.len()).then_some((pin, n % 2 == 1))
    }

    /// An edge on `pin`: what it delivers, unless the pin is masked or its
    /// delivery mode is not one this machine has (SMI, INIT, ExtINT...).
    pub fn edge(&self, pin: u8) -> Option<Delivery> {
        let entry = *self.table.get(usize::from(pin))?;
        if entry & ENTRY_MASKED != 0 {
            return None;
        }
        let lowest_priority = match (entry >> 8) & 7 {
            0 => false,
            1 => true,
            _ => return None,
        };
        let target = entry.to_le_bytes()[7];
        Some(Delivery {
            vector: entry.to_le_bytes()[0],
            destination: if entry & ENTRY_LOGICAL != 0 {
                Destination::Logical(target)
            } else {
                Destination::Physical(target)
            },
            lowest_priority,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn program(io: &mut IoApic, pin: u8, entry: u64) {
        io.write(IOREGSEL, u32::from(REG_TABLE + 2 * pin));
        io.write(IOWIN, entry as u32);
        io.write(IOREGSEL, u32::from(REG_TABLE + 2 * pin + 1));
        io.write(IOWIN, (entry >> 32) as u32);
    }

    #[test]
    fn it_says_what_it_is_and_starts_with_every_pin_masked() {
        let mut io = IoApic::new(2);
        io.write(IOREGSEL, u32::from(REG_VERSION));
        assert_eq!(io.read(IOWIN), 0x0017_0011);
        io.write(IOREGSEL, u32::from(REG_ID));
        assert_eq!(io.read(IOWIN), 2 << 24);
        for pin in 0..PINS {
            assert_eq!(io.edge(pin), None, "pin {pin}");
        }
        assert_eq!(io.edge(PINS), None);
    }

    #[test]
    fn an_unmasked_pin_sends_its_vector_where_its_entry_says() {
        let mut io = IoApic::new(0);
        // Vector 0x30, fixed, physical, to APIC ID 1.
        program(&mut io, 2, 0x0100_0000_0000_0030);
        assert_eq!(
            io.edge(2),
            Some(Delivery {
                vector: 0x30,
                destination: Destination::Physical(1),
                lowest_priority: false,
            })
        );
        // Lowest priority, logical, to CPUs 0 and 1 (mask 0b11).
        program(&mut io, 4, 0x0300_0000_0000_0931);
        assert_eq!(
            io.edge(4),
            Some(Delivery {
                vector: 0x31,
                destination: Destination::Logical(3),
                lowest_priority: true,
            })
        );
        // The entry reads back as written.
        io.write(IOREGSEL, u32::from(REG_TABLE + 9));
        assert_eq!(io.read(IOWIN), 0x0300_0000);
        // Masked again: nothing; ExtINT: not this machine's.
        program(&mut io, 4, 0x0300_0000_0001_0931);
        assert_eq!(io.edge(4), None);
        program(&mut io, 5, 0x0000_0000_0000_0700);
        assert_eq!(io.edge(5), None);
    }

    #[test]
    fn read_only_bits_stay_clear() {
        let mut io = IoApic::new(0);
        // Delivery status (12) and remote IRR (14) written as ones.
        program(&mut io, 1, 0x0000_0000_0000_5030);
        io.write(IOREGSEL, u32::from(REG_TABLE + 2));
        assert_eq!(io.read(IOWIN), 0x30);
    }
}
