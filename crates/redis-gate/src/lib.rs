//! The shared first gate on Redis (`serve --redis-url`), shared by several broker nodes.
//!
//! This crate owns the Redis client of the broker and the layout of its keys: an
//! idempotency key's first sighting is claimed with `SET k - NX EX <claim ttl>`, and once
//! the task is durable the key is remembered as `SET k "<task_id> <fingerprint>" EX
//! <remember ttl>`. It implements `onceprint_engine::SharedGate`, so that the engine never
//! links a Redis client (as `onceprint-mqtt` keeps the MQTT client out of it).
//!
//! It must never decide an answer: what it reads is only a hint that intake checks against
//! the store by task id, and a claim without a task id decides nothing. It must never
//! block or fail intake either: it connects lazily, the connection manager reconnects in
//! the background, and the engine's guard bounds every call and bypasses the gate after a
//! failure. Nothing here waits for Redis at start.

pub mod testing;

use std::time::Duration;

use onceprint_core::IdempotencyKey;
use onceprint_engine::{SharedEntry, SharedGate, SharedGateError};
use redis::aio::{ConnectionManager, ConnectionManagerConfig};

/// The value of a claim: no task yet. It cannot be mistaken for a remembered task, whose
/// value always holds a space between task id and fingerprint.
const CLAIM: &str = "-";

/// Settings of the shared gate.
#[derive(Clone)]
pub struct RedisGateSettings {
    /// `redis://[[USER]:PASSWORD@]HOST[:PORT][/DB]` (or `rediss://`, not compiled in).
    pub url: String,
    /// Put before every key, so that one Redis can serve several clusters (or tests).
    pub prefix: String,
    /// How long a claim without a task lives: a node that died while committing leaves
    /// nothing behind for longer than this.
    pub claim_ttl: Duration,
    /// How long a committed task is remembered; retries come within minutes, so this only
    /// bounds Redis' memory.
    pub remember_ttl: Duration,
    /// Per-operation bound used for connecting and for answers (the engine's guard bounds
    /// every call again).
    pub timeout: Duration,
}

impl std::fmt::Debug for RedisGateSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The URL may carry a password: only the part after the `@` is shown.
        f.debug_struct("RedisGateSettings")
            .field("url", &redacted(&self.url))
            .field("prefix", &self.prefix)
            .field("claim_ttl", &self.claim_ttl)
            .field("remember_ttl", &self.remember_ttl)
            .field("timeout", &self.timeout)
            .finish()
    }
}

impl RedisGateSettings {
    /// Settings with the defaults: prefix `onceprint:`, claims for 30 s, tasks for a day,
    /// 25 ms per operation.
    pub fn new(url: &str) -> RedisGateSettings {
        RedisGateSettings {
            url: url.to_owned(),
            prefix: "onceprint:".to_owned(),
            claim_ttl: Duration::from_secs(30),
            remember_ttl: Duration::from_secs(24 * 3600),
            timeout: Duration::from_millis(25),
        }
    }
}

/// The URL with any password replaced by `***`.
fn redacted(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(s), Some(at)) if at > s => format!("{}***{}", &url[..s + 3], &url[at..]),
        _ => url.to_owned(),
    }
}

/// Failures while setting the gate up.
#[derive(Debug, thiserror::Error)]
pub enum RedisGateError {
    #[error("--redis-url {url}: {reason}")]
    BadUrl { url: String, reason: String },
    #[error("--redis-prefix must not be empty")]
    EmptyPrefix,
}

/// The shared gate on one Redis server.
pub struct RedisGate {
    client: redis::Client,
    conn: tokio::sync::OnceCell<ConnectionManager>,
    settings: RedisGateSettings,
}

impl RedisGate {
    /// Checks the settings; connects on first use, not now, so that a Redis down at start
    /// delays nothing.
    pub fn new(settings: RedisGateSettings) -> Result<RedisGate, RedisGateError> {
        if settings.prefix.is_empty() {
            return Err(RedisGateError::EmptyPrefix);
        }
        let client = redis::Client::open(settings.url.as_str())
            .map_err(|e| RedisGateError::BadUrl { url: redacted(&settings.url), reason: e.to_string() })?;
        Ok(RedisGate { client, conn: tokio::sync::OnceCell::new(), settings })
    }

    /// The Redis key of an idempotency key. Tenant, target and print type are ids (no
    /// `|` in their alphabet), and `biz_no` comes last, so the joined key is unambiguous
    /// whatever `biz_no` holds.
    pub fn redis_key(&self, key: &IdempotencyKey) -> String {
        let mut s = String::with_capacity(
            self.settings.prefix.len()
                + key.tenant_id.len()
                + key.target.len()
                + key.print_type.len()
                + key.biz_no.len()
                + 3,
        );
        s.push_str(&self.settings.prefix);
        s.push_str(&key.tenant_id);
        s.push('|');
        s.push_str(&key.target);
        s.push('|');
        s.push_str(&key.print_type);
        s.push('|');
        s.push_str(&key.biz_no);
        s
    }

