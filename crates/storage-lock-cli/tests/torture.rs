//! `storage-lock torture`: on every storage of `support::urls`, and through a lock server, it
//! finds nothing wrong while it kills, pauses and clock-skews its workers and cuts their
//! connections; on a storage its workers do not share, and on storages broken on purpose
//! (`--mutate`), it reports violations, so the tool is known to be able to fail; `--report`
//! writes the history and the timeline page (scripts/ui_test.py opens it in Chromium). The real
//! binary, real processes.

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

/// Every storage at once, and a lock server over SQLite, 20 s each with every fault the storage
/// allows (a run per storage, in parallel: the checks are exact, so a loaded machine only makes
/// the runs do less).
#[test]
fn torture_finds_nothing_wrong_on_every_storage_under_kills_pauses_skews_and_cuts() {
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
                    &["--duration", "20s", "--lease", "1s", "--workers", "3"],
                );
                assert_eq!(code, Some(0), "{url}: {v} {stderr}");
                assert_eq!(v["verdict"], "ok", "{url}: {v}");
                assert_eq!(v["violations"], Value::Array(vec![]), "{url}: {v}");
                assert!(v["writes_accepted"].as_u64() > Some(0), "{url}: {v}");
                // Connections are cut wherever the storage is one server on the network.
                let cut = !url.starts_with("sqlite:") && !url.contains("cluster=true");
                // A skewed clock wherever libfaketime is (scripts/services.sh installs it).
                let faults: &[&str] = if cut {
                    &["kill", "pause", "cut", "skew"]
                } else {
                    &["kill", "pause", "skew"]
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

/// The fair lock, a semaphore (each permit slot checked as a name of its own) and the
/// reader-writer lock (readers checked against writers) on SQLite.
#[test]
fn torture_checks_fair_locks_semaphores_and_reader_writer_locks() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("kinds.db").display());
    std::thread::scope(|scope| {
        for kind in ["fair", "semaphore:2", "rw"] {
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
/// register sees repeated tokens and handles that did not know they were lost.
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
    // Readers and writers that do not exclude each other: the end-of-run check sees them.
    let (code, v, stderr) = torture(
        dir.path(),
        "memory:",
        &[
            "--kind",
            "rw",
            "--duration",
            "4s",
            "--lease",
            "500ms",
            "--names",
            "1",
            "--faults",
            "none",
        ],
    );
    assert_eq!(code, Some(1), "{v} {stderr}");
    assert!(
        v["violations"]
            .as_array()
            .is_some_and(|a| a.iter().any(|x| x
                .as_str()
                .is_some_and(|x| x.starts_with("reader and writer overlapped")))),
        "{v}"
    );
}

/// Storages broken on purpose: one that forgets acknowledged writes and one that does
/// compare-and-set as check-then-write. Both over real SQLite; the tool must say so.
#[test]
fn torture_reports_violations_on_storages_broken_on_purpose() {
    let dir = tempfile::tempdir().unwrap();
    std::thread::scope(|scope| {
        for mutation in ["forget", "non-atomic"] {
            let dir = dir.path();
            scope.spawn(move || {
                let url = format!("sqlite://{}", dir.join(format!("{mutation}.db")).display());
                let (code, v, stderr) = torture(
                    dir,
                    &url,
                    &[
                        "--mutate",
                        mutation,
                        "--duration",
                        "6s",
                        "--lease",
                        "1s",
                        "--workers",
                        "4",
                        "--names",
                        "1",
                        "--faults",
                        "none",
                    ],
                );
                assert_eq!(code, Some(1), "{mutation}: {v} {stderr}");
                assert_eq!(v["verdict"], "violated", "{mutation}: {v}");
                assert_eq!(v["mutated"], mutation, "{v}");
                assert!(
                    v["violations"].as_array().is_some_and(|a| !a.is_empty()),
                    "{mutation}: {v}"
                );
            });
        }
    });
}

/// `--report DIR`: the history as JSON lines (every kind of event, times in order of the
/// register), the verdict, and a self-contained page with a lane per worker.
#[test]
fn torture_writes_its_history_and_a_timeline_page() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("report.db").display());
    let report = dir.path().join("report");
    let (code, v, stderr) = torture(
        dir.path(),
        &url,
        &[
            "--duration",
            "8s",
            "--lease",
            "1s",
            "--workers",
            "3",
            "--faults",
            "kill,pause,skew",
            "--report",
            report.to_str().unwrap(),
        ],
    );
    assert_eq!(code, Some(0), "{v} {stderr}");
    let history = std::fs::read_to_string(report.join("history.jsonl")).unwrap();
    let events: Vec<Value> = history
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    for kind in ["worker", "exit", "read", "write", "fault"] {
        assert!(
            events.iter().any(|e| e["event"] == kind),
            "no {kind} event in the history"
        );
    }
    let writes = events.iter().filter(|e| e["event"] == "write").count();
    assert_eq!(
        Some(writes as u64),
        v["writes_accepted"]
            .as_u64()
            .zip(v["stale_writes_fenced_off"].as_u64())
            .map(|(a, b)| a + b),
        "every write is in the history: {v}"
    );
    let reads: Vec<f64> = events
        .iter()
        .filter(|e| e["event"] == "read")
        .filter_map(|e| e["ms"].as_f64())
        .collect();
    assert!(reads.windows(2).all(|w| w[0] <= w[1]), "reads out of order");
    let verdict: Value =
        serde_json::from_str(&std::fs::read_to_string(report.join("verdict.json")).unwrap())
            .unwrap();
    assert_eq!(verdict, v, "verdict.json is the verdict printed");
    let html = std::fs::read_to_string(report.join("report.html")).unwrap();
    assert!(html.contains(r#"<svg xmlns="http://www.w3.org/2000/svg" id="timeline""#));
    assert!(html.contains(r#"class="hold""#), "no hold bar");
    assert!(html.contains("(clock "), "no skewed lane");
    assert!(!html.contains("<script"), "the page needs no script");
    let lanes = html.matches(r#"class="lane""#).count();
    let workers = events.iter().filter(|e| e["event"] == "worker").count();
    assert_eq!(lanes, workers, "one lane per worker process");
}

#[test]
fn torture_refuses_bad_input_in_one_line() {
    let dir = tempfile::tempdir().unwrap();
    for args in [
        &["--workers", "0"][..],
        &["--names", "17"],
        &["--lease", "10ms"],
        &["--faults", "flood"],
        &["--mutate", "slowly"],
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

/// Every worker process is gone when torture ends, a skewed one too, and nothing of theirs is
/// left in /dev/shm. (A skewed worker ran under libfaketime's `faketime`, which forks: the
/// SIGKILLs of a kill fault and of the run's end reached `faketime` alone, and its worker lived
/// on as an orphan, still writing to the storage, found by a CI run slowed down by them. Later,
/// each killed `faketime` left a semaphore and a segment named after its PID in /dev/shm, and
/// a CI run saw a later `faketime` with that PID fail: skew now preloads libfaketime itself.)
#[test]
fn torture_leaves_no_worker_process_behind() {
    // libfaketime's files of processes that are gone (other tests' live workers have theirs).
    let faketime_files = || -> std::collections::BTreeSet<String> {
        std::fs::read_dir("/dev/shm")
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|name| name.contains("faketime"))
            .filter(|name| {
                let pid = name.rsplit('_').next().unwrap_or_default();
                !std::path::Path::new("/proc").join(pid).exists()
            })
            .collect()
    };
    let before = faketime_files();
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("orphans.db").display());
    let (code, v, stderr) = torture(
        dir.path(),
        &url,
        &[
            "--duration",
            "6s",
            "--lease",
            "1s",
            "--workers",
            "2",
            "--faults",
            "skew,pause",
        ],
    );
    assert_eq!(code, Some(0), "{v} {stderr}");
    assert!(v["faults"]["skew"].as_u64() >= Some(1), "{v}");
    let left: Vec<String> = std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| std::fs::read(e.ok()?.path().join("cmdline")).ok())
        .map(|c| String::from_utf8_lossy(&c).replace('\0', " "))
        .filter(|c| c.contains("__torture-worker") && c.contains(&url))
        .collect();
    assert!(left.is_empty(), "workers left running: {left:?}");
    let new: Vec<_> = faketime_files().difference(&before).cloned().collect();
    assert!(new.is_empty(), "left in /dev/shm: {new:?}");
}
