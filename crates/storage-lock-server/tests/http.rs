//! The HTTP API against a real server on loopback (memory storage, or a fault-injecting wrapper
//! of it): error bodies for bad input with nothing held, idempotent acquires, lost reasons,
//! long polls and their cancellation, blocking reads, the auth matrix, metrics and OpenAPI.

use std::sync::Arc;
use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{Value, json};
use storage_lock_core::fault::FaultyStorage;
use storage_lock_core::{MemoryStorage, Storage, StorageLock};
use storage_lock_server::{Auth, Server, hash_token};

struct Api {
    base: String,
    http: reqwest::Client,
    token: Option<&'static str>,
}

impl Api {
    async fn start(storage: Arc<dyn Storage>, auth: Option<Auth>) -> Self {
        let locks = StorageLock::builder_arc(storage).build().unwrap();
        let mut server = Server::new(locks);
        if let Some(auth) = auth {
            server = server.auth(auth);
        }
        let base = server.spawn_on_loopback().await.unwrap();
        Self {
            base,
            http: reqwest::Client::new(),
            token: None,
        }
    }

    async fn memory() -> Self {
        Self::start(Arc::new(MemoryStorage::new()), None).await
    }

    fn as_token(&self, token: Option<&'static str>) -> Self {
        Self {
            base: self.base.clone(),
            http: self.http.clone(),
            token,
        }
    }

    fn req(&self, method: reqwest::Method, path: &str) -> reqwest::RequestBuilder {
        let r = self.http.request(method, format!("{}{path}", self.base));
        match self.token {
            Some(t) => r.bearer_auth(t),
            None => r,
        }
    }

    async fn post(&self, path: &str, body: Value) -> (StatusCode, Value) {
        let res = self
            .req(reqwest::Method::POST, path)
            .json(&body)
            .send()
            .await
            .unwrap();
        let status = res.status();
        (status, res.json().await.unwrap_or(Value::Null))
    }

    async fn get(&self, path: &str) -> (StatusCode, Value) {
        let res = self.req(reqwest::Method::GET, path).send().await.unwrap();
        let status = res.status();
        (status, res.json().await.unwrap_or(Value::Null))
    }

    async fn acquire(&self, name: &str, body: Value) -> (StatusCode, Value) {
        self.post(&format!("/v1/locks/{name}/acquire"), body).await
    }

