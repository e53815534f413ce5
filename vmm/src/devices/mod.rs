//! The guest's devices, all in user space, and the port I/O bus that routes
//! accesses to them. There is deliberately no in-kernel irqchip or PIT: the
//! VMM decides when each interrupt reaches the vCPU.

pub mod acpi_pm;
pub mod cmos;
pub mod hypercall;
pub mod pic;
pub mod pit;
pub mod reset;
pub mod serial;

use std::collections::BTreeSet;
use std::io::Write;

use crate::clock::VirtualNanos;

use self::acpi_pm::AcpiPm;
use self::cmos::Cmos;
use self::pic::Pic;
use self::pit::Pit;
use self::reset::ResetController;
use self::serial::{SerialPort, COM1_BASE, COM1_IRQ};

/// ISA IRQ of the PIT's channel 0.
pub const TIMER_IRQ: u8 = 0;

/// Every device on the port bus.
pub struct Devices {
    pub pic: Pic,
    pub pit: Pit,
    pub serial: SerialPort,
    pub cmos: Cmos,
    pub reset: ResetController,
    pub acpi_pm: AcpiPm,
    /// Ports nobody answers, noted once each for the debug log.
    unclaimed: BTreeSet<u16>,
    /// IRQ0 edges raised so far (the timer interrupts the guest was sent).
    pub timer_edges: u64,
}

/// Ports that only exist to be written for their delay (POST codes, the
/// legacy I/O-delay port): silently accepted.
const DELAY_PORTS: [u16; 2] = [0x80, 0xed];

impl Devices {
    /// All devices in their power-on state; COM1 output goes to `console`,
    /// and the RTC starts at `rtc_base_unix`.
    pub fn new(console: Box<dyn Write + Send>, rtc_base_unix: i64) -> Self {
        Devices {
            pic: Pic::new(),
            pit: Pit::new(),
            serial: SerialPort::new(console),
            cmos: Cmos::new(rtc_base_unix),
            reset: ResetController::default(),
            acpi_pm: AcpiPm::default(),
            unclaimed: BTreeSet::new(),
            timer_edges: 0,
        }
    }

    /// A guest `IN` of `data.len()` bytes.
    pub fn pio_read(&mut self, port: u16, data: &mut [u8], now: VirtualNanos) {
        if AcpiPm::claims(port) {
            // Word-wide registers.
            self.acpi_pm.read(port, data);
            return;
        }
        let value = match port {
            0x20 | 0x21 | 0xa0 | 0xa1 | 0x4d0 | 0x4d1 => self.pic.read(port),
            0x40..=0x43 | pit::PORT_SPEAKER => self.pit.read(port, now),
            cmos::PORT_INDEX | cmos::PORT_DATA => self.cmos.read(port, now),
            reset::PORT_DATA | reset::PORT_COMMAND => self.reset.read(port),
            p if (COM1_BASE..COM1_BASE + 8).contains(&p) => self.serial.read((p - COM1_BASE) as u8),
            p if DELAY_PORTS.contains(&p) => 0xff,
            p => {
                self.note_unclaimed(p);
                0xff
            }
        };
        // Wider accesses to byte-wide devices read the same byte in every
        // lane except where no device answers (all ones, as on a real bus).
        data.fill(0xff);
        if let Some(first) = data.first_mut() {
            *first = value;
        }
    }

    /// A guest `OUT` of `data.len()` bytes.
    pub fn pio_write(&mut self, port: u16, data: &[u8], now: VirtualNanos) {
        let value = data.first().copied().unwrap_or(0);
        match port {
            0x20 | 0x21 | 0xa0 | 0xa1 | 0x4d0 | 0x4d1 => self.pic.write(port, value),
            0x40..=0x43 | pit::PORT_SPEAKER => self.pit.write(port, value, now),
            cmos::PORT_INDEX | cmos::PORT_DATA => self.cmos.write(port, value),
            reset::PORT_DATA | reset::PORT_COMMAND | reset::PORT_RESET_CONTROL => {
                self.reset.write(port, value)
            }
            p if (COM1_BASE..COM1_BASE + 8).contains(&p) => {
                self.serial.write((p - COM1_BASE) as u8, value)
            }
            p if AcpiPm::claims(p) => self.acpi_pm.write(p, data),
            p if DELAY_PORTS.contains(&p) => {}
            p => self.note_unclaimed(p),
        }
    }

    fn note_unclaimed(&mut self, port: u16) {
        if self.unclaimed.insert(port) {
            tracing::debug!("guest accessed port {port:#x}, which no device claims");
        }
    }

    /// How the guest ended the machine, if it did: a reset (reboot) or
    /// an ACPI power-off.
    pub fn machine_end(&self) -> Option<crate::GuestExit> {
        if self.reset.reset_requested() {
            Some(crate::GuestExit::Reset)
        } else if self.acpi_pm.power_off_requested() {
            Some(crate::GuestExit::PowerOff)
        } else {
            None
        }
    }

    /// Moves device interrupt outputs into the PIC as of `now`.
    pub fn update_interrupts(&mut self, now: VirtualNanos) {
        if self.pit.poll_irq0(now) {
            self.timer_edges += 1;
            self.pic.raise(TIMER_IRQ);
        }
        if self.serial.take_irq() {
            self.pic.raise(COM1_IRQ);
        }
    }

    /// Virtual time at which a device will next want the CPU's attention.
    pub fn next_deadline(&self) -> Option<VirtualNanos> {
        self.pit.next_irq0()
    }
}
