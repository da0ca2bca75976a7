//! Policies: wire `sandbox` objects, every profile in policies/, and the documented rendezvous
//! TOML validate exactly as their deserializers accept them.

use super::*;

/// Wire `sandbox` objects: every source, spelling and common key, and mutated copies.
fn sandbox_corpus() -> Vec<Value> {
    let entries = json!([
        {"path": {"type": "path", "path": "/ws"}, "access": "write"},
        {"path": {"type": "special", "value": {"kind": "root"}}, "access": "read"},
        {"path": {"type": "glob_pattern", "pattern": "**/*.pem"}, "access": "none"},
        {"path": {"type": "special", "value": {"kind": "project_roots", "subpath": "src"}}, "access": "write"},
        {"path": {"type": "special", "value": {"kind": "a_newer_special"}}, "access": "read"},
        {"path": {"type": "special", "value": {"kind": "tmpdir"}}, "access": "deny"}
    ]);
    vec![
        // Named profiles, both spellings of the knobs, every common key.
        json!({"profile": "workspace-write", "cwd": "file:///ws"}),
        json!({"profile": "read-only", "writable_roots": ["/x"], "network_access": true,
               "exclude_slash_tmp": true, "exclude_tmpdir_env_var": false}),
        json!({"profile": "workspace-write", "writableRoots": ["/x"], "networkAccess": false,
               "excludeSlashTmp": true, "excludeTmpdirEnvVar": true, "cwd": "/ws",
               "workspaceRoots": ["file:///ws", "/ws2"],
               "network": {"allow": ["pypi.org", {"pattern": "github.com", "tunnel": "any"}], "deny": []},
               "readableCredentialStores": ["~/.aws"], "allowances": ["toolchain-caches"],
               "denyPaths": ["/ws/secrets"], "allowUnixSockets": ["/run/agent.sock"]}),
        json!({"profile": "read-only", "network": "on", "cwd": null, "workspaceRoots": null,
               "windowsSandboxLevel": "elevated", "useLegacyLandlock": true}),
        json!({"profile": "read-only", "network": true}),
        json!({"profile": "read-only", "network": "restricted"}),
        // The legacy policy, flattened, both spellings of types and fields.
        json!({"type": "read-only"}),
        json!({"type": "readOnly", "networkAccess": true, "cwd": "/ws"}),
        json!({"type": "workspace-write", "writable_roots": ["/x"], "network_access": true,
               "exclude_slash_tmp": true, "cwd": "file:///ws", "denyPaths": ["/ws/.env"]}),
        json!({"type": "workspaceWrite", "writableRoots": ["/x"], "excludeTmpdirEnvVar": true}),
        json!({"type": "danger-full-access"}),
        json!({"type": "dangerFullAccess"}),
        json!({"type": "external-sandbox", "network_access": "enabled"}),
        json!({"type": "externalSandbox"}),
        // Nested, as older reference clients send it.
        json!({"sandboxPolicy": {"type": "workspace-write"}, "sandboxPolicyCwd": "file:///ws"}),
        json!({"sandboxPolicy": {"type": "readOnly"}, "cwd": "/ws"}),
        // The permission profile, tagged and untagged.
        json!({"permissions": {"type": "managed", "file_system": {"type": "restricted",
               "entries": entries, "glob_scan_max_depth": 3}, "network": "enabled"},
               "cwd": "file:///ws", "writableRoots": ["/tmp/x"]}),
        json!({"permissions": {"type": "managed", "file_system": {"type": "unrestricted"}}}),
        json!({"permissions": {"type": "disabled"}}),
        json!({"permissions": {"type": "external", "network": "restricted"}}),
        json!({"permissions": {"network": {"enabled": true}, "file_system": {"entries": [
               {"path": {"type": "path", "path": "/ws"}, "access": "read"}]}}, "cwd": "/ws"}),
        json!({"permissions": {}}),
        // A profile file's text.
        json!({"profileToml": "network = \"on\"\n[filesystem]\n\":root\" = \"read\"\n",
               "cwd": "/ws", "writableRoots": ["/x"]}),
        // Refused: wrong types.
        json!("workspace-write"),
        json!({"profile": 3}),
        json!({"profile": "read-only", "cwd": 3}),
        json!({"profile": "read-only", "cwd": "relative/dir"}),
        json!({"type": "read-only", "networkAccess": "yes"}),
        json!({"profile": "read-only", "workspaceRoots": "file:///ws"}),
        json!({"profile": "read-only", "denyPaths": [3]}),
        json!({"profile": "read-only", "network": "sometimes"}),
        json!({"profile": "read-only", "network": {"allow": "pypi.org"}}),
        json!({"profileToml": 3}),
        json!({"permissions": {"type": "managed", "file_system": {"type": "restricted",
               "entries": [{"path": {"type": "path", "path": "/ws"}, "access": "execute"}]}}}),
        json!({"permissions": {"network": {"enabled": "yes"}}}),
        // Refused: unknown keys where the deserializer denies them.
        json!({"profile": "read-only", "bogus": 1}),
        json!({"type": "read-only", "writableRoots": ["/x"]}),
        json!({"type": "no-such-type"}),
        json!({"permissions": {"type": "disabled"}, "profile": "read-only"}),
        json!({"sandboxPolicy": {"type": "read-only"}, "writableRoots": ["/x"]}),
        json!({"sandboxPolicy": {"type": "read-only", "bogus": true}}),
        json!({"permissions": {"network": {"enabled": true}, "bogus": 1}}),
        json!({"permissions": {"type": "managed", "file_system": {"type": "restricted",
               "entries": [{"path": {"type": "path", "path": "/ws", "extra": 1}, "access": "read"}]}}}),
        json!({"profileToml": "", "type": "read-only"}),
        json!({"profile": "read-only", "network": {"allow": [], "bogus": []}}),
        // Refused: both spellings of one field.
        json!({"profile": "read-only", "writableRoots": [], "writable_roots": []}),
        json!({"type": "read-only", "networkAccess": true, "network_access": true}),
        // Refused: missing required fields.
        json!({}),
        json!({"cwd": "/ws"}),
        json!({"permissions": {"type": "managed"}}),
        json!({"permissions": {"type": "managed", "file_system": {"type": "restricted"}}}),
        json!({"permissions": {"type": "managed", "file_system": {"type": "restricted",
               "entries": [{"path": {"type": "path", "path": "/ws"}}]}}}),
        json!({"permissions": {"type": "managed", "file_system": {"type": "restricted",
               "entries": [{"path": {"type": "special", "value": {}}, "access": "read"}]}}}),
        json!({"profile": "read-only", "network": {"allow": [{"tunnel": "any"}]}}),
    ]
}

