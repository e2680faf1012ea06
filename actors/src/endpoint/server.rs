//! The HTTP side of the endpoint: routes, the episode named by a request, limits.
//!
//! A request names its episode by its API key (`Authorization: Bearer KEY`, what
//! `OPENAI_API_KEY` sets) or by a per-episode base URL (`/episodes/KEY/v1/...`, for clients
//! whose key is fixed). Bound anywhere but loopback, the endpoint wants a bearer token
//! ([`Access`]): every request then carries the run's token as its API key and names its
//! episode by the per-episode base URL ([`Endpoint::credentials`] hands out both). The
//! server parses and checks the body, then hands it to the episode
//! that registered the key (a bounded channel: past its bound the request is refused with
//! 429) and waits for the answer up to the request timeout. The server runs on a thread of
//! its own, so a busy actor runtime does not hold up accepting or parsing.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http_body_util::{BodyExt, Full, Limited};
use hyper::body::{Bytes, Incoming};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use serde_json::json;
use tokio::sync::{mpsc, oneshot};

use agent_r1_envs::access::Access;

use super::error::ApiError;
use super::protocol;
use super::serve::{Call, Reply};

/// The endpoint's limits.
#[derive(Debug, Clone)]
pub struct EndpointLimits {
    /// Largest request body.
    pub max_body_bytes: usize,
    /// Connections open at once (more wait in the listen backlog).
    pub max_connections: usize,
    /// Longest a request waits for its answer.
    pub request_timeout: Duration,
    /// Longest a client may take to send its headers.
    pub header_timeout: Duration,
}

impl Default for EndpointLimits {
    fn default() -> Self {
        Self {
            max_body_bytes: 8 << 20,
            max_connections: 4096,
            request_timeout: Duration::from_secs(600),
            header_timeout: Duration::from_secs(30),
        }
    }
}

/// A request handed to its episode, with where the answer goes.
pub struct EpisodeRequest {
    /// The request.
    pub call: Call,
    /// The answer (dropped unanswered when the episode ends first).
    pub reply: oneshot::Sender<Result<Reply, ApiError>>,
}

type Directory = Mutex<HashMap<String, mpsc::Sender<EpisodeRequest>>>;

/// A running endpoint. Dropping it stops the server.
pub struct Endpoint {
    addr: SocketAddr,
    access: Arc<Access>,
    directory: Arc<Directory>,
    shutdown: Option<oneshot::Sender<()>>,
}

/// An episode's place in the endpoint: requests with its key reach it until this is dropped.
pub struct Registration {
    key: String,
    directory: Arc<Directory>,
}

impl Drop for Registration {
    fn drop(&mut self) {
        lock(&self.directory).remove(&self.key);
    }
}

fn lock(d: &Directory) -> std::sync::MutexGuard<'_, HashMap<String, mpsc::Sender<EpisodeRequest>>> {
    d.lock().unwrap_or_else(|e| e.into_inner())
}

impl Endpoint {
    /// Binds `addr` (port 0 picks one) and serves the requests `access` admits from a thread
    /// of its own. Refused on an address other than loopback when `access` has no token.
    pub fn start(
        addr: SocketAddr,
        access: Access,
        model: String,
        limits: EndpointLimits,
    ) -> std::io::Result<Self> {
        access.check_listen("the OpenAI endpoint", addr)?;
        let listener = std::net::TcpListener::bind(addr)?;
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        let directory: Arc<Directory> = Arc::default();
        let (tx, rx) = oneshot::channel();
        let dir = directory.clone();
        let access = Arc::new(access);
        let shared = Shared {
            directory: dir,
            model,
            limits,
            access: access.clone(),
        };
        std::thread::Builder::new()
            .name("openai-endpoint".into())
            .spawn(move || serve(listener, shared, rx))?;
        Ok(Self {
            addr,
            access,
            directory,
            shutdown: Some(tx),
        })
    }

    /// The address it listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// The base URL clients take (`OPENAI_BASE_URL`).
    pub fn base_url(&self) -> String {
        format!("http://{}/v1", self.addr)
    }

    /// The base URL that names `key`'s episode in its path.
    pub fn episode_base_url(&self, key: &str) -> String {
        format!("http://{}/episodes/{key}/v1", self.addr)
    }

    /// What a client of `key`'s episode is given: its base URL and its API key. Without a
    /// token, the shared base URL and the episode's key; with one, the episode's own base
    /// URL and the token.
    pub fn credentials(&self, key: &str) -> (String, String) {
        match self.access.token() {
            None => (self.base_url(), key.to_string()),
            Some(token) => (self.episode_base_url(key), token.expose().to_string()),
        }
    }

