//! What the handlers' annotations leave out of the document because every operation of a
//! kind shares it, added in one place so that no operation can forget it:
//!
//! - the error answers that come from the request's shape rather than from the handler:
//!   400 for a body, query or path that does not parse, 413 and 415 for bodies, 401 for
//!   authenticated operations, 429 with `Retry-After` for operations a tenant key or an
//!   agent token calls (the rate limits), 503 when the database is unavailable;
//! - the JSON error body on every 4xx/5xx answer, and a description naming its codes;
//! - the OpenAPI `links` between operations, so that stateful testing (and a reader) can
//!   follow an object from the answer that creates it to the operations that use it.
//!
//! It works on the document as JSON, after utoipa has generated it.

use serde_json::{json, Map, Value};

use super::rules;

const ERROR_BODY: &str = "#/components/schemas/ErrorBody";

/// The description of an error status where the handler gave none.
fn default_description(status: &str) -> &'static str {
    match status {
        "400" => "`invalid_request`: a field, query or path parameter is missing or wrong; the message names it",
        "401" => "`unauthorized`: missing or wrong credentials",
        "403" => "`forbidden`: the credentials do not allow this",
        "404" => "`not_found`: no such object of the caller's tenant",
        "409" => "`conflict`: the object already exists or changed meanwhile",
        "413" => "`payload_too_large`: the body is larger than the broker's limit (`max_body_bytes`, 1 MiB by default)",
        "415" => "`unsupported_media_type`: the body was sent with a `Content-Type` this operation does not take",
        "422" => "`idempotency_mismatch`",
        "429" => "`too_many_requests`: a rate limit; retry after `Retry-After` seconds",
        "503" => "`unavailable`: the database does not answer; retry later",
        _ => "an error",
    }
}

/// Adds the input rules, the answers and the links to `doc`; `print_types` are the
/// broker's configured print types.
pub fn complete(doc: &mut Value, print_types: &[String], mqtt: bool) {
    apply_rules(doc, print_types, mqtt);
    let Some(paths) = doc.get_mut("paths").and_then(Value::as_object_mut) else { return };
    for (path, item) in paths.iter_mut() {
        let Some(item) = item.as_object_mut() else { continue };
        for (method, op) in item.iter_mut() {
            if !matches!(method.as_str(), "get" | "post" | "put" | "patch" | "delete") {
                continue;
            }
            complete_operation(path, op);
        }
    }
    add_media_types(doc);
    add_links(doc);
}

/// The answers and bodies that are not (only) JSON: `(operation id, where, media type,
/// schema)`, `where` being an answer's status or `body` for the request body.
fn media_types() -> Vec<(&'static str, &'static str, &'static str, Value)> {
    let bytes = json!({"type": "string", "format": "binary"});
    let text = json!({"type": "string"});
    vec![
        (
            "get_day",
            "200",
            "text/csv",
            json!({"type": "string", "description": "With `Accept: text/csv`: one `section,item,value` row per fact."}),
        ),
        (
            "post_day",
            "200",
            "text/csv",
            json!({"type": "string", "description": "With `Accept: text/csv`: one `section,item,value` row per fact."}),
        ),
        (
            "post_day",
            "body",
            "text/csv",
            json!({"type": "string", "description": "One biz_no per line (the first column), an optional `biz_no` header line."}),
        ),
        ("post_day", "body", "text/plain", text.clone()),
        ("preview", "200", "image/png", bytes.clone()),
        ("preview", "200", "text/plain", json!({"type": "string", "description": "`format=text`"})),
        (
            "preview",
            "200",
            "application/octet-stream",
            json!({"type": "string", "format": "binary", "description": "`format=escpos`: the ESC/POS bytes"}),
        ),
        (
            "preview",
            "body",
            "text/plain",
            json!({"type": "string", "description": "Cloud markup (`<CB>`, `<BR>`, `<QR>` …)."}),
        ),
        ("task_preview", "200", "image/png", bytes.clone()),
        ("cloudprnt_get_job", "200", "image/png", bytes),
        ("cloudprnt_get_job", "200", "text/plain", text),
    ]
}