#[test]
fn the_sandbox_schema_accepts_exactly_what_the_deserializer_accepts() {
    let generated = generate();
    let schemas = BTreeMap::from([("sandbox".to_owned(), generated["sandbox.json"].clone())]);
    let corpus = sandbox_corpus();
    let expected: Vec<bool> = corpus
        .iter()
        .map(|value| sandbox::policy::SandboxSpec::try_from(value.clone()).is_ok())
        .collect();
    let accepted = expected.iter().filter(|ok| **ok).count();
    assert!(
        accepted >= 20 && corpus.len() - accepted >= 30,
        "the corpus must hold accepted and refused objects ({accepted} of {} accepted)",
        corpus.len()
    );
    let cases: Vec<Case> = corpus
        .into_iter()
        .enumerate()
        .map(|(i, instance)| Case {
            label: format!(
                "sandbox #{i} (deserializer: {})",
                if expected[i] { "accepts" } else { "refuses" }
            ),
            schema: "sandbox".into(),
            instance,
        })
        .collect();
    assert_verdicts(&schemas, &cases, &expected);
}

fn toml_to_json(text: &str) -> Value {
    toml::from_str(text).unwrap_or_else(|e| panic!("not TOML: {e}\n{text}"))
}

#[test]
fn every_profile_in_policies_validates_and_mutated_ones_are_refused() {
    let generated = generate();
    let schemas = BTreeMap::from([("profile".to_owned(), generated["profile.json"].clone())]);
    let mut texts: Vec<(String, String)> = Vec::new();
    let dir = repo().join("policies");
    let mut files = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        // The deny set of credential stores is a data file of another format (`[[store]]`),
        // read by sandbox::policy::credentials; every other top-level .toml is a profile.
        if !name.ends_with(".toml") || name == "credential-stores.toml" {
            continue;
        }
        files += 1;
        let text = std::fs::read_to_string(&path).unwrap();
        texts.push((name.clone(), text.clone()));
        for (what, line) in [
            ("wrong type", "description = 1"),
            ("wrong type", "network = 3"),
            ("wrong type", "protected_subpaths = \".git\""),
            ("unknown field", "bogus = true"),
            ("unknown mode", "network = \"sometimes\""),
            (
                "both spellings",
                "allow_unix_sockets = []\nallowUnixSockets = []",
            ),
            (
                "missing pattern",
                "network = { allow = [{ tunnel = \"any\" }] }",
            ),
            ("unknown allow key", "network = { allow = [], bogus = [] }"),
            ("alias", "allowUnixSockets = [\"/run/agent.sock\"]"),
            (
                "allowlist",
                "network = { allow = [\"pypi.org\", { pattern = \"github.com\", tunnel = \"any\" }] }",
            ),
            ("mode", "network = \"enabled\""),
        ] {
            // Top-level keys go before the first table; drop a key the line sets again.
            let key = line.split([' ', '=']).next().unwrap();
            let kept: String = text
                .lines()
                .filter(|l| !l.starts_with(&format!("{key} ")))
                .map(|l| format!("{l}\n"))
                .collect();
            texts.push((
                format!("{name} with {what}: {line}"),
                format!("{line}\n{kept}"),
            ));
        }
        if text.contains("[filesystem]") {
            texts.push((
                format!("{name} with an access of the wrong kind"),
                text.replace("\"read\"", "\"rwx\""),
            ));
            texts.push((
                format!("{name} with full access and entries"),
                format!("full_filesystem_access = true\n{text}"),
            ));
            // [filesystem] is the last table: entries appended land in it.
            for key in [
                ":rooot",
                "relative/dir",
                ":cwd/sub",
                "",
                "**/*.pem",
                "[ab]*.key",
                ":project_roots/build",
                ":workspace_roots",
                ":current_working_directory",
                "/var/cache/ccache",
            ] {
                texts.push((
                    format!("{name} with entry {key:?}"),
                    format!("{text}\n\"{key}\" = \"write\"\n"),
                ));
            }
        }
    }
    assert!(files >= 3, "policies/ holds the built-in profiles");
    // The profile examples of the READMEs (every ```toml block with a [filesystem] table).
    for doc in ["README.md", "policies/README.md"] {
        let text = std::fs::read_to_string(repo().join(doc)).unwrap();
        let examples: Vec<&str> = text
            .split("```toml\n")
            .skip(1)
            .map(|block| block.split("```").next().unwrap())
            .filter(|block| block.contains("[filesystem]"))
            .collect();
        assert!(!examples.is_empty(), "{doc} shows a profile");
        texts.extend(
            examples
                .into_iter()
                .map(|example| (format!("the example of {doc}"), example.to_owned())),
        );
    }
    let expected: Vec<bool> = texts
        .iter()
        .map(|(_, text)| sandbox::policy::ProfileFile::parse(text, "test").is_ok())
        .collect();
    let accepted = expected.iter().filter(|ok| **ok).count();
    assert!(accepted >= files * 4 && texts.len() - accepted >= files * 8);
    let cases: Vec<Case> = texts
        .iter()
        .map(|(label, text)| Case {
            label: label.clone(),
            schema: "profile".into(),
            instance: toml_to_json(text),
        })
        .collect();
    let verdicts = assert_verdicts(&schemas, &cases, &expected);
    // Every profile file as shipped, and every example, validates (not only agrees with the
    // parser).
    for ((label, _), (valid, error)) in texts.iter().zip(&verdicts) {
        if !label.contains(" with ") {
            assert!(valid, "{label}: {error}");
        }
    }
}

