//! Both suites against [`EtcdStorage`] on the cluster named by `STORAGE_LOCK_ETCD_URL`
//! (`scripts/services.sh` starts one and sets it), and a restart of an etcd of this test's own.
//! Tests share one key prefix; each uses lock names under a prefix of its own.

use storage_lock_etcd::{EtcdStorage, EtcdStorageBuilder};
use storage_lock_testkit::restart::{ServerProcess, restart_keeps_fencing, spare_port, wait_until};

async fn etcd() -> EtcdStorage {
    open_env("STORAGE_LOCK_ETCD_URL").await
}

/// The suites' storage on the cluster the environment variable `var` names.
async fn open_env(var: &str) -> EtcdStorage {
    let url = std::env::var(var)
        .unwrap_or_else(|_| panic!("{var} must name an etcd cluster (run scripts/test.sh)"));
    EtcdStorageBuilder::from_url(&url)
        .expect("a valid etcd URL")
        .prefix("storage-lock-suite/")
        // Time for a loaded machine (the default 2 s failed cases at random); no case here
        // needs a request to time out.
        .timeout(std::time::Duration::from_secs(10))
        .open()
        .await
        .unwrap_or_else(|e| panic!("connect to etcd ({var}): {e}"))
}

// Only the primitives are implemented here: the lock operations are the engine's defaults
// (the polling path of a storage without notifications runs in the other backends' `defaults`).
storage_lock_testkit::storage_lock_suites!(etcd, lock_operations = default);

/// SIGKILL of an etcd this test started (same data directory on restart): etcd fsyncs before
/// it answers, so the records and their fencing tokens come back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_restart_keeps_fencing() {
    let bin = std::env::var("STORAGE_LOCK_ETCD_BIN").unwrap_or_else(|_| "etcd".into());
    let dir = tempfile::tempdir().unwrap();
    let (client, peer) = (spare_port(), spare_port());
    let args: Vec<String> = [
        "--name=restart".to_owned(),
        format!("--data-dir={}", dir.path().join("data").display()),
        format!("--listen-client-urls=http://127.0.0.1:{client}"),
        format!("--advertise-client-urls=http://127.0.0.1:{client}"),
        format!("--listen-peer-urls=http://127.0.0.1:{peer}"),
        format!("--initial-advertise-peer-urls=http://127.0.0.1:{peer}"),
        format!("--initial-cluster=restart=http://127.0.0.1:{peer}"),
    ]
    .into();
    let mut server = ServerProcess::start(bin, &args, dir.path().join("etcd.log"));
    let url = format!("etcd://127.0.0.1:{client}?timeout=5s");
    let open = || async { EtcdStorageBuilder::from_url(&url).unwrap().open().await };
    let storage = wait_until("etcd starts", open).await;
    restart_keeps_fencing(storage, async {
        server.restart();
        wait_until("etcd restarts", open).await;
    })
    .await;
}

/// A 3-member etcd cluster of this test's own, on spare loopback ports.
struct Cluster {
    members: Vec<ServerProcess>,
    clients: Vec<u16>,
    _dir: tempfile::TempDir,
}

impl Cluster {
    fn start() -> Self {
        let bin = std::env::var("STORAGE_LOCK_ETCD_BIN").unwrap_or_else(|_| "etcd".into());
        let dir = tempfile::tempdir().unwrap();
        let ports: Vec<(u16, u16)> = (0..3).map(|_| (spare_port(), spare_port())).collect();
        let initial = ports
            .iter()
            .enumerate()
            .map(|(i, (_, peer))| format!("m{i}=http://127.0.0.1:{peer}"))
            .collect::<Vec<_>>()
            .join(",");
        let members = ports
            .iter()
            .enumerate()
            .map(|(i, (client, peer))| {
                let args: Vec<String> = vec![
                    format!("--name=m{i}"),
                    format!("--data-dir={}", dir.path().join(format!("m{i}")).display()),
                    format!("--listen-client-urls=http://127.0.0.1:{client}"),
                    format!("--advertise-client-urls=http://127.0.0.1:{client}"),
                    format!("--listen-peer-urls=http://127.0.0.1:{peer}"),
                    format!("--initial-advertise-peer-urls=http://127.0.0.1:{peer}"),
                    format!("--initial-cluster={initial}"),
                    "--initial-cluster-state=new".to_owned(),
                    format!(
                        "--initial-cluster-token=storage-lock-{}",
                        std::process::id()
                    ),
                ];
                ServerProcess::start(&bin, &args, dir.path().join(format!("m{i}.log")))
            })
            .collect();
        Self {
            members,
            clients: ports.iter().map(|(c, _)| *c).collect(),
            _dir: dir,
        }
    }

    fn url(&self) -> String {
        let hosts: Vec<String> = self
            .clients
            .iter()
            .map(|p| format!("127.0.0.1:{p}"))
            .collect();
        format!("etcd://{}?prefix=cluster/&timeout=3s", hosts.join(","))
    }

    /// The member `i`'s own view: its id and the leader's (0: none).
    async fn status(&self, i: usize) -> Result<(u64, u64), etcd_client::Error> {
        let mut c =
            etcd_client::Client::connect([format!("http://127.0.0.1:{}", self.clients[i])], None)
                .await?;
        let s = c.status().await?;
        let me = s.header().map_or(0, |h| h.member_id());
        Ok((me, s.leader()))
    }

    /// The index of the leader, once the members in `alive` agree on one among them.
    async fn leader(&self, alive: &[usize]) -> usize {
        wait_until("the members agree on a leader", || async {
            let mut ids = Vec::new();
            for &i in alive {
                ids.push((i, self.status(i).await.map_err(|e| e.to_string())?));
            }
            let leader = ids[0].1.1;
            match ids.iter().find(|(_, (me, _))| *me == leader) {
                Some((i, _)) if ids.iter().all(|(_, (_, l))| *l == leader) => Ok(*i),
                _ => Err(format!("no agreed leader among {alive:?}: {ids:?}")),
            }
        })
        .await
    }
}

