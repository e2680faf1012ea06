//! torch.distributed's process groups for the learner's ranks, through `csrc/dist_shim.cpp`:
//! ranks meet at a rendezvous store (a file on one machine, TCP across machines) and run
//! Gloo collectives on CPU tensors in place. Every collective and the rendezvous itself end
//! after the group's timeout with [`Error::Collective`] naming the operation and the rank;
//! a peer whose process ends makes the others' next collective fail at once.

use std::ffi::{c_char, c_void, CStr, CString};
use std::path::PathBuf;
use std::time::Duration;

use tch::{Device, Kind, Tensor};

use crate::{Error, Result};

mod ffi {
    use std::ffi::{c_char, c_int, c_void};

    extern "C" {
        pub(super) fn ar1_dist_free_error(e: *mut c_char);
        #[allow(clippy::too_many_arguments)]
        pub(super) fn ar1_dist_new(
            store: *const c_char,
            at: *const c_char,
            port: c_int,
            rank: c_int,
            world: c_int,
            timeout_ms: i64,
            interface: *const c_char,
            out: *mut *mut c_void,
        ) -> *mut c_char;
        pub(super) fn ar1_dist_free(group: *mut c_void);
        pub(super) fn ar1_dist_all_reduce(
            group: *mut c_void,
            tensor: *mut c_void,
            op: c_int,
        ) -> *mut c_char;
        pub(super) fn ar1_dist_broadcast(
            group: *mut c_void,
            tensor: *mut c_void,
            root: c_int,
        ) -> *mut c_char;
        pub(super) fn ar1_dist_barrier(group: *mut c_void) -> *mut c_char;
        pub(super) fn ar1_set_grad(param: *mut c_void, grad: *mut c_void) -> *mut c_char;
    }
}

/// Where the ranks meet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Rendezvous {
    /// A file every rank can open (ranks on one machine, or a shared file system); it must
    /// not exist before the group is formed.
    File(PathBuf),
    /// Rank 0 listens on `host:port`; the others connect there.
    Tcp {
        /// Rank 0's address as the others reach it.
        host: String,
        /// Rank 0's port.
        port: u16,
    },
}

/// One rank's place in a group.
#[derive(Debug, Clone)]
pub struct GroupSpec {
    /// Where the ranks meet.
    pub rendezvous: Rendezvous,
    /// This process's rank, `0..world`.
    pub rank: usize,
    /// How many ranks.
    pub world: usize,
    /// How long the rendezvous and each collective may take.
    pub timeout: Duration,
    /// The address this rank's Gloo transport binds (`127.0.0.1` on one machine).
    pub interface: String,
}

impl GroupSpec {
    /// Rank `rank` of `world` ranks on this machine, meeting at the file `store` (which must
    /// not hold an earlier group's keys), over loopback.
    pub fn on_this_machine(store: PathBuf, rank: usize, world: usize, timeout: Duration) -> Self {
        Self {
            rendezvous: Rendezvous::File(store),
            rank,
            world,
            timeout,
            interface: "127.0.0.1".into(),
        }
    }
}

/// How a collective combines the ranks' values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReduceOp {
    /// Elementwise sum.
    Sum,
    /// Elementwise maximum.
    Max,
    /// Elementwise minimum.
    Min,
}

/// A joined group. Collectives are called in the same order on every rank.
#[derive(Debug)]
pub struct ProcessGroup {
    raw: *mut c_void,
    rank: usize,
    world: usize,
    timeout: Duration,
}

// SAFETY: c10d's process groups are used from any thread (PyTorch's own DDP reduces from
// autograd's threads); the learner calls one group from one thread at a time.
unsafe impl Send for ProcessGroup {}
// SAFETY: as for `Send`; the learner's ranks and its layer gates share one group but call
// it from the learner's thread only.
unsafe impl Sync for ProcessGroup {}

/// Sets `param`'s gradient to `grad` (its shape), or clears it (freeing its memory) with
/// `None`: tch reads `.grad` but cannot assign it.
pub(crate) fn set_grad(param: &Tensor, grad: Option<&Tensor>) -> Result<()> {
    let raw = |t: &Tensor| t.as_ptr() as *mut c_void;
    // SAFETY: both tensors are live; the shim only reassigns the parameter's grad handle.
    let e = unsafe { ffi::ar1_set_grad(raw(param), grad.map_or(std::ptr::null_mut(), raw)) };
    check(e).map_err(|m| Error::Other(format!("cannot set a parameter's gradient: {m}")))
}

