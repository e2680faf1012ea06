//! Choosing where tensors live: `--device cpu|cuda|cuda:N|auto` and `--dtype`.

pub mod cuda;
pub mod memory;

use tch::{Device, Kind};

use crate::model::Placement;
use crate::{Error, Result};

/// Parses a device name. `auto` picks CUDA when a GPU is visible.
pub fn parse_device(name: &str) -> Result<Device> {
    let cuda_available = tch::Cuda::is_available();
    let device = device_named(name)?;
    if let Device::Cuda(n) = device {
        if !cuda_available {
            return Err(Error::invalid(
                "--device",
                format!("`{name}` requested but CUDA is not available on this machine (use cpu or auto)"),
            ));
        }
        let count = tch::Cuda::device_count() as usize;
        if n >= count {
            return Err(Error::invalid(
                "--device",
                format!("cuda:{n} requested but only {count} CUDA device(s) are visible"),
            ));
        }
    }
    Ok(device)
}

/// The device a name means, without checking that this machine has it.
fn device_named(name: &str) -> Result<Device> {
    Ok(match name {
        "cpu" => Device::Cpu,
        "auto" => Device::cuda_if_available(),
        "cuda" => Device::Cuda(0),
        other => match other.strip_prefix("cuda:").map(str::parse::<usize>) {
            Some(Ok(n)) => Device::Cuda(n),
            _ => {
                return Err(Error::invalid(
                    "--device",
                    format!("unknown device `{other}` (allowed: cpu, cuda, cuda:N, auto)"),
                ))
            }
        },
    })
}

/// Parses `--dtype` (`auto`, `float32`, `bf16`) for a device: float32 on CPU, bf16 allowed
/// on CUDA, `auto` = float32 on CPU and bf16 on CUDA.
pub fn parse_placement(device: &str, dtype: &str) -> Result<Placement> {
    placement_on(parse_device(device)?, dtype)
}

/// [`parse_placement`] without checking that this machine has the device (`auto` means
/// CUDA): for planning a configuration meant for another machine.
pub fn parse_placement_elsewhere(device: &str, dtype: &str) -> Result<Placement> {
    let device = match device {
        "auto" => Device::Cuda(0),
        name => device_named(name)?,
    };
    placement_on(device, dtype)
}

/// The dtype a model's weights are written in (`init-model`, `export`, weight benches):
/// `bf16`, `float16` or `float32`, any device.
pub fn parse_storage_dtype(name: &str) -> Result<Kind> {
    match name {
        "bf16" | "bfloat16" => Ok(Kind::BFloat16),
        "float16" | "fp16" | "half" => Ok(Kind::Half),
        "float32" | "f32" | "fp32" => Ok(Kind::Float),
        other => Err(Error::invalid(
            "--dtype",
            format!("unknown dtype `{other}` (allowed: bf16, float16, float32)"),
        )),
    }
}

fn placement_on(device: Device, dtype: &str) -> Result<Placement> {
    let kind = match (dtype, device) {
        ("float32" | "f32" | "fp32", _) => Kind::Float,
        ("auto", Device::Cpu) => Kind::Float,
        ("auto", _) => Kind::BFloat16,
        ("bf16" | "bfloat16", Device::Cuda(_)) => Kind::BFloat16,
        ("bf16" | "bfloat16", _) => {
            return Err(Error::invalid(
                "--dtype",
                "bf16 needs a CUDA device; use float32 on CPU",
            ))
        }
        (other, _) => {
            return Err(Error::invalid(
                "--dtype",
                format!("unknown dtype `{other}` (allowed: auto, float32, bf16)"),
            ))
        }
    };
    Ok(Placement { device, kind })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_devices_and_rejects_unknown() {
        assert_eq!(parse_device("cpu").unwrap(), Device::Cpu);
        let auto = parse_device("auto").unwrap();
        assert_eq!(auto == Device::Cpu, !tch::Cuda::is_available());
        let e = parse_device("tpu").unwrap_err().to_string();
        assert!(e.contains("--device") && e.contains("tpu"), "{e}");
        assert!(parse_placement("cpu", "bf16").is_err());
        assert_eq!(parse_storage_dtype("bfloat16").unwrap(), Kind::BFloat16);
        assert_eq!(parse_storage_dtype("fp16").unwrap(), Kind::Half);
        assert_eq!(parse_storage_dtype("float32").unwrap(), Kind::Float);
        let e = parse_storage_dtype("int8").unwrap_err().to_string();
        assert!(
            e.contains("--dtype") && e.contains("int8") && e.contains("bf16"),
            "{e}"
        );
        assert_eq!(parse_placement("cpu", "auto").unwrap().kind, Kind::Float);
    }
}
