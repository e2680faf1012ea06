//! The weights' data plane: each policy version as a safetensors file with a manifest of
//! SHA-256 digests, served over HTTP with range requests, fetched and verified by whoever
//! samples elsewhere (a remote rollout worker). Weights never travel in actor messages: the
//! control plane carries versions, this carries bytes.
//!
//! ```text
//! trainer: publish(version, tensors) -> ROOT/v00000003/{model.safetensors, manifest.json}
//!          WeightServer: GET /weights/latest, /weights/v3/manifest.json, /weights/v3/FILE (Range)
//! worker:  Fetcher::fetch(version) -> DEST/v00000003/ verified file by file, then load_tensors
//! ```
//!
//! A LoRA run also publishes its frozen base once, at `ROOT/base` (`/weights/base/FILE`); its
//! versions then hold the adapters alone, and a worker fetches the base once
//! (`Fetcher::fetch_base_pinned`).

mod fetch;
mod manifest;
mod server;

pub use fetch::{Fetched, Fetcher, FetcherConfig};
pub use manifest::{
    load_policy, load_tensors, publish, publish_base, publish_dir, FileEntry, Manifest,
    PublishedVersion, BASE_DIR, MANIFEST_FILE,
};
pub use server::WeightServer;

/// What can go wrong on the data plane; every variant names what and where.
#[derive(Debug, thiserror::Error)]
pub enum WeightPlaneError {
    /// A file could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file or directory.
        path: std::path::PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// Tensors could not be written or read as safetensors.
    #[error("{path}: safetensors: {message}")]
    Tensors {
        /// The file.
        path: std::path::PathBuf,
        /// libtorch's message.
        message: String,
    },
    /// A manifest that does not parse or does not describe its version.
    #[error("manifest {at}: {message}")]
    Manifest {
        /// Where it came from (a path or a URL).
        at: String,
        /// What is wrong.
        message: String,
    },
    /// The server could not be reached or answered with an error.
    #[error("GET {url}: {message}")]
    Http {
        /// The request.
        url: String,
        /// What happened.
        message: String,
    },
    /// A file's bytes kept failing their digest after every attempt.
    #[error(
        "{file} of version {version}: SHA-256 {got} does not match the manifest's {expected} \
         after {attempts} attempts"
    )]
    Digest {
        /// The weights version.
        version: u64,
        /// The file in the manifest.
        file: String,
        /// The manifest's digest.
        expected: String,
        /// The last download's digest.
        got: String,
        /// Downloads tried.
        attempts: u32,
    },
    /// The server could not start.
    #[error("weight server on {addr}: {message}")]
    Serve {
        /// The address asked for.
        addr: std::net::SocketAddr,
        /// Why.
        message: String,
    },
}

fn io_error(path: &std::path::Path) -> impl FnOnce(std::io::Error) -> WeightPlaneError + '_ {
    move |source| WeightPlaneError::Io {
        path: path.to_path_buf(),
        source,
    }
}
