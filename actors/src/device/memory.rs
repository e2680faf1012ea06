//! A device's total and free memory, for the engine's memory plan.
//!
//! On a CPU: the machine's (`MemTotal`, `MemAvailable`), bounded by this process's control
//! group's memory limit where one is set. On CUDA: the driver's `cuMemGetInfo` for the
//! device, read through the primary context libtorch uses (retained and released, so it is
//! shared, not created anew); the driver library (`libcuda.so.1`) is opened at run time, so
//! a build without CUDA needs nothing of it.

use tch::Device;

use serde::{Deserialize, Serialize};

/// A device's memory now, bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceMemory {
    /// All of it (on a CPU: the machine's, or this process's memory limit if lower).
    pub total: u64,
    /// Free now.
    pub free: u64,
}

/// The memory of `device` now.
pub fn now(device: Device) -> Result<DeviceMemory, String> {
    match device {
        Device::Cpu => cpu(),
        Device::Cuda(ordinal) => cuda::memory(ordinal),
        other => Err(format!(
            "reading the free memory of {other:?} is not supported (cpu and cuda are)"
        )),
    }
}

fn cpu() -> Result<DeviceMemory, String> {
    let info =
        std::fs::read_to_string("/proc/meminfo").map_err(|e| format!("/proc/meminfo: {e}"))?;
    let field = |name: &str| -> Result<u64, String> {
        info.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            .map(|kib| kib * 1024)
            .ok_or_else(|| format!("/proc/meminfo has no {name}"))
    };
    let mut memory = DeviceMemory {
        total: field("MemTotal")?,
        free: field("MemAvailable")?,
    };
    if let Some(limit) = agent_r1_envs::control_groups::OwnGroups::read()
        .ok()
        .and_then(|g| g.memory_limit())
    {
        memory.total = memory.total.min(limit.limit);
        memory.free = memory.free.min(limit.limit.saturating_sub(limit.usage));
    }
    Ok(memory)
}

mod cuda {
    use std::ffi::{c_int, c_uint, c_void};

    use super::DeviceMemory;

    type CuResult = c_int;
    type CuDevice = c_int;
    type CuContext = *mut c_void;

    /// `cuMemGetInfo` on device `ordinal` (as libtorch numbers it: after
    /// `CUDA_VISIBLE_DEVICES`, which the driver applies too).
    pub(super) fn memory(ordinal: usize) -> Result<DeviceMemory, String> {
        // SAFETY: the driver library is loaded by name and every symbol is declared with its
        // documented C signature (CUDA driver API, stable since CUDA 4/11 for the _v2 forms).
        unsafe {
            let lib = libloading::Library::new("libcuda.so.1")
                .map_err(|e| format!("cannot open the CUDA driver (libcuda.so.1): {e}"))?;
            let sym = |name: &[u8]| -> Result<*const c_void, String> {
                lib.get::<*const c_void>(name).map(|s| *s).map_err(|e| {
                    format!(
                        "the CUDA driver has no {}: {e}",
                        String::from_utf8_lossy(name)
                    )
                })
            };
            let init: extern "C" fn(c_uint) -> CuResult = std::mem::transmute(sym(b"cuInit\0")?);
            let device_get: extern "C" fn(*mut CuDevice, c_int) -> CuResult =
                std::mem::transmute(sym(b"cuDeviceGet\0")?);
            let retain: extern "C" fn(*mut CuContext, CuDevice) -> CuResult =
                std::mem::transmute(sym(b"cuDevicePrimaryCtxRetain\0")?);
            let release: extern "C" fn(CuDevice) -> CuResult =
                std::mem::transmute(sym(b"cuDevicePrimaryCtxRelease_v2\0")?);
            let push: extern "C" fn(CuContext) -> CuResult =
                std::mem::transmute(sym(b"cuCtxPushCurrent_v2\0")?);
            let pop: extern "C" fn(*mut CuContext) -> CuResult =
                std::mem::transmute(sym(b"cuCtxPopCurrent_v2\0")?);
            let mem_get_info: extern "C" fn(*mut usize, *mut usize) -> CuResult =
                std::mem::transmute(sym(b"cuMemGetInfo_v2\0")?);
            let check = |what: &str, r: CuResult| match r {
                0 => Ok(()),
                code => Err(format!("CUDA driver: {what} failed with error {code}")),
            };
            check("cuInit", init(0))?;
            let mut device: CuDevice = 0;
            check("cuDeviceGet", device_get(&mut device, ordinal as c_int))?;
            let mut context: CuContext = std::ptr::null_mut();
            check("cuDevicePrimaryCtxRetain", retain(&mut context, device))?;
            let read = check("cuCtxPushCurrent", push(context)).and_then(|()| {
                let (mut free, mut total) = (0usize, 0usize);
                let r = check("cuMemGetInfo", mem_get_info(&mut free, &mut total));
                let mut popped: CuContext = std::ptr::null_mut();
                let _ = pop(&mut popped);
                r.map(|()| DeviceMemory {
                    total: total as u64,
                    free: free as u64,
                })
            });
            let _ = release(device);
            read
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cpu_has_memory_and_some_of_it_is_free() {
        let m = now(Device::Cpu).unwrap();
        assert!(m.total > 0 && m.free > 0 && m.free <= m.total, "{m:?}");
    }
}
