//! Fetching a version from a [`super::WeightServer`]: file by file into a staging directory,
//! resuming an interrupted transfer with a range request, checking each file's SHA-256
//! against the manifest and downloading it again when it does not match. A version's
//! directory appears only once every file verified.
//!
//! Blocking (it reads sockets and hashes files): async callers run it on the blocking pool.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};

use super::manifest::{version_dir, Manifest, BASE_DIR, MANIFEST_FILE};
use super::{io_error, WeightPlaneError};
use crate::file_digest::{hex, sha256_state};

/// Limits of a [`Fetcher`].
#[derive(Debug, Clone, PartialEq)]
pub struct FetcherConfig {
    /// Downloads of one file before it is given up (a broken transfer resumes, a digest
    /// mismatch starts over; both count).
    pub attempts: u32,
    /// To connect, and then to receive a response's headers.
    pub connect_timeout: Duration,
    /// To receive one response's body (a whole file).
    pub transfer_timeout: Duration,
}

impl Default for FetcherConfig {
    fn default() -> Self {
        Self {
            attempts: 4,
            connect_timeout: Duration::from_secs(10),
            transfer_timeout: Duration::from_secs(1800),
        }
    }
}

/// Where to fetch from and to.
pub struct Fetcher {
    base: String,
    dest: PathBuf,
    config: FetcherConfig,
    agent: ureq::Agent,
    /// `Authorization` header value, when the server wants a bearer token.
    authorization: Option<String>,
}

/// Where a manifest's files are on the server (`/weights/SEGMENT/FILE`) and go here.
struct Place {
    segment: String,
    dir: PathBuf,
}

/// A version fetched and verified.
#[derive(Debug, Clone)]
pub struct Fetched {
    /// Its manifest.
    pub manifest: Manifest,
    /// Its directory under the fetcher's destination.
    pub dir: PathBuf,
    /// Bytes received (more than the version's size when a file was downloaded again).
    pub bytes_received: u64,
    /// Seconds from the manifest request to the last file verified.
    pub seconds: f64,
    /// Files downloaded again because their digest did not match.
    pub digest_retries: u32,
    /// Transfers resumed after they broke off.
    pub resumed: u32,
}

impl Fetcher {
    /// Fetches from `base` (`http://HOST:PORT`) into `dest`.
    pub fn new(base: &str, dest: &Path, config: FetcherConfig) -> Self {
        let agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_connect(Some(config.connect_timeout))
            .timeout_recv_response(Some(config.connect_timeout))
            .timeout_recv_body(Some(config.transfer_timeout))
            .build()
            .into();
        Self {
            base: base.trim_end_matches('/').to_string(),
            dest: dest.to_path_buf(),
            config,
            agent,
            authorization: None,
        }
    }

    /// Presents `token` to the server (`Authorization: Bearer TOKEN`).
    pub fn with_token(mut self, token: Option<&str>) -> Self {
        self.authorization = token.map(|t| format!("Bearer {t}"));
        self
    }

    fn get(&self, url: &str) -> ureq::RequestBuilder<ureq::typestate::WithoutBody> {
        let request = self.agent.get(url);
        match &self.authorization {
            Some(value) => request.header("Authorization", value),
            None => request,
        }
    }

    /// The newest version's manifest on the server.
    pub fn latest(&self) -> Result<Manifest, WeightPlaneError> {
        self.manifest("latest")
    }

    fn manifest(&self, which: &str) -> Result<Manifest, WeightPlaneError> {
        self.manifest_pinned(which, None)
    }

    /// The manifest of `which`, its bytes checked against `sha256` when given (a digest the
    /// trainer announced over an authenticated channel, so a manifest altered on the way,
    /// and with it the files' digests, is refused).
    fn manifest_pinned(
        &self,
        which: &str,
        sha256: Option<&str>,
    ) -> Result<Manifest, WeightPlaneError> {
        let url = match which {
            "latest" => format!("{}/weights/latest", self.base),
            v => format!("{}/weights/{v}/{MANIFEST_FILE}", self.base),
        };
        let http = |message: String| WeightPlaneError::Http {
            url: url.clone(),
            message,
        };
        let response = self.get(&url).call().map_err(|e| http(e.to_string()))?;
        let status = response.status().as_u16();
        let body = response
            .into_body()
            .with_config()
            .limit(1 << 20)
            .read_to_vec()
            .map_err(|e| http(e.to_string()))?;
        if status != 200 {
            return Err(http(format!(
                "status {status}: {}",
                String::from_utf8_lossy(&body).trim()
            )));
        }
        if let Some(expected) = sha256 {
            let got = hex(&Sha256::digest(&body));
            if got != expected {
                return Err(WeightPlaneError::Manifest {
                    at: url,
                    message: format!("SHA-256 {got}, but the trainer announced {expected}"),
                });
            }
        }
        Manifest::parse(&body, &url)
    }

