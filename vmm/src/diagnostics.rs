//! What the user is shown when a guest dies: registers, the code at RIP and
//! the last exits before it happened.

use std::fmt;

use iced_x86::{CpuidFeature, Decoder, DecoderOptions, Formatter, Instruction, IntelFormatter};
use vtrace_x86::{Registers, SpecialRegisters};

/// How many recent exits the report keeps.
pub const EXIT_HISTORY: usize = 16;

/// One exit, remembered for a crash report.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ExitNote {
    pub kind: &'static str,
    pub rip: u64,
    /// Port, address or vector, depending on the kind.
    pub detail: u64,
}

/// A ring of the last exits; recording one is a copy into a fixed array, so
/// it can stay on even where exits are frequent.
#[derive(Clone, Debug, Default)]
pub struct ExitHistory {
    notes: [ExitNote; EXIT_HISTORY],
    next: usize,
    total: u64,
}

impl ExitHistory {
    pub fn record(&mut self, note: ExitNote) {
        self.notes[self.next] = note;
        self.next = (self.next + 1) % EXIT_HISTORY;
        self.total += 1;
    }

    /// Exits recorded so far.
    pub fn total(&self) -> u64 {
        self.total
    }

    /// The remembered exits, oldest first.
    pub fn recent(&self) -> Vec<ExitNote> {
        let kept = (self.total as usize).min(EXIT_HISTORY);
        (0..kept)
            .map(|i| self.notes[(self.next + EXIT_HISTORY - kept + i) % EXIT_HISTORY])
            .collect()
    }
}

/// The guest's state when it stopped abnormally.
#[derive(Clone, Debug)]
pub struct CrashReport {
    /// The general registers.
    pub regs: Registers,
    /// The segment, control and descriptor-table registers.
    pub sregs: SpecialRegisters,
    /// Bytes at CS:RIP, if they could be read.
    pub code: Option<Vec<u8>>,
    /// The last exits, oldest first.
    pub recent_exits: Vec<ExitNote>,
    /// What the user can do about it.
    pub hint: Option<String>,
    /// RIP's routine and source line (`start_kernel+0x12 at
    /// init/main.c:950`), where whoever reports the crash knows the
    /// guest's symbols.
    pub rip_named: Option<String>,
}

impl CrashReport {
    /// Code size of the CPU mode in the segment registers: 16, 32 or 64.
    pub fn bitness(&self) -> u32 {
        self.sregs.code_bits()
    }

    /// The instruction at RIP, if its bytes are known and decode.
    pub fn decoded(&self) -> Option<Instruction> {
        let code = self.code.as_ref()?;
        let mut decoder =
            Decoder::with_ip(self.bitness(), code, self.regs.rip, DecoderOptions::NONE);
        let insn = decoder.decode();
        (!insn.is_invalid()).then_some(insn)
    }

    /// The instruction at RIP in Intel syntax, if its bytes are known.
    pub fn instruction(&self) -> Option<String> {
        self.decoded().map(|insn| intel(&insn))
    }
}

fn intel(insn: &Instruction) -> String {
    let mut text = String::new();
    IntelFormatter::new().format(insn, &mut text);
    text
}

impl fmt::Display for CrashReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let r = &self.regs;
        let s = &self.sregs;
        writeln!(
            f,
            "  mode: {}-bit, CPL {}, CS:RIP {:04x}:{:016x}",
            self.bitness(),
            s.cs.selector & 3,
            s.cs.selector,
            r.rip
        )?;
        if let Some(named) = &self.rip_named {
            writeln!(f, "  RIP is in: {named}")?;
        }
        if let Some(code) = &self.code {
            let bytes: Vec<String> = code.iter().take(15).map(|b| format!("{b:02x}")).collect();
            write!(f, "  code at RIP: {}", bytes.join(" "))?;
            match self.instruction() {
                Some(text) => writeln!(f, "  ({text})")?,
                None => writeln!(f)?,
            }
        }
        writeln!(
            f,
            "  rax {:016x} rbx {:016x} rcx {:016x} rdx {:016x}",
            r.rax, r.rbx, r.rcx, r.rdx
        )?;
        writeln!(
            f,
            "  rsi {:016x} rdi {:016x} rbp {:016x} rsp {:016x}",
            r.rsi, r.rdi, r.rbp, r.rsp
        )?;
        writeln!(
            f,
            "  r8  {:016x} r9  {:016x} r10 {:016x} r11 {:016x}",
            r.r8, r.r9, r.r10, r.r11
        )?;
        writeln!(
            f,
            "  r12 {:016x} r13 {:016x} r14 {:016x} r15 {:016x}",
            r.r12, r.r13, r.r14, r.r15
        )?;
        writeln!(
            f,
            "  rflags {:08x} cr0 {:08x} cr2 {:016x} cr3 {:016x} cr4 {:08x} efer {:x}",
            r.rflags, s.cr0, s.cr2, s.cr3, s.cr4, s.efer
        )?;
        writeln!(
            f,
            "  idt {:016x}+{:x} gdt {:016x}+{:x}",
            s.idt.base, s.idt.limit, s.gdt.base, s.gdt.limit
        )?;
        if !self.recent_exits.is_empty() {
            writeln!(f, "  last exits, oldest first:")?;
            for e in &self.recent_exits {
                writeln!(f, "    {:<12} rip {:016x}  {:#x}", e.kind, e.rip, e.detail)?;
            }
        }
        if let Some(hint) = &self.hint {
            write!(f, "  hint: {hint}")?;
        }
        Ok(())
    }
}

