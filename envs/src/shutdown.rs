//! A process-wide request to shut down, for the few blocking waits that sit under an API with
//! no way to pass a cancel signal through: a tool's construction (an MCP server's handshake,
//! made while `train` builds its tools). The binary requests it on the first SIGINT/SIGTERM;
//! such a wait then gives up at once instead of running out its timeout.

use std::sync::atomic::{AtomicBool, Ordering};

static REQUESTED: AtomicBool = AtomicBool::new(false);

/// Asks blocking setup waits to give up (see the module docs).
pub fn request() {
    REQUESTED.store(true, Ordering::SeqCst);
}

/// Whether a shutdown was requested.
pub fn requested() -> bool {
    REQUESTED.load(Ordering::SeqCst)
}
