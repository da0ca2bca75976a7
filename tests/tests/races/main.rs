//! Race tests: while the real `exec-server` runs recursive `fs/copy`, recursive `fs/remove`,
//! `fs/writeFile` (atomic and in place) and `fs/createDirectory {recursive}`, an attacker
//! thread swaps every directory and file the operation creates or walks for a symlink to a
//! sentinel directory outside the workspace, in a tight loop. After 500 rounds per operation
//! nothing in the sentinel has been written, removed or changed (content, mode, owner, size,
//! link count, mtime and ctime of every entry, the directories included), no sentinel content
//! was copied into the workspace through a swapped link, and the server never tried to write
//! outside (under a sandbox that attempt would surface as `sandboxDenied`).
//!
//! Each operation runs unsandboxed (in the server process, as root) and under a
//! workspace-write sandbox (in a pooled fs-helper). The attacker stands for a sandboxed command
//! that can write the workspace; the named paths' parents (the workspace itself) are not
//! swapped: docs/protocol.md ("Symlinks") says symlinks there are followed, once, as named.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::os::unix::fs::{MetadataExt, symlink};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Instant;

use serde_json::{Value, json};
use tests::{Client, ExecServer, b64, error_kind, file_uri};

mod copy_remove;
mod create_directory;
mod write_file;

/// Rounds per operation and mode, at least. (1,000 rounds landed 2,600 to 7,900 swaps, far
/// past [`MIN_SWAPS`], and cost ~90 s of CI's time on 2 cores in the sandboxed mode, where
/// every round is a helper's request competing with the attacker's spinning thread.)
const ROUNDS: usize = 500;

/// Fewest swaps the attacker must land in one run, or the run proved nothing. How many land
/// depends on scheduling (a busy machine may run the attacker rarely), so a run goes on past
/// [`ROUNDS`] until this many landed, up to [`MAX_ROUNDS`].
const MIN_SWAPS: usize = ROUNDS / 5;

/// Rounds after which a run whose attacker still has not landed [`MIN_SWAPS`] fails.
const MAX_ROUNDS: usize = 20 * ROUNDS;

/// The attacker's round between requests (it sleeps then).
const NO_ROUND: usize = usize::MAX;

/// Content of every sentinel file: found anywhere in the workspace, it was read through a link.
fn marker() -> String {
    format!("sentinel-marker-{}", std::process::id())
}

/// What is recorded of each sentinel entry.
#[derive(Debug, PartialEq, Eq)]
struct EntryState {
    mode: u32,
    uid: u32,
    gid: u32,
    size: u64,
    nlink: u64,
    mtime: (i64, i64),
    ctime: (i64, i64),
    content: Option<Vec<u8>>,
    link: Option<PathBuf>,
}

/// Every entry below `root` (and `root` itself), without following links.
fn snapshot(root: &Path) -> BTreeMap<PathBuf, EntryState> {
    let mut out = BTreeMap::new();
    let mut pending = vec![root.to_path_buf()];
    while let Some(path) = pending.pop() {
        let meta = std::fs::symlink_metadata(&path).unwrap();
        if meta.is_dir() {
            for entry in std::fs::read_dir(&path).unwrap() {
                pending.push(entry.unwrap().path());
            }
        }
        out.insert(
            path.strip_prefix(root).unwrap().to_path_buf(),
            EntryState {
                mode: meta.mode(),
                uid: meta.uid(),
                gid: meta.gid(),
                size: meta.size(),
                nlink: meta.nlink(),
                mtime: (meta.mtime(), meta.mtime_nsec()),
                ctime: (meta.ctime(), meta.ctime_nsec()),
                content: meta.is_file().then(|| std::fs::read(&path).unwrap()),
                link: meta
                    .file_type()
                    .is_symlink()
                    .then(|| std::fs::read_link(&path).unwrap()),
            },
        );
    }
    out
}

