//! A published version on disk: its files and the manifest that names their digests.

use std::path::{Path, PathBuf};

use agent_r1_actors::model::lora::PEFT_PREFIX;
use serde::{Deserialize, Serialize};
use tch::Tensor;

use super::{io_error, WeightPlaneError};
use crate::file_digest::sha256_file;

/// The one weights file of a version.
pub const WEIGHTS_FILE: &str = "model.safetensors";
/// The manifest beside it.
pub const MANIFEST_FILE: &str = "manifest.json";
/// Where [`publish_base`] puts a LoRA run's frozen base, beside the versions.
pub const BASE_DIR: &str = "base";

/// What a version holds, as the trainer wrote it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    /// The policy version.
    pub version: u64,
    /// Its files, with sizes and digests.
    pub files: Vec<FileEntry>,
}

/// One file of a version.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileEntry {
    /// Its name inside the version's directory (no path separators).
    pub name: String,
    /// Its size.
    pub bytes: u64,
    /// Its SHA-256, lowercase hex.
    pub sha256: String,
}

impl Manifest {
    /// Bytes of all files.
    pub fn bytes(&self) -> u64 {
        self.files.iter().map(|f| f.bytes).sum()
    }

    /// The entry named `name`, if the version has it.
    pub fn file(&self, name: &str) -> Option<&FileEntry> {
        self.files.iter().find(|f| f.name == name)
    }

    /// Parses a manifest read from `at` (a path or URL, for the error), checking that its
    /// file names are plain names.
    pub fn parse(text: &[u8], at: &str) -> Result<Self, WeightPlaneError> {
        let bad = |message: String| WeightPlaneError::Manifest {
            at: at.to_string(),
            message,
        };
        let m: Manifest = serde_json::from_slice(text).map_err(|e| bad(e.to_string()))?;
        for f in &m.files {
            if !plain_name(&f.name) {
                return Err(bad(format!("file name {:?} is not a plain name", f.name)));
            }
            if f.sha256.len() != 64 || !f.sha256.bytes().all(|b| b.is_ascii_hexdigit()) {
                return Err(bad(format!(
                    "{}: sha256 {:?} is not 64 hex digits",
                    f.name, f.sha256
                )));
            }
        }
        Ok(m)
    }
}

/// Whether `name` names a file inside a version directory and nothing else.
pub(super) fn plain_name(name: &str) -> bool {
    !name.is_empty() && name != "." && name != ".." && !name.contains(['/', '\\', '\0'])
}

/// The directory of `version` under `root`.
pub(super) fn version_dir(root: &Path, version: u64) -> PathBuf {
    root.join(format!("v{version:08}"))
}

/// The versions complete under `root`, oldest first (a version's directory appears whole:
/// it is written under another name and renamed).
pub(super) fn versions(root: &Path) -> Vec<u64> {
    let mut v: Vec<u64> = std::fs::read_dir(root)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            let n = name.strip_prefix('v')?;
            (n.len() == 8).then(|| n.parse().ok()).flatten()
        })
        .collect();
    v.sort_unstable();
    v
}

/// A version written by [`publish`].
#[derive(Debug, Clone)]
pub struct PublishedVersion {
    /// Its directory.
    pub dir: PathBuf,
    /// Its manifest.
    pub manifest: Manifest,
}

/// Writes `tensors` as version `version` under `root` (the file, its digest, the manifest;
/// the directory appears only once complete) and removes all but the newest `keep`
/// versions.
pub fn publish(
    root: &Path,
    version: u64,
    tensors: &[(String, Tensor)],
    keep: usize,
) -> Result<PublishedVersion, WeightPlaneError> {
    let staging = staging_dir(root, version)?;
    let file = staging.join(WEIGHTS_FILE);
    Tensor::write_safetensors(tensors, &file).map_err(|e| WeightPlaneError::Tensors {
        path: file.clone(),
        message: e.to_string(),
    })?;
    finish(root, version, &staging, keep)
}

/// Publishes a saved policy directory (a Hugging Face directory: config, tokenizer,
/// safetensors shards) as version `version`: its plain files are moved in, so a worker that
/// fetches it has everything to start an engine from. `src` is consumed.
pub fn publish_dir(
    root: &Path,
    version: u64,
    src: &Path,
    keep: usize,
) -> Result<PublishedVersion, WeightPlaneError> {
    let staging = staging_dir(root, version)?;
    for entry in std::fs::read_dir(src).map_err(io_error(src))? {
        let entry = entry.map_err(io_error(src))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if entry.path().is_file() && plain_name(&name) && name != MANIFEST_FILE {
            let to = staging.join(&name);
            std::fs::rename(entry.path(), &to).map_err(io_error(&to))?;
        }
    }
    let _ = std::fs::remove_dir_all(src);
    finish(root, version, &staging, keep)
}

