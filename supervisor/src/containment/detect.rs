//! Where this process's cgroups are: the cgroup mounts from `/proc/self/mountinfo` and the
//! process's own paths from `/proc/self/cgroup`. Pure parsing; the caller reads the files.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The directories of this process's own cgroups.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CgroupLocations {
    /// Its cgroup in the unified (v2) hierarchy.
    pub v2: Option<PathBuf>,
    /// Its cgroup in each v1 hierarchy, by controller (`memory`, `pids`, ...).
    pub v1: BTreeMap<String, PathBuf>,
}

/// A cgroup filesystem mount.
#[derive(Debug, Clone, PartialEq, Eq)]
struct CgroupMount {
    /// Where it is mounted.
    mount_point: PathBuf,
    /// The hierarchy path mounted there (`/` unless a subtree was bind-mounted).
    root: String,
    /// `None` for cgroup2, else the v1 controllers (and `name=...`) of the hierarchy.
    controllers: Option<Vec<String>>,
}

/// Undo mountinfo's octal escapes (`\040` for a space).
fn unescape(field: &str) -> String {
    String::from_utf8_lossy(&sandbox::linux::mounts::mountinfo::unescape(field)).into_owned()
}

fn cgroup_mounts(mountinfo: &str) -> Vec<CgroupMount> {
    let mut mounts = Vec::new();
    for line in mountinfo.lines() {
        let Some((before, after)) = line.split_once(" - ") else {
            continue;
        };
        let fields: Vec<&str> = before.split(' ').collect();
        let tail: Vec<&str> = after.split(' ').collect();
        let (Some(root), Some(mount_point), Some(fstype)) =
            (fields.get(3), fields.get(4), tail.first())
        else {
            continue;
        };
        let controllers = match *fstype {
            "cgroup2" => None,
            "cgroup" => Some(
                tail.get(2)
                    .map(|options| options.split(',').map(str::to_owned).collect())
                    .unwrap_or_default(),
            ),
            _ => continue,
        };
        mounts.push(CgroupMount {
            mount_point: PathBuf::from(unescape(mount_point)),
            root: unescape(root),
            controllers,
        });
    }
    mounts
}

/// `mount_point` + (`path` relative to the mounted `root`).
fn directory(mount: &CgroupMount, path: &str) -> PathBuf {
    let relative = Path::new(path)
        .strip_prefix(&mount.root)
        .unwrap_or_else(|_| Path::new(path.trim_start_matches('/')));
    let relative = relative.strip_prefix("/").unwrap_or(relative);
    mount.mount_point.join(relative)
}

/// Find this process's cgroup directories from the two files' contents.
pub fn locate(mountinfo: &str, proc_self_cgroup: &str) -> CgroupLocations {
    let mounts = cgroup_mounts(mountinfo);
    let mut found = CgroupLocations::default();
    for line in proc_self_cgroup.lines() {
        let mut parts = line.splitn(3, ':');
        let (Some(id), Some(controllers), Some(path)) = (parts.next(), parts.next(), parts.next())
        else {
            continue;
        };
        if id == "0" && controllers.is_empty() {
            if let Some(mount) = mounts.iter().find(|m| m.controllers.is_none()) {
                found.v2 = Some(directory(mount, path));
            }
            continue;
        }
        for controller in controllers.split(',').filter(|c| !c.is_empty()) {
            let mount = mounts.iter().find(|m| {
                m.controllers
                    .as_ref()
                    .is_some_and(|list| list.iter().any(|c| c == controller))
            });
            if let Some(mount) = mount {
                found
                    .v1
                    .entry(controller.to_owned())
                    .or_insert_with(|| directory(mount, path));
            }
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;

    /// This machine's layout: v1 controllers beside an empty v2 hierarchy.
    const HYBRID_MOUNTINFO: &str = "\
25 1 0:23 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
26 25 0:24 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
27 25 0:25 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
28 25 0:26 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
29 25 0:27 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,name=systemd
30 25 0:28 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
";
    const HYBRID_CGROUP: &str = "\
9:name=systemd:/
8:pids:/
4:memory:/process_api/ca88
1:cpu:/
0::/
";

    #[test]
    fn hybrid_hosts_give_v2_and_v1_directories() {
        let found = locate(HYBRID_MOUNTINFO, HYBRID_CGROUP);
        assert_eq!(found.v2, Some(PathBuf::from("/sys/fs/cgroup/unified")));
        assert_eq!(
            found.v1.get("memory"),
            Some(&PathBuf::from("/sys/fs/cgroup/memory/process_api/ca88"))
        );
        assert_eq!(
            found.v1.get("pids"),
            Some(&PathBuf::from("/sys/fs/cgroup/pids"))
        );
        assert_eq!(
            found.v1.get("cpu"),
            Some(&PathBuf::from("/sys/fs/cgroup/cpu"))
        );
    }

    #[test]
    fn pure_v2_hosts_give_the_service_cgroup() {
        let mountinfo = "35 24 0:30 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n";
        let cgroup = "0::/user.slice/user-1000.slice/user@1000.service/app.slice/x.scope\n";
        let found = locate(mountinfo, cgroup);
        assert_eq!(
            found.v2,
            Some(PathBuf::from(
                "/sys/fs/cgroup/user.slice/user-1000.slice/user@1000.service/app.slice/x.scope"
            ))
        );
        assert!(found.v1.is_empty());
    }

    #[test]
    fn a_bind_mounted_subtree_is_joined_relative_to_its_root() {
        let mountinfo = "40 30 0:30 /docker/abc /sys/fs/cgroup ro - cgroup2 cgroup2 rw\n";
        let found = locate(mountinfo, "0::/docker/abc/inner\n");
        assert_eq!(found.v2, Some(PathBuf::from("/sys/fs/cgroup/inner")));
        assert_eq!(unescape(r"/a\040b"), "/a b");
    }

    #[test]
    fn no_cgroup_mounts_give_nothing() {
        assert_eq!(locate("", "0::/\n"), CgroupLocations::default());
    }
}
