#!/usr/bin/env python3
"""Runs the workspace's test binaries several at a time, as `cargo test` would run them one by one.

usage: cargo test … --no-run --message-format json-render-diagnostics | scripts/run-tests.py [--jobs N]

Why: the suites spend most of their time waiting on servers and on leases running out, not on
the CPU, and `cargo test` runs one binary after the other.

What stays as under `cargo test`: each binary runs in its package's directory with the same
environment cargo gives it (`CARGO_MANIFEST_DIR`, `CARGO_PKG_NAME`), with no arguments, so each
binary's own tests still run on its default number of threads. What the binaries share: the
servers `scripts/services.sh` started (every test uses keys no other test uses), and the spare
ports the testkit hands out, which a directory named by `STORAGE_LOCK_TEST_PORTS` keeps unique
across the processes of one run (`storage_lock_testkit::restart::spare_port`).

Each binary's output is printed whole when it ends (never interleaved), then a table of the
binaries' wall times. A binary that runs longer than `--timeout` seconds is killed with its
process group and counts as failed. The exit status is 1 when any binary failed or could not
run; Ctrl-C or SIGTERM kills the running binaries' process groups and exits 130.
"""
import argparse, json, os, shutil, signal, subprocess, sys, tempfile, threading, time

# Binaries that take longest go first, so that the last ones to start are short. Names are
# `package/target`; the rest keep cargo's order. Update from the table this script prints.
SLOW_FIRST = [
    "storage-lock-dynamodb/dynamodb", "storage-lock-nats/nats", "storage-lock-etcd/etcd",
    "storage-lock-sql/mysql", "storage-lock-sql/postgres", "storage-lock-redis/cluster",
    "storage-lock-object-store/azure", "storage-lock-client/semantics", "storage-lock-cli/supervise",
    "storage-lock-zookeeper/zookeeper", "storage-lock-object-store/s3", "storage-lock-sql/sqlite",
    "storage-lock-redis/valkey", "storage-lock-redis/redis", "storage-lock-redis/durability",
    "storage-lock-cli/run", "storage-lock-cli/options", "storage-lock-cli/torture",
    "storage-lock-testkit/memory", "storage-lock/connection_loss", "storage-lock-cli/commands",
    "storage-lock-memcached/memcached", "storage-lock/multiprocess",
]


def binaries(messages):
    """(name, executable, package directory, package name) of each test executable cargo built."""
    out = []
    for line in messages:
        line = line.strip()
        if not line.startswith("{"):
            continue
        msg = json.loads(line)
        if msg.get("reason") != "compiler-artifact" or not msg.get("executable"):
            continue
        if not msg.get("profile", {}).get("test"):
            continue
        target = msg["target"]
        pkg_dir = os.path.dirname(msg["manifest_path"])
        # `path+file:///…/DIR#VERSION`, or `…#NAME@VERSION` when the name is not DIR's.
        fragment = msg.get("package_id", "").rpartition("#")[2]
        pkg = fragment.partition("@")[0] if "@" in fragment else os.path.basename(pkg_dir)
        kind = target["kind"][0]
        name = f"{pkg}/{target['name']}" if kind != "lib" else f"{pkg}/lib"
        out.append((name, msg["executable"], pkg_dir, pkg))
    return out


def order(bins):
    rank = {name: i for i, name in enumerate(SLOW_FIRST)}
    return sorted(bins, key=lambda b: rank.get(b[0], len(rank)))


class Stopped(Exception):
    """SIGTERM (a cancelled CI job): stop like Ctrl-C does."""


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=1200)
    args = ap.parse_args()
    jobs = max(1, args.jobs)
    bins = order(binaries(sys.stdin))
    if not bins:
        print("run-tests: cargo built no test binary", file=sys.stderr)
        return 1
    ports = tempfile.mkdtemp(prefix="storage-lock-test-ports-")
    queue = list(bins)
    lock = threading.Lock()
    results = []  # (name, seconds, ok)
    running = {}  # name -> Popen, to stop on an interrupt
    stopping = threading.Event()
    started = time.monotonic()

    def run(name, exe, pkg_dir, pkg):
        """(exit code, why, output) of one binary."""
        env = dict(os.environ, CARGO_MANIFEST_DIR=pkg_dir, CARGO_PKG_NAME=pkg,
                   STORAGE_LOCK_TEST_PORTS=ports)
        with tempfile.TemporaryFile() as log:
            proc = subprocess.Popen([exe], cwd=pkg_dir, env=env, stdin=subprocess.DEVNULL,
                                    stdout=log, stderr=subprocess.STDOUT,
                                    start_new_session=True)
            with lock:
                running[name] = proc
            try:
                code, why = proc.wait(timeout=args.timeout), ""
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                code, why = proc.wait(), f" (killed after {args.timeout:.0f} s)"
            finally:
                with lock:
                    running.pop(name, None)
            log.seek(0)
            return code, why, log.read().decode("utf-8", "replace")

    def worker():
        while not stopping.is_set():
            with lock:
                if not queue:
                    return
                name, exe, pkg_dir, pkg = queue.pop(0)
            t0 = time.monotonic()
            try:
                code, why, text = run(name, exe, pkg_dir, pkg)
            except Exception as e:  # a binary that could not run counts as failed
                code, why, text = None, f" ({e})", ""
            seconds = time.monotonic() - t0
            ok = code == 0
            with lock:
                results.append((name, seconds, ok))
                status = "ok" if ok else f"FAILED, exit {code}{why}"
                print(f"\n==== {name}: {status} in {seconds:.1f} s "
                      f"({time.monotonic() - started:.0f} s into the run)", flush=True)
                print(text, end="" if text.endswith("\n") else "\n", flush=True)

    def stop(*_):
        raise Stopped()

    signal.signal(signal.SIGTERM, stop)
    threads = [threading.Thread(target=worker, daemon=True) for _ in range(jobs)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            while t.is_alive():
                t.join(timeout=1)
    except (KeyboardInterrupt, Stopped):
        stopping.set()
        with lock:
            for proc in running.values():
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        print("run-tests: interrupted; the running test binaries were killed", file=sys.stderr)
        return 130
    finally:
        shutil.rmtree(ports, ignore_errors=True)
    wall = time.monotonic() - started
    print(f"\n==== {len(results)} test binaries, {jobs} at a time: {wall:.0f} s wall, "
          f"{sum(s for _, s, _ in results):.0f} s summed")
    for name, seconds, ok in sorted(results, key=lambda r: -r[1]):
        print(f"  {seconds:7.1f} s  {'ok    ' if ok else 'FAILED'}  {name}")
    failed = [name for name, _, ok in results if not ok]
    if failed or len(results) != len(bins):
        print(f"==== failed: {' '.join(failed)} ({len(bins) - len(results)} not run)")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
