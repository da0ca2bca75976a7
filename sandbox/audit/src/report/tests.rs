use super::*;
use crate::limits::RECORD_LINE_MAX_BYTES;
use pretty_assertions::assert_eq;

fn denial(op: &str, path: Option<&str>, layer: Layer) -> Denial {
    Denial {
        time: "2025-01-01T00:00:00.000Z".to_owned(),
        pid: Some(10),
        exe: Some("/usr/bin/touch".to_owned()),
        layer,
        operation: op.to_owned(),
        path: path.map(str::to_owned),
        address: None,
        syscall: Some("openat".to_owned()),
        errno: None,
        allow_rule: String::new(),
    }
}

fn full() -> Coverage {
    Coverage {
        audit: true,
        landlock: true,
        seccomp: true,
        mount: true,
        unexplained: true,
        complete: true,
        gaps: Vec::new(),
    }
}

fn run(denials: Vec<Denial>, coverage: Coverage) -> RunAudit {
    let mut aggregate = Aggregate::new();
    for d in denials {
        aggregate.add(d, |_| "\"/out\" = \"write\"".to_owned());
    }
    RunAudit {
        command: vec!["make".to_owned()],
        root: std::path::PathBuf::from("/repo"),
        exit_status: 0,
        aggregate,
        coverage,
    }
}

#[test]
fn summary_groups_by_operation_and_directory() {
    let audit = run(
        vec![
            denial("fs.write_file", Some("/out/a"), Layer::Mount),
            denial("fs.write_file", Some("/out/b"), Layer::Mount),
            denial("fs.make_dir", Some("/out"), Layer::Landlock),
        ],
        full(),
    );
    let text = summary(&audit);
    assert!(
        text.starts_with("sandbox-run: audit: 3 denials in 2 groups by landlock, mount\n"),
        "{text}"
    );
    assert!(text.contains("fs.write_file  /out/     2"), "{text}");
    assert!(text.contains("fs.make_dir    /out/     1"), "{text}");
    assert!(!text.contains("INCOMPLETE"), "{text}");
}

#[test]
fn jsonl_lists_examples_then_groups_then_totals() {
    let mut denials = Vec::new();
    for i in 0..10 {
        denials.push(denial(
            "fs.write_file",
            Some(&format!("/out/{}", i % 5)),
            Layer::Mount,
        ));
    }
    let audit = run(denials, full());
    let lines: Vec<serde_json::Value> = jsonl(&audit)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let kinds: Vec<&str> = lines.iter().map(|l| l["kind"].as_str().unwrap()).collect();
    assert_eq!(
        kinds,
        ["denial", "denial", "denial", "denial", "group", "coverage"]
    );
    assert_eq!(lines[0]["group"], 0);
    assert_eq!(lines[0]["path"], "/out/0");
    assert_eq!(lines[4]["count"], 10);
    assert_eq!(lines[4]["listed"], 4);
    assert_eq!(lines[4]["prefix"], "/out/");
    let coverage = &lines[5];
    assert_eq!(
        (
            &coverage["denials"],
            &coverage["listed"],
            &coverage["aggregated"]
        ),
        (
            &serde_json::json!(10),
            &serde_json::json!(4),
            &serde_json::json!(6)
        )
    );
    assert_eq!(coverage["complete"], true);
    assert!(summary(&audit).contains("6 of them aggregated"));
}

#[test]
fn incomplete_reports_never_read_as_clean() {
    let coverage = Coverage {
        complete: false,
        gaps: vec!["the command tried to stack a seccomp filter of its own".to_owned()],
        ..full()
    };
    let audit = run(Vec::new(), coverage);
    let text = summary(&audit);
    assert!(
        text.starts_with("sandbox-run: audit: no denials observed, but the audit is INCOMPLETE"),
        "{text}"
    );
    assert!(text.contains("gap: the command tried"), "{text}");
    assert_eq!(
        github(&audit, true),
        "::error title=Sandbox audit incomplete::the command tried to stack a seccomp filter \
         of its own\n"
    );
}

#[test]
fn blind_reports_say_so_in_every_format() {
    let audit = run(
        Vec::new(),
        Coverage::blind("joining the audit multicast group failed"),
    );
    assert!(summary(&audit).contains("UNAVAILABLE"));
    assert!(!summary(&audit).contains("no denials"));
    assert!(github(&audit, true).starts_with("::warning title=Sandbox audit unavailable::"));
    let last = jsonl(&audit);
    let value: serde_json::Value = serde_json::from_str(last.trim()).unwrap();
    assert_eq!(value["kind"], "coverage");
    assert_eq!(value["audit"], false);
}

