//! The weights' data plane over loopback: a version published as safetensors with its
//! manifest, served with range requests, fetched and verified. Faults come from a test
//! double, a TCP proxy between fetcher and server that flips one byte of, or cuts short, the
//! first transfer of the weights file; the server and the fetcher are the real ones.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::sync::{Arc, Mutex};

use agent_r1::weight_plane::{
    load_tensors, publish, publish_base, Fetcher, FetcherConfig, WeightPlaneError, WeightServer,
};
use agent_r1_envs::access::Access;
use tch::{Kind, Tensor};

/// The same tensors for the same seed: libtorch's generator is global, and the tests of this
/// file run on parallel threads, so seeding and drawing happen under one lock.
fn tensors(seed: i64) -> Vec<(String, Tensor)> {
    static DRAWS: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _one_at_a_time = DRAWS.lock().unwrap_or_else(|e| e.into_inner());
    tch::manual_seed(seed);
    vec![
        (
            "model.embed_tokens.weight".into(),
            Tensor::randn([512, 64], (Kind::Float, tch::Device::Cpu)),
        ),
        (
            "model.layers.0.mlp.up_proj.weight".into(),
            Tensor::randn([128, 64], (Kind::BFloat16, tch::Device::Cpu)),
        ),
        (
            "model.norm.weight".into(),
            Tensor::ones([64], (Kind::Float, tch::Device::Cpu)),
        ),
    ]
}

fn assert_same(a: &[(String, Tensor)], b: &[(String, Tensor)]) {
    assert_eq!(a.len(), b.len());
    for (name, t) in a {
        let (_, u) = b.iter().find(|(n, _)| n == name).expect(name);
        assert!(t.equal(u), "{name} differs");
    }
}

/// What the proxy does to the first response carrying the weights file.
#[derive(Clone, Copy)]
enum Fault {
    /// XOR this byte of the body with 0xff.
    Flip(usize),
    /// Close the connection after this many body bytes.
    Cut(usize),
}

/// Test double: forwards each request to the server on its own connection, records the
/// request line and any `Range` header, and applies `fault` once.
struct Proxy {
    addr: SocketAddr,
    requests: Arc<Mutex<Vec<String>>>,
}

impl Proxy {
    fn start(upstream: SocketAddr, fault: Fault) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let requests = Arc::new(Mutex::new(Vec::new()));
        let log = requests.clone();
        let armed = Arc::new(Mutex::new(Some(fault)));
        std::thread::spawn(move || {
            for client in listener.incoming() {
                let Ok(client) = client else { return };
                let (log, armed) = (log.clone(), armed.clone());
                std::thread::spawn(move || relay(client, upstream, &log, &armed));
            }
        });
        Self { addr, requests }
    }

    fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    fn requests(&self) -> Vec<String> {
        self.requests.lock().unwrap().clone()
    }
}

fn read_head(stream: &mut TcpStream) -> Option<(Vec<u8>, Vec<u8>)> {
    let mut buf = Vec::new();
    let mut byte = [0u8; 4096];
    loop {
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let rest = buf.split_off(end + 4);
            return Some((buf, rest));
        }
        let n = stream.read(&mut byte).ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&byte[..n]);
    }
}

fn relay(
    mut client: TcpStream,
    upstream: SocketAddr,
    log: &Mutex<Vec<String>>,
    armed: &Mutex<Option<Fault>>,
) {
    let Some((head, _)) = read_head(&mut client) else {
        return;
    };
    let head = String::from_utf8_lossy(&head).to_string();
    let mut lines: Vec<&str> = head.trim_end().split("\r\n").collect();
    let range = lines
        .iter()
        .find(|l| l.to_ascii_lowercase().starts_with("range:"))
        .map(|l| format!(" [{}]", l.trim()))
        .unwrap_or_default();
    log.lock().unwrap().push(format!("{}{range}", lines[0]));
    let is_weights = lines[0].contains("model.safetensors");
    lines.retain(|l| !l.to_ascii_lowercase().starts_with("connection:"));
    let request = format!("{}\r\nConnection: close\r\n\r\n", lines.join("\r\n"));
    let mut server = TcpStream::connect(upstream).unwrap();
    server.write_all(request.as_bytes()).unwrap();
    let Some((response_head, mut body)) = read_head(&mut server) else {
        return;
    };
    let _ = client.write_all(&response_head);
    let fault = if is_weights {
        armed.lock().unwrap().take()
    } else {
        None
    };
    let mut sent = 0usize;
    let mut chunk = [0u8; 65536];
    loop {
        if body.is_empty() {
            let n = server.read(&mut chunk).unwrap_or(0);
            if n == 0 {
                return;
            }
            body.extend_from_slice(&chunk[..n]);
        }
        match fault {
            Some(Fault::Flip(k)) if k >= sent && k < sent + body.len() => body[k - sent] ^= 0xff,
            Some(Fault::Cut(n)) if sent + body.len() >= n => {
                let _ = client.write_all(&body[..n - sent]);
                let _ = client.shutdown(std::net::Shutdown::Both);
                return;
            }
            _ => {}
        }
        if client.write_all(&body).is_err() {
            return;
        }
        sent += body.len();
        body.clear();
    }
}

