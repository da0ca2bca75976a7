//! `execward-cli-docs DIR`: writes the man pages and shell completions of execward's commands,
//! generated from the same clap definitions the binaries parse with, so they cannot drift from
//! `--help`. `install.sh` runs it; the layout under DIR is the one a prefix uses:
//!
//! - `share/man/man1/exec-server.1`, `exec-server-exec.1`, `sandbox-run.1`, `exec-rendezvous.1`
//! - `share/bash-completion/completions/exec-server`, `sandbox-run`, `exec-rendezvous`
//! - `share/zsh/site-functions/_exec-server`, `_sandbox-run`, `_exec-rendezvous`
//! - `share/fish/vendor_completions.d/exec-server.fish`, `sandbox-run.fish`, `exec-rendezvous.fish`
//!
//! Only the commands people type get pages: `exec-server` (and its `exec` client),
//! `sandbox-run` and `exec-rendezvous`. The internal helpers (`fs-helper`, `exec-guardian`) are run by `exec-server`
//! and say so in their `--help`.
#![deny(unsafe_code)]

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context;
use clap::CommandFactory;
use clap_complete::Shell;

/// The user-facing commands: `(name, clap definition)`.
fn commands() -> Vec<(&'static str, clap::Command)> {
    vec![
        ("exec-server", supervisor::cli::Cli::command()),
        ("sandbox-run", sandbox_run::command()),
        (
            "exec-rendezvous",
            supervisor::rendezvous::cli::Cli::command(),
        ),
    ]
}

/// Completion scripts: the shell and where its script goes, relative to the prefix.
const COMPLETIONS: &[(Shell, &str)] = &[
    (Shell::Bash, "share/bash-completion/completions"),
    (Shell::Zsh, "share/zsh/site-functions"),
    (Shell::Fish, "share/fish/vendor_completions.d"),
];

/// Where man pages go, relative to the prefix.
const MAN_DIR: &str = "share/man/man1";

fn main() -> ExitCode {
    let mut args = std::env::args_os().skip(1);
    let (Some(prefix), None) = (args.next(), args.next()) else {
        eprintln!(
            "usage: execward-cli-docs PREFIX\n\nwrites man pages ({MAN_DIR}) and bash, zsh and \
             fish completions of exec-server and sandbox-run under PREFIX"
        );
        return ExitCode::from(2);
    };
    match generate(Path::new(&prefix)) {
        Ok(written) => {
            for path in written {
                println!("{}", path.display());
            }
            ExitCode::SUCCESS
        }
        Err(error) => {
            eprintln!("execward-cli-docs: {error:#}");
            ExitCode::FAILURE
        }
    }
}

/// Writes every page and script under `prefix`; returns the files written.
fn generate(prefix: &Path) -> anyhow::Result<Vec<PathBuf>> {
    let mut written = Vec::new();
    let man_dir = prefix.join(MAN_DIR);
    std::fs::create_dir_all(&man_dir).with_context(|| format!("create {}", man_dir.display()))?;
    for (name, command) in commands() {
        let command = command.name(name).bin_name(name);
        written.push(write_man_page(&man_dir, name, command.clone())?);
        for sub in command.get_subcommands().filter(|sub| !sub.is_hide_set()) {
            let sub_name = format!("{name}-{}", sub.get_name());
            let sub = sub
                .clone()
                .name(sub_name.clone())
                .bin_name(format!("{name} {}", sub.get_name()));
            written.push(write_man_page(&man_dir, &sub_name, sub)?);
        }
        for (shell, dir) in COMPLETIONS {
            let dir = prefix.join(dir);
            std::fs::create_dir_all(&dir).with_context(|| format!("create {}", dir.display()))?;
            let mut command = command.clone();
            let path = clap_complete::generate_to(*shell, &mut command, name, &dir)
                .with_context(|| format!("write the {shell} completion of {name}"))?;
            if *shell == Shell::Bash {
                repair_bash_subcommands(&path, name)?;
            }
            written.push(path);
        }
    }
    Ok(written)
}

