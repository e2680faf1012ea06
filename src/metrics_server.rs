//! The HTTP endpoint of `agent-r1 train`: `/metrics`, `/healthz` and the web UI under `/ui`
//! ([`crate::view`]); `agent-r1 view` serves the UI alone with the same server ([`serve_ui`]).
//!
//! The `metrics` facade's recorder is process-global, so [`start`] installs the
//! `metrics-exporter-prometheus` recorder once and serves it from a small hyper server. The
//! exporter's own listener answers `/health` (not the `/healthz` probes expect) and hides
//! the port it bound, which makes `127.0.0.1:0` untestable; ours binds first (so a busy or
//! bad address is an error before anything else starts, naming `metrics.address`), then
//! serves on its own thread with its own single-threaded tokio runtime, so scrapes are
//! answered even while the training loop's runtime is saturated.
//!
//! Histograms are exported as Prometheus histograms (`_bucket`, `_sum`, `_count`) so that
//! the dashboard can aggregate them with `histogram_quantile`; `*_seconds` series get
//! latency buckets and `agent_r1_engine_batch_size` powers of two.

use std::net::{SocketAddr, TcpListener};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use agent_r1_envs::access::Access;
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::{Bytes, Incoming};
use hyper::header::{HeaderValue, AUTHORIZATION, CONTENT_TYPE, WWW_AUTHENTICATE};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

use crate::config::{ConfigError, MetricsSection};
use crate::view::Site;
use agent_r1_actors::runtime::LiveBoard;
use agent_r1_actors::stall::StallDetector;

/// Latency buckets (seconds) for every `*_seconds` histogram: tool calls, queue waits,
/// engine steps, learner updates span sub-millisecond to minutes.
const SECONDS_BUCKETS: &[f64] = &[
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
    60.0, 120.0, 300.0, 600.0,
];
/// Rows per engine decode step.
const BATCH_BUCKETS: &[f64] = &[
    1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0,
];
/// How often idle histogram buckets are rolled.
const UPKEEP_EVERY: Duration = Duration::from_secs(5);

/// Errors of [`start`].
#[derive(Debug, thiserror::Error)]
pub enum MetricsError {
    /// `metrics.address` does not parse or resolve.
    #[error(transparent)]
    Address(#[from] ConfigError),
    /// The address parsed but cannot be listened on (in use, not local, no permission).
    #[error("`metrics.address`: cannot listen on {addr}: {source} (choose another HOST:PORT or set metrics.enabled = false)")]
    Bind {
        /// The address tried.
        addr: SocketAddr,
        /// The OS error.
        source: std::io::Error,
    },
    /// A recorder was installed before (the recorder is per process).
    #[error(
        "a metrics recorder is already installed in this process; start the metrics server once"
    )]
    AlreadyInstalled,
    /// The exporter refused its settings, or the server thread could not start.
    #[error("metrics server: {0}")]
    Setup(String),
}

/// The running endpoint. Dropping it stops the HTTP server; the recorder stays installed
/// (the `metrics` facade cannot uninstall one), so metrics keep being collected.
#[derive(Debug)]
pub struct MetricsServer {
    http: HttpServer,
    handle: PrometheusHandle,
}

impl MetricsServer {
    /// The address actually bound (the real port when the config said port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.http.addr
    }

    /// The text `/metrics` serves right now (for logs and tests).
    pub fn render(&self) -> String {
        self.handle.render()
    }
}

