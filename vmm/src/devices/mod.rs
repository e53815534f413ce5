//! The guest's devices, all in user space, and the two buses that route
//! accesses to them: ports ([`Devices::pio_read`], [`Devices::pio_write`])
//! and MMIO ([`Devices::mmio_read`], [`Devices::mmio_write`]). There is
//! deliberately no in-kernel irqchip or PIT: the VMM decides when each
//! interrupt reaches the vCPU.

pub mod acpi_pm;
mod bus;
pub mod cmos;
pub mod hypercall;
pub mod ioapic;
pub mod lapic;
pub mod pic;
pub mod pit;
pub mod reset;
pub mod serial;

use std::collections::BTreeSet;
use std::io::Write;

use crate::clock::VirtualNanos;

use self::acpi_pm::AcpiPm;
use self::bus::{MmioBus, MmioDevice, PortBus, PortDevice};
use self::cmos::Cmos;
use self::ioapic::IoApic;
use self::lapic::{Ipi, LocalApic};
use self::pic::Pic;
use self::pit::Pit;
use self::reset::ResetController;
use self::serial::{SerialPort, COM1_BASE, COM1_IRQ};

/// ISA IRQ of the PIT's channel 0.
pub const TIMER_IRQ: u8 = 0;

/// What [`Devices::acknowledge`] gives as the IRQ of an interrupt from a
/// CPU's local APIC (its timer or an IPI), which no ISA line carries.
pub const LOCAL_APIC_IRQ: u8 = 0xfe;

/// Every device, on the port bus or the MMIO bus.
pub struct Devices {
    pub pic: Pic,
    pub pit: Pit,
    pub serial: SerialPort,
    pub cmos: Cmos,
    pub reset: ResetController,
    pub acpi_pm: AcpiPm,
    /// Each CPU's local APIC, by CPU number; none on a one-CPU machine,
    /// which keeps the machine every one-CPU trace was taken on.
    pub lapics: Vec<LocalApic>,
    /// The I/O APIC, where there are local APICs.
    pub ioapic: Option<IoApic>,
    /// Which device answers at which port.
    bus: PortBus,
    /// Which device answers at which address outside RAM.
    mmio: MmioBus,
    /// Ports nobody answers, noted once each for the debug log.
    unclaimed: BTreeSet<u16>,
    /// IRQ0 edges raised so far (the timer interrupts the guest was sent).
    pub timer_edges: u64,
}

/// Every device's ports.
fn port_bus() -> PortBus {
    use acpi_pm::{PM1A_CNT_BLK, PM1A_EVT_BLK, PM1_CNT_LEN, PM1_EVT_LEN};
    let claims = [
        (0x20..=0x21, PortDevice::Pic),
        (0xa0..=0xa1, PortDevice::Pic),
        (0x4d0..=0x4d1, PortDevice::Pic),
        (0x40..=pit::PORT_COMMAND, PortDevice::Pit),
        (pit::PORT_SPEAKER..=pit::PORT_SPEAKER, PortDevice::Pit),
        (cmos::PORT_INDEX..=cmos::PORT_DATA, PortDevice::Cmos),
        (reset::PORT_DATA..=reset::PORT_DATA, PortDevice::Keyboard),
        (
            reset::PORT_COMMAND..=reset::PORT_COMMAND,
            PortDevice::Keyboard,
        ),
        (
            reset::PORT_RESET_CONTROL..=reset::PORT_RESET_CONTROL,
            PortDevice::ResetControl,
        ),
        (COM1_BASE..=COM1_BASE + 7, PortDevice::Serial),
        (
            PM1A_EVT_BLK..=PM1A_EVT_BLK + u16::from(PM1_EVT_LEN) - 1,
            PortDevice::AcpiPm,
        ),
        (
            PM1A_CNT_BLK..=PM1A_CNT_BLK + u16::from(PM1_CNT_LEN) - 1,
            PortDevice::AcpiPm,
        ),
        // POST codes and the legacy I/O-delay port: written only for the
        // delay.
        (0x80..=0x80, PortDevice::Delay),
        (0xed..=0xed, PortDevice::Delay),
    ];
    let mut bus = PortBus::default();
    for (ports, device) in claims {
        // The table above is fixed: an overlap is a bug the unit test
        // `every_device_has_its_ports` catches.
        if let Err(e) = bus.insert(ports, device) {
            tracing::error!("{e}");
        }
    }
    bus
}

