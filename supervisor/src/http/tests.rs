use super::*;
use serde_json::json;

fn params(extra: serde_json::Value) -> HttpRequestParams {
    let mut value = json!({"method": "GET", "url": "http://127.0.0.1:1/", "requestId": "r"});
    for (key, field) in extra.as_object().unwrap() {
        value[key] = field.clone();
    }
    serde_json::from_value(value).unwrap()
}

fn invalid(extra: serde_json::Value) -> String {
    match validate(&params(extra)) {
        Err(
            error @ (HttpError::RequestIdLength { .. }
            | HttpError::InvalidMethod { .. }
            | HttpError::ConnectMethod
            | HttpError::InvalidUrl { .. }
            | HttpError::UnsupportedScheme { .. }
            | HttpError::InvalidHeaderName { .. }
            | HttpError::InvalidHeaderValue { .. }),
        ) => error.to_string(),
        other => panic!("expected an invalid-params error, got {other:?}"),
    }
}

#[test]
fn validation_names_what_is_wrong() {
    assert!(invalid(json!({"url": "ftp://x/"})).contains("\"ftp\""));
    assert!(invalid(json!({"url": "/relative"})).contains("absolute"));
    assert!(invalid(json!({"method": "GE T"})).contains("method"));
    assert!(invalid(json!({"method": "CONNECT"})).contains("CONNECT"));
    assert!(invalid(json!({"requestId": ""})).contains("requestId"));
    assert!(invalid(json!({"headers": [{"name": "bad name", "value": "v"}]})).contains("bad name"));
    assert!(invalid(json!({"headers": [{"name": "x", "value": "a\nb"}]})).contains("\"x\""));
    assert!(matches!(
        validate(&params(json!({"bodyBase64": "!!"}))),
        Err(HttpError::InvalidBase64(_))
    ));
}

#[test]
fn a_request_without_a_timeout_gets_the_default_and_none_exceeds_the_cap() {
    let default = HTTP_REQUEST_DEFAULT_TIMEOUT_MS;
    // Buffered: the default bounds the whole request; a shorter one is kept.
    assert_eq!(timeouts(None, false), (Some(default), default));
    assert_eq!(timeouts(Some(250), false), (Some(250), 250));
    // A longer one is capped.
    let max = HTTP_REQUEST_MAX_TIMEOUT_MS;
    assert_eq!(timeouts(Some(u64::MAX), false), (Some(max), max));
    assert_eq!(timeouts(Some(u64::MAX), true), (Some(max), max));
    // Streamed without one: the head waits at most the default, the body as long as the
    // client is there.
    assert_eq!(timeouts(None, true), (None, default));
}

#[test]
fn headers_keep_order_and_repeats() {
    let outgoing = validate(&params(json!({"headers": [
        {"name": "X-A", "value": "1"}, {"name": "x-b", "value": "2"}, {"name": "x-a", "value": "3"}
    ]})))
    .unwrap();
    let seen: Vec<_> = outgoing
        .headers
        .get_all("x-a")
        .iter()
        .map(|value| value.to_str().unwrap().to_owned())
        .collect();
    assert_eq!(seen, ["1", "3"]);
    assert_eq!(outgoing.headers.len(), 3);
}

#[test]
fn a_second_active_stream_with_one_id_is_refused_until_the_first_ends() {
    let connection = ConnectionHttp::default();
    let first = reserve_stream(&connection, "s").unwrap();
    assert!(matches!(
        reserve_stream(&connection, "s"),
        Err(HttpError::DuplicateStream { .. })
    ));
    let _other = reserve_stream(&connection, "t").unwrap();
    drop(first);
    reserve_stream(&connection, "s").unwrap();
}
