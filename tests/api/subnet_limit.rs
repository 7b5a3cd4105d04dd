//! The `subnet` rate-limit subject (issue 52): a policy that counts the client's
//! network (IPv4 /24, IPv6 /56, told behind a trusted proxy as for `ip`), on a
//! route checked by the limiter (join, sign-up) and on one checked inside its
//! decision script (the vote).

use reqwest::StatusCode;
use serde_json::json;

use crate::helpers::{TestApp, User, limits, spawn_app_with, window_policy};
use crate::waiting_room::waiting_room_sale;

/// Two per network a minute on `route`, the test client a trusted proxy.
async fn two_per_network_on(route: &str) -> TestApp {
    spawn_app_with(|c| {
        c.limits = limits(&[window_policy(
            "net",
            route,
            "subnet",
            "sliding_counter",
            2,
            60_000,
        )]);
        c.trusted_proxies = vec!["127.0.0.1".parse().unwrap()];
    })
    .await
}

async fn post_from(
    app: &TestApp,
    path: &str,
    user: Option<&User>,
    from: &str,
    body: serde_json::Value,
) -> StatusCode {
    let mut req = app
        .client
        .post(app.url(path))
        .header("x-forwarded-for", from)
        .json(&body);
    if let Some(user) = user {
        req = req.bearer_auth(&user.token);
    }
    req.send().await.unwrap().status()
}

/// Each address in `froms`, by a user of its own, with the status expected.
async fn each_from(
    app: &TestApp,
    path: &str,
    body: serde_json::Value,
    froms: &[(&str, StatusCode)],
) {
    for (from, expected) in froms {
        let user = app.user().await;
        let got = post_from(app, path, Some(&user), from, body.clone()).await;
        assert_eq!(got, *expected, "from {from}");
    }
}

#[tokio::test]
async fn a_network_shares_the_join_budget_and_another_network_does_not() {
    let app = two_per_network_on("join").await;
    let admin = app.admin().await;
    let sale = waiting_room_sale(&app, &admin, 5, 60_000, 10).await;
    let path = format!("/api/sales/{sale}/queue");
    use StatusCode as S;
    each_from(
        &app,
        &path,
        json!({}),
        &[
            ("203.0.113.1", S::OK),
            ("203.0.113.2", S::OK),
            ("203.0.113.250", S::TOO_MANY_REQUESTS),
            ("203.0.114.1", S::OK),
            ("2001:db8:1:100::1", S::OK),
            ("2001:db8:1:1ff::7", S::OK),
            ("2001:db8:1:1aa::9", S::TOO_MANY_REQUESTS),
            ("2001:db8:1:200::1", S::OK),
            // The machine itself is no network: loopback meets no subnet policy.
            ("127.0.0.1", S::OK),
            ("127.0.0.1", S::OK),
            ("127.0.0.1", S::OK),
        ],
    )
    .await;
    // The refused joiners hold no place: 6 by networks, 3 from loopback.
    let waiting: i64 = app
        .redis_query(redis::cmd("ZCARD").arg(app.sale_keys(sale).queue))
        .await;
    assert_eq!(waiting, 9);
}

#[tokio::test]
async fn a_network_shares_the_vote_budget_inside_the_vote_script() {
    let app = two_per_network_on("vote").await;
    let admin = app.admin().await;
    let (poll, options) = app.open_poll(&admin, "Q?", &["A", "B"]).await;
    let path = format!("/api/polls/{poll}/votes");
    use StatusCode as S;
    each_from(
        &app,
        &path,
        json!({ "option_id": options[0] }),
        &[
            ("198.51.100.1", S::ACCEPTED),
            ("198.51.100.2", S::ACCEPTED),
            ("198.51.100.3", S::TOO_MANY_REQUESTS),
            ("198.51.101.3", S::ACCEPTED),
        ],
    )
    .await;
    assert_eq!(app.poll_results(poll).await["voters"], 3);
}

#[tokio::test]
async fn a_network_shares_the_sign_up_budget() {
    let app = two_per_network_on("signup").await;
    use StatusCode as S;
    for (n, (from, expected)) in [
        ("192.0.2.1", S::CREATED),
        ("192.0.2.77", S::CREATED),
        ("192.0.2.200", S::TOO_MANY_REQUESTS),
        ("192.0.3.1", S::CREATED),
    ]
    .into_iter()
    .enumerate()
    {
        let creds = json!({ "username": format!("net_{n}"), "password": "correct horse battery" });
        let got = post_from(&app, "/api/auth/signup", None, from, creds).await;
        assert_eq!(got, expected, "from {from}");
    }
}
