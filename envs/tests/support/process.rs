//! Waiting on another process's exit as an event: a pidfd turns readable when the process
//! terminates, so no test guesses how long a kill takes.

/// Whether process `pid` has ended (or ends within `limit_ms`).
pub fn process_ends(pid: i32, limit_ms: i32) -> bool {
    // SAFETY: pidfd_open and poll on a descriptor we own and close; no memory is shared.
    unsafe {
        let fd = libc::syscall(libc::SYS_pidfd_open, pid, 0) as i32;
        if fd < 0 {
            return true; // no such process any more
        }
        let mut poll = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        let ready = libc::poll(&mut poll, 1, limit_ms);
        libc::close(fd);
        ready == 1
    }
}
