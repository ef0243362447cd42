//! Two `storage-lock serve` processes over one PostgreSQL (`STORAGE_LOCK_POSTGRES_URL`) serve the
//! same locks: three worker processes, two of them on one replica and one on the other, run
//! critical sections with a non-atomic read-modify-write and a fenced append
//! (`storage_lock_testkit::multiprocess`); no overlap, no stale token, no lost update.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};

use storage_lock_testkit::multiprocess;

/// Not a test on its own: the body of each worker process (returns at once otherwise).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn worker_entry_point() {
    let Some(dir) = multiprocess::worker_dir() else {
        return;
    };
    let url = std::env::var(multiprocess::WORKER_URL_ENV).expect("worker URL");
    let locks = storage_lock::connect(&url).await.expect("worker connects");
    multiprocess::run_worker(&locks, "replicated", &dir, multiprocess::worker_rounds()).await;
}

/// A `storage-lock serve` process on a spare loopback port; killed on drop.
struct Replica {
    child: Child,
    url: String,
}

impl Replica {
    fn start(storage: &str) -> Self {
        let mut child = Command::new(env!("CARGO_BIN_EXE_storage-lock"))
            .args(["--storage", storage, "serve", "--listen", "127.0.0.1:0"])
            .stderr(Stdio::piped())
            .spawn()
            .expect("start storage-lock serve");
        let stderr = child.stderr.take().expect("stderr");
        let mut lines = BufReader::new(stderr).lines();
        // "storage-lock: serving … on http://127.0.0.1:PORT (OpenAPI: …)"
        let url = lines
            .by_ref()
            .map_while(Result::ok)
            .find_map(|l| {
                let rest = l.split(" on http://").nth(1)?;
                Some(format!("http://{}", rest.split_whitespace().next()?))
            })
            .expect("the server says where it listens");
        std::thread::spawn(move || lines.for_each(drop)); // keep its stderr drained
        Self { child, url }
    }
}

impl Drop for Replica {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn three_processes_through_two_server_replicas_exclude_each_other() {
    let pg = std::env::var("STORAGE_LOCK_POSTGRES_URL")
        .expect("STORAGE_LOCK_POSTGRES_URL must be set (run scripts/test.sh)");
    let storage = format!("{pg}?table=storage_lock_replicas");
    let a = Replica::start(&storage);
    let b = Replica::start(&storage);
    assert_ne!(a.url, b.url);
    let dir =
        multiprocess::run_processes_on("worker_entry_point", &[&a.url, &b.url, &a.url], 3, 40);
    let _ = std::fs::remove_dir_all(dir);
}
