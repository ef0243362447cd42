//! Server restarts: a server process a test started itself, killed and started again, and the
//! check that holds and fencing tokens come through it.
//!
//! [`ServerProcess`] runs one server binary on spare loopback ports and kills only that process
//! (by its PID, with `SIGKILL`: no graceful shutdown). [`restart_keeps_fencing`] is the check
//! every replicated backend runs across such a restart.

use std::future::Future;
use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use storage_lock_core::{AcquireOptions, Storage, StorageLock, Wait};
use tokio::time::{Instant, sleep, timeout};

/// A free loopback TCP port (bound and released; good enough for a test's own server), never
/// one handed out before in this process or, under `scripts/run-tests.py`, in this test run.
///
/// Linux often hands the port just released to the next `bind(0)`: two tests of one binary
/// (threads of one process) starting servers at once got the same port, one server failed to
/// bind, and its test talked to the other test's server (a clean-clone CI run saw a Redis
/// started without persistence answer as the other test's durable one). So the port is drawn
/// at random **below the ephemeral range** (`ip_local_port_range`, from 20000 up), where no
/// `bind(0)` and no outgoing connection's local port can land, and is remembered: never
/// given twice in this process. `scripts/run-tests.py` runs several test binaries at once and
/// names a fresh directory in `STORAGE_LOCK_TEST_PORTS`: a port is given only to the process
/// that creates the file named by it there (`create_new`, atomic across processes), so no two
/// binaries of one run get the same port either.
pub fn spare_port() -> u16 {
    static GIVEN: std::sync::Mutex<Vec<u16>> = std::sync::Mutex::new(Vec::new());
    let shared = std::env::var_os("STORAGE_LOCK_TEST_PORTS").map(PathBuf::from);
    let ephemeral_from = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|range| range.split_whitespace().next()?.parse::<u16>().ok())
        .unwrap_or(32768);
    let below = 20000..ephemeral_from.max(20000 + 2000);
    let mut given = GIVEN
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    loop {
        let port = rand::random_range(below.clone());
        if given.contains(&port) || TcpListener::bind(("127.0.0.1", port)).is_err() {
            continue;
        }
        let claimed = shared.as_ref().is_none_or(|dir| {
            match std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(dir.join(port.to_string()))
            {
                Ok(_) => true,
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => false,
                Err(e) => panic!("STORAGE_LOCK_TEST_PORTS ({}): {e}", dir.display()),
            }
        });
        if claimed {
            given.push(port);
            return port;
        }
    }
}

/// A server process the test owns: started by [`Self::start`], killed on [`Self::kill`] and
/// on drop, never any other process.
#[derive(Debug)]
pub struct ServerProcess {
    program: PathBuf,
    args: Vec<String>,
    log: PathBuf,
    child: Option<Child>,
}

impl ServerProcess {
    /// Starts `program args…`, its output appended to `log`.
    ///
    /// # Panics
    /// If it cannot be started (a test helper: the test fails).
    pub fn start(program: impl Into<PathBuf>, args: &[String], log: impl Into<PathBuf>) -> Self {
        let mut p = Self {
            program: program.into(),
            args: args.to_vec(),
            log: log.into(),
            child: None,
        };
        p.spawn();
        p
    }

    fn spawn(&mut self) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .expect("open the server log");
        let err = log.try_clone().expect("clone the log handle");
        let child = Command::new(&self.program)
            .args(&self.args)
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(err)
            .spawn()
            .unwrap_or_else(|e| panic!("start {}: {e}", self.program.display()));
        self.child = Some(child);
    }

    /// Kills the process with `SIGKILL` and waits for it. The operating system keeps what the
    /// process wrote to files, so this tests a process crash, not a machine crash (whether a
    /// server fsyncs before it answers is not exercised).
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Stops the process with `SIGSTOP` (a member that is cut off: it answers nothing and
    /// keeps its state) until [`Self::resume`].
    ///
    /// # Panics
    /// If the process is not running or the signal cannot be sent.
    pub fn pause(&self) {
        self.signal("-STOP");
    }

    /// Continues a process stopped by [`Self::pause`] (`SIGCONT`).
    ///
    /// # Panics
    /// As [`Self::pause`].
    pub fn resume(&self) {
        self.signal("-CONT");
    }

    fn signal(&self, which: &str) {
        let pid = self.child.as_ref().expect("the server is running").id();
        let status = Command::new("kill")
            .args([which, &pid.to_string()])
            .status()
            .expect("run kill");
        assert!(status.success(), "kill {which} {pid}: {status}");
    }

    /// Kills it and starts it again with the same arguments (same data directory).
    pub fn restart(&mut self) {
        self.kill();
        self.spawn();
    }

    /// The server's log so far (for a failing test's message).
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        if self.child.is_some() {
            // A paused process would not die of SIGKILL before it is continued on every
            // kernel; continue it first (an error only means it is gone).
            let _ = Command::new("kill")
                .args([
                    "-CONT",
                    &self.child.as_ref().map_or(0, Child::id).to_string(),
                ])
                .status();
        }
        self.kill();
    }
}

