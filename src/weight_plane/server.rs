//! Serves published versions over HTTP/1.1: the newest manifest, any kept version's manifest
//! and files, with single byte-range requests so an interrupted download resumes.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use futures::TryStreamExt;
use http_body_util::{combinators::BoxBody, BodyExt, Full, StreamBody};
use hyper::body::{Bytes, Frame, Incoming};
use hyper::header::{
    HeaderValue, ACCEPT_RANGES, CONTENT_LENGTH, CONTENT_RANGE, CONTENT_TYPE, RANGE,
};
use hyper::{Method, Request, Response, StatusCode};
use tokio::io::{AsyncReadExt, AsyncSeekExt};

use super::manifest::{plain_name, version_dir, versions, BASE_DIR, MANIFEST_FILE};
use super::WeightPlaneError;
use agent_r1_envs::access::Access;

use crate::metrics_server::{spawn_http, HttpServer, Limits, ServerSpec};

type Body = BoxBody<Bytes, std::io::Error>;

/// What one client may hold: headers within 10 s, a connection for an hour (a whole file on
/// a slow link), 64 connections at once.
const SPEC: ServerSpec = ServerSpec {
    name: "weight server",
    count_refused: || {
        metrics::counter!(crate::metric_names::CLUSTER_WEIGHT_CONNECTIONS_REFUSED_TOTAL.name)
            .increment(1)
    },
    limits: Limits {
        header: Duration::from_secs(10),
        connection: Duration::from_secs(3600),
        connections: 64,
    },
};

/// The running server; dropping it stops it.
#[derive(Debug)]
pub struct WeightServer {
    http: HttpServer,
}

impl WeightServer {
    /// Serves the versions under `root` at `addr` (port 0 picks one) on its own thread, to
    /// the requests `access` admits.
    pub fn start(addr: SocketAddr, access: Access, root: &Path) -> Result<Self, WeightPlaneError> {
        let fail = |message: String| WeightPlaneError::Serve { addr, message };
        let listener = std::net::TcpListener::bind(addr).map_err(|e| fail(e.to_string()))?;
        let local = listener.local_addr().map_err(|e| fail(e.to_string()))?;
        listener
            .set_nonblocking(true)
            .map_err(|e| fail(e.to_string()))?;
        let root = Arc::new(root.to_path_buf());
        let handler = move |req| {
            let root = root.clone();
            async move { respond(req, &root).await }
        };
        let http = spawn_http(SPEC, listener, local, access, handler, None)
            .map_err(|e| fail(e.to_string()))?;
        tracing::info!(addr = %local, "serving weights");
        Ok(Self { http })
    }

    /// Where it listens.
    pub fn local_addr(&self) -> SocketAddr {
        self.http.local_addr()
    }

    /// The base URL fetchers use (`http://ADDR`).
    pub fn url(&self) -> String {
        format!("http://{}", self.local_addr())
    }
}

