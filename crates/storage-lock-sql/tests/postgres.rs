//! Both suites against [`PostgresStorage`] on the server named by `STORAGE_LOCK_POSTGRES_URL`
//! (`scripts/services.sh` starts one and sets it). The tests share one table; each uses keys
//! under a prefix of its own.

use storage_lock_sql::PostgresStorage;

async fn postgres() -> PostgresStorage {
    let url = std::env::var("STORAGE_LOCK_POSTGRES_URL")
        .expect("STORAGE_LOCK_POSTGRES_URL must name a PostgreSQL server (run scripts/test.sh)");
    PostgresStorage::builder()
        .url(url)
        .table("storage_lock_suite")
        // Time for a loaded machine: the default 5 s to get a connection failed the suite
        // once with a release build beside it (PoolTimedOut); no case needs it to time out.
        .acquire_timeout(std::time::Duration::from_secs(30))
        .open()
        .await
        .expect("connect to PostgreSQL")
}

storage_lock_testkit::storage_lock_suites!(postgres);

/// Regression: an acquisition whose statement took its snapshot before a sweep raised the
/// fencing floor and deleted the key's tombstone must still see the raised floor (it read the
/// floor from its snapshot and re-issued token 1). The acquisition is held between its snapshot
/// and its insert's conflict check by a `BEFORE INSERT` trigger of the test's table that waits
/// for an advisory lock the test holds (row triggers run before `ON CONFLICT` looks for the
/// conflicting row).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquisition_delayed_past_a_sweep_gets_a_new_token() {
    use std::time::Duration;
    use storage_lock_core::{AcquireOutcome, AcquireRequest, OwnerId, Storage, StorageExt};

    let (s, url, table) = own_table("sl_race").await;
    let req = |owner| AcquireRequest {
        owner,
        lease: Duration::from_secs(30),
        holder: None,
        reentrant: false,
    };
    let token = |o: AcquireOutcome| match o {
        AcquireOutcome::Acquired { fencing, .. } => fencing,
        busy => panic!("{busy:?}"),
    };
    let a = OwnerId::random();
    let first = token(s.acquire_once("k", &req(a)).await.unwrap());
    s.release("k", a).await.unwrap();

    let pool = sqlx::PgPool::connect(&url).await.unwrap();
    let (blocker, gate) = closed_gate(&pool, &table, "true").await;
    let s = std::sync::Arc::new(s);
    let delayed = tokio::spawn({
        let s = s.clone();
        async move { s.acquire_once("k", &req(OwnerId::random())).await }
    });
    until_waiting_at(&pool, gate).await; // it has its snapshot and waits
    let swept = s.sweep("", Duration::ZERO).await.unwrap();
    assert_eq!(swept.deleted, 1, "{swept:?}");
    blocker.rollback().await.unwrap();
    let second = token(delayed.await.unwrap().unwrap());
    drop_gated_table(&pool, &table).await;
    assert!(
        second > first,
        "token {second} issued after {first}: the floor raised by the sweep was not seen"
    );
}

/// A storage on a table of its own (`PREFIX_` and a random suffix), with the server's URL and
/// the table's name.
async fn own_table(prefix: &str) -> (PostgresStorage, String, String) {
    let url = std::env::var("STORAGE_LOCK_POSTGRES_URL")
        .expect("STORAGE_LOCK_POSTGRES_URL must name a PostgreSQL server (run scripts/test.sh)");
    let table = format!("{prefix}_{:08x}", rand_suffix());
    let s = PostgresStorage::builder()
        .url(&url)
        .table(&table)
        .open()
        .await
        .expect("connect to PostgreSQL");
    (s, url, table)
}

