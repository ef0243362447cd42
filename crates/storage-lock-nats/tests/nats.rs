//! Both suites against [`NatsStorage`] on the server named by `STORAGE_LOCK_NATS_URL`
//! (`scripts/services.sh` starts one and sets it), and a restart of a nats-server of this
//! test's own. Tests share one bucket; each uses lock names under a prefix of its own.

use storage_lock_nats::{NatsStorage, NatsStorageBuilder};
use storage_lock_testkit::restart::{ServerProcess, restart_keeps_fencing, spare_port, wait_until};

async fn nats() -> NatsStorage {
    open_env("STORAGE_LOCK_NATS_URL").await
}

/// The suites' storage on the server (or cluster) the environment variable `var` names.
async fn open_env(var: &str) -> NatsStorage {
    let url = std::env::var(var)
        .unwrap_or_else(|_| panic!("{var} must name a NATS server (run scripts/test.sh)"));
    NatsStorageBuilder::from_url(&url)
        .expect("a valid NATS URL")
        .bucket("storage-lock-suite")
        // Time for a loaded machine (the default 2 s failed cases at random); no case here
        // needs a request to time out.
        .timeout(std::time::Duration::from_secs(10))
        .open()
        .await
        .unwrap_or_else(|e| panic!("connect to NATS ({var}): {e}"))
}

// Only the primitives are implemented here: the lock operations are the engine's defaults
// (the polling path of a storage without notifications runs in the other backends' `defaults`).
storage_lock_testkit::storage_lock_suites!(nats, lock_operations = default);

/// SIGKILL of a nats-server this test started (same store directory on restart, fsync before
/// every acknowledgement): the records and their fencing tokens come back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_restart_keeps_fencing() {
    let bin = std::env::var("STORAGE_LOCK_NATS_BIN").unwrap_or_else(|_| "nats-server".into());
    let dir = tempfile::tempdir().unwrap();
    let port = spare_port();
    let conf = dir.path().join("nats.conf");
    std::fs::write(
        &conf,
        format!(
            "listen: \"127.0.0.1:{port}\"\njetstream {{ store_dir: \"{}\", sync_interval: always }}\n",
            dir.path().join("js").display()
        ),
    )
    .unwrap();
    let args = ["-c".to_owned(), conf.display().to_string()];
    let mut server = ServerProcess::start(bin, &args, dir.path().join("nats.log"));
    let url = format!("nats://127.0.0.1:{port}?timeout=5s");
    let open = || async { NatsStorageBuilder::from_url(&url).unwrap().open().await };
    let storage = wait_until("nats-server starts", open).await;
    restart_keeps_fencing(storage, async {
        server.restart();
        wait_until("nats-server restarts", open).await;
    })
    .await;
}

/// A 3-node NATS cluster of this test's own, JetStream on every node, on spare loopback ports.
struct Cluster {
    nodes: Vec<ServerProcess>,
    clients: Vec<u16>,
    _dir: tempfile::TempDir,
}

impl Cluster {
    fn start() -> Self {
        let bin = std::env::var("STORAGE_LOCK_NATS_BIN").unwrap_or_else(|_| "nats-server".into());
        let dir = tempfile::tempdir().unwrap();
        let ports: Vec<(u16, u16)> = (0..3).map(|_| (spare_port(), spare_port())).collect();
        let routes = ports
            .iter()
            .map(|(_, route)| format!("\"nats-route://127.0.0.1:{route}\""))
            .collect::<Vec<_>>()
            .join(", ");
        let nodes = ports
            .iter()
            .enumerate()
            .map(|(i, (client, route))| {
                let conf = dir.path().join(format!("n{i}.conf"));
                std::fs::write(
                    &conf,
                    format!(
                        "server_name: n{i}\nlisten: \"127.0.0.1:{client}\"\n\
                         jetstream {{ store_dir: \"{}\" }}\n\
                         cluster {{ name: storage-lock, listen: \"127.0.0.1:{route}\", \
                         routes: [{routes}] }}\n",
                        dir.path().join(format!("js{i}")).display()
                    ),
                )
                .unwrap();
                let args = ["-c".to_owned(), conf.display().to_string()];
                ServerProcess::start(&bin, &args, dir.path().join(format!("n{i}.log")))
            })
            .collect();
        Self {
            nodes,
            clients: ports.iter().map(|(c, _)| *c).collect(),
            _dir: dir,
        }
    }

    fn url(&self, bucket: &str) -> String {
        let hosts: Vec<String> = self
            .clients
            .iter()
            .map(|p| format!("127.0.0.1:{p}"))
            .collect();
        format!(
            "nats://{}?bucket={bucket}&replicas=3&timeout=3s",
            hosts.join(",")
        )
    }

