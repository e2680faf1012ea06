//! The identity of an index: what it was built from and how.
//!
//! A fingerprint lists each corpus file's path, size, modification time and a 64-bit FNV-1a
//! hash of its bytes, plus the index settings. It is stored as JSON in the index directory;
//! an index whose stored fingerprint does not [`Fingerprint::matches`] the corpus's current
//! one is rebuilt. Comparing content hashes (always computed) rather than mtimes makes a
//! touched-but-unchanged file reuse its index and a file rewritten within one mtime tick
//! still rebuild it.

use std::io::Read;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// One corpus file as indexed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileFingerprint {
    /// The path as configured.
    pub path: String,
    /// Size in bytes.
    pub size: u64,
    /// Modification time, nanoseconds since the Unix epoch (0 where unknown).
    pub mtime_ns: u128,
    /// FNV-1a 64 of the bytes, hex.
    pub hash: String,
}

/// Everything an index depends on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Fingerprint {
    /// Index layout version (bumped when the schema or tokenisation changes).
    pub format: String,
    /// The corpus files.
    pub files: Vec<FileFingerprint>,
    /// Settings that change the index's content.
    pub options: serde_json::Value,
}

impl Fingerprint {
    /// Fingerprints `files` (reading each once) with the index `options`.
    pub fn compute(format: &str, files: &[&Path], options: serde_json::Value) -> Result<Self> {
        let files = files
            .iter()
            .map(|p| file_fingerprint(p))
            .collect::<Result<Vec<_>>>()?;
        Ok(Self {
            format: format.to_string(),
            files,
            options,
        })
    }

    /// Whether an index built for `self` serves `other`: same format, options, and files of
    /// the same path, size and content hash. The mtime is recorded for people reading the
    /// file but not compared, so touching a file does not force a rebuild.
    pub fn matches(&self, other: &Fingerprint) -> bool {
        self.format == other.format
            && self.options == other.options
            && self.files.len() == other.files.len()
            && self
                .files
                .iter()
                .zip(&other.files)
                .all(|(a, b)| a.path == b.path && a.size == b.size && a.hash == b.hash)
    }

    /// The fingerprint stored at `path`, if readable.
    pub fn load(path: &Path) -> Option<Self> {
        let text = std::fs::read_to_string(path).ok()?;
        serde_json::from_str(&text).ok()
    }

    /// Writes the fingerprint to `path`.
    pub fn store(&self, path: &Path) -> Result<()> {
        let text = serde_json::to_string_pretty(self).map_err(|e| Error::Other(e.to_string()))?;
        std::fs::write(path, text).map_err(|e| Error::io(path, e))
    }
}

fn file_fingerprint(path: &Path) -> Result<FileFingerprint> {
    let meta = std::fs::metadata(path).map_err(|e| Error::io(path, e))?;
    let mtime_ns = meta
        .modified()
        .ok()
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_nanos());
    let mut file = std::fs::File::open(path).map_err(|e| Error::io(path, e))?;
    let mut hash = Fnv64::default();
    let mut buf = vec![0u8; 1 << 16];
    loop {
        let n = file.read(&mut buf).map_err(|e| Error::io(path, e))?;
        if n == 0 {
            break;
        }
        hash.write(&buf[..n]);
    }
    Ok(FileFingerprint {
        path: path.to_string_lossy().into_owned(),
        size: meta.len(),
        mtime_ns,
        hash: format!("{:016x}", hash.0),
    })
}

/// FNV-1a, 64-bit: stable across Rust versions (unlike `DefaultHasher`).
struct Fnv64(u64);

impl Default for Fnv64 {
    fn default() -> Self {
        Fnv64(0xcbf2_9ce4_8422_2325)
    }
}

impl Fnv64 {
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 ^= u64::from(b);
            self.0 = self.0.wrapping_mul(0x0100_0000_01b3);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fnv_matches_reference_values() {
        let mut h = Fnv64::default();
        h.write(b"a");
        assert_eq!(h.0, 0xaf63_dc4c_8601_ec8c);
    }

    #[test]
    fn content_and_options_change_the_fingerprint() {
        let tmp = tempfile::tempdir().unwrap();
        let p = tmp.path().join("c.jsonl");
        std::fs::write(&p, "abc").unwrap();
        let opts = serde_json::json!({"k": 1});
        let a = Fingerprint::compute("v1", &[&p], opts.clone()).unwrap();
        assert_eq!(a, Fingerprint::compute("v1", &[&p], opts.clone()).unwrap());
        assert_ne!(
            a,
            Fingerprint::compute("v1", &[&p], serde_json::json!({"k": 2})).unwrap()
        );
        std::fs::write(&p, "abd").unwrap();
        let b = Fingerprint::compute("v1", &[&p], opts.clone()).unwrap();
        assert_ne!(a.files[0].hash, b.files[0].hash);
        assert!(!a.matches(&b));
        let mut touched = b.clone();
        touched.files[0].mtime_ns += 1;
        assert!(b.matches(&touched), "mtime alone does not invalidate");
        let stored = tmp.path().join("fp.json");
        b.store(&stored).unwrap();
        assert_eq!(Fingerprint::load(&stored), Some(b));
    }
}
