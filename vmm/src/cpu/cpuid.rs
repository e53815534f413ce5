//! CPUID profiles.
//!
//! `baseline` (the default) hides what the VMM does not emulate (local APIC,
//! x2APIC, TSC-deadline, kvmclock and the other paravirtual leaves) and what
//! KVM's instruction emulator cannot run on hosts where kernel code is
//! emulated (CMPXCHG16B, the XSAVE family, POPCNT, RDTSCP/RDPID, ...), so an
//! unmodified kernel picks code paths that work everywhere vtrace runs.
//! `host` passes KVM's supported set through, for real VT-x/AMD-V machines.

use kvm_bindings::{kvm_cpuid_entry2, CpuId, KVM_MAX_CPUID_ENTRIES};
use kvm_ioctls::Kvm;

use crate::error::{Error, Result};

/// Which CPU the guest sees.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum CpuProfile {
    /// Features every vtrace host can run (see the module docs).
    #[default]
    Baseline,
    /// Everything KVM supports on this host.
    Host,
}

const fn bit(n: u32) -> u32 {
    1 << n
}

/// Leaf 1 ECX bits hidden by the baseline.
const LEAF1_ECX_HIDDEN: u32 = bit(3) // MONITOR/MWAIT
    | bit(5) // VMX
    | bit(6) // SMX
    | bit(7) // EST
    | bit(8) // TM2
    | bit(11) // SDBG
    | bit(12) // FMA (needs AVX state)
    | bit(13) // CMPXCHG16B
    | bit(14) // xTPR
    | bit(15) // PDCM
    | bit(17) // PCID
    | bit(18) // DCA
    | bit(21) // x2APIC
    | bit(22) // MOVBE
    | bit(23) // POPCNT
    | bit(24) // TSC-deadline
    | bit(25) // AES
    | bit(26) // XSAVE
    | bit(27) // OSXSAVE
    | bit(28) // AVX
    | bit(29); // F16C

/// Leaf 1 EDX bits hidden by the baseline.
const LEAF1_EDX_HIDDEN: u32 = bit(7) // MCE
    | bit(9) // local APIC
    | bit(14) // MCA
    | bit(22) // ACPI thermal MSRs
    | bit(29) // TM
    | bit(31); // PBE

/// Leaf 7 EBX bits the baseline keeps: ERMS and SMEP (plain CR4 bit).
const LEAF7_EBX_KEPT: u32 = bit(7) | bit(9);

/// Leaf 0x8000_0001: keep LAHF/SAHF and PREFETCHW in ECX, and SYSCALL,
/// NX and long mode in EDX (1 GiB pages and RDTSCP go).
const EXT1_ECX_KEPT: u32 = bit(0) | bit(8);
const EXT1_EDX_HIDDEN: u32 = bit(26) | bit(27);

/// Leaves the baseline removes entirely.
fn leaf_hidden(function: u32) -> bool {
    matches!(
        function,
        0x5 | 0x6 | 0xa | 0xd | 0x12 | 0x14 | 0x19 | 0x1d | 0x1e
    ) || (0x4000_0000..0x5000_0000).contains(&function)
}

/// Applies the baseline profile to KVM's supported entries.
pub fn apply_baseline(entries: &mut Vec<kvm_cpuid_entry2>) {
    entries.retain(|e| !leaf_hidden(e.function));
    for e in entries.iter_mut() {
        match (e.function, e.index) {
            (1, _) => {
                e.ecx &= !LEAF1_ECX_HIDDEN;
                e.edx &= !LEAF1_EDX_HIDDEN;
                e.ecx |= bit(31); // say "hypervisor": it is true
            }
            (7, 0) => {
                e.eax = 0; // no further subleaves
                e.ebx &= LEAF7_EBX_KEPT;
                e.ecx = 0;
                e.edx = 0;
            }
            (7, _) => {
                e.eax = 0;
                e.ebx = 0;
                e.ecx = 0;
                e.edx = 0;
            }
            (0x8000_0001, _) => {
                e.ecx &= EXT1_ECX_KEPT;
                e.edx &= !EXT1_EDX_HIDDEN;
            }
            _ => {}
        }
    }
}

/// Bits of the feature leaves that mirror control-register state rather
/// than name a feature (OSXSAVE, OSPKE, the APIC bit KVM clears with the
/// APIC), left as the CPU reported them by [`as_given`].
fn dynamic_bits(function: u32, index: u32) -> [u32; 4] {
    match (function, index) {
        (1, _) => [u32::MAX, u32::MAX, bit(27), bit(9)],
        (7, 0) => [u32::MAX, 0, bit(4), 0],
        _ => [u32::MAX; 4],
    }
}

