//! Each denial names the rule that refused it.

use super::*;

#[test]
fn advice_names_the_rule_that_refused_each_denial() {
    let _guard = require_audit();
    let fx = Fixture::new(None);
    let root = fx.ws.parent().unwrap().to_path_buf();
    let (ws, outside_file) = (s(&fx.ws), s(&fx.outside_file));
    let no_rule = root.join("norule.txt");
    std::fs::write(&no_rule, "x\n").unwrap();
    // Another user's private file: the sandbox holds no CAP_DAC_OVERRIDE even as uid 0, so
    // opening it fails with EACCES that no layer logs.
    let private = root.join("private");
    std::fs::create_dir(&private).unwrap();
    let secret = private.join("secret");
    std::fs::write(&secret, "s\n").unwrap();
    std::os::unix::fs::chown(&secret, Some(NOBODY), Some(NOBODY)).unwrap();
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600)).unwrap();
    std::fs::create_dir(fx.ws.join("denied")).unwrap();
    std::fs::write(fx.ws.join("flagged.txt"), "f\n").unwrap();
    let exe_dir = common::probe_exe().parent().unwrap().to_path_buf();
    let profile = root.join("narrow.toml");
    std::fs::write(
        &profile,
        format!(
            "description = \"audit advice test\"\nnetwork = false\n[filesystem]\n\
             \":cwd\" = \"write\"\n\"/usr\" = \"read\"\n\"/lib\" = \"read\"\n\
             \"/lib64\" = \"read\"\n\"/bin\" = \"read\"\n\"/etc\" = \"read\"\n\
             \"{exe}\" = \"read\"\n\"{private}\" = \"read\"\n\"{outside}\" = \"read\"\n\
             \"{ws}/denied\" = \"deny\"\n",
            exe = exe_dir.display(),
            private = private.display(),
            outside = s(&fx.outside),
        ),
    )
    .unwrap();
    let git_config = format!("{ws}/.git/config");
    let denied = format!("{ws}/denied/x");
    let flagged = format!("{ws}/flagged.txt");
    let out = run_probe_tree(
        &[
            "--policy",
            s(&profile),
            "--cwd",
            ws,
            "--deny",
            "flagged.txt",
            "--audit",
            "-",
            "--fail-on-denial",
        ],
        &[
            "read",
            s(&no_rule),
            ";",
            "read",
            &denied,
            ";",
            "read",
            &flagged,
            ";",
            "write",
            &git_config,
            ";",
            "write",
            outside_file,
            ";",
            "read",
            s(&secret),
        ],
        1,
        &fx.ws,
        None,
    );
    let what = context(&out);
    assert_eq!(out.status.code(), Some(3), "{what}");
    let results = probe_results(&out.stdout);
    assert!(results.iter().all(|r| r["blocked"] == true), "{what}");
    let Jsonl {
        denials, coverage, ..
    } = jsonl_of_stdout(&out.stdout);
    assert_eq!(coverage["complete"], true, "{coverage}");
    let advice = |target: &str| -> (String, String) {
        let d = denials
            .iter()
            .find(|d| d["path"] == target)
            .unwrap_or_else(|| panic!("no denial of {target}: {what}"));
        (
            d["layer"].as_str().unwrap().to_owned(),
            d["allow_rule"].as_str().unwrap().to_owned(),
        )
    };
    let no_rule = s(&no_rule);
    let (_, rule) = advice(no_rule);
    assert_eq!(
        rule,
        format!(
            "no rule grants read on {no_rule} (a path no rule covers is denied): \
             \"{no_rule}\" = \"read\" in a profile file"
        )
    );
    let (_, rule) = advice(&denied);
    assert_eq!(
        rule,
        format!(
            "remove the deny entry \"{ws}/denied\" = \"deny\" of the policy, which covers {denied}"
        )
    );
    let (_, rule) = advice(&flagged);
    assert!(
        rule.starts_with(&format!("remove --deny {flagged}")),
        "{rule}"
    );
    let (_, rule) = advice(&git_config);
    assert!(
        rule.starts_with(&format!("{ws}/.git is a protected path")),
        "{rule}"
    );
    let (_, rule) = advice(outside_file);
    let outside = s(&fx.outside);
    assert_eq!(
        rule,
        format!("\"{outside}\" = \"write\" (sandbox-run --writable-root {outside})")
    );
    let (layer, rule) = advice(s(&secret));
    assert_eq!(layer, "unexplained", "{rule}");
    assert!(rule.contains("the file's own mode or owner"), "{rule}");
}
