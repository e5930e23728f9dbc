//! The secrets kodx keeps for repositories, sealed ([`crate::secrets`]; migration 0018).
//! Repository names are stored in lower case (GitHub's are case-insensitive).

use super::{now_ms, Db, DbError};
use crate::secrets::Sealed;

/// A stored secret, without its value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SecretEntry {
    pub name: String,
    pub key_id: String,
    /// Unix milliseconds.
    pub updated_at: i64,
}

impl Db {
    /// Stores (or replaces) `repo`'s secret `name`.
    pub async fn put_secret(&self, repo: &str, name: &str, sealed: &Sealed) -> Result<(), DbError> {
        let now = now_ms();
        with_pool!(&self.pool, p => sqlx::query(
            "INSERT INTO secrets (repo, name, key_id, nonce, ciphertext, created_at, updated_at) \
             VALUES ($1, $2, $3, $4, $5, $6, $6) ON CONFLICT (repo, name) DO UPDATE SET \
             key_id = excluded.key_id, nonce = excluded.nonce, \
             ciphertext = excluded.ciphertext, updated_at = excluded.updated_at",
        )
        .bind(repo.to_ascii_lowercase())
        .bind(name)
        .bind(&sealed.key_id)
        .bind(&sealed.nonce)
        .bind(&sealed.ciphertext)
        .bind(now)
        .execute(p).await.map(|_| ()))?;
        Ok(())
    }

    /// `repo`'s secret `name` as stored.
    pub async fn sealed_secret(&self, repo: &str, name: &str) -> Result<Option<Sealed>, DbError> {
        let row: Option<(String, String, String)> = with_pool!(&self.pool, p => sqlx::query_as(
            "SELECT key_id, nonce, ciphertext FROM secrets WHERE repo = $1 AND name = $2",
        )
        .bind(repo.to_ascii_lowercase())
        .bind(name)
        .fetch_optional(p).await)?;
        Ok(row.map(|(key_id, nonce, ciphertext)| Sealed {
            key_id,
            nonce,
            ciphertext,
        }))
    }

    /// `repo`'s secrets by name, without values.
    pub async fn secret_names(&self, repo: &str) -> Result<Vec<SecretEntry>, DbError> {
        let rows: Vec<(String, String, i64)> = with_pool!(&self.pool, p => sqlx::query_as(
            "SELECT name, key_id, updated_at FROM secrets WHERE repo = $1 ORDER BY name LIMIT 1000",
        )
        .bind(repo.to_ascii_lowercase())
        .fetch_all(p).await)?;
        Ok(rows
            .into_iter()
            .map(|(name, key_id, updated_at)| SecretEntry {
                name,
                key_id,
                updated_at,
            })
            .collect())
    }

    /// How many secrets each repository has, by repository (for `kodx doctor`).
    pub async fn secret_counts(&self) -> Result<Vec<(String, i64)>, DbError> {
        Ok(with_pool!(&self.pool, p => sqlx::query_as(
            "SELECT repo, COUNT(*) FROM secrets GROUP BY repo ORDER BY repo LIMIT 1000",
        )
        .fetch_all(p).await)?)
    }

    /// The ids of the keys the stored secrets were sealed with.
    pub async fn secret_key_ids(&self) -> Result<Vec<String>, DbError> {
        Ok(with_pool!(&self.pool, p => sqlx::query_scalar(
            "SELECT DISTINCT key_id FROM secrets ORDER BY key_id LIMIT 100",
        )
        .fetch_all(p).await)?)
    }

    /// Removes `repo`'s secret `name`; whether there was one.
    pub async fn remove_secret(&self, repo: &str, name: &str) -> Result<bool, DbError> {
        let n = with_pool!(&self.pool, p => sqlx::query(
            "DELETE FROM secrets WHERE repo = $1 AND name = $2",
        )
        .bind(repo.to_ascii_lowercase())
        .bind(name)
        .execute(p).await.map(|r| r.rows_affected()))?;
        Ok(n > 0)
    }
}

#[cfg(test)]
mod tests {
    use crate::db::test_support::*;
    use crate::secrets::SecretsKey;
    use secrecy::ExposeSecret as _;

    #[tokio::test]
    async fn secrets_are_stored_sealed_and_listed_without_values() {
        let dir = tempfile::tempdir().unwrap();
        let key = SecretsKey::from_bytes([3u8; 32]);
        for db in each_db(&dir).await {
            let sealed = key.seal("acme/widgets", "NPM_TOKEN", b"v1").unwrap();
            db.put_secret("Acme/Widgets", "NPM_TOKEN", &sealed)
                .await
                .unwrap();
            let again = key.seal("acme/widgets", "NPM_TOKEN", b"v2").unwrap();
            db.put_secret("acme/widgets", "NPM_TOKEN", &again)
                .await
                .unwrap();
            let other = key.seal("acme/widgets", "DB_PASSWORD", b"pw").unwrap();
            db.put_secret("acme/widgets", "DB_PASSWORD", &other)
                .await
                .unwrap();
            let names: Vec<String> = db
                .secret_names("acme/widgets")
                .await
                .unwrap()
                .into_iter()
                .map(|e| e.name)
                .collect();
            assert_eq!(names, ["DB_PASSWORD", "NPM_TOKEN"]);
            let stored = db
                .sealed_secret("ACME/widgets", "NPM_TOKEN")
                .await
                .unwrap()
                .unwrap();
            assert_eq!(
                key.open("acme/widgets", "NPM_TOKEN", &stored)
                    .unwrap()
                    .expose_secret(),
                "v2"
            );
            assert_eq!(
                db.secret_counts().await.unwrap(),
                [("acme/widgets".to_string(), 2)]
            );
            assert_eq!(db.secret_key_ids().await.unwrap(), [key.id().to_string()]);
            assert!(db.remove_secret("acme/widgets", "NPM_TOKEN").await.unwrap());
            assert!(!db.remove_secret("acme/widgets", "NPM_TOKEN").await.unwrap());
            assert!(db
                .sealed_secret("acme/widgets", "NPM_TOKEN")
                .await
                .unwrap()
                .is_none());
        }
    }
}
