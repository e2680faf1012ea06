//! A headless Chromium driven over the Chrome DevTools Protocol on a pipe
//! (`--remote-debugging-pipe`: commands in on fd 3, replies out on fd 4, NUL-separated JSON),
//! so a test can open pages, click, fill forms, read the DOM and take screenshots with no
//! WebDriver and no network port.

use std::collections::VecDeque;
use std::fs::File;
use std::io::{BufRead, BufReader, Write};
use std::os::fd::{FromRawFd, RawFd};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use base64::Engine as _;
use serde_json::{json, Value};

/// The longest one command, page load or wait may take: a bound against a hang (some waits
/// are for the run's progress, which a loaded machine slows many times over).
pub const STEP_TIMEOUT: Duration = Duration::from_secs(600);

/// A running headless Chromium with one page attached.
pub struct Browser {
    child: Child,
    to_browser: File,
    from_browser: mpsc::Receiver<Value>,
    events: VecDeque<Value>,
    next_id: u64,
    session: String,
    _profile: tempfile::TempDir,
}

fn pipe() -> (RawFd, RawFd) {
    let mut fds = [0; 2];
    // SAFETY: pipe2 writes two descriptors into the array it is given.
    let rc = unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) };
    assert_eq!(rc, 0, "pipe2: {}", std::io::Error::last_os_error());
    (fds[0], fds[1])
}

impl Browser {
    /// Starts `chromium` headless (as root it needs `--no-sandbox`), with a fresh profile.
    pub fn start(chromium: &Path, width: u32, height: u32) -> Self {
        let profile = tempfile::tempdir().unwrap();
        let (cmd_read, cmd_write) = pipe();
        let (out_read, out_write) = pipe();
        let mut command = Command::new(chromium);
        command
            .args([
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-dev-shm-usage",
                "--no-first-run",
                "--no-default-browser-check",
                "--hide-scrollbars",
                // A page driven over the pipe counts as a background tab; its timers must run.
                "--disable-background-timer-throttling",
                "--disable-renderer-backgrounding",
                "--disable-backgrounding-occluded-windows",
                "--remote-debugging-pipe",
                &format!("--window-size={width},{height}"),
                &format!("--user-data-dir={}", profile.path().display()),
                "about:blank",
            ])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        // SAFETY: only async-signal-safe calls (fcntl, dup2) between fork and exec. The pipe
        // ends are first copied above fd 10, so that dup2 never meets a descriptor that is
        // already 3 or 4 (dup2 onto itself would keep close-on-exec).
        unsafe {
            command.pre_exec(move || {
                let a = libc::fcntl(cmd_read, libc::F_DUPFD_CLOEXEC, 10);
                let b = libc::fcntl(out_write, libc::F_DUPFD_CLOEXEC, 10);
                if a < 0 || b < 0 || libc::dup2(a, 3) < 0 || libc::dup2(b, 4) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let child = command.spawn().expect("starting chromium");
        // SAFETY: the descriptors are ours, from pipe2, and each is wrapped once.
        let (to_browser, from, _r, _w) = unsafe {
            (
                File::from_raw_fd(cmd_write),
                File::from_raw_fd(out_read),
                File::from_raw_fd(cmd_read),
                File::from_raw_fd(out_write),
            )
        };
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let mut reader = BufReader::new(from);
            let mut buf = Vec::new();
            loop {
                buf.clear();
                match reader.read_until(0, &mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(_) => {
                        let body = buf.strip_suffix(&[0]).unwrap_or(&buf);
                        if let Ok(v) = serde_json::from_slice::<Value>(body) {
                            if tx.send(v).is_err() {
                                break;
                            }
                        }
                    }
                }
            }
        });
        let mut browser = Self {
            child,
            to_browser,
            from_browser: rx,
            events: VecDeque::new(),
            next_id: 0,
            session: String::new(),
            _profile: profile,
        };
        let targets = browser.call("Target.getTargets", json!({}));
        let target = targets["targetInfos"]
            .as_array()
            .and_then(|t| t.iter().find(|t| t["type"] == "page"))
            .map(|t| t["targetId"].clone())
            .expect("chromium has no page target");
        let attached = browser.call(
            "Target.attachToTarget",
            json!({ "targetId": target, "flatten": true }),
        );
        browser.session = attached["sessionId"].as_str().unwrap().to_string();
        browser.call("Page.enable", json!({}));
        browser.call("Runtime.enable", json!({}));
        browser.call(
            "Emulation.setDeviceMetricsOverride",
            json!({ "width": width, "height": height, "deviceScaleFactor": 1, "mobile": false }),
        );
        browser
    }

    fn recv(&mut self, deadline: Instant, what: &str) -> Value {
        let left = deadline.saturating_duration_since(Instant::now());
        match self.from_browser.recv_timeout(left) {
            Ok(v) => v,
            Err(_) => panic!("chromium: no answer to {what} within {STEP_TIMEOUT:?}"),
        }
    }

    /// Sends a command (to the page once attached) and returns its result; panics on an
    /// error reply or when no answer comes within [`STEP_TIMEOUT`].
    pub fn call(&mut self, method: &str, params: Value) -> Value {
        match self.try_call(method, params) {
            Ok(v) => v,
            Err(()) => panic!("chromium: no answer to {method} within {STEP_TIMEOUT:?}"),
        }
    }

    /// [`Browser::call`], with `Err` when no answer came within [`STEP_TIMEOUT`].
    fn try_call(&mut self, method: &str, params: Value) -> Result<Value, ()> {
        self.next_id += 1;
        let id = self.next_id;
        let mut msg = json!({ "id": id, "method": method, "params": params });
        if !self.session.is_empty() {
            msg["sessionId"] = json!(self.session);
        }
        let mut bytes = serde_json::to_vec(&msg).unwrap();
        bytes.push(0);
        self.to_browser
            .write_all(&bytes)
            .expect("writing to chromium");
        let deadline = Instant::now() + STEP_TIMEOUT;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let v = self.from_browser.recv_timeout(left).map_err(|_| ())?;
            if v["id"] == json!(id) {
                if let Some(e) = v.get("error") {
                    panic!("chromium: {method} failed: {e}");
                }
                return Ok(v["result"].clone());
            }
            if v.get("method").is_some() {
                self.events.push_back(v);
            }
        }
    }