fn staging_dir(root: &Path, version: u64) -> Result<PathBuf, WeightPlaneError> {
    std::fs::create_dir_all(root).map_err(io_error(root))?;
    let staging = root.join(format!(".v{version:08}.partial"));
    let _ = std::fs::remove_dir_all(&staging);
    std::fs::create_dir_all(&staging).map_err(io_error(&staging))?;
    Ok(staging)
}

/// Publishes a LoRA run's frozen base, the model directory `src` (left as it is; its plain
/// files are hard-linked where the filesystem allows, else copied), once at `ROOT/base`:
/// each version then holds the adapters alone, and a worker fetches the base once. Its
/// manifest says version 0.
pub fn publish_base(root: &Path, src: &Path) -> Result<PublishedVersion, WeightPlaneError> {
    std::fs::create_dir_all(root).map_err(io_error(root))?;
    let staging = root.join(format!(".{BASE_DIR}.partial"));
    let _ = std::fs::remove_dir_all(&staging);
    std::fs::create_dir_all(&staging).map_err(io_error(&staging))?;
    for entry in std::fs::read_dir(src).map_err(io_error(src))? {
        let entry = entry.map_err(io_error(src))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if entry.path().is_file()
            && plain_name(&name)
            && name != MANIFEST_FILE
            && !name.starts_with('.')
        {
            let to = staging.join(&name);
            if std::fs::hard_link(entry.path(), &to).is_err() {
                std::fs::copy(entry.path(), &to).map_err(io_error(&to))?;
            }
        }
    }
    let manifest = write_manifest(&staging, 0)?;
    let dir = root.join(BASE_DIR);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::rename(&staging, &dir).map_err(io_error(&dir))?;
    Ok(PublishedVersion { dir, manifest })
}

/// Digests the staged files, writes the manifest, renames the directory into place and
/// prunes old versions.
fn finish(
    root: &Path,
    version: u64,
    staging: &Path,
    keep: usize,
) -> Result<PublishedVersion, WeightPlaneError> {
    let manifest = write_manifest(staging, version)?;
    let dir = version_dir(root, version);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::rename(staging, &dir).map_err(io_error(&dir))?;
    let all = versions(root);
    for old in &all[..all.len().saturating_sub(keep.max(1))] {
        let _ = std::fs::remove_dir_all(version_dir(root, *old));
    }
    Ok(PublishedVersion { dir, manifest })
}

/// Digests the files in `staging` and writes their manifest beside them.
fn write_manifest(staging: &Path, version: u64) -> Result<Manifest, WeightPlaneError> {
    let mut names: Vec<String> = std::fs::read_dir(staging)
        .map_err(io_error(staging))?
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    let mut files = Vec::new();
    for name in names {
        let file = staging.join(&name);
        let (bytes, sha256) = sha256_file(&file).map_err(io_error(&file))?;
        files.push(FileEntry {
            name,
            bytes,
            sha256,
        });
    }
    let manifest = Manifest { version, files };
    let text = serde_json::to_vec_pretty(&manifest).expect("a manifest serializes");
    let manifest_path = staging.join(MANIFEST_FILE);
    std::fs::write(&manifest_path, text).map_err(io_error(&manifest_path))?;
    Ok(manifest)
}

/// Reads a version's tensors back (names as published).
pub fn load_tensors(dir: &Path) -> Result<Vec<(String, Tensor)>, WeightPlaneError> {
    let file = dir.join(WEIGHTS_FILE);
    Tensor::read_safetensors(&file).map_err(|e| WeightPlaneError::Tensors {
        path: file,
        message: e.to_string(),
    })
}

/// Reads the policy tensors of a version published by [`publish_dir`] (every safetensors
/// file, names sorted, a value head left out): what an engine's weight update takes. A LoRA
/// version's tensors are PEFT's; they come back named as the model names its adapters, with
/// PEFT's prefix off.
pub fn load_policy(dir: &Path) -> Result<Vec<(String, Tensor)>, WeightPlaneError> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(io_error(dir))?
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "safetensors"))
        .collect();
    files.sort();
    let mut tensors = Vec::new();
    for file in files {
        let read = Tensor::read_safetensors(&file).map_err(|e| WeightPlaneError::Tensors {
            path: file.clone(),
            message: e.to_string(),
        })?;
        tensors.extend(
            read.into_iter()
                .filter(|(name, _)| !name.starts_with(agent_r1_actors::model::VALUE_HEAD))
                .map(|(name, t)| match name.strip_prefix(PEFT_PREFIX) {
                    Some(own) => (own.to_string(), t),
                    None => (name, t),
                }),
        );
    }
    tensors.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(tensors)
}
