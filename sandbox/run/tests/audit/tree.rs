//! The report lists exactly the denials of the whole command tree, each under its layer.

use super::*;

#[test]
fn audit_lists_exactly_the_forbidden_operations_of_the_command_tree() {
    let _guard = require_audit();
    let fx = Fixture::new(None);
    let report = fx.ws.join("../audit.jsonl");
    let (ws, outside, outside_file) = (s(&fx.ws), s(&fx.outside), s(&fx.outside_file));
    let git_config = format!("{ws}/.git/config");
    let ops = [
        // forbidden
        "write",
        outside_file,
        ";",
        "write",
        &format!("{outside}/new.txt"),
        ";",
        "mkdir",
        &format!("{outside}/newdir"),
        ";",
        "write",
        &git_config,
        ";",
        "tcp-connect",
        "127.0.0.1:9",
        ";",
        "udp-socket",
        ";",
        // allowed
        "write",
        &format!("{ws}/inside.txt"),
        ";",
        "mkdir",
        &format!("{ws}/made"),
        ";",
        "read",
        "/etc/hostname",
        ";",
        "read",
        outside_file,
    ];
    // An unrelated sandboxed process is denied at the same time, over and over: none of its
    // denials (other paths, same kinds) may show up in our report.
    let unrelated_dir = fx.outside.with_file_name("unrelated");
    std::fs::create_dir(&unrelated_dir).unwrap();
    let stop = AtomicBool::new(false);
    let unrelated_runs = std::thread::scope(|scope| {
        let noise = scope.spawn(|| {
            let mut runs = 0;
            let target = format!("{}/x.txt", unrelated_dir.display());
            while !stop.load(Ordering::SeqCst) || runs == 0 {
                let out = run_probe_tree(
                    &["--policy", "workspace-write", "--cwd", ws],
                    &["write", &target, ";", "udp-socket", ";", "mkdir", &target],
                    1,
                    &fx.ws,
                    None,
                );
                assert!(out.status.success(), "{}", context(&out));
                runs += 1;
            }
            runs
        });
        let out = run_probe_tree(
            &[
                "--policy",
                "workspace-write",
                "--cwd",
                ws,
                "--audit",
                s(&report),
            ],
            &ops,
            2,
            &fx.ws,
            None,
        );
        stop.store(true, Ordering::SeqCst);
        assert!(out.status.success(), "{}", context(&out));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            stderr.contains("sandbox-run: audit: 12 denials in 5 groups by seccomp, mount"),
            "{stderr}"
        );
        noise.join().unwrap()
    });
    assert!(unrelated_runs >= 1);

    let Jsonl {
        denials,
        groups,
        coverage,
    } = read_jsonl(&report);
    assert_eq!(coverage["audit"], true, "{coverage}");
    assert_eq!(coverage["complete"], true, "{coverage}");
    assert_eq!(coverage["gaps"], serde_json::json!([]), "{coverage}");
    assert_eq!(coverage["denials"], 12, "{coverage}");
    // Each distinct target is listed once; repeats are only counted in their group.
    let listed: BTreeMap<_, _> = [
        key("mount", "fs.write_file", outside_file),
        key("mount", "fs.make_reg", outside),
        key("mount", "fs.make_dir", outside),
        key("mount", "fs.write_file", &git_config),
        // seccomp refuses socket() itself (records carry no arguments: no family, no address)
        key("seccomp", "socket", "-"),
    ]
    .into_iter()
    .map(|k| (k, 1))
    .collect();
    pretty_assertions::assert_eq!(tally(&denials), listed);
    let grouped: BTreeMap<_, _> = [
        (key("mount", "fs.write_file", &format!("{outside}/")), 2),
        (key("mount", "fs.make_reg", &format!("{outside}/")), 2),
        (key("mount", "fs.make_dir", &format!("{outside}/")), 2),
        (key("mount", "fs.write_file", &format!("{ws}/.git/")), 2),
        (key("seccomp", "socket", "-"), 4),
    ]
    .into_iter()
    .collect();
    pretty_assertions::assert_eq!(group_counts(&groups), grouped);
    let exe = common::probe_exe();
    for d in &denials {
        assert!(d["pid"].as_u64().is_some(), "{d}");
        assert_eq!(d["exe"].as_str(), Some(s(&exe)), "{d}");
        assert!(!d["allow_rule"].as_str().unwrap().is_empty(), "{d}");
    }
    let git = denials
        .iter()
        .find(|d| d["path"] == git_config.as_str())
        .unwrap();
    assert!(
        git["allow_rule"]
            .as_str()
            .unwrap()
            .contains("protected path"),
        "{git}"
    );
    fx.assert_outside_untouched("audited run");
}

#[test]
fn landlock_denials_are_reported_without_the_namespace_layer() {
    let _guard = require_audit();
    let fx = Fixture::new(None);
    let report = fx.ws.join("../landlock.jsonl");
    let (ws, outside, outside_file) = (s(&fx.ws), s(&fx.outside), s(&fx.outside_file));
    let out = run_probe_tree(
        &[
            "--policy",
            "workspace-write",
            "--cwd",
            ws,
            "--no-namespaces",
            "--best-effort",
            "--audit",
            s(&report),
        ],
        &[
            "write",
            outside_file,
            ";",
            "mkdir",
            &format!("{outside}/d"),
            ";",
            "write",
            &format!("{ws}/ok.txt"),
        ],
        1,
        &fx.ws,
        None,
    );
    assert!(out.status.success(), "{}", context(&out));
    let Jsonl {
        denials, coverage, ..
    } = read_jsonl(&report);
    assert_eq!(coverage["landlock"], true, "{coverage}");
    assert_eq!(coverage["complete"], true, "{coverage}");
    let expected: BTreeMap<_, _> = [
        (key("landlock", "fs.write_file", outside_file), 1),
        (key("landlock", "fs.make_dir", outside), 1),
    ]
    .into_iter()
    .collect();
    pretty_assertions::assert_eq!(tally(&denials), expected);
    assert!(denials.iter().all(|d| d["pid"].as_u64().is_some()));
}
