//! What a trace says of the run that wrote it: the guest, the kernel and
//! initrd it booted (so `vtrace analyze` finds their symbols), and Linux's
//! task layout where the tracer follows tasks.

use std::path::Path;

use vtrace_image::linux_tasks::task_layout;
use vtrace_storage::TaskLayout;
use vtrace_storage::{image_id, TraceMetadata, BUILTIN_DEMO, BUILTIN_DEMO_SMP};
use vtrace_vmm::BootSource;

/// The metadata of a trace of `guest` booted from `boot`, written by
/// vtrace `version`: which kernel and initrd ran. The caller adds what the
/// run itself decides (clock, tasks, peeping).
pub fn for_boot(guest: &str, boot: &BootSource, version: &str) -> TraceMetadata {
    let (image, initrd, cmdline) = match boot {
        BootSource::Kernel {
            kernel,
            initrd,
            cmdline,
        } => (kernel, initrd.as_ref(), cmdline.as_str()),
        BootSource::RealMode { image, .. } => (image, None, ""),
    };
    // One line of it, and no more than the superblock has room for.
    let cmdline: String = cmdline
        .chars()
        .take(1024)
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    TraceMetadata {
        guest: guest.to_string(),
        kernel: Some(match &image.path {
            Some(path) => absolute(path),
            None if *image.bytes == *vtrace_demo::DEMO_OS_SMP_ELF => BUILTIN_DEMO_SMP.to_string(),
            None => BUILTIN_DEMO.to_string(),
        }),
        kernel_id: Some(image_id(&image.bytes)),
        initrd: initrd.map(|i| absolute(&i.path)),
        cmdline: Some(cmdline).filter(|c| !c.trim().is_empty()),
        vtrace_version: Some(version.to_string()),
        ..TraceMetadata::default()
    }
}

/// `path` made absolute where it can be, so a trace analyzed from another
/// directory still finds the file.
fn absolute(path: &Path) -> String {
    std::fs::canonicalize(path)
        .unwrap_or_else(|_| path.to_path_buf())
        .display()
        .to_string()
}

/// Where a Linux guest keeps its running task, so the trace names tasks;
/// for a bzImage kernel only. What the user should know goes to `notes`.
pub(crate) fn linux_tasks(boot: &BootSource, notes: &mut Vec<String>) -> Option<TaskLayout> {
    let BootSource::Kernel { kernel, .. } = boot else {
        return None;
    };
    let vmlinux = vtrace_image::bzimage::vmlinux_inside(&kernel.bytes)?;
    match task_layout(&vmlinux) {
        Ok(layout) => {
            if layout.maps.is_none() {
                notes.push(
                    "vtrace: memory maps of Linux processes are not recorded: the kernel \
                     keeps them in a form vtrace does not read (before 6.1) or its BTF lacks \
                     a field; user code is named by address only"
                        .to_string(),
                );
            }
            Some(layout)
        }
        Err(why) => {
            notes.push(format!(
                "vtrace: Linux tasks are not followed: {why}; the trace names address \
                 spaces only"
            ));
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vtrace_vmm::Image;

    #[test]
    fn the_demo_is_named_builtin_and_identified_by_its_bytes() {
        let boot = BootSource::Kernel {
            kernel: Image::embedded("built-in demo OS", vtrace_demo::DEMO_OS_ELF),
            initrd: None,
            cmdline: String::new(),
        };
        let m = for_boot("demo", &boot, "test");
        assert_eq!(m.kernel.as_deref(), Some(BUILTIN_DEMO));
        assert_eq!(m.kernel_id, Some(image_id(vtrace_demo::DEMO_OS_ELF)));
        assert_eq!(m.initrd, None);
        assert_eq!(m.vtrace_version.as_deref(), Some("test"));
        // Nothing the run decides is guessed here.
        assert_eq!((m.clock, m.tasks, m.peep), (None, None, None));
    }
}
