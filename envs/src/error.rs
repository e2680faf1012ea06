//! The crate's error type.

use std::path::PathBuf;

/// Everything that can go wrong in tools, environments, datasets and rewards.
///
/// Variants carry the *where* (file, line, field, tool name) so that a user reading the
/// one-line message knows what to fix without a backtrace.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Reading or writing a file failed.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// A data file had a row or field that does not fit its format.
    #[error("{path}:{line}: {message}")]
    BadRow {
        /// The file.
        path: PathBuf,
        /// 1-based line (or row) number.
        line: usize,
        /// What is wrong and what is allowed.
        message: String,
    },
    /// A configuration value is out of range or of the wrong kind.
    #[error("invalid config `{key}`: {message}")]
    Config {
        /// The key (dotted path).
        key: String,
        /// What is wrong and what is allowed.
        message: String,
    },
    /// No tool or env registered under this name.
    #[error("unknown {kind} `{name}` (known: {known})")]
    Unknown {
        /// "tool" or "env" or "dataset format".
        kind: &'static str,
        /// The name asked for.
        name: String,
        /// Comma-separated list of registered names.
        known: String,
    },
    /// A tool failed while running (the episode turns this into an observation).
    #[error("tool `{tool}` failed: {message}")]
    Tool {
        /// The tool's name.
        tool: String,
        /// What happened.
        message: String,
    },
    /// A data file as a whole cannot be read in the expected format (not one row of it).
    #[error("{path}: {message}")]
    BadFile {
        /// The file.
        path: PathBuf,
        /// What is wrong and what is allowed.
        message: String,
    },
    /// Any other error with its context already in the message.
    #[error("{0}")]
    Other(String),
}

/// The crate's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// An I/O error on `path`.
    pub fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Error::Io {
            path: path.into(),
            source,
        }
    }
}
