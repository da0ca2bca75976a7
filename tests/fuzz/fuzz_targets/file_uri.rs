//! [`FileUri`], the `file:` URI every path on the wire is written as.
//!
//! Invariants:
//! - no panic on any string;
//! - every accepted URI holds an absolute path with no NUL byte;
//! - `parse(to_uri_string(x)) == x` byte for byte (not just `Path` equality, which ignores
//!   repeated slashes), and the canonical text is a fixed point;
//! - the serde form (a JSON string) round-trips too;
//! - any absolute path without NUL, including non-UTF-8 names, survives `from_path` →
//!   `to_uri_string` → `parse` unchanged.
#![no_main]

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use libfuzzer_sys::fuzz_target;
use proto::FileUri;

fn bytes(uri: &FileUri) -> &[u8] {
    uri.as_path().as_os_str().as_bytes()
}

fn check_round_trip(uri: &FileUri) {
    assert!(uri.as_path().is_absolute());
    assert!(!bytes(uri).contains(&0));
    let text = uri.to_uri_string();
    assert!(
        text.starts_with("file:///"),
        "canonical form is file:///...: {text:?}"
    );
    assert!(text.is_ascii(), "canonical form is ASCII: {text:?}");
    let again = FileUri::parse(&text).expect("canonical text parses");
    assert_eq!(bytes(&again), bytes(uri), "round trip through {text:?}");
    assert_eq!(again.to_uri_string(), text);
    let json = serde_json::to_string(uri).expect("serializes");
    let back: FileUri = serde_json::from_str(&json).expect("serde form parses");
    assert_eq!(bytes(&back), bytes(uri));
}

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        if let Ok(uri) = FileUri::parse(text) {
            check_round_trip(&uri);
        }
    }
    // The same bytes as a native path, made absolute.
    let mut raw = b"/".to_vec();
    raw.extend_from_slice(data);
    match FileUri::from_path(Path::new(OsStr::from_bytes(&raw))) {
        Ok(uri) => {
            assert_eq!(bytes(&uri), &raw[..]);
            check_round_trip(&uri);
        }
        Err(_) => assert!(
            raw.contains(&0),
            "only NUL makes an absolute path unacceptable"
        ),
    }
});
