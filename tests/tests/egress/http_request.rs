//! `http/request` checked against the sandbox's allowlist: the destination, a pattern's
//! `methods=`/`paths=`, and a `Host` header naming another host.

use super::*;

#[tokio::test]
async fn http_request_is_checked_against_the_sandboxs_allowlist() {
    let origin = Origin::start();
    let server = ExecServer::start(&[]);
    let mut client = server.client().await;
    let url = format!("http://127.0.0.1:{}/", origin.port);
    let request = |sandbox: Value, url: &str| {
        json!({"method": "GET", "url": url, "headers": [], "requestId": "r",
               "streamResponse": false, "sandbox": sandbox})
    };
    let named = json!({"profile": "read-only", "network": {"allow": [format!("127.0.0.1:{}", origin.port)]}});
    let ok = client.call("http/request", request(named, &url)).await;
    assert_eq!(ok["status"], 200, "{ok}");
    for (allow, url, expected) in [
        (
            json!(["example.test"]),
            url.clone(),
            "not in the sandbox's network allowlist",
        ),
        (
            json!(["*.example.test"]),
            "http://unlisted.invalid/".to_owned(),
            "not in the sandbox's network allowlist",
        ),
        (
            json!(["localhost"]),
            format!("http://localhost:{}/", origin.port),
            "not in the sandbox's network allowlist",
        ),
    ] {
        let sandbox = json!({"profile": "read-only", "network": {"allow": allow}});
        let error = assert_rpc_error(
            client.request("http/request", request(sandbox, &url)).await,
            -32600,
            "sandboxDenied",
        );
        assert!(error.message.contains(expected), "{url}: {error:?}");
    }
    let rebinding = json!({"profile": "read-only", "network": {"allow": [format!("localhost:{}", origin.port)]}});
    let error = assert_rpc_error(
        client
            .request(
                "http/request",
                request(rebinding, &format!("http://localhost:{}/", origin.port)),
            )
            .await,
        -32600,
        "sandboxDenied",
    );
    assert!(
        error.message.contains("does not name"),
        "a name resolving to loopback needs the address named: {error:?}"
    );
    assert_eq!(origin.connections.load(Ordering::SeqCst), 1);
}

/// `http/request` under a pattern with `methods=read-only paths=/ok/` (the table form, as a
/// harness sends it): a GET of `/ok/x` is made, a POST, another path and a dot-segment path
/// are refused with `sandboxDenied` naming the limits, and none of them reaches the origin.
#[tokio::test]
async fn http_request_holds_a_patterns_methods_and_paths() {
    let origin = Origin::start();
    let server = ExecServer::start(&[]);
    let mut client = server.client().await;
    let base = format!("http://127.0.0.1:{}", origin.port);
    let sandbox = json!({"profile": "read-only", "network": {"allow": [
        {"pattern": format!("127.0.0.1:{}", origin.port), "methods": "read-only", "paths": ["/ok/"]}
    ]}});
    let request = |method: &str, path: &str| {
        json!({"method": method, "url": format!("{base}{path}"), "headers": [], "requestId": "r",
               "streamResponse": false, "sandbox": sandbox})
    };
    let ok = client.call("http/request", request("GET", "/ok/x")).await;
    assert_eq!(ok["status"], 200, "{ok}");
    for (method, path) in [
        ("POST", "/ok/x"),
        ("GET", "/admin"),
        ("GET", "/ok/%2e%2e/admin"),
    ] {
        let error = assert_rpc_error(
            client.request("http/request", request(method, path)).await,
            -32600,
            "sandboxDenied",
        );
        assert!(
            error
                .message
                .contains("outside what its pattern allows (methods=GET,HEAD,OPTIONS paths=/ok/)"),
            "{method} {path}: {error:?}"
        );
    }
    assert_eq!(origin.connections.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn http_request_refuses_a_host_header_naming_another_host_under_an_allowlist() {
    let origin = Origin::start();
    let server = ExecServer::start(&[]);
    let mut client = server.client().await;
    let url = format!("http://127.0.0.1:{}/", origin.port);
    let sandbox = json!({"profile": "read-only", "network": {"allow": [format!("127.0.0.1:{}", origin.port)]}});
    let request = |host: &str| {
        json!({"method": "GET", "url": url, "headers": [{"name": "Host", "value": host}],
               "requestId": "r", "streamResponse": false, "sandbox": sandbox})
    };
    let error = assert_rpc_error(
        client.request("http/request", request("evil.test")).await,
        -32600,
        "sandboxDenied",
    );
    assert!(
        error
            .message
            .contains("the Host header \"evil.test\" names another host"),
        "{error:?}"
    );
    assert_eq!(origin.connections.load(Ordering::SeqCst), 0);
    // Plain http:// to a destination whose pattern says tunnel=tls-only is refused, as the
    // egress proxy refuses it.
    let tls_only = json!({"profile": "read-only", "network": {"allow": [format!("127.0.0.1:{} tunnel=tls-only", origin.port)]}});
    let error = assert_rpc_error(
        client
            .request(
                "http/request",
                json!({"method": "GET", "url": url, "headers": [], "requestId": "r",
                       "streamResponse": false, "sandbox": tls_only}),
            )
            .await,
        -32600,
        "sandboxDenied",
    );
    assert!(error.message.contains("carries TLS only"), "{error:?}");
    assert_eq!(origin.connections.load(Ordering::SeqCst), 0);
    // The control: a Host header naming the URL's host is sent.
    let ok = client
        .call(
            "http/request",
            request(&format!("127.0.0.1:{}", origin.port)),
        )
        .await;
    assert_eq!(ok["status"], 200, "{ok}");
    assert_eq!(origin.connections.load(Ordering::SeqCst), 1);
}
