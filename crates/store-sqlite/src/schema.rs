//! Migrations for the SQLite backend, applied in order at start. A migration is never
//! edited once released; changes come as new entries.

pub const MIGRATIONS: &[&str] = &[
    r#"
CREATE TABLE settings (
    key   TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
CREATE TABLE tenants (
    id           TEXT PRIMARY KEY,
    name         TEXT NOT NULL,
    api_key_hash TEXT NOT NULL UNIQUE,
    created_at   INTEGER NOT NULL
);
CREATE TABLE stores (
    tenant_id  TEXT NOT NULL REFERENCES tenants(id),
    id         TEXT NOT NULL,
    name       TEXT NOT NULL,
    created_at INTEGER NOT NULL,
    PRIMARY KEY (tenant_id, id)
);
CREATE TABLE printers (
    tenant_id    TEXT NOT NULL,
    id           TEXT NOT NULL,
    store_id     TEXT NOT NULL,
    name         TEXT NOT NULL,
    transport    TEXT NOT NULL,
    online       INTEGER NOT NULL DEFAULT 0,
    last_seen_at INTEGER,
    last_error   TEXT,
    created_at   INTEGER NOT NULL,
    PRIMARY KEY (tenant_id, id),
    FOREIGN KEY (tenant_id, store_id) REFERENCES stores(tenant_id, id)
);
CREATE TABLE stations (
    tenant_id  TEXT NOT NULL,
    id         TEXT NOT NULL,
    store_id   TEXT NOT NULL,
    printers   TEXT NOT NULL, -- JSON array, primary first
    created_at INTEGER NOT NULL,
    PRIMARY KEY (tenant_id, id),
    FOREIGN KEY (tenant_id, store_id) REFERENCES stores(tenant_id, id)
);
CREATE TABLE agent_tokens (
    token_hash TEXT PRIMARY KEY,
    tenant_id  TEXT NOT NULL,
    store_id   TEXT NOT NULL,
    created_at INTEGER NOT NULL,
    FOREIGN KEY (tenant_id, store_id) REFERENCES stores(tenant_id, id)
);
CREATE TABLE tasks (
    id              TEXT PRIMARY KEY,
    tenant_id       TEXT NOT NULL,
    store_id        TEXT NOT NULL,
    printer_id      TEXT NOT NULL,
    station_id      TEXT,
    target          TEXT NOT NULL,
    biz_no          TEXT NOT NULL,
    print_type      TEXT NOT NULL,
    priority        INTEGER NOT NULL,
    content_type    TEXT NOT NULL,
    content         BLOB NOT NULL,
    fingerprint     TEXT NOT NULL,
    state           TEXT NOT NULL,
    attempts        INTEGER NOT NULL DEFAULT 0,
    last_error      TEXT,
    next_attempt_at INTEGER,
    created_at      INTEGER NOT NULL,
    updated_at      INTEGER NOT NULL,
    printed_at      INTEGER,
    -- The final judge of duplicates.
    UNIQUE (tenant_id, target, biz_no, print_type),
    FOREIGN KEY (tenant_id, printer_id) REFERENCES printers(tenant_id, id)
);
-- Due work is found through this index, never a scan.
CREATE INDEX tasks_due ON tasks(state, next_attempt_at);
CREATE INDEX tasks_by_store ON tasks(tenant_id, store_id, id);
CREATE INDEX tasks_by_tenant ON tasks(tenant_id, id);
CREATE INDEX tasks_by_biz_no ON tasks(tenant_id, biz_no);
CREATE TABLE task_events (
    id         INTEGER PRIMARY KEY,
    task_id    TEXT NOT NULL REFERENCES tasks(id),
    at         INTEGER NOT NULL,
    from_state TEXT,
    to_state   TEXT NOT NULL,
    attempt    INTEGER NOT NULL,
    actor      TEXT NOT NULL,
    reason     TEXT NOT NULL
);
CREATE INDEX task_events_by_task ON task_events(task_id, id);
CREATE TABLE ledger (
    tenant_id TEXT NOT NULL,
    task_id   TEXT NOT NULL REFERENCES tasks(id),
    kind      TEXT NOT NULL CHECK (kind IN ('charge', 'refund')),
    amount    INTEGER NOT NULL,
    at        INTEGER NOT NULL,
    -- One charge per task, one refund at most. Without a rowid the key is the
    -- table itself: one B-tree less to write per accepted task.
    PRIMARY KEY (task_id, kind)
) WITHOUT ROWID;
"#,
    // Delivery: who a delivery was handed to, the lane index, and the rule that
    // a printer has at most one task in flight, enforced by the database itself.
    r#"
ALTER TABLE tasks ADD COLUMN sent_to TEXT;
ALTER TABLE tasks ADD COLUMN sent_session TEXT;
CREATE UNIQUE INDEX tasks_one_in_flight_per_printer ON tasks(tenant_id, printer_id) WHERE state = 'sent';
CREATE INDEX tasks_lane ON tasks(tenant_id, printer_id, priority, id) WHERE state IN ('pending', 'sent', 'retrying');
"#,
    // Operations: reprints and successors hang on their origin task, and the
    // per-store attention list is read through its own small index.
    r#"
ALTER TABLE tasks ADD COLUMN origin_task_id TEXT;
ALTER TABLE tasks ADD COLUMN origin_kind TEXT;
ALTER TABLE tasks ADD COLUMN reprint_no INTEGER;
ALTER TABLE tasks ADD COLUMN successor_task_id TEXT;
CREATE INDEX tasks_by_origin ON tasks(origin_task_id) WHERE origin_task_id IS NOT NULL;
CREATE INDEX tasks_attention ON tasks(tenant_id, store_id, updated_at) WHERE state IN ('failed', 'in_doubt');
"#,
    // Reconciliation: a store's business day starts at its local midnight, and
    // the day's ledger is read through an index on time.
    r#"
ALTER TABLE stores ADD COLUMN utc_offset_minutes INTEGER NOT NULL DEFAULT 0;
CREATE INDEX ledger_by_time ON ledger(tenant_id, at);
"#,
    // Alerts: webhook endpoints, the outbox written in the same transaction as
    // the change it reports, and one delivery row per event and endpoint.
    r#"
CREATE TABLE webhooks (
    tenant_id  TEXT NOT NULL REFERENCES tenants(id),
    id         TEXT NOT NULL,
    url        TEXT NOT NULL,
    secret     TEXT NOT NULL,
    events     TEXT NOT NULL, -- JSON array of event kinds
    created_at INTEGER NOT NULL,
    PRIMARY KEY (tenant_id, id)
);
CREATE TABLE outbox (
    event_id   TEXT PRIMARY KEY,
    tenant_id  TEXT NOT NULL,
    kind       TEXT NOT NULL,
    payload    TEXT NOT NULL,
    created_at INTEGER NOT NULL
);
CREATE TABLE webhook_deliveries (
    event_id        TEXT NOT NULL REFERENCES outbox(event_id),
    webhook_id      TEXT NOT NULL,
    tenant_id       TEXT NOT NULL,
    attempts        INTEGER NOT NULL DEFAULT 0,
    next_attempt_at INTEGER,
    last_status     INTEGER,
    last_error      TEXT,
    delivered_at    INTEGER,
    created_at      INTEGER NOT NULL,
    PRIMARY KEY (event_id, webhook_id)
);
CREATE INDEX webhook_deliveries_due ON webhook_deliveries(next_attempt_at) WHERE delivered_at IS NULL AND next_attempt_at IS NOT NULL;
CREATE INDEX webhook_deliveries_by_hook ON webhook_deliveries(tenant_id, webhook_id, created_at);
"#,
    // Time zones: a store's business day follows its time zone, an IANA name such as
    // "Europe/Berlin" (daylight saving time included) or a fixed offset. Existing stores
    // keep the offset they had, written "+HH:MM" / "-HH:MM", and "UTC" for none. The old
    // column stays, unused: dropping it would gain nothing, but a broker of the previous
    // version opened on this file after a downgrade still writes and reads it.
    r#"
ALTER TABLE stores ADD COLUMN timezone TEXT NOT NULL DEFAULT 'UTC';
UPDATE stores
   SET timezone = (CASE WHEN utc_offset_minutes < 0 THEN '-' ELSE '+' END)
                  || printf('%02d:%02d', abs(utc_offset_minutes) / 60, abs(utc_offset_minutes) % 60)
 WHERE utc_offset_minutes <> 0;
"#,
    // The lane engine: when a task last went into `sent` (its in-flight age for the watchdog;
    // offering it again does not move it), and whether any attempt may have printed (no
    // automatic failover then). A task in flight at the upgrade counts from its last
    // change.
    r#"
ALTER TABLE tasks ADD COLUMN sent_at INTEGER;
ALTER TABLE tasks ADD COLUMN may_have_printed INTEGER NOT NULL DEFAULT 0;
UPDATE tasks SET sent_at = updated_at WHERE state = 'sent';
UPDATE tasks SET may_have_printed = 1 WHERE state = 'in_doubt' OR last_error = 'in_doubt';
"#,
    // Set-up changes: printers can be disabled; API keys live in a table of
    // their own, with ids, so that a tenant has several and can revoke them (the key given
    // at tenant creation moves there; `tenants.api_key_hash` keeps it for brokers of the
    // previous version and is overwritten when that key is revoked); agent tokens get ids
    // and can be revoked; every set-up change leaves a row in `setup_events`. Ids of keys
    // and tokens that exist already are derived from their hashes, which are unique.
    // Set-up objects are best created only by brokers of this version once it runs: an
    // earlier broker writes no `api_keys` row and no token id.
    r#"
ALTER TABLE printers ADD COLUMN enabled INTEGER NOT NULL DEFAULT 1;
CREATE TABLE api_keys (
    tenant_id  TEXT NOT NULL REFERENCES tenants(id),
    id         TEXT NOT NULL,
    key_hash   TEXT NOT NULL UNIQUE,
    created_at INTEGER NOT NULL,
    revoked_at INTEGER,
    PRIMARY KEY (tenant_id, id)
);
INSERT INTO api_keys (tenant_id, id, key_hash, created_at)
    SELECT id, 'key_' || substr(api_key_hash, 1, 16), api_key_hash, created_at FROM tenants;
ALTER TABLE agent_tokens ADD COLUMN id TEXT;
ALTER TABLE agent_tokens ADD COLUMN revoked_at INTEGER;
UPDATE agent_tokens SET id = 'tok_' || substr(token_hash, 1, 16);
CREATE UNIQUE INDEX agent_tokens_by_id ON agent_tokens(tenant_id, id);
CREATE INDEX agent_tokens_by_store ON agent_tokens(tenant_id, store_id, created_at);
CREATE TABLE setup_events (
    id          INTEGER PRIMARY KEY,
    tenant_id   TEXT NOT NULL,
    at          INTEGER NOT NULL,
    actor       TEXT NOT NULL,
    object_kind TEXT NOT NULL,
    object_id   TEXT NOT NULL,
    action      TEXT NOT NULL,
    detail      TEXT NOT NULL -- JSON
);
CREATE INDEX setup_events_by_tenant ON setup_events(tenant_id, id);
"#,
    // Printers that call the broker (CloudPRNT, Epson Server Direct Print, MQTT)
    // log in with a user name and a random password; only its SHA-256 is kept. A printer
    // has at most one login: rotating it replaces the row.
    r#"
CREATE TABLE printer_credentials (
    tenant_id   TEXT NOT NULL,
    printer_id  TEXT NOT NULL,
    username    TEXT NOT NULL UNIQUE,
    secret_hash TEXT NOT NULL UNIQUE,
    created_at  INTEGER NOT NULL,
    PRIMARY KEY (tenant_id, printer_id),
    FOREIGN KEY (tenant_id, printer_id) REFERENCES printers(tenant_id, id)
);
"#,
    // A printer that logs in to the MQTT server also keeps its password hashed the way the
    // MQTT server checks it (Mosquitto's PBKDF2-SHA512 line), so that the server's password
    // file can be written from the database.
    r#"
ALTER TABLE printer_credentials ADD COLUMN mqtt_hash TEXT;
"#,
    // Operators: people who log in to the console, per tenant, with an argon2id
    // password hash; `stores` is the JSON array of a staff member's stores. Sessions keep
    // only the SHA-256 of the secret the browser (cookie) or API client (operator token)
    // holds; revocation is a timestamp so that the audit keeps what existed.
    r#"
CREATE TABLE operators (
    tenant_id     TEXT NOT NULL REFERENCES tenants(id),
    id            TEXT NOT NULL,
    name          TEXT NOT NULL,
    role          TEXT NOT NULL,
    stores        TEXT NOT NULL, -- JSON array of store ids
    password_hash TEXT NOT NULL,
    created_at    INTEGER NOT NULL,
    PRIMARY KEY (tenant_id, id)
);
CREATE TABLE operator_sessions (
    token_hash  TEXT PRIMARY KEY,
    id          TEXT NOT NULL UNIQUE,
    tenant_id   TEXT NOT NULL,
    operator_id TEXT NOT NULL,
    kind        TEXT NOT NULL,
    csrf_token  TEXT NOT NULL,
    created_at  INTEGER NOT NULL,
    expires_at  INTEGER NOT NULL,
    revoked_at  INTEGER,
    FOREIGN KEY (tenant_id, operator_id) REFERENCES operators(tenant_id, id)
);
CREATE INDEX operator_sessions_by_operator ON operator_sessions(tenant_id, operator_id);
"#,
    // Retention: finished tasks older than `retention_days` are pruned.
    // A pruned task's row moves to `task_tombstones` without its content (its audit events
    // are deleted), keeping its idempotency key unique there, so that a late replay of the
    // submission finds it and is answered with its final state instead of creating a task,
    // and so that its day's reconciliation still counts it. The ledger is never pruned;
    // its entries may now name a task that lives on only as a tombstone, so the ledger is
    // rebuilt without the foreign key to `tasks` (SQLite cannot drop a constraint), the
    // rows copied as they are.
    r#"
CREATE TABLE ledger_new (
    tenant_id TEXT NOT NULL,
    task_id   TEXT NOT NULL,
    kind      TEXT NOT NULL CHECK (kind IN ('charge', 'refund')),
    amount    INTEGER NOT NULL,
    at        INTEGER NOT NULL,
    PRIMARY KEY (task_id, kind)
) WITHOUT ROWID;
INSERT INTO ledger_new (tenant_id, task_id, kind, amount, at) SELECT tenant_id, task_id, kind, amount, at FROM ledger;
DROP TABLE ledger;
ALTER TABLE ledger_new RENAME TO ledger;
CREATE INDEX ledger_by_time ON ledger(tenant_id, at);
CREATE TABLE task_tombstones (
    task_id           TEXT PRIMARY KEY,
    tenant_id         TEXT NOT NULL,
    store_id          TEXT NOT NULL,
    printer_id        TEXT NOT NULL,
    station_id        TEXT,
    target            TEXT NOT NULL,
    biz_no            TEXT NOT NULL,
    print_type        TEXT NOT NULL,
    priority          INTEGER NOT NULL,
    content_type      TEXT NOT NULL,
    fingerprint       TEXT NOT NULL,
    state             TEXT NOT NULL,
    attempts          INTEGER NOT NULL,
    last_error        TEXT,
    created_at        INTEGER NOT NULL,
    updated_at        INTEGER NOT NULL,
    printed_at        INTEGER,
    origin_task_id    TEXT,
    origin_kind       TEXT,
    reprint_no        INTEGER,
    successor_task_id TEXT,
    may_have_printed  INTEGER NOT NULL,
    business_day      TEXT NOT NULL,
    pruned_at         INTEGER NOT NULL,
    -- The key stays taken after its task is gone.
    UNIQUE (tenant_id, target, biz_no, print_type)
);
CREATE INDEX task_tombstones_by_store ON task_tombstones(tenant_id, store_id, task_id);
CREATE INDEX task_tombstones_by_origin ON task_tombstones(origin_task_id) WHERE origin_task_id IS NOT NULL;
"#,
    // Migration 13 here, the counterpart of PostgreSQL's 14 (this backend never had
    // PostgreSQL's migration 7, on planner statistics). Order by a sequence: lanes order by (priority, seq) instead of
    // (priority, id), like PostgreSQL, where ids minted by nodes with different clocks can
    // disagree with the order of submission. Here the single writer assigns `seq` from the
    // one-row counter `task_seq` as it inserts, so a task inserted later gets a greater
    // value. Existing tasks get a `seq` in id order, the order they had. SQLite cannot give
    // an added column a default from a counter, so a trigger fills it in for an insert that
    // names no `seq`: a broker of the previous version opened on this file after a downgrade
    // keeps inserting tasks that line up behind the others (it orders by id itself).
    r#"
ALTER TABLE tasks ADD COLUMN seq INTEGER;
CREATE TEMP TABLE tasks_in_id_order (id TEXT PRIMARY KEY, n INTEGER NOT NULL);
INSERT INTO tasks_in_id_order (id, n) SELECT id, row_number() OVER (ORDER BY id) FROM tasks;
UPDATE tasks SET seq = (SELECT n FROM tasks_in_id_order o WHERE o.id = tasks.id);
DROP TABLE tasks_in_id_order;
CREATE TABLE task_seq (
    one  INTEGER PRIMARY KEY CHECK (one = 1),
    last INTEGER NOT NULL
);
INSERT INTO task_seq (one, last) SELECT 1, coalesce(max(seq), 0) FROM tasks;
CREATE TRIGGER tasks_seq_default AFTER INSERT ON tasks FOR EACH ROW WHEN NEW.seq IS NULL
BEGIN
    UPDATE task_seq SET last = last + 1;
    UPDATE tasks SET seq = (SELECT last FROM task_seq) WHERE rowid = NEW.rowid;
END;
DROP INDEX tasks_lane;
CREATE INDEX tasks_lane ON tasks(tenant_id, printer_id, priority, seq) WHERE state IN ('pending', 'sent', 'retrying');
"#,
    // 14 here (15 on PostgreSQL), several nodes on one database. A lease names
    // a job that must run on one node at a time; its token increases on every change of holder (the fencing token).
    // Agent sessions are what each node heard of the agents polling it, merged by the
    // others. SQLite serves one node, so both tables only keep the code the same.
    r#"
CREATE TABLE leases (
    name       TEXT PRIMARY KEY,
    holder     TEXT NOT NULL,
    token      INTEGER NOT NULL,
    expires_at INTEGER NOT NULL
);
CREATE TABLE agent_sessions (
    tenant_id  TEXT NOT NULL,
    store_id   TEXT NOT NULL,
    agent_id   TEXT NOT NULL,
    session    TEXT NOT NULL,
    started_at INTEGER NOT NULL,
    heard_at   INTEGER NOT NULL,
    open_poll  INTEGER NOT NULL,
    node_id    TEXT NOT NULL,
    PRIMARY KEY (tenant_id, store_id, agent_id, session)
);
CREATE INDEX agent_sessions_by_heard ON agent_sessions(heard_at);
"#,
    // 15 here (16 on PostgreSQL), flat cost: the watchdog measures every lane
    // with work every few seconds (`lane_stats`: waiting tasks, the oldest one's age, the
    // one in flight). It found the active tasks through `tasks_due`, looked each up in the
    // table and sorted them by lane; with 100,000 tasks waiting that was a sort of 100,000
    // rows every five seconds. The lane index, which holds the active tasks only, now also
    // carries what that query reads, so the figures come from one walk of the index in
    // lane order, without the table. Its leading columns, which the lane reads use, are
    // the same; the index is not written more often than before (a change of state already
    // rewrote its entry, `state` being in its condition).
    r#"
DROP INDEX tasks_lane;
CREATE INDEX tasks_lane ON tasks(tenant_id, printer_id, priority, seq, store_id, state, created_at, sent_at)
    WHERE state IN ('pending', 'sent', 'retrying');
"#,
    // 16 here (17 on PostgreSQL), many stores. Every long poll reads the lanes
    // of its store's printers; without an index by store that read went through every
    // printer of the database, so 10,000 idle agents (one per store) cost a core.
    r#"
CREATE INDEX printers_by_store ON printers(tenant_id, store_id, id);
CREATE INDEX stations_by_store ON stations(tenant_id, store_id);
"#,
    // 17 here (18 on PostgreSQL), offline operation. LAN keys are store
    // credentials the store agent checks on its LAN listener; they live in `agent_tokens`
    // beside the agent tokens, told apart by `kind`, so that one mechanism creates, lists,
    // revokes and audits both. Their hash is stored with the prefix `lan:`: a broker of
    // the previous version, which does not know the column and looks tokens up by the
    // bare SHA-256 of what it was sent, can then never take a LAN key for an agent token
    // (it lists them among a store's agent tokens, which is harmless). `task_aliases`
    // keeps the task ids the agent minted for orders it took offline whose key the broker
    // already had, so that such an id still answers with the task it was merged into.
    r#"
ALTER TABLE agent_tokens ADD COLUMN kind TEXT NOT NULL DEFAULT 'agent';
CREATE TABLE task_aliases (
    alias_id   TEXT PRIMARY KEY,
    tenant_id  TEXT NOT NULL,
    task_id    TEXT NOT NULL,
    kind       TEXT NOT NULL,
    created_at INTEGER NOT NULL
);
CREATE INDEX task_aliases_by_task ON task_aliases(task_id);
"#,
    // 18 here (19 on PostgreSQL): the device log digest. Each store agent reports every
    // task's latest journal record; one row per (tenant, store, task id), replaced by a
    // later record. Reconciliation reads a store's rows by task id range (ids sort by
    // creation time), which is the primary key. A new table only, so a broker of the
    // previous version opened on this file after a downgrade is unaffected.
    r#"
CREATE TABLE device_log (
    tenant_id   TEXT NOT NULL,
    store_id    TEXT NOT NULL,
    task_id     TEXT NOT NULL,
    key         TEXT NOT NULL,
    printer_id  TEXT NOT NULL,
    state       TEXT NOT NULL,
    at          INTEGER NOT NULL,
    agent_id    TEXT NOT NULL,
    received_at INTEGER NOT NULL,
    PRIMARY KEY (tenant_id, store_id, task_id),
    FOREIGN KEY (tenant_id, store_id) REFERENCES stores(tenant_id, id)
) WITHOUT ROWID;
"#,
    // 19 here (20 on PostgreSQL): a paper-out pauses the lane. A task counts the
    // offers its printer refused with a status that proves nothing printed, which do not
    // spend `max_attempts`; a printer keeps since when such a state holds its lane, for
    // station failover and the console; a station may have its own failover threshold.
    // Added columns with defaults only, so a broker of
    // the previous version opened on this file after a downgrade is unaffected (it
    // neither reads nor writes them).
    r#"
ALTER TABLE tasks ADD COLUMN refusals INTEGER NOT NULL DEFAULT 0;
ALTER TABLE printers ADD COLUMN paused_since INTEGER;
ALTER TABLE stations ADD COLUMN failover_after_ms INTEGER;
UPDATE printers SET paused_since = last_seen_at
 WHERE last_error IN ('no_paper', 'cover_open', 'paper_jam', 'offline');
"#,
    // 20 here (none on PostgreSQL): intake without a statement journal. The
    // trigger of migration 13 made every INSERT into `tasks` a statement that may write
    // several rows, so each opened a statement journal inside the writer's savepoint, and
    // each release walked that in-memory journal from its start: a cost that grew with the
    // batch, 47 % of the broker's CPU at intake (perf). Every broker since migration 13
    // writes `seq` itself; the tasks an older one (opened after a downgrade) inserted
    // without it are numbered when this broker opens the file
    // (`sql::sequence_unnumbered_tasks`).
    r#"
DROP TRIGGER IF EXISTS tasks_seq_default;
"#,
    // 21 here (none on PostgreSQL, which tests an `IN` list in place): the lane index's
    // predicate as comparisons. SQLite evaluates `state IN (three values)`
    // through a temporary B-tree that it builds and drops for the old and for the new row
    // of every INSERT and UPDATE of `tasks` (partial index predicates are evaluated on
    // every write); the comparisons cost nothing. Measured on a copy of this schema, a
    // task's `pending → sent → printed` with its audit events: 50–56 → 32–33 µs. Same
    // keys, same rows in it; the queries that use it repeat the new predicate
    // (`sql::IN_LANE`). A broker older than this migration opened on the file after a
    // downgrade no longer finds the index for its own spelling (its watchdog's `INDEXED
    // BY` fails): docs/DEPLOYMENT.md says how to put the old predicate back.
    r#"
DROP INDEX tasks_lane;
CREATE INDEX tasks_lane ON tasks(tenant_id, printer_id, priority, seq, store_id, state, created_at, sent_at)
    WHERE (state = 'pending' OR state = 'sent' OR state = 'retrying');
"#,
    // 22 (21 on PostgreSQL): lanes progress by time. The sweeper looks every second
    // at the printers whose lane is paused (a printer that fell silent among them) to move
    // their tickets on when the printer says nothing; this index holds only those.
    // Additive: an older broker neither reads nor needs it.
    r#"
CREATE INDEX printers_paused ON printers(paused_since) WHERE paused_since IS NOT NULL;
"#,
    // 23 (22 on PostgreSQL): HTTP Digest sign-in for Epson Server Direct Print printers.
    // Digest never sends the password, so the SHA-256 kept since migration 10 cannot check
    // it; a login made from now on also keeps RFC 7616's `HA1` (`H(username:realm:password)`)
    // with MD5 and with SHA-256. Logins made before have none and sign in with Basic until
    // they are rotated. Nullable columns only: an older broker neither reads nor writes them.
    r#"
ALTER TABLE printer_credentials ADD COLUMN ha1_md5 TEXT;
ALTER TABLE printer_credentials ADD COLUMN ha1_sha256 TEXT;
"#,
    // 24 (24 on PostgreSQL): a manager disables an operator's login. A nullable column
    // only: an older broker opened on this file after a downgrade neither reads nor writes
    // it, and would let a disabled operator log in again.
    r#"
ALTER TABLE operators ADD COLUMN disabled_at INTEGER;
"#,
    // 25 (25 on PostgreSQL): alert endpoints that are group bots (WeCom, DingTalk, Feishu,
    // Slack) get the bot's message instead of onceprint's signed event. A column with a
    // default: an older broker neither reads nor writes it, and would send such an
    // endpoint onceprint's JSON, which the bot refuses.
    r#"
ALTER TABLE webhooks ADD COLUMN format TEXT NOT NULL DEFAULT 'onceprint';
"#,
    // 26 (26 on PostgreSQL): the console's ticket list pages by id within a printer, as
    // far back as a person goes, at what one page costs: without it a rare printer walked
    // the store's whole index to fill a page. Written once per task (a task's printer
    // seldom changes). A state filter walks the store's index instead: an index with the
    // state in it is rewritten at every transition, which cost a fifth of intake and of
    // printed/s (docs/BENCHMARKS.md). Additive: an older broker neither reads nor needs it.
    r#"
CREATE INDEX tasks_by_printer ON tasks(tenant_id, printer_id, id);
"#,
];
