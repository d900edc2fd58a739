//! Fresh, empty PostgreSQL stores for tests, each in a schema of its own.
//!
//! Tests run against the server named by `ONCEPRINT_TEST_POSTGRES`. When it is not set the
//! tests are skipped with a line on stderr; when it is set but the server cannot be
//! reached they fail, because a CI that configured PostgreSQL must not pass silently
//! without it. Each store lives in a new schema that its guard drops afterwards, so tests
//! can run in parallel against one database.
//!
//! The module is always compiled (it is small and has no extra dependencies), so that the
//! server's and the engine's tests can use it too.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use onceprint_store::testing::Harness;
use tokio_postgres::NoTls;

use crate::PostgresStore;

/// The environment variable naming the test server, e.g.
/// `postgres://postgres@127.0.0.1:5432/test`.
pub const ENV: &str = "ONCEPRINT_TEST_POSTGRES";

/// Connections each test store may open. Small, because tests run in parallel and the
/// server's connection limit is shared.
const TEST_POOL_SIZE: usize = 8;

/// A schema created for one test; dropped, with everything in it, when this is dropped.
pub struct SchemaGuard {
    /// The URL as configured, used to drop the schema.
    admin_url: String,
    schema: String,
    url: String,
}

impl SchemaGuard {
    /// A URL whose connections use this schema.
    pub fn url(&self) -> &str {
        &self.url
    }

    pub fn schema(&self) -> &str {
        &self.schema
    }
}

impl Drop for SchemaGuard {
    fn drop(&mut self) {
        let admin_url = self.admin_url.clone();
        let sql = format!("DROP SCHEMA IF EXISTS \"{}\" CASCADE", self.schema);
        // Drop may run inside a tokio runtime, where blocking on a future is not allowed,
        // or outside any runtime. A thread with its own small runtime works in both cases.
        let dropped = std::thread::spawn(move || -> Result<(), String> {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| e.to_string())?;
            rt.block_on(async {
                let (client, connection) =
                    tokio_postgres::connect(&admin_url, NoTls).await.map_err(|e| crate::error::with_causes(&e))?;
                let driver = tokio::spawn(connection);
                let result = client.batch_execute(&sql).await.map_err(|e| crate::error::with_causes(&e));
                drop(client);
                let _ = driver.await;
                result
            })
        })
        .join();
        match dropped {
            Ok(Ok(())) => {}
            Ok(Err(e)) => eprintln!("could not drop test schema {}: {e}", self.schema),
            Err(_) => eprintln!("could not drop test schema {}: the cleanup thread panicked", self.schema),
        }
    }
}

/// The configured test server, or `None` (after saying so on stderr) when there is none.
fn configured_url() -> Option<String> {
    match std::env::var(ENV) {
        Ok(url) if !url.trim().is_empty() => Some(url),
        _ => {
            // Written to the process's stderr directly rather than with `eprintln!`, which
            // the test harness captures and hides for passing tests: a skip must be
            // visible in a CI log. Once per process is enough to say why.
            static SAID: std::sync::Once = std::sync::Once::new();
            SAID.call_once(|| {
                use std::io::Write as _;
                let _ = writeln!(std::io::stderr(), "SKIPPED: PostgreSQL tests need {ENV}=postgres://… (not set)");
            });
            None
        }
    }
}

/// Creates a new, empty schema on the test server, without migrating it.
///
/// Returns `None` when `ONCEPRINT_TEST_POSTGRES` is not set. Panics when it is set but the
/// server cannot be reached or refuses to create the schema.
pub async fn fresh_schema() -> Option<SchemaGuard> {
    let admin_url = configured_url()?;
    let schema = unique_schema_name();
    let (client, connection) = match tokio_postgres::connect(&admin_url, NoTls).await {
        Ok(pair) => pair,
        Err(e) => panic!(
            "{ENV} is set, but PostgreSQL cannot be reached with it: {}. \
             Start the server, fix the URL, or unset {ENV} to skip the PostgreSQL tests.",
            crate::error::with_causes(&e)
        ),
    };
    let driver = tokio::spawn(connection);
    if let Err(e) = client.batch_execute(&format!("CREATE SCHEMA \"{schema}\"")).await {
        panic!("cannot create the test schema {schema} on the {ENV} server: {}", crate::error::with_causes(&e));
    }
    drop(client);
    let _ = driver.await;
    let url = with_search_path(&admin_url, &schema);
    Some(SchemaGuard { admin_url, schema, url })
}

/// A fresh, migrated store in a schema of its own, for the conformance suite and any other
/// test that needs a real database.
///
/// Returns `None` when `ONCEPRINT_TEST_POSTGRES` is not set. Panics when it is set but the
/// server cannot be reached.
pub async fn fresh_store() -> Option<Harness> {
    let guard = fresh_schema().await?;
    let store = match PostgresStore::connect(guard.url(), TEST_POOL_SIZE).await {
        Ok(store) => store,
        Err(e) => panic!("cannot open a PostgreSQL store in test schema {}: {e}", guard.schema()),
    };
    let url = guard.url().to_owned();
    Some(Harness { store: Arc::new(store), guard: Box::new(guard), url })
}

/// `onceprint_t_{pid}_{counter}_{random}`: unique across parallel tests of one process and
/// across processes, and recognisable when a crashed run leaves one behind.
fn unique_schema_name() -> String {
    use std::hash::BuildHasher;
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0);
    // RandomState is seeded randomly per process, which is all the randomness needed here
    // without pulling in a random number crate.
    let random = std::collections::hash_map::RandomState::new().hash_one((nanos, n));
    format!("onceprint_t_{}_{n}_{:08x}", std::process::id(), random as u32)
}

/// Adds a search path option to a connection string in either of its two forms.
pub fn with_search_path(url: &str, schema: &str) -> String {
    if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        let separator = if url.contains('?') { '&' } else { '?' };
        format!("{url}{separator}options=-csearch_path%3D{schema}")
    } else {
        format!("{url} options='-csearch_path={schema}'")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn search_path_is_added_to_both_url_forms() {
        assert_eq!(with_search_path("postgres://u@h:5432/db", "s"), "postgres://u@h:5432/db?options=-csearch_path%3Ds");
        assert_eq!(
            with_search_path("postgres://u@h/db?sslmode=disable", "s"),
            "postgres://u@h/db?sslmode=disable&options=-csearch_path%3Ds"
        );
        assert_eq!(with_search_path("host=h dbname=db", "s"), "host=h dbname=db options='-csearch_path=s'");
        let config: tokio_postgres::Config = with_search_path("postgres://u@h/db", "abc").parse().unwrap();
        assert_eq!(config.get_options(), Some("-csearch_path=abc"));
    }

    #[test]
    fn schema_names_are_unique_and_valid_identifiers() {
        let a = unique_schema_name();
        let b = unique_schema_name();
        assert_ne!(a, b);
        assert!(a.len() < 64, "{a}");
        assert!(a.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_'), "{a}");
    }
}