fn get(addr: SocketAddr, path: &str, range: Option<&str>) -> (u16, Vec<u8>) {
    let mut s = TcpStream::connect(addr).unwrap();
    let range = range.map(|r| format!("Range: {r}\r\n")).unwrap_or_default();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: x\r\n{range}Connection: close\r\n\r\n"
    )
    .unwrap();
    let mut out = Vec::new();
    s.read_to_end(&mut out).unwrap();
    let end = out.windows(4).position(|w| w == b"\r\n\r\n").unwrap();
    let head = String::from_utf8_lossy(&out[..end]).to_string();
    let status = head.split(' ').nth(1).unwrap().parse().unwrap();
    (status, out[end + 4..].to_vec())
}

fn fetcher(url: &str, dest: &Path) -> Fetcher {
    Fetcher::new(url, dest, FetcherConfig::default())
}

#[test]
fn a_version_is_served_fetched_verified_and_loads_the_same_tensors() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("published");
    let original = tensors(1);
    let published = publish(&root, 1, &original, 2).unwrap();
    let server = WeightServer::start(
        "127.0.0.1:0".parse().unwrap(),
        Access::unauthenticated(),
        &root,
    )
    .unwrap();

    let fetched = fetcher(&server.url(), &tmp.path().join("worker"))
        .fetch(None)
        .unwrap();
    assert_eq!(fetched.manifest, published.manifest);
    assert_eq!(fetched.bytes_received, published.manifest.bytes());
    assert_eq!((fetched.digest_retries, fetched.resumed), (0, 0));
    assert_same(&original, &load_tensors(&fetched.dir).unwrap());

    // Ranges, straight from the server.
    let file = std::fs::read(published.dir.join("model.safetensors")).unwrap();
    let (status, body) = get(
        server.local_addr(),
        "/weights/v1/model.safetensors",
        Some("bytes=10-19"),
    );
    assert_eq!((status, body.as_slice()), (206, &file[10..20]));
    let (status, body) = get(
        server.local_addr(),
        "/weights/v1/model.safetensors",
        Some("bytes=-7"),
    );
    assert_eq!((status, body.as_slice()), (206, &file[file.len() - 7..]));
    let tail = format!("bytes={}-", file.len());
    assert_eq!(
        get(
            server.local_addr(),
            "/weights/v1/model.safetensors",
            Some(&tail)
        )
        .0,
        416
    );
    assert_eq!(
        get(server.local_addr(), "/weights/v1/../../etc/passwd", None).0,
        404
    );
    let (status, body) = get(server.local_addr(), "/weights/v7/manifest.json", None);
    assert_eq!(status, 404);
    assert!(String::from_utf8_lossy(&body).contains("kept versions: [1]"));

    // A newer version replaces the oldest beyond `keep`; `latest` follows it.
    publish(&root, 2, &tensors(2), 1).unwrap();
    let f = fetcher(&server.url(), &tmp.path().join("worker"));
    assert_eq!(f.latest().unwrap().version, 2);
    let v2 = f.fetch(None).unwrap();
    assert_same(&tensors(2), &load_tensors(&v2.dir).unwrap());
    let gone = f.fetch(Some(1)).unwrap_err();
    assert!(matches!(gone, WeightPlaneError::Http { .. }), "{gone}");
    assert!(gone.to_string().contains("status 404"), "{gone}");
    // Already here: nothing is downloaded again.
    assert_eq!(f.fetch(Some(2)).unwrap().bytes_received, 0);
}