fn add_media_types(doc: &mut Value) {
    let Some(paths) = doc.get_mut("paths").and_then(Value::as_object_mut) else { return };
    for (id, at, media, schema) in media_types() {
        let Some(op) = paths
            .values_mut()
            .filter_map(Value::as_object_mut)
            .flat_map(|item| item.values_mut())
            .find(|op| op.get("operationId").and_then(Value::as_str) == Some(id))
        else {
            continue;
        };
        let slot =
            if at == "body" { op.pointer_mut("/requestBody") } else { op.pointer_mut(&format!("/responses/{at}")) };
        let Some(slot) = slot.and_then(Value::as_object_mut) else { continue };
        let content = slot.entry("content").or_insert_with(|| json!({}));
        if let Some(content) = content.as_object_mut() {
            content.insert(media.into(), json!({"schema": schema}));
        }
    }
}

/// Writes [`rules`] into the request schemas and query parameters. A rule for a property
/// or parameter the document does not have is a mistake in the table, caught by the test
/// below.
fn apply_rules(doc: &mut Value, print_types: &[String], mqtt: bool) {
    // The receipt document's JSON Schema as the renderer has it, `$defs` included (utoipa's
    // schema type would drop them and leave its references dangling).
    if let Some(schemas) = doc.pointer_mut("/components/schemas").and_then(Value::as_object_mut) {
        let mut receipt = onceprint_render::schema_with_ref_prefix("#/components/schemas/ReceiptDocument");
        if let Some(r) = receipt.as_object_mut() {
            // The document's own dialect line; the OpenAPI 3.1 document sets the dialect.
            r.remove("$schema");
            r.remove("$id");
        }
        optional_may_be_null(&mut receipt);
        schemas.insert("ReceiptDocument".into(), receipt);
    }
    if let Some(schemas) = doc.pointer_mut("/components/schemas").and_then(Value::as_object_mut) {
        for (name, schema) in rules::components() {
            schemas.insert(name.into(), schema);
        }
    }
    for (schema, keyword, rule) in rules::objects() {
        if let Some(object) = doc.pointer_mut(&format!("/components/schemas/{schema}")) {
            object[keyword] = rule;
        }
    }
    for (schema, property, mut rule) in rules::properties(print_types, mqtt) {
        let Some(slot) = doc.pointer_mut(&format!("/components/schemas/{schema}/properties/{property}")) else {
            continue;
        };
        if rule.get("description").is_none() {
            if let Some(d) = slot.get("description") {
                rule["description"] = d.clone();
            }
        }
        *slot = rule;
    }
    // Path parameters: caller-chosen ids, and the broker's task ids. Another string in the
    // path names nothing and is answered 404 `not_found`.
    for item in doc.get_mut("paths").and_then(Value::as_object_mut).into_iter().flat_map(|p| p.values_mut()) {
        for op in item.as_object_mut().into_iter().flat_map(|i| i.values_mut()) {
            for p in op.get_mut("parameters").and_then(Value::as_array_mut).into_iter().flatten() {
                if p.get("in").and_then(Value::as_str) != Some("path") {
                    continue;
                }
                p["schema"] = match p.get("name").and_then(Value::as_str) {
                    Some("task_id") => rules::task_id(),
                    // Agent token and API key ids are the broker's (`agt_…`, `key_…`), of
                    // the same alphabet.
                    _ => rules::path_id(),
                };
            }
        }
    }
    for (path, name, rule) in rules::query_parameters() {
        let Some(item) = doc.pointer_mut(&format!("/paths/{}", path.replace('/', "~1"))).and_then(Value::as_object_mut)
        else {
            continue;
        };
        for op in item.values_mut() {
            for p in op.get_mut("parameters").and_then(Value::as_array_mut).into_iter().flatten() {
                if p.get("name").and_then(Value::as_str) == Some(name)
                    && p.get("in").and_then(Value::as_str) == Some("query")
                {
                    p["schema"] = rule.clone();
                }
            }
        }
    }
}

fn security_schemes(op: &Value) -> Vec<String> {
    op.get("security")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(Value::as_object)
        .flat_map(|alternative| alternative.keys().cloned())
        .collect()
}

