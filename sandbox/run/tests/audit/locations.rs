//! One run with file, seccomp and proxy denials, rendered as SARIF (locations) and Markdown.

use super::*;

/// One audited run with file denials (one in the workspace, one outside, on a path with `|`),
/// a seccomp denial and an egress-proxy refusal, as root and as 65534, rendered as `format`.
/// Returns the report's text, the run's output and the workspace root.
fn mixed_denials_run(fx: &Fixture, format: &str) -> (String, Output) {
    let report = fx.ws.join(format!("mixed.{format}"));
    let _ = std::fs::remove_file(&report);
    let hostile = fx.outside.join("a|b c.txt");
    std::fs::write(&hostile, "original\n").unwrap();
    if let Some(uid) = fx.uid {
        nix::unistd::chown(&hostile, Some(uid.into()), Some(uid.into())).unwrap();
    }
    let exe = common::probe_exe();
    let ops = vec![
        "sequence".to_owned(),
        "write".to_owned(),
        s(&hostile).to_owned(),
        ";".to_owned(),
        "write".to_owned(),
        format!("{}/.git/config", s(&fx.ws)),
        ";".to_owned(),
        "io-uring-setup".to_owned(),
    ];
    let script = format!(
        "'{}' --exact probe_entry --ignored --nocapture --test-threads=1 -q; \
         curl -sS -m 10 http://other.test:9/x; exit 0",
        exe.display()
    );
    let mut cmd = Command::new(common::sandbox_run_exe());
    cmd.args([
        "--policy",
        "workspace-write",
        "--cwd",
        s(&fx.ws),
        "--allow-domain",
        "registry.test",
        "--audit",
        s(&report),
        "--audit-format",
        format,
        "--",
        "/bin/sh",
        "-c",
        &script,
    ])
    .current_dir(&fx.ws)
    .env_clear()
    .env("PATH", "/usr/bin:/bin")
    .env(PROBE_ENV, serde_json::to_string(&ops).unwrap());
    if let Some(uid) = fx.uid {
        use std::os::unix::process::CommandExt;
        cmd.uid(uid).gid(uid);
    }
    let out = cmd.output().unwrap();
    assert!(out.status.success(), "{}", context(&out));
    // The denials happened: both writes failed with a permission error, the files are as they
    // were, and the syscall was refused.
    let results = probe_results(&out.stdout);
    for result in &results[..2] {
        assert!(
            matches!(result["errno"].as_i64(), Some(1 | 13 | 30)),
            "{}",
            context(&out)
        );
    }
    assert_eq!(results[2]["ok"], false, "{}", context(&out));
    assert_eq!(std::fs::read_to_string(&hostile).unwrap(), "original\n");
    assert_eq!(
        std::fs::read_to_string(fx.ws.join(".git/config")).unwrap(),
        "[core]\n"
    );
    (std::fs::read_to_string(&report).unwrap(), out)
}