#[test]
fn github_annotations_escape_their_properties() {
    let audit = run(
        vec![denial("fs.write_file", Some("/out/a,b"), Layer::Landlock)],
        full(),
    );
    let text = github(&audit, false);
    assert_eq!(
        text,
        "::warning title=Sandbox denied fs.write_file (landlock)::/out/a,b denied 1x to \
         /usr/bin/touch; allow: \"/out\" = \"write\"\n"
    );
}

#[test]
fn markdown_renders_one_row_per_group_with_hostile_paths_escaped() {
    let hostile = "/out/a|b\n| forged | row |![x](https://t.example/p)";
    let audit = run(
        vec![
            denial("fs.write_file", Some("/out/a"), Layer::Mount),
            denial("fs.write_file", Some("/out/b"), Layer::Mount),
            denial("fs.make_dir", Some(hostile), Layer::Landlock),
            denial("socket", None, Layer::Seccomp),
        ],
        full(),
    );
    let text = markdown(&audit, true);
    let rows: Vec<&str> = text.lines().filter(|l| l.starts_with('|')).collect();
    assert_eq!(
        rows,
        [
            "| layer | operation | where | count | allow |",
            "|---|---|---|---:|---|",
            "| mount | fs.write\\_file | /out/ \\(e.g. /out/a, /out/b\\) | 2 | \"/out\" = \"write\" |",
            "| landlock | fs.make\\_dir | /out/a\\|b\\\\x0a\\| forged \\| row \\|\\!\\[x\\]\\(https\\://t.example/p\\) | 1 | \"/out\" = \"write\" |",
            "| seccomp | socket | - | 1 | \"/out\" = \"write\" |",
        ],
        "{text}"
    );
    assert!(
        text.contains("**4 denials in 3 groups** by landlock, seccomp, mount"),
        "{text}"
    );
    // Every row has exactly the table's five cells: no `|` of a path ends a cell.
    for row in &rows {
        let cells = row.replace("\\|", "").matches('|').count();
        assert_eq!(cells, 6, "{row}");
    }
}

#[test]
fn markdown_never_reads_as_clean_when_blind_or_incomplete() {
    let blind = run(Vec::new(), Coverage::blind("no CAP_AUDIT_READ"));
    let text = markdown(&blind, false);
    assert!(text.contains("Audit unavailable"), "{text}");
    assert!(!text.contains("No denials observed"), "{text}");
    let incomplete = run(
        Vec::new(),
        Coverage {
            complete: false,
            gaps: vec!["the audit socket overflowed".to_owned()],
            ..full()
        },
    );
    let text = markdown(&incomplete, false);
    assert!(text.contains("**incomplete**"), "{text}");
    assert!(text.contains("- the audit socket overflowed"), "{text}");
    assert_eq!(
        markdown(&run(Vec::new(), full()), false),
        "### Sandbox denials\n\nNo denials observed.\n"
    );
}

#[test]
fn a_path_of_control_characters_cannot_forge_summary_lines() {
    let path = "/out/x\nsandbox-run: audit: no denials observed\u{1b}[1A";
    let audit = run(
        vec![denial("fs.write_file", Some(path), Layer::Mount)],
        full(),
    );
    let text = summary(&audit);
    assert_eq!(text.lines().count(), 2, "{text}");
    assert!(!text.contains('\u{1b}'), "{text}");
}

#[test]
fn every_line_stays_under_the_shared_cap_whatever_the_command_chose() {
    let evil = "\u{1}".repeat(100_000);
    let mut d = denial(&evil, Some(&format!("/{evil}/{evil}")), Layer::Unexplained);
    d.exe = Some(evil.clone());
    d.syscall = Some(evil.clone());
    d.address = Some(evil.clone());
    d.errno = Some(evil.clone());
    d.time = evil.clone();
    let mut aggregate = Aggregate::new();
    aggregate.add(d, |d| format!("{} {:?}", evil, d.path));
    let coverage = Coverage {
        gaps: vec!["x".repeat(400); 8],
        ..full()
    };
    let audit = RunAudit {
        command: vec![evil.clone()],
        root: std::path::PathBuf::from("/repo"),
        exit_status: 0,
        aggregate,
        coverage,
    };
    for line in jsonl(&audit).split_inclusive('\n') {
        assert!(line.len() <= RECORD_LINE_MAX_BYTES, "{} bytes", line.len());
    }
}
