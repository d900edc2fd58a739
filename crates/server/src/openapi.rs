//! The OpenAPI document, generated from the handlers and DTOs (utoipa).

use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::{Modify, OpenApi};

mod complete;
mod rules;

use crate::routes::{
    agent, callbacks, cloudprnt, epson_sdp, journal_digest, manual, meta, offline, operators, reconcile, render, setup,
    tasks, webhooks,
};

struct Security;

impl Modify for Security {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        // The receipt document's JSON Schema lives with the renderer; it is embedded here
        // as is, so the two can never disagree.
        if let Ok(schema) = serde_json::from_value::<utoipa::openapi::schema::Schema>(
            onceprint_render::schema_with_ref_prefix("#/components/schemas/ReceiptDocument"),
        ) {
            components.schemas.insert("ReceiptDocument".into(), utoipa::openapi::RefOr::T(schema));
        }
        for (name, what) in [
            ("admin", "The admin token (set with --admin-token or generated and printed at first start)."),
            ("tenant", "A tenant API key (from POST /v1/tenants)."),
            ("agent", "A store agent token (from POST /v1/stores/{id}/agent-tokens)."),
            ("operator", "An operator token (`opo_…`, from POST /v1/operator-sessions with the operator's password)."),
        ] {
            components.add_security_scheme(
                name,
                SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).description(Some(what)).build()),
            );
        }
        components.add_security_scheme(
            "printer",
            SecurityScheme::Http(
                HttpBuilder::new()
                    .scheme(HttpAuthScheme::Basic)
                    .description(Some(
                        "A printer's login (the credentials in the answer to POST /v1/printers, or a new one from \
                         POST /v1/printers/{id}/credentials).",
                    ))
                    .build(),
            ),
        );
        components.add_security_scheme(
            "printer_digest",
            SecurityScheme::Http(
                HttpBuilder::new()
                    .scheme(HttpAuthScheme::Digest)
                    .description(Some(
                        "The same printer login by HTTP Digest (RFC 7616, qop=auth, realm \"onceprint\", \
                         SHA-256 or MD5), as Epson's Server Direct Print manual describes: the first request \
                         without credentials is answered 401 with the challenges. Logins made before the broker \
                         offered Digest must be rotated first.",
                    ))
                    .build(),
            ),
        );
    }
}

#[derive(OpenApi)]
#[openapi(
    info(
        title = "onceprint",
        description = "Self-hosted print-task broker: accept any number of retries, print exactly once, lose nothing."
    ),
    paths(
        setup::create_tenant, setup::create_store, setup::list_stores, setup::get_store,
        setup::create_printer, setup::list_printers, setup::get_printer, setup::update_printer,
        setup::disable_printer, setup::enable_printer, setup::rotate_printer_credentials,
        setup::create_station, setup::get_station, setup::update_station,
        setup::create_agent_token, setup::list_agent_tokens, setup::revoke_agent_token,
        setup::create_lan_key, setup::list_lan_keys, setup::revoke_lan_key, setup::get_lan_listener,
        setup::release_lan_listener,
        setup::create_api_key, setup::list_api_keys, setup::revoke_api_key, setup::setup_events,
        tasks::submit, tasks::submit_batch, tasks::get_task, tasks::list_tasks, tasks::task_events,
        agent::poll, agent::acks, agent::status, agent::submit,
        offline::lan_keys, offline::directory, offline::lan_listener, offline::offline_tasks,
        journal_digest::journal_digest,
        operators::create_operator, operators::list_operators, operators::revoke_operator_sessions,
        operators::disable_operator, operators::enable_operator, operators::set_operator_password,
        operators::unlock_operator, operators::create_operator_session, operators::delete_operator_session,
        manual::reprint, manual::mark_printed, manual::cancel, manual::transfer, manual::attention,
        reconcile::get_day, reconcile::post_day,
        webhooks::create, webhooks::list, webhooks::deliveries, webhooks::test,
        callbacks::callback,
        cloudprnt::poll, cloudprnt::get, cloudprnt::delete, cloudprnt::server_setting, epson_sdp::request,
        render::preview, render::task_preview,
        meta::healthz, meta::readyz, meta::metrics, meta::openapi,
    ),
    modifiers(&Security)
)]
pub struct ApiDoc;

