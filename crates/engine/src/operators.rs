//! Operators: the people who solve the one per cent in the console, each with an
//! identity of their own, per tenant.
//!
//! This module owns the rules of operator accounts and their sessions: who may create an
//! operator (a tenant API key, or a manager of the tenant), what a valid account is (an id,
//! a name, a role, a staff member's stores, a password of at least
//! [`MIN_PASSWORD_CHARS`] characters), how a password is kept (argon2id, a PHC string with
//! its own random salt: a slow hash, because people choose guessable passwords, unlike the
//! 256-bit random API keys that a fast hash protects well enough), logging in with the
//! throttle that makes guessing slow (counted per account *and* source, so that a stranger
//! guessing from elsewhere does not lock a manager out mid-rush, with a ceiling per account
//! for guesses spread over many sources), disabling a login, a new password and lifting a
//! lock-out, and sessions: console sessions and operator tokens
//! are both random 256-bit secrets of which only the SHA-256 is stored; each expires, and
//! each can be revoked (logout, or a manager or API key revoking all of an operator's).
//!
//! What an operator may then see is decided by [`Operator::may_see_store`]; the HTTP layer
//! asks it before showing or touching anything of a store.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use argon2::password_hash::{PasswordHash, PasswordHasher, PasswordVerifier, SaltString};
use argon2::Argon2;
use onceprint_core::{validate_id, CoreError, Millis};
use onceprint_store::{
    ChangeOperator, NewOperator, NewOperatorSession, Operator, OperatorChange, OperatorRole, OperatorSession,
    RevokeOperatorSessions, SessionKind, SetupAudit, Store, StoreError,
};
use serde_json::json;

use crate::clock::now_ms;
use crate::secrets;

/// Shortest accepted password. Length is what makes a password hard to guess; no other
/// composition rule is imposed (NIST SP 800-63B).
pub const MIN_PASSWORD_CHARS: usize = 10;
/// Longest accepted password: argon2 hashes any length, but a megabyte "password" would only
/// cost the broker time.
const MAX_PASSWORD_CHARS: usize = 256;
/// Most stores a staff member is bound to.
const MAX_STORES: usize = 64;
/// An account's failed logins from all sources together, as a multiple of
/// `login_max_failures`, after which it is locked for every source until the window passes
/// or a manager unlocks it. Guesses spread over many addresses are still few per window,
/// while one stranger alone can never lock out the account's owner.
pub const ACCOUNT_FAILURES_FACTOR: u32 = 10;

/// Settings of operator sessions and the login throttle.
#[derive(Debug, Clone)]
pub struct OperatorsConfig {
    /// How long a console login lasts (default 12 hours: a shift and some).
    pub session_ttl_ms: i64,
    /// How long an operator token for the API lasts (default 30 days).
    pub token_ttl_ms: i64,
    /// Failed logins of one account from one source (the client's address) within
    /// `login_window_ms` after which further attempts from that source, right or wrong, are
    /// refused until the window has passed (default 5). From all sources together an account
    /// takes [`ACCOUNT_FAILURES_FACTOR`] times as many before every source is refused.
    pub login_max_failures: u32,
    /// Default 15 minutes.
    pub login_window_ms: i64,
}

impl Default for OperatorsConfig {
    fn default() -> Self {
        OperatorsConfig {
            session_ttl_ms: 12 * 3600 * 1000,
            token_ttl_ms: 30 * 24 * 3600 * 1000,
            login_max_failures: 5,
            login_window_ms: 15 * 60 * 1000,
        }
    }
}

