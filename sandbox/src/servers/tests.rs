#![allow(clippy::unwrap_used)]
use super::dirs::euid;
use super::dirs::other_users_dirs;
use super::entries::process_identity;
use super::read::{read_dirs, read_other_users};
use super::register::prune_dead;
use super::*;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};

#[test]
fn entries_are_read_and_hostile_paths_ignored() {
    let dir = tempfile::tempdir().unwrap();
    let reg = dir.path().join("servers");
    std::fs::DirBuilder::new().mode(0o700).create(&reg).unwrap();
    let entry = Entry {
        pid: 1,
        hidden: vec![
            PathBuf::from("/srv/a/token"),
            PathBuf::from("/"),
            PathBuf::from("relative"),
            PathBuf::from("/srv/../etc"),
        ],
        read_only: vec![PathBuf::from("/srv/a/bin")],
        tcp_ports: vec![7700, 4000, 4000],
        ..Entry::default()
    };
    std::fs::write(reg.join("1-1.json"), serde_json::to_vec(&entry).unwrap()).unwrap();
    std::fs::write(reg.join(".2-2.tmp"), "half").unwrap();
    let read = read_dirs(std::slice::from_ref(&reg), euid()).unwrap();
    assert_eq!(read.hidden, vec![PathBuf::from("/srv/a/token")]);
    assert_eq!(read.dirs, vec![reg.clone()]);
    assert_eq!(read.read_only, vec![PathBuf::from("/srv/a/bin")]);
    assert_eq!(read.tcp_ports, vec![4000, 7700]);
    std::fs::write(reg.join("3-3.json"), "{not json").unwrap();
    assert!(read_dirs(std::slice::from_ref(&reg), euid()).is_err());
}

#[test]
fn a_dead_servers_entry_is_not_applied_and_a_live_ones_is() {
    let dir = tempfile::tempdir().unwrap();
    let reg = dir.path().join("servers");
    std::fs::DirBuilder::new().mode(0o700).create(&reg).unwrap();
    let (start_time, pid_namespace) = process_identity(std::process::id()).unwrap();
    let live = Entry {
        pid: std::process::id(),
        start_time,
        pid_namespace,
        hidden: vec![PathBuf::from("/srv/live/token")],
        ..Entry::default()
    };
    let dead = Entry {
        start_time: start_time + 1,
        hidden: vec![PathBuf::from("/srv/dead/token")],
        ..live.clone()
    };
    for (name, entry) in [("live", &live), ("dead", &dead)] {
        let path = reg.join(format!("{name}.json"));
        std::fs::write(path, serde_json::to_vec(entry).unwrap()).unwrap();
    }
    let read = read_dirs(std::slice::from_ref(&reg), euid()).unwrap();
    assert_eq!(read.hidden, vec![PathBuf::from("/srv/live/token")]);
}

#[test]
fn entries_of_dead_servers_are_pruned_and_live_ones_kept() {
    let dir = tempfile::tempdir().unwrap();
    let reg = dir.path().join("servers");
    std::fs::DirBuilder::new().mode(0o700).create(&reg).unwrap();
    let (start_time, pid_namespace) = process_identity(std::process::id()).unwrap();
    let live = Entry {
        pid: std::process::id(),
        start_time,
        pid_namespace,
        ..Entry::default()
    };
    // A pid reused by another process (different start time) and a pid of another PID
    // namespace (not ours to judge).
    let reused = Entry {
        start_time: start_time + 1,
        ..live.clone()
    };
    let foreign = Entry {
        pid: 1,
        pid_namespace: pid_namespace + 1,
        ..live.clone()
    };
    for (name, entry) in [("live", &live), ("reused", &reused), ("foreign", &foreign)] {
        let path = reg.join(format!("{name}.json"));
        std::fs::write(path, serde_json::to_vec(entry).unwrap()).unwrap();
    }
    prune_dead(&reg);
    let mut left: Vec<String> = std::fs::read_dir(&reg)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    left.sort();
    assert_eq!(left, ["foreign.json", "live.json"]);
}

