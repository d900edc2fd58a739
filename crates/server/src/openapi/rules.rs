//! The rules the broker checks on its input, written into the document's request schemas:
//! id alphabets and lengths, non-empty names, enums, integer bounds, which of a transport's
//! or a content's fields go together. The DTOs carry plain `String`s and `Value`s (the
//! engine and the renderer own the checks and their messages); this table says in JSON
//! Schema what those checks accept, so that a request valid by the document is one the
//! broker takes.
//!
//! Lengths are characters on both sides, as `maxLength` counts them. Rules between fields
//! are written as `oneOf` (a target, an operator's role, a transport's kind). What JSON
//! Schema cannot say is in the descriptions and in the 4xx the operations list: a reference
//! to an object that does not exist (a `store_id` that is not a store of the tenant) is
//! 404 `not_found`, as a path naming one is; the receipt document's layout and a content
//! the target printer cannot print are 400 `invalid_content`.

use serde_json::{json, Value};

/// Caller-chosen ids (docs/API.md): 1–64 characters of `A-Za-z0-9._:-`.
pub fn id() -> Value {
    json!({"type": "string", "minLength": 1, "maxLength": 64, "pattern": "^[A-Za-z0-9._:-]+$"})
}

/// An id in a path: `.` and `..` are ids, but as path segments they are taken apart by
/// every HTTP client (RFC 3986 dot segments), so they cannot be addressed there.
pub fn path_id() -> Value {
    json!({"type": "string", "minLength": 1, "maxLength": 64, "pattern": "^(?!\\.{1,2}$)[A-Za-z0-9._:-]+$"})
}

/// A task id: 26 characters of Crockford's base32.
pub fn task_id() -> Value {
    json!({"type": "string", "pattern": "^[0-9A-HJKMNP-TV-Z]{26}$"})
}

/// White space as the broker's checks see it (Rust's `char::is_whitespace`, Unicode's
/// White_Space), as the body of a character class. `\s` is not used: its meaning differs
/// between regex dialects (ECMAScript's takes U+FEFF and leaves out U+0085, Python's differs
/// again), so a string could be blank to the document and not to the broker.
const WHITE_SPACE: &str = "\\t-\\r \\u0085\\u00a0\\u1680\\u2000-\\u200a\\u2028\\u2029\\u202f\\u205f\\u3000";

/// Control characters as the broker's checks see them (Rust's `char::is_control`: C0, DEL,
/// C1), as the body of a character class.
const CONTROL: &str = "\\u0000-\\u001f\\u007f-\\u009f";

/// Not blank and without control characters.
fn not_blank() -> String {
    format!("^[^{CONTROL}]*[^{WHITE_SPACE}{CONTROL}][^{CONTROL}]*$")
}

/// Text that must say something: not blank, no control characters, at most `max`
/// characters (the broker counts characters too, as `maxLength` does).
fn text(max: usize) -> Value {
    json!({"type": "string", "minLength": 1, "maxLength": max, "pattern": not_blank()})
}

fn with_description(mut schema: Value, description: &str) -> Value {
    schema["description"] = json!(description);
    schema
}

fn nullable(mut schema: Value) -> Value {
    if let Some(t) = schema.get("type").and_then(Value::as_str) {
        schema["type"] = json!([t, "null"]);
    }
    schema
}

fn name() -> Value {
    with_description(text(200), "1–200 characters without control characters, not blank.")
}

fn profile() -> Value {
    let mut names: Vec<Value> = onceprint_render::Profile::builtin_names().into_iter().map(Value::from).collect();
    names.push(Value::Null);
    json!({
        "type": ["string", "null"],
        "enum": names,
        "description": "A built-in render profile: paper width (58 or 80 mm) and character encoding.",
    })
}

/// Base64 (standard alphabet, padded, canonical: the unused bits of the last character are
/// zero), of at least one byte.
fn base64() -> Value {
    json!({
        "type": "string",
        "minLength": 4,
        "pattern": "^(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{4}|[A-Za-z0-9+/][AQgw]==|[A-Za-z0-9+/]{2}[AEIMQUYcgkosw048]=)$",
    })
}

