//! The baseline CPU: one fixed CPUID table, the same on every host kind.
//!
//! Every value is set here (vendor, family, model, brand, caches, address
//! sizes, features), so a guest sees the same CPU on a paravirtual host,
//! on AMD-V and on VT-x, and a trace taken on one matches one taken on
//! another. The only thing a host changes is to drop a feature its KVM
//! cannot run ([`build`] says which), never to add one.
//!
//! The CPU is an AMD64 of QEMU's `qemu64` signature (family 0xf, model
//! 0x6b): the virtual CPU Linux and KVM have run longest on every host
//! vendor, with no CPU-specific mitigation to patch in. AMD rather than
//! Intel also because KVM answers a leaf an AMD table lacks with zeros, as
//! the hardware does, where for Intel it answers with the highest basic
//! leaf; [`answer`] models the former in a line.
//!
//! Features: x86-64's first level (SSE2, CMPXCHG8B, CMOV, FXSR, SYSCALL,
//! NX, LAHF/SAHF) and the hypervisor bit. Nothing a feature bit gates
//! beyond that is in every host's KVM: the paravirtual host's KVM offers
//! neither SSE3 nor SMEP, Bochs's Haswell has no VME, and the VT-x KVM
//! mirrors no leaf-1 bit in leaf 0x8000_0001. Deliberately absent: the
//! local APIC and x2APIC (vtrace has no APIC), MCE/MCA, and RDRAND/RDSEED
//! (their values would differ from one run to the next).

use kvm_bindings::kvm_cpuid_entry2;

const fn bit(n: u32) -> u32 {
    1 << n
}

/// Four ASCII bytes as a CPUID register holds them (first byte lowest).
const fn text(s: &[u8; 4]) -> u32 {
    u32::from_le_bytes(*s)
}

/// "AuthenticAMD", in EBX, EDX, ECX order.
const VENDOR: [u32; 3] = [text(b"Auth"), text(b"enti"), text(b"cAMD")];

/// The brand string of leaves 0x8000_0002..=0x8000_0004, NUL-padded to 48.
const BRAND: &[u8; 48] = b"vtrace baseline x86-64 CPU\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0";

/// Family 0xf, extended model 6, model 0xb (0x6b), stepping 1.
const SIGNATURE: u32 = 0x0006_0fb1;

/// Leaf 1 EBX: CLFLUSH line size 8 × 8 = 64 bytes, one logical processor,
/// APIC ID 0.
const LEAF1_EBX: u32 = (1 << 16) | (8 << 8);

/// Leaf 1 EDX: FPU, DE, PSE, TSC, MSR, PAE, CX8, SEP, MTRR, PGE, CMOV,
/// PAT, PSE36, CLFSH, MMX, FXSR, SSE, SSE2.
pub(super) const LEAF1_EDX: u32 = bit(0)
    | bit(2)
    | bit(3)
    | bit(4)
    | bit(5)
    | bit(6)
    | bit(8)
    | bit(11)
    | bit(12)
    | bit(13)
    | bit(15)
    | bit(16)
    | bit(17)
    | bit(19)
    | bit(23)
    | bit(24)
    | bit(25)
    | bit(26);

/// Leaf 1 ECX: only "running under a hypervisor", which is true.
pub(super) const LEAF1_ECX: u32 = bit(31);

/// Leaf 0x8000_0001 ECX: LAHF/SAHF in long mode.
pub(super) const EXT1_ECX: u32 = bit(0);

/// Leaf 0x8000_0001 EDX: SYSCALL, NX, long mode.
pub(super) const EXT1_EDX: u32 = bit(11) | bit(20) | bit(29);

/// Leaf 0x8000_0005: 32 KiB 8-way L1 data and instruction caches, 64-byte
/// lines (ECX, EDX); no TLB figures.
const L1_CACHE: u32 = (32 << 24) | (8 << 16) | (1 << 8) | 64;

