//! The ACPI tables a Linux guest needs to power itself off: RSDP, XSDT, a
//! FADT that names the PM1a registers of [`crate::devices::acpi_pm`], an
//! empty FACS, and a DSDT whose only object is `\_S5_` (the sleep type
//! of soft off). Without them Linux has no power-off method and turns
//! `poweroff` into a halt with interrupts off.
//!
//! Not hardware-reduced ACPI: Linux then drops the legacy PIC and PIT that
//! vtrace's interrupts go through. A machine with several CPUs also gets a
//! MADT naming each CPU's local APIC (how a guest counts its CPUs and finds
//! whom to send INIT and STARTUP) and the I/O APIC; a one-CPU machine has
//! neither, and no MADT (the default command line says `nolapic noapic`).
//!
//! The tables sit in the BIOS area below 1 MiB, which the memory map
//! reserves, with the RSDP at the start of the range Linux scans for it
//! (and its address also in `boot_params`).

use acpi_tables::madt::{
    EnabledStatus, IoApic, LocalInterruptController, ProcessorLocalApic, MADT,
};
use acpi_tables::{aml, facs::FACS, fadt, rsdp::Rsdp, sdt::Sdt, xsdt::XSDT, Aml};
use vm_memory::{Bytes, GuestAddress};

use crate::devices::acpi_pm;
use crate::error::LayoutFault;
use crate::error::{Error, Result};
use crate::memory::GuestRam;

/// Where the RSDP goes; the other tables follow it.
pub const RSDP_ADDR: u64 = 0xe_0000;
const XSDT_ADDR: u64 = RSDP_ADDR + 0x40;
const FADT_ADDR: u64 = RSDP_ADDR + 0x100;
/// The FACS must be 64-byte aligned.
const FACS_ADDR: u64 = RSDP_ADDR + 0x240;
const DSDT_ADDR: u64 = RSDP_ADDR + 0x280;
/// Room for 255 local APIC entries (8 bytes each) after its 44-byte header.
const MADT_ADDR: u64 = RSDP_ADDR + 0x400;
/// The tables end below this (the reserved BIOS area ends at 1 MiB).
const TABLES_END: u64 = RSDP_ADDR + 0x1000;

const OEM_ID: [u8; 6] = *b"VTRACE";
const OEM_TABLE_ID: [u8; 8] = *b"VTRACEVM";
/// ISA IRQ of the SCI: no event ever raises it, but the FADT must name one.
const SCI_IRQ: u16 = 9;

/// The tables as (guest-physical address, bytes), for a machine of `cpus`
/// CPUs.
fn tables(cpus: u8) -> Vec<(u64, Vec<u8>)> {
    let mut dsdt = Sdt::new(*b"DSDT", 36, 2, OEM_ID, OEM_TABLE_ID, 1);
    let s5 = acpi_pm::SLP_TYP_S5 as u8;
    let mut body = Vec::new();
    // SLP_TYPa, SLP_TYPb.
    aml::Name::new("_S5_".into(), &aml::Package::new(vec![&s5, &s5])).to_aml_bytes(&mut body);
    dsdt.append_slice(&body);

    let mut f = fadt::FADTBuilder::new(OEM_ID, OEM_TABLE_ID, 1)
        .dsdt_64(DSDT_ADDR)
        .firmware_ctrl_64(FACS_ADDR)
        // No fixed power or sleep button and no RTC wake status: Linux
        // would try to enable their events, which the PM1 block lacks.
        .flag(fadt::Flags::PwrButton)
        .flag(fadt::Flags::SlpButton)
        .flag(fadt::Flags::FixRtc);
    f.sci_int = SCI_IRQ.into();
    // SMI_CMD stays 0: always in ACPI mode, nothing to switch.
    f.pm1a_evt_blk = u32::from(acpi_pm::PM1A_EVT_BLK).into();
    f.pm1_evt_len = acpi_pm::PM1_EVT_LEN;
    f.pm1a_cnt_blk = u32::from(acpi_pm::PM1A_CNT_BLK).into();
    f.pm1_cnt_len = acpi_pm::PM1_CNT_LEN;
    let fadt = f.finalize();

    let mut xsdt = XSDT::new(OEM_ID, OEM_TABLE_ID, 1);
    xsdt.add_entry(FADT_ADDR);
    let madt = (cpus > 1).then(|| {
        xsdt.add_entry(MADT_ADDR);
        madt(cpus)
    });

    let bytes = |t: &dyn Aml| {
        let mut v = Vec::new();
        t.to_aml_bytes(&mut v);
        v
    };
    let mut all = vec![
        (RSDP_ADDR, bytes(&Rsdp::new(OEM_ID, XSDT_ADDR))),
        (XSDT_ADDR, bytes(&xsdt)),
        (FADT_ADDR, bytes(&fadt)),
        (FACS_ADDR, bytes(&FACS::new())),
        (DSDT_ADDR, dsdt.as_slice().to_vec()),
    ];
    if let Some(madt) = madt {
        all.push((MADT_ADDR, bytes(&madt)));
    }
    all
}

