//! The schema, as an ordered list of migrations applied when a broker starts.
//!
//! Each migration runs in its own transaction that first takes a transaction-scoped
//! advisory lock. Two brokers starting against the same empty schema therefore apply each
//! migration exactly once: the second waits for the first to commit and then finds the
//! version already recorded in `schema_migrations`. A migration that fails rolls back
//! completely, so a schema is never left half-migrated.
//!
//! Migrations are append-only: a released migration is never edited, a change to the
//! schema is a new entry at the end of [`MIGRATIONS`].
//!
//! Migrations are also additive, so that brokers of the previous release keep running
//! against the new schema during a rolling upgrade (docs/DEPLOYMENT.md): a migration adds
//! tables, columns (nullable or with a default), indexes and functions, and may loosen a
//! constraint; it never drops or renames a table or column, changes a column's type,
//! makes an existing column NOT NULL, or adds a NOT NULL column without a default. The
//! test `every_migration_is_additive` checks the SQL text and the schema itself after
//! each step; [`NOT_ADDITIVE`] lists the exceptions released before the rule was checked.

use onceprint_store::{StoreError, StoreResult};

use crate::error::pg_error;

/// First key of the advisory lock. The second key is derived from the current schema, so
/// brokers migrating different schemas of one database do not wait for each other.
const LOCK_CLASS: i32 = 0x6f70_6d67; // "opmg"

/// `(version, SQL)` in the order they must be applied. Versions are increasing.
pub(crate) const MIGRATIONS: &[(i32, &str)] = &[
    (1, V1_INITIAL),
    (2, V2_DELIVERY),
    (3, V3_OPERATIONS),
    (4, V4_RECONCILIATION),
    (5, V5_ALERTS),
    (6, V6_TIME_ZONES),
    (7, V7_PLANS),
    (8, V8_LANES),
    (9, V9_SETUP_CHANGES),
    (10, V10_PRINTER_CREDENTIALS),
    (11, V11_MQTT_LOGINS),
    (12, V12_OPERATORS),
    (13, V13_RETENTION),
    (14, V14_LANE_SEQUENCE),
    (15, V15_CLUSTER),
    (16, V16_LANE_FIGURES),
    (17, V17_STORE_INDEXES),
    (18, V18_OFFLINE),
    (19, V19_DEVICE_LOG),
    (20, V20_PAUSED_LANES),
    (21, V21_PAUSED_PRINTERS),
    (22, V22_DIGEST_LOGINS),
    (23, V23_BIZ_NO_PREFIX),
    (24, V24_OPERATOR_DISABLED),
    (25, V25_WEBHOOK_FORMAT),
    (26, V26_TASK_LIST_INDEXES),
];

/// Released migrations that break the additive rule, each with why it was accepted. The
/// list is closed: a new migration must be additive (see the module documentation).
#[cfg_attr(not(test), allow(dead_code))]
pub(crate) const NOT_ADDITIVE: &[(i32, &str, &str)] = &[(
    9,
    "ALTER COLUMN ID SET NOT NULL",
    "agent_tokens.id is added and filled by the same migration; brokers of version 8 insert tokens without \
     it and fail, so set-up objects are created only by brokers of version 9 or later (see V9_SETUP_CHANGES)",
)];

/// The version a fully migrated database reports.
pub const LATEST_VERSION: i32 = MIGRATIONS[MIGRATIONS.len() - 1].0;

/// Times are BIGINT milliseconds since the epoch everywhere, as in the models. Ids are
/// scoped per tenant, so every tenant-owned table keys on `(tenant_id, id)` and every
/// reference carries the tenant id: a printer can only point at its own tenant's store.
///
/// Task ids use the "C" collation (byte order) whatever the database's default is: the
/// task list pages by `id < cursor` and the ids sort by creation time only in byte order,
/// which is also the order every other backend and the Rust side use. It also makes the
/// comparisons on the busiest index plain `memcmp`s.
const V1_INITIAL: &str = r#"
CREATE TABLE settings (
    key   TEXT PRIMARY KEY,
    value TEXT NOT NULL
);

CREATE TABLE tenants (
    id           TEXT PRIMARY KEY,
    name         TEXT NOT NULL,
    api_key_hash TEXT NOT NULL CONSTRAINT tenants_api_key_hash_key UNIQUE,
    created_at   BIGINT NOT NULL
);

CREATE TABLE stores (
    tenant_id  TEXT NOT NULL REFERENCES tenants (id),
    id         TEXT NOT NULL,
    name       TEXT NOT NULL,
    created_at BIGINT NOT NULL,
    PRIMARY KEY (tenant_id, id)
);

CREATE TABLE printers (
    tenant_id    TEXT NOT NULL,
    id           TEXT NOT NULL,
    store_id     TEXT NOT NULL,
    name         TEXT NOT NULL,
    transport    TEXT NOT NULL,
    online       BOOLEAN NOT NULL DEFAULT false,
    last_seen_at BIGINT,
    last_error   TEXT,
    created_at   BIGINT NOT NULL,
    PRIMARY KEY (tenant_id, id),
    FOREIGN KEY (tenant_id, store_id) REFERENCES stores (tenant_id, id)
);

CREATE TABLE stations (
    tenant_id  TEXT NOT NULL,
    id         TEXT NOT NULL,
    store_id   TEXT NOT NULL,
    printers   TEXT[] NOT NULL,
    created_at BIGINT NOT NULL,
    PRIMARY KEY (tenant_id, id),
    FOREIGN KEY (tenant_id, store_id) REFERENCES stores (tenant_id, id)
);

CREATE TABLE agent_tokens (
    token_hash TEXT PRIMARY KEY,
    tenant_id  TEXT NOT NULL,
    store_id   TEXT NOT NULL,
    created_at BIGINT NOT NULL,
    FOREIGN KEY (tenant_id, store_id) REFERENCES stores (tenant_id, id)
);