    /// Fetches `version` (`None`: the newest), unless it is already here; verified file by
    /// file.
    pub fn fetch(&self, version: Option<u64>) -> Result<Fetched, WeightPlaneError> {
        let manifest = match version {
            None => self.latest()?,
            Some(v) => self.manifest(&format!("v{v}"))?,
        };
        self.fetch_manifest(manifest)
    }

    /// Fetches `version` whose manifest has the SHA-256 `manifest_sha256` (announced by the
    /// trainer on the control plane); verified file by file against that manifest.
    pub fn fetch_pinned(
        &self,
        version: u64,
        manifest_sha256: &str,
    ) -> Result<Fetched, WeightPlaneError> {
        let manifest = self.manifest_pinned(&format!("v{version}"), Some(manifest_sha256))?;
        self.fetch_manifest(manifest)
    }

    /// Fetches a LoRA run's frozen base (published once beside the versions, its manifest
    /// with the SHA-256 `manifest_sha256` the trainer announced) into `DEST/base`, unless it
    /// is already there; verified file by file.
    pub fn fetch_base_pinned(&self, manifest_sha256: &str) -> Result<Fetched, WeightPlaneError> {
        let manifest = self.manifest_pinned(BASE_DIR, Some(manifest_sha256))?;
        let place = Place {
            segment: BASE_DIR.to_string(),
            dir: self.dest.join(BASE_DIR),
        };
        // A base fetched for another run (or another base) is fetched again.
        let here = std::fs::read(place.dir.join(MANIFEST_FILE)).ok();
        if here.is_some_and(|bytes| hex(&Sha256::digest(&bytes)) != manifest_sha256) {
            let _ = std::fs::remove_dir_all(&place.dir);
        }
        self.fetch_into(manifest, place)
    }

    fn fetch_manifest(&self, manifest: Manifest) -> Result<Fetched, WeightPlaneError> {
        let place = Place {
            segment: format!("v{}", manifest.version),
            dir: version_dir(&self.dest, manifest.version),
        };
        self.fetch_into(manifest, place)
    }

    fn fetch_into(&self, manifest: Manifest, place: Place) -> Result<Fetched, WeightPlaneError> {
        let began = Instant::now();
        let dir = place.dir.clone();
        let mut fetched = Fetched {
            manifest: manifest.clone(),
            dir: dir.clone(),
            bytes_received: 0,
            seconds: 0.0,
            digest_retries: 0,
            resumed: 0,
        };
        if dir.join(MANIFEST_FILE).is_file() {
            fetched.seconds = began.elapsed().as_secs_f64();
            return Ok(fetched);
        }
        let staging = self.dest.join(format!(".{}.partial", place.segment));
        std::fs::create_dir_all(&staging).map_err(io_error(&staging))?;
        for entry in &manifest.files {
            self.fetch_file(&manifest, &place.segment, entry, &staging, &mut fetched)?;
        }
        let text = serde_json::to_vec_pretty(&manifest).expect("a manifest serializes");
        let path = staging.join(MANIFEST_FILE);
        std::fs::write(&path, text).map_err(io_error(&path))?;
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::rename(&staging, &dir).map_err(io_error(&dir))?;
        fetched.seconds = began.elapsed().as_secs_f64();
        metrics::histogram!(crate::metric_names::CLUSTER_WEIGHT_FETCH_SECONDS.name)
            .record(fetched.seconds);
        tracing::info!(
            version = manifest.version,
            bytes = fetched.bytes_received,
            seconds = fetched.seconds,
            "weights fetched and verified"
        );
        Ok(fetched)
    }

