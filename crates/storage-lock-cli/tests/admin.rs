//! `break` (operators free a stuck lock) and `check` (what a storage promises), end to end on
//! the real binary, on every backend.

mod support;

use std::process::Stdio;
use std::time::Duration;

use support::{cli, inspect, is_held, output_within, unique, urls};

const LIMIT: Duration = Duration::from_secs(20);

#[test]
fn break_frees_a_stuck_lock_and_the_next_token_is_higher() {
    let dir = tempfile::tempdir().unwrap();
    for url in urls(dir.path()) {
        let name = unique("break");
        let out = output_within(
            &mut cli(
                dir.path(),
                &url,
                &["acquire", &name, "--lease", "10m", "--note", "stuck"],
            ),
            LIMIT,
        );
        assert!(out.status.success(), "{url}: {out:?}");
        let token = inspect(dir.path(), &url, &name)["fencing_token"]
            .as_u64()
            .unwrap();
        // Not on a terminal and no --yes: refused, nothing changes.
        let out = output_within(
            cli(dir.path(), &url, &["break", &name]).stdin(Stdio::null()),
            LIMIT,
        );
        assert_eq!(out.status.code(), Some(2), "{url}: {out:?}");
        assert!(is_held(dir.path(), &url, &name), "{url}");
        let out = output_within(
            cli(dir.path(), &url, &["break", &name, "--yes"]).stdin(Stdio::null()),
            LIMIT,
        );
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{url}: {out:?}");
        assert!(
            stdout.contains("broke") && stdout.contains("stuck"),
            "{url}: {stdout}"
        );
        assert!(!is_held(dir.path(), &url, &name), "{url}");
        let out = output_within(
            &mut cli(dir.path(), &url, &["acquire", &name, "--no-wait", "--json"]),
            LIMIT,
        );
        assert!(out.status.success(), "{url}: {out:?}");
        let next = inspect(dir.path(), &url, &name)["fencing_token"]
            .as_u64()
            .unwrap();
        assert!(next > token, "{url}: {next} after {token}");
        let out = output_within(
            &mut cli(
                dir.path(),
                &url,
                &["break", &format!("{name}-free"), "--yes"],
            ),
            LIMIT,
        );
        assert!(out.status.success(), "{url}: {out:?}");
        assert!(String::from_utf8_lossy(&out.stdout).contains("was not held"));

        // `release --force NAME` is the same operation (NAME is held again since the
        // acquisition after the break).
        assert!(is_held(dir.path(), &url, &name), "{url}");
        let out = output_within(
            &mut cli(dir.path(), &url, &["release", "--force", &name, "--yes"]),
            LIMIT,
        );
        assert!(out.status.success(), "{url}: {out:?}");
        assert!(!is_held(dir.path(), &url, &name), "{url}");
    }
}

#[test]
fn check_reports_durable_backends_ok_and_refuses_volatile_ones() {
    let dir = tempfile::tempdir().unwrap();
    for url in urls(dir.path()) {
        let out = output_within(&mut cli(dir.path(), &url, &["check"]), LIMIT);
        let stdout = String::from_utf8_lossy(&out.stdout);
        if url.contains("durability=volatile") {
            // Azurite (it forgets up to 5 s of writes on a kill) and memcached (a restart
            // forgets everything): only a URL that accepts that with durability=volatile opens
            // them, and check still calls them unsafe.
            assert_eq!(out.status.code(), Some(78), "{url}: {out:?}");
            assert!(stdout.contains("VOLATILE"), "{url}: {stdout}");
            assert!(stdout.contains("verdict: unsafe"), "{url}: {stdout}");
            let refused = url
                .replace("durability=volatile&", "")
                .replace("&durability=volatile", "")
                .replace("?durability=volatile", "");
            let out = output_within(&mut cli(dir.path(), &refused, &["check"]), LIMIT);
            assert_eq!(out.status.code(), Some(78), "{refused}: {out:?}");
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert!(
                stderr.contains("durability=volatile"),
                "{refused}: {stderr}"
            );
            assert_eq!(stderr.trim_end().lines().count(), 1, "{refused}: {stderr}");
            continue;
        }
        assert!(out.status.success(), "{url}: {out:?}");
        assert!(stdout.starts_with("storage: "), "{url}: {stdout}");
        // An R1 NATS bucket is durable only with the server's `sync_interval: always`, which
        // clients cannot see (the test server has it, and the test URL says so).
        let (durability, verdict) = if url.starts_with("nats:") {
            (
                "durability: unverified (a bucket with fewer than 3 replicas",
                "verdict: ok (durability unverified, accepted by durability=unverified",
            )
        } else {
            ("durability: durable", "verdict: ok")
        };
        assert!(stdout.contains(durability), "{url}: {stdout}");
        assert!(stdout.contains(verdict), "{url}: {stdout}");
        assert!(
            !stdout.contains("see the backend's documentation"),
            "{url}: {stdout}"
        );
    }
    // memory: process-local, so volatile whatever its in-process promise.
    let out = output_within(&mut cli(dir.path(), "memory:", &["check"]), LIMIT);
    assert_eq!(out.status.code(), Some(78), "{out:?}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("durability: volatile (process-local"),
        "{stdout}"
    );
    assert!(stdout.contains("verdict: unsafe"), "{stdout}");
    let sqlite = format!("sqlite://{}/v.db?durability=volatile", dir.path().display());
    let out = output_within(&mut cli(dir.path(), &sqlite, &["check"]), LIMIT);
    assert_eq!(out.status.code(), Some(78), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stdout).contains("VOLATILE"));
}

