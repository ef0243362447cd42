//! `storage-lock run` end to end: the real binary, real processes, a real SQLite file (and any
//! storage in `STORAGE_LOCK_TEST_URLS`).

mod support;

use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use support::{cli, file, inspect, is_held, kill, read, unique, urls, wait_until, wait_within};

/// A child script that records its start/end times (ns since the epoch) and its fencing token
/// into `$OUT.*`, holding the lock for `hold` seconds.
fn recording_script(hold: &str) -> String {
    format!(
        "date +%s%N > \"$OUT.start\"; echo \"$STORAGE_LOCK_FENCING_TOKEN\" > \"$OUT.token\"; \
         sleep {hold}; date +%s%N > \"$OUT.end\""
    )
}

#[test]
fn two_runs_on_one_name_take_turns() {
    let dir = tempfile::tempdir().unwrap();
    for (i, url) in urls(dir.path()).into_iter().enumerate() {
        let dir = &support::Scratch::new(dir.path(), i);
        let name = unique("turns");
        let script = recording_script("0.7");
        let start = |who: &str| {
            cli(
                dir.path(),
                &url,
                &["run", &name, "--wait", "15s", "--", "sh", "-c", &script],
            )
            .env("OUT", file(dir.path(), who))
            .spawn()
            .unwrap()
        };
        let mut a = start("a");
        let mut b = start("b");
        assert!(
            wait_within(&mut a, Duration::from_secs(20)).success(),
            "{url}"
        );
        assert!(
            wait_within(&mut b, Duration::from_secs(20)).success(),
            "{url}"
        );

        let span = |who: &str| {
            let n = |part: &str| -> u128 {
                read(&file(dir.path(), &format!("{who}.{part}")))
                    .parse()
                    .unwrap_or_else(|_| panic!("{url}: {who}.{part} missing"))
            };
            (n("start"), n("end"), n("token"))
        };
        let (first, second) = {
            let (a, b) = (span("a"), span("b"));
            if a.0 <= b.0 { (a, b) } else { (b, a) }
        };
        assert!(
            first.1 <= second.0,
            "{url}: the runs overlapped: {first:?} {second:?}"
        );
        assert!(
            second.2 > first.2,
            "{url}: the second token must be higher: {first:?} {second:?}"
        );
        eprintln!(
            "{url}: hand-off from the first child's end to the second child's start: {:.1} ms",
            (second.0 - first.1) as f64 / 1e6
        );
    }
}

#[test]
fn no_wait_on_a_held_lock_exits_with_the_conflict_code_at_once() {
    let dir = tempfile::tempdir().unwrap();
    for (i, url) in urls(dir.path()).into_iter().enumerate() {
        let dir = &support::Scratch::new(dir.path(), i);
        let name = unique("no-wait");
        let mut holder = cli(dir.path(), &url, &["run", &name, "--", "sleep", "30"])
            .spawn()
            .unwrap();
        wait_until(Duration::from_secs(10), "the holder", || {
            is_held(dir.path(), &url, &name)
        });

        // Like `flock -n`: silent by default, a notice with -v; -E / --conflict-exit-code.
        for (extra, code, verbose) in [
            (vec!["--no-wait"], 75, false),
            (vec!["-n", "-v"], 75, true),
            (vec!["-n", "--conflict-exit-code", "9"], 9, false),
            (vec!["-n", "-E", "9", "-v"], 9, true),
            (vec!["-w", "0.3"], 75, true),
        ] {
            let mut args = vec!["run", &name];
            args.extend(extra.iter().copied());
            args.extend(["--", "true"]);
            let started = Instant::now();
            let out =
                support::output_within(&mut cli(dir.path(), &url, &args), Duration::from_secs(10));
            // No waiting (a wait would last the holder's whole lease): the bound is the
            // process start and the storage's opening on a loaded machine.
            assert!(
                started.elapsed() < Duration::from_secs(8),
                "{url}: took {:?}",
                started.elapsed()
            );
            assert_eq!(out.status.code(), Some(code), "{url}: {args:?} {out:?}");
            let stderr = String::from_utf8_lossy(&out.stderr);
            if verbose {
                assert!(stderr.contains("not acquired"), "{url}: {args:?} {stderr}");
            } else {
                assert_eq!(stderr, "", "{url}: {args:?} must be silent");
            }
        }

        kill(holder.id(), Signal::SIGTERM);
        wait_within(&mut holder, Duration::from_secs(10));
    }
}

