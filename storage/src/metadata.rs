//! The superblock's description of a trace: `key: value` lines, so old
//! traces stay readable when keys are added and `vtrace info` can print the
//! text as it is.

use crate::record::MAX_CPUS;

/// What a trace says about its guest and its clock.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TraceMetadata {
    /// What was booted, for people ("built-in demo OS: PVH ELF at ...").
    pub guest: String,
    /// The kernel image: a host path, or [`BUILTIN_DEMO`] for the demo OS.
    pub kernel: Option<String>,
    /// [`image_id`] of the kernel image's bytes, to tell whether symbols
    /// found later belong to the kernel that ran.
    pub kernel_id: Option<String>,
    /// The virtual clock, as `vtrace run --clock` spells it.
    pub clock: Option<String>,
    /// The vtrace that wrote the trace (`--version`'s text).
    pub vtrace_version: Option<String>,
    /// How the tracer named tasks: [`LINUX_TASKS`] where it followed a
    /// Linux kernel's tasks (the trace has task events from its start).
    pub tasks: Option<String>,
    /// The initramfs the guest booted: a host path, so the analyzer can
    /// find user programs in it.
    pub initrd: Option<String>,
    /// The kernel command line the guest booted with (on one line).
    pub cmdline: Option<String>,
    /// The peeping interval (`vtrace run --peep`), as given.
    pub peep: Option<String>,
    /// The sampled variables, in the order of every
    /// [`Event::Sample`](crate::Event::Sample)'s values, as
    /// [`SampleVariable::list_text`] writes them.
    pub samples: Option<String>,
    /// Whether samples carry the running pc (`--sample-pc`).
    pub sample_pc: bool,
    /// CPUs of the machine, where more than one (`vtrace run --cpus`):
    /// its records name their CPU ([`Event::Cpu`](crate::Event::Cpu)).
    pub cpus: Option<u32>,
    /// What ran the traced steps, where it was not stepping with the trap
    /// flag (`vtrace run --engine`): `bochs`. Traces without it were
    /// stepped.
    pub engine: Option<String>,
}

/// How a sampled variable's bytes are read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SampleType {
    /// An unsigned byte.
    U8,
    /// An unsigned 16-bit word, little-endian.
    U16,
    /// An unsigned 32-bit word, little-endian.
    U32,
    /// An unsigned 64-bit word, little-endian.
    U64,
    /// A signed 64-bit word, little-endian.
    I64,
}

impl SampleType {
    /// Every type, as `--sample NAME:TYPE` spells them.
    pub const ALL: [SampleType; 5] = [
        SampleType::U8,
        SampleType::U16,
        SampleType::U32,
        SampleType::U64,
        SampleType::I64,
    ];

    /// `u8`, `u16`, `u32`, `u64` or `i64`.
    pub fn name(self) -> &'static str {
        match self {
            SampleType::U8 => "u8",
            SampleType::U16 => "u16",
            SampleType::U32 => "u32",
            SampleType::U64 => "u64",
            SampleType::I64 => "i64",
        }
    }

    /// The type [`SampleType::name`] spells `text`.
    pub fn parse(text: &str) -> Option<SampleType> {
        SampleType::ALL.into_iter().find(|t| t.name() == text)
    }

    /// Bytes read.
    pub fn size(self) -> u8 {
        match self {
            SampleType::U8 => 1,
            SampleType::U16 => 2,
            SampleType::U32 => 4,
            SampleType::U64 | SampleType::I64 => 8,
        }
    }

    /// A sampled value (the bytes read, zero-extended) as a number.
    pub fn number(self, raw: u64) -> i128 {
        match self {
            SampleType::I64 => i128::from(raw as i64),
            _ => i128::from(raw),
        }
    }
}

/// A variable the peeper sampled.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SampleVariable {
    /// As the user named it: a symbol, or an address.
    pub name: String,
    /// How its bytes are read.
    pub kind: SampleType,
    /// Where it was read, guest-physical.
    pub address: u64,
}