/// The whole API as pretty JSON (the default print types, MQTT printers included): what
/// the handlers' annotations say, completed by [`complete::complete`] with the input rules,
/// the answers every operation shares and the links between operations. Built once.
pub fn document_json() -> String {
    static DOCUMENT: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    DOCUMENT.get_or_init(|| build(&onceprint_core::policy::PolicyTable::default(), true)).clone()
}

/// The document a broker serves: its configured print types, and MQTT printers only when
/// it has an MQTT server, so that what the document calls valid is what this broker takes.
pub fn document_json_for(config: &crate::HttpConfig) -> String {
    let mqtt = config.mqtt.is_some();
    if mqtt && config.intake.policies == onceprint_core::policy::PolicyTable::default() {
        document_json()
    } else {
        build(&config.intake.policies, mqtt)
    }
}

fn build(policies: &onceprint_core::policy::PolicyTable, mqtt: bool) -> String {
    let mut doc = match serde_json::to_value(ApiDoc::openapi()) {
        Ok(doc) => doc,
        Err(e) => return format!("{{\"error\":\"{e}\"}}"),
    };
    let print_types: Vec<String> = policies.types.keys().cloned().collect();
    complete::complete(&mut doc, &print_types, mqtt);
    serde_json::to_string_pretty(&doc).unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}"))
}

#[cfg(test)]
mod tests {
    use serde_json::Value;

    /// Routes served but deliberately left out of the document, each with why.
    const UNDOCUMENTED: &[(&str, &str)] = &[
        // The staff console is HTML for people, not an API (docs/CONSOLE.md).
        ("/console", "any"),
    ];

    /// Every `(path, method)` the router declares in `crate::router`, read from its source:
    /// axum keeps no list of its routes, and that function is the one place they are made.
    fn routed() -> Vec<(String, String)> {
        let source = include_str!("lib.rs");
        let start = source.find("pub fn router(").expect("lib.rs declares the router");
        let body = &source[start..];
        let end = body.find("\n}\n").unwrap_or(body.len());
        let mut out = Vec::new();
        for part in body[..end].split(".route(").skip(1) {
            let Some(open) = part.find('"') else { continue };
            let Some(len) = part[open + 1..].find('"') else { continue };
            let path = part[open + 1..open + 1 + len].to_owned();
            // The methods chained on this route, up to the next route or merge.
            let rest = &part[open + 1 + len..];
            let rest = rest.split(".merge(").next().unwrap_or(rest);
            for method in ["get", "post", "put", "patch", "delete"] {
                let called = rest.match_indices(&format!("{method}(")).any(|(i, _)| {
                    i == 0 || !rest[..i].ends_with(|c: char| c.is_ascii_alphanumeric() || c == '_' || c == ':')
                });
                if called {
                    out.push((path.clone(), method.to_owned()));
                }
            }
        }
        out
    }

    /// Every API route the broker serves is in the published document, so that clients
    /// generated from it and the schemathesis run reach all of them. A route added to the
    /// router without its annotation fails here, not in a user's client.
    #[test]
    fn every_route_of_the_router_is_in_the_document() {
        let doc: Value = serde_json::from_str(&super::document_json()).expect("JSON");
        let paths = doc["paths"].as_object().expect("paths");
        let routes = routed();
        assert!(routes.len() > 50, "the router's routes were read: {routes:?}");
        let mut missing = Vec::new();
        for (path, method) in &routes {
            if UNDOCUMENTED.iter().any(|(p, _)| path == p || path.starts_with(&format!("{p}/"))) {
                continue;
            }
            if paths.get(path.as_str()).and_then(|item| item.get(method.as_str())).is_none() {
                missing.push(format!("{} {path}", method.to_uppercase()));
            }
        }
        assert!(missing.is_empty(), "served but not in the OpenAPI document: {missing:?}");
    }
}