    /// Routes requests with `key` to the returned receiver, at most `capacity` waiting.
    pub fn register(
        &self,
        key: String,
        capacity: usize,
    ) -> (Registration, mpsc::Receiver<EpisodeRequest>) {
        let (tx, rx) = mpsc::channel(capacity.max(1));
        lock(&self.directory).insert(key.clone(), tx);
        (
            Registration {
                key,
                directory: self.directory.clone(),
            },
            rx,
        )
    }

    /// Episodes registered now.
    pub fn episodes(&self) -> usize {
        lock(&self.directory).len()
    }
}

impl Drop for Endpoint {
    fn drop(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
    }
}

struct Shared {
    directory: Arc<Directory>,
    model: String,
    limits: EndpointLimits,
    access: Arc<Access>,
}

fn serve(listener: std::net::TcpListener, shared: Shared, mut shutdown: oneshot::Receiver<()>) {
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            tracing::error!("openai endpoint: cannot build its runtime: {e}");
            return;
        }
    };
    let shared = Arc::new(shared);
    runtime.block_on(async move {
        let listener = match tokio::net::TcpListener::from_std(listener) {
            Ok(l) => l,
            Err(e) => {
                tracing::error!("openai endpoint: {e}");
                return;
            }
        };
        let slots = Arc::new(tokio::sync::Semaphore::new(shared.limits.max_connections));
        loop {
            let slot = tokio::select! {
                _ = &mut shutdown => break,
                slot = slots.clone().acquire_owned() => match slot {
                    Ok(s) => s,
                    Err(_) => break,
                },
            };
            let stream = tokio::select! {
                _ = &mut shutdown => break,
                accepted = listener.accept() => match accepted {
                    Ok((stream, _)) => stream,
                    Err(e) => {
                        tracing::warn!("openai endpoint: accept failed: {e}");
                        continue;
                    }
                },
            };
            let shared = shared.clone();
            tokio::spawn(async move {
                let _slot = slot;
                let header = shared.limits.header_timeout;
                let service = hyper::service::service_fn(move |req| {
                    let shared = shared.clone();
                    async move { Ok::<_, std::convert::Infallible>(respond(req, &shared).await) }
                });
                let connection = hyper::server::conn::http1::Builder::new()
                    .timer(TokioTimer::new())
                    .header_read_timeout(header)
                    .serve_connection(TokioIo::new(stream), service);
                if let Err(e) = connection.await {
                    tracing::debug!("openai endpoint: connection: {e}");
                }
            });
        }
    });
}

fn json_response(status: u16, body: &serde_json::Value) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from(body.to_string())));
    *r.status_mut() = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    r.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("application/json"),
    );
    r
}

fn error_response(e: &ApiError) -> Response<Full<Bytes>> {
    json_response(e.status, &e.body())
}

/// The route and the episode key a path names: `/v1/...` or `/episodes/KEY/v1/...`.
fn split_path(path: &str) -> (Option<&str>, &str) {
    if let Some(rest) = path.strip_prefix("/episodes/") {
        if let Some((key, route)) = rest.split_once('/') {
            return (Some(key), route);
        }
        return (Some(rest), "");
    }
    (None, path.trim_start_matches('/'))
}

async fn respond(req: Request<Incoming>, shared: &Shared) -> Response<Full<Bytes>> {
    let method = req.method().clone();
    let path = req.uri().path().to_string();
    let (path_key, route) = split_path(&path);
    let route_name = match route {
        "v1/chat/completions" => "chat_completions",
        "v1/completions" => "completions",
        "v1/models" => "models",
        "v1/agent_r1/tools" => "tools",
        "v1/agent_r1/tool_calls" => "tool_calls",
        _ => "other",
    };
    let authorization = req
        .headers()
        .get(hyper::header::AUTHORIZATION)
        .map(|v| v.as_bytes());
    let result = match shared.access.admit(&path, authorization) {
        Ok(()) => {
            let path_key = path_key.map(str::to_string);
            route_request(req, shared, &method, path_key, route).await
        }
        Err(refused) => Err(ApiError::unauthorized(refused.message)),
    };
    let (status, response) = match result {
        Ok(r) => (r.status().as_u16(), r),
        Err(e) => (e.status, error_response(&e)),
    };
    metrics::counter!(crate::metric_names::ENDPOINT_REQUESTS_TOTAL.name,
        "route" => route_name, "status" => status.to_string())
    .increment(1);
    response
}

