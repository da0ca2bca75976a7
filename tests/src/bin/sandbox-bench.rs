//! `sandbox-bench`: median wall time of spawning `/bin/true` directly, through `sandbox-run`
//! (workspace-write, namespaces on and off) and through bwrap when installed.
//!
//! Usage: `sandbox-bench [RUNS]` (default 200). Run it from a release build:
//! `cargo build --release -p execward-sandbox-run -p execward-egress -p execward-tests --bins && target/release/sandbox-bench`.
#![deny(unsafe_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

/// Default number of runs per configuration.
const DEFAULT_RUNS: usize = 200;

fn median(command: &mut Command, runs: usize) -> anyhow::Result<Duration> {
    let mut samples = Vec::with_capacity(runs);
    for _ in 0..runs {
        let start = Instant::now();
        let status = command.status()?;
        samples.push(start.elapsed());
        anyhow::ensure!(status.success(), "{command:?} failed: {status}");
    }
    samples.sort();
    Ok(samples[samples.len() / 2])
}

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("sandbox-bench: {err:#}");
            ExitCode::FAILURE
        }
    }
}

/// Benchmark (a development tool, not installed): median wall time of spawning /bin/true
/// directly, through sandbox-run (workspace-write, namespaces on and off) and through bwrap
/// when installed. Run it from a release build, next to sandbox-run:
/// `cargo build --release -p execward-sandbox-run -p execward-egress -p execward-tests --bins && target/release/sandbox-bench`.
#[derive(Debug, clap::Parser)]
#[command(name = "sandbox-bench", version, about, long_about)]
struct Cli {
    /// Runs per configuration.
    #[arg(value_name = "RUNS", default_value_t = DEFAULT_RUNS, value_parser = clap::value_parser!(usize))]
    runs: usize,
}

fn run() -> anyhow::Result<()> {
    let runs = <Cli as clap::Parser>::parse().runs;
    anyhow::ensure!(runs > 0, "RUNS must be at least 1");
    let exe = std::env::current_exe()?;
    let sandbox_run = exe
        .parent()
        .map(|dir| dir.join("sandbox-run"))
        .filter(|p| p.exists())
        .ok_or_else(|| anyhow::anyhow!("sandbox-run not found next to {}", exe.display()))?;
    let workspace = tempfile_dir()?;
    let quiet = |mut cmd: Command| {
        cmd.current_dir(&workspace)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        cmd
    };
    let mut rows: Vec<(String, Duration)> = Vec::new();
    rows.push((
        "direct /bin/true".into(),
        median(&mut quiet(Command::new("/bin/true")), runs)?,
    ));
    let mut ns_on = quiet(Command::new(&sandbox_run));
    ns_on.args(["--policy", "workspace-write", "--", "/bin/true"]);
    rows.push((
        "sandbox-run workspace-write (namespaces on)".into(),
        median(&mut ns_on, runs)?,
    ));
    let mut ns_off = quiet(Command::new(&sandbox_run));
    ns_off.args([
        "--policy",
        "workspace-write",
        "--no-namespaces",
        // Without a mount namespace the credential-store denials inside a readable root (e.g.
        // `~/.npmrc`) cannot be applied: sandbox-run refuses (125) unless told to go without.
        "--best-effort",
        "--",
        "/bin/true",
    ]);
    rows.push((
        "sandbox-run workspace-write (namespaces off, best effort)".into(),
        median(&mut ns_off, runs)?,
    ));
    if Path::new("/usr/bin/bwrap").exists() {
        let mut bwrap = quiet(Command::new("/usr/bin/bwrap"));
        bwrap.args(["--ro-bind", "/", "/", "--dev", "/dev", "--bind"]);
        bwrap.arg(&workspace).arg(&workspace);
        bwrap.args(["--unshare-user", "--unshare-net", "--", "/bin/true"]);
        rows.push((
            "bwrap --ro-bind / / --bind WS WS --unshare-net".into(),
            median(&mut bwrap, runs)?,
        ));
    }
    let direct = rows[0].1.as_secs_f64();
    println!("median of {runs} runs, /bin/true");
    println!("{:<58} {:>10} {:>8}", "configuration", "median", "x direct");
    for (name, time) in &rows {
        println!(
            "{name:<58} {:>8.3}ms {:>7.2}x",
            time.as_secs_f64() * 1e3,
            time.as_secs_f64() / direct
        );
    }
    let _ = std::fs::remove_dir(&workspace);
    Ok(())
}

/// A fresh directory under the system temp dir to run in (the workspace).
fn tempfile_dir() -> anyhow::Result<PathBuf> {
    let dir = std::env::temp_dir().join(format!("sandbox-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}