/// Closes a gate on `table`: a `BEFORE INSERT` trigger that makes every row for which
/// `condition` holds wait for an advisory lock, held by the returned transaction (row triggers
/// run before `ON CONFLICT` looks for the conflicting row). Rolling it back opens the gate.
async fn closed_gate(
    pool: &sqlx::PgPool,
    table: &str,
    condition: &str,
) -> (sqlx::Transaction<'static, sqlx::Postgres>, i64) {
    let gate = i64::from(rand_suffix());
    sqlx::raw_sql(&format!(
        "CREATE FUNCTION {table}_gate() RETURNS trigger LANGUAGE plpgsql AS $$
         BEGIN
           IF {condition} THEN PERFORM pg_advisory_xact_lock_shared({gate}); END IF;
           RETURN NEW;
         END $$;
         CREATE TRIGGER gate BEFORE INSERT ON {table} FOR EACH ROW EXECUTE FUNCTION {table}_gate()"
    ))
    .execute(pool)
    .await
    .unwrap();
    let mut blocker = pool.begin().await.unwrap();
    sqlx::query("SELECT pg_advisory_xact_lock($1)")
        .bind(gate)
        .execute(&mut *blocker)
        .await
        .unwrap();
    (blocker, gate)
}

/// Until a statement waits at the gate `gate` (within 60 s).
async fn until_waiting_at(pool: &sqlx::PgPool, gate: i64) {
    let waiting = async {
        loop {
            let n: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted
                   AND objid::bigint = $1",
            )
            .bind(gate & 0xffff_ffff)
            .fetch_one(pool)
            .await
            .unwrap();
            if n > 0 {
                return;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
    };
    tokio::time::timeout(std::time::Duration::from_secs(60), waiting)
        .await
        .expect("a statement reached the gate");
}

/// A 30 s request of `owner` whose holder note is `note` (a gate's trigger picks its rows by it).
fn noted_request(
    owner: storage_lock_core::OwnerId,
    note: Option<&str>,
) -> storage_lock_core::AcquireRequest {
    storage_lock_core::AcquireRequest {
        owner,
        lease: std::time::Duration::from_secs(30),
        holder: Some(std::sync::Arc::new(storage_lock_core::HolderInfo {
            host: "test".into(),
            pid: 1,
            note: note.map(str::to_owned),
        })),
        reentrant: false,
    }
}

/// Drops a table of [`own_table`] and its gate.
async fn drop_gated_table(pool: &sqlx::PgPool, table: &str) {
    sqlx::raw_sql(&format!(
        "DROP TABLE {table}; DROP SEQUENCE {table}_version; DROP FUNCTION {table}_gate()"
    ))
    .execute(pool)
    .await
    .ok();
}

fn rand_suffix() -> u32 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos()
        ^ std::process::id()
}

/// Regression: every open ran `ALTER TABLE … ADD COLUMN IF NOT EXISTS`, which queues for an
/// exclusive table lock behind any open transaction that read the table (an idle `psql`, a
/// CLI `list` in a transaction) and makes every lock operation queue behind it: a holder lost
/// its lock. Opening must not touch an up-to-date table, and renewals go on meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn opening_does_not_queue_behind_a_reader_of_the_table() {
    use std::time::Duration;
    use storage_lock_core::{AcquireOutcome, AcquireRequest, OwnerId, RenewOutcome, Storage};

    let url = std::env::var("STORAGE_LOCK_POSTGRES_URL")
        .expect("STORAGE_LOCK_POSTGRES_URL must name a PostgreSQL server (run scripts/test.sh)");
    let table = format!("sl_idle_{:08x}", rand_suffix());
    let open = || PostgresStorage::builder().url(&url).table(&table).open();
    let s = open().await.unwrap();
    let owner = OwnerId::random();
    let req = AcquireRequest {
        owner,
        lease: Duration::from_secs(30),
        holder: None,
        reentrant: false,
    };
    assert!(matches!(
        s.acquire_once("k", &req).await.unwrap(),
        AcquireOutcome::Acquired { .. }
    ));
    let pool = sqlx::PgPool::connect(&url).await.unwrap();
    let mut idle = pool.begin().await.unwrap();
    sqlx::query(&format!("SELECT count(*) FROM {table}"))
        .execute(&mut *idle)
        .await
        .unwrap();
    let second = tokio::time::timeout(Duration::from_secs(4), open()).await;
    let renewed = tokio::time::timeout(
        Duration::from_secs(4),
        s.renew("k", owner, Duration::from_secs(30)),
    )
    .await;
    idle.rollback().await.unwrap();
    sqlx::raw_sql(&format!(
        "DROP TABLE {table}; DROP SEQUENCE {table}_version"
    ))
    .execute(&pool)
    .await
    .ok();
    second
        .expect("open queued behind an idle reader of the table")
        .unwrap();
    assert!(matches!(
        renewed.expect("renewal queued").unwrap(),
        RenewOutcome::Renewed { .. }
    ));
}

