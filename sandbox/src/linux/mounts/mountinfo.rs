//! Mount points as `/proc/self/mountinfo` lists them.

use std::ffi::OsString;
use std::io;
use std::os::unix::ffi::OsStringExt;
use std::path::{Path, PathBuf};

/// The mount points strictly below `dir` in the caller's mount namespace, relative to `dir`, in
/// the order the kernel lists them (a parent before what is mounted inside it), each once (a
/// place mounted on twice is listed twice by the kernel).
///
/// # Errors
/// Reading `/proc/self/mountinfo`.
pub fn mount_points_below(dir: &Path) -> io::Result<Vec<PathBuf>> {
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo")?;
    Ok(points_below(&mountinfo, dir))
}

/// [`mount_points_below`] over the text of a mountinfo file.
fn points_below(mountinfo: &str, dir: &Path) -> Vec<PathBuf> {
    let mut seen = std::collections::HashSet::new();
    mountinfo
        .lines()
        .filter_map(|line| line.split(' ').nth(4))
        .map(|field| PathBuf::from(OsString::from_vec(unescape(field))))
        .filter_map(|point| {
            let relative = point.strip_prefix(dir).ok()?;
            (!relative.as_os_str().is_empty()).then(|| relative.to_owned())
        })
        .filter(|relative| seen.insert(relative.clone()))
        .collect()
}

/// Undoes mountinfo's octal escapes (`\040` for a space, `\011`, `\012`, `\134`). A backslash
/// not followed by three octal digits, or by a value above 255, is kept as it is.
pub fn unescape(field: &str) -> Vec<u8> {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut rest = bytes;
    while let Some((&first, tail)) = rest.split_first() {
        let escaped = match tail {
            [a @ b'0'..=b'7', b @ b'0'..=b'7', c @ b'0'..=b'7', ..] if first == b'\\' => {
                u8::try_from(
                    (u32::from(a - b'0') << 6) | (u32::from(b - b'0') << 3) | u32::from(c - b'0'),
                )
                .ok()
            }
            _ => None,
        };
        match escaped {
            Some(value) => {
                out.push(value);
                rest = &tail[3..];
            }
            None => {
                out.push(first);
                rest = tail;
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const MOUNTINFO: &str = "\
27 1 254:0 / / rw,relatime - ext4 /dev/vda rw
43 27 0:39 / /tmp/ws rw,relatime - tmpfs tmpfs rw
44 43 0:40 / /tmp/ws/read\\040only ro,relatime - tmpfs tmpfs ro
45 27 0:41 / /tmp/wsx rw,relatime - tmpfs tmpfs rw
46 43 0:42 / /tmp/ws/a/b rw,relatime - tmpfs tmpfs rw
47 43 0:43 / /tmp/ws/read\\040only ro,relatime - tmpfs tmpfs ro
";

    #[test]
    fn only_mount_points_strictly_below_the_directory_relative_to_it() {
        assert_eq!(
            points_below(MOUNTINFO, Path::new("/tmp/ws")),
            vec![PathBuf::from("read only"), PathBuf::from("a/b")]
        );
        assert_eq!(
            points_below(MOUNTINFO, Path::new("/tmp")).len(),
            4,
            "every mount under /tmp, sibling prefixes included as their own components"
        );
        assert!(points_below(MOUNTINFO, Path::new("/var")).is_empty());
    }

    #[test]
    fn escapes_are_undone_and_anything_else_is_kept() {
        assert_eq!(unescape("a\\040b\\011c\\012d\\134e"), b"a b\tc\nd\\e");
        assert_eq!(unescape("\\04"), b"\\04", "too short");
        assert_eq!(unescape("\\089"), b"\\089", "not octal");
        assert_eq!(unescape("\\777"), b"\\777", "above 255");
        assert_eq!(unescape("tail\\"), b"tail\\");
    }
}