/// A running HTTP server thread; dropping it stops the server.
#[derive(Debug)]
pub struct HttpServer {
    addr: SocketAddr,
    shutdown: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl HttpServer {
    /// The address actually bound.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Blocks until the server thread ends (it ends only when dropped, or on a fatal error).
    pub fn wait(mut self) {
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// What a server answers besides `/healthz`, and what `/healthz` watches.
#[derive(Clone)]
struct Routes {
    metrics: Option<PrometheusHandle>,
    ui: Option<Arc<Site>>,
    progress: Option<(Progress, Duration)>,
}

/// What `/healthz` watches in a training run: the live board's last activity, and the stall
/// detector's stages.
#[derive(Clone, Debug)]
pub struct Progress {
    /// Where episodes and the loop record activity.
    pub board: LiveBoard,
    /// The run's stages and their deadlines.
    pub stalls: StallDetector,
}

impl Routes {
    /// `/healthz`: 503 naming each stalled stage while the stall detector reports any; else
    /// 200 while something progressed within the stale limit, else 503 saying for how long
    /// nothing has and what moved last.
    fn health(&self) -> (StatusCode, String) {
        let Some((progress, stale)) = &self.progress else {
            return (StatusCode::OK, "ok\n".into());
        };
        let stalls = progress.stalls.current();
        if !stalls.is_empty() {
            let lines: String = stalls.iter().map(|s| format!("stalled: {s}\n")).collect();
            return (StatusCode::SERVICE_UNAVAILABLE, lines);
        }
        let (idle, what) = progress.board.idle();
        if idle < *stale {
            (
                StatusCode::OK,
                format!(
                    "ok: last progress {:.0} s ago ({what})\n",
                    idle.as_secs_f64()
                ),
            )
        } else {
            (
                StatusCode::SERVICE_UNAVAILABLE,
                format!(
                    "stalled: no progress for {:.0} s (metrics.healthz_stale_secs = {:.0}); last: {what}\n",
                    idle.as_secs_f64(),
                    stale.as_secs_f64()
                ),
            )
        }
    }
}

impl Drop for HttpServer {
    fn drop(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn bind(addr: SocketAddr) -> Result<(TcpListener, SocketAddr), MetricsError> {
    let listener = TcpListener::bind(addr).map_err(|source| MetricsError::Bind { addr, source })?;
    let addr = listener
        .local_addr()
        .map_err(|source| MetricsError::Bind { addr, source })?;
    listener
        .set_nonblocking(true)
        .map_err(|e| MetricsError::Setup(format!("non-blocking listener: {e}")))?;
    Ok((listener, addr))
}

fn spawn(
    listener: TcpListener,
    addr: SocketAddr,
    access: Access,
    routes: Routes,
    limits: Limits,
) -> Result<HttpServer, MetricsError> {
    let spec = ServerSpec {
        name: "metrics server",
        count_refused: || {
            metrics::counter!(crate::metric_names::METRICS_CONNECTIONS_REFUSED_TOTAL.name)
                .increment(1)
        },
        limits,
    };
    let upkeep = routes
        .metrics
        .clone()
        .map(|handle| Box::new(move || handle.run_upkeep()) as Box<dyn Fn() + Send>);
    let handler = move |req| respond(req, routes.clone());
    spawn_http(spec, listener, addr, access, handler, upkeep)
        .map_err(|e| MetricsError::Setup(format!("cannot start the server thread: {e}")))
}

/// Serves the web UI of `site` (and `/healthz`) at `addr` to the requests `access` admits,
/// with the default connection limits; no `/metrics` (`agent-r1 view`).
pub fn serve_ui(
    addr: SocketAddr,
    access: Access,
    site: Arc<Site>,
) -> Result<HttpServer, MetricsError> {
    let (listener, addr) = bind(addr)?;
    let defaults = MetricsSection::default();
    let routes = Routes {
        metrics: None,
        ui: Some(site),
        progress: None,
    };
    spawn(listener, addr, access, routes, Limits::of(&defaults))
}

/// Installs the global recorder, describes the `agent_r1_*` series, and serves `/metrics`,
/// `/healthz` and (with `ui`) the web UI at `section.address`. With `progress`, `/healthz`
/// turns unhealthy while a stage is stalled, or when the board has not moved for
/// `metrics.healthz_stale_secs`.
pub fn start(
    section: &MetricsSection,
    ui: Option<Arc<Site>>,
    progress: Option<Progress>,
) -> Result<MetricsServer, MetricsError> {
    section.check()?;
    let access = section.access()?;
    let (listener, addr) = bind(section.socket_addr()?)?;

    let recorder = PrometheusBuilder::new()
        .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), SECONDS_BUCKETS)
        .and_then(|b| {
            b.set_buckets_for_metric(
                Matcher::Full(agent_r1_actors::metric_names::ENGINE_BATCH_SIZE.name.into()),
                BATCH_BUCKETS,
            )
        })
        .map_err(|e| MetricsError::Setup(e.to_string()))?
        .build_recorder();
    let handle = recorder.handle();
    metrics::set_global_recorder(recorder).map_err(|_| MetricsError::AlreadyInstalled)?;
    describe_series();

    let routes = Routes {
        metrics: Some(handle.clone()),
        ui,
        progress: progress.map(|p| (p, Duration::from_secs_f64(section.healthz_stale_secs))),
    };
    let http = spawn(listener, addr, access, routes, Limits::of(section))?;
    tracing::info!(%addr, "serving /metrics, /healthz and /ui");
    Ok(MetricsServer { http, handle })
}

/// What one client may hold of the server.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Limits {
    /// To send the request headers.
    pub(crate) header: Duration,
    /// A connection's whole life.
    pub(crate) connection: Duration,
    /// Connections at once.
    pub(crate) connections: usize,
}

impl Limits {
    fn of(section: &MetricsSection) -> Self {
        Self {
            header: Duration::from_secs_f64(section.header_timeout_secs),
            connection: Duration::from_secs_f64(section.connection_timeout_secs),
            connections: section.max_connections,
        }
    }
}

/// What a server is called in logs, the counter of connections it refused, and its limits.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ServerSpec {
    /// The name in its log lines ("metrics server").
    pub(crate) name: &'static str,
    /// Counts a connection refused past `limits.connections` (in its own metric).
    pub(crate) count_refused: fn(),
    /// What one client may hold of it.
    pub(crate) limits: Limits,
}

/// Serves `handler` on `listener` from a thread of its own (a current-thread runtime), with
/// `upkeep` run every few seconds, until the returned server is dropped. Requests `access`
/// does not admit are answered 401 before `handler` sees them. Idle or slow clients cannot
/// pile up: headers must arrive within `limits.header`, a connection closes after
/// `limits.connection`, and past `limits.connections` new ones are closed at once.
pub(crate) fn spawn_http<H, F, B>(
    spec: ServerSpec,
    listener: TcpListener,
    addr: SocketAddr,
    access: Access,
    handler: H,
    upkeep: Option<Box<dyn Fn() + Send>>,
) -> std::io::Result<HttpServer>
where
    H: Fn(Request<Incoming>) -> F + Clone + Send + 'static,
    F: std::future::Future<Output = Response<B>> + Send + 'static,
    B: hyper::body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    access.check_listen(spec.name, addr)?;
    let (tx, rx) = tokio::sync::oneshot::channel();
    let access = Arc::new(access);
    let thread = std::thread::Builder::new()
        .name(spec.name.replace(' ', "-"))
        .spawn(move || serve(spec, listener, access, handler, upkeep, rx))?;
    Ok(HttpServer {
        addr,
        shutdown: Some(tx),
        thread: Some(thread),
    })
}

