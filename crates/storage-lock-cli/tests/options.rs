//! Options, formats and exit codes end to end on the real binary: durations, notes and
//! escaping, the README's exit-code table, lease tokens, flock(1) options, `-v`, the progress
//! line.

mod support;

use std::process::{Command, Output, Stdio};
use std::time::{Duration, SystemTime};

use nix::sys::signal::Signal;
use support::{BIN, Scratch, cli, inspect, is_held, kill, output_within, unique, urls, wait_until};

const LIMIT: Duration = Duration::from_secs(15);

fn run_cli(dir: &std::path::Path, url: &str, args: &[&str]) -> Output {
    output_within(&mut cli(dir, url, args), LIMIT)
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A failure that is not a crash: one line on stderr, no panic, not the internal-error code.
fn assert_clean_failure(what: &str, out: &Output) {
    let err = stderr(out);
    assert_ne!(out.status.code(), Some(70), "{what}: {err}");
    assert!(out.status.code().is_some(), "{what}: killed: {out:?}");
    assert!(!err.contains("panicked"), "{what}: {err}");
    assert_eq!(err.lines().count(), 1, "{what}: {err:?}");
}

#[test]
fn durations_take_bare_seconds_and_huge_values_never_crash() {
    let dir = tempfile::tempdir().unwrap();
    for (i, url) in urls(dir.path()).into_iter().enumerate() {
        let dir = &Scratch::new(dir.path(), i);
        let d = dir.path();
        let name = unique("durations");
        let out = run_cli(
            d,
            &url,
            &[
                "run",
                &name,
                "--wait",
                "10",
                "--lease",
                "30",
                "--renew",
                "5",
                "--kill-grace",
                "2.5",
                "--",
                "true",
            ],
        );
        assert_eq!(out.status.code(), Some(0), "{url}: bare seconds: {out:?}");
        let out = run_cli(d, &url, &["acquire", &name, "-w", "1.5", "--lease", "0.5"]);
        assert_eq!(out.status.code(), Some(0), "{url}: -w 1.5: {out:?}");

        // A lease of a billion days: the library has no upper bound; the CLI must print it.
        let huge = unique("huge");
        let out = run_cli(
            d,
            &url,
            &[
                "run",
                &huge,
                "--lease",
                "1000000000d",
                "--",
                "sh",
                "-c",
                "echo \"$STORAGE_LOCK_EXPIRES_AT\"",
            ],
        );
        if out.status.success() {
            assert!(stdout(&out).starts_with('+'), "{url}: {out:?}");
        } else {
            assert_clean_failure(&format!("{url}: run --lease 1000000000d"), &out);
        }
        let out = run_cli(
            d,
            &url,
            &["acquire", &huge, "--lease", "1000000000d", "--json"],
        );
        if out.status.success() {
            let acquired: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
            for args in [
                vec!["list", huge.as_str()],
                vec!["list", huge.as_str(), "--json"],
                vec!["inspect", huge.as_str()],
                vec!["inspect", huge.as_str(), "--json"],
            ] {
                let out = run_cli(d, &url, &args);
                assert_eq!(out.status.code(), Some(0), "{url}: {args:?}: {out:?}");
                assert!(stdout(&out).contains(&huge), "{url}: {args:?}: {out:?}");
            }
            let token = acquired["token"].as_str().unwrap();
            let out = run_cli(d, &url, &["renew", token]);
            assert_eq!(out.status.code(), Some(0), "{url}: renew: {out:?}");
            let out = run_cli(d, &url, &["release", token]);
            assert_eq!(out.status.code(), Some(0), "{url}: release: {out:?}");
        } else {
            assert_clean_failure(&format!("{url}: acquire --lease 1000000000d"), &out);
        }

        // The durations only the CLI uses have bounds: usage errors beyond them.
        for args in [
            vec!["run", &name, "--kill-grace", "500000000000y", "--", "true"],
            vec!["run", &name, "--wait", "500000000000y", "--", "true"],
            vec!["run", &name, "-w", "101y", "--", "true"],
            vec!["acquire", &name, "--wait", "500000000000y"],
            vec![
                "run",
                &name,
                "--lease",
                "99999999999999999999999",
                "--",
                "true",
            ],
        ] {
            let out = run_cli(d, &url, &args);
            assert_eq!(out.status.code(), Some(2), "{url}: {args:?}: {out:?}");
            assert_clean_failure(&format!("{url}: {args:?}"), &out);
        }
        let out = run_cli(d, &url, &["sweep", "--older-than", "500000000000y"]);
        assert!(
            out.status.success() || out.status.code() == Some(69),
            "{url}: sweep: {out:?}"
        );
        assert!(!stderr(&out).contains("panicked"), "{url}: {out:?}");
    }
}

#[test]
fn the_default_note_is_the_program_name_and_stored_text_is_escaped() {
    let dir = tempfile::tempdir().unwrap();
    for (i, url) in urls(dir.path()).into_iter().enumerate() {
        let dir = &Scratch::new(dir.path(), i);
        let d = dir.path();
        let name = unique("note");
        let ready = d.join("ready");
        let mut holder = cli(
            d,
            &url,
            &[
                "run",
                &name,
                "--",
                "sh",
                "-c",
                "touch \"$READY\"; sleep 30",
                "sh",
                "--password=hunter2",
            ],
        )
        .env("READY", &ready)
        .spawn()
        .unwrap();
        wait_until(Duration::from_secs(10), "the holder", || ready.exists());
        let record = inspect(d, &url, &name);
        assert_eq!(record["holder"]["note"], "sh", "{url}: {record}");
        let listed = stdout(&run_cli(d, &url, &["list", &name]));
        assert!(!listed.contains("hunter2"), "{url}: {listed}");
        kill(holder.id(), Signal::SIGTERM);
        holder.wait().unwrap();

        // A note (and a name) with a newline and escape sequences cannot fake rows.
        let evil = unique("evil");
        let out = run_cli(
            d,
            &url,
            &[
                "acquire",
                &evil,
                "--note",
                "x\nfake-lock        1   9.9s  root:1 (\u{1b}[31mred\u{202e})",
            ],
        );
        assert!(out.status.success(), "{url}: {out:?}");
        let token = stdout(&out).trim().to_owned();
        let listed = stdout(&run_cli(d, &url, &["list", &evil]));
        assert_eq!(listed.lines().count(), 2, "{url}: {listed}");
        assert!(listed.contains("x\\nfake-lock"), "{url}: {listed}");
        assert!(
            !listed.contains('\u{1b}') && !listed.contains('\u{202e}'),
            "{url}"
        );
        let shown = stdout(&run_cli(d, &url, &["inspect", &evil]));
        assert!(!shown.contains('\u{1b}'), "{url}: {shown}");
        assert_eq!(shown.lines().count(), 11, "{url}: {shown}"); // ten fields and the storage
        // JSON keeps the note exactly (JSON escapes it).
        let record = inspect(d, &url, &evil);
        assert!(
            record["holder"]["note"]
                .as_str()
                .unwrap()
                .starts_with("x\nfake"),
            "{url}"
        );
        // A busy notice shows the holder escaped as well (`--no-wait` would be silent).
        let out = run_cli(d, &url, &["acquire", &evil, "--wait", "0.01"]);
        assert_eq!(out.status.code(), Some(75));
        assert_eq!(stderr(&out).lines().count(), 1, "{url}: {out:?}");
        run_cli(d, &url, &["release", &token]);
    }
}

/// One check per row of the README's exit-code table (70, an internal error, has no test: it
/// needs a bug).
#[test]
fn every_row_of_the_exit_code_table() {
    let dir = tempfile::tempdir().unwrap();
    for (i, url) in urls(dir.path()).into_iter().enumerate() {
        let dir = &Scratch::new(dir.path(), i);
        let d = dir.path();
        let name = unique("codes");
        let code = |args: &[&str]| run_cli(d, &url, args).status.code();
        // the command's own code; 128 + N when signal N killed it
        assert_eq!(code(&["run", &name, "--", "sh", "-c", "exit 3"]), Some(3));
        assert_eq!(
            code(&["run", &name, "--", "sh", "-c", "kill -USR1 $$"]),
            Some(138)
        );
        // 0
        assert_eq!(code(&["list"]), Some(0), "{url}");
        // 2: bad arguments, unknown scheme, malformed URL, invalid name, invalid token, --renew
        for (what, out) in [
            ("bad argument", run_cli(d, &url, &["run", &name, "--bogus"])),
            (
                "unknown scheme",
                output_within(&mut cli(d, "nosuch://x", &["list"]), LIMIT),
            ),
            (
                "malformed URL",
                output_within(&mut cli(d, "postgres://u@h:port/db", &["list"]), LIMIT),
            ),
            ("invalid name", run_cli(d, &url, &["inspect", "a\nb"])),
            ("invalid token", run_cli(d, &url, &["release", "v2.x"])),
            (
                "--renew >= --lease",
                run_cli(
                    d,
                    &url,
                    &["run", &name, "--lease", "1s", "--renew", "2s", "--", "true"],
                ),
            ),
        ] {
            assert_eq!(out.status.code(), Some(2), "{url}: {what}: {out:?}");
        }
        // 69
        let out = output_within(
            &mut cli(d, "postgres://postgres@127.0.0.1:1/test", &["list"]),
            LIMIT,
        );
        assert_eq!(out.status.code(), Some(69), "{out:?}");
        // 75 (and -E changes it)
        let token = stdout(&run_cli(d, &url, &["acquire", &name, "--lease", "30s"]))
            .trim()
            .to_owned();
        assert_eq!(code(&["run", &name, "-n", "--", "true"]), Some(75), "{url}");
        assert_eq!(code(&["acquire", &name, "-n", "-E", "9"]), Some(9), "{url}");
        // 128 + N: interrupted while waiting; nothing is left held by the waiter
        let mut waiter = cli(d, &url, &["run", &name, "--", "true"])
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        std::thread::sleep(Duration::from_millis(500));
        kill(waiter.id(), Signal::SIGTERM);
        let status = support::wait_within(&mut waiter, LIMIT);
        assert_eq!(status.code(), Some(143), "{url}");
        assert_eq!(code(&["release", &token]), Some(0), "{url}");
        assert!(!is_held(d, &url, &name), "{url}");
        // 76: release / renew of a token whose lease ran out (nobody took the lock since). On a
        // `clock: observed` storage a process that has not seen the write cannot tell that the
        // lease ran out (no clock is shared: README, "Backends"), so it renews or releases the
        // hold, conditionally on the version nobody replaced: 0.
        let check = run_cli(d, &url, &["check", "--json"]);
        let check: serde_json::Value = serde_json::from_slice(&check.stdout).unwrap();
        let ran_out = if check["clock"] == "observed" {
            Some(0)
        } else {
            Some(76)
        };
        let token = stdout(&run_cli(d, &url, &["acquire", &name, "--lease", "300ms"]))
            .trim()
            .to_owned();
        std::thread::sleep(Duration::from_millis(600));
        assert_eq!(code(&["release", &token]), ran_out, "{url}: release");
        let token = stdout(&run_cli(d, &url, &["acquire", &name, "--lease", "300ms"]))
            .trim()
            .to_owned();
        std::thread::sleep(Duration::from_millis(600));
        assert_eq!(code(&["renew", &token]), ran_out, "{url}: renew");
        // 126 / 127
        let not_exec = d.join("not-executable");
        std::fs::write(&not_exec, "echo hi\n").unwrap();
        assert_eq!(
            code(&["run", &name, "--", not_exec.to_str().unwrap()]),
            Some(126)
        );
        assert_eq!(code(&["run", &name, "--", "/no/such/cmd"]), Some(127));
        assert!(!is_held(d, &url, &name), "{url}");
    }
}

#[test]
fn renew_without_lease_keeps_the_acquisition_lease() {
    let dir = tempfile::tempdir().unwrap();
    for (i, url) in urls(dir.path()).into_iter().enumerate() {
        let dir = &Scratch::new(dir.path(), i);
        let d = dir.path();
        let name = unique("renew");
        let token = stdout(&run_cli(d, &url, &["acquire", &name, "--lease", "10m"]))
            .trim()
            .to_owned();
        assert!(token.starts_with("v2."), "{url}: {token}");
        let left_after_renew = |token: &str, extra: &[&str]| -> Duration {
            let mut args = vec!["renew", token, "--json"];
            args.extend(extra);
            let out = run_cli(d, &url, &args);
            assert!(out.status.success(), "{url}: {out:?}");
            let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
            let at = humantime::parse_rfc3339(json["expires_at"].as_str().unwrap()).unwrap();
            at.duration_since(SystemTime::now()).unwrap_or_default()
        };
        let left = left_after_renew(&token, &[]);
        assert!(left > Duration::from_secs(590), "{url}: {left:?}");
        let left = left_after_renew(&token, &["--lease", "20s"]);
        assert!(left <= Duration::from_secs(20), "{url}: {left:?}");
        // A v1 token (no lease): the old default, 30 s.
        let parts: Vec<&str> = token.split('.').collect();
        let v1 = format!("v1.{}.{}.{}", parts[1], parts[2], parts[4]);
        let left = left_after_renew(&v1, &[]);
        assert!(
            left <= Duration::from_secs(30) && left > Duration::from_secs(25),
            "{url}: {left:?}"
        );
        assert_eq!(run_cli(d, &url, &["release", &v1]).status.code(), Some(0));
    }
}

#[test]
fn flock_options_c_and_s() {
    let dir = tempfile::tempdir().unwrap();
    for (i, url) in urls(dir.path()).into_iter().enumerate() {
        let dir = &Scratch::new(dir.path(), i);
        let d = dir.path();
        let name = unique("flock");
        let out = run_cli(
            d,
            &url,
            &[
                "run",
                &name,
                "-x",
                "-c",
                "echo \"$STORAGE_LOCK_NAME\"; exit 4",
            ],
        );
        assert_eq!(out.status.code(), Some(4), "{url}: {out:?}");
        assert_eq!(stdout(&out).trim(), name, "{url}");
        let out = run_cli(
            d,
            &url,
            &["run", &name, "-s", "-c", "echo \"$STORAGE_LOCK_NAME\""],
        );
        assert_eq!(out.status.code(), Some(0), "{url}: {out:?}");
        assert_eq!(stdout(&out).trim(), name, "{url}");
        // A candidate holds the seat alone.
        let out = run_cli(d, &url, &["elect", &name, "-s", "--", "true"]);
        assert_eq!(out.status.code(), Some(2), "{url}: {out:?}");
        assert!(stderr(&out).contains("-s"), "{url}: {out:?}");
        assert_clean_failure("elect -s", &out);
    }
}

#[test]
fn verbose_prints_the_storage_in_use() {
    let dir = tempfile::tempdir().unwrap();
    let out = output_within(
        Command::new(BIN)
            .args(["-v", "list"])
            .env_remove("STORAGE_LOCK_URL")
            .env_remove("XDG_STATE_HOME")
            .env("HOME", dir.path())
            .stdin(Stdio::null()),
        LIMIT,
    );
    assert!(out.status.success(), "{out:?}");
    let expected = format!(
        "storage-lock: storage: sqlite://{}/.local/state/storage-lock/locks.db",
        dir.path().display()
    );
    assert!(stderr(&out).contains(&expected), "{}", stderr(&out));

    let out = output_within(
        &mut cli(
            dir.path(),
            "postgres://u:hunter2@127.0.0.1:1/db",
            &["-v", "list"],
        ),
        LIMIT,
    );
    let err = stderr(&out);
    assert!(
        err.contains("storage: postgres://u:***@127.0.0.1:1/db"),
        "{err}"
    );
    assert!(!err.contains("hunter2"), "{err}");
}

/// While waiting on a terminal 50 columns wide, every progress update fits in 49 columns.
#[test]
fn the_progress_line_fits_the_terminal() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("locks.db").display());
    let name = unique("a-rather-long-lock-name-for-the-progress-line");
    let token = stdout(&run_cli(
        dir.path(),
        &url,
        &["acquire", &name, "--lease", "1m", "--note", &"n".repeat(60)],
    ))
    .trim()
    .to_owned();
    let out = output_within(
        Command::new("script")
            .args([
                "-qec",
                "stty cols 50; \"$BIN\" --storage \"$URL\" acquire \"$NAME\" --wait 1s",
                "/dev/null",
            ])
            .env("BIN", BIN)
            .env("URL", &url)
            .env("NAME", &name)
            .stdin(Stdio::null()),
        LIMIT,
    );
    assert_eq!(out.status.code(), Some(75), "{out:?}");
    let text = stdout(&out);
    let updates: Vec<&str> = text
        .split(['\r', '\n'])
        .filter(|l| l.contains("waiting"))
        .map(|l| l.trim_start_matches("\u{1b}[2K"))
        .collect();
    assert!(!updates.is_empty(), "{text:?}");
    for line in updates {
        assert!(line.chars().count() <= 49, "{line:?}");
    }
    run_cli(dir.path(), &url, &["release", &token]);
}