    fn fetch_file(
        &self,
        manifest: &Manifest,
        segment: &str,
        entry: &super::FileEntry,
        staging: &Path,
        fetched: &mut Fetched,
    ) -> Result<(), WeightPlaneError> {
        let path = staging.join(&entry.name);
        let url = format!("{}/weights/{segment}/{}", self.base, entry.name);
        let mut last_error = None;
        // The digest of what is on disk, kept up to date as bytes arrive, so a verified file
        // is read once; `hashed` is how many bytes it covers.
        let mut hasher = Sha256::new();
        let mut hashed = 0u64;
        for _ in 0..self.config.attempts.max(1) {
            let have = std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
            if have > entry.bytes {
                std::fs::remove_file(&path).map_err(io_error(&path))?;
                (hasher, hashed) = (Sha256::new(), 0);
                continue;
            }
            if have != hashed {
                // Left by an earlier process: hash what is there before appending to it.
                (hasher, hashed) = sha256_state(&path).map_err(io_error(&path))?;
            }
            if have < entry.bytes {
                if have > 0 {
                    fetched.resumed += 1;
                }
                let result = self.download(&url, &path, have, &mut hasher);
                let n = match &result {
                    Ok(n) | Err((n, _)) => *n,
                };
                fetched.bytes_received += n;
                // Appended to what was there, or (a server ignoring the range) the whole
                // file again: either way the digest covers exactly the file's bytes.
                hashed = std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
                if let Err((_, e)) = result {
                    metrics::counter!(crate::metric_names::CLUSTER_WEIGHT_FETCH_RETRIES_TOTAL.name, "reason" => "transfer")
                        .increment(1);
                    tracing::warn!("{e}; resuming");
                    last_error = Some(e);
                    continue;
                }
            }
            let bytes = hashed;
            let sha256 = hex(&std::mem::take(&mut hasher).finalize());
            hashed = 0;
            if bytes == entry.bytes && sha256 == entry.sha256 {
                return Ok(());
            }
            fetched.digest_retries += 1;
            metrics::counter!(crate::metric_names::CLUSTER_WEIGHT_FETCH_RETRIES_TOTAL.name, "reason" => "digest")
                .increment(1);
            tracing::warn!(
                file = entry.name,
                version = manifest.version,
                "SHA-256 {sha256} does not match the manifest's {}; downloading it again",
                entry.sha256
            );
            std::fs::remove_file(&path).map_err(io_error(&path))?;
            last_error = Some(WeightPlaneError::Digest {
                version: manifest.version,
                file: entry.name.clone(),
                expected: entry.sha256.clone(),
                got: sha256,
                attempts: self.config.attempts.max(1),
            });
        }
        let _ = std::fs::remove_file(&path);
        Err(last_error.unwrap_or_else(|| WeightPlaneError::Http {
            url,
            message: "no attempt was made".into(),
        }))
    }

    /// Appends the file's bytes from `from` on to `path`; returns the bytes received, also
    /// on failure (what arrived stays, for the next attempt to resume from).
    fn download(
        &self,
        url: &str,
        path: &Path,
        from: u64,
        hasher: &mut Sha256,
    ) -> Result<u64, (u64, WeightPlaneError)> {
        let http = |message: String| WeightPlaneError::Http {
            url: url.to_string(),
            message,
        };
        let mut request = self.get(url);
        if from > 0 {
            request = request.header("Range", format!("bytes={from}-"));
        }
        let response = request.call().map_err(|e| (0, http(e.to_string())))?;
        let status = response.status().as_u16();
        let append = match (status, from) {
            (206, f) if f > 0 => true,
            (200, _) => false,
            (s, _) => return Err((0, http(format!("status {s}")))),
        };
        if !append && from > 0 {
            // The server sent the whole file instead of the range: start the digest over.
            *hasher = Sha256::new();
        }
        let mut file = std::fs::OpenOptions::new()
            .create(true)
            .write(true)
            .append(append)
            .truncate(!append)
            .open(path)
            .map_err(|e| (0, io_error(path)(e)))?;
        let mut reader = response.into_body().into_reader();
        let mut buf = vec![0u8; 1 << 20];
        let mut received = 0u64;
        loop {
            let n = match reader.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => n,
                Err(e) => return Err((received, http(format!("after {received} bytes: {e}")))),
            };
            file.write_all(&buf[..n])
                .map_err(|e| (received, io_error(path)(e)))?;
            hasher.update(&buf[..n]);
            received += n as u64;
            metrics::counter!(crate::metric_names::CLUSTER_WEIGHT_FETCH_BYTES_TOTAL.name)
                .increment(n as u64);
        }
        Ok(received)
    }
}