/// Regular files under `root` (links not followed) that hold the sentinel marker.
fn files_with_marker(root: &Path) -> Vec<PathBuf> {
    let marker = marker();
    let mut found = Vec::new();
    let mut pending = vec![root.to_path_buf()];
    while let Some(path) = pending.pop() {
        let Ok(meta) = std::fs::symlink_metadata(&path) else {
            continue;
        };
        if meta.is_dir() {
            if let Ok(entries) = std::fs::read_dir(&path) {
                pending.extend(entries.flatten().map(|e| e.path()));
            }
        } else if meta.is_file()
            && std::fs::read(&path).is_ok_and(|data| {
                data.windows(marker.len())
                    .any(|window| window == marker.as_bytes())
            })
        {
            found.push(path);
        }
    }
    found
}

/// The workspace, the sentinel outside it, and a place for what the attacker moves away.
///
/// The workspace lives on the tmpfs `/dev/shm` (writable under workspace-write as the policy's
/// `cwd`), so thousands of rounds cost CPU time, not journal commits of a shared disk. The
/// sentinel is in `/var/tmp`, outside every writable root.
struct Arena {
    workspace: tempfile::TempDir,
    _outside: tempfile::TempDir,
    sentinel: PathBuf,
    sentinel_file: PathBuf,
    junk: PathBuf,
}

impl Arena {
    fn new() -> Arena {
        let workspace = tempfile::Builder::new()
            .prefix("ew-race-")
            .tempdir_in("/dev/shm")
            .expect("a workspace on /dev/shm");
        let outside = tempfile::Builder::new()
            .prefix("ew-race-out-")
            .tempdir_in("/var/tmp")
            .expect("a directory under /var/tmp");
        let sentinel = outside.path().join("sentinel");
        std::fs::create_dir_all(sentinel.join("nested/deeper")).unwrap();
        std::fs::create_dir(sentinel.join("empty")).unwrap();
        let sentinel_file = sentinel.join("file");
        for file in [
            sentinel_file.clone(),
            sentinel.join("nested/file"),
            sentinel.join("nested/deeper/file"),
        ] {
            std::fs::write(&file, marker()).unwrap();
        }
        // Names the operations use, so a followed link would land on an existing entry.
        for name in ["a", "b", "c", "top", "target", "f1"] {
            std::fs::write(sentinel.join("nested").join(name), marker()).unwrap();
        }
        let junk = workspace.path().join("junk");
        std::fs::create_dir(&junk).unwrap();
        Arena {
            workspace,
            _outside: outside,
            sentinel,
            sentinel_file,
            junk,
        }
    }

    fn ws(&self, name: &str) -> PathBuf {
        self.workspace.path().join(name)
    }

    fn policy(&self) -> Value {
        json!({"profile": "workspace-write", "cwd": file_uri(self.workspace.path())})
    }
}

/// The attacker: a thread that, for the current round, replaces every existing directory or
/// file among its targets by a symlink into the sentinel, atomically (`renameat2` with
/// `RENAME_EXCHANGE` against a link made in advance, so the path never goes missing for a
/// moment), moving the real entry to the junk directory; links it finds at a target are
/// removed, so the server may create the entry again and be raced again.
struct Attacker {
    round: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
    swaps: Arc<AtomicUsize>,
    thread: Option<std::thread::JoinHandle<()>>,
}

/// What a target is expected to be when the server has made it: a directory is swapped for a
/// link to the sentinel directory, a file for a link to a sentinel file.
#[derive(Debug, Clone, Copy)]
enum Kind {
    Dir = 0,
    File = 1,
}

/// A path the attacker swaps, and its kind.
type Target = (PathBuf, Kind);

fn dirs(paths: impl IntoIterator<Item = PathBuf>) -> impl Iterator<Item = Target> {
    paths.into_iter().map(|path| (path, Kind::Dir))
}

fn files(paths: impl IntoIterator<Item = PathBuf>) -> impl Iterator<Item = Target> {
    paths.into_iter().map(|path| (path, Kind::File))
}

/// Replaces entries by links into the sentinel (see [`Attacker`]). One link to the sentinel
/// directory and one to a sentinel file wait in the junk directory, so a swap is one `lstat`
/// and one `renameat2`.
struct Swapper {
    junk: PathBuf,
    made: usize,
    swaps: Arc<AtomicUsize>,
    /// (link target, spare link ready in the junk directory) for directories, then files.
    spares: [(PathBuf, PathBuf); 2],
}

