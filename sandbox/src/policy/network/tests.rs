use super::*;
use pretty_assertions::assert_eq;
use std::net::IpAddr;

fn rules(allow: &[&str], deny: &[&str]) -> EgressRules {
    let owned = |list: &[&str]| list.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
    EgressRules::parse(&owned(allow), &owned(deny)).unwrap()
}

fn name(text: &str) -> Host {
    Host::parse(text).unwrap()
}

fn hosts(prefix: &str, n: usize) -> Vec<String> {
    (0..n).map(|i| format!("h{i}.{prefix}.test")).collect()
}

#[test]
fn request_rules_parse_in_both_forms_and_limit_only_when_every_match_limits() {
    let limited = rules(
        &[
            "pypi.org methods=read-only paths=/simple/,/packages/",
            "files.test methods=GET",
        ],
        &[],
    );
    let scope = limited.request_scope(&name("pypi.org"), 443);
    assert!(scope.is_limited());
    assert!(scope.permits("GET", "/simple/requests/"));
    assert!(scope.permits("HEAD", "/packages/x.whl?sha=1"));
    for (method, target) in [
        ("POST", "/simple/requests/"),
        ("PUT", "/packages/x"),
        ("GET", "/legacy/"),
        ("GET", "/simple/../legacy/"),
        ("GET", "/simple/%2e%2e/legacy/"),
        ("GET", "/simple/%2F..%2Flegacy"),
        ("GET", "/simple\\..\\legacy"),
        ("GET", "/simple/..;/legacy"),
        ("GET", "/simple/%252e%252e/legacy"),
        ("GET", "//evil/simple/"),
        ("GET", "simple/"),
        ("get", "/simple/"),
    ] {
        assert!(!scope.permits(method, target), "{method} {target}");
    }
    assert_eq!(
        scope.describe(),
        "methods=GET,HEAD,OPTIONS paths=/packages/,/simple/"
    );
    let files = limited.request_scope(&name("files.test"), 80);
    assert!(files.permits("GET", "/anything") && !files.permits("POST", "/anything"));
    // One matching pattern without limits lifts them.
    let both = rules(&["pypi.org methods=GET", "pypi.org:443"], &[]);
    assert_eq!(
        both.request_scope(&name("pypi.org"), 443),
        RequestScope::Any
    );
    assert!(both.request_scope(&name("pypi.org"), 80).is_limited());
    // The table form says the same, and prints back as the string form.
    let table: AllowEntry = serde_json::from_value(serde_json::json!(
        {"pattern": "pypi.org", "methods": "read-only", "paths": ["/simple/"]}
    ))
    .unwrap();
    let pattern = HostPattern::parse(&table.to_pattern_text()).unwrap();
    assert_eq!(
        pattern.to_string(),
        "pypi.org methods=GET,HEAD,OPTIONS paths=/simple/"
    );
    assert_eq!(HostPattern::parse(&pattern.to_string()).unwrap(), pattern);
}

