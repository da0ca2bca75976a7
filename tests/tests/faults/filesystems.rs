//! Full and read-only filesystems.

use super::*;

/// A tmpfs of `size` mounted on a fresh directory under /tmp; unmounted (lazily, so a busy
/// mount never survives the test) and removed on drop.
struct Tmpfs {
    dir: tempfile::TempDir,
}

impl Tmpfs {
    fn mount(size: &str) -> Tmpfs {
        Tmpfs::mount_in(Path::new("/tmp"), size)
    }

    /// Mounted `noatime`: a neighbour reading it (another test's sandbox scanning /tmp) takes
    /// no write reference for an access time, which would make a read-only remount `EBUSY`.
    fn mount_in(parent: &Path, size: &str) -> Tmpfs {
        require_root("mounting a tmpfs");
        let dir = tempfile::Builder::new()
            .prefix("ew-tmpfs-")
            .tempdir_in(parent)
            .unwrap();
        let options = format!("size={size},mode=0755");
        nix::mount::mount(
            Some("tmpfs"),
            dir.path(),
            Some("tmpfs"),
            nix::mount::MsFlags::MS_NOATIME,
            Some(options.as_str()),
        )
        .unwrap_or_else(|e| panic!("mount -t tmpfs -o {options} on {:?}: {e}", dir.path()));
        Tmpfs { dir }
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    /// Remounts read-only. `EBUSY` (a write reference held for a moment by someone passing
    /// through) is retried for up to [`DEADLINE`].
    fn remount_read_only(&self) {
        use nix::mount::MsFlags;
        let started = Instant::now();
        loop {
            let result = nix::mount::mount(
                None::<&str>,
                self.path(),
                None::<&str>,
                MsFlags::MS_REMOUNT | MsFlags::MS_RDONLY | MsFlags::MS_NOATIME,
                None::<&str>,
            );
            match result {
                Err(nix::errno::Errno::EBUSY) if started.elapsed() < DEADLINE => {
                    std::thread::sleep(Duration::from_millis(20));
                }
                result => {
                    result.unwrap_or_else(|e| panic!("mount -o remount,ro {:?}: {e}", self.path()));
                    return;
                }
            }
        }
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = nix::mount::umount2(self.path(), nix::mount::MntFlags::MNT_DETACH);
    }
}

/// The error must be an I/O failure naming the operation, the path and ENOSPC.
#[track_caller]
fn assert_disk_full(result: Result<Value, RpcError>, path: &Path, what: &str) {
    let error = match result {
        Ok(value) => panic!("{what}: a write larger than the filesystem succeeded: {value}"),
        Err(error) => error,
    };
    assert_eq!(
        (error.code, error_kind(&error).as_str()),
        (-32603, "io"),
        "{what}: {error:?}"
    );
    assert!(
        error.message.contains("No space left on device"),
        "{what}: the message must name the cause: {error:?}"
    );
    let data = error.data.clone().expect("fs errors carry data");
    assert_eq!(data.operation.as_deref(), Some("fs/writeFile"), "{what}");
    assert_eq!(data.path, Some(file_uri(path)), "{what}");
}

#[tokio::test]
async fn disk_full_during_write_file_is_a_clear_error_and_atomic_writes_keep_the_old_file() {
    let disk = Tmpfs::mount("1m");
    let server = ExecServer::start(&[]);
    let mut client = server.client().await;
    let old = vec![b'o'; 100 * 1024];
    let too_big = vec![b'n'; 2 * 1024 * 1024];
    for (how, sandbox) in [
        ("unsandboxed", Value::Null),
        ("sandboxed", write_policy(disk.path())),
    ] {
        let target = disk.path().join(format!("{how}.bin"));
        std::fs::write(&target, &old).unwrap();
        // Atomic: the temporary file fills the disk, the write fails, the target is untouched
        // and the temporary file is gone.
        let r = write_file(&mut client, &target, &too_big, true, sandbox.clone()).await;
        assert_disk_full(r, &target, &format!("{how} atomic"));
        assert_eq!(
            std::fs::read(&target).unwrap(),
            old,
            "{how} atomic: target changed"
        );
        assert!(
            !names(disk.path())
                .iter()
                .any(|n| n.starts_with(ATOMIC_TEMP_PREFIX)),
            "{how}: temporary file left behind: {:?}",
            names(disk.path())
        );
        // In place: the same clear error; the file holds what fit (that is what non-atomic means).
        let r = write_file(&mut client, &target, &too_big, false, sandbox.clone()).await;
        assert_disk_full(r, &target, &format!("{how} in place"));
        let partial = std::fs::metadata(&target).unwrap().len();
        assert!(partial < too_big.len() as u64, "{how}: {partial} bytes");
        // Space freed: writes work again.
        std::fs::remove_file(&target).unwrap();
        write_file(&mut client, &target, &old, true, sandbox.clone())
            .await
            .unwrap_or_else(|e| panic!("{how}: write after freeing space: {e:?}"));
        assert_eq!(std::fs::read(&target).unwrap(), old);
        std::fs::remove_file(&target).unwrap();
    }
    // A process that fills the disk gets ENOSPC itself; the server is unaffected.
    let out = client
        .run(
            "fill",
            &sh("head -c 2000000 /dev/zero > big; echo status $?"),
            json!({"cwd": file_uri(disk.path())}),
        )
        .await;
    assert!(out.stdout_text().starts_with("status 1"), "{out:?}");
    client
        .call(
            "fs/remove",
            json!({"path": file_uri(disk.path().join("big"))}),
        )
        .await;
}

#[tokio::test]
async fn read_only_filesystem_refuses_every_write_by_name_and_still_reads() {
    let disk = Tmpfs::mount("1m");
    let file = disk.path().join("kept.txt");
    std::fs::write(&file, b"kept").unwrap();
    std::fs::create_dir(disk.path().join("sub")).unwrap();
    disk.remount_read_only();
    let server = ExecServer::start(&[]);
    let mut client = server.client().await;
    let uri = |name: &str| file_uri(disk.path().join(name));
    let attempts = [
        (
            "fs/writeFile",
            json!({"path": uri("kept.txt"), "dataBase64": b64("x")}),
        ),
        (
            "fs/writeFile",
            json!({"path": uri("kept.txt"), "dataBase64": b64("x"), "atomic": true}),
        ),
        (
            "fs/writeFile",
            json!({"path": uri("new.txt"), "dataBase64": b64("x")}),
        ),
        ("fs/createDirectory", json!({"path": uri("dir")})),
        ("fs/remove", json!({"path": uri("kept.txt")})),
        ("fs/remove", json!({"path": uri("sub")})),
        (
            "fs/copy",
            json!({"sourcePath": uri("kept.txt"), "destinationPath": uri("copy.txt")}),
        ),
    ];
    for (how, sandbox) in [
        ("unsandboxed", Value::Null),
        ("sandboxed", write_policy(disk.path())),
    ] {
        for (method, params) in &attempts {
            let mut params = params.clone();
            params["sandbox"] = sandbox.clone();
            let r = client.request(method, params.clone()).await;
            let error = match r {
                Ok(value) => panic!("{how} {method} {params} succeeded: {value}"),
                Err(error) => error,
            };
            // Unsandboxed EROFS is permissionDenied. Inside the sandbox read-only bind mounts
            // are how denials look, so the helper reports sandboxDenied: either way -32600
            // with the OS text.
            let kind = error_kind(&error);
            assert!(
                error.code == -32600
                    && (kind == "permissionDenied"
                        || (how == "sandboxed" && kind == "sandboxDenied")),
                "{how} {method}: {error:?}"
            );
            assert!(
                tests::error_text(&error).contains("Read-only file system"),
                "{how} {method}: the message must name the cause: {error:?}"
            );
        }
        let read = client
            .call(
                "fs/readFile",
                json!({"path": uri("kept.txt"), "sandbox": sandbox}),
            )
            .await;
        assert_eq!(unb64(read["dataBase64"].as_str().unwrap()), b"kept");
    }
    assert_eq!(names(disk.path()), vec!["kept.txt", "sub"]);
    assert_eq!(std::fs::read(&file).unwrap(), b"kept");
}

/// A writable root holding a writable mount and one the host made read-only (as another test's
/// read-only tmpfs under /tmp is for every workspace there): the command writes into the
/// writable one, never into the read-only one, through the pooled fs helper and a process,
/// with both launch modes, whether the root is /tmp (the profile's) or the workspace itself.
#[tokio::test]
async fn a_read_only_mount_inside_a_writable_root_leaves_the_mounts_beside_it_writable() {
    for parent in ["/tmp", "/var/tmp"] {
        let workspace = tempfile::Builder::new()
            .prefix("ew-faults-")
            .tempdir_in(parent)
            .unwrap();
        let writable = Tmpfs::mount_in(workspace.path(), "1m");
        let read_only = Tmpfs::mount_in(workspace.path(), "1m");
        read_only.remount_read_only();
        let sandbox = write_policy(workspace.path());
        // `--explain` says what the command will see at /tmp, here with mounts inside it (in
        // the /var/tmp round only another test's mounts would be there).
        if parent == "/tmp" {
            assert_explained_tmp(workspace.path());
        }
        for (mode, flags) in tests::matrix::launch_modes() {
            let what = format!("{parent}, {mode}");
            let server = ExecServer::start(flags);
            let mut client = server.client().await;
            let name = format!("helper-{mode}");
            write_file(
                &mut client,
                &writable.path().join(&name),
                b"w",
                false,
                sandbox.clone(),
            )
            .await
            .unwrap_or_else(|e| panic!("{what}: writing the writable mount: {e:?}"));
            assert_eq!(std::fs::read(writable.path().join(&name)).unwrap(), b"w");
            let refused = write_file(
                &mut client,
                &read_only.path().join(&name),
                b"w",
                false,
                sandbox.clone(),
            )
            .await
            .expect_err("the read-only mount took a write");
            assert!(
                tests::error_text(&refused).contains("Read-only file system"),
                "{what}: {refused:?}"
            );
            // /tmp, holding these mounts, cannot be overlaid: the command's /tmp is private
            // then, and what it writes there must not reach the host's.
            let name = format!("process-{mode}");
            let escape = Path::new("/tmp").join(format!(
                "{}-{name}",
                workspace.path().file_name().unwrap().to_string_lossy()
            ));
            let script = format!(
                "echo w > {w}/{name}; echo rc_w=$?; echo r > {r}/{name} 2>/dev/null; echo rc_r=$?; \
                 echo e > {e}",
                w = writable.path().display(),
                r = read_only.path().display(),
                e = escape.display(),
            );
            let extra = json!({"sandbox": sandbox, "cwd": file_uri(workspace.path())});
            let out = client.run("w", &sh(&script), extra).await;
            let text = out.stdout_text();
            assert!(text.contains("rc_w=0\n"), "{what}: {out:?}");
            assert!(!text.contains("rc_r=0\n"), "{what}: {out:?}");
            assert_eq!(std::fs::read(writable.path().join(&name)).unwrap(), b"w\n");
            assert!(!read_only.path().join(&name).exists(), "{what}");
            assert!(
                !escape.exists(),
                "{what}: the command's /tmp write reached the host"
            );
        }
        drop((writable, read_only));
    }
}

/// `sandbox-run --explain`, with the workspace-write policy for `workspace`, says the command's
/// /tmp is private and writable (the host has mounts inside it).
fn assert_explained_tmp(workspace: &Path) {
    let explain =
        std::process::Command::new(tests::exec_server_binary().with_file_name("sandbox-run"))
            .args(["--policy", "workspace-write", "--cwd"])
            .arg(workspace)
            .args(["--explain", "--", "true"])
            .output()
            .unwrap();
    let explain: Value = serde_json::from_slice(&explain.stdout).unwrap();
    assert_eq!(
        explain["layers"]["tmp"],
        sandbox::linux::TmpView::PrivateWritable.describe()
    );
}
