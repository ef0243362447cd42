//! Both suites against [`NatsStorage`] on an R3 bucket of the 3-node NATS cluster named by
//! `STORAGE_LOCK_NATS_CLUSTER_URL` (`scripts/services.sh` starts one on loopback and sets it,
//! with `replicas=3`): every semantic of the single-server suites, with each write
//! acknowledged once a quorum of the stream's replicas has it. (The fault tests, which kill
//! and stop nodes, start clusters of their own: `tests/nats.rs`.)

use storage_lock_nats::{NatsStorage, NatsStorageBuilder};

async fn cluster() -> NatsStorage {
    let url = std::env::var("STORAGE_LOCK_NATS_CLUSTER_URL").expect(
        "STORAGE_LOCK_NATS_CLUSTER_URL must name a 3-node NATS cluster (run scripts/test.sh)",
    );
    NatsStorageBuilder::from_url(&url)
        .expect("a valid NATS URL")
        .bucket("storage-lock-suite")
        // Time for a loaded machine; no case here needs a request to time out.
        .timeout(std::time::Duration::from_secs(10))
        .open()
        .await
        .expect("connect to the NATS cluster")
}

storage_lock_testkit::storage_lock_suites!(cluster, lock_operations = default);
