//! The JSON-RPC envelope.
//!
//! As in the reference, the `"jsonrpc"` member is optional: it is accepted when it says `"2.0"`
//! and never produced. One message is one websocket frame. A message is classified by its
//! members: `method` + `id` is a request, `method` alone a notification, `id` + `result` a
//! response, `id` + `error` an error response.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::error::{ErrorKind, RpcError};

/// A request id: an integer or a string, echoed back verbatim.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(untagged)]
pub enum RequestId {
    /// An integer id.
    Integer(i64),
    /// A string id.
    String(String),
}

impl RequestId {
    /// The id used for errors that cannot be tied to a request (unparseable input,
    /// unexpected notifications), as the reference does.
    pub const UNKNOWN: RequestId = RequestId::Integer(-1);
}

impl std::fmt::Display for RequestId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RequestId::Integer(id) => write!(f, "{id}"),
            RequestId::String(id) => write!(f, "{id:?}"),
        }
    }
}

/// A request: it expects exactly one response with the same id.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct Request {
    /// Echoed in the response.
    pub id: RequestId,
    /// The method name, e.g. `process/start`.
    pub method: String,
    /// The params; absent is the same as `null`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub params: Option<Value>,
}

/// A notification: no response.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct Notification {
    /// The method name, e.g. `process/output`.
    pub method: String,
    /// The params.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub params: Option<Value>,
}

/// A successful response.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct Response {
    /// The request's id.
    pub id: RequestId,
    /// The method's result.
    pub result: Value,
}

/// An error response.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct ErrorResponse {
    /// The request's id, or -1 when the error is not tied to a request.
    pub id: RequestId,
    /// The error.
    pub error: RpcError,
}

/// Any JSON-RPC message.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(untagged)]
pub enum Message {
    /// A request.
    Request(Request),
    /// A notification.
    Notification(Notification),
    /// A successful response.
    Response(Response),
    /// An error response.
    Error(ErrorResponse),
}

/// How the answer to a frame that is not a JSON-RPC message begins: the reference server's
/// words, which its own suite compares (`starts_with`).
pub const ENVELOPE_ERROR_PREFIX: &str =
    "failed to parse websocket JSON-RPC message from exec-server websocket";

/// Why bytes are not a JSON-RPC message. Carries the id when one could be read, so the error
/// response can name the request; otherwise the response uses id -1.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{message}")]
pub struct EnvelopeError {
    /// The id of the offending message, when it had a valid one.
    pub id: Option<RequestId>,
    /// What was wrong and what is expected.
    pub message: String,
}

impl EnvelopeError {
    fn new(id: Option<RequestId>, message: impl Into<String>) -> Self {
        Self {
            id,
            message: message.into(),
        }
    }

    /// The error response to send back (-32600 `invalidRequest`). Its message starts with the
    /// reference server's words ([`ENVELOPE_ERROR_PREFIX`], which its suite reads) and goes on
    /// with what was wrong and what is expected.
    pub fn to_response(&self) -> ErrorResponse {
        ErrorResponse {
            id: self.id.clone().unwrap_or(RequestId::UNKNOWN),
            error: RpcError::invalid_request(
                ErrorKind::InvalidRequest,
                format!("{ENVELOPE_ERROR_PREFIX}: {}", self.message),
            ),
        }
    }
}

impl Message {
    /// Parse one message from bytes (one websocket frame).
    ///
    /// # Errors
    /// [`EnvelopeError`] when the bytes are not UTF-8 JSON, not an object, or not one of the four
    /// message shapes. serde_json's recursion limit bounds nesting depth.
    pub fn from_slice(bytes: &[u8]) -> Result<Message, EnvelopeError> {
        let value: Value = serde_json::from_slice(bytes).map_err(|error| {
            EnvelopeError::new(
                None,
                format!(
                    "message is not valid JSON ({error}); expected one JSON-RPC object per frame"
                ),
            )
        })?;
        Self::from_value(value)
    }