/// A print task's content, one object per `type`.
pub fn content() -> Value {
    let object = |kind: &str, field: &str, schema: Value| {
        json!({
            "type": "object",
            "additionalProperties": false,
            "required": ["type", field],
            "properties": {"type": {"type": "string", "enum": [kind]}, field: schema},
        })
    };
    json!({
        "description": "What to print. Its decoded size is at most 256 KiB (`content_max_bytes`): larger content is \
            400 `invalid_request`. A document that breaks a rule of the receipt document beyond its JSON Schema, \
            or content the target printer cannot print (raw `escpos` to a printer that takes rendered receipts), \
            is 400 `invalid_content`.",
        "oneOf": [
            object("text", "text", json!({"type": "string", "minLength": 1})),
            object("escpos", "data", base64()),
            object("doc", "doc", json!({"$ref": "#/components/schemas/ReceiptDocument"})),
            object("markup", "markup", json!({"type": "string", "pattern": format!("[^{WHITE_SPACE}]")})),
        ],
    })
}

fn tcp_port() -> &'static str {
    "(?:[1-9][0-9]{0,3}|[1-5][0-9]{4}|6[0-4][0-9]{3}|65[0-4][0-9]{2}|655[0-2][0-9]|6553[0-5])"
}

/// A printer's transport, one object per `kind`; the `mqtt` kinds only where the broker
/// has an MQTT server (`serve --mqtt-url`): elsewhere they are refused with 400.
pub fn transport(mqtt: bool) -> Value {
    // 2–1024 characters, the leading `/` included.
    let device_path = format!("/[^{WHITE_SPACE}{CONTROL}?#]{{1,1023}}");
    let bauds = "(?:1200|2400|4800|9600|19200|38400|57600|115200|230400|460800|921600)";
    let address = format!(
        "^(?:tcp://[A-Za-z0-9._\\[\\]:-]{{1,253}}:{port}|usb://{device_path}|serial://{device_path}(?:\\?baud={bauds}(?:&flow=rtscts)?|\\?flow=rtscts)?)$",
        port = tcp_port(),
    );
    let url = json!({"type": "string", "maxLength": 2000, "pattern": format!("^https?://[^{WHITE_SPACE}]*$")});
    let mac = json!({"type": "string", "pattern": "^[0-9A-Fa-f]{2}(?::[0-9A-Fa-f]{2}){5}$"});
    let device_id = json!({"type": "string", "minLength": 1, "maxLength": 64, "pattern": "^[A-Za-z0-9._:-]+$"});
    let poll = json!({"type": ["integer", "null"], "minimum": 1, "maximum": 3600,
        "description": "Seconds between the printer's polls, as set on the printer (default 5)."});
    let kind = |k: &str| json!({"type": "string", "enum": [k]});
    let mut kinds = vec![
        json!({
            "title": "agent",
            "description": "A store agent prints to the printer: raw TCP 9100, a USB printer device or a serial port.",
            "type": "object", "additionalProperties": false, "required": ["kind", "address"],
            "properties": {
                "kind": kind("agent"),
                "address": {"type": "string", "maxLength": 1100, "pattern": address,
                    "description": "`tcp://HOST:PORT`, `usb:///PATH` or `serial:///PATH[?baud=N][&flow=rtscts]`, \
                        as seen from the store agent's machine (paths of 2–1024 characters)."},
                "profile": profile(),
            },
        }),
        json!({
            "title": "webhook",
            "description": "The broker pushes jobs to an HTTP endpoint.",
            "type": "object", "additionalProperties": false, "required": ["kind", "url", "secret"],
            "properties": {
                "kind": kind("webhook"),
                "url": url.clone(),
                "secret": {"type": "string", "minLength": 16, "maxLength": 500,
                    "description": "Signs jobs and callbacks: 16–500 characters."},
                "status_url": nullable(url.clone()),
                "profile": profile(),
            },
        }),
        json!({
            "title": "cloudprnt",
            "description": "A Star CloudPRNT printer polling `/cloudprnt`.",
            "type": "object", "additionalProperties": false, "required": ["kind", "mac"],
            "properties": {"kind": kind("cloudprnt"), "mac": mac.clone(), "poll_interval_s": poll.clone(), "profile": profile()},
        }),
        json!({
            "title": "epson_sdp",
            "description": "An Epson printer using Server Direct Print at `/epson-sdp`.",
            "type": "object", "additionalProperties": false, "required": ["kind"],
            "properties": {"kind": kind("epson_sdp"), "printer_id": nullable(device_id.clone()), "poll_interval_s": poll,
                "profile": profile()},
        }),
    ];
    if mqtt {
        kinds.extend([
            json!({
                "title": "mqtt (Star CloudPRNT)",
                "description": "A Star CloudPRNT Version MQTT printer. Needs `serve --mqtt-url` (else 400), and a MAC \
                    no other printer of the broker has (else 400).",
                "type": "object", "additionalProperties": false, "required": ["kind", "protocol", "mac"],
                "properties": {"kind": kind("mqtt"), "protocol": {"type": "string", "enum": ["cloudprnt"]},
                    "mac": mac, "profile": profile()},
            }),
            json!({
                "title": "mqtt (onceprint)",
                "description": "A device speaking onceprint's MQTT protocol. Needs `serve --mqtt-url` (else 400), and \
                    a device id no other printer of the broker has (else 400).",
                "type": "object", "additionalProperties": false, "required": ["kind", "protocol", "device_id"],
                "properties": {"kind": kind("mqtt"), "protocol": {"type": "string", "enum": ["onceprint"]},
                    "device_id": device_id, "profile": profile()},
            }),
        ]);
    }
    json!({"description": "How the broker reaches the printer.", "oneOf": kinds})
}

