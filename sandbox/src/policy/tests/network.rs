//! The `network` value of wire specs and profile files.

use pretty_assertions::assert_eq;

use super::*;

#[test]
fn wire_network_allowlist_resolves_and_keeps_sockets_in_their_own_namespace() {
    let policy = spec(json!({
        "profile": "read-only",
        "network": {"allow": ["PyPI.org", "*.crates.io", "@git-hosts"], "deny": ["evil.crates.io"]}
    }))
    .resolve_with(&ctx())
    .unwrap();
    let rules = policy.egress().expect("an allowlist");
    assert!(rules.allow.iter().any(|p| p.to_string() == "pypi.org"));
    assert!(rules.allow.iter().any(|p| p.to_string() == "github.com"));
    assert_eq!(rules.deny[0].to_string(), "evil.crates.io");
    assert!(policy.network_allowed(), "AF_INET sockets may be created");
    assert!(!policy.network_fully_on());
    assert!(policy.needs_network_namespace());
    assert!(!policy.is_unrestricted());
    // The resolved policy round-trips through the launch request's JSON.
    let json = serde_json::to_string(&policy).unwrap();
    assert_eq!(
        serde_json::from_str::<ResolvedPolicy>(&json).unwrap(),
        policy
    );
}

#[test]
fn wire_network_overrides_the_sources_own_setting() {
    let on = spec(json!({"type": "read-only", "network_access": false, "network": "on"}))
        .resolve_with(&ctx())
        .unwrap();
    assert!(on.network_fully_on());
    let off = spec(json!({"profile": "read-only", "networkAccess": true, "network": "off"}))
        .resolve_with(&ctx())
        .unwrap();
    assert!(!off.network_allowed());
}

#[test]
fn malformed_network_values_are_refused_with_the_accepted_forms() {
    for bad in [
        json!({"profile": "read-only", "network": {"allow": ["pypi.org"], "extra": true}}),
        json!({"profile": "read-only", "network": "sometimes"}),
        json!({"profile": "read-only", "network": {"allow": ["*"]}}),
        json!({"profile": "read-only", "network": {"allow": ["@unknown-set"]}}),
    ] {
        let err = serde_json::from_value::<SandboxSpec>(bad.clone()).unwrap_err();
        assert!(err.to_string().contains("expected"), "{bad}: {err}");
    }
}

#[test]
fn toml_profiles_take_an_allowlist_table() {
    let profile = ProfileFile::parse(
        "network = { allow = [\"pypi.org\", \"files.pythonhosted.org\"], deny = [] }\n\
         [filesystem]\n\":root\" = \"read\"\n",
        "test",
    )
    .unwrap();
    let policy = profile.resolve(None, &[], &ctx()).unwrap();
    assert_eq!(policy.egress().unwrap().allow.len(), 2);
    let switch = ProfileFile::parse("network = true\n", "test").unwrap();
    assert_eq!(switch.network, NetworkPolicy::On);
    assert!(ProfileFile::parse("network = { allow = [\"a b\"] }\n", "test").is_err());
}