    /// Classify a parsed JSON value.
    ///
    /// # Errors
    /// See [`Message::from_slice`].
    pub fn from_value(value: Value) -> Result<Message, EnvelopeError> {
        let Value::Object(mut object) = value else {
            return Err(EnvelopeError::new(
                None,
                format!(
                    "message must be a JSON object (got {}); batches are not supported",
                    type_name(&value)
                ),
            ));
        };
        let id = match object.remove("id") {
            None => None,
            Some(raw) => Some(
                serde_json::from_value::<RequestId>(raw.clone()).map_err(|_| {
                    EnvelopeError::new(
                        None,
                        format!(
                            "\"id\" must be an integer or a string (got {})",
                            type_name(&raw)
                        ),
                    )
                })?,
            ),
        };
        check_version(&mut object, &id)?;
        let method = match object.remove("method") {
            None => None,
            Some(Value::String(method)) => Some(method),
            Some(other) => {
                return Err(EnvelopeError::new(
                    id,
                    format!("\"method\" must be a string (got {})", type_name(&other)),
                ));
            }
        };
        let params = object.remove("params");
        if let Some(params) = &params
            && !matches!(params, Value::Object(_) | Value::Array(_) | Value::Null)
        {
            return Err(EnvelopeError::new(
                id,
                format!("\"params\" must be an object (got {})", type_name(params)),
            ));
        }
        let result = object.remove("result");
        let error = object.remove("error");
        if let Some(extra) = object.keys().next() {
            return Err(EnvelopeError::new(
                id,
                format!("unexpected member {extra:?} in a JSON-RPC message"),
            ));
        }
        match (id, method, result, error) {
            (Some(id), Some(method), None, None) => {
                Ok(Message::Request(Request { id, method, params }))
            }
            (None, Some(method), None, None) => {
                Ok(Message::Notification(Notification { method, params }))
            }
            (Some(id), None, Some(result), None) if params.is_none() => {
                Ok(Message::Response(Response { id, result }))
            }
            (Some(id), None, None, Some(error)) if params.is_none() => {
                let error = serde_json::from_value(error).map_err(|e| {
                    EnvelopeError::new(
                        Some(id.clone()),
                        format!("\"error\" is not a JSON-RPC error object: {e}"),
                    )
                })?;
                Ok(Message::Error(ErrorResponse { id, error }))
            }
            (id, _, _, _) => Err(EnvelopeError::new(
                id,
                "message must be a request {id, method, params}, a notification {method, params}, \
                 or a response {id, result} / {id, error}",
            )),
        }
    }

    /// Serialize to the bytes of one frame (never includes `"jsonrpc"`).
    pub fn to_bytes(&self) -> Vec<u8> {
        // Serializing these types cannot fail: every map key is a string and every value is JSON.
        serde_json::to_vec(self).unwrap_or_default()
    }
}

fn check_version(
    object: &mut Map<String, Value>,
    id: &Option<RequestId>,
) -> Result<(), EnvelopeError> {
    match object.remove("jsonrpc") {
        None => Ok(()),
        Some(Value::String(version)) if version == "2.0" => Ok(()),
        Some(other) => Err(EnvelopeError::new(
            id.clone(),
            format!("\"jsonrpc\" must be \"2.0\" or absent (got {other})"),
        )),
    }
}

fn type_name(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;
    use serde_json::json;

    #[test]
    fn request_without_jsonrpc_member_parses() {
        let message =
            Message::from_slice(br#"{"id":1,"method":"initialize","params":{"clientName":"c"}}"#)
                .unwrap();
        assert_eq!(
            message,
            Message::Request(Request {
                id: RequestId::Integer(1),
                method: "initialize".into(),
                params: Some(json!({"clientName": "c"})),
            })
        );
    }

    #[test]
    fn jsonrpc_two_point_zero_is_accepted_and_other_versions_rejected() {
        assert!(Message::from_slice(br#"{"jsonrpc":"2.0","id":"a","method":"m"}"#).is_ok());
        let error = Message::from_slice(br#"{"jsonrpc":"1.0","id":"a","method":"m"}"#).unwrap_err();
        assert_eq!(error.id, Some(RequestId::String("a".into())));
    }

    #[test]
    fn string_ids_round_trip_and_output_has_no_jsonrpc_member() {
        let message = Message::Response(Response {
            id: RequestId::String("x".into()),
            result: json!({}),
        });
        assert_eq!(
            String::from_utf8(message.to_bytes()).unwrap(),
            r#"{"id":"x","result":{}}"#
        );
    }

    #[test]
    fn notification_and_error_shapes_are_classified() {
        assert!(matches!(
            Message::from_slice(br#"{"method":"initialized"}"#).unwrap(),
            Message::Notification(_)
        ));
        let error =
            Message::from_slice(br#"{"id":3,"error":{"code":-32600,"message":"no"}}"#).unwrap();
        assert!(matches!(error, Message::Error(_)));
    }

    #[test]
    fn garbage_and_non_objects_get_id_minus_one() {
        for input in [&b"not json"[..], b"[1,2]", b"42", b"\xff\xfe"] {
            let error = Message::from_slice(input).unwrap_err();
            assert_eq!(error.to_response().id, RequestId::UNKNOWN);
            assert_eq!(
                error.to_response().error.code,
                crate::error::INVALID_REQUEST
            );
        }
    }

    #[test]
    fn bad_method_type_keeps_the_id() {
        let error = Message::from_slice(br#"{"id":7,"method":5}"#).unwrap_err();
        assert_eq!(error.id, Some(RequestId::Integer(7)));
    }

    #[test]
    fn deep_nesting_is_rejected_not_overflowed() {
        let deep = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
        assert!(Message::from_slice(deep.as_bytes()).is_err());
    }
}
