//! The binary `process/output` frame decoder ([`OutputFrame::decode`]): what a client that asked
//! for binary output parses from the server (or from whatever sits on the path to it).
//!
//! Invariants:
//! - no panic on any bytes;
//! - an accepted frame has a known kind and stream, a non-empty UTF-8 process id and a
//!   non-empty chunk, and its parts account for every byte received;
//! - it re-encodes to exactly the bytes received.
#![no_main]

use libfuzzer_sys::fuzz_target;
use proto::methods::process::binary::{OUTPUT_FRAME_HEADER_BYTES, OUTPUT_FRAME_KIND, OutputFrame};

fuzz_target!(|data: &[u8]| {
    match OutputFrame::decode(data) {
        Ok(frame) => {
            assert_eq!(data[0], OUTPUT_FRAME_KIND);
            assert!(!frame.process_id.is_empty());
            assert!(!frame.data.is_empty());
            assert_eq!(
                OUTPUT_FRAME_HEADER_BYTES + frame.process_id.len() + frame.data.len(),
                data.len()
            );
            assert_eq!(frame.encode(), data);
        }
        Err(error) => assert!(!error.to_string().is_empty()),
    }
});
