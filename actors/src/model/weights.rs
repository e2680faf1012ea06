//! Reading and writing Hugging Face safetensors weights into a tch `VarStore`.
//!
//! Written against the safetensors crate rather than `VarStore::load` so that every error names
//! the file and the tensor (a wrong shape says which tensor and what config.json implies), so
//! sharded checkpoints (`model.safetensors.index.json`) load, and so that saved files carry the
//! `{"format": "pt"}` metadata that `transformers` requires.

use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};

use safetensors::{Dtype, SafeTensors};
use tch::{nn::VarStore, Kind, Tensor};

use crate::{Error, Result};

/// Weight file of a single-file checkpoint.
pub const WEIGHTS_FILE: &str = "model.safetensors";
/// Index of a sharded checkpoint.
pub const WEIGHTS_INDEX_FILE: &str = "model.safetensors.index.json";

/// The safetensors files of a model directory: the single file, or the shards the index names.
pub fn weight_files(dir: &Path) -> Result<Vec<PathBuf>> {
    let single = dir.join(WEIGHTS_FILE);
    if single.is_file() {
        return Ok(vec![single]);
    }
    let index = dir.join(WEIGHTS_INDEX_FILE);
    if !index.is_file() {
        return Err(Error::model(
            dir,
            format!("no {WEIGHTS_FILE} and no {WEIGHTS_INDEX_FILE} in the model directory"),
        ));
    }
    let text = std::fs::read_to_string(&index).map_err(|e| Error::io(&index, e))?;
    let json: serde_json::Value = serde_json::from_str(&text)
        .map_err(|e| Error::model(&index, format!("not valid JSON: {e}")))?;
    let map = json
        .get("weight_map")
        .and_then(|m| m.as_object())
        .ok_or_else(|| Error::model(&index, "missing object `weight_map`"))?;
    let shards: BTreeSet<&str> = map.values().filter_map(|v| v.as_str()).collect();
    if shards.is_empty() {
        return Err(Error::model(&index, "`weight_map` names no shard files"));
    }
    Ok(shards.into_iter().map(|s| dir.join(s)).collect())
}

pub(crate) fn kind_of(dtype: Dtype) -> Option<Kind> {
    Some(match dtype {
        Dtype::F32 => Kind::Float,
        Dtype::F16 => Kind::Half,
        Dtype::BF16 => Kind::BFloat16,
        Dtype::F64 => Kind::Double,
        _ => return None,
    })
}

/// Names a checkpoint may hold that this model deliberately does not use.
fn ignorable(name: &str) -> bool {
    name.ends_with("rotary_emb.inv_freq")
}

/// Copies every variable of `vs` from the safetensors files of `dir`.
///
/// Variables whose name starts with one of `optional_prefixes` (a fresh value head, say) keep
/// their initial values when the checkpoint lacks them; any other missing variable is an error,
/// and so is a checkpoint tensor with no variable unless `allow_unused` is set (a tied
/// `lm_head.weight`, a value head the caller did not ask for).
pub fn load_into(
    vs: &mut VarStore,
    dir: &Path,
    optional_prefixes: &[&str],
    allow_unused: &dyn Fn(&str) -> bool,
) -> Result<()> {
    let variables: HashMap<String, Tensor> = vs.variables();
    let mut seen = BTreeSet::new();
    for file in weight_files(dir)? {
        let bytes = std::fs::read(&file).map_err(|e| Error::io(&file, e))?;
        let st = SafeTensors::deserialize(&bytes)
            .map_err(|e| Error::model(&file, format!("not a safetensors file: {e}")))?;
        for (name, view) in st.tensors() {
            let Some(var) = variables.get(&name) else {
                if ignorable(&name) || allow_unused(&name) {
                    continue;
                }
                return Err(Error::model(
                    &file,
                    format!("unexpected tensor `{name}`: no such weight in this architecture"),
                ));
            };
            let shape: Vec<i64> = view.shape().iter().map(|&d| d as i64).collect();
            if shape != var.size() {
                return Err(Error::model(
                    &file,
                    format!(
                        "tensor `{name}` has shape {shape:?}, but config.json implies {:?}",
                        var.size()
                    ),
                ));
            }
            let kind = kind_of(view.dtype()).ok_or_else(|| {
                Error::model(
                    &file,
                    format!(
                        "tensor `{name}` has dtype {:?} (supported: F32, F16, BF16, F64)",
                        view.dtype()
                    ),
                )
            })?;
            let src = Tensor::f_from_data_size(view.data(), &shape, kind)?;
            tch::no_grad(|| {
                let mut var = var.shallow_clone();
                var.copy_(&src.to_kind(var.kind()).to_device(var.device()))
            });
            seen.insert(name);
        }
    }
    let missing: Vec<&String> = variables
        .keys()
        .filter(|n| !seen.contains(*n))
        .filter(|n| !optional_prefixes.iter().any(|p| n.starts_with(p)))
        .collect();
    if !missing.is_empty() {
        let mut names: Vec<&str> = missing.iter().map(|s| s.as_str()).collect();
        names.sort_unstable();
        let shown = names.iter().take(5).copied().collect::<Vec<_>>().join(", ");
        return Err(Error::model(
            dir,
            format!(
                "{} weight(s) missing from the checkpoint: {shown}{}",
                names.len(),
                if names.len() > 5 { ", ..." } else { "" }
            ),
        ));
    }
    Ok(())
}

