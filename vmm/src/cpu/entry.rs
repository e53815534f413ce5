//! The CPU state each boot protocol hands over to the guest.

use kvm_bindings::{kvm_fpu, kvm_regs, kvm_segment, kvm_sregs};
use vm_memory::{Bytes, GuestAddress};

use crate::error::{Error, Result};
use crate::memory::{layout, GuestRam};
use crate::vcpu::Vcpu;

/// Where and how the vCPU starts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EntryState {
    /// 16-bit real mode at `load_addr` (CS:IP chosen to reach it).
    RealMode { load_addr: u64 },
    /// PVH: 32-bit protected mode, paging off, EBX = `start_info`.
    Protected32 { entry: u64, start_info: u64 },
    /// Linux 64-bit boot protocol: long mode on an identity map of the first
    /// 1 GiB, RSI = `boot_params`.
    Long64 { entry: u64, boot_params: u64 },
    /// An application processor that took a STARTUP IPI: real mode, CS
    /// `vector << 8` (base `vector << 12`), IP 0, paging and long mode off
    /// (SDM vol. 3A, 9.4.4 and table 10-1).
    Startup { vector: u8 },
}

use vtrace_x86::{cr0, cr4, efer};

/// Boot GDT: null, 32-bit code (0x08), data (0x10), 64-bit code (0x18).
const GDT: [u64; 4] = [
    0,
    gdt_entry(0xc09b, 0, 0xfffff),
    gdt_entry(0xc093, 0, 0xfffff),
    gdt_entry(0xa09b, 0, 0xfffff),
];
const CODE32: u16 = 0x08;
const DATA: u16 = 0x10;
const CODE64: u16 = 0x18;

/// A GDT descriptor from its flags (access byte and granularity nibble),
/// base and limit.
pub(crate) const fn gdt_entry(flags: u16, base: u32, limit: u32) -> u64 {
    ((base as u64 & 0xff00_0000) << 32)
        | ((flags as u64 & 0xf0ff) << 40)
        | ((limit as u64 & 0x000f_0000) << 32)
        | ((base as u64 & 0x00ff_ffff) << 16)
        | (limit as u64 & 0x0000_ffff)
}

/// The hidden part of a segment register, as loading `selector` from GDT
/// would fill it.
fn segment(selector: u16) -> kvm_segment {
    segment_of(GDT[usize::from(selector >> 3)], selector)
}

/// The hidden part of a segment register loaded with `selector`, which
/// names the GDT descriptor `entry`.
pub(crate) fn segment_of(entry: u64, selector: u16) -> kvm_segment {
    let flags = (entry >> 40) as u16;
    let granular = (flags >> 15) & 1 == 1;
    let raw_limit = ((entry >> 32) & 0xf_0000 | entry & 0xffff) as u32;
    kvm_segment {
        base: ((entry >> 16) & 0xff_ffff) | ((entry >> 32) & 0xff00_0000),
        limit: if granular {
            (raw_limit << 12) | 0xfff
        } else {
            raw_limit
        },
        selector,
        type_: (flags & 0xf) as u8,
        present: ((flags >> 7) & 1) as u8,
        dpl: ((flags >> 5) & 3) as u8,
        db: ((flags >> 14) & 1) as u8,
        s: ((flags >> 4) & 1) as u8,
        l: ((flags >> 13) & 1) as u8,
        g: granular as u8,
        avl: ((flags >> 12) & 1) as u8,
        unusable: 0,
        padding: 0,
    }
}

fn real_segment(selector: u16, code: bool) -> kvm_segment {
    kvm_segment {
        base: u64::from(selector) << 4,
        limit: 0xffff,
        selector,
        type_: if code { 0xb } else { 0x3 },
        present: 1,
        s: 1,
        ..Default::default()
    }
}

/// Loads `seg` into DS, ES, FS, GS and SS.
fn data_segments(sregs: &mut kvm_sregs, seg: kvm_segment) {
    for s in [
        &mut sregs.ds,
        &mut sregs.es,
        &mut sregs.fs,
        &mut sregs.gs,
        &mut sregs.ss,
    ] {
        *s = seg;
    }
}

fn write(mem: &GuestRam, addr: u64, bytes: &[u8]) -> Result<()> {
    mem.write_slice(bytes, GuestAddress(addr))
        .map_err(|source| Error::GuestWrite {
            what: "the boot structures",
            at: addr,
            source,
        })
}

