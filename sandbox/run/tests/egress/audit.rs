//! What the proxy's refusals and destinations leave behind: denial records in every `--audit`
//! format without root, and the `--egress-log` list of destinations.

use super::*;

#[test]
fn proxy_refusals_are_denial_records_in_every_audit_format_without_root() {
    let origin = Origin::start(None);
    // As 65534 only: as root, --audit would switch the kernel audit on machine-wide.
    let uid = if nix::unistd::geteuid().is_root() {
        Some(NOBODY)
    } else {
        None
    };
    let ws = Workspace::new(uid);
    let url = format!("http://other.test:{}/hello", origin.port);
    for (format, needle) in [
        ("jsonl", "\"layer\":\"proxy\""),
        ("sarif", "net.connect"),
        ("github", "proxy"),
    ] {
        let report = ws.path.join(format!("report.{format}"));
        let mut args = allow(&["registry.test"], &origin);
        args.extend([
            "--audit".to_owned(),
            report.display().to_string(),
            "--audit-format".to_owned(),
            format.to_owned(),
            "--fail-on-denial".to_owned(),
        ]);
        let output = ws.run(&strs(&args), &["curl", "-sS", "-m", "10", &url]);
        assert_eq!(
            output.status.code(),
            Some(3),
            "{format}: {}",
            describe(&output)
        );
        let text = std::fs::read_to_string(&report).unwrap();
        assert!(
            text.contains(needle) && text.contains(&format!("other.test:{}", origin.port)),
            "{format}: {text}"
        );
        if format == "jsonl" {
            let denial: serde_json::Value = text
                .lines()
                .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
                .find(|v| v["kind"] == "denial")
                .unwrap();
            assert_eq!(denial["operation"], "net.connect");
            assert_eq!(
                denial["allow_rule"],
                format!("--allow-domain other.test:{}", origin.port)
            );
        }
    }
}

#[test]
fn the_egress_log_lists_allowed_destinations_for_ci() {
    let origin = Origin::start(None);
    let ws = Workspace::new(None);
    let log = ws.path.join("egress.jsonl");
    let mut args = allow(&["registry.test"], &origin);
    args.extend(["--egress-log".to_owned(), log.display().to_string()]);
    let url = format!("http://registry.test:{}/hello", origin.port);
    let output = ws.run(&strs(&args), &["curl", "-sS", "-f", "-m", "10", &url]);
    assert!(output.status.success(), "{}", describe(&output));
    let events: Vec<serde_json::Value> = BufReader::new(std::fs::File::open(&log).unwrap())
        .lines()
        .map(|l| serde_json::from_str(&l.unwrap()).unwrap())
        .collect();
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!(events[0]["allowed"], true);
    assert_eq!(events[0]["host"], "registry.test");
    assert_eq!(events[0]["port"], origin.port);
    assert_eq!(events[0]["rule"], format!("registry.test:{}", origin.port));
}