/// Waits until `probe` succeeds (up to 30 s), e.g. a connect to the restarted server.
///
/// # Panics
/// If it never does.
pub async fn wait_until<F, Fut, T, E>(what: &str, mut probe: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, E>>,
    E: std::fmt::Debug,
{
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match timeout(Duration::from_secs(5), probe()).await {
            Ok(Ok(v)) => return v,
            Ok(Err(e)) if Instant::now() > deadline => panic!("{what}: {e:?}"),
            Err(_) if Instant::now() > deadline => panic!("{what}: timed out"),
            _ => sleep(Duration::from_millis(200)).await,
        }
    }
}

/// Holds a lock with the watchdog on, leaves a released one behind and has a waiter wait for a
/// third, has `restart` kill the server and start it again, then checks:
/// * the waiter, which saw storage errors while it waited and is granted its lock after the
///   restart, keeps the grant for its whole lease (its deadline counts from its own request);
/// * the held handle either turned lost (no later than its local deadline) or is still held
///   *and the storage agrees* (a waiter cannot take it);
/// * every fencing token issued after the restart is strictly higher than every token issued
///   before it, for the held key and for the released one.
///
/// # Panics
/// When a check fails (a test helper).
pub async fn restart_keeps_fencing<S, R>(storage: S, restart: R)
where
    S: Storage,
    R: Future<Output = ()>,
{
    let lock = StorageLock::new(storage).expect("a lock over the storage");
    let name = format!("restart-{:016x}", rand::random::<u64>());
    let released = format!("{name}-released");
    let lease = Duration::from_secs(3);
    let opts = AcquireOptions::default()
        .lease(lease)
        .auto_renew(Duration::from_millis(500));
    let held = lock
        .try_acquire(&name, &opts)
        .await
        .expect("acquire before the restart")
        .expect("free");
    let held_token = held.fencing_token();
    let r = lock
        .try_acquire(&released, &AcquireOptions::default().wait(Wait::Never))
        .await
        .expect("acquire before the restart")
        .expect("free");
    let released_token = r.fencing_token();
    r.release().await.expect("release before the restart");

    // A waiter on a held lock across the restart: it sees storage errors while it waits, and
    // its grant (well after them) must still be good for its whole lease.
    let waited = format!("{name}-waited");
    let wait_lease = Duration::from_secs(5);
    let blocker = lock
        .try_acquire(
            &waited,
            &AcquireOptions::default()
                .lease(Duration::from_secs(30))
                .auto_renew(Duration::from_secs(2)),
        )
        .await
        .expect("acquire before the restart")
        .expect("free");
    let waiter = {
        let (lock, waited) = (lock.clone(), waited.clone());
        tokio::spawn(async move {
            let opts = AcquireOptions::default()
                .wait(Wait::For(Duration::from_secs(120)))
                .lease(wait_lease)
                .auto_renew(Duration::from_secs(1));
            lock.try_acquire(&waited, &opts).await
        })
    };

    let killed = Instant::now();
    restart.await;
    let back = killed.elapsed();

    // The blocker lets go more than the waiter's lease after the errors the waiter saw, which
    // all came before the server was back: a grant timed from them would be over at once.
    sleep(wait_lease + Duration::from_secs(1)).await;
    let _ = blocker.release().await; // lost in a long outage: then its lease ends it
    let granted = timeout(Duration::from_secs(120), waiter)
        .await
        .expect("the waiter was granted the lock within 120 s")
        .expect("the waiter task")
        .expect("waiting survives the storage's restart")
        .expect("the waiter was granted the lock");
    assert!(
        !granted.is_lost(),
        "a grant after storage errors was lost at once (its deadline was counted from an error \
         seen while waiting, not from its own request)"
    );
    sleep(wait_lease).await;
    assert!(
        !granted.is_lost(),
        "a grant after storage errors was lost within its lease although its watchdog renews"
    );
    granted.release().await.expect("release the waiter's grant");

    // Past the local deadline of a handle that could not renew during the outage.
    sleep(lease + Duration::from_millis(500)).await;
    let probe = AcquireOptions::default().wait(Wait::Never);
    if held.is_lost() {
        eprintln!("restart took {back:?}; the held handle turned lost");
    } else {
        eprintln!("restart took {back:?}; the held handle survived and renews");
        let other = wait_until("a probe after the restart", || {
            lock.try_acquire(&name, &probe)
        })
        .await;
        assert!(
            other.is_none(),
            "the handle is not lost, yet a second holder got the lock"
        );
        held.release().await.expect("release after the restart");
    }
    let wait = AcquireOptions::default().wait(Wait::For(lease * 2));
    let again = wait_until("acquire after the restart", || {
        lock.try_acquire(&name, &wait)
    })
    .await
    .expect("the lock is free again");
    assert!(
        again.fencing_token() > held_token,
        "fencing token repeated across a restart: {} after {held_token}",
        again.fencing_token(),
    );
    let r2 = wait_until("acquire after the restart", || {
        lock.try_acquire(&released, &wait)
    })
    .await
    .expect("the released lock is free");
    assert!(
        r2.fencing_token() > released_token,
        "fencing token of a released lock repeated across a restart"
    );
    again.release().await.expect("release");
    r2.release().await.expect("release");
}