    /// The node that leads the bucket's stream, as node `ask` sees it, once there is one and
    /// it is not `not`.
    async fn stream_leader(&self, ask: usize, bucket: &str, not: Option<usize>) -> usize {
        wait_until("the stream has a leader", || async {
            let client = async_nats::connect(format!("127.0.0.1:{}", self.clients[ask]))
                .await
                .map_err(|e| e.to_string())?;
            let js = async_nats::jetstream::new(client);
            let mut stream = js
                .get_stream(format!("KV_{bucket}"))
                .await
                .map_err(|e| e.to_string())?;
            let info = stream.info().await.map_err(|e| e.to_string())?;
            let leader = info
                .cluster
                .as_ref()
                .and_then(|c| c.leader.clone())
                .and_then(|name| name.strip_prefix('n')?.parse::<usize>().ok());
            match leader {
                Some(l) if Some(l) != not => Ok(l),
                other => Err(format!("leader {other:?}")),
            }
        })
        .await
    }
}

/// The stream leader of an R3 bucket on a 3-node cluster killed (SIGKILL) while three clients
/// contend for one lock, and restarted once the others elected a new one: no two critical
/// sections overlap, no stale token reaches the fenced resource, tokens rise in the order
/// holders entered, and the contenders go on being granted the lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_stream_leader_keeps_exclusion_and_fencing() {
    let mut cluster = Cluster::start();
    let bucket = "cluster-locks";
    let url = cluster.url(bucket);
    let open = || async { NatsStorageBuilder::from_url(&url).unwrap().open().await };
    let mut clients = Vec::new();
    for _ in 0..3 {
        clients.push(wait_until("the cluster starts", open).await);
    }
    let leader = cluster.stream_leader(0, bucket, None).await;
    let report = storage_lock_testkit::cluster::contention_survives(
        clients,
        async {
            cluster.nodes[leader].kill();
            let survivor = (leader + 1) % 3;
            cluster.stream_leader(survivor, bucket, Some(leader)).await;
            cluster.nodes[leader].restart();
        },
        20,
    )
    .await;
    eprintln!("{report:?}");
}

/// A node cut off from the other two (they are stopped with SIGSTOP) grants nothing to a
/// client that reaches only it; once they continue, the same client is granted the lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_without_quorum_grants_nothing() {
    let cluster = Cluster::start();
    let bucket = "minority-locks";
    let open_all = || async {
        NatsStorageBuilder::from_url(&cluster.url(bucket))
            .unwrap()
            .open()
            .await
    };
    wait_until("the cluster starts", open_all).await;
    cluster.stream_leader(0, bucket, None).await;
    let url = format!(
        "nats://127.0.0.1:{}?bucket={bucket}&replicas=3&timeout=1s",
        cluster.clients[0]
    );
    let open = || async { NatsStorageBuilder::from_url(&url).unwrap().open().await };
    let lone = wait_until("node 0 answers", open).await;
    storage_lock_testkit::cluster::a_minority_grants_nothing(
        lone,
        async {
            cluster.nodes[1].pause();
            cluster.nodes[2].pause();
        },
        async {
            cluster.nodes[1].resume();
            cluster.nodes[2].resume();
        },
    )
    .await;
}

/// Clients opening a replicated bucket that does not exist yet, all at once (as a fleet's
/// processes do on their first start): each one's first read is answered. A creator whose
/// create call found the bucket already being created used to get it before its stream had a
/// leader, and its first read then waited out the whole request timeout and failed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_opening_a_new_replicated_bucket_together_can_all_read_it() {
    use storage_lock_core::Storage;
    let url =
        std::env::var("STORAGE_LOCK_NATS_CLUSTER_URL").expect("STORAGE_LOCK_NATS_CLUSTER_URL");
    let bucket = format!("storage-lock-new-{:x}", std::process::id());
    let opened = futures_util::future::join_all((0..8).map(|_| async {
        let storage = NatsStorageBuilder::from_url(&url)
            .unwrap()
            .bucket(&bucket)
            .timeout(std::time::Duration::from_secs(10))
            .open()
            .await
            .expect("open");
        storage.get("k").await
    }))
    .await;
    let first = url
        .trim_start_matches("nats://")
        .split([',', '?'])
        .next()
        .unwrap();
    let js = async_nats::jetstream::new(async_nats::connect(first).await.expect("connect"));
    js.delete_key_value(&bucket).await.expect("clean up");
    for (i, read) in opened.into_iter().enumerate() {
        assert!(
            read.expect("the first read is answered").is_none(),
            "client {i}"
        );
    }
}

