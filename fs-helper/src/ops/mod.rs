//! The operations, one file per concern. Each public function documents its errors.

pub mod copy;
pub mod directory;
pub mod metadata;
pub mod read;
pub mod remove;
pub mod write;

use std::path::{Component, Path, PathBuf};

use crate::error::{FsError, FsOperation};

/// `path` rewritten so its last component is the entry's own name: a trailing `/` or `/.` is
/// dropped. Operations that must not follow a symlink in the last component need this, because
/// the kernel resolves `link/` to the link's target.
///
/// # Errors
/// [`FsError::InvalidPath`] if the path names no entry of a directory (empty, `/`, or ending in
/// `..`).
pub(crate) fn named_entry(op: FsOperation, path: &Path) -> Result<PathBuf, FsError> {
    match path.components().next_back() {
        Some(Component::Normal(_)) => Ok(path.components().collect()),
        _ => Err(FsError::InvalidPath {
            op,
            path: path.to_path_buf(),
            reason: "the path must end in the name of an entry (not empty, `/`, `.` or `..`)",
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::FsErrorKind;
    use pretty_assertions::assert_eq;

    #[test]
    fn named_entry_drops_trailing_slash_and_dot() {
        for (input, expected) in [
            ("/a/link/", "/a/link"),
            ("/a/link/.", "/a/link"),
            ("/a/./link//", "/a/link"),
            ("rel/x", "rel/x"),
        ] {
            assert_eq!(
                named_entry(FsOperation::Remove, Path::new(input)).unwrap(),
                PathBuf::from(expected)
            );
        }
    }

    #[test]
    fn named_entry_refuses_paths_without_a_name() {
        for input in ["", "/", "/a/..", ".", "./"] {
            let error = named_entry(FsOperation::Remove, Path::new(input)).unwrap_err();
            assert_eq!(error.kind(), FsErrorKind::InvalidInput, "{input:?}");
        }
    }
}
