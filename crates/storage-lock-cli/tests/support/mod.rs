//! Helpers for driving the real `storage-lock` binary.
//!
//! Every test runs once per storage URL from [`urls`]: a fresh SQLite file always, plus every URL
//! in `STORAGE_LOCK_TEST_URLS` (space-separated) — adding a backend is one entry there. Lock
//! names are unique per call of [`unique`], so tests may share an external storage.

#![allow(dead_code)] // each test file uses its own subset

use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

pub const BIN: &str = env!("CARGO_BIN_EXE_storage-lock");

/// The storage URLs to test against: SQLite in `dir`, then `STORAGE_LOCK_TEST_URLS`.
pub fn urls(dir: &Path) -> Vec<String> {
    let mut urls = vec![format!("sqlite://{}", dir.join("locks.db").display())];
    if let Ok(extra) = std::env::var("STORAGE_LOCK_TEST_URLS") {
        urls.extend(extra.split_whitespace().map(str::to_owned));
    }
    urls
}

/// A lock name no other test (or earlier run) uses.
pub fn unique(base: &str) -> String {
    static N: AtomicU32 = AtomicU32::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    format!(
        "{base}-{}-{nanos}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

/// `storage-lock --storage URL ARGS…` with a clean environment: no `STORAGE_LOCK_URL`, `HOME`
/// in `dir` (so a missing `--storage` could never touch the real default file), stdin closed.
pub fn cli(dir: &Path, url: &str, args: &[&str]) -> Command {
    let mut cmd = Command::new(BIN);
    cmd.arg("--storage")
        .arg(url)
        .args(args)
        .env_remove("STORAGE_LOCK_URL")
        .env_remove("XDG_STATE_HOME")
        .env_remove("RUST_LOG")
        .env("HOME", dir)
        .stdin(Stdio::null());
    cmd
}

/// Runs `cmd` to completion (at most `limit`), capturing its output.
pub fn output_within(cmd: &mut Command, limit: Duration) -> Output {
    let child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn storage-lock");
    let pid = child.id();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    match rx.recv_timeout(limit) {
        Ok(out) => out.expect("wait for storage-lock"),
        Err(_) => {
            kill(pid, nix::sys::signal::Signal::SIGKILL);
            panic!("storage-lock did not finish within {limit:?}");
        }
    }
}

/// Waits for `child` at most `limit`; kills it and panics if it is still running.
pub fn wait_within(child: &mut Child, limit: Duration) -> ExitStatus {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(status) = child.try_wait().expect("try_wait") {
            return status;
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("process {} did not exit within {limit:?}", child.id());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Polls `cond` every 20 ms for at most `limit`.
pub fn wait_until(limit: Duration, what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Sends `signal` to process `pid`.
pub fn kill(pid: u32, signal: nix::sys::signal::Signal) {
    let pid = nix::unistd::Pid::from_raw(i32::try_from(pid).unwrap());
    let _ = nix::sys::signal::kill(pid, signal);
}

/// `inspect NAME --json` as JSON.
pub fn inspect(dir: &Path, url: &str, name: &str) -> serde_json::Value {
    let out = output_within(
        &mut cli(dir, url, &["inspect", name, "--json"]),
        Duration::from_secs(10),
    );
    assert!(out.status.success(), "inspect failed: {out:?}");
    serde_json::from_slice(&out.stdout).expect("inspect --json parses")
}

/// Whether `name` is held right now.
pub fn is_held(dir: &Path, url: &str, name: &str) -> bool {
    inspect(dir, url, name)["held"] == serde_json::Value::Bool(true)
}

/// Reads a file a child script wrote, trimmed (empty if missing).
pub fn read(path: &Path) -> String {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .trim()
        .to_owned()
}

/// A path in `dir`.
pub fn file(dir: &Path, name: &str) -> PathBuf {
    dir.join(name)
}

/// A fresh directory per backend inside a test's temp dir, so files one backend's run wrote
/// are never mistaken for the next one's.
pub struct Scratch(PathBuf);

impl Scratch {
    /// Creates `base/u<i>`.
    pub fn new(base: &Path, i: usize) -> Self {
        let dir = base.join(format!("u{i}"));
        std::fs::create_dir_all(&dir).expect("scratch dir");
        Self(dir)
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        &self.0
    }
}

/// Runs its closure when dropped, also while a failed assertion unwinds.
pub struct OnDrop<F: FnMut()>(pub F);

impl<F: FnMut()> Drop for OnDrop<F> {
    fn drop(&mut self) {
        (self.0)();
    }
}

/// Whether process `pid` is alive: exists and is not a zombie (an orphan's zombie is never
/// reaped in some containers, so `kill -0` is not enough).
pub fn alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => {
            let state = stat
                .rfind(')')
                .and_then(|i| stat[i + 1..].split_whitespace().next())
                .unwrap_or("X");
            !matches!(state, "Z" | "X" | "x")
        }
        Err(_) => false,
    }
}

/// The numbers a child script appended to `path`, one a line (nanoseconds since the epoch).
pub fn stamps(path: &Path) -> Vec<u128> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect()
}

/// Now, in nanoseconds since the epoch (what `date +%s%N` prints).
pub fn now_ns() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos()
}

/// Waits until the [`writer_script`] writing to `w` has written twice; returns its pid.
pub fn writer_started(dir: &Path, w: &Path) -> u32 {
    wait_until(Duration::from_secs(10), "the command's writes", || {
        stamps(w).len() >= 2
    });
    read(&file(dir, "w.pid")).parse().unwrap()
}

/// A shell loop appending `date +%s%N` to `$W` every 50 ms, forever. With `ignore_term`, the
/// loop (and its `sleep`s) ignore SIGTERM.
pub fn writer_script(ignore_term: bool) -> String {
    let trap = if ignore_term { "trap '' TERM; " } else { "" };
    format!("{trap}echo $$ > \"$W.pid\"; while :; do date +%s%N >> \"$W\"; sleep 0.05; done")
}

/// A `storage-lock serve` process on a spare loopback port; killed on drop.
pub struct Served {
    child: Child,
    /// `http://127.0.0.1:PORT` (`https://` when started with `--tls-cert`).
    pub url: String,
}

impl Served {
    /// Starts `storage-lock --storage STORAGE serve --listen 127.0.0.1:0 EXTRA…` and reads the
    /// address it announces.
    pub fn start(storage: &str, extra: &[&str]) -> Self {
        Self::start_with_env(storage, extra, &[])
    }

    /// [`Self::start`] with these environment variables set for the server.
    pub fn start_with_env(storage: &str, extra: &[&str], env: &[(&str, &str)]) -> Self {
        use std::io::{BufRead, BufReader};
        let mut child = Command::new(BIN)
            .args(["--storage", storage, "serve", "--listen", "127.0.0.1:0"])
            .args(extra)
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start storage-lock serve");
        let stderr = child.stderr.take().expect("stderr");
        let mut lines = BufReader::new(stderr).lines();
        // "storage-lock: serving … on http(s)://127.0.0.1:PORT (OpenAPI: …)"
        let url = lines
            .by_ref()
            .map_while(Result::ok)
            .find_map(|l| {
                ["http", "https"].into_iter().find_map(|scheme| {
                    let rest = l.split(&format!(" on {scheme}://")).nth(1)?;
                    Some(format!("{scheme}://{}", rest.split_whitespace().next()?))
                })
            })
            .expect("the server says where it listens");
        std::thread::spawn(move || lines.for_each(drop)); // keep its stderr drained
        Self { child, url }
    }

    /// The server process's id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Waits for the server to exit, at most `limit` (see [`wait_within`]).
    pub fn wait_within(&mut self, limit: Duration) -> ExitStatus {
        wait_within(&mut self.child, limit)
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