/// Leaf 0x8000_0006 ECX: 512 KiB 8-way (encoded 6) L2, 64-byte lines.
const L2_CACHE: u32 = (512 << 16) | (6 << 12) | (1 << 8) | 64;

/// Physical address bits the table gives (leaf 0x8000_0008 EAX bits 7:0),
/// fewer where the host has fewer.
pub(super) const PHYS_BITS: u32 = 40;

/// Linear address bits (EAX bits 15:8): four-level paging.
const VIRT_BITS: u32 = 48;

fn brand(part: usize) -> [u32; 4] {
    std::array::from_fn(|r| {
        let at = 16 * part + 4 * r;
        u32::from_le_bytes([BRAND[at], BRAND[at + 1], BRAND[at + 2], BRAND[at + 3]])
    })
}

/// The table, leaf by leaf (EAX, EBX, ECX, EDX), before any host drops a
/// feature. No leaf has subleaves.
pub(super) fn leaves() -> Vec<(u32, [u32; 4])> {
    let [v0, v1, v2] = VENDOR;
    vec![
        (0, [1, v0, v2, v1]),
        (1, [SIGNATURE, LEAF1_EBX, LEAF1_ECX, LEAF1_EDX]),
        (0x8000_0000, [0x8000_0008, v0, v2, v1]),
        (0x8000_0001, [SIGNATURE, 0, EXT1_ECX, EXT1_EDX]),
        (0x8000_0002, brand(0)),
        (0x8000_0003, brand(1)),
        (0x8000_0004, brand(2)),
        (0x8000_0005, [0, 0, L1_CACHE, L1_CACHE]),
        (0x8000_0006, [0, 0, L2_CACHE, 0]),
        (0x8000_0007, [0, 0, 0, 0]),
        (0x8000_0008, [(VIRT_BITS << 8) | PHYS_BITS, 0, 0, 0]),
    ]
}

/// A feature of the table the host's KVM does not offer, and so dropped:
/// leaf, register (`'a'`..`'d'`) and bit.
pub type Dropped = (u32, char, u8);

/// The registers of each leaf whose bits name features, as (leaf,
/// register index): the bits a host may drop.
const FEATURE_REGS: [(u32, usize); 4] = [(1, 2), (1, 3), (0x8000_0001, 2), (0x8000_0001, 3)];

/// The baseline table for a host whose KVM supports `supported`: every
/// leaf of [`leaves`], with the features `supported` lacks cleared and
/// the physical address bits cut to the host's; and what was dropped.
pub fn build(supported: &[kvm_cpuid_entry2]) -> (Vec<kvm_cpuid_entry2>, Vec<Dropped>) {
    let offered = |function: u32| answer(supported, function);
    let mut dropped = Vec::new();
    let entries = leaves()
        .into_iter()
        .map(|(function, mut regs)| {
            for &(leaf, r) in FEATURE_REGS.iter().filter(|(l, _)| *l == function) {
                // The hypervisor bit is the VMM's to give, whatever KVM says.
                let own = if leaf == 1 && r == 2 { LEAF1_ECX } else { 0 };
                let lacking = regs[r] & !(offered(leaf)[r] | own);
                for b in (0..32u8).filter(|b| lacking & (1 << b) != 0) {
                    dropped.push((leaf, ['a', 'b', 'c', 'd'][r], b));
                }
                regs[r] &= !lacking;
            }
            if function == 0x8000_0008 {
                let host = offered(function)[0] & 0xff;
                if host != 0 && host < PHYS_BITS {
                    regs[0] = (regs[0] & !0xff) | host;
                }
            }
            entry(function, regs)
        })
        .collect();
    (entries, dropped)
}

/// A leaf without subleaves.
fn entry(function: u32, [eax, ebx, ecx, edx]: [u32; 4]) -> kvm_cpuid_entry2 {
    kvm_cpuid_entry2 {
        function,
        eax,
        ebx,
        ecx,
        edx,
        ..Default::default()
    }
}