/// A PostgreSQL server of this test's own (`initdb` into a temporary directory, a spare port),
/// run as the `postgres` user when the test runs as root (the server refuses root), with the
/// WAL writer slowed to 10 s so that an asynchronous commit stays unflushed until the crash.
struct OwnServer {
    dir: tempfile::TempDir,
    port: u16,
    bin: std::path::PathBuf,
    child: Option<std::process::Child>,
}

impl OwnServer {
    fn command(&self, program: &str) -> std::process::Command {
        let path = self.bin.join(program);
        let root = std::process::Command::new("id")
            .arg("-u")
            .output()
            .is_ok_and(|o| o.stdout.starts_with(b"0\n"));
        if root {
            let mut c = std::process::Command::new("setpriv");
            c.args([
                "--reuid=postgres",
                "--regid=postgres",
                "--init-groups",
                "--",
            ])
            .arg(path);
            c
        } else {
            std::process::Command::new(path)
        }
    }

    fn data(&self) -> std::path::PathBuf {
        self.dir.path().join("data")
    }

    fn init() -> Self {
        let bin = std::env::var("STORAGE_LOCK_POSTGRES_BIN").map_or_else(
            |_| {
                std::fs::read_dir("/usr/lib/postgresql")
                    .ok()
                    .and_then(|d| d.flatten().map(|e| e.path()).max())
                    .map(|p| p.join("bin"))
                    .expect("PostgreSQL server binaries (set STORAGE_LOCK_POSTGRES_BIN)")
            },
            std::path::PathBuf::from,
        );
        let dir = tempfile::tempdir().unwrap();
        let s = Self {
            dir,
            port: storage_lock_testkit::restart::spare_port(),
            bin,
            child: None,
        };
        // The server's user must own its directory.
        let _ = std::process::Command::new("chown")
            .args(["-R", "postgres:postgres"])
            .arg(s.dir.path())
            .status();
        let out = s
            .command("initdb")
            .args(["-U", "postgres", "--auth=trust", "--no-sync", "-D"])
            .arg(s.data())
            .output()
            .unwrap();
        assert!(out.status.success(), "initdb: {out:?}");
        s
    }

    fn start(&mut self) {
        let log =
            std::fs::File::create(self.dir.path().join(format!("pg-{}.log", self.port))).unwrap();
        let child = self
            .command("postgres")
            .arg("-D")
            .arg(self.data())
            .args(["-p", &self.port.to_string(), "-k"])
            .arg(self.dir.path())
            .args([
                "-c",
                "listen_addresses=127.0.0.1",
                "-c",
                "wal_writer_delay=10000",
            ])
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap();
        self.child = Some(child);
    }

    /// `pg_ctl stop -m immediate`: the server exits at once, without a checkpoint and without
    /// writing the WAL still in its buffers, as in a crash.
    fn crash(&mut self) {
        let out = self
            .command("pg_ctl")
            .args(["stop", "-m", "immediate", "-D"])
            .arg(self.data())
            .output()
            .unwrap();
        assert!(out.status.success(), "pg_ctl stop: {out:?}");
        if let Some(mut c) = self.child.take() {
            let _ = c.wait();
        }
    }

    async fn open(&self) -> PostgresStorage {
        let url = format!("postgres://postgres@127.0.0.1:{}/postgres", self.port);
        storage_lock_testkit::restart::wait_until("PostgreSQL starts", || {
            PostgresStorage::builder().url(&url).table("crash").open()
        })
        .await
    }
}