/// What a CPUID of `function`/`index` should have returned, given that the
/// CPU returned `seen` (EAX, EBX, ECX, EDX) and the vCPU's table is
/// `table`: feature bits the table does not set are cleared. Some KVMs
/// (those that emulate kernel code) answer CPUID from the host CPU, so the
/// feature leaves leak what the table hides; a tracer corrects the result
/// at the step after the instruction, so every host gives the same trace.
pub fn as_given(table: &CpuId, function: u32, index: u32, seen: [u32; 4]) -> [u32; 4] {
    if !matches!(function, 1 | 7 | 0x8000_0001) || (function == 7 && index != 0) {
        return seen;
    }
    let Some(e) = table
        .as_slice()
        .iter()
        .find(|e| e.function == function && (function != 7 || e.index == index))
    else {
        return seen;
    };
    let given = [e.eax, e.ebx, e.ecx, e.edx];
    let keep = dynamic_bits(function, index);
    std::array::from_fn(|i| seen[i] & (given[i] | keep[i]))
}

/// The CPUID table for the guest's vCPU.
pub fn build(kvm: &Kvm, profile: CpuProfile) -> Result<CpuId> {
    let supported = kvm
        .get_supported_cpuid(KVM_MAX_CPUID_ENTRIES)
        .map_err(Error::kvm("KVM_GET_SUPPORTED_CPUID"))?;
    let mut entries = supported.as_slice().to_vec();
    if profile == CpuProfile::Baseline {
        apply_baseline(&mut entries);
    }
    // One vCPU: APIC ID 0, one logical processor.
    for e in entries.iter_mut().filter(|e| e.function == 1) {
        e.ebx &= 0x0000_ffff;
        e.ebx |= 1 << 16;
    }
    CpuId::from_entries(&entries)
        .map_err(|e| Error::KvmUnsupported(crate::error::KvmLack::CpuidTable(e)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(function: u32, index: u32, regs: [u32; 4]) -> kvm_cpuid_entry2 {
        kvm_cpuid_entry2 {
            function,
            index,
            eax: regs[0],
            ebx: regs[1],
            ecx: regs[2],
            edx: regs[3],
            ..Default::default()
        }
    }

    #[test]
    fn as_given_clears_only_feature_bits_the_table_lacks() {
        let table =
            CpuId::from_entries(&[entry(1, 0, [0x800f12, 0x10800, bit(0), bit(0)])]).unwrap();
        let seen = [
            0x800f12,
            0x20800,
            bit(0) | bit(23) | bit(27),
            bit(0) | bit(9) | bit(25),
        ];
        assert_eq!(
            as_given(&table, 1, 0, seen),
            // EAX and EBX as seen; POPCNT and SSE go, OSXSAVE and APIC stay.
            [0x800f12, 0x20800, bit(0) | bit(27), bit(0) | bit(9)]
        );
        assert_eq!(as_given(&table, 0xb, 0, seen), seen, "not a feature leaf");
    }

    #[test]
    fn baseline_hides_unemulated_features() {
        let mut e = vec![
            entry(1, 0, [0, 0, u32::MAX, u32::MAX]),
            entry(7, 0, [2, u32::MAX, u32::MAX, u32::MAX]),
            entry(0xd, 0, [7, 0, 0, 0]),
            entry(0x4000_0000, 0, [0x4000_0001, 0, 0, 0]),
            entry(0x8000_0001, 0, [0, 0, u32::MAX, u32::MAX]),
        ];
        apply_baseline(&mut e);
        let leaf = |f| e.iter().find(|x| x.function == f).copied();
        let l1 = leaf(1).unwrap();
        for hidden in [13, 21, 23, 24, 26, 27, 28] {
            assert_eq!(l1.ecx & bit(hidden), 0, "leaf 1 ecx bit {hidden}");
        }
        assert_eq!(l1.edx & bit(9), 0, "APIC");
        assert_ne!(l1.ecx & bit(0), 0, "SSE3 stays");
        assert_eq!(leaf(7).unwrap().ebx, LEAF7_EBX_KEPT);
        assert!(leaf(0xd).is_none());
        assert!(leaf(0x4000_0000).is_none());
        let ext = leaf(0x8000_0001).unwrap();
        assert_eq!(ext.edx & bit(27), 0, "RDTSCP");
        assert_ne!(ext.edx & bit(29), 0, "long mode stays");
    }
}
