//! macOS: a Seatbelt profile built from `policies/macos/*.sbpl` and the resolved rules.
//!
//! Every path reaches the profile as a `(param "NAME")` reference with its value passed to
//! `sandbox-exec` as `-DNAME=PATH`; no path is ever pasted into the profile text, so a path
//! cannot inject profile syntax. The generation is plain Rust, compiled and golden-tested on
//! every platform; only the launch is macOS-specific.

use std::ffi::OsString;
use std::path::PathBuf;

use crate::policy::{Access, PathRule, ResolvedPolicy};

/// `sandbox-exec`, by absolute path (never looked up through `$PATH`).
pub const SANDBOX_EXEC: &str = "/usr/bin/sandbox-exec";

/// The base profile (`policies/macos/base.sbpl`).
pub const BASE_SBPL: &str = include_str!("../../policies/macos/base.sbpl");
/// Appended when the network is allowed (`policies/macos/network.sbpl`).
pub const NETWORK_SBPL: &str = include_str!("../../policies/macos/network.sbpl");

/// Appended when the network is an allowlist (`policies/macos/egress.sbpl`), with
/// `EGRESS_PORT` replaced by the egress proxy's port.
pub const EGRESS_SBPL: &str = include_str!("../../policies/macos/egress.sbpl");

/// A profile and the parameter values it refers to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SeatbeltProfile {
    /// Profile text.
    pub text: String,
    /// `(name, path)` for each `(param "name")` in the text.
    pub params: Vec<(String, PathBuf)>,
}

impl SeatbeltProfile {
    /// Arguments for `sandbox-exec`: `-p TEXT -DNAME=PATH ... -- ARGV...`.
    pub fn sandbox_exec_args(&self, argv: &[OsString]) -> Vec<OsString> {
        let mut args = vec![OsString::from("-p"), OsString::from(&self.text)];
        for (name, path) in &self.params {
            let mut define = OsString::from(format!("-D{name}="));
            define.push(path.as_os_str());
            args.push(define);
        }
        args.push(OsString::from("--"));
        args.extend(argv.iter().cloned());
        args
    }
}

/// Builds the Seatbelt profile for `policy`. `None` when the policy restricts nothing. A
/// network allowlist gets no network here (its proxy's port is not known yet): see
/// [`seatbelt_profile_with_egress`].
pub fn seatbelt_profile(policy: &ResolvedPolicy) -> Option<SeatbeltProfile> {
    seatbelt_profile_with_egress(policy, None)
}

/// [`seatbelt_profile`] for a command whose egress proxy listens on loopback `egress_port`:
/// with a network allowlist, that port is the only network destination allowed.
pub fn seatbelt_profile_with_egress(
    policy: &ResolvedPolicy,
    egress_port: Option<u16>,
) -> Option<SeatbeltProfile> {
    if policy.is_unrestricted() {
        return None;
    }
    let mut text = String::from(BASE_SBPL);
    let mut params = Vec::new();
    if policy.restricts_filesystem() {
        text.push_str("\n; Generated from the resolved policy.\n");
        let rules = policy.rules();
        for (index, rule) in rules.iter().enumerate() {
            if rule.access == Access::Deny {
                continue;
            }
            let name = format!("PATH_{index}");
            params.push((name.clone(), rule.path.clone()));
            let read_excludes = exclusions(rules, rule, |a| a == Access::Deny, &mut params, index);
            text.push_str(&allow("file-read*", &name, &read_excludes));
            if rule.access == Access::Write {
                let write_excludes =
                    exclusions(rules, rule, |a| a != Access::Write, &mut params, index);
                text.push_str(&allow("file-write*", &name, &write_excludes));
            }
        }
    } else {
        text.push_str("\n(allow file-read* file-write*)\n");
    }
    if policy.network_fully_on() {
        text.push('\n');
        text.push_str(NETWORK_SBPL);
    } else if let (Some(_), Some(port)) = (policy.egress(), egress_port) {
        text.push('\n');
        text.push_str(&EGRESS_SBPL.replace("EGRESS_PORT", &port.to_string()));
    }
    protections(policy, &mut text, &mut params);
    Some(SeatbeltProfile { text, params })
}

/// The supervisor's protections, last so they win over the allows above: hidden paths are
/// neither readable nor writable, read-only paths not writable, denied ports not reachable.
fn protections(policy: &ResolvedPolicy, text: &mut String, params: &mut Vec<(String, PathBuf)>) {
    if policy.hidden_paths().is_empty()
        && policy.read_only_paths().is_empty()
        && policy.denied_tcp_ports.is_empty()
    {
        return;
    }
    text.push_str("\n; The supervisor's own files, binaries and port.\n");
    for (index, path) in policy.hidden_paths().iter().enumerate() {
        let name = format!("HIDDEN_{index}");
        params.push((name.clone(), path.clone()));
        text.push_str(&format!(
            "(deny file-read* file-write* (subpath (param \"{name}\")))\n"
        ));
    }
    for (index, path) in policy.read_only_paths().iter().enumerate() {
        let name = format!("READ_ONLY_{index}");
        params.push((name.clone(), path.clone()));
        text.push_str(&format!(
            "(deny file-write* (subpath (param \"{name}\")))\n"
        ));
    }
    if policy.network_allowed() {
        // Port numbers are integers, not paths: nothing a client names reaches the text.
        for port in &policy.denied_tcp_ports {
            text.push_str(&format!(
                "(deny network-outbound (remote tcp \"*:{port}\"))\n"
            ));
        }
    }
}

/// Params for the deeper rules under `rule` whose access matches `narrower`.
fn exclusions(
    rules: &[PathRule],
    rule: &PathRule,
    narrower: impl Fn(Access) -> bool,
    params: &mut Vec<(String, PathBuf)>,
    index: usize,
) -> Vec<String> {
    rules
        .iter()
        .enumerate()
        .filter(|(_, inner)| {
            inner.path != rule.path && inner.path.starts_with(&rule.path) && narrower(inner.access)
        })
        .map(|(inner_index, inner)| {
            let name = format!("PATH_{index}_EXCEPT_{inner_index}");
            if !params.iter().any(|(existing, _)| *existing == name) {
                params.push((name.clone(), inner.path.clone()));
            }
            name
        })
        .collect()
}

fn allow(operation: &str, name: &str, excludes: &[String]) -> String {
    if excludes.is_empty() {
        return format!("(allow {operation} (subpath (param \"{name}\")))\n");
    }
    let mut out = format!("(allow {operation}\n  (require-all (subpath (param \"{name}\"))");
    for exclude in excludes {
        out.push_str(&format!(
            "\n    (require-not (subpath (param \"{exclude}\")))"
        ));
    }
    out.push_str("))\n");
    out
}

/// Replaces the current process with `argv` under Seatbelt.
///
/// # Errors
/// The `exec` error; on success it does not return.
#[cfg(target_os = "macos")]
pub fn exec_under_seatbelt(policy: &ResolvedPolicy, argv: &[OsString]) -> std::io::Error {
    use std::os::unix::process::CommandExt;
    let Some((program, rest)) = argv.split_first() else {
        return std::io::Error::from(std::io::ErrorKind::InvalidInput);
    };
    match seatbelt_profile(policy) {
        None => std::process::Command::new(program).args(rest).exec(),
        Some(profile) => std::process::Command::new(SANDBOX_EXEC)
            .args(profile.sandbox_exec_args(argv))
            .exec(),
    }
}