impl ProcessGroup {
    /// Joins the group: waits (up to the timeout) until every rank has arrived.
    pub fn join(spec: &GroupSpec) -> Result<Self> {
        let fail = |message: String| Error::Collective {
            op: "rendezvous".into(),
            rank: spec.rank,
            world: spec.world,
            message,
        };
        if spec.world == 0 || spec.rank >= spec.world {
            return Err(Error::invalid(
                "learner rank",
                format!(
                    "rank {} of {} ranks: a rank is 0 up to the number of ranks - 1",
                    spec.rank, spec.world
                ),
            ));
        }
        let (store, at, port) = match &spec.rendezvous {
            Rendezvous::File(path) => ("file", path.display().to_string(), 0),
            Rendezvous::Tcp { host, port } => ("tcp", host.clone(), *port),
        };
        let c =
            |s: &str| CString::new(s).map_err(|_| fail(format!("`{s}` contains a NUL character")));
        let (store, at, interface) = (c(store)?, c(&at)?, c(&spec.interface)?);
        let mut raw = std::ptr::null_mut();
        // SAFETY: the strings live across the call; the shim writes `raw` only on success.
        let e = unsafe {
            ffi::ar1_dist_new(
                store.as_ptr(),
                at.as_ptr(),
                i32::from(port),
                spec.rank as i32,
                spec.world as i32,
                spec.timeout.as_millis().min(i64::MAX as u128) as i64,
                interface.as_ptr(),
                &mut raw,
            )
        };
        check(e).map_err(fail)?;
        Ok(Self {
            raw,
            rank: spec.rank,
            world: spec.world,
            timeout: spec.timeout,
        })
    }

    /// How long the rendezvous and each collective may take.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// This process's rank.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// How many ranks.
    pub fn world(&self) -> usize {
        self.world
    }

    fn failed(&self, op: &str) -> impl FnOnce(String) -> Error + '_ {
        let op = op.to_string();
        move |message| {
            // Gloo's own words for a timeout do not say how long it waited.
            let message = match message.to_ascii_lowercase().contains("timed out") {
                true => format!(
                    "{message} (no answer from every rank within {} s: a rank hung)",
                    self.timeout.as_secs_f64()
                ),
                false => message,
            };
            Error::Collective {
                op,
                rank: self.rank,
                world: self.world,
                message,
            }
        }
    }

    /// Combines `t` (contiguous, on the CPU) across the ranks in place; `what` names it in
    /// errors.
    pub fn all_reduce(&self, t: &mut Tensor, op: ReduceOp, what: &str) -> Result<()> {
        self.check_tensor(t, what)?;
        let op = match op {
            ReduceOp::Sum => 0,
            ReduceOp::Max => 1,
            ReduceOp::Min => 2,
        };
        // SAFETY: `t` is a live tensor; the shim writes into its storage only.
        let e = unsafe { ffi::ar1_dist_all_reduce(self.raw, t.as_mut_ptr() as *mut c_void, op) };
        check(e).map_err(self.failed(&format!("all-reduce of {what}")))
    }

    /// Overwrites `t` (contiguous, on the CPU, the same shape on every rank) with `root`'s.
    pub fn broadcast(&self, t: &mut Tensor, root: usize, what: &str) -> Result<()> {
        self.check_tensor(t, what)?;
        // SAFETY: as in `all_reduce`.
        let e = unsafe {
            ffi::ar1_dist_broadcast(self.raw, t.as_mut_ptr() as *mut c_void, root as i32)
        };
        check(e).map_err(self.failed(&format!("broadcast of {what} from rank {root}")))
    }

    /// Waits until every rank has arrived.
    pub fn barrier(&self, what: &str) -> Result<()> {
        // SAFETY: `raw` is a live group.
        let e = unsafe { ffi::ar1_dist_barrier(self.raw) };
        check(e).map_err(self.failed(&format!("barrier ({what})")))
    }

    /// Sums `values` across the ranks (in float64).
    pub fn sum_f64s(&self, values: &mut [f64], what: &str) -> Result<()> {
        if self.world == 1 || values.is_empty() {
            return Ok(());
        }
        let mut t = Tensor::from_slice(values);
        self.all_reduce(&mut t, ReduceOp::Sum, what)?;
        values.copy_from_slice(&Vec::<f64>::try_from(&t)?);
        Ok(())
    }

    fn check_tensor(&self, t: &Tensor, what: &str) -> Result<()> {
        if t.device() != Device::Cpu || !t.is_contiguous() || t.kind() == Kind::Bool {
            return Err(Error::invalid(
                format!("collective on {what}"),
                format!(
                    "Gloo reduces contiguous numeric CPU tensors; got {:?} {:?} (contiguous: {})",
                    t.device(),
                    t.kind(),
                    t.is_contiguous()
                ),
            ));
        }
        Ok(())
    }
}

impl Drop for ProcessGroup {
    fn drop(&mut self) {
        // SAFETY: made by `ar1_dist_new`, freed once.
        unsafe { ffi::ar1_dist_free(self.raw) };
    }
}

/// The shim's error string (NULL = success) as a result.
fn check(e: *mut c_char) -> std::result::Result<(), String> {
    if e.is_null() {
        return Ok(());
    }
    // SAFETY: a non-NULL return is a NUL-terminated string the shim malloc'd for us.
    let message = unsafe { CStr::from_ptr(e) }.to_string_lossy().into_owned();
    unsafe { ffi::ar1_dist_free_error(e) };
    Err(message)
}