impl Swapper {
    fn new(arena: &Arena, swaps: Arc<AtomicUsize>) -> Swapper {
        let mut swapper = Swapper {
            junk: arena.junk.clone(),
            made: 0,
            swaps,
            spares: [
                (arena.sentinel.clone(), PathBuf::new()),
                (arena.sentinel_file.clone(), PathBuf::new()),
            ],
        };
        for index in 0..2 {
            swapper.new_spare(index);
        }
        swapper
    }

    /// Makes a fresh spare link of kind `index` (the previous one now holds a swapped-out
    /// entry and stays in the junk directory).
    fn new_spare(&mut self, index: usize) {
        self.made += 1;
        let spare = self.junk.join(format!("link-{}", self.made));
        symlink(&self.spares[index].0, &spare).unwrap();
        self.spares[index].1 = spare;
    }

    /// Exchanges `path` with the spare link of its kind, blindly (one syscall: the sooner
    /// after the entry appears, the likelier the server still has a step to take in it).
    fn swap(&mut self, path: &Path, kind: Kind) {
        let index = kind as usize;
        let spare = &self.spares[index].1;
        let exchanged = nix::fcntl::renameat2(
            nix::fcntl::AT_FDCWD,
            path,
            nix::fcntl::AT_FDCWD,
            spare,
            nix::fcntl::RenameFlags::RENAME_EXCHANGE,
        );
        if exchanged.is_err() {
            return; // not there (yet, or any more)
        }
        let swapped_out = std::fs::symlink_metadata(spare);
        if swapped_out.is_ok_and(|meta| meta.file_type().is_symlink()) {
            // `path` held one of our links already: remove the one just put there, so the
            // server may create the entry again and be raced again; the old link is the spare.
            let _ = std::fs::remove_file(path);
        } else {
            self.swaps.fetch_add(1, Ordering::Relaxed);
            self.new_spare(index);
        }
    }
}

impl Attacker {
    /// `targets(round)` lists the paths to swap in that round; entries of the listed
    /// `scan_dirs(round)` whose names start with `.execward-write-` are swapped too.
    fn start(
        arena: &Arena,
        targets: impl Fn(usize) -> Vec<Target> + Send + 'static,
        scan_dirs: impl Fn(usize) -> Vec<PathBuf> + Send + 'static,
    ) -> Attacker {
        // No round yet: nothing is attacked while a round's tree is being set up.
        let round = Arc::new(AtomicUsize::new(NO_ROUND));
        let stop = Arc::new(AtomicBool::new(false));
        let swaps = Arc::new(AtomicUsize::new(0));
        let mut swapper = Swapper::new(arena, swaps.clone());
        let thread = {
            let (round, stop) = (round.clone(), stop.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    let current = round.load(Ordering::Acquire);
                    if current == NO_ROUND {
                        // Between requests: sleep until the next round starts (spurious
                        // wake-ups only cost one more look at the round).
                        std::thread::park();
                        continue;
                    }
                    for (path, kind) in targets(current) {
                        swapper.swap(&path, kind);
                    }
                    for dir in scan_dirs(current) {
                        let Ok(entries) = std::fs::read_dir(&dir) else {
                            continue;
                        };
                        for entry in entries.flatten() {
                            if entry
                                .file_name()
                                .to_string_lossy()
                                .starts_with(fs_helper_temp_prefix())
                            {
                                swapper.swap(&entry.path(), Kind::File);
                            }
                        }
                    }
                    // Let the server run where the cores are shared; returns at once otherwise.
                    std::thread::yield_now();
                }
            })
        };
        Attacker {
            round,
            stop,
            swaps,
            thread: Some(thread),
        }
    }

    /// Attacks `round` until [`Attacker::pause`].
    fn attack(&self, round: usize) {
        self.round.store(round, Ordering::Release);
        if let Some(thread) = &self.thread {
            thread.thread().unpark();
        }
    }

    /// Stops attacking until the next [`Attacker::attack`].
    fn pause(&self) {
        self.round.store(NO_ROUND, Ordering::Release);
    }

    /// How many swaps the attacker landed so far.
    fn swaps(&self) -> usize {
        self.swaps.load(Ordering::Relaxed)
    }

    /// Stops the attacker and returns how many swaps it landed.
    fn finish(mut self) -> usize {
        self.stop.store(true, Ordering::Relaxed);
        let thread = self.thread.take().unwrap();
        thread.thread().unpark();
        thread.join().unwrap();
        self.swaps()
    }
}