#[test]
fn a_paused_holder_loses_the_lock_and_stops_its_command() {
    let dir = tempfile::tempdir().unwrap();
    for (i, url) in urls(dir.path()).into_iter().enumerate() {
        let dir = &support::Scratch::new(dir.path(), i);
        let name = unique("paused");
        let tok1 = file(dir.path(), "tok1");
        let tok2 = file(dir.path(), "tok2");
        let mut holder = cli(
            dir.path(),
            &url,
            &[
                "run",
                &name,
                "--lease",
                "1s",
                "--renew",
                "300ms",
                "--kill-grace",
                "200ms",
                "--",
                "sh",
                "-c",
                "echo $STORAGE_LOCK_FENCING_TOKEN > \"$TOK\"; exec sleep 30",
            ],
        )
        .env("TOK", &tok1)
        .spawn()
        .unwrap();
        wait_until(Duration::from_secs(10), "the holder's child", || {
            !read(&tok1).is_empty()
        });

        kill(holder.id(), Signal::SIGSTOP);
        let out = support::output_within(
            cli(
                dir.path(),
                &url,
                &[
                    "run",
                    &name,
                    "--wait",
                    "10s",
                    "--",
                    "sh",
                    "-c",
                    "echo $STORAGE_LOCK_FENCING_TOKEN > \"$TOK\"",
                ],
            )
            .env("TOK", &tok2),
            Duration::from_secs(15),
        );
        // Keep the holder stopped until the waiter is done, so the lease surely ran out.
        kill(holder.id(), Signal::SIGCONT);
        assert!(out.status.success(), "{url}: waiter failed: {out:?}");
        let (t1, t2): (u64, u64) = (read(&tok1).parse().unwrap(), read(&tok2).parse().unwrap());
        assert!(t2 > t1, "{url}: tokens {t1} then {t2}");

        let resumed = Instant::now();
        let status = wait_within(&mut holder, Duration::from_secs(10));
        assert_eq!(status.code(), Some(76), "{url}: holder {status:?}");
        assert!(
            resumed.elapsed() < Duration::from_secs(5),
            "{url}: the holder took {:?} to stop after resuming",
            resumed.elapsed()
        );
    }
}

#[test]
fn sigterm_reaches_the_command_and_the_lock_is_released() {
    let dir = tempfile::tempdir().unwrap();
    for (i, url) in urls(dir.path()).into_iter().enumerate() {
        let dir = &support::Scratch::new(dir.path(), i);
        let name = unique("sigterm");
        let ready = file(dir.path(), "ready");
        let marker = file(dir.path(), "marker");
        let _ = std::fs::remove_file(&ready);
        let _ = std::fs::remove_file(&marker);
        let mut holder = cli(
            dir.path(),
            &url,
            &[
                "run",
                &name,
                "--",
                "sh",
                "-c",
                "trap 'echo got-term > \"$MARKER\"; exit 7' TERM; touch \"$READY\"; \
                 while :; do sleep 0.1; done",
            ],
        )
        .env("READY", &ready)
        .env("MARKER", &marker)
        .spawn()
        .unwrap();
        wait_until(Duration::from_secs(10), "the child to be ready", || {
            ready.exists()
        });
        assert!(is_held(dir.path(), &url, &name), "{url}");

        kill(holder.id(), Signal::SIGTERM);
        let status = wait_within(&mut holder, Duration::from_secs(10));
        assert_eq!(status.code(), Some(7), "{url}: the child's own exit code");
        assert_eq!(read(&marker), "got-term", "{url}");
        let record = inspect(dir.path(), &url, &name);
        assert_eq!(record["state"], "released", "{url}: {record}");
    }
}