async fn route_request(
    req: Request<Incoming>,
    shared: &Shared,
    method: &Method,
    path_key: Option<String>,
    route: &str,
) -> Result<Response<Full<Bytes>>, ApiError> {
    let post = |name: &str| -> Result<(), ApiError> {
        if method == Method::POST {
            Ok(())
        } else {
            Err(ApiError::not_found(format!(
                "{method} /{route}: {name} takes POST"
            )))
        }
    };
    match route {
        "v1/models" => {
            if method != Method::GET {
                return Err(ApiError::not_found(format!(
                    "{method} /v1/models: takes GET"
                )));
            }
            Ok(json_response(
                200,
                &json!({"object": "list", "data": [{
                    "id": shared.model, "object": "model", "created": 0, "owned_by": "agent-r1",
                }]}),
            ))
        }
        "v1/chat/completions" => {
            post("chat completions")?;
            let key = episode_key(&req, path_key, &shared.access)?;
            let body = read_body(req, shared.limits.max_body_bytes).await?;
            let call = Call::Chat(Box::new(protocol::parse(&body)?));
            hand_over(shared, &key, call).await
        }
        "v1/completions" => {
            post("completions")?;
            let key = episode_key(&req, path_key, &shared.access)?;
            let body = read_body(req, shared.limits.max_body_bytes).await?;
            let call = Call::Completion(Box::new(protocol::parse(&body)?));
            hand_over(shared, &key, call).await
        }
        "v1/agent_r1/tools" => {
            if method != Method::GET {
                return Err(ApiError::not_found(format!(
                    "{method} /v1/agent_r1/tools: takes GET"
                )));
            }
            let key = episode_key(&req, path_key, &shared.access)?;
            hand_over(shared, &key, Call::Tools).await
        }
        "v1/agent_r1/tool_calls" => {
            post("tool calls")?;
            let key = episode_key(&req, path_key, &shared.access)?;
            let body = read_body(req, shared.limits.max_body_bytes).await?;
            let call = Call::ToolCalls(Box::new(protocol::parse(&body)?));
            hand_over(shared, &key, call).await
        }
        other => Err(ApiError::not_found(format!(
            "{method} /{other}: no such route; served: POST /v1/chat/completions, POST \
             /v1/completions, GET /v1/models, GET /v1/agent_r1/tools, POST \
             /v1/agent_r1/tool_calls (also under /episodes/KEY/)"
        ))),
    }
}

fn episode_key(
    req: &Request<Incoming>,
    path_key: Option<String>,
    access: &Access,
) -> Result<String, ApiError> {
    if let Some(key) = path_key {
        return Ok(key);
    }
    if access.requires_token() {
        return Err(ApiError::unknown_episode(
            "no episode named: with a token the API key is the token, so name the episode \
             by its base URL /episodes/KEY/v1 (what the run hands each agent)",
        ));
    }
    let header = req
        .headers()
        .get(hyper::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim);
    match header {
        Some(key) if !key.is_empty() => Ok(key.to_string()),
        _ => Err(ApiError::unknown_episode(
            "no episode named: send the episode's key as the API key (Authorization: Bearer \
             KEY) or use its base URL /episodes/KEY/v1",
        )),
    }
}

async fn read_body(req: Request<Incoming>, limit: usize) -> Result<Bytes, ApiError> {
    match Limited::new(req.into_body(), limit).collect().await {
        Ok(body) => Ok(body.to_bytes()),
        Err(e) if e.is::<http_body_util::LengthLimitError>() => Err(ApiError::too_large(limit)),
        Err(e) => Err(ApiError::invalid(format!("reading the body: {e}"), None)),
    }
}

async fn hand_over(
    shared: &Shared,
    key: &str,
    call: Call,
) -> Result<Response<Full<Bytes>>, ApiError> {
    let sender = lock(&shared.directory).get(key).cloned();
    let Some(sender) = sender else {
        return Err(ApiError::unknown_episode(
            "no episode in flight has this key: it never existed or its episode has ended",
        ));
    };
    let (tx, rx) = oneshot::channel();
    sender
        .try_send(EpisodeRequest { call, reply: tx })
        .map_err(|e| match e {
            mpsc::error::TrySendError::Full(_) => ApiError::too_many(format!(
                "this episode has {n} requests in flight and {n} waiting, the most it takes \
                 (env.options.max_requests_per_episode = {n})",
                n = sender.max_capacity()
            )),
            mpsc::error::TrySendError::Closed(_) => {
                ApiError::unknown_episode("this key's episode has ended")
            }
        })?;
    let timeout = shared.limits.request_timeout;
    match tokio::time::timeout(timeout, rx).await {
        Ok(Ok(Ok(Reply::Json(body)))) => Ok(json_response(200, &body)),
        Ok(Ok(Ok(Reply::Events(text)))) => {
            let mut r = Response::new(Full::new(Bytes::from(text)));
            r.headers_mut().insert(
                hyper::header::CONTENT_TYPE,
                hyper::header::HeaderValue::from_static("text/event-stream"),
            );
            r.headers_mut().insert(
                hyper::header::CACHE_CONTROL,
                hyper::header::HeaderValue::from_static("no-cache"),
            );
            Ok(r)
        }
        Ok(Ok(Err(e))) => Err(e),
        Ok(Err(_)) => Err(ApiError::server(
            "the episode ended before this request was answered",
        )),
        Err(_) => Err(ApiError::timeout(format!(
            "no answer within {timeout:?} (the endpoint's request timeout)"
        ))),
    }
}