/// The MADT: every CPU's local APIC, APIC ID = ACPI processor ID = CPU
/// number, all enabled.
fn madt(cpus: u8) -> MADT {
    let base = u32::try_from(crate::devices::lapic::BASE).unwrap_or(u32::MAX);
    let mut madt = MADT::new(
        OEM_ID,
        OEM_TABLE_ID,
        1,
        LocalInterruptController::Address(base),
    );
    for cpu in 0..cpus {
        madt.add_structure(ProcessorLocalApic::new(cpu, cpu, EnabledStatus::Enabled));
    }
    // No interrupt source override: ISA IRQ n is pin n (the PIT's too).
    let io_apic = u32::try_from(crate::devices::ioapic::BASE).unwrap_or(u32::MAX);
    madt.add_structure(IoApic::new(crate::devices::io_apic_id(cpus), io_apic, 0));
    madt
}

/// Writes the tables of a machine of `cpus` CPUs into guest memory;
/// returns the RSDP's address.
pub fn write(ram: &GuestRam, cpus: u8) -> Result<u64> {
    let all = tables(cpus);
    for (i, (addr, bytes)) in all.iter().enumerate() {
        let next = all.get(i + 1).map_or(TABLES_END, |(a, _)| *a);
        // A table that grew past the next one is a bug here, not the guest's.
        if addr + bytes.len() as u64 > next {
            return Err(Error::BootLayout(LayoutFault::AcpiOverlap {
                at: *addr,
                len: bytes.len(),
                next,
            }));
        }
        ram.write_slice(bytes, GuestAddress(*addr))
            .map_err(|source| Error::GuestWrite {
                what: "the ACPI tables",
                at: *addr,
                source,
            })?;
    }
    Ok(RSDP_ADDR)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sums_to_zero(b: &[u8]) -> bool {
        b.iter().fold(0u8, |a, x| a.wrapping_add(*x)) == 0
    }

    #[test]
    fn tables_have_valid_checksums_and_fit() {
        let all = tables(1);
        for (i, (addr, b)) in all.iter().enumerate() {
            let next = all.get(i + 1).map_or(TABLES_END, |(a, _)| *a);
            assert!(addr + b.len() as u64 <= next, "table at {addr:#x} overlaps");
            let len = if *addr == RSDP_ADDR { 20 } else { b.len() };
            if *addr != FACS_ADDR {
                assert!(sums_to_zero(&b[..len]), "checksum of table at {addr:#x}");
            }
        }
        assert_eq!(FACS_ADDR % 64, 0);
    }

    #[test]
    fn dsdt_names_s5_with_the_devices_sleep_type() {
        let (_, dsdt) = tables(1).pop().unwrap();
        assert_eq!(&dsdt[..4], b"DSDT");
        let at = dsdt.windows(4).position(|w| w == b"_S5_").expect("_S5_");
        // NameOp, "_S5_", PackageOp, length, 2 elements, BytePrefix 5, BytePrefix 5.
        assert_eq!(dsdt[at - 1], 0x08);
        assert_eq!(&dsdt[at + 4..at + 11], &[0x12, 6, 2, 0x0a, 5, 0x0a, 5]);
    }

    #[test]
    fn fadt_points_at_the_pm1a_registers_and_the_dsdt() {
        let (_, fadt) = &tables(1)[2];
        assert_eq!(&fadt[..4], b"FACP");
        let u32_at = |o: usize| u32::from_le_bytes(fadt[o..o + 4].try_into().unwrap());
        // Offsets from the ACPI specification's FADT layout.
        assert_eq!(u32_at(56), u32::from(acpi_pm::PM1A_EVT_BLK));
        assert_eq!(u32_at(64), u32::from(acpi_pm::PM1A_CNT_BLK));
        assert_eq!(fadt[88], acpi_pm::PM1_EVT_LEN);
        assert_eq!(fadt[89], acpi_pm::PM1_CNT_LEN);
        assert_eq!(
            u64::from_le_bytes(fadt[140..148].try_into().unwrap()),
            DSDT_ADDR
        );
        assert_eq!(u32_at(112) & (1 << 20), 0, "not hardware-reduced");
    }

    #[test]
    fn several_cpus_get_a_madt_in_the_xsdt_one_cpu_none() {
        assert!(tables(1).iter().all(|(_, t)| &t[..4] != b"APIC"));
        let all = tables(4);
        let (at, madt) = all.last().unwrap();
        assert_eq!(&madt[..4], b"APIC");
        assert!(sums_to_zero(madt));
        assert!(at + madt.len() as u64 <= TABLES_END);
        // Header (36), local APIC address, flags; then one 8-byte entry a CPU.
        assert_eq!(&madt[36..40], &0xfee0_0000u32.to_le_bytes());
        assert_eq!(madt.len(), 44 + 4 * 8 + 12);
        for cpu in 0..4u8 {
            let e = &madt[44 + 8 * usize::from(cpu)..][..8];
            assert_eq!(
                e,
                &[0, 8, cpu, cpu, 1, 0, 0, 0],
                "type 0, length 8, uid, id, enabled"
            );
        }
        // The I/O APIC: type 1, length 12, ID 4 (after the CPUs'), its
        // address, GSI base 0.
        assert_eq!(
            &madt[44 + 4 * 8..],
            &[1, 12, 4, 0, 0, 0, 0xc0, 0xfe, 0, 0, 0, 0]
        );
        let (_, xsdt) = &all[1];
        assert_eq!(&xsdt[36 + 8..36 + 16], &MADT_ADDR.to_le_bytes());
        assert!(tables(255)
            .last()
            .map(|(a, t)| a + t.len() as u64 <= TABLES_END)
            .unwrap());
    }
}