CREATE TABLE tasks (
    id              TEXT COLLATE "C" PRIMARY KEY,
    tenant_id       TEXT NOT NULL,
    store_id        TEXT NOT NULL,
    printer_id      TEXT NOT NULL,
    station_id      TEXT,
    target          TEXT NOT NULL,
    biz_no          TEXT NOT NULL,
    print_type      TEXT NOT NULL,
    priority        INT NOT NULL,
    content_type    TEXT NOT NULL,
    content         BYTEA NOT NULL,
    fingerprint     TEXT NOT NULL,
    state           TEXT NOT NULL,
    attempts        INT NOT NULL DEFAULT 0,
    last_error      TEXT,
    next_attempt_at BIGINT,
    created_at      BIGINT NOT NULL,
    updated_at      BIGINT NOT NULL,
    printed_at      BIGINT,
    CONSTRAINT tasks_idempotency_key UNIQUE (tenant_id, target, biz_no, print_type),
    FOREIGN KEY (tenant_id, printer_id) REFERENCES printers (tenant_id, id)
);
-- The engine finds due work (pending, or retrying whose time has come) through this.
CREATE INDEX tasks_state_next_attempt_idx ON tasks (state, next_attempt_at);
CREATE INDEX tasks_tenant_store_id_idx ON tasks (tenant_id, store_id, id);
CREATE INDEX tasks_tenant_id_idx ON tasks (tenant_id, id);
CREATE INDEX tasks_tenant_biz_no_idx ON tasks (tenant_id, biz_no);

CREATE TABLE task_events (
    id         BIGSERIAL PRIMARY KEY,
    task_id    TEXT COLLATE "C" NOT NULL REFERENCES tasks (id),
    at         BIGINT NOT NULL,
    from_state TEXT,
    to_state   TEXT NOT NULL,
    attempt    INT NOT NULL,
    actor      TEXT NOT NULL,
    reason     TEXT NOT NULL
);
CREATE INDEX task_events_task_idx ON task_events (task_id, id);

CREATE TABLE ledger (
    id        BIGSERIAL PRIMARY KEY,
    tenant_id TEXT NOT NULL,
    task_id   TEXT COLLATE "C" NOT NULL REFERENCES tasks (id),
    kind      TEXT NOT NULL CHECK (kind IN ('charge', 'refund')),
    amount    BIGINT NOT NULL,
    at        BIGINT NOT NULL,
    UNIQUE (task_id, kind)
);
"#;

/// Delivery: who a delivery was handed to (agent and session), the lane index, and the
/// rule that a printer has at most one task in flight, enforced by a partial unique
/// index so that it holds against concurrent engines too.
///
/// Both indexes end in `id`, which keeps the column's "C" collation: the lane order
/// `ORDER BY priority, id` of [`crate::PostgresStore`]'s lane query then matches the index
/// and is read straight from it. (An index with another collation on `id` would not serve
/// that ORDER BY.) The predicate of `tasks_lane` is repeated literally by that query, so
/// that the planner can prove the partial index applies.
const V2_DELIVERY: &str = r#"
ALTER TABLE tasks ADD COLUMN sent_to TEXT, ADD COLUMN sent_session TEXT;
CREATE UNIQUE INDEX tasks_one_in_flight_per_printer ON tasks (tenant_id, printer_id) WHERE state = 'sent';
CREATE INDEX tasks_lane ON tasks (tenant_id, printer_id, priority, id)
    WHERE state IN ('pending', 'sent', 'retrying');
"#;

/// Operations: reprints and successors hang on their origin task (`origin_kind` is
/// `reprint`, `transfer` or `failover`; `reprint_no` numbers the reprints), a transferred
/// task points at the task that carries on its work, and the per-store attention list
/// (failed and in-doubt tasks, oldest change first) is read through its own small index.
///
/// The task references use the "C" collation like `tasks.id`, so that comparisons and
/// joins with it need no collation conversion. The predicate of `tasks_attention` is
/// repeated literally by the attention query, so that the planner can use it.
const V3_OPERATIONS: &str = r#"
ALTER TABLE tasks
    ADD COLUMN origin_task_id TEXT COLLATE "C",
    ADD COLUMN origin_kind TEXT,
    ADD COLUMN reprint_no INT,
    ADD COLUMN successor_task_id TEXT COLLATE "C";
CREATE INDEX tasks_by_origin ON tasks (origin_task_id) WHERE origin_task_id IS NOT NULL;
CREATE INDEX tasks_attention ON tasks (tenant_id, store_id, updated_at) WHERE state IN ('failed', 'in_doubt');
"#;

/// Reconciliation: a store's business day starts at its local midnight (its offset from
/// UTC in minutes; existing stores are UTC), and a day's ledger is read through an index
/// on time. A day's tasks need no new index: their ids sort by creation time, so
/// `tasks_tenant_store_id_idx` already serves the range.
const V4_RECONCILIATION: &str = r#"
ALTER TABLE stores ADD COLUMN utc_offset_minutes INT NOT NULL DEFAULT 0;
CREATE INDEX ledger_by_time ON ledger (tenant_id, at);
"#;

/// Alerts: webhook endpoints (the event kinds each wants as an array, matched with
/// `kind = ANY (events)`), the outbox an alert is written to in the same transaction as
/// the change it reports, and one delivery row per event and endpoint. Due deliveries are
/// found through a partial index that holds only those still waiting for an attempt, an
/// endpoint's history through `webhook_deliveries_by_hook`.
///
/// Event ids use the "C" collation, like task ids: an endpoint's history sorts by
/// (created_at, event_id) in byte order, as on every other backend.
const V5_ALERTS: &str = r#"
CREATE TABLE webhooks (
    tenant_id  TEXT NOT NULL REFERENCES tenants (id),
    id         TEXT NOT NULL,
    url        TEXT NOT NULL,
    secret     TEXT NOT NULL,
    events     TEXT[] NOT NULL,
    created_at BIGINT NOT NULL,
    PRIMARY KEY (tenant_id, id)
);

CREATE TABLE outbox (
    event_id   TEXT COLLATE "C" PRIMARY KEY,
    tenant_id  TEXT NOT NULL,
    kind       TEXT NOT NULL,
    payload    TEXT NOT NULL,
    created_at BIGINT NOT NULL
);

CREATE TABLE webhook_deliveries (
    event_id        TEXT COLLATE "C" NOT NULL REFERENCES outbox (event_id),
    webhook_id      TEXT NOT NULL,
    tenant_id       TEXT NOT NULL,
    attempts        INT NOT NULL DEFAULT 0,
    next_attempt_at BIGINT,
    last_status     INT,
    last_error      TEXT,
    delivered_at    BIGINT,
    created_at      BIGINT NOT NULL,
    PRIMARY KEY (event_id, webhook_id)
);
CREATE INDEX webhook_deliveries_due ON webhook_deliveries (next_attempt_at)
    WHERE delivered_at IS NULL AND next_attempt_at IS NOT NULL;