/// What KVM answers a CPUID of `function` with from an AMD table
/// `entries` without subleaves: the leaf's values, or zeros for a leaf the
/// table lacks (KVM's rule for AMD, as on the hardware).
pub fn answer(entries: &[kvm_cpuid_entry2], function: u32) -> [u32; 4] {
    entries
        .iter()
        .find(|e| e.function == function)
        .map_or([0; 4], |e| [e.eax, e.ebx, e.ecx, e.edx])
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What the three host kinds' KVMs offer, as measured there.
    fn host(kind: &str) -> Vec<kvm_cpuid_entry2> {
        let (l1, e1, e8) = match kind {
            "paravirtual" => (
                [0xa10f11, 0x20800, 0x8120_2000, 0x078b_fbff],
                [0xa10f11, 0x4000_0000, 0x0040_0393, 0x23d3_fbff],
                0x3030,
            ),
            "amd-v" => (
                [0x800f12, 0x800, 0x76f8_3203, 0x078b_fbfd],
                [0x800f12, 0, 0x75, 0x2dd3_fbfd],
                0x3028,
            ),
            _ => (
                [0x306c3, 0x10800, 0x76fa_3223, 0x0f8b_fbff],
                [0, 0, 0x21, 0x2c10_0800],
                0x3028,
            ),
        };
        vec![
            entry(1, l1),
            entry(0x8000_0001, e1),
            entry(0x8000_0008, [e8, 0, 0, 0]),
        ]
    }

    #[test]
    fn every_host_kind_gets_the_whole_table() {
        let (reference, none) = build(&host("vt-x"));
        assert!(none.is_empty(), "{none:?}");
        for kind in ["paravirtual", "amd-v"] {
            let (entries, dropped) = build(&host(kind));
            assert!(dropped.is_empty(), "{kind}: {dropped:?}");
            assert_eq!(entries, reference, "{kind}");
        }
    }

    #[test]
    fn a_host_without_a_feature_drops_it_and_says_so() {
        let mut h = host("vt-x");
        h[0].edx &= !bit(26); // no SSE2
        h[1].edx &= !bit(20); // no NX
        h[2].eax = 0x3024; // 36 physical address bits
        let (entries, dropped) = build(&h);
        assert_eq!(dropped, [(1, 'd', 26), (0x8000_0001, 'd', 20)]);
        assert_eq!(answer(&entries, 1)[3], LEAF1_EDX & !bit(26));
        assert_eq!(answer(&entries, 0x8000_0008)[0], 0x3024);
        // The hypervisor bit stays though no KVM lists it.
        assert_eq!(answer(&entries, 1)[2], LEAF1_ECX);
    }

    #[test]
    fn the_table_says_what_cpu_it_is() {
        let (entries, _) = build(&host("vt-x"));
        let vendor: Vec<u8> = [1, 3, 2]
            .iter()
            .flat_map(|&r| answer(&entries, 0)[r].to_le_bytes())
            .collect();
        assert_eq!(vendor, b"AuthenticAMD");
        let leaf1 = answer(&entries, 1);
        // Family 0xf + extended 0, model 0xb + (6 << 4): as Linux works it out.
        assert_eq!((leaf1[0] >> 8) & 0xf, 0xf);
        assert_eq!(
            ((leaf1[0] >> 16) & 0xf) << 4 | ((leaf1[0] >> 4) & 0xf),
            0x6b
        );
        let brand: Vec<u8> = (0x8000_0002..=0x8000_0004)
            .flat_map(|f| answer(&entries, f))
            .flat_map(u32::to_le_bytes)
            .collect();
        assert!(brand.starts_with(b"vtrace baseline x86-64 CPU\0"));
        assert_eq!(answer(&entries, 0)[0], 1, "leaves 0 and 1");
        assert_eq!(answer(&entries, 0x8000_0000)[0], 0x8000_0008);
        assert_eq!(answer(&entries, 7), [0; 4], "a leaf past the table");
        assert_eq!(
            answer(&entries, 0x4000_0000),
            [0; 4],
            "no hypervisor leaves"
        );
    }
}