/// Why an operator call was refused.
#[derive(Debug, thiserror::Error)]
pub enum OperatorError {
    #[error(transparent)]
    Invalid(#[from] CoreError),
    /// Unknown tenant, unknown operator or wrong password: deliberately one answer, so a
    /// caller cannot find out which operator ids exist.
    #[error("wrong tenant, operator or password")]
    BadLogin,
    /// Too many failed logins of this account lately.
    #[error("too many failed logins for this operator; try again in {retry_after_s} s")]
    Throttled { retry_after_s: u64 },
    /// The password was right but a manager disabled this login.
    #[error("operator {0:?} is disabled; a manager can enable it again")]
    Disabled(String),
    /// The caller may not do this (a staff member creating operators, for instance).
    #[error("{0}")]
    Forbidden(String),
    #[error("{0}")]
    NotFound(String),
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Who creates an operator or revokes sessions: a tenant API key or a manager.
#[derive(Debug, Clone, Copy)]
pub enum Creator<'a> {
    ApiKey { tenant_id: &'a str, key_id: &'a str },
    Manager(&'a Operator),
}

impl Creator<'_> {
    fn tenant_id(&self) -> &str {
        match self {
            Creator::ApiKey { tenant_id, .. } => tenant_id,
            Creator::Manager(o) => &o.tenant_id,
        }
    }

    fn actor(&self) -> Result<String, OperatorError> {
        match self {
            Creator::ApiKey { key_id, .. } => Ok(format!("api_key:{key_id}")),
            Creator::Manager(o) if o.role == OperatorRole::Manager => Ok(format!("operator:{}", o.id)),
            Creator::Manager(o) => Err(OperatorError::Forbidden(format!(
                "operator {:?} is staff; only a manager (or the tenant's API key) manages operators",
                o.id
            ))),
        }
    }
}

/// An account as the caller wants it.
#[derive(Debug, Clone)]
pub struct OperatorSpec {
    pub id: String,
    pub name: Option<String>,
    /// `staff` or `manager`.
    pub role: String,
    /// A staff member's stores (at least one); must be empty or absent for a manager.
    pub stores: Vec<String>,
    pub password: String,
}

/// A session just started: the secret to hand to the client (once) and the session.
#[derive(Clone)]
pub struct Login {
    pub secret: String,
    pub session: OperatorSession,
}

impl std::fmt::Debug for Login {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Login").field("secret", &"***").field("session", &self.session.id).finish()
    }
}

#[derive(Debug, Clone, Copy)]
struct Failures {
    count: u32,
    first_at: Millis,
}

/// (tenant, operator id in lower case): the key of an account's failures.
type Account = (String, String);

/// Failed logins in this process: per account and source, and per account from every
/// source together.
#[derive(Default)]
struct Throttle {
    by_source: HashMap<(Account, String), Failures>,
    by_account: HashMap<Account, Failures>,
}

/// Whether an account's logins are refused now, and until when.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lockout {
    /// The latest end of a lock-out of this account (a source's or the whole account's).
    pub until: Millis,
    /// How many sources are locked out.
    pub sources: usize,
    /// Whether every source is refused (the account's ceiling was reached).
    pub account: bool,
}

/// The operator service. Share it behind an `Arc`.
pub struct Operators {
    store: Arc<dyn Store>,
    config: OperatorsConfig,
    /// Failed logins in this process. A cluster of nodes multiplies the attempts an
    /// attacker gets by the number of nodes, which the slow hash still keeps far from a
    /// useful guessing rate; an unlock lifts the lock-out on the node that serves it.
    failures: Mutex<Throttle>,
}

fn hasher() -> Argon2<'static> {
    // The crate's defaults are the parameters OWASP recommends for argon2id (19 MiB,
    // two passes, one lane): tens of milliseconds per login on a small server.
    Argon2::default()
}

/// The argon2id PHC string of `password` with a fresh random salt.
pub fn hash_password(password: &str) -> Result<String, OperatorError> {
    let salt_bytes: [u8; 16] = rand::random();
    let salt = SaltString::encode_b64(&salt_bytes)
        .map_err(|e| OperatorError::Store(StoreError::Backend(format!("salt: {e}"))))?;
    hasher()
        .hash_password(password.as_bytes(), &salt)
        .map(|h| h.to_string())
        .map_err(|e| OperatorError::Store(StoreError::Backend(format!("argon2: {e}"))))
}

/// Whether `password` matches the stored PHC string. A malformed stored hash matches
/// nothing.
pub fn verify_password(password: &str, phc: &str) -> bool {
    match PasswordHash::new(phc) {
        Ok(parsed) => hasher().verify_password(password.as_bytes(), &parsed).is_ok(),
        Err(_) => false,
    }
}

/// A PHC string of no one's password, verified against when the operator does not exist,
/// so that an unknown id takes as long to refuse as a wrong password.
fn decoy_hash() -> &'static str {
    static DECOY: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    DECOY.get_or_init(|| hash_password(&secrets::generate("decoy_")).unwrap_or_default())
}

/// Lengths count characters, as the OpenAPI document's `maxLength` does.
fn check_name(name: &str) -> Result<(), CoreError> {
    if name.trim().is_empty() || name.chars().count() > 200 || name.chars().any(char::is_control) {
        return Err(CoreError::invalid("name", "must be 1–200 characters without control characters"));
    }
    Ok(())
}