CREATE INDEX webhook_deliveries_by_hook ON webhook_deliveries (tenant_id, webhook_id, created_at);
"#;

/// Time zones: a store's business day follows its time zone, an IANA name such as
/// "Europe/Berlin" (daylight saving time included) or a fixed offset. Existing stores keep
/// the offset they had, written `+HH:MM` / `-HH:MM`, and `UTC` for none.
///
/// `utc_offset_minutes` stays, unused by this version. Brokers of the previous version
/// may still run against the same database during a rolling upgrade, and they insert
/// stores with that column; dropping it would make their store creation fail. (A store
/// created by such a broker after this migration gets the default `UTC` here, whatever
/// offset it was given, so stores in other zones are best created once every node runs
/// this version.)
const V6_TIME_ZONES: &str = r#"
ALTER TABLE stores ADD COLUMN timezone TEXT NOT NULL DEFAULT 'UTC';
UPDATE stores
   SET timezone = (CASE WHEN utc_offset_minutes < 0 THEN '-' ELSE '+' END)
                  || lpad((abs(utc_offset_minutes) / 60)::text, 2, '0')
                  || ':' || lpad((abs(utc_offset_minutes) % 60)::text, 2, '0')
 WHERE utc_offset_minutes <> 0;
"#;

/// Plans that stay right while the planner knows little about the tasks.
///
/// The (state, next_attempt_at) index of due work becomes partial: only tasks with a
/// deadline that something waits for (`sent`, `retrying`) are in it. Before, its leading
/// `state` made it a candidate for the compare-and-set `UPDATE … WHERE id = $1 AND
/// state = $3`; on a fresh database, whose statistics still said "empty table", the
/// planner's generic plan took it instead of the primary key and read every task in the
/// state for each transition (delivery fell to ~1,000 tasks/s). A partial index cannot
/// serve a predicate on a parameter, so that plan is gone; the due-task query names its
/// state literally (see `delivery::due_tasks_sql`) and keeps using it. The index is also
/// far smaller: pending and finished tasks are not in it.
///
/// The tasks table is vacuumed and analyzed after a twentieth of it changed instead of a
/// fifth (autovacuum's default): every printed task leaves dead entries in the lane and
/// due indexes, which the lane and due queries step over until a vacuum removes them.
const V7_PLANS: &str = r#"
DROP INDEX tasks_state_next_attempt_idx;
CREATE INDEX tasks_due ON tasks (state, next_attempt_at) WHERE state IN ('sent', 'retrying');
ALTER TABLE tasks SET (autovacuum_vacuum_scale_factor = 0.05, autovacuum_analyze_scale_factor = 0.05);
"#;

/// The lane engine: when a task last went into `sent` (its in-flight age for the watchdog;
/// offering it again does not move it), and whether any attempt may have printed (no
/// automatic failover then). A task in flight at the upgrade counts from its last
/// change. Both columns are added without a table rewrite (a constant default).
const V8_LANES: &str = r#"
ALTER TABLE tasks ADD COLUMN sent_at BIGINT, ADD COLUMN may_have_printed BOOLEAN NOT NULL DEFAULT false;
UPDATE tasks SET sent_at = updated_at WHERE state = 'sent';
UPDATE tasks SET may_have_printed = true WHERE state = 'in_doubt' OR last_error = 'in_doubt';
"#;

/// Set-up changes: printers can be disabled; API keys live in a table of their
/// own, with ids, so that a tenant has several and can revoke them; agent tokens get ids
/// and can be revoked; every set-up change leaves a row in `setup_events`, read newest
/// first per tenant through `setup_events_by_tenant`.
///
/// The key given at tenant creation moves to `api_keys`; `tenants.api_key_hash` keeps it
/// for brokers of the previous version during a rolling upgrade and is overwritten when
/// that key is revoked. Ids of keys and tokens that exist already are derived from their
/// hashes, which are unique. An earlier broker writes no `api_keys` row and no token id
/// (its token inserts fail on the NOT NULL), so set-up objects are best created only by
/// brokers of this version once every node runs it.
const V9_SETUP_CHANGES: &str = r#"
ALTER TABLE printers ADD COLUMN enabled BOOLEAN NOT NULL DEFAULT true;

CREATE TABLE api_keys (
    tenant_id  TEXT NOT NULL REFERENCES tenants (id),
    id         TEXT NOT NULL,
    key_hash   TEXT NOT NULL CONSTRAINT api_keys_key_hash_key UNIQUE,
    created_at BIGINT NOT NULL,
    revoked_at BIGINT,
    PRIMARY KEY (tenant_id, id)
);
INSERT INTO api_keys (tenant_id, id, key_hash, created_at)
    SELECT id, 'key_' || substr(api_key_hash, 1, 16), api_key_hash, created_at FROM tenants;

ALTER TABLE agent_tokens ADD COLUMN id TEXT, ADD COLUMN revoked_at BIGINT;
UPDATE agent_tokens SET id = 'tok_' || substr(token_hash, 1, 16);
ALTER TABLE agent_tokens ALTER COLUMN id SET NOT NULL;
CREATE UNIQUE INDEX agent_tokens_by_id ON agent_tokens (tenant_id, id);
CREATE INDEX agent_tokens_by_store ON agent_tokens (tenant_id, store_id, created_at);

CREATE TABLE setup_events (
    id          BIGSERIAL PRIMARY KEY,
    tenant_id   TEXT NOT NULL,
    at          BIGINT NOT NULL,
    actor       TEXT NOT NULL,
    object_kind TEXT NOT NULL,
    object_id   TEXT NOT NULL,
    action      TEXT NOT NULL,
    detail      TEXT NOT NULL
);
CREATE INDEX setup_events_by_tenant ON setup_events (tenant_id, id);
"#;

/// Printers that call the broker (CloudPRNT, Epson Server Direct Print, MQTT) log in with
/// a user name and a random password; only its SHA-256 is kept, one login per printer.
const V10_PRINTER_CREDENTIALS: &str = r#"
CREATE TABLE printer_credentials (
    tenant_id   TEXT NOT NULL,
    printer_id  TEXT NOT NULL,
    username    TEXT NOT NULL CONSTRAINT printer_credentials_username_key UNIQUE,
    secret_hash TEXT NOT NULL CONSTRAINT printer_credentials_secret_hash_key UNIQUE,
    created_at  BIGINT NOT NULL,
    PRIMARY KEY (tenant_id, printer_id),
    FOREIGN KEY (tenant_id, printer_id) REFERENCES printers (tenant_id, id)
);
"#;

