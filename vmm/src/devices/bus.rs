//! The device buses: which device answers at which port, and at which
//! guest-physical address outside RAM, as ranges each claimed by one
//! device, built once with overlaps refused (as Firecracker's `Bus` does
//! for its devices). Ports and MMIO are the same bus over two address
//! types, so that whatever runs the guest (KVM's exits, or an engine that
//! runs it in-process) reaches every device through [`super::Devices`]' two
//! doors.

use std::fmt::Debug;
use std::ops::RangeInclusive;

/// A device on the port bus.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum PortDevice {
    /// The two 8259 PICs and their edge/level registers.
    Pic,
    /// The 8254 PIT and the speaker port's gate bits.
    Pit,
    /// The CMOS RTC's index and data ports.
    Cmos,
    /// The i8042's data and command ports (its reset line).
    Keyboard,
    /// Port 0xCF9, the reset control register: written only.
    ResetControl,
    /// COM1; the device sees the offset from its base.
    Serial,
    /// ACPI's PM1a event and control blocks (word-wide registers).
    AcpiPm,
    /// Ports written only for their delay (POST codes, the legacy I/O
    /// delay): accepted silently, read as all ones.
    Delay,
}

/// A device on the MMIO bus.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum MmioDevice {
    /// The local APIC page: each CPU reaches its own there.
    LocalApic,
    /// The I/O APIC's register window.
    IoApic,
}

/// Two claims on one address.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("addresses {new:#x?} of {device:?} overlap {existing:#x?} of {owner:?}")]
pub(crate) struct Overlap<A: Debug, D: Debug> {
    device: D,
    new: RangeInclusive<A>,
    owner: D,
    existing: RangeInclusive<A>,
}

/// Address ranges and the device each belongs to, sorted by first
/// address.
#[derive(Clone, Debug)]
pub(crate) struct Bus<A, D> {
    ranges: Vec<(RangeInclusive<A>, D)>,
}

impl<A, D> Default for Bus<A, D> {
    fn default() -> Self {
        Bus { ranges: Vec::new() }
    }
}

/// Ports (16 bits) and the devices at them.
pub(crate) type PortBus = Bus<u16, PortDevice>;

/// Guest-physical addresses outside RAM and the devices at them.
pub(crate) type MmioBus = Bus<u64, MmioDevice>;

impl<A: Copy + Ord + Debug, D: Copy + Debug> Bus<A, D> {
    /// Claims `range` for `device`; refused where another device has any
    /// of it.
    pub(crate) fn insert(
        &mut self,
        range: RangeInclusive<A>,
        device: D,
    ) -> Result<(), Overlap<A, D>> {
        if let Some((existing, owner)) = self
            .ranges
            .iter()
            .find(|(r, _)| r.start() <= range.end() && range.start() <= r.end())
        {
            return Err(Overlap {
                device,
                new: range,
                owner: *owner,
                existing: existing.clone(),
            });
        }
        let at = self
            .ranges
            .partition_point(|(r, _)| r.start() < range.start());
        self.ranges.insert(at, (range, device));
        Ok(())
    }

    /// The device at `addr` and the first address of its range.
    pub(crate) fn find(&self, addr: A) -> Option<(D, A)> {
        let at = self.ranges.partition_point(|(r, _)| *r.start() <= addr);
        let (range, device) = self.ranges.get(at.checked_sub(1)?)?;
        range.contains(&addr).then_some((*device, *range.start()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_port_finds_its_range_and_nothing_else() {
        let mut bus = PortBus::default();
        bus.insert(0x40..=0x43, PortDevice::Pit).unwrap();
        bus.insert(0x20..=0x21, PortDevice::Pic).unwrap();
        bus.insert(0x3f8..=0x3ff, PortDevice::Serial).unwrap();
        assert_eq!(bus.find(0x20), Some((PortDevice::Pic, 0x20)));
        assert_eq!(bus.find(0x21), Some((PortDevice::Pic, 0x20)));
        assert_eq!(bus.find(0x43), Some((PortDevice::Pit, 0x40)));
        assert_eq!(bus.find(0x3fd), Some((PortDevice::Serial, 0x3f8)));
        for nobody in [0, 0x1f, 0x22, 0x44, 0x3f7, 0x400, u16::MAX] {
            assert_eq!(bus.find(nobody), None, "{nobody:#x}");
        }
    }

    #[test]
    fn overlapping_claims_are_refused() {
        let mut bus = PortBus::default();
        bus.insert(0x40..=0x43, PortDevice::Pit).unwrap();
        for clash in [0x43..=0x44, 0x3f..=0x40, 0x41..=0x41, 0..=u16::MAX] {
            let e = bus.insert(clash.clone(), PortDevice::Cmos).unwrap_err();
            assert_eq!(e.owner, PortDevice::Pit, "{clash:?}");
        }
        bus.insert(0x44..=0x44, PortDevice::Cmos).unwrap();
        assert_eq!(bus.find(0x44), Some((PortDevice::Cmos, 0x44)));
    }

    #[test]
    fn mmio_claims_go_up_to_the_top_of_the_address_space() {
        let mut bus = MmioBus::default();
        bus.insert(0xfee0_0000..=0xfee0_0fff, MmioDevice::LocalApic)
            .unwrap();
        bus.insert(0xfec0_0000..=0xfec0_001f, MmioDevice::IoApic)
            .unwrap();
        bus.insert(u64::MAX..=u64::MAX, MmioDevice::IoApic).unwrap();
        assert_eq!(
            bus.find(0xfee0_0300),
            Some((MmioDevice::LocalApic, 0xfee0_0000))
        );
        assert_eq!(
            bus.find(0xfec0_0010),
            Some((MmioDevice::IoApic, 0xfec0_0000))
        );
        assert_eq!(bus.find(u64::MAX), Some((MmioDevice::IoApic, u64::MAX)));
        for nobody in [0, 0xfebf_ffff, 0xfec0_0020, 0xfee0_1000, u64::MAX - 1] {
            assert_eq!(bus.find(nobody), None, "{nobody:#x}");
        }
        let e = bus
            .insert(0xfee0_0800..=0xfee0_1800, MmioDevice::IoApic)
            .unwrap_err();
        assert_eq!(e.owner, MmioDevice::LocalApic);
        assert!(e.to_string().contains("0xfee00000"), "{e}");
    }
}
