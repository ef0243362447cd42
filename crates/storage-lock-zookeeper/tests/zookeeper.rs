//! Both suites against [`ZooKeeperStorage`] on the ZooKeeper named by
//! `STORAGE_LOCK_ZOOKEEPER_URL` (`scripts/services.sh` starts one and sets it), and servers of
//! this test's own, started with `scripts/zookeeper` (`STORAGE_LOCK_ZOOKEEPER`): a standalone
//! server killed with SIGKILL and restarted, and 3-member ensembles whose leader is killed
//! under contention, whose majority is stopped, and whose followers serve synced reads.

use std::time::Duration;

use storage_lock_core::{AcquireOptions, Storage, StorageLock};
use storage_lock_testkit::restart::{ServerProcess, restart_keeps_fencing, spare_port, wait_until};
use storage_lock_zookeeper::{ZooKeeperStorage, ZooKeeperStorageBuilder};

fn url() -> String {
    std::env::var("STORAGE_LOCK_ZOOKEEPER_URL")
        .expect("STORAGE_LOCK_ZOOKEEPER_URL must name a ZooKeeper (run scripts/test.sh)")
}

fn script() -> String {
    std::env::var("STORAGE_LOCK_ZOOKEEPER")
        .expect("STORAGE_LOCK_ZOOKEEPER: scripts/zookeeper (scripts/services.sh sets it)")
}

/// A storage under a root of its own, with requests given time on a loaded machine.
async fn zookeeper() -> ZooKeeperStorage {
    let root = format!("/storage-lock-suite/{:016x}", rand::random::<u64>());
    ZooKeeperStorageBuilder::from_url(&url())
        .expect("a valid ZooKeeper URL")
        .root(root)
        .timeout(Duration::from_secs(10))
        .open()
        .await
        .expect("the test ZooKeeper opens")
}

/// The holder's renewal, release and re-acquisition take one request each (the hint).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_known_record_saves_the_read() {
    storage_lock_testkit::conformance::a_known_record_saves_the_read(zookeeper().await).await;
}

// Only the primitives are implemented here: the lock operations are the engine's defaults.
storage_lock_testkit::storage_lock_suites!(zookeeper, lock_operations = default);

/// Opens `servers` (`host:port,…`) under `/locks`, retrying until the servers answer.
async fn open(servers: &str) -> ZooKeeperStorage {
    wait_until("ZooKeeper answers", || async {
        ZooKeeperStorageBuilder::new()
            .servers(servers)
            .root("/locks")
            .timeout(Duration::from_secs(5))
            .session_timeout(Duration::from_secs(6))
            .open()
            .await
    })
    .await
}

/// SIGKILL of a standalone server this test started (it fsyncs its log before it answers):
/// the records and their fencing tokens come back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_keeps_fencing() {
    let dir = tempfile::tempdir().unwrap();
    let port = spare_port();
    let args = [port.to_string(), dir.path().display().to_string()];
    let mut server = ServerProcess::start(script(), &args, dir.path().join("zookeeper.log"));
    let servers = format!("127.0.0.1:{port}");
    let storage = open(&servers).await;
    let probe = storage.clone();
    restart_keeps_fencing(storage, async {
        server.restart();
        wait_until("ZooKeeper restarts", || async { probe.get("probe").await }).await;
    })
    .await;
}

/// A 3-member ensemble of this test's own.
struct Ensemble {
    members: Vec<ServerProcess>,
    clients: Vec<u16>,
    _dir: tempfile::TempDir,
}

impl Ensemble {
    fn start() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let ports: Vec<[u16; 3]> = (0..3)
            .map(|_| [spare_port(), spare_port(), spare_port()])
            .collect();
        let list = ports
            .iter()
            .enumerate()
            .map(|(i, [client, peer, election])| {
                format!("{}=127.0.0.1:{peer}:{election};{client}", i + 1)
            })
            .collect::<Vec<_>>()
            .join(",");
        let members = ports
            .iter()
            .enumerate()
            .map(|(i, [client, ..])| {
                let home = dir.path().join(format!("zk{}", i + 1));
                let args = [
                    client.to_string(),
                    home.display().to_string(),
                    (i + 1).to_string(),
                    list.clone(),
                ];
                std::fs::create_dir_all(&home).unwrap();
                ServerProcess::start(script(), &args, home.join("zookeeper.log"))
            })
            .collect();
        Self {
            members,
            clients: ports.iter().map(|p| p[0]).collect(),
            _dir: dir,
        }
    }

    /// Every member's client address, `host:port,…`.
    fn servers(&self) -> String {
        self.clients
            .iter()
            .map(|p| format!("127.0.0.1:{p}"))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// Member `i`'s mode (`leader`, `follower`, `standalone`), from its `srvr` answer.
    async fn mode(&self, i: usize) -> Result<String, String> {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let ask = async {
            let mut conn = tokio::net::TcpStream::connect(("127.0.0.1", self.clients[i])).await?;
            conn.write_all(b"srvr").await?;
            let mut answer = String::new();
            conn.read_to_string(&mut answer).await?;
            Ok::<_, std::io::Error>(answer)
        };
        let answer = tokio::time::timeout(Duration::from_secs(5), ask)
            .await
            .map_err(|_| "srvr: no answer".to_owned())?
            .map_err(|e| e.to_string())?;
        answer
            .lines()
            .find_map(|l| l.strip_prefix("Mode: "))
            .map(str::to_owned)
            .ok_or_else(|| format!("member {i} serves no clients: {answer:?}"))
    }

    /// The index of the leader among `alive`, once they all serve (a leader and followers).
    async fn leader(&self, alive: &[usize]) -> usize {
        wait_until("the ensemble has a leader", || async {
            let mut leader = None;
            for &i in alive {
                match self.mode(i).await?.as_str() {
                    "leader" => leader = Some(i),
                    "follower" => {}
                    other => return Err(format!("member {i} is {other}")),
                }
            }
            leader.ok_or_else(|| "no leader".to_owned())
        })
        .await
    }
}