/// A printer that logs in to the MQTT server also keeps its password hashed the way the
/// MQTT server checks it (Mosquitto's PBKDF2-SHA512 line), so that the server's password
/// file can be written from the database.
const V11_MQTT_LOGINS: &str = r#"
ALTER TABLE printer_credentials ADD COLUMN mqtt_hash TEXT;
"#;

/// Operators: people who log in to the console, per tenant, with an argon2id
/// password hash; `stores` is the JSON array of a staff member's stores. Sessions keep only
/// the SHA-256 of the secret the browser (cookie) or API client (operator token) holds.
const V12_OPERATORS: &str = r#"
CREATE TABLE operators (
    tenant_id     TEXT NOT NULL REFERENCES tenants (id),
    id            TEXT NOT NULL,
    name          TEXT NOT NULL,
    role          TEXT NOT NULL,
    stores        TEXT NOT NULL,
    password_hash TEXT NOT NULL,
    created_at    BIGINT NOT NULL,
    PRIMARY KEY (tenant_id, id)
);
CREATE TABLE operator_sessions (
    token_hash  TEXT PRIMARY KEY,
    id          TEXT NOT NULL UNIQUE,
    tenant_id   TEXT NOT NULL,
    operator_id TEXT NOT NULL,
    kind        TEXT NOT NULL,
    csrf_token  TEXT NOT NULL,
    created_at  BIGINT NOT NULL,
    expires_at  BIGINT NOT NULL,
    revoked_at  BIGINT,
    FOREIGN KEY (tenant_id, operator_id) REFERENCES operators (tenant_id, id)
);
CREATE INDEX operator_sessions_by_operator ON operator_sessions (tenant_id, operator_id);
"#;

/// Retention: finished tasks older than `retention_days` are pruned. A
/// pruned task's row moves to `task_tombstones` without its content (its audit events are
/// deleted), keeping its idempotency key unique there, so that a late replay finds it and
/// is answered with its final state, and its day's reconciliation still counts it. The
/// ledger is never pruned; its entries may now name a task that lives on only as a
/// tombstone, so the ledger's foreign key to `tasks` goes.
///
/// Intake inserts a batch with one statement that skips tombstoned keys (`NOT EXISTS`),
/// but that check reads the statement's snapshot: a prune that deletes a task while the
/// statement waits for that task's key could let the insert through unseen. The statement
/// therefore ends by calling `onceprint_refuse_pruned_keys` on the keys it inserted; being
/// a volatile PL/pgSQL function, it reads with a fresh snapshot, which shows every prune
/// the insert waited for, and raises `OP001` if one of the keys has a tombstone. The whole
/// statement (task, event and charge) is then rolled back and the batch tried again, when
/// its snapshot shows the tombstone. `SET search_path FROM CURRENT` binds the function to
/// the schema it was created in.
const V13_RETENTION: &str = r#"
ALTER TABLE ledger DROP CONSTRAINT IF EXISTS ledger_task_id_fkey;

CREATE TABLE task_tombstones (
    task_id           TEXT COLLATE "C" PRIMARY KEY,
    tenant_id         TEXT NOT NULL,
    store_id          TEXT NOT NULL,
    printer_id        TEXT NOT NULL,
    station_id        TEXT,
    target            TEXT NOT NULL,
    biz_no            TEXT NOT NULL,
    print_type        TEXT NOT NULL,
    priority          INT NOT NULL,
    content_type      TEXT NOT NULL,
    fingerprint       TEXT NOT NULL,
    state             TEXT NOT NULL,
    attempts          INT NOT NULL,
    last_error        TEXT,
    created_at        BIGINT NOT NULL,
    updated_at        BIGINT NOT NULL,
    printed_at        BIGINT,
    origin_task_id    TEXT COLLATE "C",
    origin_kind       TEXT,
    reprint_no        INT,
    successor_task_id TEXT COLLATE "C",
    may_have_printed  BOOLEAN NOT NULL,
    business_day      TEXT NOT NULL,
    pruned_at         BIGINT NOT NULL,
    CONSTRAINT task_tombstones_idempotency_key UNIQUE (tenant_id, target, biz_no, print_type)
);
CREATE INDEX task_tombstones_by_store ON task_tombstones (tenant_id, store_id, task_id);
CREATE INDEX task_tombstones_by_origin ON task_tombstones (origin_task_id) WHERE origin_task_id IS NOT NULL;

CREATE FUNCTION onceprint_refuse_pruned_keys(tenants TEXT[], targets TEXT[], biz_nos TEXT[], print_types TEXT[])
RETURNS BOOLEAN LANGUAGE plpgsql VOLATILE SET search_path FROM CURRENT AS $$
BEGIN
    IF EXISTS (
        SELECT 1
        FROM unnest(tenants, targets, biz_nos, print_types) AS k(tenant_id, target, biz_no, print_type)
        JOIN task_tombstones b ON b.tenant_id = k.tenant_id AND b.target = k.target
                              AND b.biz_no = k.biz_no AND b.print_type = k.print_type
    ) THEN
        RAISE EXCEPTION 'a task key was pruned while a submission for it was being inserted'
            USING ERRCODE = 'OP001';
    END IF;
    RETURN true;
END
$$;
"#;

/// Order across broker nodes: lanes order by (priority, seq) instead of
/// (priority, id). Task ids are minted per node from its own clock, so two tickets for one
/// printer submitted one after the other to two nodes whose clocks differ could get ids in
/// the wrong order. `seq` comes from one database sequence: a task inserted after another
/// task's commit gets a greater value, whichever node inserted it. The sequence keeps
/// `CACHE 1` (the default) on purpose: with a cache, each session would draw from a block
/// of its own and values from two nodes would no longer follow the order of the inserts.
/// Concurrent inserts get values in some order, which is right, since neither submission
/// was answered before the other was made.
///
/// Existing tasks get a `seq` in id order (the order they had). The column then gets the
/// sequence as its default, so a broker of the previous version, which does not know the
/// column, keeps working during a rolling upgrade: its inserts get a value from the
/// default, and its lane query (`ORDER BY priority, id`) still finds its rows through the
/// new lane index (it sorts the few rows of a lane instead of reading them in order). While
/// old and new nodes run side by side they may disagree about the order of tasks whose ids
/// and sequence values disagree, that is, exactly the tasks the old order got wrong.
///
/// The index on (…, priority, seq) replaces `tasks_lane` under the same name, with the
/// same predicate. The backfill rewrites every task row once, under the migration's lock
/// (intake of every node waits for it); retention keeps the table small enough for that.
const V14_LANE_SEQUENCE: &str = r#"
CREATE SEQUENCE tasks_seq AS BIGINT CACHE 1;
ALTER TABLE tasks ADD COLUMN seq BIGINT;
UPDATE tasks t SET seq = o.n
  FROM (SELECT id, row_number() OVER (ORDER BY id) AS n FROM tasks) o
 WHERE t.id = o.id;