impl Drop for OwnServer {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Releases commit without waiting for their WAL flush (the module docs argue why that is safe);
/// this crashes a server of the test's own (`pg_ctl stop -m immediate`) right after releases:
/// * a release followed by another owner's (synchronous) acquisition is never lost: that
///   acquisition's flush carries it, and the new holder and its higher token survive;
/// * a release with nothing after it may be lost, and then the record is exactly the hold as it
///   was (same owner, token and expiry): the key frees when that lease ends, and the next token
///   is still higher. With the WAL writer slowed down, at least one of three such releases is
///   lost, which shows releases really do not wait for the flush.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn releases_lost_in_a_crash_leave_the_hold_as_it_was() {
    use std::time::Duration;
    use storage_lock_core::{AcquireOutcome, AcquireRequest, OwnerId, Storage};

    let req = |owner, secs| AcquireRequest {
        owner,
        lease: Duration::from_secs(secs),
        holder: None,
        reentrant: false,
    };
    let token = |o: AcquireOutcome| match o {
        AcquireOutcome::Acquired { fencing, .. } => fencing,
        busy => panic!("{busy:?}"),
    };
    let mut server = OwnServer::init();
    server.start();
    let (a, b) = (OwnerId::random(), OwnerId::random());

    // A release, then another owner's acquisition, then the crash.
    let s = server.open().await;
    let first = token(s.acquire_once("chain", &req(a, 60)).await.unwrap());
    s.release("chain", a).await.unwrap();
    let second = token(s.acquire_once("chain", &req(b, 60)).await.unwrap());
    assert_eq!(second, first + 1);
    drop(s);
    server.crash();
    server.start();
    let s = server.open().await;
    let rec = s.get("chain").await.unwrap().expect("the record").record;
    assert_eq!(
        (rec.owner, rec.count, rec.fencing),
        (b, 1, second),
        "{rec:?}"
    );

    // A release with nothing after it.
    let mut lost = 0;
    let mut s = s;
    for round in 0..3 {
        let key = format!("alone-{round}");
        let t = token(s.acquire_once(&key, &req(a, 2)).await.unwrap());
        let held = s.get(&key).await.unwrap().expect("the record").record;
        s.release(&key, a).await.unwrap();
        drop(s);
        server.crash();
        server.start();
        s = server.open().await;
        let after = s.get(&key).await.unwrap().expect("the record").record;
        if after.count == 1 {
            // Lost: the hold exactly as it was, until its own expiry.
            assert_eq!(after, held, "a lost release must leave the hold as it was");
            lost += 1;
        } else {
            assert_eq!(
                (after.owner, after.count, after.fencing),
                (a, 0, t),
                "{after:?}"
            );
        }
        // Either way the next holder gets a higher token, once the lease has ended.
        let next = loop {
            match s.acquire_once(&key, &req(b, 60)).await.unwrap() {
                AcquireOutcome::Acquired { fencing, .. } => break fencing,
                AcquireOutcome::Busy { .. } => tokio::time::sleep(Duration::from_millis(100)).await,
            }
        };
        assert_eq!(next, t + 1);
        if lost > 0 {
            break;
        }
    }
    assert!(
        lost > 0,
        "no release was lost in 3 crashes: releases waited for the WAL flush"
    );
}

