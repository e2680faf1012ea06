//! One OpenEnv environment session over the server's WebSocket.
//!
//! The wire format is `openenv-core`'s (`openenv.core.env_server.types`): the client sends
//! `{"type": "reset", "data": {kwargs}}`, `{"type": "step", "data": {action fields}}`,
//! `{"type": "state"}` or `{"type": "close"}`; the server answers `{"type": "observation",
//! "data": {"observation": {...}, "reward": number|null, "done": bool}}`, `{"type": "state",
//! "data": {...}}` or `{"type": "error", "data": {"message", "code"}}`. The server keeps one
//! environment per connection and ends it when the connection closes.

use std::time::Duration;

use futures::{SinkExt, StreamExt};
use serde_json::{json, Value};
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::Message as WsMessage;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

use crate::{Error, Result};

/// What `reset` and `step` return.
#[derive(Debug, Clone, PartialEq)]
pub struct EnvReply {
    /// The observation's own fields (without reward, done and metadata).
    pub observation: Value,
    /// The reward of the last action (`None` at reset, or when the env gives none).
    pub reward: Option<f64>,
    /// Whether the episode has ended.
    pub done: bool,
}

/// An open session (one environment on the server).
pub struct Session {
    ws: WebSocketStream<MaybeTlsStream<TcpStream>>,
    url: String,
    timeout: Duration,
}

/// The WebSocket URL of a server at `base` (`http(s)://host:port[/prefix]` or
/// `ws(s)://...`): its `/ws` route.
pub fn ws_url(base: &str) -> std::result::Result<String, String> {
    let base = base.trim_end_matches('/');
    let rest = if let Some(r) = base.strip_prefix("http://") {
        format!("ws://{r}")
    } else if let Some(r) = base.strip_prefix("https://") {
        format!("wss://{r}")
    } else if base.starts_with("ws://") || base.starts_with("wss://") {
        base.to_string()
    } else {
        return Err(format!(
            "{base:?}: an http://, https://, ws:// or wss:// URL of an OpenEnv server"
        ));
    };
    Ok(if rest.ends_with("/ws") {
        rest
    } else {
        format!("{rest}/ws")
    })
}

impl Session {
    /// Opens a session on the server at `base` within `connect_timeout`; every later call
    /// waits at most `timeout` for its answer.
    pub async fn connect(base: &str, connect_timeout: Duration, timeout: Duration) -> Result<Self> {
        let url = ws_url(base).map_err(Error::Other)?;
        let (ws, _) = tokio::time::timeout(connect_timeout, tokio_tungstenite::connect_async(&url))
            .await
            .map_err(|_| {
                Error::Other(format!(
                    "openenv {url}: no connection within {connect_timeout:?}"
                ))
            })?
            .map_err(|e| Error::Other(format!("openenv {url}: cannot connect: {e}")))?;
        Ok(Self { ws, url, timeout })
    }

    /// The WebSocket URL this session talks to.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// Starts an episode; `kwargs` go to the env's `reset` (`seed`, `episode_id`, its own).
    pub async fn reset(&mut self, kwargs: Value) -> Result<EnvReply> {
        let data = self
            .call(
                json!({"type": "reset", "data": kwargs}),
                "observation",
                "reset",
            )
            .await?;
        observation(&self.url, "reset", data)
    }

    /// Takes one action (the fields of the env's action type).
    pub async fn step(&mut self, action: Value) -> Result<EnvReply> {
        let data = self
            .call(
                json!({"type": "step", "data": action}),
                "observation",
                "step",
            )
            .await?;
        observation(&self.url, "step", data)
    }

    /// The env's state (episode id, step count and the env's own fields).
    pub async fn state(&mut self) -> Result<Value> {
        self.call(json!({"type": "state"}), "state", "state").await
    }

    /// Ends the session (the server ends its environment); errors are ignored, as the
    /// connection closing does the same.
    pub async fn close(mut self) {
        let send = async {
            let _ = self
                .ws
                .send(WsMessage::text(json!({"type": "close"}).to_string()))
                .await;
            let _ = self.ws.close(None).await;
        };
        let _ = tokio::time::timeout(self.timeout, send).await;
    }