/// The MMIO devices' ranges: a machine of several CPUs has local APICs
/// and an I/O APIC; a machine of one has neither (the machine every
/// one-CPU trace was taken on).
fn mmio_bus(cpus: u8) -> MmioBus {
    let mut bus = MmioBus::default();
    if cpus > 1 {
        let claims = [
            (
                lapic::BASE..=lapic::BASE + lapic::SIZE - 1,
                MmioDevice::LocalApic,
            ),
            (
                ioapic::BASE..=ioapic::BASE + ioapic::SIZE - 1,
                MmioDevice::IoApic,
            ),
        ];
        for (range, device) in claims {
            // Fixed, as the port table: `every_device_has_its_ports`
            // catches an overlap.
            if let Err(e) = bus.insert(range, device) {
                tracing::error!("{e}");
            }
        }
    }
    bus
}

impl Devices {
    /// All devices in their power-on state; COM1 output goes to `console`,
    /// and the RTC starts at `rtc_base_unix`. `cpus` local APICs (APIC ID =
    /// CPU number) where there are several CPUs.
    pub fn new(console: Box<dyn Write + Send>, rtc_base_unix: i64, cpus: u8) -> Self {
        Devices {
            pic: Pic::new(),
            pit: Pit::new(),
            serial: SerialPort::new(console),
            cmos: Cmos::new(rtc_base_unix),
            reset: ResetController::default(),
            acpi_pm: AcpiPm::default(),
            lapics: match cpus {
                0 | 1 => Vec::new(),
                n => (0..n).map(LocalApic::new).collect(),
            },
            ioapic: (cpus > 1).then(|| IoApic::new(io_apic_id(cpus))),
            bus: port_bus(),
            mmio: mmio_bus(cpus),
            unclaimed: BTreeSet::new(),
            timer_edges: 0,
        }
    }

