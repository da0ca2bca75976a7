//! Helpers shared by the unit tests.

use std::ffi::OsString;
use std::os::unix::ffi::OsStringExt;
use std::path::{Path, PathBuf};

use nix::sys::stat::Mode;
use nix::unistd::mkfifo;

/// A file name that is not valid UTF-8 (Latin-1 "café" plus a lone continuation byte).
pub(crate) fn non_utf8_name() -> OsString {
    OsString::from_vec(b"caf\xe9-\x80".to_vec())
}

/// Creates a FIFO named `name` in `dir` and returns its path.
pub(crate) fn make_fifo(dir: &Path, name: &str) -> PathBuf {
    let path = dir.join(name);
    mkfifo(&path, Mode::from_bits_truncate(0o644)).unwrap();
    path
}

/// The names in `dir`, sorted, so tests can assert nothing stray was left behind.
pub(crate) fn entry_names(dir: &Path) -> Vec<OsString> {
    let mut names: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|entry| entry.unwrap().file_name())
        .collect();
    names.sort();
    names
}