    fn wait_event(&mut self, method: &str) {
        let deadline = Instant::now() + STEP_TIMEOUT;
        while let Some(e) = self.events.pop_front() {
            if e["method"] == method {
                return;
            }
        }
        loop {
            let v = self.recv(deadline, method);
            if v["method"] == method {
                return;
            }
        }
    }

    /// Opens `url` and waits for its load event.
    pub fn open(&mut self, url: &str) {
        self.events.clear();
        let r = self.call("Page.navigate", json!({ "url": url }));
        if let Some(e) = r.get("errorText") {
            panic!("chromium: cannot open {url}: {e}");
        }
        self.wait_event("Page.loadEventFired");
    }

    /// Evaluates `expression` in the page and returns its value (JSON).
    pub fn eval(&mut self, expression: &str) -> Value {
        let r = self.call(
            "Runtime.evaluate",
            json!({ "expression": expression, "returnByValue": true, "awaitPromise": true }),
        );
        if let Some(e) = r.get("exceptionDetails") {
            panic!("chromium: `{expression}` threw: {e}");
        }
        r["result"]["value"].clone()
    }

    /// Runs `action` (a script that clicks a link or submits a form) and waits for the page
    /// it leads to.
    pub fn navigate_by(&mut self, action: &str) {
        self.events.clear();
        self.eval(action);
        self.wait_event("Page.loadEventFired");
    }

    /// Waits until `expression` is truthy and returns its value: the page itself resolves a
    /// promise when a DOM change makes it so (a `MutationObserver`), so nothing here polls;
    /// panics with `what` and the page's text after [`STEP_TIMEOUT`].
    pub fn wait_for(&mut self, expression: &str, what: &str) -> Value {
        let script = format!(
            "new Promise(resolve => {{\n\
               const check = () => {{ const v = ({expression}); if (v) {{ resolve(v); return true; }} return false; }};\n\
               if (!check()) new MutationObserver((_, o) => {{ if (check()) o.disconnect(); }})\n\
                 .observe(document, {{ subtree: true, childList: true, characterData: true, attributes: true }});\n\
             }})"
        );
        let params = json!({ "expression": script, "returnByValue": true, "awaitPromise": true });
        match self.try_call("Runtime.evaluate", params) {
            Ok(r) => {
                if let Some(e) = r.get("exceptionDetails") {
                    panic!("chromium: waiting for {what} threw: {e}");
                }
                r["result"]["value"].clone()
            }
            Err(()) => {
                let text = self.eval("document.body ? document.body.innerText.slice(0, 1500) : ''");
                panic!(
                    "waited {STEP_TIMEOUT:?} for {what}; the page says:\n{}",
                    text.as_str().unwrap_or("")
                );
            }
        }
    }

    /// A PNG of the page as shown (the whole page height, up to 4,000 px) written to `path`.
    pub fn screenshot(&mut self, path: &Path) -> PathBuf {
        let height = self
            .eval("Math.min(4000, document.documentElement.scrollHeight)")
            .as_f64()
            .unwrap_or(1000.0);
        let width = self
            .eval("document.documentElement.scrollWidth")
            .as_f64()
            .unwrap_or(1400.0);
        let r = self.call(
            "Page.captureScreenshot",
            json!({
                "format": "png",
                "captureBeyondViewport": true,
                "clip": { "x": 0, "y": 0, "width": width, "height": height, "scale": 1 }
            }),
        );
        let png = base64::engine::general_purpose::STANDARD
            .decode(r["data"].as_str().expect("screenshot data"))
            .expect("screenshot is base64");
        assert!(png.starts_with(b"\x89PNG"), "not a PNG");
        std::fs::write(path, png).unwrap();
        path.to_path_buf()
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
