use std::ffi::OsStr;
use std::path::{Path, PathBuf};

use super::gate::denied_explicitly;
use super::notifier::{pathname, unix_address};
use super::*;

#[test]
fn a_pathname_address_is_told_from_abstract_and_unnamed_ones() {
    assert_eq!(
        pathname(&unix_address(b"/var/tmp/s")),
        Some(OsStr::new("/var/tmp/s"))
    );
    let mut abstract_address = unix_address(b"\0name");
    abstract_address.pop();
    assert_eq!(pathname(&abstract_address), None);
    assert_eq!(pathname(&(libc::AF_UNIX as u16).to_ne_bytes()), None);
    let mut inet = unix_address(b"/x");
    inet[..2].copy_from_slice(&(libc::AF_INET as u16).to_ne_bytes());
    assert_eq!(pathname(&inet), None);
    // No NUL at the end (a 108-byte path): the whole rest is the path.
    let mut full = (libc::AF_UNIX as u16).to_ne_bytes().to_vec();
    full.extend_from_slice(b"rel/sock");
    assert_eq!(pathname(&full), Some(OsStr::new("rel/sock")));
}

#[test]
fn a_hidden_or_denied_socket_is_denied_explicitly_and_an_uncovered_one_is_not() {
    use crate::policy::{Access, FilesystemPolicy, PathRule};
    let rules = vec![
        PathRule {
            path: PathBuf::from("/"),
            access: Access::Read,
        },
        PathRule {
            path: PathBuf::from("/srv/denied"),
            access: Access::Deny,
        },
    ];
    let policy = ResolvedPolicy::new(FilesystemPolicy::Restricted { rules }, false)
        .with_hidden_path(Path::new("/run/exec.sock"));
    assert!(denied_explicitly(&policy, Path::new("/srv/denied/a.sock")));
    assert!(denied_explicitly(&policy, Path::new("/run/exec.sock")));
    assert!(!denied_explicitly(&policy, Path::new("/srv/agent.sock")));
    let minimal = ResolvedPolicy::new(
        FilesystemPolicy::Restricted {
            rules: vec![PathRule {
                path: PathBuf::from("/usr"),
                access: Access::Read,
            }],
        },
        false,
    );
    assert!(!denied_explicitly(
        &minimal,
        Path::new("/run/user/1000/agent.sock")
    ));
}

#[test]
fn the_mechanism_is_landlock_from_abi_9() {
    assert_eq!(Mechanism::for_abi(7), Mechanism::SeccompNotify);
    assert_eq!(Mechanism::for_abi(8), Mechanism::SeccompNotify);
    assert_eq!(Mechanism::for_abi(9), Mechanism::Landlock);
}