    /// The connection manager, made on first use. A failed attempt is made again by the
    /// next call; once made, the manager reconnects by itself after a connection is lost.
    async fn connection(&self) -> Result<ConnectionManager, SharedGateError> {
        let timeout = self.settings.timeout.max(Duration::from_millis(1));
        let conn = self
            .conn
            .get_or_try_init(|| async {
                // Reconnection runs in the background while calls fail fast: few quick
                // retries, a connect bounded well below TCP's own timeout (a host that
                // does not answer at all), and answers bounded by the operation timeout.
                let config = ConnectionManagerConfig::new()
                    .set_number_of_retries(2)
                    .set_factor(50)
                    .set_max_delay(500)
                    .set_connection_timeout(Duration::from_secs(1))
                    .set_response_timeout(timeout);
                ConnectionManager::new_with_config(self.client.clone(), config).await
            })
            .await
            .map_err(|e| SharedGateError(e.to_string()))?;
        Ok(conn.clone())
    }

    fn secs(d: Duration) -> u64 {
        d.as_secs().max(1)
    }
}

/// What a value read from Redis says.
fn parse_value(value: Option<&str>) -> SharedEntry {
    match value.and_then(|v| v.split_once(' ')) {
        Some((task_id, fingerprint)) if !task_id.is_empty() && !fingerprint.is_empty() => {
            SharedEntry::Known { task_id: task_id.to_owned(), fingerprint: fingerprint.to_owned() }
        }
        // Our claim marker, a claim that expired between the two commands, or a value
        // this version does not understand: nothing to answer from, the database decides.
        _ => SharedEntry::ClaimedElsewhere,
    }
}

#[async_trait::async_trait]
impl SharedGate for RedisGate {
    async fn claim(&self, key: &IdempotencyKey) -> Result<SharedEntry, SharedGateError> {
        let mut conn = self.connection().await?;
        let k = self.redis_key(key);
        // One round trip: the claim, then whatever is there now. SET … NX answers OK when
        // it claimed, nil when the key existed (and changed nothing). Two commands rather
        // than SET … NX GET, which needs Redis 7.
        let (set, value): (redis::Value, Option<String>) = redis::pipe()
            .cmd("SET")
            .arg(&k)
            .arg(CLAIM)
            .arg("NX")
            .arg("EX")
            .arg(Self::secs(self.settings.claim_ttl))
            .cmd("GET")
            .arg(&k)
            .query_async(&mut conn)
            .await
            .map_err(|e| SharedGateError(e.to_string()))?;
        if matches!(set, redis::Value::Okay) {
            return Ok(SharedEntry::Claimed);
        }
        Ok(parse_value(value.as_deref()))
    }

    async fn remember(&self, key: &IdempotencyKey, task_id: &str, fingerprint: &str) -> Result<(), SharedGateError> {
        let mut conn = self.connection().await?;
        let mut value = String::with_capacity(task_id.len() + 1 + fingerprint.len());
        value.push_str(task_id);
        value.push(' ');
        value.push_str(fingerprint);
        let () = redis::cmd("SET")
            .arg(self.redis_key(key))
            .arg(value)
            .arg("EX")
            .arg(Self::secs(self.settings.remember_ttl))
            .query_async(&mut conn)
            .await
            .map_err(|e| SharedGateError(e.to_string()))?;
        Ok(())
    }

    fn describe(&self) -> String {
        redacted(&self.settings.url)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_are_not_shown() {
        assert_eq!(redacted("redis://:s3cret@10.0.0.1:6379/0"), "redis://***@10.0.0.1:6379/0");
        assert_eq!(redacted("redis://127.0.0.1:6379"), "redis://127.0.0.1:6379");
        let s = RedisGateSettings::new("redis://u:pw@h:1");
        assert!(!format!("{s:?}").contains("pw"));
    }

    #[test]
    fn values_are_read_as_tasks_or_claims() {
        assert_eq!(
            parse_value(Some("01J0 abcd")),
            SharedEntry::Known { task_id: "01J0".into(), fingerprint: "abcd".into() }
        );
        assert_eq!(parse_value(Some(CLAIM)), SharedEntry::ClaimedElsewhere);
        assert_eq!(parse_value(None), SharedEntry::ClaimedElsewhere);
        assert_eq!(parse_value(Some(" x")), SharedEntry::ClaimedElsewhere);
    }

    #[test]
    fn keys_are_prefixed_and_unambiguous() {
        let mut s = RedisGateSettings::new("redis://127.0.0.1:1");
        s.prefix = "c1:".into();
        let g = RedisGate::new(s).expect("valid settings");
        let k = IdempotencyKey::new("t1", &onceprint_core::Target::Printer("p1".into()), "A|1 x", "receipt");
        assert_eq!(g.redis_key(&k), "c1:t1|printer:p1|receipt|A|1 x");
    }
}
