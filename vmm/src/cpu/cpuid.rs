//! CPUID profiles.
//!
//! `baseline` (the default) is one fixed CPU, the same on every host kind
//! (`baseline.rs`): a trace of a guest that asks for its CPU's identity
//! and features is the same on every host. `host` passes KVM's supported
//! set through, for guests that should use what a real VT-x/AMD-V machine
//! offers.

mod baseline;

pub use baseline::Dropped;

use kvm_bindings::{kvm_cpuid_entry2, CpuId, KVM_MAX_CPUID_ENTRIES};
use kvm_ioctls::Kvm;

use crate::error::{Error, Result};

/// Which CPU the guest sees.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum CpuProfile {
    /// One fixed CPU, the same on every host (see `baseline.rs`).
    #[default]
    Baseline,
    /// Everything KVM supports on this host.
    Host,
}

const fn bit(n: u32) -> u32 {
    1 << n
}

/// The vCPU's CPUID table, and what a CPUID should answer with it.
#[derive(Clone, Debug)]
pub struct CpuidTable {
    entries: CpuId,
    profile: CpuProfile,
    dropped: Vec<Dropped>,
}

impl CpuidTable {
    /// The table for `profile` on the host whose KVM supports `supported`.
    pub fn new(supported: &[kvm_cpuid_entry2], profile: CpuProfile) -> Result<Self> {
        let (mut entries, dropped) = match profile {
            CpuProfile::Baseline => baseline::build(supported),
            CpuProfile::Host => (supported.to_vec(), Vec::new()),
        };
        // APIC ID 0 (see `for_cpu`), one logical processor a package.
        for e in entries.iter_mut().filter(|e| e.function == 1) {
            e.ebx &= 0x0000_ffff;
            e.ebx |= 1 << 16;
        }
        let entries = CpuId::from_entries(&entries)
            .map_err(|e| Error::KvmUnsupported(crate::error::KvmLack::CpuidTable(e)))?;
        Ok(Self {
            entries,
            profile,
            dropped,
        })
    }

    /// The entries, for `KVM_SET_CPUID2`.
    pub fn entries(&self) -> &CpuId {
        &self.entries
    }

    /// The entries as CPU `apic_id` sees them: its initial APIC ID in leaf
    /// 1 (EBX bits 24-31) and in the x2APIC topology leaves (EDX of 0xB
    /// and 0x1F). CPU 0's are [`entries`](Self::entries).
    pub fn for_cpu(&self, apic_id: u8) -> Result<CpuId> {
        let mut entries = self.entries.as_slice().to_vec();
        for e in &mut entries {
            let mut regs = [e.eax, e.ebx, e.ecx, e.edx];
            place_apic_id(e.function, apic_id, &mut regs);
            [e.eax, e.ebx, e.ecx, e.edx] = regs;
        }
        CpuId::from_entries(&entries)
            .map_err(|e| Error::KvmUnsupported(crate::error::KvmLack::CpuidTable(e)))
    }

    /// The machine has local APICs (several CPUs): leaf 1 says so (EDX
    /// bit 9), which the baseline CPU, without one, does not.
    pub fn with_local_apics(mut self) -> Result<Self> {
        let mut entries = self.entries.as_slice().to_vec();
        for e in entries.iter_mut().filter(|e| e.function == 1) {
            e.edx |= 1 << 9;
        }
        self.entries = CpuId::from_entries(&entries)
            .map_err(|e| Error::KvmUnsupported(crate::error::KvmLack::CpuidTable(e)))?;
        Ok(self)
    }

    /// [`as_given`](Self::as_given) on the CPU of APIC ID `apic_id`.
    pub fn as_given_on(&self, apic_id: u8, function: u32, index: u32, seen: [u32; 4]) -> [u32; 4] {
        let mut given = self.as_given(function, index, seen);
        place_apic_id(function, apic_id, &mut given);
        given
    }

    /// Features of the baseline CPU this host's KVM cannot run, and so
    /// left out: a trace here differs from other hosts' wherever the guest
    /// asks. Empty for the host profile.
    pub fn dropped(&self) -> &[Dropped] {
        &self.dropped
    }

    /// What a CPUID of `function`/`index` should have returned, given that
    /// the CPU returned `seen` (EAX, EBX, ECX, EDX). Some KVMs (those that
    /// emulate kernel code) answer CPUID from the host CPU, so a guest
    /// would see the host's vendor, signature and features; a tracer
    /// corrects the result at the step after the instruction, so every
    /// host gives the same trace. With the baseline every leaf is the
    /// table's; with the host profile only feature bits the table lacks
    /// are cleared, and bits that mirror control-register state stay.
    pub fn as_given(&self, function: u32, index: u32, seen: [u32; 4]) -> [u32; 4] {
        match self.profile {
            CpuProfile::Baseline => baseline::answer(self.entries.as_slice(), function),
            CpuProfile::Host => host_as_given(&self.entries, function, index, seen),
        }
    }
}

