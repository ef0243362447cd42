//! Both suites against [`EtcdStorage`] on the 3-member etcd cluster named by
//! `STORAGE_LOCK_ETCD_CLUSTER_URL` (`scripts/services.sh` starts one on loopback and sets it):
//! every semantic of the single-member suites, with each write committed by a Raft quorum and
//! the client spread over the members. (The fault tests, which kill and stop members, start
//! clusters of their own: `tests/etcd.rs`.)

use storage_lock_etcd::{EtcdStorage, EtcdStorageBuilder};

async fn cluster() -> EtcdStorage {
    let url = std::env::var("STORAGE_LOCK_ETCD_CLUSTER_URL").expect(
        "STORAGE_LOCK_ETCD_CLUSTER_URL must name a 3-member etcd cluster (run scripts/test.sh)",
    );
    EtcdStorageBuilder::from_url(&url)
        .expect("a valid etcd URL")
        .prefix("storage-lock-suite/")
        // Time for a loaded machine; no case here needs a request to time out.
        .timeout(std::time::Duration::from_secs(10))
        .open()
        .await
        .expect("connect to the etcd cluster")
}

storage_lock_testkit::storage_lock_suites!(cluster, lock_operations = default);