fn write_gdt_idt(mem: &GuestRam, sregs: &mut kvm_sregs) -> Result<()> {
    let gdt: Vec<u8> = GDT.iter().flat_map(|e| e.to_le_bytes()).collect();
    write(mem, layout::BOOT_GDT, &gdt)?;
    write(mem, layout::BOOT_IDT, &0u64.to_le_bytes())?;
    sregs.gdt.base = layout::BOOT_GDT;
    sregs.gdt.limit = (gdt.len() - 1) as u16;
    sregs.idt.base = layout::BOOT_IDT;
    sregs.idt.limit = 7;
    Ok(())
}

/// Identity map of the first 1 GiB with 2 MiB pages.
fn write_identity_map(mem: &GuestRam) -> Result<()> {
    write(mem, layout::PML4, &(layout::PDPT | 0x3).to_le_bytes())?;
    write(mem, layout::PDPT, &(layout::PD | 0x3).to_le_bytes())?;
    let pd: Vec<u8> = (0..512u64)
        .flat_map(|i| ((i << 21) | 0x83).to_le_bytes())
        .collect();
    write(mem, layout::PD, &pd)
}

/// Puts the vCPU into `state`, writing the boot GDT (and page tables for
/// long mode) into guest memory.
pub fn apply(vcpu: &mut Vcpu, mem: &GuestRam, state: EntryState) -> Result<()> {
    let mut sregs = vcpu.sregs();
    let mut regs = kvm_regs {
        rflags: 0x2,
        ..Default::default()
    };
    match state {
        EntryState::RealMode { load_addr } => {
            let (cs, ip) = if load_addr <= 0xffff {
                (0u16, load_addr)
            } else {
                ((load_addr >> 4) as u16, load_addr & 0xf)
            };
            sregs.cs = real_segment(cs, true);
            data_segments(&mut sregs, real_segment(0, false));
            sregs.cr0 = cr0::ET;
            regs.rip = ip;
        }
        EntryState::Startup { vector } => {
            sregs.cs = real_segment(u16::from(vector) << 8, true);
            data_segments(&mut sregs, real_segment(0, false));
            sregs.gdt.base = 0;
            sregs.gdt.limit = 0xffff;
            sregs.idt.base = 0;
            sregs.idt.limit = 0xffff;
            sregs.cr0 = cr0::ET;
            sregs.cr3 = 0;
            sregs.cr4 = 0;
            sregs.efer = 0;
        }
        EntryState::Protected32 { entry, start_info } => {
            write_gdt_idt(mem, &mut sregs)?;
            sregs.cs = segment(CODE32);
            data_segments(&mut sregs, segment(DATA));
            sregs.tr.type_ = 0xb;
            sregs.tr.present = 1;
            sregs.cr0 = cr0::PE | cr0::ET;
            sregs.cr4 = 0;
            sregs.efer = 0;
            regs.rip = entry;
            regs.rbx = start_info;
        }
        EntryState::Long64 { entry, boot_params } => {
            write_gdt_idt(mem, &mut sregs)?;
            write_identity_map(mem)?;
            sregs.cs = segment(CODE64);
            data_segments(&mut sregs, segment(DATA));
            sregs.tr.type_ = 0xb;
            sregs.tr.present = 1;
            sregs.cr3 = layout::PML4;
            sregs.cr4 = cr4::PAE;
            sregs.cr0 = cr0::PE | cr0::ET | cr0::PG;
            sregs.efer = efer::LME | efer::LMA;
            regs.rip = entry;
            regs.rsi = boot_params;
            regs.rsp = layout::BOOT_STACK_TOP;
            regs.rbp = layout::BOOT_STACK_TOP;
        }
    }
    vcpu.set_sregs(&sregs)?;
    vcpu.set_regs(&regs)?;
    let fpu = kvm_fpu {
        fcw: 0x37f,
        mxcsr: 0x1f80,
        ..Default::default()
    };
    vcpu.set_fpu(&fpu)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gdt_segments_decode_as_flat() {
        let cs = segment(CODE64);
        assert_eq!(
            (cs.l, cs.db, cs.base, cs.limit, cs.type_),
            (1, 0, 0, 0xffff_ffff, 0xb)
        );
        let cs32 = segment(CODE32);
        assert_eq!((cs32.l, cs32.db, cs32.present, cs32.s), (0, 1, 1, 1));
        let ds = segment(DATA);
        assert_eq!((ds.type_, ds.limit), (0x3, 0xffff_ffff));
    }
}
