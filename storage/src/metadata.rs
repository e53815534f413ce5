//! The superblock's description of a trace: `key: value` lines, so old
//! traces stay readable when keys are added and `vtrace info` can print the
//! text as it is.

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
    pub vtrace_version: Option<String>,
    /// How the tracer named tasks: [`LINUX_TASKS`] where it followed a
    /// Linux kernel's tasks (the trace has task events from its start).
    pub tasks: Option<String>,
    /// The initramfs the guest booted: a host path, so the analyzer can
    /// find user programs in it.
    pub initrd: Option<String>,
}

/// The `tasks` value of traces that follow a Linux kernel's tasks.
pub const LINUX_TASKS: &str = "linux";

/// The `kernel` value of traces of the embedded demo OS.
pub const BUILTIN_DEMO: &str = "builtin:demo";

/// A short, stable fingerprint of an image (the first 16 hex digits of its
/// BLAKE3 hash). ELF build ids would do for Linux, but the demo OS and many
/// hand-built kernels have none, and this works for every format.
pub fn image_id(bytes: &[u8]) -> String {
    blake3::hash(bytes).to_hex()[..16].to_string()
}

impl TraceMetadata {
    pub fn to_text(&self) -> String {
        let mut out = format!("guest: {}", self.guest);
        for (key, value) in [
            ("kernel", &self.kernel),
            ("kernel-id", &self.kernel_id),
            ("clock", &self.clock),
            ("vtrace", &self.vtrace_version),
            ("tasks", &self.tasks),
            ("initrd", &self.initrd),
        ] {
            if let Some(v) = value {
                out.push_str(&format!("\n{key}: {v}"));
            }
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
                _ => {}
            }
        }
        m
    }

    /// Whether the trace names Linux tasks.
    pub fn names_tasks(&self) -> bool {
        self.tasks.as_deref() == Some(LINUX_TASKS)
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
        };
        let text = format!("{}\nfuture-key: x", m.to_text());
        assert_eq!(TraceMetadata::parse(&text), m);
        assert_eq!(m.ns_per_step(), Some(250));
        assert!(m.names_tasks());
    }

    #[test]
    fn old_traces_parse_with_what_they_have() {
        let m = TraceMetadata::parse("guest: demo\nclock: Steps(1)\nvtrace: 0.1.0");
        assert_eq!(m.guest, "demo");
        assert_eq!(m.kernel, None);
        assert_eq!(m.ns_per_step(), None);
    }
}