type AnyBody = UnsyncBoxBody<Bytes, Box<dyn std::error::Error + Send + Sync>>;

/// The 401 answer to a request `access` refused.
fn unauthorized(message: String) -> Response<AnyBody> {
    let body = Full::new(Bytes::from(message + "\n"))
        .map_err(|e| match e {})
        .boxed_unsync();
    let mut r = Response::new(body);
    *r.status_mut() = StatusCode::UNAUTHORIZED;
    r.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("text/plain"));
    r.headers_mut().insert(
        WWW_AUTHENTICATE,
        HeaderValue::from_static("Bearer realm=\"agent-r1\""),
    );
    r
}

fn serve<H, F, B>(
    spec: ServerSpec,
    listener: TcpListener,
    access: Arc<Access>,
    handler: H,
    upkeep: Option<Box<dyn Fn() + Send>>,
    mut shutdown: tokio::sync::oneshot::Receiver<()>,
) where
    H: Fn(Request<Incoming>) -> F + Clone + Send + 'static,
    F: std::future::Future<Output = Response<B>> + Send + 'static,
    B: hyper::body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let (name, limits) = (spec.name, spec.limits);
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            tracing::error!("{name}: cannot build its runtime: {e}");
            return;
        }
    };
    runtime.block_on(async move {
        let listener = match tokio::net::TcpListener::from_std(listener) {
            Ok(l) => l,
            Err(e) => {
                tracing::error!("{name}: {e}");
                return;
            }
        };
        let mut ticks = tokio::time::interval(UPKEEP_EVERY);
        let slots = std::sync::Arc::new(tokio::sync::Semaphore::new(limits.connections));
        loop {
            tokio::select! {
                _ = &mut shutdown => break,
                _ = ticks.tick() => {
                    if let Some(upkeep) = &upkeep {
                        upkeep();
                    }
                }
                accepted = listener.accept() => {
                    let stream = match accepted {
                        Ok((stream, _)) => stream,
                        Err(e) => {
                            tracing::warn!("{name}: accept failed: {e}");
                            continue;
                        }
                    };
                    let Ok(slot) = slots.clone().try_acquire_owned() else {
                        (spec.count_refused)();
                        drop(stream);
                        continue;
                    };
                    let handler = handler.clone();
                    let access = access.clone();
                    tokio::spawn(async move {
                        let _slot = slot;
                        let service = hyper::service::service_fn(move |req: Request<Incoming>| {
                            let authorization = req.headers().get(AUTHORIZATION).map(|v| v.as_bytes());
                            let reply = match access.admit(req.uri().path(), authorization) {
                                Ok(()) => Ok(handler(req)),
                                Err(refused) => Err(unauthorized(refused.message)),
                            };
                            async move {
                                Ok::<_, std::convert::Infallible>(match reply {
                                    Ok(reply) => reply
                                        .await
                                        .map(|body| body.map_err(Into::into).boxed_unsync()),
                                    Err(refused) => refused,
                                })
                            }
                        });
                        let connection = hyper::server::conn::http1::Builder::new()
                            .timer(TokioTimer::new())
                            .header_read_timeout(limits.header)
                            .serve_connection(TokioIo::new(stream), service);
                        match tokio::time::timeout(limits.connection, connection).await {
                            Ok(Err(e)) => tracing::debug!("{name}: connection: {e}"),
                            Err(_) => tracing::debug!("{name}: connection closed after {:?}", limits.connection),
                            Ok(Ok(())) => {}
                        }
                    });
                }
            }
        }
    });
}