/// clap_complete's bash script names a hyphenated command's state `exec__server` where it
/// walks the words but `exec__subcmd__server` where it matches them, so `exec-server exec
/// <TAB>` completed nothing. One spelling for both.
fn repair_bash_subcommands(path: &Path, name: &str) -> anyhow::Result<()> {
    if !name.contains('-') {
        return Ok(());
    }
    let script =
        std::fs::read_to_string(path).with_context(|| format!("read {}", path.display()))?;
    let repaired = script.replace(&name.replace('-', "__subcmd__"), &name.replace('-', "__"));
    std::fs::write(path, repaired).with_context(|| format!("write {}", path.display()))
}

fn write_man_page(dir: &Path, name: &str, command: clap::Command) -> anyhow::Result<PathBuf> {
    let mut page = Vec::new();
    clap_mangen::Man::new(command)
        .render(&mut page)
        .with_context(|| format!("render the man page of {name}"))?;
    let path = dir.join(format!("{name}.1"));
    std::fs::write(&path, page).with_context(|| format!("write {}", path.display()))?;
    Ok(path)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn pages_and_completions_cover_every_user_command_and_its_options() {
        let prefix = tempfile::tempdir().unwrap();
        let written = generate(prefix.path()).unwrap();
        let relative: Vec<String> = written
            .iter()
            .map(|p| p.strip_prefix(prefix.path()).unwrap().display().to_string())
            .collect();
        for expected in [
            "share/man/man1/exec-server.1",
            "share/man/man1/exec-server-exec.1",
            "share/man/man1/sandbox-run.1",
            "share/bash-completion/completions/exec-server.bash",
            "share/zsh/site-functions/_sandbox-run",
            "share/fish/vendor_completions.d/sandbox-run.fish",
        ] {
            assert!(
                relative.iter().any(|p| p == expected),
                "{expected} not in {relative:?}"
            );
        }
        let read = |p: &str| std::fs::read_to_string(prefix.path().join(p)).unwrap();
        let sandbox_run = read("share/man/man1/sandbox-run.1");
        for option in [
            "\\-\\-policy",
            "\\-\\-allow",
            "\\-\\-audit",
            "\\-\\-create\\-missing",
        ] {
            assert!(sandbox_run.contains(option), "sandbox-run.1 lacks {option}");
        }
        assert!(
            !sandbox_run.contains("launch\\-fd"),
            "a hidden option is documented"
        );
        let exec = read("share/man/man1/exec-server-exec.1");
        assert!(
            exec.contains("\\-\\-tty") && exec.contains("\\-\\-connect"),
            "{exec}"
        );
        let bash = read("share/bash-completion/completions/exec-server.bash");
        assert!(
            bash.contains("--log-format") && bash.contains("exec"),
            "{bash}"
        );
        let rendezvous = read("share/man/man1/exec-rendezvous.1");
        assert!(rendezvous.contains("\\-\\-credentials"), "{rendezvous}");
        assert!(
            relative
                .iter()
                .any(|p| p == "share/bash-completion/completions/exec-rendezvous.bash")
        );
    }

    /// What bash offers for `words` (the last one being completed), through the generated
    /// script as bash-completion would call it.
    fn bash_offers(script: &Path, function: &str, words: &[&str]) -> String {
        let line = words.join(" ");
        let program = format!(
            "source {}; COMP_WORDS=({line}); COMP_CWORD={}; COMP_LINE='{line}'; \
             COMP_POINT=${{#COMP_LINE}}; {function} {} '{}' '{}'; echo \"${{COMPREPLY[@]}}\"",
            script.display(),
            words.len() - 1,
            words[0],
            words[words.len() - 1],
            words[words.len() - 2],
        );
        let output = std::process::Command::new("bash")
            .args(["-c", &program])
            .output()
            .unwrap();
        String::from_utf8(output.stdout).unwrap()
    }

    #[test]
    fn bash_completes_the_options_of_exec_server_exec() {
        let prefix = tempfile::tempdir().unwrap();
        generate(prefix.path()).unwrap();
        let script = prefix
            .path()
            .join("share/bash-completion/completions/exec-server.bash");
        let offered = bash_offers(&script, "_exec__server", &["exec-server", "exec", "--co"]);
        assert!(offered.contains("--connect"), "offered: {offered:?}");
        let top = bash_offers(&script, "_exec__server", &["exec-server", "--lis"]);
        assert!(top.contains("--listen"), "offered: {top:?}");
    }
}