SELECT setval('tasks_seq', coalesce((SELECT max(seq) FROM tasks), 0) + 1, false);
ALTER SEQUENCE tasks_seq OWNED BY tasks.seq;
ALTER TABLE tasks ALTER COLUMN seq SET DEFAULT nextval('tasks_seq'), ALTER COLUMN seq SET NOT NULL;
DROP INDEX tasks_lane;
CREATE INDEX tasks_lane ON tasks (tenant_id, printer_id, priority, seq)
    WHERE state IN ('pending', 'sent', 'retrying');
"#;

/// Several nodes on one database. A lease names a job that must run on one node
/// at a time (the sweeper, the push drivers, alert delivery, ...): `token` increases on
/// every change of holder and is the fencing token of the holder's work; `expires_at` is
/// in the holders' clocks, which must agree to well within a lease's time to live.
/// `agent_sessions` is what each node heard of the agents that poll it, merged by the
/// other nodes about once a second (a store agent's polls may reach any node); rows are
/// written and read in batches, and read by `heard_at`. Brokers of the previous version
/// never read either table.
const V15_CLUSTER: &str = r#"
CREATE TABLE leases (
    name       TEXT PRIMARY KEY,
    holder     TEXT NOT NULL,
    token      BIGINT NOT NULL,
    expires_at BIGINT NOT NULL
);
CREATE TABLE agent_sessions (
    tenant_id  TEXT NOT NULL,
    store_id   TEXT NOT NULL,
    agent_id   TEXT NOT NULL,
    session    TEXT NOT NULL,
    started_at BIGINT NOT NULL,
    heard_at   BIGINT NOT NULL,
    open_poll  BOOLEAN NOT NULL,
    node_id    TEXT NOT NULL,
    PRIMARY KEY (tenant_id, store_id, agent_id, session)
);
CREATE INDEX agent_sessions_by_heard ON agent_sessions (heard_at);
"#;

/// Flat cost: the watchdog measures every lane with work every few seconds
/// (`delivery::LANE_STATS`: waiting tasks, the oldest one's age, the one in flight). It
/// read the active tasks through a bitmap scan of `tasks_lane` and the table, hashed and
/// sorted them: with 100,000 tasks waiting, 190 ms of three processes every five seconds.
/// `tasks_lane` now also carries what that query reads (`INCLUDE`), so the figures come
/// from an index-only scan in lane order. Its key columns, which the lane reads use and an
/// older broker's queries too, are the same, under the same name and predicate; no update
/// that was HOT before stops being HOT (`state` was already in the predicate). Rebuilding
/// it reads the table once under the migration's lock.
const V16_LANE_FIGURES: &str = r#"
DROP INDEX tasks_lane;
CREATE INDEX tasks_lane ON tasks (tenant_id, printer_id, priority, seq) INCLUDE (store_id, state, created_at, sent_at)
    WHERE state IN ('pending', 'sent', 'retrying');
"#;

/// Many stores: every long poll reads the lanes of its store's printers, and
/// without an index by store that read went through every printer of the database (10,000
/// idle agents, one per store, cost a core). `id` last, so a store's lanes come in printer
/// order from the index without a sort. Plain indexes: brokers of the previous version are
/// unaffected.
const V17_STORE_INDEXES: &str = r#"
CREATE INDEX printers_by_store ON printers (tenant_id, store_id, id);
CREATE INDEX stations_by_store ON stations (tenant_id, store_id);
"#;

/// Offline operation. LAN keys are store credentials the store agent checks on
/// its LAN listener; they live in `agent_tokens` beside the agent tokens, told apart by
/// `kind`, so that one mechanism creates, lists, revokes and audits both. The column has a
/// default, so a broker of version 17 inserting an agent token names no kind and gets
/// `agent`. Such a broker looks tokens up by the bare SHA-256 of what it was sent and knows
/// nothing of `kind`; LAN keys are therefore stored with the hash prefixed `lan:`, which no
/// bare SHA-256 equals, so an older node can never take a LAN key for an agent token (it
/// does list them among a store's agent tokens, which grants nothing). `task_aliases`
/// keeps the task ids the agent minted for orders it took offline whose key the broker
/// already had, so that such an id still answers with the task it was merged into; older
/// brokers never read it.
const V18_OFFLINE: &str = r#"
ALTER TABLE agent_tokens ADD COLUMN kind TEXT NOT NULL DEFAULT 'agent';
CREATE TABLE task_aliases (
    alias_id   TEXT COLLATE "C" PRIMARY KEY,
    tenant_id  TEXT NOT NULL,
    task_id    TEXT COLLATE "C" NOT NULL,
    kind       TEXT NOT NULL,
    created_at BIGINT NOT NULL
);
CREATE INDEX task_aliases_by_task ON task_aliases (task_id);
"#;

/// The device log digest: each store agent reports every task's latest journal
/// record, kept as one row per (tenant, store, task id) and replaced by a later record.
/// Reconciliation reads a store's rows by task id range, which is the primary key; the ids
/// compare in the "C" collation as `tasks.id` does, so the range is the creation-time range
/// of the tasks. A new table only: brokers of the previous version never read it.
const V19_DEVICE_LOG: &str = r#"
CREATE TABLE device_log (
    tenant_id   TEXT NOT NULL,
    store_id    TEXT NOT NULL,
    task_id     TEXT COLLATE "C" NOT NULL,
    key         TEXT NOT NULL,
    printer_id  TEXT NOT NULL,
    state       TEXT NOT NULL,
    at          BIGINT NOT NULL,
    agent_id    TEXT NOT NULL,
    received_at BIGINT NOT NULL,
    PRIMARY KEY (tenant_id, store_id, task_id),
    FOREIGN KEY (tenant_id, store_id) REFERENCES stores (tenant_id, id)
);
"#;