/// Routes one request. UI pages read files, so they are rendered on the blocking pool.
async fn respond(req: Request<Incoming>, routes: Routes) -> Response<Full<Bytes>> {
    let reply = |status: StatusCode, content_type: &'static str, body: String| {
        let mut r = Response::new(Full::new(Bytes::from(body)));
        *r.status_mut() = status;
        r.headers_mut()
            .insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
        r
    };
    if req.method() != Method::GET && req.method() != Method::HEAD {
        return reply(
            StatusCode::METHOD_NOT_ALLOWED,
            "text/plain",
            "use GET\n".into(),
        );
    }
    let path = req.uri().path().to_string();
    match (path.as_str(), &routes.metrics, &routes.ui) {
        ("/metrics", Some(handle), _) => {
            record_process_memory();
            reply(
                StatusCode::OK,
                "text/plain; version=0.0.4; charset=utf-8",
                handle.render(),
            )
        }
        ("/healthz", _, _) => {
            let (status, text) = routes.health();
            reply(status, "text/plain", text)
        }
        ("/", None, Some(_)) => {
            let mut r = reply(StatusCode::FOUND, "text/plain", "see /ui\n".into());
            r.headers_mut()
                .insert(hyper::header::LOCATION, HeaderValue::from_static("/ui"));
            r
        }
        (p, _, Some(site)) if p == "/ui" || p.starts_with("/ui/") => {
            let site = site.clone();
            let query = req.uri().query().map(str::to_string);
            match tokio::task::spawn_blocking(move || site.respond(&path, query.as_deref())).await {
                Ok(page) => reply(
                    StatusCode::from_u16(page.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
                    page.content_type,
                    page.body,
                ),
                Err(e) => reply(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "text/plain",
                    format!("the page failed: {e}\n"),
                ),
            }
        }
        _ => reply(
            StatusCode::NOT_FOUND,
            "text/plain",
            format!(
                "not found; try {}/healthz{}\n",
                if routes.metrics.is_some() {
                    "/metrics, "
                } else {
                    ""
                },
                if routes.ui.is_some() { ", /ui" } else { "" }
            ),
        ),
    }
}