#[test]
fn sarif_locations_are_repository_relative_for_file_seccomp_and_proxy_denials() {
    let _guard = require_audit();
    // Control: without the sandbox the same write lands.
    let control = Fixture::new(None);
    let control_file = control.outside.join("a|b c.txt");
    std::fs::write(&control_file, "changed\n").unwrap();
    assert_eq!(std::fs::read_to_string(&control_file).unwrap(), "changed\n");
    for uid in common::identities() {
        let fx = Fixture::new(uid);
        let (text, out) = mixed_denials_run(&fx, "sarif");
        let log: Value = serde_json::from_str(&text).unwrap();
        let run = &log["runs"][0];
        let root_uri = run["originalUriBaseIds"]["%SRCROOT%"]["uri"]
            .as_str()
            .unwrap();
        assert_eq!(root_uri, format!("file://{}/", s(&fx.ws)), "{log:#}");
        assert!(
            run["tool"]["driver"]["informationUri"]
                .as_str()
                .is_some_and(|u| u.starts_with("https://") && u.contains("docs/audit.md")),
            "{log:#}"
        );
        for rule in run["tool"]["driver"]["rules"].as_array().unwrap() {
            assert!(
                rule["helpUri"]
                    .as_str()
                    .is_some_and(|u| u.starts_with("https://") && u.contains("docs/audit.md#")),
                "{rule:#}"
            );
        }
        let results = run["results"].as_array().unwrap();
        let mut seen = BTreeMap::new();
        for result in results {
            let locations = result["locations"].as_array().unwrap();
            assert!(
                !locations.is_empty(),
                "every result has a location: {result:#}"
            );
            for location in locations {
                let artifact = &location["physicalLocation"]["artifactLocation"];
                assert_eq!(artifact["uriBaseId"], "%SRCROOT%", "{result:#}");
                let uri = artifact["uri"].as_str().unwrap();
                assert!(
                    !uri.is_empty() && !uri.starts_with('/') && !uri.contains(':'),
                    "relative, no scheme: {uri}"
                );
                assert!(
                    uri.split('/')
                        .all(|seg| !seg.is_empty() && seg != ".." && seg != "."),
                    "no empty, . or .. segment: {uri}"
                );
                let resolved = fx.ws.join(uri);
                assert!(
                    resolved.starts_with(&fx.ws)
                        && resolved
                            .components()
                            .all(|c| !matches!(c, std::path::Component::ParentDir)),
                    "{uri} resolves under {}",
                    fx.ws.display()
                );
                seen.insert(
                    (
                        result["properties"]["layer"].as_str().unwrap().to_owned(),
                        result["properties"]["operation"]
                            .as_str()
                            .unwrap()
                            .to_owned(),
                    ),
                    uri.to_owned(),
                );
            }
        }
        // The proxy's refusal needs no kernel audit: as root and as 65534.
        assert_eq!(
            seen.get(&("proxy".to_owned(), "net.connect".to_owned()))
                .map(String::as_str),
            Some(".execward/sandbox-run"),
            "{uid:?} {log:#}\n{}",
            context(&out)
        );
        if uid.is_none() {
            // The kernel layers are seen as root: the workspace file is itself, the outside
            // file and the syscall point at the runtime artifact (and keep the real target).
            let file_uris: Vec<&String> = seen
                .iter()
                .filter(|((_, op), _)| op == "fs.write_file")
                .map(|(_, uri)| uri)
                .collect();
            assert!(
                text.contains("\"uri\": \".git/config\""),
                "the workspace denial points at the file: {log:#}"
            );
            assert!(!file_uris.is_empty(), "{log:#}");
            assert_eq!(
                seen.get(&("seccomp".to_owned(), "io_uring_setup".to_owned()))
                    .map(String::as_str),
                Some(".execward/sandbox-run"),
                "{log:#}"
            );
            assert!(text.contains("a|b c.txt"), "the real path is kept: {log:#}");
        } else {
            assert_eq!(run["invocations"][0]["executionSuccessful"], false);
        }
        validate_sarif(&fx.ws.join("mixed.sarif"));
    }
}

#[test]
fn markdown_summary_renders_one_row_per_group_with_hostile_paths_escaped() {
    let _guard = require_audit();
    for uid in common::identities() {
        let fx = Fixture::new(uid);
        let (text, out) = mixed_denials_run(&fx, "markdown");
        let rows: Vec<&str> = text.lines().filter(|l| l.starts_with('|')).collect();
        assert_eq!(
            rows.get(..2),
            Some(
                &[
                    "| layer | operation | where | count | allow |",
                    "|---|---|---|---:|---|"
                ][..]
            ),
            "{text}"
        );
        // Every row has exactly five cells: no `|` of a path ends a cell.
        for row in &rows {
            assert_eq!(row.replace("\\|", "").matches('|').count(), 6, "{row}");
        }
        let layers: Vec<&str> = rows[2..]
            .iter()
            .map(|r| r.split(" | ").next().unwrap().trim_start_matches("| "))
            .collect();
        assert!(layers.contains(&"proxy"), "{text}\n{}", context(&out));
        if uid.is_none() {
            let groups = text
                .lines()
                .find_map(|l| l.strip_prefix("**"))
                .and_then(|l| l.split(" denial").next())
                .unwrap_or_default();
            assert!(
                text.contains(&format!("in {} groups**", rows.len() - 2)),
                "one row per group ({groups} denials): {text}"
            );
            assert!(layers.contains(&"seccomp"), "{text}");
            assert!(text.contains("a\\|b c.txt"), "the | is escaped: {text}");
        } else {
            assert!(text.contains("Audit unavailable"), "{text}");
        }
    }
}