fn check_password(password: &str) -> Result<(), CoreError> {
    let len = password.chars().count();
    if !(MIN_PASSWORD_CHARS..=MAX_PASSWORD_CHARS).contains(&len) {
        return Err(CoreError::invalid(
            "password",
            format!("must be {MIN_PASSWORD_CHARS}–{MAX_PASSWORD_CHARS} characters; a phrase of several words is best"),
        ));
    }
    Ok(())
}

impl Operators {
    pub fn new(store: Arc<dyn Store>, config: OperatorsConfig) -> Operators {
        Operators { store, config, failures: Mutex::new(Throttle::default()) }
    }

    pub fn config(&self) -> &OperatorsConfig {
        &self.config
    }

    /// Creates an operator account (audited as a set-up change by `creator`).
    pub async fn create(&self, creator: Creator<'_>, spec: OperatorSpec) -> Result<Operator, OperatorError> {
        let actor = creator.actor()?;
        validate_id("id", &spec.id)?;
        let name = spec.name.clone().unwrap_or_else(|| spec.id.clone());
        check_name(&name)?;
        let role = OperatorRole::parse(&spec.role)
            .ok_or_else(|| CoreError::invalid("role", "must be \"staff\" (bound to stores) or \"manager\""))?;
        match role {
            OperatorRole::Staff if spec.stores.is_empty() => {
                return Err(CoreError::invalid("stores", "a staff member needs at least one store").into())
            }
            OperatorRole::Manager if !spec.stores.is_empty() => {
                return Err(CoreError::invalid("stores", "a manager sees every store; leave stores out").into())
            }
            _ => {}
        }
        if spec.stores.len() > MAX_STORES {
            return Err(CoreError::invalid("stores", format!("at most {MAX_STORES} stores")).into());
        }
        for (i, s) in spec.stores.iter().enumerate() {
            validate_id(&format!("stores[{i}]"), s)?;
        }
        check_password(&spec.password)?;
        let password = spec.password;
        let password_hash = tokio::task::spawn_blocking(move || hash_password(&password))
            .await
            .map_err(|e| StoreError::Backend(format!("hashing task: {e}")))??;
        let mut stores = spec.stores;
        stores.sort();
        stores.dedup();
        let operator = self
            .store
            .create_operator(NewOperator {
                audit: SetupAudit { actor, detail: json!({ "name": name, "role": role.as_str(), "stores": stores }) },
                tenant_id: creator.tenant_id().to_owned(),
                id: spec.id,
                name,
                role,
                store_ids: stores,
                password_hash,
                now: now_ms(),
            })
            .await?;
        Ok(operator)
    }

    pub async fn list(&self, tenant_id: &str) -> Result<Vec<Operator>, OperatorError> {
        Ok(self.store.list_operators(tenant_id).await?)
    }

    /// Checks a login from `source` (the client's address, or "" when unknown) and starts
    /// a new session of `kind`. Every login makes a new random secret: a session id the
    /// client brought along is never adopted (no fixation).
    pub async fn login(
        &self,
        tenant_id: &str,
        operator_id: &str,
        password: &str,
        kind: SessionKind,
        source: &str,
    ) -> Result<Login, OperatorError> {
        let key = (tenant_id.to_owned(), operator_id.to_ascii_lowercase());
        let now = now_ms();
        self.check_throttle(&key, source, now)?;
        let found = if validate_id("tenant_id", tenant_id).is_ok() && validate_id("operator_id", operator_id).is_ok() {
            self.store.operator_login(tenant_id, operator_id).await?
        } else {
            None
        };
        let (operator, phc) = match found {
            Some((o, h)) => (Some(o), h),
            None => (None, decoy_hash().to_owned()),
        };
        let given = password.to_owned();
        let matches = tokio::task::spawn_blocking(move || verify_password(&given, &phc))
            .await
            .map_err(|e| StoreError::Backend(format!("hashing task: {e}")))?;
        let Some(operator) = operator.filter(|_| matches) else {
            self.record_failure(key, source, now_ms());
            tracing::warn!(tenant_id, operator_id, source, "operator login refused");
            return Err(OperatorError::BadLogin);
        };
        // Only after the right password: a stranger learns nothing about the account.
        if operator.disabled_at.is_some() {
            tracing::warn!(tenant_id, operator_id, "login of a disabled operator refused");
            return Err(OperatorError::Disabled(operator.id));
        }
        // The right password from this source: its own failures are forgotten; those of
        // other sources (someone else guessing) still count.
        if let Ok(mut f) = self.failures.lock() {
            f.by_source.remove(&(key, source.to_owned()));
        }
        let ttl = match kind {
            SessionKind::Console => self.config.session_ttl_ms,
            SessionKind::Token => self.config.token_ttl_ms,
        };
        let secret = match kind {
            SessionKind::Console => secrets::generate("ops_"),
            SessionKind::Token => secrets::generate("opo_"),
        };
        let now = now_ms();
        let new = NewOperatorSession {
            id: secrets::short_id("ses_"),
            token_hash: secrets::hash(&secret),
            tenant_id: operator.tenant_id.clone(),
            operator_id: operator.id.clone(),
            kind,
            csrf_token: secrets::generate("csrf_"),
            created_at: now,
            expires_at: now.saturating_add(ttl),
        };
        self.store.create_operator_session(new.clone()).await?;
        tracing::info!(tenant_id, operator_id, session = %new.id, kind = kind.as_str(), "operator logged in");
        Ok(Login {
            secret,
            session: OperatorSession {
                id: new.id,
                kind,
                csrf_token: new.csrf_token,
                created_at: new.created_at,
                expires_at: new.expires_at,
                operator,
            },
        })
    }