#[test]
fn a_corrupted_transfer_is_refused_by_its_digest_and_fetched_again() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("published");
    let original = tensors(3);
    let published = publish(&root, 5, &original, 2).unwrap();
    let server = WeightServer::start(
        "127.0.0.1:0".parse().unwrap(),
        Access::unauthenticated(),
        &root,
    )
    .unwrap();
    let proxy = Proxy::start(server.local_addr(), Fault::Flip(20_000));

    let fetched = fetcher(&proxy.url(), &tmp.path().join("worker"))
        .fetch(Some(5))
        .unwrap();
    assert_eq!(fetched.digest_retries, 1);
    assert_eq!(fetched.bytes_received, 2 * published.manifest.bytes());
    assert_same(&original, &load_tensors(&fetched.dir).unwrap());
    let file_requests: Vec<String> = proxy
        .requests()
        .into_iter()
        .filter(|r| r.contains("model.safetensors"))
        .collect();
    assert_eq!(file_requests.len(), 2, "{file_requests:?}");
}

#[test]
fn a_broken_transfer_resumes_with_a_range_request() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("published");
    let original = tensors(4);
    let published = publish(&root, 3, &original, 2).unwrap();
    let server = WeightServer::start(
        "127.0.0.1:0".parse().unwrap(),
        Access::unauthenticated(),
        &root,
    )
    .unwrap();
    let proxy = Proxy::start(server.local_addr(), Fault::Cut(30_000));

    let fetched = fetcher(&proxy.url(), &tmp.path().join("worker"))
        .fetch(Some(3))
        .unwrap();
    assert_eq!((fetched.resumed, fetched.digest_retries), (1, 0));
    assert_eq!(fetched.bytes_received, published.manifest.bytes());
    assert_same(&original, &load_tensors(&fetched.dir).unwrap());
    let requests = proxy.requests();
    assert!(
        requests
            .iter()
            .any(|r| r.contains("model.safetensors") && r.contains("bytes=30000-")),
        "{requests:?}"
    );
}

#[test]
fn a_file_corrupted_at_the_source_fails_every_attempt_and_leaves_no_version() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("published");
    let published = publish(&root, 9, &tensors(5), 2).unwrap();
    let path = published.dir.join("model.safetensors");
    let mut bytes = std::fs::read(&path).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 0x01;
    std::fs::write(&path, bytes).unwrap();
    let server = WeightServer::start(
        "127.0.0.1:0".parse().unwrap(),
        Access::unauthenticated(),
        &root,
    )
    .unwrap();

    let dest = tmp.path().join("worker");
    let e = fetcher(&server.url(), &dest).fetch(Some(9)).unwrap_err();
    match &e {
        WeightPlaneError::Digest {
            version,
            file,
            attempts,
            ..
        } => {
            assert_eq!(
                (*version, file.as_str(), *attempts),
                (9, "model.safetensors", 4)
            );
        }
        other => panic!("expected a digest error, got {other}"),
    }
    assert!(e.to_string().contains("does not match the manifest"), "{e}");
    assert!(
        !dest.join("v00000009").exists(),
        "no unverified version is kept"
    );
}

#[test]
fn a_lora_runs_base_is_published_once_beside_the_versions_and_fetched_once() {
    let tmp = tempfile::tempdir().unwrap();
    let model = tmp.path().join("model");
    std::fs::create_dir_all(model.join("critic")).unwrap();
    let base = tensors(3);
    Tensor::write_safetensors(&base, model.join("model.safetensors")).unwrap();
    std::fs::write(model.join("config.json"), "{}").unwrap();
    let root = tmp.path().join("published");
    let published = publish_base(&root, &model).unwrap();
    // The model directory is left as it was; its subdirectories are not part of the base.
    assert!(model.join("model.safetensors").is_file());
    let mut names: Vec<&str> = published
        .manifest
        .files
        .iter()
        .map(|f| f.name.as_str())
        .collect();
    names.sort();
    assert_eq!(names, ["config.json", "model.safetensors"]);
    // The versions beside it hold what changes, and `latest` is still the newest version.
    publish(&root, 5, &tensors(4)[2..], 2).unwrap();
    let server = WeightServer::start(
        "127.0.0.1:0".parse().unwrap(),
        Access::unauthenticated(),
        &root,
    )
    .unwrap();
    let (_, announced) =
        agent_r1::file_digest::sha256_file(&published.dir.join("manifest.json")).unwrap();
    let worker = tmp.path().join("worker");
    let f = fetcher(&server.url(), &worker);
    assert_eq!(f.latest().unwrap().version, 5);
    let wrong = format!("{:064x}", 2);
    let e = f.fetch_base_pinned(&wrong).unwrap_err();
    assert!(e.to_string().contains("announced"), "{e}");
    let fetched = f.fetch_base_pinned(&announced).unwrap();
    assert_eq!(fetched.bytes_received, published.manifest.bytes());
    assert_same(
        &base,
        &Tensor::read_safetensors(fetched.dir.join("model.safetensors")).unwrap(),
    );
    // Fetched once: a second fetch (a worker that rejoins) downloads nothing.
    assert_eq!(f.fetch_base_pinned(&announced).unwrap().bytes_received, 0);
    // Another run's base in its place is replaced.
    std::fs::write(model.join("config.json"), "{\"other\": 1}").unwrap();
    let republished = publish_base(&root, &model).unwrap();
    let (_, other) =
        agent_r1::file_digest::sha256_file(&republished.dir.join("manifest.json")).unwrap();
    let again = f.fetch_base_pinned(&other).unwrap();
    assert_eq!(again.bytes_received, republished.manifest.bytes());
    assert_eq!(
        std::fs::read_to_string(again.dir.join("config.json")).unwrap(),
        "{\"other\": 1}"
    );
}

