use super::*;
use clap::Parser;
use pretty_assertions::assert_eq;
use std::collections::BTreeMap;

fn args(argv: &[&str]) -> ExecArgs {
    match crate::cli::Cli::try_parse_from(argv).map(|cli| cli.command) {
        Ok(Some(crate::cli::Command::Exec(args))) => args,
        other => panic!("not an exec command line: {other:?}"),
    }
}

#[test]
fn a_denial_line_names_the_operation_path_and_rule_and_escapes_control_characters() {
    let record = serde_json::json!({"kind": "denial", "operation": "fs.make_reg",
        "path": "/srv/x\u{1b}[2J", "exe": "/usr/bin/dash",
        "allow_rule": "\"/srv\" = \"write\""});
    assert_eq!(
        describe_denial(&record).unwrap(),
        "denied fs.make_reg /srv/x\\u{1b}[2J by /usr/bin/dash — allow: \"/srv\" = \"write\""
    );
    let blind = serde_json::json!({"kind": "coverage", "audit": false});
    assert!(
        describe_denial(&blind)
            .unwrap()
            .contains("not a clean report")
    );
    let clean =
        serde_json::json!({"kind": "coverage", "audit": true, "denials": 0, "complete": true});
    assert_eq!(describe_denial(&clean).unwrap(), "audit: 0 denial(s)");
    assert_eq!(describe_denial(&serde_json::json!({"kind": "group"})), None);
}

fn local_env() -> Vec<(String, String)> {
    [
        ("PATH", "/p"),
        ("HOME", "/h"),
        ("SECRET", "s"),
        ("TERM", "vt100"),
    ]
    .iter()
    .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
    .collect()
}

#[test]
fn default_env_forwards_only_the_listed_variables_and_env_flags_override() {
    let args = args(&[
        "exec-server",
        "exec",
        "--connect",
        "ws://127.0.0.1:1",
        "--env",
        "HOME=/x",
        "--env",
        "A=b=c",
        "--",
        "prog",
        "arg",
    ]);
    let params = start_params(&args, local_env(), &Some(PathBuf::from("/work"))).unwrap();
    let env: Vec<(&str, &str)> = params
        .env
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    assert_eq!(
        env,
        vec![
            ("A", "b=c"),
            ("HOME", "/x"),
            ("PATH", "/p"),
            ("TERM", "vt100")
        ]
    );
    assert_eq!(params.argv, vec!["prog", "arg"]);
    assert_eq!(params.cwd.to_uri_string(), "file:///work");
    assert!(params.pipe_stdin && !params.tty);
    assert_eq!(params.sandbox, None);
}

#[test]
fn clear_env_starts_empty_and_tty_gets_a_term() {
    let args = args(&[
        "exec-server",
        "exec",
        "--connect",
        "unix:/s",
        "--clear-env",
        "--tty",
        "--sandbox",
        "read-only",
        "--cwd",
        "/tmp",
        "--",
        "cat",
    ]);
    let params = start_params(&args, local_env(), &None).unwrap();
    assert_eq!(
        params.env,
        BTreeMap::from([("TERM".to_owned(), FALLBACK_TERM.to_owned())])
    );
    assert_eq!(
        params.sandbox,
        Some(serde_json::json!({"profile": "read-only", "cwd": "file:///tmp"}))
    );
    assert!(params.tty && !params.pipe_stdin);
    assert_eq!(params.cwd.to_uri_string(), "file:///tmp");
}

#[test]
fn malformed_env_is_refused() {
    let args = args(&[
        "exec-server",
        "exec",
        "--connect",
        "unix:/s",
        "--env",
        "NOEQUALS",
        "--",
        "true",
    ]);
    assert!(matches!(
        start_params(&args, local_env(), &None),
        Err(ExecCommandError::InvalidEnv(_))
    ));
}