    /// The live session of a secret: `None` when unknown, revoked or expired.
    pub async fn authenticate(&self, secret: &str) -> Result<Option<OperatorSession>, OperatorError> {
        let Some(session) = self.store.operator_session(&secrets::hash(secret)).await? else { return Ok(None) };
        if session.expires_at <= now_ms() {
            return Ok(None);
        }
        Ok(Some(session))
    }

    /// Ends the session of a secret (logout); `false` when it was not active.
    pub async fn logout(&self, secret: &str) -> Result<bool, OperatorError> {
        Ok(self.store.revoke_operator_session(&secrets::hash(secret), now_ms()).await?)
    }

    /// Ends every session of an operator; how many were active.
    pub async fn revoke_sessions(&self, creator: Creator<'_>, operator_id: &str) -> Result<u64, OperatorError> {
        let actor = creator.actor()?;
        self.store
            .revoke_operator_sessions(RevokeOperatorSessions {
                tenant_id: creator.tenant_id().to_owned(),
                operator_id: operator_id.to_owned(),
                now: now_ms(),
                audit: SetupAudit { actor, detail: json!({ "sessions": "revoked" }) },
            })
            .await?
            .ok_or_else(|| OperatorError::NotFound(format!("no operator {operator_id:?}")))
    }

    /// Disables or enables an operator's login (audited). Disabling ends every session of
    /// the operator at once; a manager cannot disable their own login.
    pub async fn set_enabled(
        &self,
        creator: Creator<'_>,
        operator_id: &str,
        enabled: bool,
    ) -> Result<Operator, OperatorError> {
        if let Creator::Manager(me) = creator {
            if !enabled && me.id == operator_id {
                return Err(OperatorError::Forbidden(
                    "a manager cannot disable their own login; another manager or the tenant's API key can".into(),
                ));
            }
        }
        let (change, detail) = if enabled {
            (OperatorChange::Enable, json!({ "login": "enabled" }))
        } else {
            (OperatorChange::Disable, json!({ "login": "disabled", "sessions": "revoked" }))
        };
        self.change(creator, operator_id, change, detail).await
    }

    /// Gives an operator a new password (audited, the password itself never): every
    /// session ends, and the account's failed logins are forgotten.
    pub async fn set_password(
        &self,
        creator: Creator<'_>,
        operator_id: &str,
        password: String,
    ) -> Result<Operator, OperatorError> {
        creator.actor()?;
        check_password(&password)?;
        let password_hash = tokio::task::spawn_blocking(move || hash_password(&password))
            .await
            .map_err(|e| StoreError::Backend(format!("hashing task: {e}")))??;
        let detail = json!({ "password": "replaced", "sessions": "revoked" });
        let changed = self.change(creator, operator_id, OperatorChange::Password { password_hash }, detail).await?;
        self.forget_failures(creator.tenant_id(), operator_id);
        Ok(changed)
    }

