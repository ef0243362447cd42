#!/usr/bin/env python3
"""Browser tests of the lock server's web page (/ui) in headless Chromium (Debian's
/usr/bin/chromium, driven by Playwright; no downloaded browser).

    python3 scripts/ui_test.py BINARY SCREENSHOT_DIR

Starts `BINARY serve` with an auth file (admin, reader and locker tokens) over a fresh SQLite
file on a spare loopback port, then checks:
  1. a lock acquired through the API appears on the page without a reload, and its time left
     counts down;
  2. a note containing <script> is shown as text (and never runs);
  3. a release through the API makes the row go, without a reload;
  4. a reader sees no force-release button, and gets 403 when posting one anyway;
  5. an admin force-releases from the page (confirming the dialog) and the holder — a
     `storage-lock run` process whose SDK handle renews through the server — loses the lock;
  6. the page is readable at 1280 px and at phone width (screenshots);
  7. a name's lock-kind parts show on its page: a semaphore's permits held, each linking to
     its own lock (the permit taken through the API as the lock of its slot);
  8. `torture --report` pages open from the file: a run with faults shows its verdict, a lane
     per worker, hold bars and fault marks; a run on a storage broken on purpose (--mutate)
     shows VIOLATED, red bars and the list of violations (screenshots).
Screenshots of each page go to SCREENSHOT_DIR. Any failure exits non-zero.
"""

import hashlib
import json
import os
import secrets
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

from playwright.sync_api import expect, sync_playwright

CHROMIUM = os.environ.get("SL_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]


def spare_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def api(base, token, method, path, body=None):
    req = urllib.request.Request(base + path, method=method)
    req.add_header("authorization", f"Bearer {token}")
    data = None
    if body is not None:
        data = json.dumps(body).encode()
        req.add_header("content-type", "application/json")
    try:
        with urllib.request.urlopen(req, data, timeout=10) as res:
            return res.status, json.loads(res.read() or b"null")
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"null")


def check(cond, what):
    if not cond:
        raise AssertionError(what)
    print(f"ok - {what}")