/// A store's time zone: a name of the bundled IANA database, a fixed offset of at most 14
/// hours, or UTC.
fn timezone() -> Value {
    let mut names = onceprint_engine::tz::names();
    names.extend(["".into(), "Z".into(), "UTC".into()]);
    json!({
        "description": "An IANA name of the broker's bundled time zone database (`Asia/Shanghai`), a fixed \
            offset `±HH:MM` of at most 14 hours (`+08:00`), or UTC (`UTC`, `Z`, empty, or no field). Names are \
            matched without regard to case.",
        "anyOf": [
            {"type": "string", "enum": names},
            {"type": "string", "pattern": "^[+-](?:(?:0?[0-9]|1[0-3]):[0-5][0-9]|14:00)$"},
            {"type": "null"},
        ],
    })
}

/// `(component schema, property, schema)`: each property's schema is replaced by this one
/// (its description kept where this one has none).
pub fn properties(print_types: &[String], mqtt: bool) -> Vec<(&'static str, &'static str, Value)> {
    let print_type = || {
        json!({"type": ["string", "null"], "enum": print_types.iter().map(|t| json!(t)).chain([Value::Null]).collect::<Vec<_>>(),
            "description": "One of the broker's configured print types (default `receipt`); joins the idempotency \
                key and selects the retry policy and priority."})
    };
    let ids = || json!({"type": "array", "items": id(), "minItems": 1, "maxItems": 16, "uniqueItems": true});
    let agent_id = || with_description(id(), "The agent's stable id (1–64 characters of `A-Za-z0-9._:-`).");
    let session = || nullable(id());
    vec![
        ("CreateTenant", "id", id()),
        ("CreateTenant", "name", name()),
        ("CreateStore", "id", id()),
        ("CreateStore", "name", name()),
        ("CreateStore", "timezone", timezone()),
        ("CreatePrinter", "id", id()),
        ("CreatePrinter", "store_id", with_description(id(), "A store of the tenant (else 404 `not_found`).")),
        ("CreatePrinter", "name", nullable(name())),
        ("CreatePrinter", "transport", transport(mqtt)),
        ("UpdatePrinter", "name", nullable(name())),
        ("UpdatePrinter", "transport", json!({"anyOf": [transport(mqtt), {"type": "null"}]})),
        ("UpdatePrinter", "store_id", with_description(nullable(id()), "The printer's store, where it is looked up: \
            a printer stays in the store it was registered in, so in any other store (or one that does not exist) \
            there is no such printer (404 `not_found`).")),
        ("SwitchIn", "operator", with_description(text(200), "Who: 1–200 characters, not blank.")),
        ("SwitchIn", "reason", with_description(text(2000), "Why: 1–2000 characters, not blank.")),
        ("CreateStation", "id", id()),
        ("CreateStation", "store_id", with_description(id(), "A store of the tenant (else 404 `not_found`).")),
        ("CreateStation", "printers", with_description(ids(), "Printers of the station's store, the primary first \
            (a printer that is not one of that store's is 404 `not_found`).")),
        ("UpdateStation", "printers", with_description(ids(), "Printers of the station's store, the primary first \
            (a printer that is not one of that store's is 404 `not_found`).")),
        ("SubmitTask", "biz_no", with_description(
            json!({"type": "string", "minLength": 1, "maxLength": 128, "pattern": not_blank()}),
            "The business number (order number, serial…): required, not blank (else 400 `missing_biz_no`, before \
             anything else is checked), at most 128 characters, no control characters.",
        )),
        ("SubmitTask", "printer_id", with_description(nullable(id()), "A printer of the tenant (else 404 `not_found`).")),
        ("SubmitTask", "station_id", with_description(nullable(id()), "A station of the tenant (else 404 `not_found`).")),
        ("SubmitTask", "print_type", print_type()),
        ("SubmitTask", "content", content()),
        ("ActionIn", "operator", action_operator()),
        ("ActionIn", "reason", action_reason()),
        ("ActionIn", "printer_id", with_description(nullable(id()), "For `reprint`: another printer of the task's \
            store to print the copy on (a printer that is not one of that store's is 404 `not_found`).")),
        ("TransferIn", "operator", action_operator()),
        ("TransferIn", "reason", action_reason()),
        ("TransferIn", "printer_id", with_description(id(), "The printer of the task's store to print on instead (a \
            printer that is not one of that store's is 404 `not_found`; the task's own printer is 409 \
            `invalid_transition`).")),
        ("PollIn", "agent_id", agent_id()),
        ("PollIn", "session", session()),
        ("PollIn", "wait_ms", json!({"type": ["integer", "null"], "minimum": 0, "maximum": u64::MAX,
            "description": "Long-poll wait in milliseconds (default 25000); longer waits are cut to 60000."})),
        ("PollIn", "max", json!({"type": ["integer", "null"], "minimum": 0, "maximum": u32::MAX,
            "description": "Most deliveries in one answer (default 16); taken as 1–256."})),
        ("PollIn", "session_age_ms", json!({"type": ["integer", "null"], "minimum": 0, "maximum": u64::MAX,
            "description": "Extension (agent protocol 3): how long this agent process has been running, in \
                milliseconds of its monotonic clock. Of two sessions of one agent id the one that started later on \
                the broker's clock (first heard, less this age) is the newer; the agent's wall clock never counts. \
                Without it, a session starts when the broker first hears it."})),
        // Any item is part of a valid batch: each is checked as the body of a single
        // submission (`SubmitTask`) and a bad one is refused in its own result (400 in
        // `results`), not by refusing the batch, whose other items go on.
        ("SubmitBatch", "tasks", json!({"type": "array", "minItems": 1, "maxItems": crate::routes::tasks::MAX_BATCH,
            "items": {"description": "The body of `POST /v1/print-tasks` (schema `SubmitTask`). An item that is \
                not a valid one is answered in its own result (status 400, as that endpoint would answer it), and \
                the batch's other items go on."}})),
        ("AcksIn", "acks", json!({"type": "array", "maxItems": 1000, "items": {"$ref": "#/components/schemas/AckIn"}})),
        ("AcksIn", "agent_id", nullable(id())),
        ("AcksIn", "session", session()),
        ("AcksIn", "next", json!({"type": ["integer", "null"], "minimum": 0, "maximum": u32::MAX,
            "description": "Extension (agent protocol 2): hand out with the answer the next task of each printer \
                whose task in flight these acks end, at most this many (taken as 0–256; 0 or absent: none); the \
                answer then carries `deliveries`."})),
        ("AckIn", "outcome", json!({"type": "string", "enum": onceprint_core::Outcome::ALL.map(onceprint_core::Outcome::as_str)})),
        ("StatusIn", "agent_id", agent_id()),
        ("StatusIn", "session", session()),
        ("StatusIn", "printers", json!({"type": "array", "maxItems": onceprint_engine::printer_watch::MAX_REPORTS,
            "items": {"$ref": "#/components/schemas/PrinterStatusIn"}})),
        ("PrinterStatusIn", "status", json!({"type": "string", "enum": ["ready", "no_paper", "cover_open", "paper_jam", "offline"]})),
        // Offline operation. What the broker refuses per task with a `rejected`
        // result (200) stays plain here: a report the broker cannot take is answered, not
        // refused, so that the agent stops sending it. What refuses the whole request is
        // in the schema.
        ("CreateLanKey", "id", nullable(id())),
        ("LanListenerClaim", "agent_id", agent_id()),
        ("OfflineTasksIn", "agent_id", agent_id()),
        ("OfflineTasksIn", "session", session()),
        // A task that is not a valid `OfflineTaskIn` but names itself is answered `rejected`
        // with the reason inside the 200, so that the agent stops sending it; only an item
        // without a `task_id` to answer under fails the whole request.
        ("OfflineTasksIn", "tasks", json!({"type": "array", "maxItems": onceprint_engine::offline::MAX_TASKS,
            "items": {"anyOf": [
                {"$ref": "#/components/schemas/OfflineTaskIn"},
                {"title": "a task the broker rejects", "type": "object", "required": ["task_id"],
                    "properties": {"task_id": {"type": "string"}},
                    "description": "Any other object with a `task_id`: answered `rejected`, with the reason, in the \
                        200."},
            ]}})),
        ("OfflineTaskIn", "content", content()),
        // Integers out of the 64-bit range cannot even be read (400 for the whole request),
        // so the document bounds them; inside the range the broker judges each task.
        ("OfflineTaskIn", "accepted_at", json!({"type": "integer", "minimum": 0, "maximum": i64::MAX,
            "description": "When the agent accepted it (milliseconds since the epoch): the task's creation time, \
                its business day and the time of its charge."})),
        ("OfflineTaskIn", "age_ms", json!({"type": ["integer", "null"], "minimum": i64::MIN, "maximum": i64::MAX,
            "description": "How long before this upload the agent accepted the task, in milliseconds, by a clock \
                that no setting of the wall clock moves (the machine's time since boot), when the agent knows it \
                (agent protocol 4): the broker then places the acceptance on its own clock exactly. A value \
                outside 0 to a year is ignored. Optional."})),
        ("OfflineTaskIn", "attempts", json!({"type": ["integer", "null"], "minimum": 0, "maximum": 1000,
            "description": "Attempts the agent made (default 0)."})),
        ("JournalRecordIn", "at", json!({"type": "integer", "minimum": 0, "maximum": i64::MAX,
            "description": "Milliseconds since the epoch, by the agent's clock."})),
        ("JournalRecordIn", "attempt", json!({"type": ["integer", "null"], "minimum": 0, "maximum": i32::MAX})),
        ("JournalDigestIn", "agent_id", agent_id()),
        ("JournalDigestIn", "session", session()),
        ("JournalDigestIn", "records", json!({"type": "array", "maxItems": onceprint_engine::device_log::MAX_RECORDS,
            "items": {"$ref": "#/components/schemas/DigestRecordIn"}})),
        ("DigestRecordIn", "task_id", task_id()),
        ("DigestRecordIn", "key", with_description(text(onceprint_engine::device_log::MAX_KEY_LEN),
            "The idempotency key the job carried: 1–1024 characters without control characters, not blank.")),
        ("DigestRecordIn", "printer_id", id()),
        ("DigestRecordIn", "state", json!({"type": "string",
            "enum": onceprint_store::DeviceLogState::ALL.map(onceprint_store::DeviceLogState::as_str)})),
        ("DigestRecordIn", "at", json!({"type": "integer", "minimum": 0, "maximum": i64::MAX,
            "description": "When the agent journaled the record: milliseconds since the epoch, by its clock."})),
        ("CreateWebhook", "id", id()),
        ("CreateWebhook", "url", json!({"type": "string", "maxLength": 2000,
            "pattern": format!("^https?://[^{WHITE_SPACE}]*$")})),
        ("CreateWebhook", "events", json!({"type": "array", "minItems": 1,
            "items": {"type": "string", "enum": onceprint_engine::alerts::EVENT_KINDS}})),
        ("CreateWebhook", "secret", json!({"type": ["string", "null"], "minLength": 16,
            "description": "The signing secret (at least 16 characters). For `onceprint`, generated when absent; \
                for a chat group bot, the bot's own signing secret when it has one, else left out."})),
        ("CreateWebhook", "format", json!({"type": ["string", "null"],
            "enum": onceprint_engine::alerts::AlertFormat::NAMES.iter().map(|n| json!(n)).chain([Value::Null]).collect::<Vec<_>>(),
            "description": "How events are written: `onceprint` (default; the signed event as JSON) or a chat group \
                bot's text message: `wecom`, `dingtalk`, `feishu`, `slack`."})),
        ("OperatorPassword", "password", json!({"type": "string", "minLength": 10, "maxLength": 256,
            "description": "10–256 characters. Kept only as an argon2id hash; every session of the operator ends."})),
        ("EpsonSdpRequest", "ConnectionType", json!({"type": "string", "enum": ["GetRequest", "SetResponse"]})),
        ("EpsonSdpRequest", "ID", with_description(nullable(id()),
            "The ID set in the printer's Web Config: the printer's `printer_id` where one is configured (else 401).")),
    ]
}