/// The leader of a 3-member cluster killed (SIGKILL) while three clients contend for one
/// lock, and restarted once the other two elected a new leader: no two critical sections
/// overlap, no stale token reaches the fenced resource, tokens rise in the order holders
/// entered, and the contenders go on being granted the lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_leader_keeps_exclusion_and_fencing() {
    let mut cluster = Cluster::start();
    let url = cluster.url();
    let open = || async { EtcdStorageBuilder::from_url(&url).unwrap().open().await };
    let mut clients = Vec::new();
    for _ in 0..3 {
        clients.push(wait_until("the cluster starts", open).await);
    }
    let leader = cluster.leader(&[0, 1, 2]).await;
    let report = storage_lock_testkit::cluster::contention_survives(
        clients,
        async {
            cluster.members[leader].kill();
            let alive: Vec<usize> = (0..3).filter(|&i| i != leader).collect();
            cluster.leader(&alive).await;
            cluster.members[leader].restart();
            cluster.leader(&[0, 1, 2]).await;
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
    let cluster = Cluster::start();
    let url = format!(
        "etcd://127.0.0.1:{}?prefix=cluster/&timeout=1s",
        cluster.clients[0]
    );
    let open = || async { EtcdStorageBuilder::from_url(&url).unwrap().open().await };
    let lone = wait_until("the cluster starts", open).await;
    cluster.leader(&[0, 1, 2]).await;
    storage_lock_testkit::cluster::a_minority_grants_nothing(
        lone,
        async {
            cluster.members[1].pause();
            cluster.members[2].pause();
        },
        async {
            cluster.members[1].resume();
            cluster.members[2].resume();
        },
    )
    .await;
}

/// The example of `EtcdStorageBuilder::open` (a `no_run` doctest) against the real server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_documented_open_works() {
    use storage_lock_core::Storage;
    let storage = storage_lock_etcd::EtcdStorageBuilder::from_env()
        .expect("STORAGE_LOCK_ETCD_URL is valid")
        .prefix("doc-locks/")
        .open()
        .await
        .expect("connect");
    assert!(storage.capabilities().linearizable_cas);
}

/// The holder's renewal, release and re-acquisition take one request each (the hint).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_known_record_saves_the_read() {
    storage_lock_testkit::conformance::a_known_record_saves_the_read(etcd().await).await;
}

/// A contender that lost the race on a stale hint answers busy from the refused `Txn` (its
/// failure branch reads the key), with no second request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_race_costs_one_request() {
    storage_lock_testkit::conformance::a_lost_race_costs_one_request(etcd().await, etcd().await)
        .await;
}

/// A waiter woken by the release (the watch carries the record) takes the lock in one request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_woken_waiter_takes_the_lock_in_one_request() {
    storage_lock_testkit::conformance::a_woken_waiter_takes_the_lock_in_one_request(
        etcd().await,
        etcd().await,
    )
    .await;
}

/// A second client whose clock runs an hour ahead finds a held lock busy (`clock: observed`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_contender_whose_clock_runs_ahead_finds_a_held_lock_busy() {
    let url = std::env::var("STORAGE_LOCK_ETCD_URL").expect("STORAGE_LOCK_ETCD_URL");
    let ahead = EtcdStorageBuilder::from_url(&url)
        .expect("a valid etcd URL")
        .prefix("storage-lock-suite/")
        .timeout(std::time::Duration::from_secs(10))
        .clock(storage_lock_testkit::conformance::Ahead(
            std::time::Duration::from_secs(3600),
        ))
        .open()
        .await
        .expect("connect to etcd");
    storage_lock_testkit::conformance::a_contender_whose_clock_runs_ahead_finds_a_held_lock_busy(
        etcd().await,
        ahead,
    )
    .await;
}

/// `host:port` of every member named by an `etcd://` URL (no credentials in the test's URL).
fn endpoints(url: &str) -> Vec<String> {
    let hosts = url.trim_start_matches("etcd://");
    let hosts = hosts.split(['?', '/']).next().unwrap_or(hosts);
    hosts.split(',').map(str::to_owned).collect()
}

/// A value under the prefix that is no storage-lock record is one bad row of a listing, named
/// by its key (before, it failed the whole listing).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_corrupt_record_is_one_bad_row() {
    let url = std::env::var("STORAGE_LOCK_ETCD_URL").expect("STORAGE_LOCK_ETCD_URL");
    let mut raw = etcd_client::Client::connect(endpoints(&url), None)
        .await
        .expect("a raw etcd client");
    storage_lock_testkit::conformance::a_corrupt_record_is_one_bad_row(
        etcd().await,
        |key| async move {
            raw.put(format!("storage-lock-suite/{key}"), "garbage", None)
                .await
                .expect("a raw put");
        },
    )
    .await;
}

/// Both suites against [`EtcdStorage`] on the 3-member etcd cluster named by
/// `STORAGE_LOCK_ETCD_CLUSTER_URL` (`scripts/services.sh` starts one on loopback and sets it):
/// every semantic of the single-member suites, with each write committed by a Raft quorum and
/// the client spread over the members. (The fault tests above, which kill and stop members,
/// start clusters of their own.)
mod cluster {
    use super::*;

    async fn cluster() -> EtcdStorage {
        open_env("STORAGE_LOCK_ETCD_CLUSTER_URL").await
    }

    storage_lock_testkit::storage_lock_suites!(cluster, lock_operations = default);
}