    /// Lifts a lock-out of an operator's login in this process (audited): every source may
    /// try again at once.
    pub async fn unlock(&self, creator: Creator<'_>, operator_id: &str) -> Result<Operator, OperatorError> {
        let lock = self.lockout(creator.tenant_id(), operator_id);
        let detail = json!({ "login": "unlocked", "sources": lock.as_ref().map_or(0, |l| l.sources) });
        let changed = self.change(creator, operator_id, OperatorChange::Unlock, detail).await?;
        self.forget_failures(creator.tenant_id(), operator_id);
        Ok(changed)
    }

    /// The lock-out of an operator's login in this process, if any source is refused now.
    pub fn lockout(&self, tenant_id: &str, operator_id: &str) -> Option<Lockout> {
        let now = now_ms();
        let window = self.config.login_window_ms;
        let max = self.config.login_max_failures;
        let account = (tenant_id.to_owned(), operator_id.to_ascii_lowercase());
        let f = self.failures.lock().ok()?;
        let locked = |x: &Failures, limit: u32| (x.count >= limit && now - x.first_at < window).then_some(x.first_at);
        let whole = f.by_account.get(&account).and_then(|x| locked(x, max.saturating_mul(ACCOUNT_FAILURES_FACTOR)));
        let sources: Vec<Millis> =
            f.by_source.iter().filter(|((a, _), _)| *a == account).filter_map(|(_, x)| locked(x, max)).collect();
        let first = whole.into_iter().chain(sources.iter().copied()).max()?;
        Some(Lockout { until: first + window, sources: sources.len(), account: whole.is_some() })
    }

    async fn change(
        &self,
        creator: Creator<'_>,
        operator_id: &str,
        change: OperatorChange,
        detail: serde_json::Value,
    ) -> Result<Operator, OperatorError> {
        let actor = creator.actor()?;
        self.store
            .change_operator(ChangeOperator {
                tenant_id: creator.tenant_id().to_owned(),
                operator_id: operator_id.to_owned(),
                change,
                now: now_ms(),
                audit: SetupAudit { actor, detail },
            })
            .await?
            .ok_or_else(|| OperatorError::NotFound(format!("no operator {operator_id:?}")))
    }

    fn forget_failures(&self, tenant_id: &str, operator_id: &str) {
        let account = (tenant_id.to_owned(), operator_id.to_ascii_lowercase());
        if let Ok(mut f) = self.failures.lock() {
            f.by_account.remove(&account);
            f.by_source.retain(|(a, _), _| *a != account);
        }
    }

    fn check_throttle(&self, account: &Account, source: &str, now: Millis) -> Result<(), OperatorError> {
        let Ok(mut f) = self.failures.lock() else { return Ok(()) };
        let window = self.config.login_window_ms;
        // Forgetting old entries here keeps the maps as small as the recent failures.
        f.by_source.retain(|_, x| now - x.first_at < window);
        f.by_account.retain(|_, x| now - x.first_at < window);
        let max = self.config.login_max_failures;
        let refused = |x: Option<&Failures>, limit: u32| x.filter(|x| x.count >= limit).map(|x| x.first_at);
        let by_account = refused(f.by_account.get(account), max.saturating_mul(ACCOUNT_FAILURES_FACTOR));
        let by_source = refused(f.by_source.get(&(account.clone(), source.to_owned())), max);
        match by_account.into_iter().chain(by_source).max() {
            Some(first_at) => {
                let left_ms = (first_at + window - now).max(1000);
                Err(OperatorError::Throttled { retry_after_s: (left_ms as u64).div_ceil(1000) })
            }
            None => Ok(()),
        }
    }

    fn record_failure(&self, account: Account, source: &str, now: Millis) {
        if let Ok(mut f) = self.failures.lock() {
            f.by_source
                .entry((account.clone(), source.to_owned()))
                .or_insert(Failures { count: 0, first_at: now })
                .count += 1;
            f.by_account.entry(account).or_insert(Failures { count: 0, first_at: now }).count += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_hash_with_argon2id_and_a_salt_of_their_own() {
        let a = hash_password("correct horse battery").unwrap();
        let b = hash_password("correct horse battery").unwrap();
        assert!(a.starts_with("$argon2id$"), "{a}");
        assert_ne!(a, b, "every hash has its own salt");
        assert!(verify_password("correct horse battery", &a));
        assert!(!verify_password("correct horse batter", &a));
        assert!(!verify_password("anything", "not a phc string"));
    }
}
