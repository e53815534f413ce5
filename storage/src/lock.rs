//! One writer per trace disk: the writer holds an exclusive `flock` on the
//! disk for as long as it writes, and whoever else opens it can tell.
//!
//! `flock` rather than `fcntl` record locks: a record lock belongs to the
//! process and goes when any of its descriptors of the file is closed (a
//! reader in the same process would drop the writer's lock); a `flock`
//! belongs to the open file and lasts until the writer ends, however it
//! ends. Linux says who holds one in /proc/locks, which is how a refused
//! run names the run it would have destroyed.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::fs::MetadataExt;

/// Takes the exclusive lock on `file` without waiting; false if another
/// open file holds a lock on it.
pub(crate) fn try_exclusive(file: &File) -> std::io::Result<bool> {
    try_flock(file, libc::LOCK_EX)
}

/// Whether another open file holds the exclusive lock on `file` now (a
/// writer is writing it). Takes nothing: a shared lock, taken to ask, is
/// given back at once, so a reader never keeps a writer out.
pub(crate) fn written_now(file: &File) -> bool {
    match try_flock(file, libc::LOCK_SH) {
        Ok(true) => {
            // SAFETY: flock on an open descriptor this function borrows.
            unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_UN) };
            false
        }
        Ok(false) => true,
        Err(_) => false,
    }
}

fn try_flock(file: &File, kind: libc::c_int) -> std::io::Result<bool> {
    // SAFETY: flock on an open descriptor this function borrows.
    let rc = unsafe { libc::flock(file.as_raw_fd(), kind | libc::LOCK_NB) };
    if rc == 0 {
        return Ok(true);
    }
    let e = std::io::Error::last_os_error();
    match e.raw_os_error() {
        Some(libc::EWOULDBLOCK) => Ok(false),
        _ => Err(e),
    }
}

/// Who holds the lock on `file`, for a message: "pid 1234 (vtrace run
/// --trace ...)", or "a process this one cannot see" where /proc/locks
/// does not name it (another PID namespace, /proc not mounted).
pub(crate) fn holder(file: &File) -> String {
    let pid = file.metadata().ok().and_then(|m| {
        let locks = std::fs::read_to_string("/proc/locks").ok()?;
        flock_holder(&locks, m.dev(), m.ino())
    });
    match pid {
        Some(pid) => {
            let command = std::fs::read(format!("/proc/{pid}/cmdline"))
                .map(|c| printable_command(&c))
                .unwrap_or_default();
            if command.is_empty() {
                format!("pid {pid}")
            } else {
                format!("pid {pid}: {command}")
            }
        }
        None => "a process this one cannot see".to_string(),
    }
}

/// The pid /proc/locks gives for a FLOCK on the file with device `dev`
/// and inode `ino`. Its lines read `1: FLOCK  ADVISORY  WRITE 1234
/// 08:01:5678 0 EOF` (the device as major:minor in hex); a waiter's line,
/// marked `->`, names no holder.
fn flock_holder(locks: &str, dev: u64, ino: u64) -> Option<u32> {
    // glibc's major() and minor(), which the kernel prints.
    let major = ((dev >> 8) & 0xfff) | ((dev >> 32) & !0xfff);
    let minor = (dev & 0xff) | ((dev >> 12) & !0xff);
    let file = format!("{major:02x}:{minor:02x}:{ino}");
    locks.lines().find_map(|line| {
        let fields: Vec<&str> = line.split_whitespace().collect();
        if fields.get(1) != Some(&"FLOCK") || fields.get(5) != Some(&file.as_str()) {
            return None;
        }
        fields.get(4)?.parse().ok()
    })
}

/// A process's command line as /proc gives it (NUL-separated), on one
/// line, without control characters, at most 200 characters.
fn printable_command(raw: &[u8]) -> String {
    let text = String::from_utf8_lossy(raw);
    let words: Vec<&str> = text.split('\0').filter(|w| !w.is_empty()).collect();
    let line: String = words
        .join(" ")
        .chars()
        .map(|c| if c.is_control() { '?' } else { c })
        .collect();
    match line.char_indices().nth(200) {
        Some((at, _)) => format!("{}...", &line[..at]),
        None => line,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_holder_is_the_flock_on_that_file() {
        let locks = "1: POSIX  ADVISORY  WRITE 11 08:01:77 0 EOF\n\
                     2: FLOCK  ADVISORY  WRITE 22 08:02:77 0 EOF\n\
                     2: -> FLOCK  ADVISORY  WRITE 33 08:01:77 0 EOF\n\
                     3: FLOCK  ADVISORY  WRITE 44 08:01:77 0 EOF\n";
        // st_dev 0x801: major 8, minor 1.
        assert_eq!(flock_holder(locks, 0x801, 77), Some(44));
        assert_eq!(flock_holder(locks, 0x801, 78), None);
        // A device number past 8 bits of minor: major 0x103, minor 0x1234.
        let wide = (0x103u64 << 8) | (0x1234 & 0xff) | ((0x1234 & !0xff) << 12);
        let line = "1: FLOCK  ADVISORY  WRITE 55 103:1234:9 0 EOF";
        assert_eq!(flock_holder(line, wide, 9), Some(55));
    }

    #[test]
    fn a_command_line_is_shown_on_one_safe_line() {
        assert_eq!(
            printable_command(b"vtrace\0run\0--disk\0a\x1b[2Jb\0"),
            "vtrace run --disk a?[2Jb"
        );
        assert!(printable_command(&[b'x'; 500]).ends_with("..."));
    }

    #[test]
    fn a_writer_keeps_a_second_writer_out_and_readers_can_tell() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t");
        std::fs::write(&path, b"x").unwrap();
        let writer = File::open(&path).unwrap();
        let other = File::open(&path).unwrap();
        assert!(!written_now(&other));
        assert!(try_exclusive(&writer).unwrap());
        assert!(!try_exclusive(&other).unwrap(), "one writer");
        assert!(written_now(&other));
        assert!(holder(&other).starts_with(&format!("pid {}", std::process::id())));
        drop(writer);
        assert!(!written_now(&other));
        assert!(try_exclusive(&other).unwrap());
    }
}