impl Drop for Attacker {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            thread.thread().unpark();
            let _ = thread.join();
        }
    }
}

/// Prefix of an atomic write's temporary files (`fs_helper::ATOMIC_TEMP_PREFIX`).
fn fs_helper_temp_prefix() -> &'static str {
    ".execward-write-"
}

/// Outcomes of one run, by `data.kind` (`ok` for success).
type Outcomes = BTreeMap<String, usize>;

/// Runs at least `ROUNDS` rounds of one operation under the attacker (more until it landed
/// `MIN_SWAPS`), in one mode, and checks the sentinel afterwards. `prepare(round)` sets the round's tree up and returns the request.
async fn race(
    arena: &Arena,
    client: &mut Client,
    what: &str,
    sandbox: Option<Value>,
    attacker: Attacker,
    prepare: impl Fn(usize) -> (&'static str, Value),
) {
    let before = snapshot(&arena.sentinel);
    let started = Instant::now();
    let mut outcomes = Outcomes::new();
    let mut round = 0;
    while round < ROUNDS || (attacker.swaps() < MIN_SWAPS && round < MAX_ROUNDS) {
        let (method, mut params) = prepare(round);
        if let Some(sandbox) = &sandbox {
            params["sandbox"] = sandbox.clone();
        }
        attacker.attack(round);
        let result = client.request(method, params).await;
        attacker.pause();
        let kind = match result {
            Ok(_) => "ok".to_owned(),
            Err(error) => {
                let kind = error_kind(&error);
                assert!(
                    !matches!(
                        kind.as_str(),
                        "sandboxDenied" | "permissionDenied" | "internal" | "helperFailed"
                    ),
                    "{what}, round {round}: the server tried to reach outside the workspace \
                     or failed: {error:?}"
                );
                if !outcomes.contains_key(&kind) {
                    eprintln!("{what}: first {kind}: {}", error.message);
                }
                kind
            }
        };
        *outcomes.entry(kind).or_default() += 1;
        round += 1;
    }
    let swaps = attacker.finish();
    let elapsed = started.elapsed();
    eprintln!("{what}: {round} rounds in {elapsed:?}, {swaps} swaps landed, outcomes {outcomes:?}");
    let after = snapshot(&arena.sentinel);
    assert!(
        before == after,
        "{what}: the sentinel outside the workspace changed:\nbefore {before:#?}\nafter {after:#?}"
    );
    let leaked = files_with_marker(arena.workspace.path());
    assert!(
        leaked.is_empty(),
        "{what}: sentinel content was copied into the workspace through a link: {leaked:?}"
    );
    assert!(
        swaps >= MIN_SWAPS,
        "{what}: the attacker landed only {swaps} swaps in {round} rounds; the race was not run"
    );
    assert!(
        outcomes.get("ok").copied().unwrap_or(0) > 0,
        "{what}: no round succeeded, so the operation itself was never exercised: {outcomes:?}"
    );
}

/// Both modes of one operation: unsandboxed, then under workspace-write.
async fn both_modes(
    what: &str,
    targets: fn(&Arena, usize) -> Vec<Target>,
    scan_dirs: fn(&Arena, usize) -> Vec<PathBuf>,
    prepare: fn(&Arena, &str, usize) -> (&'static str, Value),
) {
    let server = ExecServer::start(&[]);
    let mut client = server.client().await;
    for (mode, sandboxed) in [("unsandboxed", false), ("workspace-write", true)] {
        let arena = Arc::new(Arena::new());
        let attacker = {
            let (a, b) = (arena.clone(), arena.clone());
            Attacker::start(
                &arena,
                move |round| targets(&a, round),
                move |round| scan_dirs(&b, round),
            )
        };
        let sandbox = sandboxed.then(|| arena.policy());
        let label = format!("{what} ({mode})");
        race(&arena, &mut client, &label, sandbox, attacker, |round| {
            prepare(&arena, mode, round)
        })
        .await;
    }
}

fn no_scan(_: &Arena, _: usize) -> Vec<PathBuf> {
    Vec::new()
}
