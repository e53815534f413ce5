//! An initramfs as `vtrace analyze` reads it for user programs: plain and
//! compressed cpio archives one after the other.
#![no_main]

use std::collections::BTreeSet;

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let wanted: BTreeSet<String> = ["/init", "/bin/sh"].map(String::from).into();
    let _ = vtrace_image::initramfs::files_in(data, &wanted);
});