fn complete_operation(path: &str, op: &mut Value) {
    let schemes = security_schemes(op);
    let has_body = op.get("requestBody").is_some();
    let has_params = op.get("parameters").and_then(Value::as_array).is_some_and(|p| !p.is_empty());
    let Some(responses) = op.get_mut("responses").and_then(Value::as_object_mut) else { return };

    let mut statuses: Vec<&str> = Vec::new();
    if has_body || has_params {
        statuses.push("400");
    }
    if has_body {
        statuses.extend(["413", "415"]);
    }
    if !schemes.is_empty() {
        statuses.push("401");
    }
    // The per-tenant and per-agent rate limits guard every /v1 operation a tenant key or
    // an agent token may call (an operator token on the same operation counts against its
    // tenant).
    let limited = path.starts_with("/v1/") && schemes.iter().any(|s| s == "tenant" || s == "agent");
    if limited {
        statuses.push("429");
    }
    // Everything but the process's own liveness and its description reads the database.
    if !matches!(path, "/healthz" | "/openapi.json") {
        statuses.push("503");
    }
    for status in statuses {
        responses.entry(status).or_insert_with(|| json!({}));
    }

    for (status, response) in responses.iter_mut() {
        let is_error = status.starts_with('4') || status.starts_with('5');
        let Some(response) = response.as_object_mut() else { continue };
        if !is_error {
            continue;
        }
        let described = response.get("description").and_then(Value::as_str).is_some_and(|d| !d.is_empty());
        if !described {
            response.insert("description".into(), json!(default_description(status)));
        }
        let content = response.entry("content").or_insert_with(|| json!({}));
        if let Some(content) = content.as_object_mut() {
            if content.is_empty() {
                content.insert("application/json".into(), json!({"schema": {"$ref": ERROR_BODY}}));
            }
        }
        if status == "429" {
            let headers = response.entry("headers").or_insert_with(|| json!({}));
            if let Some(headers) = headers.as_object_mut() {
                headers.insert(
                    "Retry-After".into(),
                    json!({
                        "description": "Seconds to wait before the next request may be taken.",
                        "required": true,
                        "schema": {"type": "integer", "minimum": 0}
                    }),
                );
            }
        }
    }
}

/// The document parser reads a field that is `null` as a field left out
/// (`onceprint_render::doc`): every property an object does not require may be `null`.
fn optional_may_be_null(schema: &mut Value) {
    match schema {
        Value::Object(map) => {
            let required: Vec<String> = map
                .get("required")
                .and_then(Value::as_array)
                .map(|r| r.iter().filter_map(Value::as_str).map(str::to_owned).collect())
                .unwrap_or_default();
            if let Some(Value::Object(props)) = map.get_mut("properties") {
                for (name, prop) in props.iter_mut() {
                    optional_may_be_null(prop);
                    if !required.contains(name) {
                        let original = std::mem::take(prop);
                        *prop = json!({"anyOf": [original, {"type": "null"}]});
                    }
                }
            }
            for (key, value) in map.iter_mut() {
                if key != "properties" {
                    optional_may_be_null(value);
                }
            }
        }
        Value::Array(items) => items.iter_mut().for_each(optional_may_be_null),
        _ => {}
    }
}

/// One link: from the answer `status` of operation `from` (by operation id) to operation
/// `to`, with runtime expressions for its parameters (`path.id`, `query.store_id`,
/// `header.Authorization`) and, optionally, fields of its request body (merged into the
/// body the client would send).
struct LinkSpec {
    from: &'static str,
    status: &'static str,
    name: &'static str,
    to: &'static str,
    parameters: Value,
    body: Option<Value>,
    description: &'static str,
}