/// A paper-out pauses the lane: a task counts the offers its printer refused
/// with a status that proves nothing printed, which do not spend `max_attempts`; a printer
/// keeps since when such a state holds its lane, for station failover and the console;
/// a station may have its own failover threshold.
/// Added columns with defaults only: brokers of the previous version neither read nor
/// write them (their refusals are simply not counted, as before).
const V20_PAUSED_LANES: &str = r#"
ALTER TABLE tasks ADD COLUMN refusals INTEGER NOT NULL DEFAULT 0;
ALTER TABLE printers ADD COLUMN paused_since BIGINT;
ALTER TABLE stations ADD COLUMN failover_after_ms BIGINT;
UPDATE printers SET paused_since = last_seen_at
 WHERE last_error IN ('no_paper', 'cover_open', 'paper_jam', 'offline');
"#;

/// Lanes progress by time: the sweeper looks every second at the printers whose
/// lane is paused (a printer that fell silent among them) to move their tickets on when
/// the printer says nothing; this index holds only those. Additive.
const V21_PAUSED_PRINTERS: &str = r#"
CREATE INDEX printers_paused ON printers (paused_since) WHERE paused_since IS NOT NULL;
"#;

/// HTTP Digest sign-in for Epson Server Direct Print printers. Digest never sends the
/// password, so the SHA-256 kept since V10 cannot check it; a login made from now on also
/// keeps RFC 7616's `HA1` (`H(username:realm:password)`) with MD5 and with SHA-256. Logins
/// made before have none and sign in with Basic until they are rotated. Additive.
const V22_DIGEST_LOGINS: &str = r#"
ALTER TABLE printer_credentials ADD COLUMN ha1_md5 TEXT;
ALTER TABLE printer_credentials ADD COLUMN ha1_sha256 TEXT;
"#;

/// The console finds tickets by the start of their business number (`A1003` finds
/// `A1003#kitchen`). `tasks_tenant_biz_no_idx` compares in the database's collation, in
/// which the strings with a prefix need not be one range; this index compares in "C"
/// (code point order), where they are, and the prefix query names that collation. An
/// index only: brokers of the previous version neither read nor need it.
const V23_BIZ_NO_PREFIX: &str = r#"
CREATE INDEX tasks_biz_no_prefix_idx ON tasks (tenant_id, biz_no COLLATE "C");
"#;

/// A manager disables an operator's login. A nullable column only: brokers of the previous
/// version neither read nor write it, so during a rolling upgrade an old node still lets a
/// disabled operator log in: disable operators once every node runs this release.
const V24_OPERATOR_DISABLED: &str = r#"
ALTER TABLE operators ADD COLUMN disabled_at BIGINT;
"#;

/// Alert endpoints that are group bots (WeCom, DingTalk, Feishu, Slack) get the bot's
/// message instead of onceprint's signed event. A column with a default: brokers of the
/// previous version neither read nor write it (and send such an endpoint onceprint's JSON,
/// which the bot refuses: add bot endpoints once every node runs this release).
const V25_WEBHOOK_FORMAT: &str = r#"
ALTER TABLE webhooks ADD COLUMN format TEXT NOT NULL DEFAULT 'onceprint';
"#;

/// The console's ticket list pages by id within a printer, as far back as a person goes,
/// at what one page costs: without it a rare printer walked the store's whole index to
/// fill a page. Written once per task (a task's printer seldom changes). A state filter
/// walks the store's index instead: an index with the state in it is rewritten at every
/// transition, which cost a fifth of intake and of printed/s (docs/BENCHMARKS.md).
/// Additive: an older broker neither reads nor needs it.
const V26_TASK_LIST_INDEXES: &str = r#"
CREATE INDEX tasks_by_printer ON tasks (tenant_id, printer_id, id);
"#;

/// Applies every migration the schema has not seen yet, one transaction each.
pub(crate) async fn apply(client: &mut deadpool_postgres::Client) -> StoreResult<()> {
    for (version, sql) in MIGRATIONS {
        let tx = client.transaction().await.map_err(pg_error)?;
        // The lock is held until this transaction ends. `current_schema()` is NULL when
        // the search path names no existing schema; coalescing keeps the lock taken in
        // that case, and the CREATE below then fails with PostgreSQL's own clear message.
        tx.batch_execute(&format!(
            "SELECT pg_advisory_xact_lock({LOCK_CLASS}, hashtext(coalesce(current_schema(), '')));
             CREATE TABLE IF NOT EXISTS schema_migrations (
                 version    INT PRIMARY KEY,
                 applied_at BIGINT NOT NULL
             );"
        ))
        .await
        .map_err(|e| migration_error(*version, e))?;
        let done = tx
            .query_opt("SELECT 1 FROM schema_migrations WHERE version = $1", &[version])
            .await
            .map_err(|e| migration_error(*version, e))?;
        if done.is_some() {
            // Nothing to do; ending the transaction releases the lock either way.
            tx.rollback().await.map_err(pg_error)?;
            continue;
        }
        tx.batch_execute(sql).await.map_err(|e| migration_error(*version, e))?;
        tx.execute(
            "INSERT INTO schema_migrations (version, applied_at)
             VALUES ($1, (extract(epoch FROM clock_timestamp()) * 1000)::bigint)",
            &[version],
        )
        .await
        .map_err(|e| migration_error(*version, e))?;
        tx.commit().await.map_err(|e| migration_error(*version, e))?;
        tracing::info!(version, "applied PostgreSQL migration");
    }
    Ok(())
}