/// The largest shard [`save_weights`] writes before splitting (transformers' default was 5 GB).
pub const MAX_SHARD_BYTES: usize = 5_000_000_000;

/// The safetensors dtype and config.json `dtype` name of a float kind.
pub fn dtype_name(kind: Kind) -> Result<(Dtype, &'static str)> {
    Ok(match kind {
        Kind::Float => (Dtype::F32, "float32"),
        Kind::BFloat16 => (Dtype::BF16, "bfloat16"),
        Kind::Half => (Dtype::F16, "float16"),
        other => {
            return Err(Error::invalid(
                "dtype",
                format!("cannot save weights as {other:?} (supported: float32, bfloat16, float16)"),
            ))
        }
    })
}

/// Writes `tensors` into `dir` as `kind`: one `model.safetensors`, or shards of at most
/// `max_shard_bytes` named as transformers names them with a `model.safetensors.index.json`.
/// Weight files of an earlier save in `dir` are removed first, so a loader never mixes them.
pub fn save_weights(
    dir: &Path,
    tensors: &[(String, Tensor)],
    kind: Kind,
    max_shard_bytes: usize,
) -> Result<()> {
    for entry in std::fs::read_dir(dir).map_err(|e| Error::io(dir, e))? {
        let path = entry.map_err(|e| Error::io(dir, e))?.path();
        let name = path
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_default();
        let stale = name == WEIGHTS_FILE
            || name == WEIGHTS_INDEX_FILE
            || (name.starts_with("model-") && name.ends_with(".safetensors"));
        if stale {
            std::fs::remove_file(&path).map_err(|e| Error::io(&path, e))?;
        }
    }
    let (_, elt) = dtype_name(kind)?;
    let elt_size = kind.elt_size_in_bytes();
    let mut shards: Vec<Vec<&(String, Tensor)>> = vec![vec![]];
    let mut bytes = 0usize;
    for t in tensors {
        let size = t.1.numel() * elt_size;
        if bytes > 0 && bytes + size > max_shard_bytes {
            shards.push(vec![]);
            bytes = 0;
        }
        shards.last_mut().expect("one shard").push(t);
        bytes += size;
    }
    if shards.len() == 1 {
        return save_tensors(&dir.join(WEIGHTS_FILE), tensors, kind);
    }
    let n = shards.len();
    let mut weight_map = serde_json::Map::new();
    let mut total = 0usize;
    for (i, shard) in shards.iter().enumerate() {
        let file = format!("model-{:05}-of-{n:05}.safetensors", i + 1);
        let owned: Vec<(String, Tensor)> = shard
            .iter()
            .map(|(name, t)| (name.clone(), t.shallow_clone()))
            .collect();
        save_tensors(&dir.join(&file), &owned, kind)?;
        for (name, t) in &owned {
            weight_map.insert(name.clone(), file.clone().into());
            total += t.numel() * elt_size;
        }
    }
    let index = serde_json::json!({
        "metadata": {"total_size": total, "dtype": elt},
        "weight_map": weight_map,
    });
    let path = dir.join(WEIGHTS_INDEX_FILE);
    let text = serde_json::to_string_pretty(&index)
        .map_err(|e| Error::model(&path, format!("cannot serialize: {e}")))?;
    std::fs::write(&path, text).map_err(|e| Error::io(&path, e))
}

/// Writes `tensors` as one safetensors file of `kind` with the metadata `transformers`
/// expects.
pub fn save_tensors(path: &Path, tensors: &[(String, Tensor)], kind: Kind) -> Result<()> {
    let (dtype, _) = dtype_name(kind)?;
    let mut buffers: Vec<(String, Vec<usize>, Vec<u8>)> = Vec::with_capacity(tensors.len());
    for (name, t) in tensors {
        let t = t
            .detach()
            .to_device(tch::Device::Cpu)
            .to_kind(kind)
            .contiguous();
        let shape: Vec<usize> = t.size().iter().map(|&d| d as usize).collect();
        let numel = t.numel();
        let mut bytes = vec![0u8; numel * kind.elt_size_in_bytes()];
        t.f_copy_data_u8(&mut bytes, numel)?;
        buffers.push((name.clone(), shape, bytes));
    }
    let views = buffers
        .iter()
        .map(|(name, shape, bytes)| {
            safetensors::tensor::TensorView::new(dtype, shape.clone(), bytes)
                .map(|v| (name.clone(), v))
                .map_err(|e| Error::model(path, format!("tensor `{name}`: {e}")))
        })
        .collect::<Result<Vec<_>>>()?;
    let metadata = HashMap::from([("format".to_string(), "pt".to_string())]);
    safetensors::serialize_to_file(views, Some(metadata), path)
        .map_err(|e| Error::model(path, format!("writing safetensors: {e}")))
}