#[test]
fn inspect_parses_in_both_forms_and_inspects_only_limited_destinations() {
    let rules = EgressRules::parse(
        &[
            "a.test methods=read-only inspect=true".to_owned(),
            "b.test methods=GET".to_owned(),
        ],
        &[],
    )
    .unwrap();
    assert!(rules.inspects_any());
    let a = Host::parse("a.test").unwrap();
    assert!(rules.request_scope(&a, 443).inspects());
    assert!(
        !rules
            .request_scope(&Host::parse("b.test").unwrap(), 443)
            .inspects()
    );
    assert_eq!(
        rules.allow[0].to_string(),
        "a.test methods=GET,HEAD,OPTIONS inspect=true"
    );
    // An unlimited pattern for the same host lifts the limits, and with them inspection.
    let wider = rules.extended(&["a.test".to_owned()], &[]).unwrap();
    assert!(!wider.request_scope(&a, 443).inspects());
    let table: AllowEntry =
        serde_json::from_str(r#"{"pattern": "a.test", "methods": "read-only", "inspect": true}"#)
            .unwrap();
    assert_eq!(
        table.to_pattern_text(),
        "a.test methods=read-only inspect=true"
    );
    assert!(
        !EgressRules::parse(&["a.test methods=GET".to_owned()], &[])
            .unwrap()
            .inspects_any()
    );
}

#[test]
fn request_rules_that_cannot_hold_are_refused_when_parsed() {
    let owned = |list: &[&str]| list.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
    for (allow, deny, says) in [
        (
            &["a.test methods=get"][..],
            &[][..],
            "is not an HTTP method",
        ),
        (&["a.test methods="], &[], "is not an HTTP method"),
        (&["a.test paths=simple/"], &[], "is not a path prefix"),
        (&["a.test paths=/a/../b"], &[], "is not a path prefix"),
        (&["a.test paths=/a%2f"], &[], "is not a path prefix"),
        (&["a.test methods=GET methods=POST"], &[], "given twice"),
        (
            &["a.test methods=GET tunnel=any"],
            &[],
            "tunnel=any carries",
        ),
        (&["a.test verbs=GET"], &[], "is not a pattern setting"),
        (&["a.test inspect=true"], &[], "inspect=true needs methods="),
        (
            &["a.test methods=GET inspect=yes"],
            &[],
            "is not a pattern setting",
        ),
        (
            &["a.test methods=GET inspect=true inspect=true"],
            &[],
            "given twice",
        ),
        (&[], &["a.test methods=GET"], "apply to allow patterns only"),
    ] {
        let error = EgressRules::parse(&owned(allow), &owned(deny))
            .err()
            .unwrap_or_else(|| panic!("{allow:?} {deny:?} was accepted"))
            .to_string();
        assert!(error.contains(says), "{allow:?} {deny:?}: {error}");
    }
}

#[test]
fn an_allowlist_holds_max_egress_patterns_and_one_more_is_refused() {
    let at_limit = EgressRules::parse(&hosts("a", MAX_EGRESS_PATTERNS), &[]).unwrap();
    assert_eq!(at_limit.allow.len(), MAX_EGRESS_PATTERNS);
    for (allow, deny) in [
        (hosts("a", MAX_EGRESS_PATTERNS + 1), Vec::new()),
        (hosts("a", MAX_EGRESS_PATTERNS), hosts("d", 1)),
    ] {
        let err = EgressRules::parse(&allow, &deny).unwrap_err().to_string();
        assert!(err.contains("MAX_EGRESS_PATTERNS"), "{err}");
    }
    // Counted after named sets expand.
    let set = EgressRules::parse(&["@package-registries".to_owned()], &[])
        .unwrap()
        .allow
        .len();
    let mut allow = hosts("a", MAX_EGRESS_PATTERNS - set);
    allow.push("@package-registries".to_owned());
    EgressRules::parse(&allow, &[]).unwrap();
    allow.push("one-more.test".to_owned());
    let err = EgressRules::parse(&allow, &[]).unwrap_err().to_string();
    assert!(err.contains("MAX_EGRESS_PATTERNS"), "{err}");
}

#[test]
fn exact_host_allows_default_ports_only() {
    let r = rules(&["pypi.org"], &[]);
    assert_eq!(
        r.decide(&name("pypi.org"), 443),
        Decision::Allowed("pypi.org".into())
    );
    assert_eq!(
        r.decide(&name("pypi.org"), 80),
        Decision::Allowed("pypi.org".into())
    );
    assert_eq!(
        r.decide(&name("pypi.org"), 22),
        Decision::Denied(Refusal::NotAllowed)
    );
    assert_eq!(
        r.decide(&name("evil.pypi.org"), 443),
        Decision::Denied(Refusal::NotAllowed)
    );
}

#[test]
fn wildcard_matches_subdomains_not_the_domain_or_lookalikes() {
    let r = rules(&["*.crates.io"], &[]);
    assert!(matches!(
        r.decide(&name("static.crates.io"), 443),
        Decision::Allowed(_)
    ));
    assert!(matches!(
        r.decide(&name("a.b.crates.io"), 443),
        Decision::Allowed(_)
    ));
    for host in ["crates.io", "evilcrates.io", "crates.io.evil.com"] {
        assert_eq!(
            r.decide(&name(host), 443),
            Decision::Denied(Refusal::NotAllowed),
            "{host}"
        );
    }
}

#[test]
fn deny_wins_over_allow_on_every_port() {
    let r = rules(
        &["*.example.com", "example.com:8443"],
        &["secret.example.com"],
    );
    assert_eq!(
        r.decide(&name("secret.example.com"), 443),
        Decision::Denied(Refusal::DeniedByRule("secret.example.com".into()))
    );
    assert!(matches!(
        r.decide(&name("www.example.com"), 443),
        Decision::Allowed(_)
    ));
    assert!(matches!(
        r.decide(&name("example.com"), 8443),
        Decision::Allowed(_)
    ));
}

#[test]
fn names_are_case_insensitive_and_idna_normalised() {
    let r = rules(&["Bücher.Example"], &[]);
    assert_eq!(r.allow[0].to_string(), "xn--bcher-kva.example");
    assert!(matches!(
        r.decide(&name("xn--BCHER-kva.example."), 443),
        Decision::Allowed(_)
    ));
    assert!(matches!(
        r.decide(&name("BÜCHER.example"), 443),
        Decision::Allowed(_)
    ));
}

#[test]
fn ip_literals_are_reached_only_when_listed() {
    let r = rules(&["*.example.com", "127.0.0.1:8080", "[::1]:9000"], &[]);
    assert_eq!(
        r.decide(&name("93.184.216.34"), 443),
        Decision::Denied(Refusal::NotAllowed)
    );
    assert!(matches!(
        r.decide(&name("127.0.0.1"), 8080),
        Decision::Allowed(_)
    ));
    assert!(matches!(
        r.decide(&name("[::1]"), 9000),
        Decision::Allowed(_)
    ));
    assert!(r.address_allowed("127.0.0.1".parse().unwrap(), 8080, &|_| false));
    assert!(!r.address_allowed("127.0.0.1".parse().unwrap(), 8081, &|_| false));
    assert!(!r.address_allowed("169.254.169.254".parse().unwrap(), 80, &|_| false));
    assert!(!r.address_allowed("::ffff:10.0.0.1".parse().unwrap(), 443, &|_| false));
    assert!(r.address_allowed("93.184.216.34".parse().unwrap(), 443, &|_| false));
}

#[test]
fn embedded_ipv4_forms_are_checked_as_their_ipv4_address() {
    let r = rules(&["*.example.com", "127.0.0.1:8080"], &["11.22.33.5"]);
    for form in [
        "11.22.33.5",
        "::ffff:11.22.33.5",
        "::ffff:0:11.22.33.5",
        "::11.22.33.5",
        "64:ff9b::11.22.33.5",
        "64:ff9b:1::11.22.33.5",
    ] {
        let ip: IpAddr = form.parse().unwrap();
        assert_eq!(
            canonical_ip(ip),
            "11.22.33.5".parse::<IpAddr>().unwrap(),
            "{form}"
        );
        assert!(
            !r.address_allowed(ip, 443, &|_| false),
            "{form} passed the deny pattern"
        );
        assert!(
            matches!(r.decide(&Host::Ip(ip), 443), Decision::Denied(_)),
            "{form}"
        );
    }
    for form in ["::ffff:127.0.0.1", "64:ff9b::7f00:1", "::127.0.0.1"] {
        let ip: IpAddr = form.parse().unwrap();
        assert!(is_special_address(ip), "{form}");
        assert!(
            r.address_allowed(ip, 8080, &|_| false),
            "{form}: the named address"
        );
        assert!(!r.address_allowed(ip, 8081, &|_| false), "{form}");
    }
    // The control: public addresses, and IPv6 addresses that carry none, stay themselves.
    assert!(r.address_allowed("11.22.33.6".parse().unwrap(), 443, &|_| false));
    assert!(r.address_allowed("::ffff:11.22.33.6".parse().unwrap(), 443, &|_| false));
    for form in ["::1", "::", "2001:db8::1", "2606:4700::1"] {
        let ip: IpAddr = form.parse().unwrap();
        assert_eq!(canonical_ip(ip), ip, "{form}");
    }
    assert_eq!(name("[::ffff:10.0.0.1]"), name("10.0.0.1"));
}

#[test]
fn the_hosts_own_addresses_are_reached_only_when_named() {
    let r = rules(&["*.example.com", "11.22.33.5:8080"], &[]);
    let own: [IpAddr; 2] = [
        "11.22.33.5".parse().unwrap(),
        "2606:4700::5".parse().unwrap(),
    ];
    let is_own = |ip: IpAddr| own.contains(&ip);
    for form in ["11.22.33.5", "::ffff:11.22.33.5", "2606:4700::5"] {
        let ip: IpAddr = form.parse().unwrap();
        assert!(!r.address_allowed(ip, 443, &is_own), "{form}");
        // The control: not an address of this host, so public.
        assert!(r.address_allowed(ip, 443, &|_| false), "{form}");
    }
    assert!(r.address_allowed("11.22.33.5".parse().unwrap(), 8080, &is_own));
    assert!(r.address_allowed("11.22.33.6".parse().unwrap(), 443, &is_own));
}

#[test]
fn bad_patterns_are_refused_with_the_expected_form() {
    for bad in [
        "*",
        "*.com",
        "a*.example.com",
        "example.com:0",
        "example.com:99999",
        "exa mple.com",
        "",
        "@no-such-set",
    ] {
        let err = EgressRules::parse(&[bad.to_owned()], &[]).unwrap_err();
        assert!(err.to_string().contains("expected"), "{bad}: {err}");
    }
}

#[test]
fn a_bad_pattern_names_the_pattern_and_its_fault_once() {
    let fault = |text: &str| match EgressRules::parse(&[text.to_owned()], &[]) {
        Err(PolicyError::Network(NetworkError::Pattern { pattern, source })) => (pattern, source),
        other => panic!("{text}: expected a pattern error, got {other:?}"),
    };
    let (pattern, source) = fault("example.com:0");
    assert_eq!(pattern, "example.com:0");
    assert!(matches!(source, PatternError::Port { port } if port == "0"));
    assert!(matches!(fault("*.com").1, PatternError::WildcardTooWide));
    assert!(matches!(
        fault("a*.example.com").1,
        PatternError::WildcardInside
    ));
    assert!(matches!(fault("[::1]x").1, PatternError::AfterBracket { rest } if rest == "x"));
    let (_, source) = fault("exa mple.com");
    assert!(
        matches!(&source, PatternError::Host(HostNameError { host, .. }) if host == "exa mple.com"),
        "{source:?}"
    );
    let message = EgressRules::parse(&["exa mple.com".to_owned()], &[])
        .unwrap_err()
        .to_string();
    assert_eq!(
        message.matches("invalid network policy").count(),
        1,
        "{message}"
    );
}

#[test]
fn named_sets_expand_and_every_shipped_line_parses() {
    let r = rules(&["@package-registries"], &[]);
    assert!(matches!(
        r.decide(&name("pypi.org"), 443),
        Decision::Allowed(_)
    ));
    assert!(matches!(
        r.decide(&name("static.crates.io"), 443),
        Decision::Allowed(_)
    ));
    assert_eq!(
        r.decide(&name("example.com"), 443),
        Decision::Denied(Refusal::NotAllowed)
    );
    rules(&["@git-hosts"], &[]);
}

#[test]
fn tunnel_settings_parse_in_every_form_and_the_widest_matching_one_applies() {
    let r = rules(
        &[
            "db.corp.test:5432 tunnel=any",
            "*.corp.test:5432",
            "web.test",
            "tls.test:8443  tunnel=tls-only",
        ],
        &[],
    );
    let mode = |h: &str, p: u16| r.tunnel_mode(&name(h), p);
    assert_eq!(mode("db.corp.test", 5432), TunnelMode::Any);
    assert_eq!(mode("x.corp.test", 5432), TunnelMode::Checked);
    assert_eq!(mode("web.test", 443), TunnelMode::TlsOnly);
    assert_eq!(mode("web.test", 80), TunnelMode::Checked);
    assert_eq!(mode("tls.test", 8443), TunnelMode::TlsOnly);
    assert_eq!(
        r.allow.iter().map(ToString::to_string).collect::<Vec<_>>(),
        [
            "*.corp.test:5432",
            "db.corp.test:5432 tunnel=any",
            "tls.test:8443 tunnel=tls-only",
            "web.test"
        ]
    );
    // The table form, on the wire and in TOML, means the same and round-trips as text.
    let wire: NetworkPolicy = serde_json::from_str(
        r#"{"allow": [{"pattern": "db.test:5432", "tunnel": "any"}, "web.test"]}"#,
    )
    .unwrap();
    #[derive(Deserialize)]
    struct Profile {
        network: NetworkPolicy,
    }
    let toml: Profile = toml::from_str(
        "network = { allow = [{ pattern = \"db.test:5432\", tunnel = \"any\" }, \"web.test\"] }",
    )
    .unwrap();
    assert_eq!(wire, toml.network);
    let NetworkPolicy::Allowlist(parsed) = &wire else {
        panic!("{wire:?}");
    };
    assert_eq!(parsed.tunnel_mode(&name("db.test"), 5432), TunnelMode::Any);
    let json = serde_json::to_string(&wire).unwrap();
    assert_eq!(
        json,
        r#"{"allow":["db.test:5432 tunnel=any","web.test"],"deny":[]}"#
    );
    assert_eq!(serde_json::from_str::<NetworkPolicy>(&json).unwrap(), wire);
    // Unknown settings, modes and keys, and a setting on a deny pattern, fail closed.
    for bad in [
        "db.test tunnel=sometimes",
        "db.test mode=any",
        "db.test tunnel=",
    ] {
        let err = EgressRules::parse(&[bad.to_owned()], &[])
            .unwrap_err()
            .to_string();
        assert!(err.contains("tunnel=any"), "{bad}: {err}");
    }
    let err = EgressRules::parse(&[], &["db.test tunnel=any".to_owned()])
        .unwrap_err()
        .to_string();
    assert!(err.contains("allow patterns only"), "{err}");
    assert!(
        serde_json::from_str::<NetworkPolicy>(
            r#"{"allow": [{"pattern": "db.test", "tunnel": "any", "extra": 1}]}"#
        )
        .is_err()
    );
}

#[test]
fn wire_forms_round_trip() {
    for (text, expected) in [
        (r#""off""#, NetworkPolicy::Off),
        (r#"true"#, NetworkPolicy::On),
        (r#""enabled""#, NetworkPolicy::On),
    ] {
        let parsed: NetworkPolicy = serde_json::from_str(text).unwrap();
        assert_eq!(parsed, expected);
    }
    let parsed: NetworkPolicy =
        serde_json::from_str(r#"{"allow": ["PyPI.org", "*.crates.io:443"], "deny": []}"#).unwrap();
    let json = serde_json::to_string(&parsed).unwrap();
    assert_eq!(
        json,
        r#"{"allow":["*.crates.io:443","pypi.org"],"deny":[]}"#
    );
    assert!(serde_json::from_str::<NetworkPolicy>(r#"{"allow": [], "extra": 1}"#).is_err());
    assert!(serde_json::from_str::<NetworkPolicy>(r#""sometimes""#).is_err());
}
