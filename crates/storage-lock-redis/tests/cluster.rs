//! [`RedisStorage`] on a Redis Cluster.
//!
//! * Both suites run on the cluster `scripts/services.sh` starts (3 primaries with a replica
//!   each, on 6400–6405), through `STORAGE_LOCK_REDIS_CLUSTER_URL` (`cluster=true&replicas=1`:
//!   every acknowledged write is held by the shard's replica).
//! * Any node is a good seed, and a prefix without a hash tag is refused.
//! * A failover: a cluster of this test's own, whose primary of the locks' slot is killed with
//!   SIGKILL mid-contention; its replica takes over, the killed node comes back as a replica,
//!   and exclusion and fencing hold throughout.

use std::time::Duration;

use storage_lock_core::{AcquireRequest, OwnerId, Storage, StorageError};
use storage_lock_redis::{RedisStorage, RedisStorageBuilder};
use storage_lock_testkit::restart::{ServerProcess, spare_port, wait_until};

fn cluster_url() -> String {
    std::env::var("STORAGE_LOCK_REDIS_CLUSTER_URL").expect(
        "STORAGE_LOCK_REDIS_CLUSTER_URL must name a Redis Cluster node (run scripts/test.sh)",
    )
}

async fn cluster() -> RedisStorage {
    RedisStorageBuilder::from_url(&cluster_url())
        .expect("a valid cluster URL")
        .prefix("{storage-lock-suite}:")
        .open()
        .await
        .expect("connect to the Redis Cluster")
}

storage_lock_testkit::storage_lock_suites!(cluster);

fn request() -> AcquireRequest {
    AcquireRequest {
        owner: OwnerId::random(),
        lease: Duration::from_secs(30),
        holder: None,
        reentrant: false,
    }
}

/// Whichever node the URL names, the storage reaches the primary of the prefix's slot (the
/// client follows `MOVED`), and the tokens of one lock rise across clients seeded at each node;
/// a plain client of a node that does not own the slot is told `MOVED`, which is why the URL
/// must say `cluster=true`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_node_is_a_seed_for_the_slot_of_the_prefix() {
    let name = format!("seeds-{:016x}", rand_u64());
    let mut last = 0;
    let mut moved = 0;
    for port in 6400..=6405 {
        let url = format!("redis://127.0.0.1:{port}/?cluster=true&replicas=1");
        let s = RedisStorageBuilder::from_url(&url)
            .unwrap()
            .prefix("{storage-lock-seeds}:")
            .open()
            .await
            .unwrap_or_else(|e| panic!("seed {port}: {e}"));
        let req = request();
        let granted = s.acquire_once(&name, &req).await.unwrap();
        let storage_lock_core::AcquireOutcome::Acquired { fencing, .. } = granted else {
            panic!("seed {port}: {granted:?}");
        };
        assert!(fencing > last, "seed {port}: token {fencing} after {last}");
        last = fencing;
        s.release(&name, req.owner).await.unwrap();

        let plain = RedisStorage::builder()
            .url(format!("redis://127.0.0.1:{port}/"))
            .prefix("{storage-lock-seeds}:")
            .open()
            .await
            .unwrap();
        let req = request();
        if let Err(e) = plain.acquire_once(&name, &req).await {
            assert!(
                e.to_string().to_lowercase().contains("moved"),
                "seed {port}: {e}"
            );
            moved += 1;
        } else {
            plain.release(&name, req.owner).await.unwrap();
        }
    }
    assert!(
        moved >= 4,
        "only {moved} of 6 nodes redirected a plain client"
    );
}

/// On a cluster a lock's record and the fencing floor must share a slot: a prefix without a
/// hash tag is a configuration error at `open`, naming the fix.
#[tokio::test]
async fn a_prefix_without_a_hash_tag_is_refused() {
    let err = RedisStorageBuilder::from_url(&cluster_url())
        .unwrap()
        .prefix("locks:")
        .open()
        .await
        .unwrap_err();
    let StorageError::Config { reason, .. } = &err else {
        panic!("expected a configuration error, got {err:?}");
    };
    assert!(reason.contains("hash tag"), "{reason}");
}

/// A Redis Cluster of this test's own: 3 primaries, a replica each, on spare loopback ports.
struct OwnCluster {
    nodes: Vec<ServerProcess>,
    ports: Vec<u16>,
    _dir: tempfile::TempDir,
}

