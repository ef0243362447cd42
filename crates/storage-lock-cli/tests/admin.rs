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
        assert!(out.status.success(), "{url}: {out:?}");
        // An R1 NATS bucket is durable only with the server's `sync_interval: always`, which
        // clients cannot see (the test server has it).
        let expected = if url.starts_with("nats:") {
            "durability: unverified"
        } else {
            "durability: durable"
        };
        assert!(stdout.contains(expected), "{url}: {stdout}");
        assert!(stdout.contains("verdict: ok"), "{url}: {stdout}");
    }
    let out = output_within(&mut cli(dir.path(), "memory:", &["check"]), LIMIT);
    assert_eq!(out.status.code(), Some(78), "{out:?}");
    let sqlite = format!("sqlite://{}/v.db?durability=volatile", dir.path().display());
    let out = output_within(&mut cli(dir.path(), &sqlite, &["check"]), LIMIT);
    assert_eq!(out.status.code(), Some(78), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stdout).contains("VOLATILE"));
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
