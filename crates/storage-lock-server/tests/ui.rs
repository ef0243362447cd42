//! The web page without a browser (the browser tests are `scripts/ui_test.py`): it renders with
//! JavaScript off, escapes what it shows, needs a sign-in when the server has tokens, and a
//! force-release needs an admin and a valid CSRF token.

use reqwest::StatusCode;
use reqwest::redirect::Policy;
use serde_json::json;
use storage_lock_core::{MemoryStorage, StorageLock};
use storage_lock_server::{Auth, Server, hash_token};

async fn serve(auth: Option<Auth>) -> String {
    let locks = StorageLock::new(MemoryStorage::new()).unwrap();
    let mut server = Server::new(locks);
    if let Some(a) = auth {
        server = server.auth(a);
    }
    server.spawn_on_loopback().await.unwrap()
}

fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .redirect(Policy::none())
        .build()
        .unwrap()
}

#[tokio::test]
async fn the_page_renders_without_javascript_and_escapes_everything() {
    let base = serve(None).await;
    let c = client();
    let note = "<script>alert(1)</script>";
    c.post(format!("{base}/v1/locks/%3Cb%3Ename/acquire"))
        .json(&json!({"lease_ms": 60_000, "note": note}))
        .send()
        .await
        .unwrap();
    let html = c
        .get(format!("{base}/ui"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        html.contains("&lt;script&gt;alert(1)&lt;/script&gt;"),
        "the note is escaped"
    );
    assert!(html.contains("&lt;b&gt;name"), "the name is escaped");
    assert!(!html.contains("<script>alert"), "never raw");
    assert!(
        html.contains("/ui/locks/%3Cb%3Ename"),
        "links encode the name"
    );
    let page = c
        .get(format!("{base}/ui/locks/%3Cb%3Ename"))
        .send()
        .await
        .unwrap();
    assert_eq!(page.status(), StatusCode::OK);
    let html = page.text().await.unwrap();
    assert!(html.contains("&lt;script&gt;alert(1)&lt;/script&gt;"));
    assert!(
        html.contains("Force-release"),
        "without auth everyone is an admin, as in the API"
    );
}

#[tokio::test]
async fn sign_in_is_needed_and_force_release_needs_admin_and_csrf() {
    let toml = format!(
        "[[token]]\nname = \"ops\"\nsha256 = \"{}\"\ngrants = [{{ prefix = \"\", allow = \"admin\" }}]\n\
         [[token]]\nname = \"ro\"\nsha256 = \"{}\"\ngrants = [{{ prefix = \"\", allow = \"read\" }}]\n",
        hash_token("ops-token"),
        hash_token("ro-token")
    );
    let base = serve(Some(Auth::from_toml(&toml).unwrap())).await;
    let c = client();
    let res = c.get(format!("{base}/ui")).send().await.unwrap();
    assert_eq!(res.status(), StatusCode::SEE_OTHER);
    assert_eq!(res.headers()["location"], "/ui/login");
    let res = c
        .post(format!("{base}/ui/login"))
        .form(&[("token", "nope")])
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::UNAUTHORIZED);
    let login = |token: &'static str| {
        let c = c.clone();
        let base = base.clone();
        async move {
            let res = c
                .post(format!("{base}/ui/login"))
                .form(&[("token", token)])
                .send()
                .await
                .unwrap();
            let cookie = res.headers()["set-cookie"].to_str().unwrap().to_owned();
            assert!(
                cookie.contains("HttpOnly") && cookie.contains("SameSite=Strict"),
                "{cookie}"
            );
            assert!(
                !cookie.contains(token),
                "the cookie carries a session id, not the token"
            );
            cookie.split(';').next().unwrap().to_owned()
        }
    };
    let ops = login("ops-token").await;
    let ro = login("ro-token").await;
    c.post(format!("{base}/v1/locks/stuck/acquire"))
        .bearer_auth("ops-token")
        .json(&json!({"lease_ms": 60_000}))
        .send()
        .await
        .unwrap();
    let page = |cookie: String| {
        let c = c.clone();
        let base = base.clone();
        async move {
            c.get(format!("{base}/ui/locks/stuck"))
                .header("cookie", cookie)
                .send()
                .await
                .unwrap()
                .text()
                .await
                .unwrap()
        }
    };
    assert!(
        !page(ro.clone()).await.contains("form id=\"force\""),
        "no button for a reader"
    );
    let html = page(ops.clone()).await;
    assert!(html.contains("form id=\"force\""), "a button for an admin");
    let csrf = html
        .split("name=\"csrf\" value=\"")
        .nth(1)
        .and_then(|s| s.split('"').next())
        .unwrap()
        .to_owned();
    let post = |cookie: String, csrf: String| {
        let c = c.clone();
        let base = base.clone();
        async move {
            c.post(format!("{base}/ui/locks/stuck/force-release"))
                .header("cookie", cookie)
                .form(&[
                    ("csrf", csrf.as_str()),
                    ("expected_fencing_token", "1"),
                    ("confirmed", "yes"),
                ])
                .send()
                .await
                .unwrap()
                .status()
        }
    };
    assert_eq!(
        post(ops.clone(), "forged".into()).await,
        StatusCode::FORBIDDEN,
        "bad CSRF token"
    );
    assert_eq!(
        post(ro.clone(), csrf.clone()).await,
        StatusCode::FORBIDDEN,
        "a reader, even with a stolen form"
    );
    let state = |c: reqwest::Client, base: String| async move {
        let v: serde_json::Value = c
            .get(format!("{base}/v1/locks/stuck"))
            .bearer_auth("ro-token")
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        v["state"].as_str().unwrap().to_owned()
    };
    assert_eq!(
        state(c.clone(), base.clone()).await,
        "held",
        "nothing changed"
    );
    // Without JavaScript the first post asks for confirmation.
    let confirm = c
        .post(format!("{base}/ui/locks/stuck/force-release"))
        .header("cookie", ops.clone())
        .form(&[("csrf", csrf.as_str()), ("expected_fencing_token", "1")])
        .send()
        .await
        .unwrap();
    assert_eq!(confirm.status(), StatusCode::OK);
    assert!(
        confirm
            .text()
            .await
            .unwrap()
            .contains("fencing token <b>1</b>")
    );
    assert_eq!(
        state(c.clone(), base.clone()).await,
        "held",
        "not before confirming"
    );
    assert_eq!(post(ops, csrf).await, StatusCode::SEE_OTHER);
    assert_eq!(state(c.clone(), base.clone()).await, "released");
}

/// A hold renewed many times is "held", not "expiring": the colour is measured against the last
/// renewal, not against the hold's age.
#[tokio::test]
async fn a_renewed_hold_is_not_shown_as_expiring() {
    let base = serve(None).await;
    let c = client();
    c.get(format!("{base}/ui")).send().await.unwrap(); // the page starts following events
    let hold: serde_json::Value = c
        .post(format!("{base}/v1/locks/renewed/acquire"))
        .json(&json!({"lease_ms": 800}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    for _ in 0..12 {
        tokio::time::sleep(std::time::Duration::from_millis(400)).await;
        let res = c
            .post(format!("{base}/v1/locks/renewed/renew"))
            .json(&json!({"owner": hold["owner"], "lease_ms": 800}))
            .send()
            .await
            .unwrap();
        assert_eq!(res.status(), StatusCode::OK);
    }
    // 300 ms after the last renewal: 500 ms of 800 left, but 500 ms of the ~5.6 s the hold is old.
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    let html = c
        .get(format!("{base}/ui"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let row = html
        .split("<tr class=\"")
        .nth(1)
        .and_then(|r| r.split('"').next())
        .unwrap();
    assert_eq!(
        row, "held",
        "renewed 12 times over ~5 s with an 800 ms lease"
    );
}
