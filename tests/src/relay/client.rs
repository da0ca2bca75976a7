//! A JSON-RPC client over one relay stream.

use std::collections::HashMap;
use std::time::Duration;

use serde_json::{Value, json};
use supervisor::relay::{RelayHarnessConnection, RemoteConnectArgs};

use super::connect_args;
use crate::DEADLINE;

/// A JSON-RPC client over one relay stream.
pub struct RemoteClient {
    /// The stream.
    pub connection: RelayHarnessConnection,
    next_id: u64,
    /// Responses that arrived while waiting for another.
    pending: HashMap<u64, Value>,
    /// Notifications, in arrival order. A binary `process/output` frame is filed as the JSON
    /// notification it stands for, marked `"frame": "binary"`.
    pub notifications: Vec<Value>,
    /// The `initialize` result.
    pub initialized: Value,
}

/// A relay message as JSON: a binary output frame (first byte 0x01) as its notification,
/// marked `"frame": "binary"`; anything else must be a JSON-RPC message.
fn decode_message(bytes: &[u8]) -> Value {
    if bytes.first() == Some(&proto::methods::process::binary::OUTPUT_FRAME_KIND) {
        return crate::client::output_frame_as_notification(bytes);
    }
    serde_json::from_slice(bytes).expect("JSON-RPC message")
}

impl RemoteClient {
    /// Connect and initialize.
    pub async fn connect(registry_url: &str, environment_id: &str) -> RemoteClient {
        Self::connect_with(&connect_args(registry_url, environment_id)).await
    }

    /// Connect with these arguments and initialize.
    pub async fn connect_with(args: &RemoteConnectArgs) -> RemoteClient {
        Self::connect_initializing(args, json!({"clientName": "relay-test"})).await
    }

    /// Connect with these arguments and initialize with these `initialize` params (e.g.
    /// `binaryOutput`, `resumeSessionId`); the `initialize` result is in
    /// [`RemoteClient::initialized`].
    pub async fn connect_initializing(args: &RemoteConnectArgs, params: Value) -> RemoteClient {
        let mut client = Self::open(args).await;
        client.initialized = client.call("initialize", params).await.expect("initialize");
        client.notify("initialized", json!({})).await;
        client
    }

    /// Open a stream without initializing.
    pub async fn open(args: &RemoteConnectArgs) -> RemoteClient {
        let connection = tokio::time::timeout(DEADLINE, RelayHarnessConnection::connect(args))
            .await
            .expect("relay connect deadline")
            .expect("relay connect");
        RemoteClient {
            connection,
            next_id: 1,
            pending: HashMap::new(),
            notifications: Vec::new(),
            initialized: Value::Null,
        }
    }

    /// Send a notification.
    pub async fn notify(&mut self, method: &str, params: Value) {
        let text = json!({"method": method, "params": params}).to_string();
        self.send_text(text).await;
    }

    /// Send a request; returns its id.
    pub async fn send(&mut self, method: &str, params: Value) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        let text = json!({"id": id, "method": method, "params": params}).to_string();
        self.send_text(text).await;
        id
    }

    /// Send, filing whatever arrives meanwhile: like any real client, keep reading while a send
    /// waits for room (otherwise full windows on both sides wait on each other).
    async fn send_text(&mut self, text: String) {
        let sender = self.connection.sender();
        let send = sender.send(text);
        tokio::pin!(send);
        let until = tokio::time::Instant::now() + Duration::from_secs(60);
        loop {
            tokio::select! {
                sent = &mut send => {
                    sent.expect("send");
                    return;
                }
                message = self.connection.recv() => {
                    let bytes = message.expect("relay stream ended while sending");
                    self.file(decode_message(&bytes));
                }
                () = tokio::time::sleep_until(until) => panic!("send did not complete within 60 s"),
            }
        }
    }

    /// Wait for the response to `id`: `Ok(result)` or `Err(error)`.
    pub async fn response(&mut self, id: u64) -> Result<Value, Value> {
        self.response_within(id, DEADLINE).await
    }

    /// [`Self::response`] with an explicit deadline.
    pub async fn response_within(&mut self, id: u64, deadline: Duration) -> Result<Value, Value> {
        let until = tokio::time::Instant::now() + deadline;
        loop {
            if let Some(message) = self.pending.remove(&id) {
                return match message.get("error") {
                    Some(error) => Err(error.clone()),
                    None => Ok(message["result"].clone()),
                };
            }
            let message = self.next_within(until).await;
            self.file(message);
        }
    }

    /// The next message of any kind, filed; panics at the deadline.
    async fn next_within(&mut self, until: tokio::time::Instant) -> Value {
        let bytes = tokio::time::timeout_at(until, self.connection.recv())
            .await
            .expect("relay message deadline")
            .expect("relay stream ended");
        decode_message(&bytes)
    }

    fn file(&mut self, message: Value) {
        match message.get("id").and_then(Value::as_u64) {
            Some(id) => {
                assert!(
                    self.pending.insert(id, message).is_none(),
                    "two responses for id {id}"
                );
            }
            None => self.notifications.push(message),
        }
    }

    /// Responses received but never asked for: a duplicate of a response already taken stays
    /// here, so 0 at the end of a run means every response arrived exactly once.
    pub fn unclaimed(&self) -> usize {
        self.pending.len()
    }

    /// Request and wait.
    pub async fn call(&mut self, method: &str, params: Value) -> Result<Value, Value> {
        let id = self.send(method, params).await;
        self.response(id).await
    }

    /// Wait for a notification matching `pred` (already received ones count).
    pub async fn wait_notification(&mut self, pred: impl Fn(&Value) -> bool) -> Value {
        let until = tokio::time::Instant::now() + DEADLINE;
        loop {
            if let Some(found) = self.notifications.iter().find(|n| pred(n)) {
                return found.clone();
            }
            let message = self.next_within(until).await;
            self.file(message);
        }
    }
}
