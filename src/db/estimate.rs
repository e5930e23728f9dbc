//! The cost estimate of a run about to start (SPEC §12, "Quote and confirmation"): what the
//! repository's last runs of the same kind cost.
//!
//! Which runs count: those of the same repository and kind that ended `succeeded` or
//! `failed` after the agent made at least one model call (`api_calls > 0`). Refusals, help
//! answers, cancellations and runs that failed before the agent started cost nothing or
//! say nothing about the work, and would pull the estimate down. The ≤ 20 costs are read
//! through the partial index `runs_cost_history` (migration 0012), newest first; the
//! percentiles are taken here, in Rust, so both backends give the same figures.

use super::{Db, DbError};

/// How many of the newest runs the estimate reads.
pub const ESTIMATE_WINDOW: i64 = 20;
/// Fewer runs than this and there is no estimate ("no history yet").
pub const ESTIMATE_MIN_RUNS: usize = 3;

/// What the repository's recent runs of one kind cost, in micro-dollars (as costs are
/// stored: exact, the same on both backends).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Estimate {
    /// How many runs it is made from (3 to 20).
    pub runs: usize,
    /// The median, nearest-rank (of an even count, the lower middle).
    pub median_micros: i64,
    /// The 90th percentile, nearest-rank.
    pub p90_micros: i64,
}

impl Estimate {
    /// The estimate from `micros` (costs in micro-dollars, any order); `None` with fewer
    /// than [`ESTIMATE_MIN_RUNS`].
    pub fn from_micros(mut micros: Vec<i64>) -> Option<Estimate> {
        if micros.len() < ESTIMATE_MIN_RUNS {
            return None;
        }
        micros.sort_unstable();
        let at = |p: usize| micros[nearest_rank(p, micros.len()) - 1];
        Some(Estimate {
            runs: micros.len(),
            median_micros: at(50),
            p90_micros: at(90),
        })
    }

    /// The median in US dollars.
    pub fn median_usd(&self) -> f64 {
        self.median_micros as f64 / 1_000_000.0
    }

    /// The 90th percentile in US dollars.
    pub fn p90_usd(&self) -> f64 {
        self.p90_micros as f64 / 1_000_000.0
    }
}

/// The nearest rank (1-based) of the `p`th percentile of `n` sorted values: ⌈p·n/100⌉, at
/// least 1.
fn nearest_rank(p: usize, n: usize) -> usize {
    (p * n).div_ceil(100).max(1)
}

impl Db {
    /// The estimate for a run of `kind` (the stored word, e.g. `code`) in `repo`; `None`
    /// when fewer than 3 of its runs count (see the module's documentation).
    pub async fn cost_estimate(&self, repo: &str, kind: &str) -> Result<Option<Estimate>, DbError> {
        let micros: Vec<i64> = with_pool!(&self.pool, p => sqlx::query_scalar(
            "SELECT CAST(COALESCE(cost_micros, ROUND(COALESCE(cost_usd, 0) * 1000000)) AS BIGINT) \
             FROM runs \
             WHERE repo = $1 AND kind = $2 \
               AND status IN ('succeeded', 'failed') AND api_calls > 0 \
             ORDER BY finished_at DESC, seq DESC LIMIT $3",
        )
        .bind(repo)
        .bind(kind)
        .bind(ESTIMATE_WINDOW)
        .fetch_all(p).await)?;
        Ok(Estimate::from_micros(micros))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::db::test_support::*;
    use crate::db::{to_micros, Finish, RunStatus};

    #[test]
    fn nearest_rank_percentiles() {
        assert_eq!(Estimate::from_micros(vec![1, 2]), None);
        let e = Estimate::from_micros(vec![3_000_000, 1_000_000, 2_000_000]).unwrap();
        assert_eq!((e.runs, e.median_usd(), e.p90_usd()), (3, 2.0, 3.0));
        // 1..=20: median the 10th, p90 the 18th.
        let e = Estimate::from_micros((1..=20).rev().collect()).unwrap();
        assert_eq!((e.median_micros, e.p90_micros), (10, 18));
        // Of 4, the lower middle and the largest.
        let e = Estimate::from_micros(vec![10, 20, 30, 40]).unwrap();
        assert_eq!((e.median_micros, e.p90_micros), (20, 40));
    }

    /// Queues, claims and finishes a run of `kind` in `repo` that cost `usd` after
    /// `api_calls` model calls.
    async fn ran(
        db: &Db,
        n: &mut i64,
        kind: &str,
        repo: &str,
        status: RunStatus,
        usd: f64,
        api_calls: i64,
    ) {
        *n += 1;
        let id = queue(db, &format!("e-{n}"), &new_run(kind, repo, *n * 2 + 1)).await;
        let fin = Finish {
            api_calls,
            ..finish(status, usd)
        };
        assert!(db
            .finish(&id, &db.holder_now(&id).await, &fin)
            .await
            .unwrap());
    }

    #[tokio::test]
    async fn the_estimate_reads_the_last_twenty_runs_that_worked() {
        let dir = tempfile::tempdir().unwrap();
        for db in each_db(&dir).await {
            let n = &mut 0;
            let repo = "octo/widgets";
            assert_eq!(db.cost_estimate(repo, "code").await.unwrap(), None);
            ran(&db, n, "code", repo, RunStatus::Succeeded, 0.40, 3).await;
            ran(&db, n, "code", repo, RunStatus::Failed, 0.80, 5).await;
            // Not counted: a refusal or an early failure (no model call), a cancelled run,
            // another kind, another repository.
            ran(&db, n, "code", repo, RunStatus::Failed, 0.0, 0).await;
            ran(&db, n, "code", repo, RunStatus::Cancelled, 9.0, 4).await;
            ran(&db, n, "ask", repo, RunStatus::Succeeded, 7.0, 2).await;
            ran(&db, n, "help", repo, RunStatus::Succeeded, 0.0, 0).await;
            ran(&db, n, "code", "octo/other", RunStatus::Succeeded, 6.0, 2).await;
            assert_eq!(
                db.cost_estimate(repo, "code").await.unwrap(),
                None,
                "{db:?}"
            );
            ran(&db, n, "code", repo, RunStatus::Succeeded, 0.20, 2).await;
            let e = db.cost_estimate(repo, "code").await.unwrap().unwrap();
            let want = (3, to_micros(0.40), to_micros(0.80));
            assert_eq!((e.runs, e.median_micros, e.p90_micros), want, "{db:?}");
            // 25 more at 1..=25 cents: only the newest 20 (6..=25 cents) count.
            for cents in 1..=25 {
                ran(
                    &db,
                    n,
                    "code",
                    repo,
                    RunStatus::Succeeded,
                    f64::from(cents) / 100.0,
                    1,
                )
                .await;
                // Distinct finish times, so "newest" is by the clock and not only by seq.
                tokio::time::sleep(std::time::Duration::from_millis(2)).await;
            }
            let e = db.cost_estimate(repo, "code").await.unwrap().unwrap();
            let want = (20, to_micros(0.15), to_micros(0.23));
            assert_eq!((e.runs, e.median_micros, e.p90_micros), want, "{db:?}");
            let ask = db.cost_estimate(repo, "ask").await.unwrap();
            assert_eq!(ask, None, "{db:?}");
        }
    }
}