/// The lock operations run on connections of the storage's own (no sqlx ping per statement):
/// an idle connection is pinged before reuse after a pause, so a storage that was open across
/// a server restart (of a server the test started) does not hand its callers the connections
/// the restart broke. Every operation after the restart succeeds at its first try.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lock_operations_after_a_server_restart_do_not_fail() {
    use std::time::Duration;
    use storage_lock_core::{AcquireOutcome, AcquireRequest, OwnerId, ReleaseOutcome, Storage};

    let req = AcquireRequest {
        owner: OwnerId::random(),
        lease: Duration::from_secs(60),
        holder: None,
        reentrant: false,
    };
    let mut server = OwnServer::init();
    server.start();
    let s = server.open().await;
    // Several connections in use at once, so that several are idle at the restart.
    let keys: Vec<String> = (0..4).map(|i| format!("restart-{i}")).collect();
    let cycle = |key: &str| {
        let (s, req, key) = (&s, &req, key.to_owned());
        async move {
            let got = s.acquire_once(&key, req).await;
            assert!(
                matches!(got, Ok(AcquireOutcome::Acquired { .. })),
                "{key}: {got:?}"
            );
            let released = s.release(&key, req.owner).await;
            assert!(
                matches!(released, Ok(ReleaseOutcome::Released { remaining: 0, .. })),
                "{key}: {released:?}"
            );
        }
    };
    tokio::join!(
        cycle(&keys[0]),
        cycle(&keys[1]),
        cycle(&keys[2]),
        cycle(&keys[3])
    );
    server.crash();
    server.start();
    drop(server.open().await); // the server accepts connections again
    tokio::time::sleep(Duration::from_millis(1100)).await;
    // Fresh keys: a release just before the crash may be lost (see the test above).
    for k in &keys {
        cycle(&format!("{k}-after")).await;
    }
    assert!(s.now().await.is_ok());
}

/// Fencing tokens are bounded by the BIGINT column (2^63 − 1): a key whose token reached it
/// gets a typed error naming the key (it was a driver error, "bigint out of range", exit 69 in
/// the CLI with no word of which key or why), and other keys are unaffected.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fencing_token_at_the_column_bound_is_a_typed_error_naming_the_key() {
    use storage_lock_core::{
        AcquireOutcome, AcquireRequest, LockRecord, OwnerId, Storage, StorageError, Timestamp,
    };
    let s = postgres().await;
    let key = format!("bound-{}", storage_lock_core::OwnerId::random());
    let record = LockRecord {
        owner: OwnerId::NOBODY,
        count: 0,
        fencing: i64::MAX as u64,
        acquired_at: Timestamp::from_millis(1),
        expires_at: Timestamp::from_millis(1),
        holder: None,
    };
    storage_lock_testkit::cas(&s)
        .create(&key, &record)
        .await
        .unwrap();
    let req = AcquireRequest {
        owner: OwnerId::random(),
        lease: std::time::Duration::from_secs(5),
        holder: None,
        reentrant: false,
    };
    let err = s.acquire_once(&key, &req).await.unwrap_err();
    assert!(
        matches!(&err, StorageError::Corrupt { key: k, reason } if *k == key && reason.contains("BIGINT")),
        "{err:?}"
    );
    let other = format!("{key}-other");
    assert!(matches!(
        s.acquire_once(&other, &req).await.unwrap(),
        AcquireOutcome::Acquired { .. }
    ));
    s.release(&other, req.owner).await.unwrap();
}

/// Waiting survives a server restart (issue 26 #10): a waiter that saw connection errors while
/// the test's own PostgreSQL crashed (`pg_ctl stop -m immediate`) and came back keeps its later
/// grant for its whole lease, the held hold is lost or still held with the storage agreeing,
/// and fencing tokens after the restart are higher (`restart_keeps_fencing`, as for etcd, NATS,
/// S3 and Redis).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_restart_keeps_fencing() {
    let mut server = OwnServer::init();
    server.start();
    let storage = server.open().await;
    storage_lock_testkit::restart::restart_keeps_fencing(storage, async {
        server.crash();
        server.start();
        drop(server.open().await);
    })
    .await;
}

/// A semaphore's one-statement attempt (`acquire_any`) whose candidate key is taken after its
/// snapshot: held at a `BEFORE INSERT` trigger (on its own rows only) until another owner has
/// taken its first candidate, it must write nothing of that attempt and take the next free
/// keys instead. Without the undo, it would return one grant where two were asked (for one
/// key, it would return none although three were free).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_attempt_at_any_keys_takes_others_when_a_candidate_is_taken_meanwhile() {
    assert_eq!(attempt_whose_candidate_is_taken(2, "sl_any").await, [1, 2]);
    assert_eq!(attempt_whose_candidate_is_taken(1, "sl_one").await, [1]);
}