/// What to tell a user whose guest hit an instruction the emulator lacks.
pub const EMULATOR_HINT: &str = "on this host KVM runs kernel-mode guest code in its instruction \
emulator, which lacks some instructions: INT n / INT3 / INTO outside real mode, CMPXCHG16B, the \
XSAVE family, XGETBV, POPCNT, RDTSCP, RDPID, x87 control (FNCLEX), and of SSE and its successors \
all but a few moves. \
Keep the default --cpu baseline (it hides the CPUID-gated ones from the guest) and build guest \
code without them (gcc: -mgeneral-regs-only -mno-popcnt), or run on a host with hardware \
VT-x/AMD-V.";

/// The hint for an emulation failure at `insn` (where it decoded): names
/// the instruction and the CPU feature it belongs to, and for a vector
/// instruction, how a kernel came to run it, before [`EMULATOR_HINT`].
pub fn emulator_hint(insn: Option<&Instruction>) -> String {
    let Some(insn) = insn else {
        return EMULATOR_HINT.to_string();
    };
    // The features every x86-64 CPU has say nothing.
    let features: Vec<String> = insn
        .cpuid_features()
        .iter()
        .filter(|f| {
            !matches!(
                f,
                CpuidFeature::INTEL8086
                    | CpuidFeature::INTEL186
                    | CpuidFeature::INTEL286
                    | CpuidFeature::INTEL386
                    | CpuidFeature::INTEL486
                    | CpuidFeature::X64
            )
        })
        .map(|f| format!("{f:?}").replace('_', "."))
        .collect();
    let vector = (0..insn.op_count()).any(|i| {
        let r = insn.op_register(i);
        r.is_xmm() || r.is_ymm() || r.is_zmm()
    });
    let mut hint = format!("the guest ran `{}`", intel(insn));
    if !features.is_empty() {
        hint += &format!(" ({})", features.join(", "));
    }
    hint += ", which KVM's emulator here cannot run. ";
    if vector {
        hint += "A Linux kernel picks such code (crypto, RAID) by CPUID, and this host lets some \
                 of its CPU's own bits through to an untraced guest (`vtrace doctor` lists \
                 them): hide the feature with clearcpuid= on the kernel's command line (the \
                 default line does for those vtrace knows of). ";
    }
    hint + "In general, " + EMULATOR_HINT
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn history_keeps_the_last_exits_in_order() {
        let mut h = ExitHistory::default();
        for i in 0..20u64 {
            h.record(ExitNote {
                kind: "io",
                rip: i,
                detail: 0,
            });
        }
        let recent = h.recent();
        assert_eq!(recent.len(), EXIT_HISTORY);
        assert_eq!(recent.first().unwrap().rip, 4);
        assert_eq!(recent.last().unwrap().rip, 19);
        assert_eq!(h.total(), 20);
    }

    /// A report of a 64-bit guest stopped at `rip` on `code`.
    fn long_mode_report(rip: u64, code: &[u8]) -> CrashReport {
        let mut report = CrashReport {
            regs: Registers {
                rip,
                ..Default::default()
            },
            sregs: SpecialRegisters::default(),
            code: Some(code.to_vec()),
            recent_exits: vec![],
            hint: None,
            rip_named: None,
        };
        report.sregs.cr0 = 1;
        report.sregs.efer = 0x500;
        report.sregs.cs.l = 1;
        report
    }

    #[test]
    fn report_decodes_the_faulting_instruction() {
        let report = long_mode_report(0x1000, &[0xf3, 0x0f, 0xb8, 0xc0]);
        assert_eq!(report.bitness(), 64);
        assert_eq!(report.instruction().as_deref(), Some("popcnt eax,eax"));
        assert!(report.to_string().contains("f3 0f b8 c0"));
        let hint = emulator_hint(report.decoded().as_ref());
        assert!(
            hint.starts_with("the guest ran `popcnt eax,eax` (POPCNT), which"),
            "{hint}"
        );
        assert!(!hint.contains("clearcpuid"), "{hint}");
    }

    #[test]
    fn the_hint_for_a_vector_instruction_names_its_feature_and_clearcpuid() {
        // Linux 6.1's SSSE3 BLAKE2s, where the stock kernel stopped here.
        let report = long_mode_report(0xffffffff81088a2a, &[0x66, 0x44, 0x0f, 0x6e, 0xf9]);
        let hint = emulator_hint(report.decoded().as_ref());
        assert!(
            hint.starts_with("the guest ran `movd xmm15,ecx` (SSE2), which"),
            "{hint}"
        );
        assert!(hint.contains("clearcpuid="), "{hint}");
        assert!(hint.contains("SSE and its successors"), "{hint}");
        // Undecodable: the general hint alone.
        assert_eq!(emulator_hint(None), EMULATOR_HINT);
    }
}
