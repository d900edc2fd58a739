//! A throw-away PostgreSQL schema, so a run never sees (or leaves) anyone else's data.

use tokio::task::JoinHandle;
use tokio_postgres::{Client, NoTls};

use crate::BenchError;

pub struct PgSchema {
    client: Client,
    connection: JoinHandle<()>,
    pub name: String,
}

impl PgSchema {
    /// Creates schema `onceprint_bench_<unique>` in the database at `url`.
    pub async fn create(url: &str, unique: &str) -> Result<Self, BenchError> {
        let (client, connection) =
            tokio_postgres::connect(url, NoTls).await.map_err(|e| BenchError::postgres("connecting", e))?;
        let connection = tokio::spawn(async move {
            let _ = connection.await;
        });
        // `unique` is hex we generated, so the identifier needs no quoting.
        let name = format!("onceprint_bench_{unique}");
        client
            .batch_execute(&format!("CREATE SCHEMA {name}"))
            .await
            .map_err(|e| BenchError::postgres(format!("creating schema {name}"), e))?;
        Ok(Self { client, connection, name })
    }

    /// The URL the broker gets: the same database with `search_path` set to the schema,
    /// through libpq's `options` parameter, so the broker creates its tables there.
    pub fn broker_url(&self, url: &str) -> String {
        with_search_path(url, &self.name)
    }

    pub async fn drop_schema(self) -> Result<(), BenchError> {
        let result = self
            .client
            .batch_execute(&format!("DROP SCHEMA {} CASCADE", self.name))
            .await
            .map_err(|e| BenchError::postgres(format!("dropping schema {}", self.name), e));
        drop(self.client);
        let _ = self.connection.await;
        result
    }
}

fn with_search_path(url: &str, schema: &str) -> String {
    let sep = if url.contains('?') { '&' } else { '?' };
    format!("{url}{sep}options=-csearch_path%3D{schema}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn search_path_is_appended_to_the_query() {
        assert_eq!(with_search_path("postgres://u@h/db", "s"), "postgres://u@h/db?options=-csearch_path%3Ds");
        assert_eq!(
            with_search_path("postgres://u@h/db?sslmode=disable", "s"),
            "postgres://u@h/db?sslmode=disable&options=-csearch_path%3Ds"
        );
    }
}