/// `check --json` is one object with the resolved storage, the capabilities and the verdict.
#[test]
fn check_json_names_the_storage_and_the_verdict() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}/j.db", dir.path().display());
    let out = output_within(&mut cli(dir.path(), &url, &["check", "--json"]), LIMIT);
    assert!(out.status.success(), "{out:?}");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["storage"], url.as_str());
    assert_eq!(v["backend"], "sqlite");
    assert_eq!(v["durability"], "durable");
    assert_eq!(v["clock"], "storage");
    assert_eq!(v["verdict"], "ok");
    assert_eq!(v["problems"], serde_json::json!([]));
    // Round trips as the storage itself declares them (no table of backend names).
    assert_eq!(v["round_trips"], "1 / 1 / 1 (one statement each)");
    let out = output_within(&mut cli(dir.path(), "memory:", &["check", "--json"]), LIMIT);
    assert_eq!(out.status.code(), Some(78), "{out:?}");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["verdict"], "unsafe");
    assert_eq!(v["durability"], "volatile");
    assert!(v["problems"].as_array().unwrap().len() >= 2, "{v}");
}

/// A storage whose durability cannot be verified (an R1 NATS bucket: the server's
/// `sync_interval` is invisible to clients) is never used silently: `check` says `unverified`
/// with the reason and exits 78, and every command warns on stderr without `-v`, until the URL
/// says `durability=unverified` (before, `check` said "verdict: ok" and `run` printed nothing).
#[test]
fn unverified_durability_fails_check_and_warns_until_the_url_accepts_it() {
    let dir = tempfile::tempdir().unwrap();
    let nats = std::env::var("STORAGE_LOCK_NATS_URL")
        .expect("STORAGE_LOCK_NATS_URL must name a NATS server (run scripts/test.sh)");
    let url = format!("{nats}?bucket=storage-lock-cli");
    let out = output_within(&mut cli(dir.path(), &url, &["check"]), LIMIT);
    assert_eq!(out.status.code(), Some(78), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stdout).contains("verdict: unverified"));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("sync_interval") && stderr.contains("durability=unverified"),
        "{stderr}"
    );
    let out = output_within(&mut cli(dir.path(), &url, &["check", "--json"]), LIMIT);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["verdict"], "unverified", "{v}");
    assert!(
        v["durability_note"].as_str().unwrap().contains("replicas"),
        "{v}"
    );
    assert_eq!(v["clock"], "observed", "{v}");

    let name = unique("unverified");
    let out = output_within(
        &mut cli(dir.path(), &url, &["run", &name, "--", "true"]),
        LIMIT,
    );
    assert!(out.status.success(), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("warning: durability unverified"),
        "run must warn without -v: {stderr}"
    );

    let accepted = format!("{url}&durability=unverified");
    let out = output_within(
        &mut cli(dir.path(), &accepted, &["run", &name, "--", "true"]),
        LIMIT,
    );
    assert!(out.status.success(), "{out:?}");
    assert_eq!(String::from_utf8_lossy(&out.stderr), "", "{out:?}");
    let out = output_within(&mut cli(dir.path(), &accepted, &["check"]), LIMIT);
    assert!(out.status.success(), "{out:?}");
}

/// `inspect` names the storage it read, a relative SQLite path resolved to an absolute one (it
/// depends on the working directory), and never a password.
#[test]
fn inspect_shows_the_resolved_storage() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("rel")).unwrap();
    let out = output_within(
        cli(
            dir.path(),
            "sqlite://rel/locks.db",
            &["inspect", "x", "--json"],
        )
        .current_dir(dir.path()),
        LIMIT,
    );
    assert!(out.status.success(), "{out:?}");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let shown = v["storage"].as_str().unwrap();
    let expected = format!("sqlite://{}", dir.path().join("rel/locks.db").display());
    assert_eq!(shown, expected);
}