#[test]
fn a_directory_open_to_others_is_not_read() {
    let dir = tempfile::tempdir().unwrap();
    let reg = dir.path().join("servers");
    std::fs::create_dir(&reg).unwrap();
    std::fs::set_permissions(&reg, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::write(reg.join("1-1.json"), "{not json").unwrap();
    let read = read_dirs(std::slice::from_ref(&reg), euid()).unwrap();
    assert_eq!(read.hidden, Vec::<PathBuf>::new());
}

#[test]
fn an_entry_removed_after_the_listing_is_skipped_but_an_unreadable_one_fails() {
    use super::entries::read_entry;
    let dir = tempfile::tempdir().unwrap();
    // Listed, then removed by its exiting server before the open: nothing to apply.
    let gone = dir.path().join("4-4.json");
    assert!(matches!(read_entry(&gone, euid()), Ok(None)));
    // Still there but not openable as an entry (a symlink, O_NOFOLLOW): fails closed.
    let link = dir.path().join("5-5.json");
    std::os::unix::fs::symlink("/etc/hostname", &link).unwrap();
    assert!(read_entry(&link, euid()).is_err());
}

/// Another server's TCP ports are refused where the sandbox reaches the host's network (the
/// command, or the egress proxy for an allowlist), and change nothing with the network off (a
/// launcher is not rebuilt when an unrelated server starts).
#[test]
fn another_servers_ports_are_refused_only_where_the_network_is_on() {
    use crate::policy::{FilesystemPolicy, NetworkPolicy};
    let registered = Registered {
        tcp_ports: vec![4000, 7700],
        ..Registered::default()
    };
    let root = PathBuf::from("/");
    let filesystem = FilesystemPolicy::Restricted {
        rules: vec![crate::policy::PathRule {
            path: root,
            access: crate::policy::Access::Read,
        }],
    };
    let on = ResolvedPolicy::new(filesystem.clone(), NetworkPolicy::On);
    assert_eq!(registered.apply(on).denied_tcp_ports, vec![4000, 7700]);
    let rules = crate::policy::network::EgressRules::default();
    let allowlist = ResolvedPolicy::new(filesystem.clone(), NetworkPolicy::Allowlist(rules));
    assert_eq!(
        registered.apply(allowlist).denied_tcp_ports,
        vec![4000, 7700]
    );
    let off = ResolvedPolicy::new(filesystem, NetworkPolicy::Off);
    assert_eq!(registered.apply(off.clone()), off);
    // An entry naming more ports than any server listens on is not one a server wrote.
    let dir = tempfile::tempdir().unwrap();
    let reg = dir.path().join("servers");
    std::fs::DirBuilder::new().mode(0o700).create(&reg).unwrap();
    let entry = Entry {
        pid: 1,
        tcp_ports: (1..=MAX_ENTRY_PORTS as u16 + 1).collect(),
        ..Entry::default()
    };
    std::fs::write(reg.join("1-1.json"), serde_json::to_vec(&entry).unwrap()).unwrap();
    assert!(read_dirs(std::slice::from_ref(&reg), euid()).is_err());
}

/// Root reads every other uid's registry (their servers admit root without a token): their
/// ports, and only the paths that belong to them; an unreadable entry of theirs is skipped, not
/// fatal. (CI runs as root: the fixtures belong to uid 65534.)
#[test]
fn root_takes_other_users_ports_and_only_their_own_paths() {
    const NOBODY: u32 = 65534;
    let base = tempfile::tempdir().unwrap();
    let (run_user, shm) = (base.path().join("run-user"), base.path().join("shm"));
    let own = |path: &std::path::Path| {
        std::os::unix::fs::lchown(path, Some(NOBODY), Some(NOBODY))
            .expect("chown to 65534 (the unit tests run as root)");
    };
    let reg = run_user.join(NOBODY.to_string()).join("execward/servers");
    std::fs::DirBuilder::new()
        .mode(0o700)
        .recursive(true)
        .create(&reg)
        .unwrap();
    for dir in [
        reg.parent().unwrap().parent().unwrap(),
        reg.parent().unwrap(),
        &reg,
    ] {
        own(dir);
    }
    std::fs::create_dir_all(shm.join("execward-notanumber")).unwrap();
    let theirs = base.path().join("their-token");
    std::fs::write(&theirs, "t").unwrap();
    own(&theirs);
    let roots = base.path().join("roots-file");
    std::fs::write(&roots, "r").unwrap();
    let (start_time, pid_namespace) = process_identity(std::process::id()).unwrap();
    let entry = Entry {
        pid: std::process::id(),
        start_time,
        pid_namespace,
        hidden: vec![theirs.clone(), roots.clone()],
        read_only: vec![roots],
        tcp_ports: vec![5000],
    };
    let path = reg.join("1-1.json");
    std::fs::write(&path, serde_json::to_vec(&entry).unwrap()).unwrap();
    own(&path);
    let broken = reg.join("2-2.json");
    std::fs::write(&broken, "{not json").unwrap();
    own(&broken);
    let dirs = other_users_dirs(&run_user, &shm);
    assert_eq!(dirs, vec![(reg.clone(), NOBODY)]);
    let mut read = Registered::default();
    read_other_users(&mut read, &dirs);
    assert_eq!(read.tcp_ports, vec![5000]);
    assert_eq!(read.hidden, vec![theirs]);
    assert!(read.read_only.is_empty(), "{read:?}");
    assert_eq!(read.dirs, vec![reg]);
}