/// The positions an `acquire_any` of `need` of a, b, c, d takes when `a` is taken by another
/// owner while the statement waits at a gate (its snapshot: every key free); d must be left.
async fn attempt_whose_candidate_is_taken(need: usize, table: &str) -> Vec<usize> {
    use std::sync::Arc;
    use storage_lock_core::{AcquireAnyOutcome, OwnerId, Storage};

    let (s, url, table) = own_table(table).await;
    let req = noted_request;
    let (x, y) = (OwnerId::random(), OwnerId::random());
    let keys = ["a", "b", "c", "d"];
    let pool = sqlx::PgPool::connect(&url).await.unwrap();
    let (blocker, gate) = closed_gate(&pool, &table, "NEW.holder_note = 'gated'").await;
    let s = Arc::new(s);
    let gated = tokio::spawn({
        let s = s.clone();
        async move {
            s.acquire_any(&keys, need, None, &req(y, Some("gated")))
                .await
        }
    });
    // Until the statement waits at the gate (its snapshot: every key free, a chosen first).
    until_waiting_at(&pool, gate).await;
    s.acquire_once("a", &req(x, None)).await.unwrap();
    blocker.rollback().await.unwrap();
    let answer = gated.await.unwrap().unwrap();
    let d = s.get("d").await.unwrap();
    drop_gated_table(&pool, &table).await;
    let AcquireAnyOutcome::Acquired { taken, .. } = answer else {
        panic!("b, c and d are free: {answer:?}");
    };
    assert!(d.is_none(), "d was written: {d:?}");
    taken.iter().map(|(i, _)| *i).collect()
}

/// The multi-key statement writes nothing when a key is busy, and undoes what it wrote when a
/// key is taken after its snapshot: it is held by a `BEFORE INSERT` trigger (on its own rows
/// only: their note says so) until another owner has taken the last key, and must then answer
/// that key busy and leave the others free. Without the undo, it would return two grants of
/// three.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_multi_key_acquisition_is_all_or_nothing_even_when_a_key_is_taken_meanwhile() {
    use std::sync::Arc;
    use storage_lock_core::{AcquireManyOutcome, OwnerId, Storage};

    let (s, url, table) = own_table("sl_multi").await;
    let req = noted_request;
    let (x, y) = (OwnerId::random(), OwnerId::random());
    let keys = ["a", "b", "c"];
    // A busy key in the snapshot: nothing is written at all.
    s.acquire_once("b", &req(x, None)).await.unwrap();
    let busy = s.acquire_many(&keys, &req(y, None)).await.unwrap();
    assert!(
        matches!(busy, AcquireManyOutcome::Busy { index: 1, .. }),
        "{busy:?}"
    );
    for key in ["a", "c"] {
        assert!(s.get(key).await.unwrap().is_none(), "{key} was written");
    }
    s.release("b", x).await.unwrap();

    let pool = sqlx::PgPool::connect(&url).await.unwrap();
    let (blocker, gate) = closed_gate(&pool, &table, "NEW.holder_note = 'gated'").await;
    let s = Arc::new(s);
    let gated = tokio::spawn({
        let s = s.clone();
        async move { s.acquire_many(&keys, &req(y, Some("gated"))).await }
    });
    // Until the statement waits at the gate (it has its snapshot: every key free).
    until_waiting_at(&pool, gate).await;
    s.acquire_once("c", &req(x, None)).await.unwrap();
    blocker.rollback().await.unwrap();
    let answer = gated.await.unwrap().unwrap();
    let (a, b) = (s.get("a").await.unwrap(), s.get("b").await.unwrap());
    drop_gated_table(&pool, &table).await;
    assert!(
        matches!(answer, AcquireManyOutcome::Busy { index: 2, .. }),
        "{answer:?}"
    );
    assert!(a.is_none(), "a was left written: {a:?}");
    assert!(
        b.as_ref().is_none_or(|b| b.record.owner != y),
        "b was left taken: {b:?}"
    );
}
