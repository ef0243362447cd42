//! `storage-lock torture`: on every storage of `support::urls`, and through a lock server, it
//! finds nothing wrong while it kills and pauses its workers and cuts their connections; on a storage its workers do not share it reports violations,
//! so the tool is known to be able to fail. The real binary, real processes.

mod support;

use std::time::Duration;

use serde_json::Value;
use support::{Served, cli, output_within, urls};

/// The run's length plus what a loaded machine needs to start and stop the workers.
const LIMIT: Duration = Duration::from_secs(90);

fn torture(dir: &std::path::Path, url: &str, args: &[&str]) -> (Option<i32>, Value, String) {
    let mut all = vec!["torture", url, "--json"];
    all.extend(args);
    let out = output_within(&mut cli(dir, url, &all), LIMIT);
    let json = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
    (
        out.status.code(),
        json,
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Every storage at once, and a lock server over SQLite (a run per storage, in parallel: the
/// checks are exact, so a loaded machine only makes the runs do less).
#[test]
fn torture_finds_nothing_wrong_on_every_storage_under_kills_pauses_and_cuts() {
    let dir = tempfile::tempdir().unwrap();
    let served = Served::start(
        &format!("sqlite://{}", dir.path().join("served.db").display()),
        &[],
    );
    let mut urls = urls(dir.path());
    urls.push(served.url.clone());
    std::thread::scope(|scope| {
        for url in &urls {
            let dir = dir.path();
            scope.spawn(move || {
                let (code, v, stderr) = torture(
                    dir,
                    url,
                    &["--duration", "10s", "--lease", "1s", "--workers", "3"],
                );
                assert_eq!(code, Some(0), "{url}: {v} {stderr}");
                assert_eq!(v["verdict"], "ok", "{url}: {v}");
                assert_eq!(v["violations"], Value::Array(vec![]), "{url}: {v}");
                assert!(v["writes_accepted"].as_u64() > Some(0), "{url}: {v}");
                // Connections are cut wherever the storage is one server on the network.
                let cut = !url.starts_with("sqlite:") && !url.contains("cluster=true");
                let faults: &[&str] = if cut {
                    &["kill", "pause", "cut"]
                } else {
                    &["kill", "pause"]
                };
                for &fault in faults {
                    assert!(
                        v["faults"][fault].as_u64() >= Some(1),
                        "{url}: no {fault}: {v}"
                    );
                }
                eprintln!("{url}: {v}");
            });
        }
    });
}

/// The fair lock and a semaphore (each permit slot checked as a name of its own) on SQLite.
#[test]
fn torture_checks_fair_locks_and_semaphores() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("kinds.db").display());
    std::thread::scope(|scope| {
        for kind in ["fair", "semaphore:2"] {
            let (dir, url) = (dir.path(), &url);
            scope.spawn(move || {
                let (code, v, stderr) = torture(
                    dir,
                    url,
                    &[
                        "--kind",
                        kind,
                        "--duration",
                        "6s",
                        "--lease",
                        "1s",
                        "--workers",
                        "3",
                    ],
                );
                assert_eq!(code, Some(0), "{kind}: {v} {stderr}");
                assert_eq!(v["kind"], kind, "{v}");
                assert!(v["writes_accepted"].as_u64() > Some(0), "{kind}: {v}");
            });
        }
    });
}

/// `memory:` is one storage per process: the workers never exclude each other, and the
/// register sees repeated tokens and lost updates.
#[test]
fn torture_reports_violations_on_a_storage_its_workers_do_not_share() {
    let dir = tempfile::tempdir().unwrap();
    let (code, v, stderr) = torture(
        dir.path(),
        "memory:",
        &["--duration", "4s", "--lease", "500ms", "--faults", "none"],
    );
    assert_eq!(code, Some(1), "{v} {stderr}");
    assert_eq!(v["verdict"], "violated", "{v}");
    assert!(
        v["violations"].as_array().is_some_and(|a| !a.is_empty()),
        "{v}"
    );
}

#[test]
fn torture_refuses_bad_input_in_one_line() {
    let dir = tempfile::tempdir().unwrap();
    for args in [
        &["--workers", "0"][..],
        &["--names", "17"],
        &["--lease", "10ms"],
        &["--faults", "skew"],
        &["--faults", "cut"], // memory: has no connection to cut
        &["--kind", "semaphore:0"],
    ] {
        let mut all = vec!["torture", "memory:"];
        all.extend(args);
        let out = output_within(&mut cli(dir.path(), "memory:", &all), LIMIT);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(stderr.lines().count(), 1, "{args:?}: {stderr}");
    }
}