/// Who takes a manual action.
fn action_operator() -> Value {
    with_description(
        nullable(text(100)),
        "Who acts: 1–100 characters, not blank. With a tenant API key it is recorded beside the key (leave it out \
         when no person acts); with an operator token it may only be the token's own operator id (else 403).",
    )
}

fn action_reason() -> Value {
    with_description(text(500), "Why: 1–500 characters, not blank.")
}

/// Whole schemas the document gets from here: `(component name, schema)`. A new operator
/// is one of two shapes by its `role`: a staff member names the stores they work in, a
/// manager none (they see every store).
pub fn components() -> Vec<(&'static str, Value)> {
    let operator = |role: &str, stores: Value, required: &[&str]| {
        json!({
            "type": "object",
            "additionalProperties": false,
            "required": required,
            "properties": {
                "id": with_description(id(), "The login name, unique in the tenant."),
                "name": with_description(nullable(name()), "The name people see (defaults to the id)."),
                "role": {"type": "string", "enum": [role]},
                "stores": stores,
                "password": {"type": "string", "minLength": 10, "maxLength": 256,
                    "description": "10–256 characters. Kept only as an argon2id hash."},
            },
        })
    };
    let schema = |name: &str| format!("#/components/schemas/{name}");
    vec![
        (
            "CreateOperator",
            json!({
                "description": "A new operator account: a `staff` member, who sees and acts on only their `stores`, \
                    or a `manager`, who sees every store of the tenant and creates operators in the console.",
                "oneOf": [{"$ref": schema("CreateStaffOperator")}, {"$ref": schema("CreateManager")}],
                "discriminator": {"propertyName": "role", "mapping": {
                    "staff": schema("CreateStaffOperator"), "manager": schema("CreateManager"),
                }},
            }),
        ),
        (
            "CreateStaffOperator",
            operator(
                "staff",
                json!({"type": "array", "items": id(), "minItems": 1, "maxItems": 64,
                    "description": "The stores the staff member works in: 1–64 stores of the tenant (one that is \
                        not is 404 `not_found`)."}),
                &["id", "role", "stores", "password"],
            ),
        ),
        (
            "CreateManager",
            operator(
                "manager",
                json!({"type": ["array", "null"], "maxItems": 0,
                    "description": "A manager sees every store: left out, `null` or empty."}),
                &["id", "role", "password"],
            ),
        ),
    ]
}