#[test]
fn the_documented_rendezvous_toml_validates_and_mutated_copies_do_not() {
    let generated = generate();
    let schemas = BTreeMap::from([(
        "rendezvous".to_owned(),
        generated["rendezvous.json"].clone(),
    )]);
    let doc = std::fs::read_to_string(repo().join("docs/remote.md")).unwrap();
    let example = doc
        .split("```toml\n")
        .skip(1)
        .map(|block| block.split("```").next().unwrap())
        .find(|block| block.contains("[[executor]]"))
        .expect("docs/remote.md shows a rendezvous.toml in a ```toml block");
    assert!(
        ["[[harness]]", "[[admin]]", "[[environment]]"]
            .iter()
            .all(|table| example.contains(table)),
        "the example shows every table"
    );
    let mut cases = vec![("docs/remote.md".to_owned(), toml_to_json(example), true)];
    for (what, from, to) in [
        ("token of the wrong type", "token = \"", "token = 7 # \""),
        (
            "environments of the wrong type",
            "environments = [",
            "environments = 1 # [",
        ),
        ("unknown table", "[[admin]]", "[[auditor]]"),
        ("unknown key", "[[admin]]\n", "[[admin]]\nrole = \"all\"\n"),
        (
            "executor without environments",
            "environments = [",
            "# environments = [",
        ),
        ("pin without public_key", "public_key =", "# public_key ="),
    ] {
        assert!(example.contains(from), "the example has {from:?}");
        cases.push((
            format!("docs/remote.md with {what}"),
            toml_to_json(&example.replacen(from, to, 1)),
            false,
        ));
    }
    let expected: Vec<bool> = cases.iter().map(|(_, _, ok)| *ok).collect();
    let cases: Vec<Case> = cases
        .into_iter()
        .map(|(label, instance, _)| Case {
            label,
            schema: "rendezvous".into(),
            instance,
        })
        .collect();
    assert_verdicts(&schemas, &cases, &expected);
}