/// Sets `agent_r1_process_resident_memory_bytes` and `..._peak_...` from
/// `/proc/self/status` (`VmRSS`, `VmHWM`), at scrape time. Elsewhere than Linux the series
/// are absent.
fn record_process_memory() {
    let Ok(status) = std::fs::read_to_string("/proc/self/status") else {
        return;
    };
    let kib = |key: &str| -> Option<f64> {
        let line = status.lines().find(|l| l.starts_with(key))?;
        let n: f64 = line[key.len()..]
            .trim()
            .trim_end_matches("kB")
            .trim()
            .parse()
            .ok()?;
        Some(n * 1024.0)
    };
    if let Some(v) = kib("VmRSS:") {
        metrics::gauge!(crate::metric_names::PROCESS_RESIDENT_MEMORY_BYTES.name).set(v);
    }
    if let Some(v) = kib("VmHWM:") {
        metrics::gauge!(crate::metric_names::PROCESS_PEAK_RESIDENT_MEMORY_BYTES.name).set(v);
    }
}

/// `# HELP` texts (and units) of every declared series ([`crate::metric_names::all`]), since
/// `promtool check metrics` wants help text on all of them.
fn describe_series() {
    use agent_r1_envs::metric::MetricKind;
    metrics::with_recorder(|recorder| {
        for m in crate::metric_names::all() {
            let key = metrics::KeyName::from_const_str(m.name);
            let help = metrics::SharedString::from(m.help_text());
            match m.kind {
                MetricKind::Counter => recorder.describe_counter(key, m.unit, help),
                MetricKind::Gauge => recorder.describe_gauge(key, m.unit, help),
                MetricKind::Histogram => recorder.describe_histogram(key, m.unit, help),
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn healthz_turns_unhealthy_when_nothing_progressed_within_the_limit() {
        let board = LiveBoard::default();
        board.touch("update 3");
        let stalls = StallDetector::new();
        let routes = |stale: Duration| Routes {
            metrics: None,
            ui: None,
            progress: Some((
                Progress {
                    board: board.clone(),
                    stalls: stalls.clone(),
                },
                stale,
            )),
        };
        let (status, text) = routes(Duration::from_secs(3600)).health();
        assert_eq!(status, StatusCode::OK);
        assert!(
            text.starts_with("ok: last progress") && text.contains("(update 3)"),
            "{text}"
        );
        let (status, text) = routes(Duration::ZERO).health();
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
        assert!(
            text.starts_with("stalled: no progress for") && text.contains("last: update 3"),
            "{text}"
        );
        // A stage past its deadline makes /healthz unhealthy whatever else moved, naming it.
        let learner = stalls.operations("learner", Duration::from_millis(1));
        let _update = learner.start("update 4");
        let (tx, rx) = std::sync::mpsc::channel();
        let _watchdog = stalls
            .spawn_watchdog(move |s| tx.send(s.clone()).unwrap())
            .unwrap();
        rx.recv_timeout(Duration::from_secs(60))
            .expect("the stall is reported");
        let (status, text) = routes(Duration::from_secs(3600)).health();
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
        assert!(
            text.starts_with("stalled: stuck stage: learner: update 4 made no progress"),
            "{text}"
        );
    }

    #[test]
    fn bad_or_busy_address_names_the_key_and_installs_nothing() {
        let e = start(
            &MetricsSection {
                enabled: true,
                address: "not an address".into(),
                ..Default::default()
            },
            None,
            None,
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("metrics.address") && e.contains("HOST:PORT"),
            "{e}"
        );
        let busy = TcpListener::bind("127.0.0.1:0").unwrap();
        let e = start(
            &MetricsSection {
                enabled: true,
                address: busy.local_addr().unwrap().to_string(),
                ..Default::default()
            },
            None,
            None,
        )
        .unwrap_err();
        assert!(matches!(e, MetricsError::Bind { .. }), "{e}");
        assert!(
            e.to_string().contains("`metrics.address`: cannot listen"),
            "{e}"
        );
        // Nothing was installed, so the global recorder is still the no-op one.
        assert!(metrics::set_global_recorder(metrics::NoopRecorder).is_ok());
    }
}