/// A lock broken while `run` holds it never ends in exit 0: where the storage has change
/// notifications, `run` learns of it at once and stops the command; elsewhere (or when the
/// command finishes first) its release finds the hold gone. Either way exit 76 (without the
/// check at release, `run` exited 0 on MySQL and S3 while a second holder had the lock).
#[test]
fn a_broken_lock_makes_run_exit_76() {
    let dir = tempfile::tempdir().unwrap();
    for (i, url) in urls(dir.path()).into_iter().enumerate() {
        let scratch = support::Scratch::new(dir.path(), i);
        let (ready, go) = (scratch.path().join("ready"), scratch.path().join("go"));
        let name = unique("broken-run");
        let mut run = cli(
            dir.path(),
            &url,
            &[
                "run",
                &name,
                "--lease",
                "60s",
                "--",
                "sh",
                "-c",
                "touch \"$R\"; i=0; while [ ! -e \"$G\" ] && [ $i -lt 600 ]; do sleep 0.05; \
                 i=$((i+1)); done",
            ],
        )
        .env("R", &ready)
        .env("G", &go)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn storage-lock run");
        support::wait_until(LIMIT, "the command to start", || ready.exists());
        let out = output_within(
            cli(dir.path(), &url, &["break", &name, "--yes"]).stdin(Stdio::null()),
            LIMIT,
        );
        assert!(out.status.success(), "{url}: {out:?}");
        std::fs::write(&go, "").unwrap();
        let status = support::wait_within(&mut run, LIMIT);
        let mut stderr = String::new();
        std::io::Read::read_to_string(&mut run.stderr.take().unwrap(), &mut stderr).unwrap();
        assert_eq!(status.code(), Some(76), "{url}: {stderr}");
        assert!(stderr.contains("lock"), "{url}: {stderr}");
    }
}

/// `inspect` shows what the lock kinds keep beside a name: a semaphore's permits held, a
/// reader-writer lock's readers, a fair lock's queue in ticket order; on every storage, and
/// through a lock server. The kinds are taken with the library in this process.
#[test]
fn inspect_shows_the_parts_of_semaphores_rw_locks_and_fair_locks() {
    use storage_lock::kinds::{FairLock, RwLock, Semaphore};
    use storage_lock::{AcquireOptions, Wait};
    let dir = tempfile::tempdir().unwrap();
    let served = support::Served::start(
        &format!("sqlite://{}", dir.path().join("served.db").display()),
        &[],
    );
    let mut all = urls(dir.path());
    all.push(served.url.clone());
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    for url in all {
        let (s, r, f) = (unique("sem"), unique("rw"), unique("fair"));
        let now = AcquireOptions::default()
            .lease(Duration::from_secs(60))
            .wait(Wait::Never);
        let held = rt.block_on(async {
            let locks = storage_lock::connect(&url).await.expect("connect");
            let sem = Semaphore::new(&locks, &s, 3).unwrap();
            let p1 = sem.acquire(&now).await.unwrap().expect("a permit");
            let p2 = sem.acquire(&now).await.unwrap().expect("another");
            let reader = RwLock::new(&locks, &r)
                .unwrap()
                .read(&now)
                .await
                .unwrap()
                .expect("a read");
            let fair = FairLock::new(&locks, &f).unwrap();
            let first = fair.acquire(&now).await.unwrap().expect("free");
            // A waiter queues behind the holder.
            let waiting = tokio::spawn({
                let fair = fair.clone();
                let wait = now.clone().wait(Wait::For(Duration::from_secs(60)));
                async move { fair.acquire(&wait).await }
            });
            (locks, p1, p2, reader, first, waiting)
        });
        let sem = inspect(dir.path(), &url, &s);
        assert_eq!(
            sem["state"], "absent",
            "{url}: a semaphore holds no lock of its name: {sem}"
        );
        assert_eq!(sem["semaphore"]["permits"], 3, "{url}: {sem}");
        let slots = sem["semaphore"]["held"].as_array().expect("held permits");
        assert_eq!(slots.len(), 2, "{url}: {sem}");
        assert!(
            slots
                .iter()
                .all(|p| p["slot"].as_u64() < Some(3) && p["held"] == true),
            "{url}: {sem}"
        );
        let text = output_within(&mut cli(dir.path(), &url, &["inspect", &s]), LIMIT);
        let text = String::from_utf8_lossy(&text.stdout);
        assert!(text.contains("3 permits, 2 held"), "{url}: {text}");
        let rw = inspect(dir.path(), &url, &r);
        assert_eq!(rw["readers"]["max"], 16, "{url}: {rw}");
        assert_eq!(
            rw["readers"]["held"].as_array().map(Vec::len),
            Some(1),
            "{url}: {rw}"
        );
        // The waiter's place shows once it has taken it.
        let deadline = std::time::Instant::now() + LIMIT;
        let fair = loop {
            let fair = inspect(dir.path(), &url, &f);
            if fair["queue"].as_array().is_some_and(|q| q.len() == 1) {
                break fair;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "{url}: the waiter never showed in the queue: {fair}"
            );
            std::thread::sleep(Duration::from_millis(50));
        };
        assert_eq!(fair["held"], true, "{url}: {fair}");
        assert!(
            fair["queue"][0]["ticket"].as_u64().is_some(),
            "{url}: {fair}"
        );
        rt.block_on(async {
            let (_locks, p1, p2, reader, first, waiting) = held;
            let _ = p1.release().await;
            let _ = p2.release().await;
            let _ = reader.release().await;
            let _ = first.release().await;
            // Served once the first hold is gone.
            let served = waiting.await.unwrap().unwrap().expect("the waiter's turn");
            let _ = served.release().await;
        });
    }
}
