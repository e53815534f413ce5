//! The port I/O bus: which device answers at which port, as ranges each
//! claimed by one device, built once with overlaps refused (as
//! Firecracker's `Bus` does for its devices).

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

/// Two claims on one port.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("ports {new:?} of {device:?} overlap {existing:?} of {owner:?}")]
pub(crate) struct Overlap {
    device: PortDevice,
    new: RangeInclusive<u16>,
    owner: PortDevice,
    existing: RangeInclusive<u16>,
}

/// Port ranges and the device each belongs to, sorted by first port.
#[derive(Clone, Debug, Default)]
pub(crate) struct PortBus {
    ranges: Vec<(RangeInclusive<u16>, PortDevice)>,
}

impl PortBus {
    /// Claims `ports` for `device`; refused where another device has any
    /// of them.
    pub(crate) fn insert(
        &mut self,
        ports: RangeInclusive<u16>,
        device: PortDevice,
    ) -> Result<(), Overlap> {
        if let Some((existing, owner)) = self
            .ranges
            .iter()
            .find(|(r, _)| r.start() <= ports.end() && ports.start() <= r.end())
        {
            return Err(Overlap {
                device,
                new: ports,
                owner: *owner,
                existing: existing.clone(),
            });
        }
        let at = self
            .ranges
            .partition_point(|(r, _)| r.start() < ports.start());
        self.ranges.insert(at, (ports, device));
        Ok(())
    }

    /// The device at `port` and the first port of its range.
    pub(crate) fn find(&self, port: u16) -> Option<(PortDevice, u16)> {
        let at = self.ranges.partition_point(|(r, _)| *r.start() <= port);
        let (range, device) = self.ranges.get(at.checked_sub(1)?)?;
        range.contains(&port).then_some((*device, *range.start()))
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
}