#[test]
fn a_pinned_fetch_refuses_a_manifest_other_than_the_one_announced() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("published");
    let original = tensors(7);
    let published = publish(&root, 4, &original, 2).unwrap();
    let server = WeightServer::start(
        "127.0.0.1:0".parse().unwrap(),
        Access::unauthenticated(),
        &root,
    )
    .unwrap();
    let (_, announced) =
        agent_r1::file_digest::sha256_file(&published.dir.join("manifest.json")).unwrap();

    // A manifest changed on the server (or on the way), digests and all, is refused whole.
    let wrong = format!("{:064x}", 1);
    let e = fetcher(&server.url(), &tmp.path().join("w1"))
        .fetch_pinned(4, &wrong)
        .unwrap_err();
    assert!(
        matches!(&e, WeightPlaneError::Manifest { message, .. } if message.contains("announced")),
        "{e}"
    );
    assert!(!tmp.path().join("w1").join("v00000004").exists());

    let fetched = fetcher(&server.url(), &tmp.path().join("w2"))
        .fetch_pinned(4, &announced)
        .unwrap();
    assert_same(&original, &load_tensors(&fetched.dir).unwrap());
}

#[test]
fn off_loopback_the_weight_server_wants_its_token_and_fetchers_present_it() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("published");
    let original = tensors(3);
    publish(&root, 1, &original, 2).unwrap();
    let any: SocketAddr = "0.0.0.0:0".parse().unwrap();

    // No token on every interface: refused before it listens, the config's rule says why.
    let e = WeightServer::start(any, Access::unauthenticated(), &root).unwrap_err();
    assert!(e.to_string().contains("no bearer token"), "{e}");
    let section = agent_r1::config::ClusterSection {
        listen: "127.0.0.1:0".into(),
        cookie_file: Some(tmp.path().join("cookie")),
        weights_listen: "0.0.0.0:0".into(),
        ..Default::default()
    };
    let e = agent_r1_envs::config::Section::validate(&section).unwrap_err();
    assert_eq!(e.key, "weights_listen", "{e}");
    assert!(e.message.contains("weights_token_file"), "{e}");

    let token = "0f1e2d3c4b5a69788796a5b4";
    let token_file = tmp.path().join("weights-token");
    std::fs::write(&token_file, token).unwrap();
    let section = agent_r1::config::ClusterSection {
        weights_token_file: Some(token_file),
        ..section
    };
    agent_r1_envs::config::Section::validate(&section).unwrap();
    let server = WeightServer::start(any, section.weights_access().unwrap(), &root).unwrap();
    let url = format!("http://127.0.0.1:{}", server.local_addr().port());

    let e = fetcher(&url, &tmp.path().join("stranger"))
        .fetch(None)
        .unwrap_err();
    assert!(e.to_string().contains("status 401"), "{e}");
    let e = fetcher(&url, &tmp.path().join("wrong"))
        .with_token(Some("0f1e2d3c4b5a69788796a5b5"))
        .fetch(None)
        .unwrap_err();
    assert!(e.to_string().contains("status 401"), "{e}");
    let fetched = fetcher(&url, &tmp.path().join("worker"))
        .with_token(Some(token))
        .fetch(None)
        .unwrap();
    assert_same(&original, &load_tensors(&fetched.dir).unwrap());
}
