//! The input as a trace disk file, for the targets that open one: one
//! file per fuzzing process, rewritten for each input, in memory
//! (/dev/shm) where there is one, for speed.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::LazyLock;

static PATH: LazyLock<PathBuf> = LazyLock::new(|| {
    let shm = Path::new("/dev/shm");
    let dir = if shm.is_dir() {
        shm.to_path_buf()
    } else {
        std::env::temp_dir()
    };
    dir.join(format!("vtrace-fuzz-{}.vtd", std::process::id()))
});

/// Writes `data` to this process's file; its path, or `None` if the host
/// refused the write.
pub fn write(data: &[u8]) -> Option<&'static Path> {
    let mut file = std::fs::File::create(&*PATH).ok()?;
    file.write_all(data).ok()?;
    Some(PATH.as_path())
}