    /// A guest `IN` of `data.len()` bytes.
    pub fn pio_read(&mut self, port: u16, data: &mut [u8], now: VirtualNanos) {
        let value = match self.bus.find(port) {
            // Word-wide registers.
            Some((PortDevice::AcpiPm, _)) => return self.acpi_pm.read(port, data),
            Some((PortDevice::Pic, _)) => self.pic.read(port),
            Some((PortDevice::Pit, _)) => self.pit.read(port, now),
            Some((PortDevice::Cmos, _)) => self.cmos.read(port, now),
            Some((PortDevice::Keyboard, _)) => self.reset.read(port),
            Some((PortDevice::Serial, base)) => self.serial.read(offset(port, base)),
            Some((PortDevice::Delay, _)) => 0xff,
            Some((PortDevice::ResetControl, _)) | None => {
                self.note_unclaimed(port);
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
        match self.bus.find(port) {
            Some((PortDevice::Pic, _)) => self.pic.write(port, value),
            Some((PortDevice::Pit, _)) => self.pit.write(port, value, now),
            Some((PortDevice::Cmos, _)) => self.cmos.write(port, value),
            Some((PortDevice::Keyboard | PortDevice::ResetControl, _)) => {
                self.reset.write(port, value)
            }
            Some((PortDevice::Serial, base)) => self.serial.write(offset(port, base), value),
            Some((PortDevice::AcpiPm, _)) => self.acpi_pm.write(port, data),
            Some((PortDevice::Delay, _)) => {}
            None => self.note_unclaimed(port),
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
            self.isa_edge(TIMER_IRQ);
        }
        if self.serial.take_irq() {
            self.isa_edge(COM1_IRQ);
        }
        for apic in &mut self.lapics {
            apic.update(now);
        }
    }

    /// An edge on ISA line `irq`: into the PIC, and into the I/O APIC's
    /// pin of the same number, which sends it on to the local APICs its
    /// entry names (the guest masks the path it does not use).
    fn isa_edge(&mut self, irq: u8) {
        self.pic.raise(irq);
        let Some(delivery) = self.ioapic.as_ref().and_then(|io| io.edge(irq)) else {
            return;
        };
        let targets = delivery.destination.targets(0, &self.apic_ids());
        let take = if delivery.lowest_priority {
            1
        } else {
            targets.len()
        };
        for cpu in targets.into_iter().take(take) {
            if let Some(apic) = self.lapics.get_mut(cpu) {
                apic.accept(delivery.vector);
            }
        }
    }

    /// Each CPU's (APIC ID, logical ID), for [`lapic::Destination::targets`].
    pub fn apic_ids(&self) -> Vec<(u8, u8)> {
        self.lapics
            .iter()
            .map(|a| (a.id(), a.logical_id()))
            .collect()
    }

    /// A guest load by CPU `cpu` at guest-physical `addr` outside RAM: the
    /// register's value (32 bits, as both APICs' registers are), or `None`
    /// where no device answers.
    pub fn mmio_read(&mut self, cpu: usize, addr: u64, now: VirtualNanos) -> Option<u32> {
        let (device, base) = self.mmio.find(addr)?;
        let offset = addr - base;
        Some(match device {
            MmioDevice::LocalApic => self.lapics.get(cpu).map_or(0, |a| a.read(offset, now)),
            MmioDevice::IoApic => self.ioapic.as_ref().map_or(u32::MAX, |io| io.read(offset)),
        })
    }

    /// A guest store by CPU `cpu` at guest-physical `addr` outside RAM (its
    /// low 32 bits: the registers' width), and the IPI it sends, where it
    /// is a write to a local APIC's interrupt command register. Stores no
    /// device answers are dropped.
    pub fn mmio_write(
        &mut self,
        cpu: usize,
        addr: u64,
        value: u64,
        now: VirtualNanos,
    ) -> Option<Ipi> {
        let (device, base) = self.mmio.find(addr)?;
        let offset = addr - base;
        let value = u32::try_from(value & 0xffff_ffff).unwrap_or(0);
        match device {
            MmioDevice::LocalApic => self.lapics.get_mut(cpu)?.write(offset, value, now),
            MmioDevice::IoApic => {
                if let Some(io) = &mut self.ioapic {
                    io.write(offset, value);
                }
                None
            }
        }
    }

    /// Virtual time at which a device will next want a CPU's attention.
    pub fn next_deadline(&self) -> Option<VirtualNanos> {
        let timers = self.lapics.iter().filter_map(LocalApic::next_deadline);
        self.pit.next_irq0().into_iter().chain(timers).min()
    }

    /// The vector CPU `cpu` would take now: the PIC's (wired to CPU 0
    /// through LINT0, the virtual-wire mode every PC starts in), else its
    /// local APIC's.
    pub fn pending_vector(&self, cpu: usize) -> Option<u8> {
        let pic = if cpu == 0 {
            self.pic.pending_vector()
        } else {
            None
        };
        pic.or_else(|| self.lapics.get(cpu).and_then(LocalApic::pending_vector))
    }

    /// CPU `cpu` takes its pending interrupt: the vector, and the ISA IRQ
    /// it came from ([`LOCAL_APIC_IRQ`] for its local APIC's).
    pub fn acknowledge(&mut self, cpu: usize) -> Option<(u8, u8)> {
        if cpu == 0 && self.pic.pending_vector().is_some() {
            return self.pic.acknowledge();
        }
        let vector = self.lapics.get_mut(cpu)?.acknowledge()?;
        Some((vector, LOCAL_APIC_IRQ))
    }
}

/// The I/O APIC's ID on a machine of `cpus` CPUs: the first after the
/// local APICs' (0 to cpus - 1), in its register's four bits.
pub fn io_apic_id(cpus: u8) -> u8 {
    cpus.min(15)
}

/// A port's offset in its device's range (COM1's eight registers).
fn offset(port: u16, base: u16) -> u8 {
    u8::try_from(port.wrapping_sub(base)).unwrap_or(u8::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_device_has_its_ports() {
        // Built without an overlap: each claim is in the bus.
        let bus = port_bus();
        let expect = [
            (0x20, PortDevice::Pic),
            (0xa1, PortDevice::Pic),
            (0x4d1, PortDevice::Pic),
            (0x40, PortDevice::Pit),
            (0x43, PortDevice::Pit),
            (0x61, PortDevice::Pit),
            (0x70, PortDevice::Cmos),
            (0x71, PortDevice::Cmos),
            (0x60, PortDevice::Keyboard),
            (0x64, PortDevice::Keyboard),
            (0xcf9, PortDevice::ResetControl),
            (0x3f8, PortDevice::Serial),
            (0x3ff, PortDevice::Serial),
            (0x600, PortDevice::AcpiPm),
            (0x605, PortDevice::AcpiPm),
            (0x80, PortDevice::Delay),
            (0xed, PortDevice::Delay),
        ];
        for (port, device) in expect {
            assert_eq!(bus.find(port).map(|(d, _)| d), Some(device), "{port:#x}");
        }
        for nobody in [0x22, 0x44, 0x62, 0x72, 0x3f7, 0x400, 0x606] {
            assert_eq!(bus.find(nobody), None, "{nobody:#x}");
        }
    }

    #[test]
    fn the_apics_answer_on_the_mmio_bus_where_there_are_several_cpus() {
        let one = Devices::new(Box::new(std::io::sink()), 0, 1);
        assert_eq!(one.mmio.find(lapic::BASE), None, "one CPU: no APICs");
        let mut two = Devices::new(Box::new(std::io::sink()), 0, 2);
        let bus = mmio_bus(2);
        assert_eq!(
            bus.find(lapic::BASE + 0xff0),
            Some((MmioDevice::LocalApic, lapic::BASE))
        );
        assert_eq!(
            bus.find(ioapic::BASE + 0x10),
            Some((MmioDevice::IoApic, ioapic::BASE))
        );
        for nobody in [
            lapic::BASE - 1,
            lapic::BASE + lapic::SIZE,
            ioapic::BASE + ioapic::SIZE,
        ] {
            assert_eq!(two.mmio_read(0, nobody, 0), None, "{nobody:#x}");
        }
        // Each CPU reads its own local APIC's ID register (bits 24-31).
        assert_eq!(two.mmio_read(1, lapic::BASE + 0x20, 0), Some(1 << 24));
        assert_eq!(two.mmio_read(0, lapic::BASE + 0x20, 0), Some(0));
        // The I/O APIC's index register, written and read back.
        assert_eq!(two.mmio_write(0, ioapic::BASE, 0x10, 0), None);
        assert_eq!(two.mmio_read(0, ioapic::BASE, 0), Some(0x10));
    }

    #[test]
    fn a_port_nobody_claims_reads_all_ones() {
        let mut d = Devices::new(Box::new(std::io::sink()), 0, 1);
        let mut data = [0u8; 4];
        d.pio_read(0x1234, &mut data, 0);
        assert_eq!(data, [0xff; 4]);
        d.pio_read(reset::PORT_RESET_CONTROL, &mut data, 0);
        assert_eq!(data, [0xff; 4], "0xcf9 is written only");
        d.pio_read(COM1_BASE + 5, &mut data, 0);
        assert_eq!(
            data[1..],
            [0xff; 3],
            "one byte-wide register, the rest float"
        );
    }
}