/// The leader of a 3-member ensemble killed (SIGKILL) while three clients contend for one
/// lock, and restarted once the other two elected a new one: no two critical sections
/// overlap, no stale token reaches the fenced resource, tokens rise in the order holders
/// entered, and the contenders go on being granted the lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_leader_keeps_exclusion_and_fencing() {
    let mut ensemble = Ensemble::start();
    let servers = ensemble.servers();
    let leader = ensemble.leader(&[0, 1, 2]).await;
    let mut clients = Vec::new();
    for _ in 0..3 {
        clients.push(open(&servers).await);
    }
    let report = storage_lock_testkit::cluster::contention_survives(
        clients,
        async {
            ensemble.members[leader].kill();
            let others: Vec<usize> = (0..3).filter(|&i| i != leader).collect();
            ensemble.leader(&others).await;
            ensemble.members[leader].restart();
        },
        20,
    )
    .await;
    eprintln!("{report:?}");
}

/// A member cut off from the other two (they are stopped with SIGSTOP) grants nothing to a
/// client that reaches only it; once they continue, the same client is granted the lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_without_quorum_grants_nothing() {
    let ensemble = Ensemble::start();
    ensemble.leader(&[0, 1, 2]).await;
    let lone = ZooKeeperStorageBuilder::new()
        .servers(format!("127.0.0.1:{}", ensemble.clients[0]))
        .root("/locks")
        .timeout(Duration::from_secs(1))
        .session_timeout(Duration::from_secs(4));
    let lone = wait_until("member 0 answers", || async { lone.clone().open().await }).await;
    storage_lock_testkit::cluster::a_minority_grants_nothing(
        lone,
        async {
            ensemble.members[1].pause();
            ensemble.members[2].pause();
        },
        async {
            ensemble.members[1].resume();
            ensemble.members[2].resume();
        },
    )
    .await;
}

/// A lock released through one member is free at once to a client of another, even one whose
/// member fell behind: that follower is stopped (SIGSTOP) while the holder, a client of the
/// other follower, releases; the other client's attempt is sent to the stopped follower, which
/// then continues with the release still to apply. The attempt's read is synced with the
/// leader first, so it sees the release and is granted. (Without the sync this test fails
/// within a few rounds: the follower answers the read before it applies the release.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_through_a_lagging_member_see_the_latest_write() {
    let ensemble = Ensemble::start();
    let leader = ensemble.leader(&[0, 1, 2]).await;
    // Both clients on followers: stopping the leader would stop the release too.
    let followers: Vec<usize> = (0..3).filter(|&i| i != leader).collect();
    let (on_a, on_b) = (followers[0], followers[1]);
    let a = open(&format!("127.0.0.1:{}", ensemble.clients[on_a])).await;
    let b = open(&format!("127.0.0.1:{}", ensemble.clients[on_b])).await;
    let a = StorageLock::new(a).unwrap();
    let b = StorageLock::new(b).unwrap();
    let opts = AcquireOptions::default().lease(Duration::from_secs(600));
    for round in 0..20 {
        let held = a
            .try_acquire("hand-off", &opts)
            .await
            .unwrap()
            .unwrap_or_else(|| panic!("round {round}: the lock released last round is busy"));
        assert!(
            b.try_acquire("hand-off", &opts).await.unwrap().is_none(),
            "round {round}: a held lock was granted through the other member"
        );
        ensemble.members[on_b].pause();
        held.release().await.unwrap();
        let attempt = tokio::spawn({
            let b = b.clone();
            let opts = opts.clone();
            async move { b.try_acquire("hand-off", &opts).await }
        });
        // Time for the attempt to reach the stopped follower's socket (it would only make a
        // stale answer less likely if it did not).
        tokio::time::sleep(Duration::from_millis(100)).await;
        ensemble.members[on_b].resume();
        let granted = attempt.await.unwrap().unwrap().unwrap_or_else(|| {
            panic!("round {round}: a lagging member reported a freed lock busy")
        });
        granted.release().await.unwrap();
    }
}
