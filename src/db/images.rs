//! The images a run gave the model, kept for its run page (`run_images`), and deleted
//! with its transcript.

use super::{now_ms, Db, DbError, Lease};

/// One stored image of a run, without its bytes.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct StoredImage {
    pub n: i64,
    pub kind: String,
    pub width: Option<i64>,
    pub height: Option<i64>,
    pub size: i64,
    pub sha256: String,
}

impl Db {
    /// Stores image `n` of the run (its `kind` as `png`, `jpeg`, `gif` or `webp`), while
    /// `lease` holds the run ([`DbError::NotHeld`] once it does not). Storing the same `n`
    /// again changes nothing.
    #[allow(clippy::too_many_arguments)]
    pub async fn store_run_image(
        &self,
        run_id: &str,
        lease: &Lease,
        n: i64,
        kind: &str,
        dimensions: Option<(u32, u32)>,
        sha256: &str,
        bytes: &[u8],
    ) -> Result<(), DbError> {
        let sql = format!(
            "INSERT INTO run_images (run_id, n, kind, width, height, size, sha256, bytes, created_at) \
             SELECT $1, $2, $3, $4, $5, $6, $7, $8, $9 \
             WHERE EXISTS (SELECT 1 FROM runs WHERE id = $1 AND {}) \
             ON CONFLICT (run_id, n) DO NOTHING",
            super::queue::held(10, 11)
        );
        let (width, height) = (
            dimensions.map(|d| i64::from(d.0)),
            dimensions.map(|d| i64::from(d.1)),
        );
        let stored = with_pool!(&self.pool, p => sqlx::query(&sql)
            .bind(run_id)
            .bind(n)
            .bind(kind)
            .bind(width)
            .bind(height)
            .bind(bytes.len() as i64)
            .bind(sha256)
            .bind(bytes)
            .bind(now_ms())
            .bind(&lease.worker)
            .bind(lease.epoch)
            .execute(p).await.map(|done| done.rows_affected()))?;
        if stored == 0 && !self.is_held(run_id, lease).await? {
            return Err(self.not_held(run_id).await);
        }
        Ok(())
    }

    /// The run's images in order, without their bytes.
    pub async fn run_images(&self, run_id: &str) -> Result<Vec<StoredImage>, DbError> {
        let rows = with_pool!(&self.pool, p => sqlx::query_as::<_, StoredImage>(
            "SELECT n, kind, width, height, size, sha256 FROM run_images \
             WHERE run_id = $1 ORDER BY n",
        )
        .bind(run_id)
        .fetch_all(p)
        .await)?;
        Ok(rows)
    }

    /// Image `n` of the run: its kind and bytes.
    pub async fn run_image(
        &self,
        run_id: &str,
        n: i64,
    ) -> Result<Option<(String, Vec<u8>)>, DbError> {
        let row = with_pool!(&self.pool, p => sqlx::query_as::<_, (String, Vec<u8>)>(
            "SELECT kind, bytes FROM run_images WHERE run_id = $1 AND n = $2",
        )
        .bind(run_id)
        .bind(n)
        .fetch_optional(p)
        .await)?;
        Ok(row)
    }
}

#[cfg(test)]
mod tests {
    use crate::db::test_support::*;
    use crate::db::{now_ms, DbError};

    #[tokio::test]
    async fn images_are_kept_for_the_holder_and_pruned_with_the_transcript() {
        let dir = tempfile::tempdir().unwrap();
        for db in each_db(&dir).await {
            let run_id = queue(&db, "d-1", &new_run("code", "octo/widgets", 1)).await;
            let lease = db.claim_run("w").await.unwrap().unwrap().lease().unwrap();
            let bytes = vec![0x89, b'P', b'N', b'G', 0, 255];
            db.store_run_image(&run_id, &lease, 0, "png", Some((2, 1)), "ab", &bytes)
                .await
                .unwrap();
            db.store_run_image(&run_id, &lease, 1, "gif", None, "cd", b"GIF89a")
                .await
                .unwrap();
            let listed = db.run_images(&run_id).await.unwrap();
            assert_eq!(listed.len(), 2);
            assert_eq!((listed[0].width, listed[0].size), (Some(2), 6));
            assert_eq!(listed[1].width, None);
            assert_eq!(
                db.run_image(&run_id, 0).await.unwrap(),
                Some(("png".to_string(), bytes.clone()))
            );
            assert_eq!(db.run_image(&run_id, 7).await.unwrap(), None);
            // Another claim's lease stores nothing.
            let stale = crate::db::Lease {
                worker: "other".into(),
                epoch: lease.epoch,
            };
            let refused = db
                .store_run_image(&run_id, &stale, 2, "png", None, "ef", b"x")
                .await;
            assert!(matches!(refused, Err(DbError::NotHeld(_))), "{refused:?}");
            let holder = db.holder_now(&run_id).await;
            let done = finish(crate::db::RunStatus::Succeeded, 0.1);
            assert!(db.finish(&run_id, &holder, &done).await.unwrap());
            db.prune_transcripts(now_ms() + 1).await.unwrap();
            assert!(db.run_images(&run_id).await.unwrap().is_empty());
        }
    }
}
