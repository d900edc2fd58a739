//! The set-up calls every bench makes against its fresh broker: a tenant, the store `s1`
//! with its printers, and an agent token. Each must answer 201; anything else ends the
//! run with [`BenchError::Setup`], since nothing measured after a broken set-up means
//! anything.

use hyper::body::Bytes;
use hyper::header::HeaderValue;
use hyper::Method;
use serde_json::{json, Value};

use crate::http::{bearer, snippet, Conn};
use crate::{BenchError, STORE_ID};

/// What a delivery bench needs after set-up: the tenant's key and the store's agent token.
pub struct Deployment {
    pub auth: HeaderValue,
    pub agent_token: String,
}

/// One set-up POST that must answer 201; returns the answer's JSON.
pub async fn setup_call(conn: &mut Conn, auth: &HeaderValue, path: &str, body: Value) -> Result<Value, BenchError> {
    let step = format!("POST {path} {body}");
    let (status, answer) = conn
        .request(Method::POST, path, auth, Some(Bytes::from(body.to_string())))
        .await
        .map_err(|detail| BenchError::Http { context: format!("set-up ({step})"), detail })?;
    if status.as_u16() != 201 {
        return Err(BenchError::Setup { step, status: status.as_u16(), body: snippet(&answer, 500) });
    }
    Ok(serde_json::from_slice(&answer).unwrap_or(Value::Null))
}

/// Creates tenant `bench` with the admin token; returns its API key as a header.
pub async fn tenant(conn: &mut Conn, admin_token: &str) -> Result<HeaderValue, BenchError> {
    let admin = bearer(admin_token).map_err(BenchError::InvalidOptions)?;
    let tenant = setup_call(conn, &admin, "/v1/tenants", json!({"id": "bench", "name": "Bench"})).await?;
    let api_key = tenant.get("api_key").and_then(Value::as_str).ok_or_else(|| BenchError::Protocol {
        context: "creating the tenant".into(),
        detail: format!("no api_key in {tenant}"),
    })?;
    bearer(api_key).map_err(|m| BenchError::Protocol { context: "creating the tenant".into(), detail: m })
}

/// Creates store [`STORE_ID`] and printers `p0…` with the given agent transport
/// addresses (`tcp://HOST:PORT`), in order.
pub async fn store_and_printers(conn: &mut Conn, auth: &HeaderValue, addresses: &[String]) -> Result<(), BenchError> {
    setup_call(conn, auth, "/v1/stores", json!({"id": STORE_ID, "name": "Bench store"})).await?;
    for (p, address) in addresses.iter().enumerate() {
        let body = json!({"id": format!("p{p}"), "store_id": STORE_ID, "name": format!("Bench printer {p}"),
                          "transport": {"kind": "agent", "address": address}});
        setup_call(conn, auth, "/v1/printers", body).await?;
    }
    Ok(())
}

/// Tenant, store, printers at `addresses` and an agent token for the store.
pub async fn deploy(conn: &mut Conn, admin_token: &str, addresses: &[String]) -> Result<Deployment, BenchError> {
    let auth = tenant(conn, admin_token).await?;
    store_and_printers(conn, &auth, addresses).await?;
    let answer = setup_call(conn, &auth, &format!("/v1/stores/{STORE_ID}/agent-tokens"), json!({})).await?;
    let agent_token = answer.get("token").and_then(Value::as_str).map(str::to_string).ok_or_else(|| {
        BenchError::Protocol { context: "creating the agent token".into(), detail: format!("no token in {answer}") }
    })?;
    Ok(Deployment { auth, agent_token })
}