/// Names the migration in the error, keeping the unavailable/backend split.
fn migration_error(version: i32, e: tokio_postgres::Error) -> StoreError {
    match pg_error(e) {
        StoreError::Unavailable(m) => StoreError::Unavailable(format!("migration {version}: {m}")),
        StoreError::Backend(m) => StoreError::Backend(format!("migration {version}: {m}")),
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_increase_from_one() {
        assert_eq!(MIGRATIONS[0].0, 1);
        assert!(MIGRATIONS.windows(2).all(|w| w[0].0 < w[1].0));
    }

    /// The clauses of `sql` (upper case, whitespace collapsed) that break the additive
    /// rule of the module documentation.
    fn not_additive(sql: &str) -> Vec<String> {
        let text = sql.split_whitespace().collect::<Vec<_>>().join(" ").to_uppercase();
        // Columns this migration adds and gives a default: tightening one of them to NOT
        // NULL in the same migration refuses nothing an older broker inserts (it names no
        // value for a column it does not know, and gets the default), so it is additive.
        let added: Vec<String> =
            text.split("ADD COLUMN ").skip(1).filter_map(|c| c.split_whitespace().next().map(str::to_owned)).collect();
        let defaulted = |column: &str| {
            added.iter().any(|a| a == column) && text.contains(&format!("ALTER COLUMN {column} SET DEFAULT"))
        };
        let mut found = Vec::new();
        for statement in text.split(';').map(str::trim) {
            for banned in ["DROP COLUMN", "DROP TABLE", "RENAME", "DROP FUNCTION", "DROP VIEW"] {
                if statement.contains(banned) {
                    found.push(statement.to_owned());
                }
            }
            // Changing an existing column: its type or tightening it to NOT NULL. (SET
            // DEFAULT and DROP NOT NULL only loosen, and are fine.)
            for part in statement.split("ALTER COLUMN ").skip(1) {
                let clause = part.split(',').next().unwrap_or(part);
                let column = clause.split_whitespace().next().unwrap_or_default();
                if clause.contains(" TYPE ") || (clause.contains("SET NOT NULL") && !defaulted(column)) {
                    found.push(format!("ALTER COLUMN {clause}"));
                }
            }
            // A new NOT NULL column without a default fails every insert of an older broker.
            for part in statement.split("ADD COLUMN ").skip(1) {
                let clause = part.split(',').next().unwrap_or(part);
                if clause.contains("NOT NULL") && !clause.contains("DEFAULT") {
                    found.push(format!("ADD COLUMN {clause}"));
                }
            }
        }
        found
    }

    /// The columns of the schema behind `client`: (table, column) → (type, nullable).
    async fn columns(client: &tokio_postgres::Client) -> std::collections::BTreeMap<(String, String), (String, bool)> {
        let rows = client
            .query(
                "SELECT table_name::text, column_name::text, data_type::text, is_nullable = 'YES'
                   FROM information_schema.columns WHERE table_schema = current_schema()",
                &[],
            )
            .await
            .expect("columns");
        rows.iter().map(|r| ((r.get(0), r.get(1)), (r.get(2), r.get(3)))).collect()
    }

    #[test]
    fn the_additive_check_catches_what_would_break_an_older_broker() {
        for bad in [
            "ALTER TABLE tasks DROP COLUMN sent_to;",
            "ALTER TABLE tasks RENAME COLUMN sent_to TO sent_for;",
            "ALTER TABLE tasks ALTER COLUMN attempts TYPE BIGINT;",
            "ALTER TABLE tasks ALTER COLUMN sent_to SET NOT NULL;",
            "ALTER TABLE tasks ADD COLUMN lane BIGINT NOT NULL;",
            "DROP TABLE settings;",
            // Added here, but with no default: an older broker's insert would fail.
            "ALTER TABLE tasks ADD COLUMN seq BIGINT; ALTER TABLE tasks ALTER COLUMN seq SET NOT NULL;",
        ] {
            assert_eq!(not_additive(bad).len(), 1, "{bad}");
        }
        for fine in [
            "ALTER TABLE tasks ADD COLUMN lane BIGINT NOT NULL DEFAULT 0, ADD COLUMN x TEXT;",
            "ALTER TABLE tasks ALTER COLUMN sent_to DROP NOT NULL;",
            "CREATE INDEX a ON t (b); DROP INDEX a;",
            "ALTER TABLE ledger DROP CONSTRAINT IF EXISTS ledger_task_id_fkey;",
            // Migration 14's shape: added, given a default, then NOT NULL.
            "ALTER TABLE tasks ADD COLUMN seq BIGINT; \
             ALTER TABLE tasks ALTER COLUMN seq SET DEFAULT nextval('s'), ALTER COLUMN seq SET NOT NULL;",
        ] {
            assert!(not_additive(fine).is_empty(), "{fine}");
        }
    }

    /// Brokers of release N keep running against N+1's schema (rolling upgrades): every
    /// migration is additive, by its SQL and by the columns each step leaves, except the
    /// listed old exceptions.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn every_migration_is_additive() {
        for (version, sql) in MIGRATIONS {
            let allowed: Vec<&str> =
                NOT_ADDITIVE.iter().filter(|(v, _, _)| v == version).map(|(_, clause, _)| *clause).collect();
            let found = not_additive(sql);
            let unexpected: Vec<&String> = found.iter().filter(|f| !allowed.iter().any(|a| f.starts_with(a))).collect();
            assert!(unexpected.is_empty(), "migration {version} is not additive: {unexpected:?}");
            assert_eq!(found.len(), allowed.len(), "migration {version}: an allowed exception is no longer there");
        }

        let Some(schema) = crate::testing::fresh_schema().await else {
            return;
        };
        let (client, connection) = tokio_postgres::connect(schema.url(), tokio_postgres::NoTls).await.expect("connect");
        let driver = tokio::spawn(connection);
        let mut before = columns(&client).await;
        for (version, sql) in MIGRATIONS {
            client.batch_execute(sql).await.expect("migration");
            let after = columns(&client).await;
            for ((table, column), (kind, nullable)) in &before {
                let now = after.get(&(table.clone(), column.clone()));
                assert!(now.is_some(), "migration {version} removed {table}.{column}");
                let Some((now_kind, now_nullable)) = now else { continue };
                assert_eq!(now_kind, kind, "migration {version} changed the type of {table}.{column}");
                assert!(
                    *now_nullable || !*nullable,
                    "migration {version} made the existing column {table}.{column} NOT NULL"
                );
            }
            before = after;
        }
        drop(client);
        let _ = driver.await;
        drop(schema);
    }

    /// A fresh schema as a broker of an earlier version left it: the migrations up to
    /// `version` applied and recorded, then `rows` inserted. `None` when no PostgreSQL is
    /// configured (the harness has said so).
    async fn schema_at(version: i32, rows: &str) -> Option<crate::testing::SchemaGuard> {
        let schema = crate::testing::fresh_schema().await?;
        let (client, connection) = tokio_postgres::connect(schema.url(), tokio_postgres::NoTls).await.expect("connect");
        let driver = tokio::spawn(connection);
        client
            .batch_execute("CREATE TABLE schema_migrations (version INT PRIMARY KEY, applied_at BIGINT NOT NULL)")
            .await
            .expect("schema_migrations");
        for (v, sql) in MIGRATIONS.iter().filter(|(v, _)| *v <= version) {
            client.batch_execute(sql).await.expect("old migration");
            client.execute("INSERT INTO schema_migrations VALUES ($1, 0)", &[v]).await.expect("version");
        }
        client.batch_execute(rows).await.expect("old rows");
        drop(client);
        let _ = driver.await;
        Some(schema)
    }

    /// The migration to time zones keeps every existing store's offset, now as text.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn stores_keep_their_utc_offset_as_a_time_zone() {
        use onceprint_store::Store as _;

        // The schema as the broker before time zones left it: migrations 1 to 5.
        let Some(schema) = schema_at(
            5,
            "INSERT INTO tenants (id, name, api_key_hash, created_at) VALUES ('t', 't', 'h', 0);
             INSERT INTO stores (tenant_id, id, name, utc_offset_minutes, created_at) VALUES
                 ('t', 'east', 'e', 480, 0), ('t', 'india', 'i', 330, 0), ('t', 'west', 'w', -300, 0),
                 ('t', 'newfoundland', 'n', -210, 0), ('t', 'utc', 'u', 0, 0);",
        )
        .await
        else {
            return;
        };

        let store = crate::PostgresStore::connect(schema.url(), 2).await.expect("migrate");
        assert_eq!(store.schema_version().await.expect("version"), LATEST_VERSION);
        let zones: Vec<(String, String)> =
            store.list_stores("t").await.expect("stores").into_iter().map(|s| (s.id, s.timezone)).collect();
        let want =
            [("east", "+08:00"), ("india", "+05:30"), ("newfoundland", "-03:30"), ("utc", "UTC"), ("west", "-05:00")];
        assert_eq!(zones, want.map(|(id, tz)| (id.to_owned(), tz.to_owned())));
        drop(store);
        drop(schema);
    }

    /// The migration to set-up changes keeps every key and token working, gives them ids,
    /// and leaves printers enabled.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn keys_and_tokens_of_earlier_versions_keep_working_with_ids() {
        use onceprint_store::Store as _;

        // The schema as the broker before set-up changes left it: migrations 1 to 8.
        let Some(schema) = schema_at(
            8,
            "INSERT INTO tenants (id, name, api_key_hash, created_at) VALUES ('t', 't', '0123456789abcdef0123', 5);
             INSERT INTO stores (tenant_id, id, name, created_at) VALUES ('t', 's', 's', 0);
             INSERT INTO printers (tenant_id, id, store_id, name, transport, created_at)
                 VALUES ('t', 'p', 's', 'p', '{}', 0);
             INSERT INTO agent_tokens (token_hash, tenant_id, store_id, created_at)
                 VALUES ('fedcba9876543210fe', 't', 's', 7);",
        )
        .await
        else {
            return;
        };

        let store = crate::PostgresStore::connect(schema.url(), 2).await.expect("migrate");
        let key = store.tenant_by_key_hash("0123456789abcdef0123").await.expect("read").expect("key still works");
        assert_eq!((key.tenant.id.as_str(), key.key_id.as_str()), ("t", "key_0123456789abcdef"));
        assert_eq!(store.list_api_keys("t").await.expect("keys")[0].created_at, 5);
        assert!(store.agent_by_token_hash("fedcba9876543210fe").await.expect("read").is_some());
        let tokens = store.list_agent_tokens("t", "s", onceprint_store::TokenKind::Agent).await.expect("tokens");
        assert_eq!((tokens[0].id.as_str(), tokens[0].created_at), ("tok_fedcba9876543210", 7));
        assert!(store.get_printer("t", "p").await.expect("read").expect("printer").enabled);
        drop(store);
        drop(schema);
    }

    /// The migration to the lane sequence numbers existing tasks in id order, and a broker
    /// of the previous version, which inserts tasks without `seq`, gets one from the
    /// default that lines its task up behind the others, even with a smaller id.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn existing_and_old_brokers_tasks_get_a_sequence_in_order() {
        use onceprint_store::Store as _;

        let task = |id: &str, biz_no: &str| {
            format!(
                "INSERT INTO tasks (id, tenant_id, store_id, printer_id, target, biz_no, print_type, priority,
                                    content_type, content, fingerprint, state, created_at, updated_at)
                 VALUES ('{id}', 't', 's', 'p', 'printer:p', '{biz_no}', 'receipt', 10, 'text', '\\x00', 'f',
                         'pending', 1, 1);"
            )
        };
        // The schema as the broker before the sequence left it: migrations 1 to 13.
        let Some(schema) = schema_at(
            13,
            &format!(
                "INSERT INTO tenants (id, name, api_key_hash, created_at) VALUES ('t', 't', 'h', 0);
                 INSERT INTO stores (tenant_id, id, name, created_at) VALUES ('t', 's', 's', 0);
                 INSERT INTO printers (tenant_id, id, store_id, name, transport, created_at)
                     VALUES ('t', 'p', 's', 'p', '{{}}', 0);
                 {}{}",
                task("T2", "B2"),
                task("T1", "B1")
            ),
        )
        .await
        else {
            return;
        };
        let store = crate::PostgresStore::connect(schema.url(), 2).await.expect("migrate");
        let (client, connection) = tokio_postgres::connect(schema.url(), tokio_postgres::NoTls).await.expect("connect");
        let driver = tokio::spawn(connection);
        // As a broker of the previous version inserts: no `seq`, and an id that sorts first.
        client.batch_execute(&task("T0", "B0")).await.expect("old broker's insert");
        let seqs: Vec<(String, i64)> = client
            .query("SELECT id, seq FROM tasks ORDER BY seq", &[])
            .await
            .expect("read")
            .iter()
            .map(|r| (r.get(0), r.get(1)))
            .collect();
        assert_eq!(seqs, vec![("T1".to_owned(), 1), ("T2".to_owned(), 2), ("T0".to_owned(), 3)]);
        let lane = store.lane("t", "p").await.expect("lane");
        assert_eq!(lane.waiting.map(|t| t.task_id).as_deref(), Some("T1"));
        drop(client);
        let _ = driver.await;
        drop(store);
        drop(schema);
    }
}