fn text(status: StatusCode, body: String) -> Response<Body> {
    let mut r = Response::new(Full::new(Bytes::from(body)).map_err(|e| match e {}).boxed());
    *r.status_mut() = status;
    r.headers_mut().insert(
        CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    r
}

async fn respond(req: Request<Incoming>, root: &Path) -> Response<Body> {
    if req.method() != Method::GET {
        return text(StatusCode::METHOD_NOT_ALLOWED, "use GET\n".into());
    }
    let path = req.uri().path().to_string();
    let Some(rest) = path.strip_prefix("/weights/") else {
        return text(
            StatusCode::NOT_FOUND,
            format!("{path}: not here; try /weights/latest\n"),
        );
    };
    let (dir, name) = match rest.split_once('/') {
        None if rest == "latest" => match versions(root).last() {
            Some(&v) => (version_dir(root, v), MANIFEST_FILE.to_string()),
            None => return text(StatusCode::NOT_FOUND, "no version published yet\n".into()),
        },
        Some((BASE_DIR, name)) if plain_name(name) => (root.join(BASE_DIR), name.to_string()),
        Some((v, name)) => {
            let version = v.strip_prefix('v').and_then(|n| n.parse::<u64>().ok());
            match version {
                Some(version) if plain_name(name) => (version_dir(root, version), name.to_string()),
                _ => {
                    return text(
                        StatusCode::NOT_FOUND,
                        format!("{path}: not /weights/vN/FILE\n"),
                    )
                }
            }
        }
        None => {
            return text(
                StatusCode::NOT_FOUND,
                format!("{path}: not /weights/vN/FILE\n"),
            )
        }
    };
    let range = req
        .headers()
        .get(RANGE)
        .map(|v| v.to_str().unwrap_or("").to_string());
    match file_response(&dir.join(&name), range.as_deref()).await {
        Ok(r) => r,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => text(
            StatusCode::NOT_FOUND,
            format!(
                "{path}: no such version or file (kept versions: {:?})\n",
                versions(root)
            ),
        ),
        Err(e) => text(StatusCode::INTERNAL_SERVER_ERROR, format!("{path}: {e}\n")),
    }
}

/// The whole file, or the one range asked for (`bytes=A-B`, `bytes=A-`, `bytes=-N`), streamed
/// in 1 MiB chunks.
async fn file_response(path: &Path, range: Option<&str>) -> std::io::Result<Response<Body>> {
    let mut file = tokio::fs::File::open(path).await?;
    let len = file.metadata().await?.len();
    let (status, start, end) = match range {
        None => (StatusCode::OK, 0, len),
        Some(spec) => match parse_range(spec, len) {
            Some((a, b)) => (StatusCode::PARTIAL_CONTENT, a, b),
            None => {
                let mut r = text(
                    StatusCode::RANGE_NOT_SATISFIABLE,
                    format!("range {spec:?} is not one range inside 0..{len}\n"),
                );
                r.headers_mut().insert(
                    CONTENT_RANGE,
                    HeaderValue::from_str(&format!("bytes */{len}")).expect("ascii"),
                );
                return Ok(r);
            }
        },
    };
    file.seek(std::io::SeekFrom::Start(start)).await?;
    let reader = file.take(end - start);
    let stream = tokio_util::io::ReaderStream::with_capacity(reader, 1 << 20).map_ok(Frame::data);
    let mut r = Response::new(BodyExt::boxed(StreamBody::new(stream)));
    *r.status_mut() = status;
    let h = r.headers_mut();
    h.insert(
        CONTENT_TYPE,
        HeaderValue::from_static("application/octet-stream"),
    );
    h.insert(ACCEPT_RANGES, HeaderValue::from_static("bytes"));
    h.insert(CONTENT_LENGTH, HeaderValue::from(end - start));
    if status == StatusCode::PARTIAL_CONTENT {
        let value = format!("bytes {start}-{}/{len}", end.saturating_sub(1));
        h.insert(CONTENT_RANGE, HeaderValue::from_str(&value).expect("ascii"));
    }
    Ok(r)
}

/// `[start, end)` of a single-range `Range` header inside a file of `len` bytes.
fn parse_range(spec: &str, len: u64) -> Option<(u64, u64)> {
    let spec = spec.trim().strip_prefix("bytes=")?;
    if spec.contains(',') {
        return None;
    }
    let (a, b) = spec.split_once('-')?;
    let (start, end) = match (a.trim(), b.trim()) {
        ("", n) => {
            let n: u64 = n.parse().ok()?;
            (len.checked_sub(n.min(len))?, len)
        }
        (a, "") => (a.parse().ok()?, len),
        (a, b) => (
            a.parse().ok()?,
            b.parse::<u64>().ok()?.checked_add(1)?.min(len),
        ),
    };
    (start < end && start < len).then_some((start, end))
}

#[cfg(test)]
mod tests {
    use super::parse_range;

    #[test]
    fn ranges_are_one_span_inside_the_file() {
        assert_eq!(parse_range("bytes=0-9", 100), Some((0, 10)));
        assert_eq!(parse_range("bytes=90-", 100), Some((90, 100)));
        assert_eq!(parse_range("bytes=-10", 100), Some((90, 100)));
        assert_eq!(parse_range("bytes=95-200", 100), Some((95, 100)));
        assert_eq!(parse_range("bytes=100-", 100), None);
        assert_eq!(parse_range("bytes=5-2", 100), None);
        assert_eq!(parse_range("bytes=0-1,5-6", 100), None);
        assert_eq!(parse_range("items=0-1", 100), None);
        assert_eq!(parse_range("bytes=x-", 100), None);
    }
}
