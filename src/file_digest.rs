//! SHA-256 of files, read in 1 MiB chunks (checkpoint manifests, the weight plane).

use std::io::Read;
use std::path::Path;

use sha2::{Digest, Sha256};

/// The digest state over a file's bytes, and how many bytes it covers (to go on hashing
/// what is appended).
pub fn sha256_state(path: &Path) -> std::io::Result<(Sha256, u64)> {
    let mut file = std::fs::File::open(path)?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    let mut bytes = 0u64;
    loop {
        let n = file.read(&mut buf)?;
        if n == 0 {
            return Ok((hasher, bytes));
        }
        hasher.update(&buf[..n]);
        bytes += n as u64;
    }
}

/// A file's size and SHA-256 (lowercase hex).
pub fn sha256_file(path: &Path) -> std::io::Result<(u64, String)> {
    let (hasher, bytes) = sha256_state(path)?;
    Ok((bytes, hex(&hasher.finalize())))
}

/// Lowercase hex of a digest.
pub fn hex(digest: &[u8]) -> String {
    digest.iter().map(|b| format!("{b:02x}")).collect()
}