    /// Waits (up to 60 s) until the server's history of `name` holds `n` events of `kind`.
    async fn until_events(&self, name: &str, kind: &str, n: usize) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        loop {
            let (_, body) = self.get(&format!("/v1/locks/{name}/events")).await;
            let seen = body["events"]
                .as_array()
                .map_or(0, |e| e.iter().filter(|e| e["kind"] == kind).count());
            if seen >= n {
                return;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "{n} {kind} events of {name}: {body}"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Every lock's (name, state, fencing token), as the list shows them (no token).
    async fn snapshot(&self) -> Vec<(String, String, String)> {
        self.as_token(None).snapshot_as().await
    }
}

fn assert_error(status: StatusCode, body: &Value, want: StatusCode, code: &str) {
    assert_eq!(status, want, "{body}");
    assert_eq!(body["error"], code, "{body}");
    assert!(
        body["message"].as_str().is_some_and(|m| !m.is_empty()),
        "{body}"
    );
}

#[tokio::test]
async fn bad_input_is_a_4xx_with_the_error_body_and_holds_nothing() {
    let api = Api::memory().await;
    let url = |n: &str| format!("{}/v1/locks/{n}/acquire", api.base);
    // Not JSON, wrong content type, too large, truncated.
    let raw = |body: &'static str, ctype: Option<&'static str>| {
        let mut r = api.http.post(url("a")).body(body);
        if let Some(c) = ctype {
            r = r.header("content-type", c);
        }
        r
    };
    for (req, want, code) in [
        (
            raw("{\"lease_ms\":", Some("application/json")),
            400,
            "invalid_body",
        ),
        (
            raw("lease_ms=5", Some("application/x-www-form-urlencoded")),
            415,
            "unsupported_media_type",
        ),
        (
            raw("{\"lease_ms\":1000}", None),
            415,
            "unsupported_media_type",
        ),
        (
            raw("[1000,0,null,null,null]", Some("application/json")),
            400,
            "invalid_body",
        ),
    ] {
        let res = req.send().await.unwrap();
        let status = res.status();
        let body: Value = res.json().await.unwrap();
        assert_error(status, &body, StatusCode::from_u16(want).unwrap(), code);
    }
    let huge = format!(
        "{{\"lease_ms\":1000,\"note\":\"{}\"}}",
        "x".repeat(70 * 1024)
    );
    let res = api
        .http
        .post(url("a"))
        .header("content-type", "application/json")
        .body(huge)
        .send()
        .await
        .unwrap();
    let status = res.status();
    assert_error(
        status,
        &res.json().await.unwrap(),
        StatusCode::PAYLOAD_TOO_LARGE,
        "body_too_large",
    );
    for (name, body, code) in [
        (
            "a",
            json!({"lease_ms": 1000, "colour": "red"}),
            "invalid_body",
        ),
        ("a", json!({"lease_ms": "1000"}), "invalid_body"),
        ("a", json!({"wait_ms": 10}), "invalid_body"),
        ("a", json!({"lease_ms": 0}), "lease_out_of_range"),
        ("a", json!({"lease_ms": u64::MAX}), "lease_out_of_range"),
        (
            "a",
            json!({"lease_ms": 1000, "wait_ms": 30_001}),
            "invalid_options",
        ),
        (
            "a",
            json!({"lease_ms": 1000, "owner": "xyz"}),
            "invalid_owner",
        ),
        (
            "a",
            json!({"lease_ms": 1000, "owner": "0".repeat(32)}),
            "invalid_owner",
        ),
        (
            "a",
            json!({"lease_ms": 1000, "note": "n".repeat(2000)}),
            "invalid_options",
        ),
        (
            "a",
            json!({"lease_ms": 1000, "note": "nul \u{0} byte"}),
            "invalid_options",
        ),
        (
            "a",
            json!({"lease_ms": 1000, "owner": "+123456789abcdef0123456789abcdef"}),
            "invalid_owner",
        ),
        ("%01ctl", json!({"lease_ms": 1000}), "invalid_name"),
        ("%20", json!({"lease_ms": 1000}), "invalid_name"),
        (&"n".repeat(300), json!({"lease_ms": 1000}), "invalid_name"),
        ("%FF", json!({"lease_ms": 1000}), "invalid_name"),
    ] {
        let (status, body) = api.acquire(name, body).await;
        assert_error(status, &body, StatusCode::BAD_REQUEST, code);
    }
    for (path, body, code) in [
        (
            "/v1/locks/a/renew",
            json!({"owner": "zz", "lease_ms": 5}),
            "invalid_owner",
        ),
        (
            "/v1/locks/a/renew",
            json!({"owner": "1".repeat(32), "lease_ms": 0}),
            "lease_out_of_range",
        ),
        ("/v1/locks/a/release", json!({}), "invalid_body"),
        (
            "/v1/locks/a/force-release",
            json!({"expected_fencing_token": "-1"}),
            "invalid_body",
        ),
        (
            "/v1/locks/a/force-release",
            json!({"expected_fencing_token": 7}),
            "invalid_body",
        ),
    ] {
        let (status, body) = api.post(path, body).await;
        assert_error(status, &body, StatusCode::BAD_REQUEST, code);
    }
    for (path, want, code) in [
        ("/v1/locks?limit=0", 400, "invalid_query"),
        ("/v1/locks?limit=abc", 400, "invalid_query"),
        ("/v1/locks?bogus=1", 400, "invalid_query"),
        ("/v1/locks/a?wait_ms=99999999", 400, "invalid_options"),
        ("/v1/locks/a?while=free", 400, "invalid_query"),
        ("/v2/nothing", 404, "not_found"),
    ] {
        let (status, body) = api.get(path).await;
        assert_error(status, &body, StatusCode::from_u16(want).unwrap(), code);
    }
    let res = api
        .http
        .delete(format!("{}/v1/locks", api.base))
        .send()
        .await
        .unwrap();
    let status = res.status();
    assert_error(
        status,
        &res.json().await.unwrap(),
        StatusCode::METHOD_NOT_ALLOWED,
        "method_not_allowed",
    );
    assert!(api.snapshot().await.is_empty(), "nothing may be held");
}

#[tokio::test]
async fn acquire_retried_with_the_same_owner_returns_the_same_hold() {
    let api = Api::memory().await;
    let owner = "0123456789abcdef0123456789abcdef";
    let (s1, h1) = api
        .acquire("jobs%2F1", json!({"lease_ms": 30_000, "owner": owner}))
        .await;
    assert_eq!(s1, StatusCode::OK, "{h1}");
    assert_eq!(h1["name"], "jobs/1");
    assert_eq!(h1["owner"], owner);
    assert!(
        h1["fencing_token"].is_string(),
        "fencing tokens are strings: {h1}"
    );
    let (s2, h2) = api
        .acquire("jobs%2F1", json!({"lease_ms": 30_000, "owner": owner}))
        .await;
    assert_eq!(s2, StatusCode::OK, "{h2}");
    assert_eq!(h1["fencing_token"], h2["fencing_token"]);
    // Not a reentrant level: one release frees it.
    let (_, r) = api
        .post("/v1/locks/jobs%2F1/release", json!({"owner": owner}))
        .await;
    assert_eq!(r["released"], true);
    assert_eq!(
        r["fencing_token"], h1["fencing_token"],
        "a release says what it released: {r}"
    );
    let (_, r) = api
        .post("/v1/locks/jobs%2F1/release", json!({"owner": owner}))
        .await;
    assert_eq!(r["released"], false, "a retried release is harmless");
    assert!(r.get("fencing_token").is_none(), "nothing released: {r}");
    let (s3, h3) = api.acquire("jobs%2F1", json!({"lease_ms": 30_000})).await;
    assert_eq!(s3, StatusCode::OK, "{h3}");
    let t = |h: &Value| h["fencing_token"].as_str().unwrap().parse::<u64>().unwrap();
    assert!(t(&h3) > t(&h1));
    // Someone else is told who holds it, for how long, and when to come back.
    let res = api
        .http
        .post(format!("{}/v1/locks/jobs%2F1/acquire", api.base))
        .json(&json!({"lease_ms": 1000, "note": "other"}))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::CONFLICT);
    let retry_after: u64 = res.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((1..=30).contains(&retry_after), "{retry_after}");
    let busy: Value = res.json().await.unwrap();
    assert_eq!(busy["error"], "busy");
    assert!(busy["holder"]["pid"].is_number(), "{busy}");
    assert!(busy["expires_in_ms"].as_u64().unwrap() <= 30_000);
}

#[tokio::test]
async fn renew_says_why_a_hold_is_gone() {
    let api = Api::memory().await;
    let take = |lease: u64| {
        let api = &api;
        async move {
            let (s, h) = api.acquire("why", json!({"lease_ms": lease})).await;
            assert_eq!(s, StatusCode::OK, "{h}");
            h["owner"].as_str().unwrap().to_owned()
        }
    };
    let renew = |owner: String| {
        let api = &api;
        async move {
            api.post(
                "/v1/locks/why/renew",
                json!({"owner": owner, "lease_ms": 1000}),
            )
            .await
        }
    };
    let a = take(30_000).await;
    let (s, r) = renew(a.clone()).await;
    assert_eq!(s, StatusCode::OK, "{r}");
    assert_eq!(r["expires_in_ms"], 1000);
    api.post("/v1/locks/why/release", json!({"owner": a})).await;
    let (s, r) = renew(a).await;
    assert_error(s, &r, StatusCode::GONE, "lost");
    assert_eq!(r["reason"], "released");

    let b = take(50).await;
    tokio::time::sleep(Duration::from_millis(120)).await;
    let (_, r) = renew(b.clone()).await;
    assert_eq!(r["reason"], "expired", "{r}");
    let c = take(30_000).await;
    let (_, r) = renew(b).await;
    assert_eq!(r["reason"], "taken_over", "{r}");

    let (s, f) = api
        .post("/v1/locks/why/force-release", json!({"reason": "test"}))
        .await;
    assert_eq!(s, StatusCode::OK, "{f}");
    assert_eq!(f["released"], true);
    let (_, r) = renew(c).await;
    assert_eq!(r["reason"], "force_released", "{r}");
    // The fencing token still moves forward.
    let (_, next) = api.acquire("why", json!({"lease_ms": 1000})).await;
    let t = |v: &Value| v.as_str().unwrap().parse::<u64>().unwrap();
    assert!(t(&next["fencing_token"]) > t(&f["fencing_token"]));
    // Force-release of an older token changes nothing.
    let (_, f2) = api
        .post(
            "/v1/locks/why/force-release",
            json!({"expected_fencing_token": f["fencing_token"]}),
        )
        .await;
    assert_eq!(f2["released"], false);
}

#[tokio::test]
async fn long_poll_hands_off_and_a_disconnected_waiter_leaves_nothing_held() {
    let api = Api::memory().await;
    let (_, h) = api.acquire("lp", json!({"lease_ms": 60_000})).await;
    let owner = h["owner"].as_str().unwrap().to_owned();
    // A waiter that gives up (disconnects) after 200 ms.
    let quitter = api
        .http
        .post(format!("{}/v1/locks/lp/acquire", api.base))
        .timeout(Duration::from_millis(200))
        .json(&json!({"lease_ms": 60_000, "wait_ms": 20_000}))
        .send()
        .await;
    assert!(quitter.is_err(), "the client timed out");
    // A waiter that stays gets the lock as soon as it is released.
    let waiter = {
        let http = api.http.clone();
        let url = format!("{}/v1/locks/lp/acquire", api.base);
        tokio::spawn(async move {
            let started = tokio::time::Instant::now();
            let res = http
                .post(url)
                .json(&json!({"lease_ms": 60_000, "wait_ms": 20_000}))
                .send()
                .await
                .unwrap();
            (
                res.status(),
                res.json::<Value>().await.unwrap(),
                started.elapsed(),
            )
        })
    };
    // Released while the stayer waits: its acquisition found the lock busy (the second
    // contention, after the quitter's), as the server's event history says.
    api.until_events("lp", "contended", 2).await;
    api.post("/v1/locks/lp/release", json!({"owner": owner}))
        .await;
    let (status, hold, waited) = waiter.await.unwrap();
    assert_eq!(status, StatusCode::OK, "{hold}");
    assert!(
        waited < Duration::from_secs(5),
        "handed off by notification: {waited:?}"
    );
    // The quitter's wait was cancelled: the stayer holds it, and after its release it is free.
    api.post("/v1/locks/lp/release", json!({"owner": hold["owner"]}))
        .await;
    // The quitter's abandoned acquisition may still be granted and then released by the
    // server in the background: wait for that (a leak would hold it for 60 s).
    let give_up = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let (_, info) = api.get("/v1/locks/lp").await;
        if info["state"] == "released" {
            break;
        }
        assert!(
            tokio::time::Instant::now() < give_up,
            "nobody may hold it: {info}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn blocking_reads_return_on_change_or_when_free() {
    let api = Api::memory().await;
    let (_, h) = api.acquire("br", json!({"lease_ms": 60_000})).await;
    let reader = {
        let http = api.http.clone();
        let url = format!("{}/v1/locks/br?wait_ms=10000&while=held", api.base);
        tokio::spawn(async move {
            let started = tokio::time::Instant::now();
            let v: Value = http.get(url).send().await.unwrap().json().await.unwrap();
            (v, started.elapsed())
        })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    api.post("/v1/locks/br/release", json!({"owner": h["owner"]}))
        .await;
    let (info, waited) = reader.await.unwrap();
    assert_eq!(info["state"], "released");
    assert!(
        waited >= Duration::from_millis(150) && waited < Duration::from_secs(5),
        "{waited:?}"
    );
    // Free: `while=held` answers at once; a plain blocking read waits for a change.
    let started = tokio::time::Instant::now();
    api.get("/v1/locks/br?wait_ms=10000&while=held").await;
    assert!(started.elapsed() < Duration::from_secs(5), "it waited");
    let started = tokio::time::Instant::now();
    let (_, info) = api.get("/v1/locks/br?wait_ms=300").await;
    assert!(started.elapsed() >= Duration::from_millis(300));
    assert_eq!(info["state"], "released");
}

fn auth() -> Auth {
    let toml = format!(
        r#"
[[token]]
name = "reader"
sha256 = "{}"
grants = [{{ prefix = "", allow = "read" }}]
[[token]]
name = "team-a"
sha256 = "{}"
grants = [{{ prefix = "a/", allow = "lock" }}]
[[token]]
name = "ops"
sha256 = "{}"
grants = [{{ prefix = "", allow = "admin" }}]
"#,
        hash_token("reader-token"),
        hash_token("team-a-token"),
        hash_token("ops-token"),
    );
    Auth::from_toml(&toml).unwrap()
}

/// A raw `/` in a lock name is a 404 that says to send it as `%2F`, not a bare one.
#[tokio::test]
async fn a_raw_slash_in_a_name_says_to_encode_it() {
    let api = Api::memory().await;
    let (s, body) = api.acquire("deploy/prod", json!({"lease_ms": 1000})).await;
    assert_eq!(s, StatusCode::NOT_FOUND, "{body}");
    assert!(body["message"].as_str().unwrap().contains("%2F"), "{body}");
    let (s, body) = api.get("/v1/nothing").await;
    assert_eq!(s, StatusCode::NOT_FOUND, "{body}");
    assert_eq!(body["message"], "no such route", "{body}");
}

/// An API client's hold names the client, not the server: `TOKEN@ADDRESS` with auth (the
/// address the client sends, else the one it connected from), the address without auth.
#[tokio::test]
async fn holds_name_the_client_and_its_token() {
    let api = Api::start(Arc::new(MemoryStorage::new()), Some(auth())).await;
    let team = api.as_token(Some("team-a-token"));
    let (s, _) = team.acquire("a%2Fwho", json!({"lease_ms": 60_000})).await;
    assert_eq!(s, StatusCode::OK);
    let (_, info) = team.get("/v1/locks/a%2Fwho").await;
    assert_eq!(info["holder"]["host"], "team-a@127.0.0.1", "{info}");
    let body = json!({"lease_ms": 60_000, "holder": {"host": "ci-7", "pid": 42}});
    let (s, _) = team.acquire("a%2Fwho2", body).await;
    assert_eq!(s, StatusCode::OK);
    let (_, info) = team.get("/v1/locks/a%2Fwho2").await;
    assert_eq!(info["holder"]["host"], "team-a@ci-7", "{info}");
    assert_eq!(info["holder"]["pid"], 42, "{info}");
    let open = Api::memory().await;
    open.acquire("who", json!({"lease_ms": 60_000})).await;
    let (_, info) = open.get("/v1/locks/who").await;
    assert_eq!(info["holder"]["host"], "127.0.0.1", "{info}");
}

/// A busy acquisition answers with the holder and the time left that the storage's own busy
/// answer carried: the server reads nothing more for its 409 (it used to read the record and
/// the clock again).
#[tokio::test]
async fn a_busy_answer_names_the_holder_without_a_second_read() {
    use storage_lock_core::fault::Op;
    let faulty = Arc::new(FaultyStorage::new(MemoryStorage::new()));
    let api = Api::start(faulty.clone(), None).await;
    let body = json!({"lease_ms": 60_000, "holder": {"host": "ci-7", "pid": 42}});
    let (s, _) = api.acquire("busy", body).await;
    assert_eq!(s, StatusCode::OK);
    let (gets, nows) = (faulty.calls(Op::Get), faulty.calls(Op::Now));
    let (s, busy) = api.acquire("busy", json!({"lease_ms": 1000})).await;
    assert_error(s, &busy, StatusCode::CONFLICT, "busy");
    assert_eq!(busy["holder"]["host"], "ci-7", "{busy}");
    assert_eq!(busy["holder"]["pid"], 42, "{busy}");
    assert!(
        busy["expires_in_ms"].as_u64().is_some_and(|ms| ms > 50_000),
        "{busy}"
    );
    // One read is the engine's: an explicit owner's busy answer is checked for that owner's
    // own earlier grant (a retried request). The server adds none.
    assert_eq!(
        (faulty.calls(Op::Get), faulty.calls(Op::Now)),
        (gets + 1, nows),
        "no read besides the engine's own"
    );
}

/// The server records events from its start (nobody has opened the page), serves them per
/// lock, and a force-release says who did it and why; the lock page shows the same.
#[tokio::test]
async fn events_are_kept_from_the_start_with_who_force_released_and_why() {
    let api = Api::start(Arc::new(MemoryStorage::new()), Some(auth())).await;
    let team = api.as_token(Some("team-a-token"));
    let ops = api.as_token(Some("ops-token"));
    let (s, held) = team.acquire("a%2Fev", json!({"lease_ms": 60_000})).await;
    assert_eq!(s, StatusCode::OK, "{held}");
    let (s, busy) = team.acquire("a%2Fev", json!({"lease_ms": 60_000})).await;
    assert_eq!(s, StatusCode::CONFLICT, "{busy}");
    let (s, fr) = ops
        .post(
            "/v1/locks/a%2Fev/force-release",
            json!({"reason": "stuck deploy #12"}),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{fr}");
    // The engine's events reach the recorder through a channel: wait for the last one.
    team.until_events("a%2Fev", "force_released", 1).await;
    let (s, body) = team.get("/v1/locks/a%2Fev/events").await;
    assert_eq!(s, StatusCode::OK, "{body}");
    let kinds: Vec<&str> = body["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["kind"].as_str().unwrap())
        .collect();
    assert_eq!(
        kinds,
        ["acquired", "contended", "timed_out", "force_released"],
        "{body}"
    );
    let token = held["fencing_token"].as_str().unwrap();
    assert_eq!(body["events"][0]["fencing_token"], token, "{body}");
    assert_eq!(body["events"][3]["fencing_token"], token, "{body}");
    assert_eq!(body["events"][3]["reason"], "stuck deploy #12", "{body}");
    assert!(body["events"][0].get("by").is_none(), "{body}");
    assert_eq!(body["name"], "a/ev");
    assert!(
        body["recorded_since"].as_str().unwrap().ends_with('Z'),
        "{body}"
    );
    assert_eq!(body["missed"], 0, "{body}");
    let (_, one) = team.get("/v1/locks/a%2Fev/events?limit=1").await;
    assert_eq!(one["events"].as_array().unwrap().len(), 1, "{one}");
    assert_eq!(one["events"][0]["kind"], "force_released", "{one}");
    // The same on the lock's page.
    let no_redirects = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let signed_in = no_redirects
        .post(format!("{}/ui/login", api.base))
        .form(&[("token", "ops-token")])
        .send()
        .await
        .unwrap();
    let cookie = signed_in.headers()["set-cookie"].to_str().unwrap();
    let cookie = cookie.split(';').next().unwrap().to_owned();
    let page = no_redirects
        .get(format!("{}/ui/locks/a%2Fev", api.base))
        .header("cookie", cookie)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(page.contains("stuck deploy #12"), "{page}");
    assert!(page.contains("on this replica only"), "{page}");
    // Reading events needs read on the name; the limit is checked; nothing else is known.
    let (s, b) = api.as_token(None).get("/v1/locks/a%2Fev/events").await;
    assert_error(s, &b, StatusCode::UNAUTHORIZED, "unauthorized");
    let (s, b) = team.get("/v1/locks/b/events").await;
    assert_error(s, &b, StatusCode::FORBIDDEN, "forbidden");
    let (s, b) = team.get("/v1/locks/a%2Fev/events?limit=0").await;
    assert_error(s, &b, StatusCode::BAD_REQUEST, "invalid_query");
    let (s, b) = team.get("/v1/locks/a%2Fnever/events").await;
    assert_eq!(s, StatusCode::OK, "{b}");
    assert_eq!(b["events"], json!([]), "{b}");
}

#[tokio::test]
async fn auth_matrix_refuses_and_changes_nothing() {
    let api = Api::start(Arc::new(MemoryStorage::new()), Some(auth())).await;
    let team = api.as_token(Some("team-a-token"));
    let (s, held) = team.acquire("a%2Fjob", json!({"lease_ms": 60_000})).await;
    assert_eq!(s, StatusCode::OK, "{held}");
    let owner = held["owner"].clone();
    let ops = api.as_token(Some("ops-token"));
    let before = ops.snapshot_as().await;
    let cases: Vec<(Api, &str, Value, StatusCode)> = vec![
        // no token, bad token
        (
            api.as_token(None),
            "/v1/locks/a%2Fjob/acquire",
            json!({"lease_ms": 1000}),
            StatusCode::UNAUTHORIZED,
        ),
        (
            api.as_token(Some("guess")),
            "/v1/locks/a%2Fjob/release",
            json!({"owner": owner}),
            StatusCode::UNAUTHORIZED,
        ),
        (
            api.as_token(Some("guess")),
            "/v1/locks/a%2Fjob/force-release",
            json!({}),
            StatusCode::UNAUTHORIZED,
        ),
        // foreign prefix
        (
            api.as_token(Some("team-a-token")),
            "/v1/locks/b%2Fjob/acquire",
            json!({"lease_ms": 1000}),
            StatusCode::FORBIDDEN,
        ),
        // read-only token trying to lock, renew, release
        (
            api.as_token(Some("reader-token")),
            "/v1/locks/a%2Fother/acquire",
            json!({"lease_ms": 1000}),
            StatusCode::FORBIDDEN,
        ),
        (
            api.as_token(Some("reader-token")),
            "/v1/locks/a%2Fjob/renew",
            json!({"owner": owner, "lease_ms": 1}),
            StatusCode::FORBIDDEN,
        ),
        (
            api.as_token(Some("reader-token")),
            "/v1/locks/a%2Fjob/release",
            json!({"owner": owner}),
            StatusCode::FORBIDDEN,
        ),
        // non-admin force-release
        (
            api.as_token(Some("team-a-token")),
            "/v1/locks/a%2Fjob/force-release",
            json!({}),
            StatusCode::FORBIDDEN,
        ),
        (
            api.as_token(Some("reader-token")),
            "/v1/locks/a%2Fjob/force-release",
            json!({}),
            StatusCode::FORBIDDEN,
        ),
    ];
    for (who, path, body, want) in cases {
        let (status, resp) = who.post(path, body).await;
        let code = if want == StatusCode::UNAUTHORIZED {
            "unauthorized"
        } else {
            "forbidden"
        };
        assert_error(status, &resp, want, code);
        assert_eq!(
            ops.snapshot_as().await,
            before,
            "{path}: nothing may change"
        );
    }
    let (s, r) = api.as_token(None).get("/v1/locks").await;
    assert_error(s, &r, StatusCode::UNAUTHORIZED, "unauthorized");
    // A reader sees everything; team-a only its prefix.
    let (s, _) = api
        .as_token(Some("reader-token"))
        .get("/v1/locks/a%2Fjob")
        .await;
    assert_eq!(s, StatusCode::OK);
    let (s, r) = team.get("/v1/locks/b%2Fx").await;
    assert_error(s, &r, StatusCode::FORBIDDEN, "forbidden");
    // The admin may force-release, and the holder then finds it gone.
    let (s, f) = ops
        .post(
            "/v1/locks/a%2Fjob/force-release",
            json!({"reason": "stuck"}),
        )
        .await;
    assert_eq!((s, &f["released"]), (StatusCode::OK, &json!(true)), "{f}");
    let (s, r) = team
        .post(
            "/v1/locks/a%2Fjob/renew",
            json!({"owner": owner, "lease_ms": 1000}),
        )
        .await;
    assert_error(s, &r, StatusCode::GONE, "lost");
}

impl Api {
    /// [`Api::snapshot`] with this caller's token.
    async fn snapshot_as(&self) -> Vec<(String, String, String)> {
        let (status, list) = self.get("/v1/locks").await;
        assert_eq!(status, StatusCode::OK, "{list}");
        list["locks"]
            .as_array()
            .unwrap()
            .iter()
            .map(|l| {
                (
                    l["name"].as_str().unwrap().to_owned(),
                    l["state"].as_str().unwrap().to_owned(),
                    l["fencing_token"].as_str().unwrap_or("").to_owned(),
                )
            })
            .collect()
    }
}

#[tokio::test]
async fn storage_outage_is_503_and_readyz_says_so() {
    let faulty = Arc::new(FaultyStorage::new(MemoryStorage::new()));
    let api = Api::start(faulty.clone(), None).await;
    let (s, _) = api.get("/readyz").await;
    assert_eq!(s, StatusCode::OK);
    faulty.set_outage(true);
    let (s, body) = api.acquire("x", json!({"lease_ms": 1000})).await;
    assert_error(s, &body, StatusCode::SERVICE_UNAVAILABLE, "unavailable");
    let res = api
        .http
        .get(format!("{}/readyz", api.base))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE);
    let res = api
        .http
        .get(format!("{}/healthz", api.base))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::OK, "the process is up");
}

/// A semaphore's limit is written once and read back by every party (`PUT` answers the stored
/// number, not the one sent; bad numbers are 400); `parts` shows the permits held, an RW lock's
/// readers and a fair lock's queue, each part a lock of its own.
#[tokio::test]
async fn semaphore_limits_and_the_parts_of_a_name() {
    let api = Api::memory().await;
    let put = |name: &'static str, permits: Value| {
        let api = &api;
        async move {
            let res = api
                .req(
                    reqwest::Method::PUT,
                    &format!("/v1/locks/{name}/semaphore-limit"),
                )
                .json(&json!({ "permits": permits }))
                .send()
                .await
                .unwrap();
            let status = res.status();
            (status, res.json::<Value>().await.unwrap_or(Value::Null))
        }
    };
    let (s, body) = api.get("/v1/locks/pool/semaphore-limit").await;
    assert_eq!((s, body), (StatusCode::OK, json!({})));
    assert_eq!(
        put("pool", json!(3)).await,
        (StatusCode::OK, json!({"permits": 3}))
    );
    // The first party decided: another number gets the stored one back.
    assert_eq!(
        put("pool", json!(5)).await,
        (StatusCode::OK, json!({"permits": 3}))
    );
    for bad in [json!(0), json!(1025), json!("3")] {
        let (s, body) = put("pool", bad.clone()).await;
        assert_eq!(s, StatusCode::BAD_REQUEST, "{bad}: {body}");
    }
    let (s, body) = api.get("/v1/locks/pool/semaphore-limit").await;
    assert_eq!((s, body), (StatusCode::OK, json!({"permits": 3})));
    // A permit is the lock of its slot.
    let (s, held) = api
        .acquire("pool%2Fpermit%2F1", json!({"lease_ms": 60000}))
        .await;
    assert_eq!(s, StatusCode::OK, "{held}");
    let (s, parts) = api.get("/v1/locks/pool/parts").await;
    assert_eq!(s, StatusCode::OK, "{parts}");
    assert_eq!(parts["semaphore"]["limit"], 3, "{parts}");
    assert_eq!(parts["semaphore"]["held"][0]["slot"], 1, "{parts}");
    assert_eq!(
        parts["semaphore"]["held"][0]["lock"]["name"],
        "pool/permit/1"
    );
    assert_eq!(
        parts["semaphore"]["held"][0]["lock"]["fencing_token"],
        held["fencing_token"]
    );
    assert!(
        parts.get("readers").is_none() && parts.get("queue").is_none(),
        "{parts}"
    );
    // Nothing of the kinds: only the name.
    let (s, parts) = api.get("/v1/locks/plain/parts").await;
    assert_eq!((s, parts), (StatusCode::OK, json!({"name": "plain"})));
    let (s, body) = api.get("/v1/locks/%20/parts").await;
    assert_eq!(s, StatusCode::BAD_REQUEST, "{body}");
}

#[tokio::test]
async fn openapi_describes_every_route_and_requests_carry_ids() {
    let api = Api::memory().await;
    let (s, doc) = api.get("/openapi.json").await;
    assert_eq!(s, StatusCode::OK);
    assert!(
        doc["openapi"].as_str().unwrap().starts_with("3.1"),
        "{}",
        doc["openapi"]
    );
    for path in [
        "/v1/locks",
        "/v1/locks/{name}",
        "/v1/locks/{name}/acquire",
        "/v1/locks/{name}/renew",
        "/v1/locks/{name}/release",
        "/v1/locks/{name}/force-release",
        "/v1/locks/{name}/events",
        "/v1/locks/{name}/semaphore-limit",
        "/v1/locks/{name}/parts",
        "/v1/storage",
    ] {
        assert!(doc["paths"][path].is_object(), "{path} missing");
    }
    let res = api
        .http
        .get(format!("{}/healthz", api.base))
        .header("x-request-id", "abc-123")
        .send()
        .await
        .unwrap();
    assert_eq!(res.headers()["x-request-id"], "abc-123");
    let res = api
        .http
        .get(format!("{}/healthz", api.base))
        .send()
        .await
        .unwrap();
    assert_eq!(res.headers()["x-request-id"].len(), 16);
}

/// A client whose first acquire timed out while the storage was slow retries with the same
/// owner; the first request's grant lands after the retry started. The retry collects the hold
/// and it stays held: the abandoned request must not release what the retry adopted.
#[tokio::test]
async fn an_abandoned_grant_is_left_to_the_owners_retry() {
    let faulty = Arc::new(FaultyStorage::new(MemoryStorage::new()));
    let api = Api::start(faulty.clone(), None).await;
    let owner = "00000000000000000000000000000abc";
    faulty.set_delay(Duration::from_millis(400));
    let first = api
        .http
        .post(format!("{}/v1/locks/retry/acquire", api.base))
        .timeout(Duration::from_millis(100))
        .json(&json!({"lease_ms": 60_000, "owner": owner}))
        .send()
        .await;
    assert!(first.is_err(), "the first attempt timed out on the client");
    tokio::time::sleep(Duration::from_millis(50)).await;
    let (status, hold) = api
        .acquire("retry", json!({"lease_ms": 60_000, "owner": owner}))
        .await;
    assert_eq!(
        status,
        StatusCode::OK,
        "the retry collects the hold: {hold}"
    );
    tokio::time::sleep(Duration::from_millis(1500)).await; // every abandoned call has finished
    faulty.set_delay(Duration::ZERO);
    let (status, renewed) = api
        .post(
            "/v1/locks/retry/renew",
            json!({"owner": owner, "lease_ms": 60_000}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "still held by the owner: {renewed}");
}

#[tokio::test]
async fn list_cursors_are_opaque_and_page_through() {
    let api = Api::memory().await;
    for i in 0..5 {
        api.acquire(&format!("page%2F{i}"), json!({"lease_ms": 60_000}))
            .await;
    }
    let mut seen = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let path = match &cursor {
            Some(c) => format!("/v1/locks?prefix=page%2F&limit=2&cursor={c}"),
            None => "/v1/locks?prefix=page%2F&limit=2".to_owned(),
        };
        let (status, page) = api.get(&path).await;
        assert_eq!(status, StatusCode::OK, "{page}");
        for l in page["locks"].as_array().unwrap() {
            seen.push(l["name"].as_str().unwrap().to_owned());
        }
        match page["next_cursor"].as_str() {
            Some(c) => {
                assert!(!c.contains("page"), "opaque: {c}");
                cursor = Some(c.to_owned());
            }
            None => break,
        }
    }
    assert_eq!(
        seen,
        (0..5).map(|i| format!("page/{i}")).collect::<Vec<_>>()
    );
    let (status, body) = api.get("/v1/locks?cursor=zz").await;
    assert_error(status, &body, StatusCode::BAD_REQUEST, "invalid_query");
}