fn links() -> Vec<LinkSpec> {
    let task = json!({"path.task_id": "$response.body#/task_id"});
    let mut specs = vec![
        LinkSpec {
            from: "create_tenant",
            status: "201",
            name: "StoresOfTheNewTenant",
            to: "list_stores",
            parameters: json!({"header.Authorization": "Bearer {$response.body#/api_key}"}),
            body: None,
            description: "The new tenant's API key authenticates its calls.",
        },
        LinkSpec {
            from: "create_tenant",
            status: "201",
            name: "KeysOfTheNewTenant",
            to: "list_api_keys",
            parameters: json!({"header.Authorization": "Bearer {$response.body#/api_key}"}),
            body: None,
            description: "The new tenant's API key authenticates its calls.",
        },
        LinkSpec {
            from: "create_api_key",
            status: "201",
            name: "RevokeTheKey",
            to: "revoke_api_key",
            parameters: json!({"path.id": "$response.body#/id"}),
            body: None,
            description: "The key's id names it for revocation.",
        },
        LinkSpec {
            from: "create_webhook",
            status: "201",
            name: "Deliveries",
            to: "webhook_deliveries",
            parameters: json!({"path.id": "$response.body#/id"}),
            body: None,
            description: "The endpoint's delivery attempts.",
        },
        LinkSpec {
            from: "create_operator",
            status: "201",
            name: "EndTheSessions",
            to: "revoke_operator_sessions",
            parameters: json!({"path.id": "$response.body#/id"}),
            body: None,
            description: "Ends every session of the new operator.",
        },
        LinkSpec {
            from: "create_operator_session",
            status: "201",
            name: "Logout",
            to: "delete_operator_session",
            parameters: json!({"header.Authorization": "Bearer {$response.body#/token}"}),
            body: None,
            description: "The operator token ends its own session.",
        },
        LinkSpec {
            from: "create_agent_token",
            status: "201",
            name: "RevokeTheToken",
            to: "revoke_agent_token",
            parameters: json!({"path.id": "$response.body#/store_id", "path.token_id": "$response.body#/id"}),
            body: None,
            description: "The token's id names it for revocation.",
        },
        LinkSpec {
            from: "create_agent_token",
            status: "201",
            name: "PollWithTheToken",
            to: "agent_poll",
            parameters: json!({"header.Authorization": "Bearer {$response.body#/token}"}),
            body: None,
            description: "The agent token authenticates the store agent's polls.",
        },
        LinkSpec {
            from: "create_lan_key",
            status: "201",
            name: "RevokeTheKey",
            to: "revoke_lan_key",
            parameters: json!({"path.id": "$response.body#/store_id", "path.key_id": "$response.body#/id"}),
            body: None,
            description: "The LAN key's id names it for revocation.",
        },
        LinkSpec {
            from: "agent_poll",
            status: "200",
            name: "AckTheFirstDelivery",
            to: "agent_acks",
            parameters: json!({}),
            body: Some(json!({"acks": [{
                "task_id": "$response.body#/deliveries/0/task_id",
                "attempt": "$response.body#/deliveries/0/attempt"
            }]})),
            description: "A delivery is acknowledged with its task id and attempt.",
        },
    ];
    for (to, name) in [
        ("get_store", "GetTheStore"),
        ("create_agent_token", "AgentTokenForTheStore"),
        ("list_agent_tokens", "AgentTokensOfTheStore"),
        ("list_lan_keys", "LanKeysOfTheStore"),
        ("attention", "AttentionListOfTheStore"),
        ("get_day", "ReconciliationOfTheStore"),
        ("post_day", "ReconciliationAgainstExpected"),
    ] {
        specs.push(LinkSpec {
            from: "create_store",
            status: "201",
            name,
            to,
            parameters: json!({"path.id": "$response.body#/id"}),
            body: None,
            description: "The store's id.",
        });
    }
    for (to, name) in [("list_printers", "PrintersOfTheStore"), ("list_tasks", "TasksOfTheStore")] {
        specs.push(LinkSpec {
            from: "create_store",
            status: "201",
            name,
            to,
            parameters: json!({"query.store_id": "$response.body#/id"}),
            body: None,
            description: "The store's id as a filter.",
        });
    }
    specs.push(LinkSpec {
        from: "create_store",
        status: "201",
        name: "PrinterInTheStore",
        to: "create_printer",
        parameters: json!({}),
        body: Some(json!({"store_id": "$response.body#/id"})),
        description: "A printer is registered in a store.",
    });
    for (to, name) in [
        ("get_printer", "GetThePrinter"),
        ("update_printer", "ChangeThePrinter"),
        ("disable_printer", "DisableThePrinter"),
        ("enable_printer", "EnableThePrinter"),
        ("rotate_printer_credentials", "NewLoginForThePrinter"),
    ] {
        specs.push(LinkSpec {
            from: "create_printer",
            status: "201",
            name,
            to,
            parameters: json!({"path.id": "$response.body#/id"}),
            body: None,
            description: "The printer's id.",
        });
    }
    specs.push(LinkSpec {
        from: "create_printer",
        status: "201",
        name: "TaskForThePrinter",
        to: "submit",
        parameters: json!({}),
        body: Some(json!({"printer_id": "$response.body#/id"})),
        description: "A print task sent to the new printer.",
    });
    specs.push(LinkSpec {
        from: "create_printer",
        status: "201",
        name: "StationOfThePrinter",
        to: "create_station",
        parameters: json!({}),
        body: Some(json!({"store_id": "$response.body#/store_id", "printers": ["$response.body#/id"]})),
        description: "A station of the printer's store with the printer as its primary.",
    });
    for (to, name) in [("get_station", "GetTheStation"), ("update_station", "ChangeTheStation")] {
        specs.push(LinkSpec {
            from: "create_station",
            status: "201",
            name,
            to,
            parameters: json!({"path.id": "$response.body#/id"}),
            body: None,
            description: "The station's id.",
        });
    }
    specs.push(LinkSpec {
        from: "create_station",
        status: "201",
        name: "TaskForTheStation",
        to: "submit",
        parameters: json!({}),
        body: Some(json!({"station_id": "$response.body#/id", "printer_id": null})),
        description: "A print task sent to the new station (and so not to a printer).",
    });
    // No link to the task's preview: a task of raw ESC/POS bytes has none (404), so the
    // preview is not something every created task has.
    for status in ["201", "200"] {
        for (to, name) in [
            ("get_task", "GetTheTask"),
            ("task_events", "EventsOfTheTask"),
            ("reprint", "ReprintTheTask"),
            ("mark_printed", "MarkTheTaskPrinted"),
            ("cancel", "CancelTheTask"),
            ("transfer", "TransferTheTask"),
        ] {
            specs.push(LinkSpec {
                from: "submit",
                status,
                name,
                to,
                parameters: task.clone(),
                body: None,
                description: "The task's id.",
            });
        }
    }
    for from in ["reprint", "transfer"] {
        for (to, name) in [("get_task", "GetTheNewTask"), ("task_events", "EventsOfTheNewTask")] {
            specs.push(LinkSpec {
                from,
                status: "201",
                name,
                to,
                parameters: json!({"path.task_id": "$response.body#/created/task_id"}),
                body: None,
                description: "The task the action created.",
            });
        }
    }
    specs
}