    async fn call(&mut self, message: Value, expect: &str, what: &str) -> Result<Value> {
        let url = self.url.clone();
        let fail = |m: String| Error::Other(format!("openenv {url}: {what}: {m}"));
        let timeout = self.timeout;
        let exchange = async {
            self.ws
                .send(WsMessage::text(message.to_string()))
                .await
                .map_err(|e| format!("sending: {e}"))?;
            loop {
                match self.ws.next().await {
                    None => return Err("the server closed the session".to_string()),
                    Some(Err(e)) => return Err(format!("receiving: {e}")),
                    Some(Ok(WsMessage::Text(text))) => return Ok(text.to_string()),
                    Some(Ok(WsMessage::Close(frame))) => {
                        return Err(format!(
                            "the server closed the session{}",
                            frame.map(|f| format!(": {}", f.reason)).unwrap_or_default()
                        ))
                    }
                    Some(Ok(_)) => continue,
                }
            }
        };
        let text = tokio::time::timeout(timeout, exchange)
            .await
            .map_err(|_| fail(format!("no answer within {timeout:?}")))?
            .map_err(fail)?;
        let reply: Value = serde_json::from_str(&text)
            .map_err(|e| fail(format!("the answer is not JSON ({e}): {}", cut(&text))))?;
        let data = reply.get("data").cloned().unwrap_or(Value::Null);
        match reply.get("type").and_then(Value::as_str) {
            Some(t) if t == expect => Ok(data),
            Some("error") => {
                let message = data
                    .get("message")
                    .and_then(Value::as_str)
                    .unwrap_or("(no message)");
                let code = data.get("code").and_then(Value::as_str).unwrap_or("error");
                let details = data
                    .get("errors")
                    .map(|e| format!(" {}", cut(&e.to_string())))
                    .unwrap_or_default();
                Err(fail(format!("the env answered {code}: {message}{details}")))
            }
            _ => Err(fail(format!(
                "expected a {expect:?} answer, got {}",
                cut(&text)
            ))),
        }
    }
}

fn observation(url: &str, what: &str, data: Value) -> Result<EnvReply> {
    let fail = |m: String| Error::Other(format!("openenv {url}: {what}: {m}"));
    let reward = match data.get("reward") {
        None | Some(Value::Null) => None,
        Some(Value::Bool(b)) => Some(f64::from(u8::from(*b))),
        Some(Value::Number(n)) => match n.as_f64() {
            Some(r) if r.is_finite() => Some(r),
            _ => return Err(fail(format!("the reward {n} is not a finite number"))),
        },
        Some(other) => return Err(fail(format!("the reward {other} is not a number"))),
    };
    let done = match data.get("done") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(other) => return Err(fail(format!("`done` is {other}, not a boolean"))),
    };
    Ok(EnvReply {
        observation: data.get("observation").cloned().unwrap_or(Value::Null),
        reward,
        done,
    })
}

fn cut(text: &str) -> String {
    match text.char_indices().nth(300) {
        Some((i, _)) => format!("{}...", &text[..i]),
        None => text.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ws_url_from_http_and_ws_bases() {
        assert_eq!(
            ws_url("http://127.0.0.1:8000").unwrap(),
            "ws://127.0.0.1:8000/ws"
        );
        assert_eq!(
            ws_url("https://h.example/env/").unwrap(),
            "wss://h.example/env/ws"
        );
        assert_eq!(ws_url("ws://h:1/ws").unwrap(), "ws://h:1/ws");
        assert!(ws_url("127.0.0.1:8000").unwrap_err().contains("http://"));
    }

    #[test]
    fn observation_reads_reward_and_done_as_given() {
        let r = observation(
            "u",
            "step",
            json!({"observation": {"text": "hi"}, "reward": 0.5, "done": true}),
        )
        .unwrap();
        assert_eq!((r.reward, r.done), (Some(0.5), true));
        assert_eq!(r.observation["text"], "hi");
        let r = observation("u", "reset", json!({"observation": {}, "reward": null})).unwrap();
        assert_eq!((r.reward, r.done), (None, false));
        let e = observation("u", "step", json!({"reward": "x"})).unwrap_err();
        assert!(e.to_string().contains("not a number"), "{e}");
    }
}