def main():
    binary, shots = sys.argv[1], sys.argv[2]
    os.makedirs(shots, exist_ok=True)
    work = tempfile.mkdtemp(prefix="storage-lock-ui-")
    tokens = {name: secrets.token_hex(16) for name in ("admin", "reader", "locker")}
    allow = {"admin": "admin", "reader": "read", "locker": "lock"}
    with open(os.path.join(work, "auth.toml"), "w") as f:
        for name, tok in tokens.items():
            digest = hashlib.sha256(tok.encode()).hexdigest()
            f.write(f'[[token]]\nname = "{name}"\nsha256 = "{digest}"\n'
                    f'grants = [{{ prefix = "", allow = "{allow[name]}" }}]\n')
    port = spare_port()
    base = f"http://127.0.0.1:{port}"
    server = subprocess.Popen(
        [binary, "--storage", f"sqlite://{work}/locks.db", "serve", "--listen", f"127.0.0.1:{port}",
         "--auth", os.path.join(work, "auth.toml")],
        stderr=open(os.path.join(work, "server.log"), "w"))
    holder = None
    # 7's runs go first, beside the rest: they take seconds of wall time, little CPU.
    tortures = {}
    for kind, extra in (("ok", ["--faults", "kill,pause,skew", "--duration", "8s"]),
                        ("violated", ["--mutate", "non-atomic", "--faults", "none",
                                      "--duration", "4s", "--names", "1"])):
        report = os.path.join(work, f"torture-{kind}")
        tortures[kind] = (report, subprocess.Popen(
            [binary, "torture", f"sqlite://{work}/torture-{kind}.db", "--lease", "1s",
             "--workers", "3", "--report", report, "-q", *extra],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    try:
        deadline = time.monotonic() + 30
        while True:
            if server.poll() is not None:
                raise AssertionError("the server exited:\n" + open(os.path.join(work, "server.log")).read())
            try:
                urllib.request.urlopen(base + "/healthz", timeout=1)
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise AssertionError("the server did not answer /healthz within 30 s")
                time.sleep(0.1)
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)

            def signed_in(who, width=1280, height=900):
                ctx = browser.new_context(viewport={"width": width, "height": height})
                page = ctx.new_page()
                page.goto(base + "/ui")
                check(page.url.endswith("/ui/login"), f"{who}: the page asks to sign in first")
                page.fill("input[name=token]", tokens[who])
                page.click("button[type=submit]")
                page.wait_for_url(base + "/ui")
                return ctx, page

            # 1-3: live rows as a reader.
            _, reader = signed_in("reader")
            dialogs = []
            reader.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
            check(reader.locator("td.empty").is_visible(), "no lock held at first")
            reader.evaluate("window.__noReload = true")
            note = "<script>alert('pwned')</script> & \"quotes\""
            status, hold = api(base, tokens["locker"], "POST", "/v1/locks/jobs%2Fbuild-1/acquire",
                               {"lease_ms": 60000, "note": note})
            check(status == 200, "acquired through the API")
            started = time.monotonic()
            row = reader.locator('tr[data-name="jobs/build-1"]')
            row.wait_for(timeout=10000)
            took = time.monotonic() - started
            check(took < 1.5, f"the row appeared within 1 s of the acquire (+0.5 s slack; took {took:.2f} s)")
            check(reader.evaluate("window.__noReload === true"), "without a reload")
            check(row.locator("td.token").inner_text() == hold["fencing_token"], "it shows the fencing token")
            check(row.locator("td.note").inner_text() == note, "a note with <script> is shown as text")
            check(reader.locator("td.note script").count() == 0, "and is not markup")
            left1 = float(row.get_attribute("data-left"))
            text1 = row.locator("td.left").inner_text()
            expect(row.locator("td.left")).not_to_have_text(text1, timeout=5000)
            text2 = row.locator("td.left").inner_text()
            check(float(text2.rstrip("s")) < float(text1.rstrip("s")), f"time left counts down ({text1} → {text2})")
            check(left1 <= 60000, "time left is at most the lease")
            check(row.get_attribute("class") == "held", "a fresh hold is coloured held")
            check(not dialogs, "no script ran (no dialog opened)")
            reader.screenshot(path=os.path.join(shots, "locks-1280.png"), full_page=True)

            # 4: a reader has no button, and posting anyway is refused.
            reader.click('tr[data-name="jobs/build-1"] td.name a')
            reader.wait_for_url("**/ui/locks/jobs%2Fbuild-1")
            check(reader.locator("form#force").count() == 0, "a reader sees no force-release button")
            check(reader.locator("dd.note").inner_text() == note, "the lock page shows the note as text")
            own_csrf = reader.locator("form[action='/ui/logout'] input[name=csrf]").get_attribute("value")
            res = reader.request.post(base + "/ui/locks/jobs%2Fbuild-1/force-release",
                                      form={"csrf": own_csrf, "expected_fencing_token": hold["fencing_token"],
                                            "confirmed": "yes"})
            check(res.status == 403, f"a reader's post with its own valid CSRF token is refused (403, got {res.status})")
            check("may not" in res.text(), "because it is not an admin")
            status, info = api(base, tokens["reader"], "GET", "/v1/locks/jobs%2Fbuild-1")
            check(info["state"] == "held" and info["fencing_token"] == hold["fencing_token"],
                  "and nothing changed")
            reader.screenshot(path=os.path.join(shots, "lock-reader.png"), full_page=True)

            # 3: release → the row goes.
            reader.goto(base + "/ui")
            reader.evaluate("window.__noReload = true")
            reader.locator('tr[data-name="jobs/build-1"]').wait_for(timeout=10000)
            api(base, tokens["locker"], "POST", "/v1/locks/jobs%2Fbuild-1/release", {"owner": hold["owner"]})
            started = time.monotonic()
            reader.locator('tr[data-name="jobs/build-1"]').wait_for(state="detached", timeout=10000)
            took = time.monotonic() - started
            check(took < 1.5, f"the row went within 1 s of the release (+0.5 s slack; took {took:.2f} s)")
            check(reader.evaluate("window.__noReload === true"), "without a reload")

            # 5: an admin force-releases a lock held by a `storage-lock run` (the SDK over HTTP).
            holder = subprocess.Popen(
                [binary, "--storage", f"{base}?token={tokens['locker']}", "run", "--lease", "15s",
                 "deploy/prod", "--", "sleep", "60"],
                stderr=subprocess.PIPE, text=True)
            _, admin = signed_in("admin")
            admin.locator('tr[data-name="deploy/prod"]').wait_for(timeout=15000)
            holder_text = admin.locator('tr[data-name="deploy/prod"] td.holder').inner_text()
            token = admin.locator('tr[data-name="deploy/prod"] td.token').inner_text()
            admin.click('tr[data-name="deploy/prod"] td.name a')
            admin.wait_for_url("**/ui/locks/deploy%2Fprod")
            check(admin.locator("form#force button").is_visible(), "an admin sees the force-release button")
            admin.screenshot(path=os.path.join(shots, "lock-admin.png"), full_page=True)
            seen = []
            admin.on("dialog", lambda d: (seen.append(d.message), d.accept()))
            admin.fill("input[name=reason]", "stuck deploy (ui test)")
            admin.click("form#force button")
            admin.wait_for_url("**/ui/locks/deploy%2Fprod?done=*")
            check(seen and "deploy/prod" in seen[0] and f"fencing token {token}" in seen[0]
                  and holder_text in seen[0], "the confirmation names the lock, the holder and the token")
            check("Force-released" in admin.locator(".flash").inner_text(), "the page says it was done")
            admin.screenshot(path=os.path.join(shots, "lock-force-released.png"), full_page=True)
            try:
                code = holder.wait(timeout=30)
            except subprocess.TimeoutExpired:
                code = None
            err = holder.stderr.read() if code is not None else ""
            check(code == 76, f"the holder's handle turned lost: `run` exits 76 (got {code}; {err.strip()})")
            status, info = api(base, tokens["reader"], "GET", "/v1/locks/deploy%2Fprod")
            check(int(info["fencing_token"]) == int(token), "the force-release kept the token")
            status, nxt = api(base, tokens["locker"], "POST", "/v1/locks/deploy%2Fprod/acquire", {"lease_ms": 5000})
            check(int(nxt["fencing_token"]) > int(token), "the next holder's token is higher")
            log = open(os.path.join(work, "server.log")).read()
            audit = [l for l in log.splitlines() if "force_release" in l]
            check(audit and 'who="admin"' in audit[-1] and f"fencing={token}" in audit[-1],
                  f"the action is logged with who did it and the token ({audit[-1:]})")

            # 6: phone width.
            _, phone = signed_in("reader", width=390, height=844)
            api(base, tokens["locker"], "POST", "/v1/locks/jobs%2Fphone/acquire",
                {"lease_ms": 60000, "note": "shown on a phone"})
            phone.locator('tr[data-name="jobs/phone"]').wait_for(timeout=10000)
            wide = phone.evaluate("document.documentElement.scrollWidth")
            check(wide <= 390, f"no horizontal scrolling at 390 px (page is {wide} px wide)")
            phone.screenshot(path=os.path.join(shots, "locks-phone.png"), full_page=True)

            # 7: a semaphore's parts on its page.
            status, limit = api(base, tokens["locker"], "PUT", "/v1/locks/pool/semaphore-limit", {"permits": 3})
            check(status == 200 and limit.get("permits") == 3, f"a semaphore limit is kept ({status} {limit})")
            status, permit = api(base, tokens["locker"], "POST", "/v1/locks/pool%2Fpermit%2F2/acquire", {"lease_ms": 60000})
            check(status == 200, f"a permit is the lock of its slot ({status})")
            _, pool = signed_in("reader")
            pool.goto(f"{base}/ui/locks/pool")
            heading = pool.locator("#semaphore h2").inner_text()
            check("3 permits, 1 held" in heading, f"the semaphore's page says so ({heading!r})")
            link = pool.locator('#semaphore a[href="/ui/locks/pool%2Fpermit%2F2"]')
            check(link.count() == 1, "the held permit links to its own lock")
            token = pool.locator("#semaphore td.token").first.inner_text()
            check(token == permit["fencing_token"], f"with its fencing token ({token})")
            pool.screenshot(path=os.path.join(shots, "lock-semaphore.png"), full_page=True)

            # 8: the torture reports, from the file (no server).
            for kind, (report, proc) in tortures.items():
                code = proc.wait(timeout=120)
                check(code == (0 if kind == "ok" else 1), f"torture ({kind}) exited {code}")
                page = browser.new_page(viewport={"width": 1280, "height": 700})
                page.goto("file://" + os.path.join(report, "report.html"))
                verdict = page.locator("#verdict").inner_text()
                check(verdict == ("ok" if kind == "ok" else "VIOLATED"),
                      f"the {kind} report says {verdict}")
                lanes = page.locator("#timeline rect.lane").count()
                holds = page.locator("#timeline rect.hold").count()
                check(lanes >= 3 and holds > 0, f"{kind}: {lanes} lanes, {holds} hold bars drawn")
                box = page.locator("#timeline rect.hold").first.bounding_box()
                check(box and box["width"] >= 2 and box["height"] > 10,
                      f"{kind}: a hold bar is visible ({box})")
                if kind == "ok":
                    faults = page.locator("#timeline .fault").count()
                    check(faults >= 3, f"the faults are marked ({faults})")
                    check(page.locator("#timeline text", has_text="(clock ").count() >= 1,
                          "the skewed worker's lane says so")
                else:
                    red = page.locator("#timeline rect.violation").count()
                    listed = page.locator("li.violation").count()
                    check(red > 0 and listed > 0, f"violations in red ({red}) and listed ({listed})")
                page.screenshot(path=os.path.join(shots, f"torture-{kind}.png"), full_page=True)
            browser.close()
        print(f"all browser checks passed; screenshots in {shots}")
    finally:
        for _, proc in tortures.values():
            if proc.poll() is None:
                proc.kill()
        if holder and holder.poll() is None:
            holder.kill()
        server.terminate()
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            server.kill()
            raise AssertionError("the server did not stop within 10 s of SIGTERM")


if __name__ == "__main__":
    main()