/// `run -s` and `run -x` on one name behave as `flock -s` and `flock -x` on one file: shared
/// runs run together, an exclusive one never beside them, and a waiting exclusive run keeps new
/// shared runs out (writer-preferring); on every storage, and through a lock server. Every step
/// waits on a file a command wrote or on the storage's state, never on time.
#[test]
fn shared_runs_run_together_and_never_beside_an_exclusive_one() {
    const LIMIT: Duration = Duration::from_secs(60);
    let dir = tempfile::tempdir().unwrap();
    let served = support::Served::start(
        &format!("sqlite://{}", dir.path().join("served.db").display()),
        &[],
    );
    let mut all = urls(dir.path());
    all.push(served.url.clone());
    for (i, url) in all.into_iter().enumerate() {
        let dir = &support::Scratch::new(dir.path(), i);
        let d = dir.path();
        let name = unique("rw");
        // A failed assertion must not leave the runs below waiting for `$GO` for ever (they
        // would hold the test harness's output pipe open): on the way out, every go file exists.
        let _go = support::OnDrop(|| {
            for go in ["go-readers", "go-writer"] {
                let _ = std::fs::write(file(d, go), "");
            }
        });
        // Records start, token, waits for `$GO`, records end.
        let script = "date +%s%N > \"$OUT.start\"; echo \"$STORAGE_LOCK_FENCING_TOKEN\" > \
                      \"$OUT.token\"; while [ ! -e \"$GO\" ]; do sleep 0.02; done; \
                      date +%s%N > \"$OUT.end\"";
        let start = |who: &str, mode: &str, go: &str| {
            cli(
                d,
                &url,
                &["run", &name, mode, "-w", "60", "--", "sh", "-c", script],
            )
            .env("OUT", file(d, who))
            .env("GO", file(d, go))
            .spawn()
            .unwrap()
        };
        let started = |who: &str| file(d, &format!("{who}.start")).exists();
        let try_now = |mode: &[&str]| {
            let mut args = vec!["run", name.as_str(), "-n"];
            args.extend(mode);
            args.extend(["--", "true"]);
            support::output_within(&mut cli(d, &url, &args), LIMIT)
                .status
                .code()
        };

        // Two shared runs at once: each waits for the other's release would never end.
        let mut a = start("a", "-s", "go-readers");
        let mut b = start("b", "-s", "go-readers");
        wait_until(LIMIT, "both shared runs running together", || {
            started("a") && started("b")
        });
        // An exclusive run that gives up says why: shared runs hold it (no holder to name).
        let gave_up = support::output_within(
            &mut cli(d, &url, &["run", &name, "-x", "-w", "0.2", "--", "true"]),
            LIMIT,
        );
        assert_eq!(
            gave_up.status.code(),
            Some(75),
            "{url}: an exclusive run beside readers"
        );
        let said = String::from_utf8_lossy(&gave_up.stderr);
        assert!(
            said.contains("held by shared (-s) runs"),
            "{url}: the notice of an exclusive run kept out by shared runs: {said}"
        );
        // An exclusive run waits for them, holding the gate: new shared runs are kept out.
        let mut x = start("x", "-x", "go-writer");
        wait_until(LIMIT, "the exclusive run waiting at the gate", || {
            is_held(d, &url, &name)
        });
        assert_eq!(
            try_now(&["-s"]),
            Some(75),
            "{url}: a waiting writer lets a reader in"
        );
        assert!(
            !started("x"),
            "{url}: the exclusive run started beside readers"
        );
        std::fs::write(file(d, "go-readers"), "").unwrap();
        for (who, child) in [("a", &mut a), ("b", &mut b)] {
            assert!(wait_within(child, LIMIT).success(), "{url}: {who}");
        }
        wait_until(LIMIT, "the exclusive run", || started("x"));
        // While it runs, neither a shared nor another exclusive run gets in.
        assert_eq!(
            try_now(&["-s"]),
            Some(75),
            "{url}: a reader beside the writer"
        );
        assert_eq!(try_now(&["-x"]), Some(75), "{url}: two writers");
        assert_eq!(try_now(&[]), Some(75), "{url}: the default is exclusive");
        std::fs::write(file(d, "go-writer"), "").unwrap();
        assert!(wait_within(&mut x, LIMIT).success(), "{url}: x");
        let mut c = start("c", "-s", "go-writer");
        assert!(wait_within(&mut c, LIMIT).success(), "{url}: c");

        let n = |who: &str, part: &str| -> u128 {
            read(&file(d, &format!("{who}.{part}")))
                .parse()
                .unwrap_or_else(|_| panic!("{url}: {who}.{part} missing"))
        };
        let readers_end = n("a", "end").max(n("b", "end"));
        assert!(
            n("x", "start") >= readers_end,
            "{url}: the exclusive run started before the shared runs ended"
        );
        assert!(n("c", "start") >= n("x", "end"), "{url}: c overlapped x");
        // Fencing: the writer's token beats every earlier reader's; the next reader's is at
        // least the writer's.
        assert!(
            n("x", "token") > n("a", "token").max(n("b", "token")),
            "{url}"
        );
        assert!(n("c", "token") >= n("x", "token"), "{url}");
    }
}