impl OwnCluster {
    async fn start() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let ports: Vec<(u16, u16)> = (0..6).map(|_| (spare_port(), spare_port())).collect();
        let nodes = ports
            .iter()
            .map(|(port, bus)| {
                let d = dir.path().join(port.to_string());
                std::fs::create_dir_all(&d).unwrap();
                let args: Vec<String> = [
                    "--bind",
                    "127.0.0.1",
                    "--port",
                    &port.to_string(),
                    "--cluster-port",
                    &bus.to_string(),
                    "--cluster-enabled",
                    "yes",
                    "--cluster-config-file",
                    &d.join("nodes.conf").display().to_string(),
                    "--cluster-node-timeout",
                    "2000",
                    "--save",
                    "",
                    "--appendonly",
                    "yes",
                    "--appendfsync",
                    "always",
                    "--dir",
                    &d.display().to_string(),
                ]
                .map(str::to_owned)
                .to_vec();
                ServerProcess::start("redis-server", &args, d.join("redis.log"))
            })
            .collect();
        let cluster = Self {
            nodes,
            ports: ports.iter().map(|(p, _)| *p).collect(),
            _dir: dir,
        };
        let c = &cluster;
        for &p in &c.ports {
            wait_until("a cluster node starts", || async move {
                c.cli(p, &["ping"]).await
            })
            .await;
        }
        let mut create = vec!["--cluster".to_owned(), "create".to_owned()];
        create.extend(cluster.ports.iter().map(|p| format!("127.0.0.1:{p}")));
        create.extend(["--cluster-replicas", "1", "--cluster-yes"].map(str::to_owned));
        let out = tokio::process::Command::new("redis-cli")
            .args(&create)
            .output()
            .await
            .expect("run redis-cli");
        assert!(
            out.status.success(),
            "redis-cli --cluster create: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        cluster.in_sync(&[0, 1, 2, 3, 4, 5]).await;
        cluster
    }

    async fn cli(&self, port: u16, args: &[&str]) -> Result<String, String> {
        let out = tokio::process::Command::new("redis-cli")
            .args(["-h", "127.0.0.1", "-p", &port.to_string()])
            .args(args)
            .output()
            .await
            .map_err(|e| e.to_string())?;
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        if out.status.success() && !text.starts_with("Could not connect") {
            Ok(text)
        } else {
            Err(text)
        }
    }

    /// Waits until the nodes `alive` see the cluster ok and each replica among them is in
    /// sync with its primary.
    async fn in_sync(&self, alive: &[usize]) {
        for &i in alive {
            let port = self.ports[i];
            wait_until("the cluster is ok and in sync", || async move {
                let info = self.cli(port, &["cluster", "info"]).await?;
                if !info.contains("cluster_state:ok") {
                    return Err(format!("{port}: {info}"));
                }
                let repl = self.cli(port, &["info", "replication"]).await?;
                if repl.contains("role:slave") && !repl.contains("master_link_status:up") {
                    return Err(format!("{port}: {repl}"));
                }
                Ok(())
            })
            .await;
        }
    }

    /// The index of the node that is the primary of `tag`'s slot, as node `via` sees it.
    async fn primary_of(&self, tag: &str, via: usize) -> Result<usize, String> {
        let port = self.ports[via];
        let slot = self
            .cli(port, &["cluster", "keyslot", &format!("{{{tag}}}")])
            .await?;
        let slot: u16 = slot
            .trim()
            .parse()
            .map_err(|_| format!("keyslot: {slot}"))?;
        let nodes = self.cli(port, &["cluster", "nodes"]).await?;
        for line in nodes.lines() {
            let f: Vec<&str> = line.split_whitespace().collect();
            if f.len() < 9 || !f[2].contains("master") || f[2].contains("fail") {
                continue;
            }
            let owns = f[8..].iter().any(|r| {
                let (a, b) = r.split_once('-').unwrap_or((r, r));
                matches!((a.parse::<u16>(), b.parse::<u16>()), (Ok(a), Ok(b)) if (a..=b).contains(&slot))
            });
            let addr = f[1].split('@').next().unwrap_or_default();
            let p = addr.rsplit(':').next().and_then(|p| p.parse::<u16>().ok());
            if let (true, Some(i)) = (owns, self.ports.iter().position(|&q| Some(q) == p)) {
                return Ok(i);
            }
        }
        Err(format!("no live primary owns slot {slot}: {nodes}"))
    }
}

/// The primary of the locks' slot killed (SIGKILL) while three clients contend for one lock;
/// its replica is promoted, the killed node is started again (it rejoins as a replica) and
/// the contenders go on. With `replicas=1` every acknowledged write was on the promoted
/// replica, so no two critical sections overlap, no stale token reaches the fenced resource,
/// and tokens rise in the order holders entered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_primary_fails_over_keeping_exclusion_and_fencing() {
    let mut cluster = OwnCluster::start().await;
    let tag = "failover-locks";
    let victim = wait_until("the cluster names the slot's primary", || {
        cluster.primary_of(tag, 0)
    })
    .await;
    let mut clients = Vec::new();
    for i in (0..6).filter(|&i| i != victim).take(3) {
        let url = format!(
            "redis://127.0.0.1:{}/?cluster=true&replicas=1&prefix={{{tag}}}:",
            cluster.ports[i]
        );
        clients.push(
            RedisStorageBuilder::from_url(&url)
                .unwrap()
                .open()
                .await
                .unwrap(),
        );
    }
    let survivor = (0..6).find(|&i| i != victim).unwrap();
    let report = storage_lock_testkit::cluster::contention_survives(
        clients,
        async {
            cluster.nodes[victim].kill();
            wait_until("a replica takes over the slot", || async {
                match cluster.primary_of(tag, survivor).await? {
                    now if now == victim => Err("the killed node still owns the slot".to_owned()),
                    _ => Ok(()),
                }
            })
            .await;
            cluster.nodes[victim].restart();
            cluster.in_sync(&[0, 1, 2, 3, 4, 5]).await;
        },
        20,
    )
    .await;
    eprintln!("{report:?}");
}

fn rand_u64() -> u64 {
    use std::hash::{BuildHasher, RandomState};
    RandomState::new().hash_one(std::time::SystemTime::now())
}
