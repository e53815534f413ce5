//! A segment as the reader takes it: header, payload checks, and the
//! records of a payload.
#![no_main]

use libfuzzer_sys::fuzz_target;
use vtrace_storage::SegmentDecoder;
use vtrace_storage::{unseal, SegmentHeader, HEADER_LEN};

fuzz_target!(|data: &[u8]| {
    // The bytes as a raw payload: every record must decode or fail.
    for record in SegmentDecoder::new(data) {
        if record.is_err() {
            break;
        }
    }
    // The bytes as a sealed segment.
    if let Some(header) = SegmentHeader::decode(data) {
        let _ = unseal(&header, &data[HEADER_LEN.min(data.len())..]);
    }
});
