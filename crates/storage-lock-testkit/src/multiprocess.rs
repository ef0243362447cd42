//! Several OS processes contending on one storage, checked through shared files.
//!
//! Each worker process runs [`run_worker`]: acquire, then a deliberately **non-atomic**
//! read-modify-write of a counter file (read, pause, write) and a fenced append to a log whose
//! last accepted token lives in another file — a token not greater than the last accepted one
//! is recorded as rejected. [`verify`] then requires: counter = total increments, log tokens
//! strictly increasing, nothing rejected.

use std::fs;
use std::io::Write;
use std::path::Path;
use std::time::Duration;

use storage_lock_core::{AcquireOptions, DistributedLock, Wait};

const COUNTER: &str = "counter";
const FENCE: &str = "fence";
const LOG: &str = "tokens.log";
const REJECTED: &str = "rejected.log";

fn read_u64(path: &Path) -> u64 {
    fs::read_to_string(path)
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(0)
}

/// One worker: `rounds` critical sections on lock `name`, recording into `dir`.
pub async fn run_worker(lock: &dyn DistributedLock, name: &str, dir: &Path, rounds: u32) {
    let opts = AcquireOptions::default()
        .wait(Wait::For(Duration::from_secs(60)))
        .lease(Duration::from_secs(30));
    for _ in 0..rounds {
        let h = lock
            .try_acquire(name, &opts)
            .await
            .expect("storage error")
            .expect("waited 60 s without acquiring");
        let token = h.fencing_token();
        // Non-atomic read-modify-write of the counter.
        let v = read_u64(&dir.join(COUNTER));
        tokio::time::sleep(Duration::from_micros(200)).await;
        fs::write(dir.join(COUNTER), (v + 1).to_string()).unwrap();
        // Fenced write: accepted only with a token above the last accepted one.
        let last = read_u64(&dir.join(FENCE));
        let target = if token > last { LOG } else { REJECTED };
        if token > last {
            fs::write(dir.join(FENCE), token.to_string()).unwrap();
        }
        let mut f = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(dir.join(target))
            .unwrap();
        writeln!(f, "{token}").unwrap();
        drop(f);
        h.release().await.expect("release failed");
    }
}

/// Panics unless the workers' records in `dir` show `total` exclusive critical sections.
pub fn verify(dir: &Path, total: u64) {
    let rejected = fs::read_to_string(dir.join(REJECTED)).unwrap_or_default();
    assert!(
        rejected.trim().is_empty(),
        "stale tokens were written: {rejected}"
    );
    let tokens: Vec<u64> = fs::read_to_string(dir.join(LOG))
        .unwrap_or_default()
        .lines()
        .map(|l| l.parse().unwrap())
        .collect();
    assert_eq!(tokens.len() as u64, total, "fenced writes");
    assert!(
        tokens.windows(2).all(|w| w[0] < w[1]),
        "accepted tokens are not strictly increasing"
    );
    assert_eq!(
        read_u64(&dir.join(COUNTER)),
        total,
        "lost increments: processes overlapped"
    );
}

/// The environment variable that tells a test binary it runs as a worker, and where to record.
pub const WORKER_DIR_ENV: &str = "STORAGE_LOCK_MP_DIR";

/// In a worker test: the directory to record into, or `None` when the test runs normally (then
/// the worker test returns at once).
pub fn worker_dir() -> Option<std::path::PathBuf> {
    std::env::var_os(WORKER_DIR_ENV).map(Into::into)
}

/// The storage URL a worker should connect to (set by [`run_processes`]).
pub const WORKER_URL_ENV: &str = "STORAGE_LOCK_MP_URL";

/// Runs `processes` copies of this test binary, each executing only the test `worker_test`
/// (which calls [`worker_dir`] and [`run_worker`] with [`worker_rounds`] on the storage named
/// by [`WORKER_URL_ENV`]), all recording into a fresh directory; then [`verify`]s
/// `processes × rounds` exclusive sections. Returns the directory.
pub fn run_processes(
    worker_test: &str,
    url: &str,
    processes: usize,
    rounds: u32,
) -> std::path::PathBuf {
    run_processes_on(worker_test, &[url], processes, rounds)
}

/// [`run_processes`] with worker `i` connecting to `urls[i % urls.len()]` (e.g. different
/// replicas of a lock server over one storage).
pub fn run_processes_on(
    worker_test: &str,
    urls: &[&str],
    processes: usize,
    rounds: u32,
) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("storage-lock-mp-{:016x}", rand::random::<u64>()));
    fs::create_dir_all(&dir).unwrap();
    let exe = std::env::current_exe().expect("test binary path");
    let children: Vec<_> = (0..processes)
        .map(|i| {
            let url = urls[i % urls.len()];
            std::process::Command::new(&exe)
                .args([
                    worker_test,
                    "--exact",
                    "--ignored",
                    "--nocapture",
                    "--test-threads=1",
                ])
                .env(WORKER_DIR_ENV, &dir)
                .env("STORAGE_LOCK_MP_ROUNDS", rounds.to_string())
                .env(WORKER_URL_ENV, url)
                .stdout(std::process::Stdio::null())
                .spawn()
                .expect("spawn worker process")
        })
        .collect();
    for mut child in children {
        let status = child.wait().unwrap();
        assert!(status.success(), "a worker process failed: {status}");
    }
    verify(&dir, processes as u64 * u64::from(rounds));
    dir
}

/// The rounds a worker should run (set by [`run_processes`]).
pub fn worker_rounds() -> u32 {
    std::env::var("STORAGE_LOCK_MP_ROUNDS")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(1)
}