/// Query parameters: `(path, name, schema)`.
pub fn query_parameters() -> Vec<(&'static str, &'static str, Value)> {
    let limit = json!({"type": "integer", "minimum": 1, "maximum": 500, "default": 50});
    let states = onceprint_core::TaskState::ALL.map(onceprint_core::TaskState::as_str);
    vec![
        ("/v1/print-tasks", "limit", limit.clone()),
        (
            "/v1/print-tasks",
            "state",
            json!({"type": "string", "enum": states.iter().copied().chain([""]).collect::<Vec<_>>()}),
        ),
        (
            "/v1/print-tasks",
            "cursor",
            json!({"type": "string", "pattern": "^(?:[0-9A-HJKMNP-TV-Z]{26})?$",
            "description": "The `next_cursor` of the previous page."}),
        ),
        ("/v1/setup-events", "limit", limit),
        (
            "/v1/render/preview",
            "profile",
            json!({"type": "string", "enum": onceprint_render::Profile::builtin_names(),
                "description": "A built-in render profile (default: the document's paper at `escpos-80-gb18030`)."}),
        ),
        (
            "/v1/render/preview",
            "format",
            json!({"type": "string", "enum": ["png", "text", "escpos"], "default": "png"}),
        ),
        (
            "/v1/stores/{id}/reconciliation",
            "date",
            json!({"type": "string", "format": "date",
            // Days before 1970 hold no tasks: the broker refuses them.
            "pattern": "^(?:19[7-9][0-9]|[2-9][0-9]{3})-[0-9]{2}-[0-9]{2}$",
            "description": "The business day, `YYYY-MM-DD` (1970 or later), in the store's time zone: from the start of that local \
                date to the start of the next (23 or 25 hours on the days daylight saving time begins or ends). Without it: today in the \
                store's time zone."}),
        ),
        (
            "/v1/setup-events",
            "cursor",
            json!({"type": "string", "pattern": "^(?:[1-9][0-9]{0,17})?$",
            "description": "The `next_cursor` of the previous page."}),
        ),
    ]
}