impl SampleVariable {
    /// `NAME:TYPE@0xADDRESS, ...`.
    pub fn list_text(variables: &[SampleVariable]) -> String {
        let each: Vec<String> = variables
            .iter()
            .map(|v| format!("{}:{}@{:#x}", v.name, v.kind.name(), v.address))
            .collect();
        each.join(", ")
    }

    /// Reads [`SampleVariable::list_text`]'s text; `None` if it is not.
    pub fn parse_list(text: &str) -> Option<Vec<SampleVariable>> {
        text.split(", ")
            .filter(|t| !t.is_empty())
            .map(|t| {
                let (name, rest) = t.rsplit_once(':')?;
                let (kind, address) = rest.split_once('@')?;
                Some(SampleVariable {
                    name: name.to_string(),
                    kind: SampleType::parse(kind)?,
                    address: u64::from_str_radix(address.strip_prefix("0x")?, 16).ok()?,
                })
            })
            .collect()
    }
}

/// The `tasks` value of traces that follow a Linux kernel's tasks.
pub const LINUX_TASKS: &str = "linux";

/// The `kernel` value of traces of the embedded demo OS.
pub const BUILTIN_DEMO: &str = "builtin:demo";

/// [`TraceMetadata::kernel`] of the built-in demo OS in its SMP mode.
pub const BUILTIN_DEMO_SMP: &str = "builtin:demo-smp";

/// A short, stable fingerprint of an image (the first 16 hex digits of its
/// BLAKE3 hash). ELF build ids would do for Linux, but the demo OS and many
/// hand-built kernels have none, and this works for every format.
pub fn image_id(bytes: &[u8]) -> String {
    blake3::hash(bytes).to_hex()[..16].to_string()
}

impl TraceMetadata {
    /// The `key: value` lines the superblock holds.
    pub fn to_text(&self) -> String {
        let mut out = format!("guest: {}", self.guest);
        for (key, value) in [
            ("kernel", &self.kernel),
            ("kernel-id", &self.kernel_id),
            ("clock", &self.clock),
            ("vtrace", &self.vtrace_version),
            ("tasks", &self.tasks),
            ("initrd", &self.initrd),
            ("cmdline", &self.cmdline),
            ("peep", &self.peep),
            ("samples", &self.samples),
            ("engine", &self.engine),
        ] {
            if let Some(v) = value {
                out.push_str(&format!("\n{key}: {v}"));
            }
        }
        if self.sample_pc {
            out.push_str("\nsample-pc: yes");
        }
        if let Some(cpus) = self.cpus {
            out.push_str(&format!("\ncpus: {cpus}"));
        }
        out
    }

    /// Reads what it knows from `text`; unknown keys are ignored.
    pub fn parse(text: &str) -> TraceMetadata {
        let mut m = TraceMetadata::default();
        for line in text.lines() {
            let Some((key, value)) = line.split_once(": ") else {
                continue;
            };
            let value = value.trim().to_string();
            match key.trim() {
                "guest" => m.guest = value,
                "kernel" => m.kernel = Some(value),
                "kernel-id" => m.kernel_id = Some(value),
                "clock" => m.clock = Some(value),
                "vtrace" => m.vtrace_version = Some(value),
                "tasks" => m.tasks = Some(value),
                "initrd" => m.initrd = Some(value),
                "cmdline" => m.cmdline = Some(value),
                "peep" => m.peep = Some(value),
                "samples" => m.samples = Some(value),
                "sample-pc" => m.sample_pc = value == "yes",
                "cpus" => m.cpus = value.parse().ok(),
                "engine" => m.engine = Some(value),
                _ => {}
            }
        }
        m
    }

    /// CPUs of the machine the trace was taken on: 1 to [`MAX_CPUS`]
    /// whatever the metadata says (a crafted count would have analyses
    /// that take a pass per CPU take billions; see
    /// [`TraceMetadata::cpus_problem`]).
    pub fn cpu_count(&self) -> u32 {
        self.cpus.unwrap_or(1).clamp(1, MAX_CPUS)
    }