fn add_links(doc: &mut Value) {
    let Some(paths) = doc.get_mut("paths").and_then(Value::as_object_mut) else { return };
    for spec in links() {
        let Some(response) = paths
            .values_mut()
            .filter_map(Value::as_object_mut)
            .flat_map(|item| item.values_mut())
            .find(|op| op.get("operationId").and_then(Value::as_str) == Some(spec.from))
            .and_then(|op| op.get_mut("responses"))
            .and_then(|r| r.get_mut(spec.status))
            .and_then(Value::as_object_mut)
        else {
            // A link from an operation or answer that does not exist is a mistake in this
            // table; the snapshot test shows it as a missing link.
            continue;
        };
        let mut link = Map::new();
        link.insert("operationId".into(), json!(spec.to));
        link.insert("description".into(), json!(spec.description));
        if spec.parameters.as_object().is_some_and(|p| !p.is_empty()) {
            link.insert("parameters".into(), spec.parameters);
        }
        if let Some(body) = spec.body {
            link.insert("requestBody".into(), body);
        }
        let links = response.entry("links").or_insert_with(|| json!({}));
        if let Some(links) = links.as_object_mut() {
            links.insert(spec.name.into(), Value::Object(link));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every link names operations of the document, so none is silently dropped.
    #[test]
    fn every_link_joins_two_operations_of_the_document() {
        let doc: Value = serde_json::from_str(&crate::openapi::document_json()).expect("JSON");
        for (schema, property, _) in rules::properties(&[], true) {
            let at = format!("/components/schemas/{schema}/properties/{property}");
            assert!(doc.pointer(&at).is_some(), "rule for {at}, which the document does not have");
        }
        let ids: Vec<&str> = doc["paths"]
            .as_object()
            .into_iter()
            .flat_map(|p| p.values())
            .filter_map(Value::as_object)
            .flat_map(|item| item.values())
            .filter_map(|op| op.get("operationId").and_then(Value::as_str))
            .collect();
        let mut unique = ids.clone();
        unique.sort_unstable();
        unique.dedup();
        assert_eq!(unique.len(), ids.len(), "operation ids are unique: {ids:?}");
        for spec in links() {
            assert!(ids.contains(&spec.from), "link {} from unknown operation {}", spec.name, spec.from);
            assert!(ids.contains(&spec.to), "link {} to unknown operation {}", spec.name, spec.to);
        }
    }
}