/// Rules on whole request schemas: `(component schema, keyword, value)`.
pub fn objects() -> Vec<(&'static str, &'static str, Value)> {
    let string = json!({"type": "string"});
    vec![
        // A change changes something: a new name or a new transport (`store_id` alone only
        // names where the printer is).
        (
            "UpdatePrinter",
            "anyOf",
            json!([
                {"title": "a new name", "required": ["name"], "properties": {"name": string}},
                {"title": "a new transport", "required": ["transport"], "properties": {"transport": {"type": "object"}}},
            ]),
        ),
        // A SetResponse reports results, so it carries them.
        (
            "EpsonSdpRequest",
            "oneOf",
            json!([
                {"title": "GetRequest", "properties": {"ConnectionType": {"type": "string", "enum": ["GetRequest"]}}},
                {"title": "SetResponse", "required": ["ResponseFile"],
                    "properties": {"ConnectionType": {"type": "string", "enum": ["SetResponse"]}, "ResponseFile": string}},
            ]),
        ),
        // `biz_no` first (400 `missing_biz_no`), then a target and the content.
        ("SubmitTask", "required", json!(["biz_no", "content"])),
        (
            "SubmitTask",
            "oneOf",
            json!([
                {"title": "to a printer", "required": ["printer_id"], "properties": {"printer_id": string}},
                {"title": "to a station", "required": ["station_id"], "properties": {"station_id": string}},
            ]),
        ),
    ]
}