/// A bucket in memory storage forgets holds on a restart, one with a `max_age` forgets released
/// records: refused unless accepted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_or_expiring_buckets_are_refused_unless_volatile_is_accepted() {
    let url = std::env::var("STORAGE_LOCK_NATS_URL").expect("STORAGE_LOCK_NATS_URL");
    let client = async_nats::connect(url.trim_start_matches("nats://"))
        .await
        .expect("connect");
    let js = async_nats::jetstream::new(client);
    let bucket = format!("storage-lock-mem-{:x}", std::process::id());
    js.create_key_value(async_nats::jetstream::kv::Config {
        bucket: bucket.clone(),
        storage: async_nats::jetstream::stream::StorageType::Memory,
        ..Default::default()
    })
    .await
    .expect("create a memory bucket");
    let refused = NatsStorageBuilder::from_url(&url)
        .unwrap()
        .bucket(&bucket)
        .open()
        .await;
    let err = refused.expect_err("a memory bucket must be refused");
    assert!(err.to_string().contains("memory"), "{err}");
    let accepted = NatsStorageBuilder::from_url(&format!("{url}?durability=volatile"))
        .unwrap()
        .bucket(&bucket)
        .open()
        .await
        .expect("accepted when volatile is allowed");
    use storage_lock_core::Storage;
    assert_eq!(
        accepted.capabilities().durability,
        storage_lock_core::Durability::Volatile
    );
    js.delete_key_value(&bucket).await.expect("clean up");

    // A bucket that expires entries would forget the fencing tokens of released locks.
    let expiring = format!("storage-lock-ttl-{:x}", std::process::id());
    js.create_key_value(async_nats::jetstream::kv::Config {
        bucket: expiring.clone(),
        max_age: std::time::Duration::from_secs(3600),
        ..Default::default()
    })
    .await
    .expect("create an expiring bucket");
    let refused = NatsStorageBuilder::from_url(&url)
        .unwrap()
        .bucket(&expiring)
        .open()
        .await;
    let err = refused.expect_err("an expiring bucket must be refused");
    assert!(err.to_string().contains("expires"), "{err}");
    js.delete_key_value(&expiring).await.expect("clean up");
}

/// The example of `NatsStorageBuilder::open` (a `no_run` doctest) against the real server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_documented_open_works() {
    use storage_lock_core::Storage;
    let storage = storage_lock_nats::NatsStorageBuilder::from_env()
        .expect("STORAGE_LOCK_NATS_URL is valid")
        .prefix("doc-locks/")
        .open()
        .await
        .expect("connect");
    assert!(storage.capabilities().linearizable_cas);
}

/// The holder's renewal, release and re-acquisition take one request each (the hint).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_known_record_saves_the_read() {
    storage_lock_testkit::conformance::a_known_record_saves_the_read(nats().await).await;
}

/// A waiter woken by the release (the watch carries the record) takes the lock in one request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_woken_waiter_takes_the_lock_in_one_request() {
    storage_lock_testkit::conformance::a_woken_waiter_takes_the_lock_in_one_request(
        nats().await,
        nats().await,
    )
    .await;
}

/// A second client whose clock runs an hour ahead finds a held lock busy (`clock: observed`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_contender_whose_clock_runs_ahead_finds_a_held_lock_busy() {
    let holder = nats().await;
    let url = std::env::var("STORAGE_LOCK_NATS_URL").expect("STORAGE_LOCK_NATS_URL");
    let ahead = NatsStorageBuilder::from_url(&url)
        .expect("a valid NATS URL")
        .bucket("storage-lock-suite")
        .timeout(std::time::Duration::from_secs(10))
        .clock(storage_lock_testkit::conformance::Ahead(
            std::time::Duration::from_secs(3600),
        ))
        .open()
        .await
        .expect("connect to NATS");
    storage_lock_testkit::conformance::a_contender_whose_clock_runs_ahead_finds_a_held_lock_busy(
        holder, ahead,
    )
    .await;
}

/// A value under the prefix that is no storage-lock record is one bad row of a listing, named
/// by its key (before, it failed the whole listing).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_corrupt_record_is_one_bad_row() {
    let url = std::env::var("STORAGE_LOCK_NATS_URL").expect("STORAGE_LOCK_NATS_URL");
    let server = url.trim_start_matches("nats://");
    let server = server.split(['?', ',']).next().unwrap_or(server).to_owned();
    let client = async_nats::connect(server)
        .await
        .expect("a raw NATS client");
    // Opened first: it creates the suite's bucket if no other case has yet.
    let storage = nats().await;
    let bucket = async_nats::jetstream::new(client)
        .get_key_value("storage-lock-suite")
        .await
        .expect("the suite's bucket");
    storage_lock_testkit::conformance::a_corrupt_record_is_one_bad_row(storage, |key| async move {
        // The storage's key: the (empty) prefix, then the escaped lock name.
        let escaped = storage_lock_core::storage::encoding::escape_key(&key);
        bucket
            .put(escaped, "garbage".into())
            .await
            .expect("a raw put");
    })
    .await;
}

/// Both suites against [`NatsStorage`] on an R3 bucket of the 3-node NATS cluster named by
/// `STORAGE_LOCK_NATS_CLUSTER_URL` (`scripts/services.sh` starts one on loopback and sets it,
/// with `replicas=3`): every semantic of the single-server suites, with each write
/// acknowledged once a quorum of the stream's replicas has it. (The fault tests above, which kill
/// and stop nodes, start clusters of their own.)
mod cluster {
    use super::*;

    async fn cluster() -> NatsStorage {
        open_env("STORAGE_LOCK_NATS_CLUSTER_URL").await
    }

    storage_lock_testkit::storage_lock_suites!(cluster, lock_operations = default);
}