    /// What is wrong with the CPU count the metadata gives, in words for
    /// the user, where it is out of what a trace can hold.
    pub fn cpus_problem(&self) -> Option<String> {
        let claimed = self.cpus.filter(|n| !(1..=MAX_CPUS).contains(n))?;
        Some(format!(
            "the trace's metadata says {claimed} CPUs, which no trace holds (1 to {MAX_CPUS}): it \
             is read as a trace of {}",
            self.cpu_count()
        ))
    }

    /// Whether the trace names Linux tasks.
    pub fn names_tasks(&self) -> bool {
        self.tasks.as_deref() == Some(LINUX_TASKS)
    }

    /// The sampled variables, in the order of the samples' values (none
    /// where the trace has no samples or the text is not readable).
    pub fn sample_variables(&self) -> Vec<SampleVariable> {
        self.samples
            .as_deref()
            .and_then(SampleVariable::parse_list)
            .unwrap_or_default()
    }

    /// Virtual nanoseconds per traced step, when the clock advanced by a
    /// fixed amount per step (`steps` or `steps:NS`).
    pub fn ns_per_step(&self) -> Option<u64> {
        let clock = self.clock.as_deref()?;
        if clock == "steps" {
            return Some(1);
        }
        clock.strip_prefix("steps:")?.parse().ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_ignores_unknown_keys() {
        let m = TraceMetadata {
            guest: "built-in demo OS".into(),
            kernel: Some(BUILTIN_DEMO.into()),
            kernel_id: Some(image_id(b"abc")),
            clock: Some("steps:250".into()),
            vtrace_version: Some("0.1.0".into()),
            tasks: Some(LINUX_TASKS.into()),
            initrd: Some("/srv/guest/initrd.cpio".into()),
            cmdline: Some("console=ttyS0 panic=1".into()),
            peep: Some("100us".into()),
            samples: Some("ticks:u64@0x10a040, x:i64@0x8".into()),
            sample_pc: true,
            cpus: Some(4),
            engine: Some("bochs".into()),
        };
        let text = format!("{}\nfuture-key: x", m.to_text());
        assert_eq!(TraceMetadata::parse(&text), m);
        assert_eq!(m.ns_per_step(), Some(250));
        assert!(m.names_tasks());
        assert_eq!(
            m.sample_variables(),
            vec![
                SampleVariable {
                    name: "ticks".into(),
                    kind: SampleType::U64,
                    address: 0x10a040
                },
                SampleVariable {
                    name: "x".into(),
                    kind: SampleType::I64,
                    address: 8
                }
            ]
        );
        assert_eq!(
            SampleVariable::list_text(&m.sample_variables()),
            m.samples.clone().unwrap()
        );
        assert_eq!(SampleType::I64.number(u64::MAX), -1);
        assert_eq!(SampleType::U64.number(u64::MAX), i128::from(u64::MAX));
    }

    #[test]
    fn a_cpu_count_no_trace_holds_is_told_and_bounded() {
        let count = |text: &str| {
            let m = TraceMetadata::parse(text);
            (m.cpu_count(), m.cpus_problem().is_some())
        };
        assert_eq!(count(""), (1, false));
        assert_eq!(count("cpus: 4"), (4, false));
        assert_eq!(count("cpus: 256"), (256, false));
        assert_eq!(count("cpus: 257"), (256, true));
        assert_eq!(count("cpus: 4294967295"), (256, true));
        assert_eq!(count("cpus: 0"), (1, true));
    }

    #[test]
    fn old_traces_parse_with_what_they_have() {
        let m = TraceMetadata::parse("guest: demo\nclock: Steps(1)\nvtrace: 0.1.0");
        assert_eq!(m.guest, "demo");
        assert_eq!(m.kernel, None);
        assert_eq!(m.ns_per_step(), None);
    }
}