#[test]
fn remote_takes_the_token_from_the_file_or_else_the_environment() {
    let remote = [
        "exec-server",
        "exec",
        "--remote",
        "http://127.0.0.1:7700",
        "--environment-id",
        "laptop",
        "--",
        "uname",
    ];
    let target = |file: Option<&str>, env: Option<&str>| {
        exec_target(
            &args(&remote),
            file.map(str::to_owned),
            env.map(str::to_owned),
        )
    };
    let token_of = |target: Result<ExecTarget, ExecCommandError>| match target {
        Ok(ExecTarget::Remote(args)) => {
            assert_eq!(args.relay.registry_url, "http://127.0.0.1:7700");
            assert_eq!(args.relay.environment_id, "laptop");
            args.relay.bearer_token
        }
        other => panic!("not a remote target: {other:?}"),
    };
    assert_eq!(token_of(target(None, Some(" from-env\n"))), "from-env");
    assert_eq!(
        token_of(target(Some("from-file"), Some("env"))),
        "from-file"
    );
    assert!(matches!(
        target(None, Some("  ")),
        Err(ExecCommandError::MissingRegistryToken)
    ));
    assert!(matches!(
        target(None, None),
        Err(ExecCommandError::MissingRegistryToken)
    ));
}

#[test]
fn connect_and_remote_are_mutually_exclusive_and_one_is_required() {
    let parse = |argv: &[&str]| crate::cli::Cli::try_parse_from(argv).map(|_| ());
    assert!(
        parse(&[
            "exec-server",
            "exec",
            "--connect",
            "ws://127.0.0.1:1",
            "--remote",
            "http://127.0.0.1:2",
            "--environment-id",
            "e",
            "--",
            "true",
        ])
        .is_err()
    );
    assert!(parse(&["exec-server", "exec", "--", "true"]).is_err());
    assert!(
        parse(&[
            "exec-server",
            "exec",
            "--remote",
            "http://127.0.0.1:2",
            "--",
            "true"
        ])
        .is_err(),
        "--remote needs --environment-id"
    );
    let local = exec_target(
        &args(&["exec-server", "exec", "--connect", "unix:/s", "--", "true"]),
        Some("t".into()),
        Some("ignored".into()),
    );
    match local {
        Ok(ExecTarget::Local(options)) => {
            assert_eq!(
                (options.url.as_str(), options.auth_token.as_deref()),
                ("unix:/s", Some("t"))
            );
        }
        other => panic!("not a local target: {other:?}"),
    }
}

#[test]
fn tty_without_a_terminal_on_stdin_falls_back_to_pipes_with_a_warning() {
    let argv = [
        "exec-server",
        "exec",
        "--connect",
        "unix:/s",
        "--tty",
        "--",
        "bash",
    ];
    let mut on_terminal = args(&argv);
    assert_eq!(tty_fallback(&mut on_terminal, true), None);
    assert!(on_terminal.tty);
    let mut piped = args(&argv);
    let warning = tty_fallback(&mut piped, false).unwrap();
    assert!(warning.contains("stdin is not a terminal"), "{warning}");
    assert!(!piped.tty);
    let params = start_params(&piped, local_env(), &Some(PathBuf::from("/"))).unwrap();
    assert!(params.pipe_stdin && !params.tty);
    let mut plain = args(
        &argv[..4]
            .iter()
            .chain(&argv[5..])
            .copied()
            .collect::<Vec<_>>(),
    );
    assert_eq!(tty_fallback(&mut plain, false), None);
}

#[test]
fn a_401_says_which_flag_fixes_it() {
    let unauthorized = |token_sent| {
        with_hint(ExecCommandError::Client(ExecServerError::Unauthorized {
            endpoint: "ws://127.0.0.1:1".into(),
            token_sent,
            reason: String::new(),
        }))
        .to_string()
    };
    let without = unauthorized(false);
    assert!(
        without.contains("401 Unauthorized") && without.contains("pass --token-file FILE"),
        "{without}"
    );
    let wrong = unauthorized(true);
    assert!(wrong.contains("check that --token-file holds"), "{wrong}");
}

#[test]
fn exit_status_passes_codes_through() {
    assert_eq!(exit_status(3), 3);
    assert_eq!(exit_status(130), 130);
    assert_eq!(exit_status(-1), 0);
    assert_eq!(exit_status(300), 255);
}