/// Puts APIC ID `id` where CPUID leaf `function`'s result (EAX, EBX, ECX,
/// EDX) gives the CPU's own: leaf 1's EBX bits 24-31, the x2APIC ID in
/// EDX of leaves 0xB and 0x1F.
fn place_apic_id(function: u32, id: u8, regs: &mut [u32; 4]) {
    match function {
        1 => regs[1] = (regs[1] & 0x00ff_ffff) | (u32::from(id) << 24),
        0xb | 0x1f => regs[3] = u32::from(id),
        _ => {}
    }
}

/// Bits of the feature leaves that mirror control-register state rather
/// than name a feature (OSXSAVE, OSPKE, the APIC bit KVM clears with the
/// APIC), left as the CPU reported them by [`host_as_given`].
fn dynamic_bits(function: u32, index: u32) -> [u32; 4] {
    match (function, index) {
        (1, _) => [u32::MAX, u32::MAX, bit(27), bit(9)],
        (7, 0) => [u32::MAX, 0, bit(4), 0],
        _ => [u32::MAX; 4],
    }
}

/// [`CpuidTable::as_given`] for the host profile: the feature bits of
/// leaves 1, 7.0 and 0x8000_0001 the table does not set are cleared.
fn host_as_given(table: &CpuId, function: u32, index: u32, seen: [u32; 4]) -> [u32; 4] {
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

/// The CPUID table for the guest's vCPU on this host.
pub fn build(kvm: &Kvm, profile: CpuProfile) -> Result<CpuidTable> {
    let supported = kvm
        .get_supported_cpuid(KVM_MAX_CPUID_ENTRIES)
        .map_err(Error::kvm("KVM_GET_SUPPORTED_CPUID"))?;
    CpuidTable::new(supported.as_slice(), profile)
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
    fn host_profile_clears_only_feature_bits_the_table_lacks() {
        let table = CpuidTable::new(
            &[entry(1, 0, [0x800f12, 0x10800, bit(0), bit(0)])],
            CpuProfile::Host,
        )
        .unwrap();
        let seen = [
            0x800f12,
            0x20800,
            bit(0) | bit(23) | bit(27),
            bit(0) | bit(9) | bit(25),
        ];
        assert_eq!(
            table.as_given(1, 0, seen),
            // EAX and EBX as seen; POPCNT and SSE go, OSXSAVE and APIC stay.
            [0x800f12, 0x20800, bit(0) | bit(27), bit(0) | bit(9)]
        );
        assert_eq!(table.as_given(0xb, 0, seen), seen, "not a feature leaf");
    }

    #[test]
    fn each_cpu_of_several_sees_its_apic_id_and_an_apic() {
        let table = CpuidTable::new(
            &[
                entry(1, 0, [0x800f12, 0x10800, 0, 0]),
                entry(0xb, 0, [1, 1, 0x100, 0]),
            ],
            CpuProfile::Host,
        )
        .unwrap()
        .with_local_apics()
        .unwrap();
        let three = table.for_cpu(3).unwrap();
        let leaf = |f: u32| {
            three
                .as_slice()
                .iter()
                .find(|e| e.function == f)
                .copied()
                .unwrap()
        };
        assert_eq!(leaf(1).ebx >> 24, 3);
        assert_eq!(leaf(1).edx & bit(9), bit(9), "APIC");
        assert_eq!(leaf(0xb).edx, 3);
        // What the tracer corrects a CPUID to on CPU 3, where KVM had the
        // host answer: CPU 3's APIC ID, not CPU 0's.
        let given = table.as_given_on(3, 1, 0, [0x800f12, 0x10800, 0, bit(9)]);
        assert_eq!(given[1] >> 24, 3);
        assert_eq!(table.as_given_on(0, 1, 0, given)[1] >> 24, 0);
    }

    #[test]
    fn baseline_answers_every_leaf_from_its_table() {
        // A host that leaks its own vendor, signature and features.
        let host = [
            entry(0, 0, [0xd, 0x756e_6547, 0x6c65_746e, 0x4965_6e69]),
            entry(1, 0, [0x306c3, 0x10800, u32::MAX, u32::MAX]),
            entry(7, 0, [0, u32::MAX, u32::MAX, u32::MAX]),
            entry(0x8000_0001, 0, [0, 0, u32::MAX, u32::MAX]),
            entry(0x8000_0008, 0, [0x3028, 0, 0, 0]),
        ];
        let table = CpuidTable::new(&host, CpuProfile::Baseline).unwrap();
        assert!(table.dropped().is_empty(), "{:?}", table.dropped());
        for (function, e) in [0, 1, 7, 0x8000_0001, 0x4000_0000]
            .into_iter()
            .zip(host.iter().chain(std::iter::once(&host[0])))
        {
            let seen = [e.eax, e.ebx, e.ecx, e.edx];
            assert_eq!(
                table.as_given(function, 0, seen),
                baseline::answer(table.entries().as_slice(), function),
                "leaf {function:#x}"
            );
        }
        assert_eq!(table.as_given(1, 0, [0; 4])[1], (1 << 16) | (8 << 8));
        assert_eq!(table.as_given(7, 0, [u32::MAX; 4]), [0; 4]);
    }
}
