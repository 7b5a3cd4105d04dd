//! `GET /api/openapi.json` describes exactly the routes the server serves.

use std::collections::BTreeSet;

use reqwest::StatusCode;
use serde_json::Value;

use crate::helpers::spawn_app;

const METHODS: &[&str] = &[
    "get", "put", "post", "delete", "options", "head", "patch", "trace",
];

/// `(method, path)` of every operation in the document.
fn operations(doc: &Value) -> BTreeSet<(String, String)> {
    let paths = doc["paths"].as_object().expect("paths is an object");
    paths
        .iter()
        .flat_map(|(path, item)| {
            METHODS
                .iter()
                .filter(|m| item.get(**m).is_some())
                .map(move |m| (m.to_string(), path.clone()))
        })
        .collect()
}

async fn document() -> Value {
    let app = spawn_app().await;
    let resp = app.get("/api/openapi.json", None).await;
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(
        resp.headers()["content-type"].to_str().unwrap(),
        "application/json"
    );
    resp.json().await.unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn openapi_document_lists_exactly_the_routes_the_server_registers() {
    let doc = document().await;
    assert!(
        doc["openapi"].as_str().unwrap().starts_with("3.1."),
        "{}",
        doc["openapi"]
    );
    // The list comes from the same tables that register the routes (`routes!`).
    let served: BTreeSet<(String, String)> = stampede::startup::api_routes()
        .into_iter()
        .map(|(m, p)| (m.to_string(), p))
        .collect();
    let described = operations(&doc);
    let missing: Vec<_> = served.difference(&described).collect();
    let extra: Vec<_> = described.difference(&served).collect();
    assert!(
        missing.is_empty() && extra.is_empty(),
        "served but not described: {missing:?}; described but not served: {extra:?}"
    );
    // 6 routes of auth, 34 of sales (the orders' CSV, the rehearsals' cleanup, the
    // admin's console, the waiting room's two and its line controls, a draw's entry,
    // standing, publication, entries' CSV and admin numbers among them), 16 of
    // polls (the reveal, the voter's ballot and the votes' CSV among them), the
    // two proof-of-work challenges (a sale's, a poll's), the document, the three
    // health checks.
    assert_eq!(served.len(), 6 + 34 + 17 + 2 + 1 + 3);
}

#[tokio::test(flavor = "multi_thread")]
async fn every_error_answer_in_the_document_is_the_json_error_body() {
    let doc = document().await;
    let error_ref = "#/components/schemas/ErrorBody";
    let body = &doc["components"]["schemas"]["ErrorBody"];
    assert_eq!(body["required"], serde_json::json!(["error", "message"]));
    for (method, path) in operations(&doc) {
        let responses = doc["paths"][&path][&method]["responses"]
            .as_object()
            .unwrap();
        assert!(
            responses.keys().any(|s| s.starts_with('2')),
            "{method} {path} has no success answer"
        );
        for (status, response) in responses {
            if !(status.starts_with('4') || status.starts_with('5')) || path.starts_with("/readyz")
            {
                continue;
            }
            let schema = &response["content"]["application/json"]["schema"]["$ref"];
            assert_eq!(schema, error_ref, "{method} {path} {status}");
            if status == "503" || status == "429" {
                assert!(
                    response["headers"].get("Retry-After").is_some(),
                    "{method} {path} {status} without Retry-After"
                );
            }
        }
        // Everything under /api but the document itself needs Redis or Postgres.
        if path.starts_with("/api/") && path != "/api/openapi.json" {
            assert!(responses.contains_key("503"), "{method} {path}: no 503");
        }
        if doc["paths"][&path][&method]["security"].is_array() {
            assert!(responses.contains_key("401"), "{method} {path}: no 401");
        }
    }
}
