//! Usage an operator can read (SPEC §12, "Quote and confirmation"): what finished runs cost,
//! how many there were and how many succeeded, per repository, person or kind, and per day;
//! and what each installation has spent of this month's budget (§9). `kodx usage` and the
//! `/usage` page read these.
//!
//! Which runs count: those created at or after the start of the period that have ended
//! (`succeeded`, `failed` or `cancelled`). Spend is the sum of their stored costs, in
//! micro-dollars as costs are stored (exact, the same on both backends). The success rate is
//! succeeded ÷ ended. The median is taken, as the estimate's ([`super::estimate`]), over the
//! runs that ended `succeeded` or `failed` after at least one model call: refusals, help
//! answers and cancellations cost nothing and would pull it down. It is computed in SQL
//! (window functions, which both backends have), so memory stays one row per group however
//! many runs there are.

use chrono::{DateTime, Datelike, NaiveTime};

use super::{Db, DbError};

/// What a group of runs is keyed by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UsageBy {
    /// The repository (`owner/name`).
    Repo,
    /// The GitHub login of who asked (the run's author).
    User,
    /// The command (`code`, `ask`, `continue` …).
    Kind,
}

impl UsageBy {
    /// The word `--by` and `?by=` take, and the table's first heading.
    pub fn as_str(self) -> &'static str {
        match self {
            UsageBy::Repo => "repo",
            UsageBy::User => "user",
            UsageBy::Kind => "kind",
        }
    }

    /// The word back; `None` for any other.
    pub fn parse(s: &str) -> Option<UsageBy> {
        match s.trim() {
            "repo" => Some(UsageBy::Repo),
            "user" => Some(UsageBy::User),
            "kind" => Some(UsageBy::Kind),
            _ => None,
        }
    }
}

/// The figures of one group of runs (or of all of them).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UsageRow {
    /// The repository, login or kind; `total` for the sum.
    pub key: String,
    /// Runs that ended.
    pub runs: i64,
    /// Of them, those that succeeded.
    pub succeeded: i64,
    /// What they cost, in micro-dollars.
    pub spend_micros: i64,
    /// The median cost of those that made a model call (nearest rank, of an even count the
    /// lower middle), in micro-dollars; `None` when none did.
    pub median_micros: Option<i64>,
}

impl UsageRow {
    /// Succeeded ÷ ended, from 0 to 1; `None` without runs.
    pub fn success_rate(&self) -> Option<f64> {
        (self.runs > 0).then(|| self.succeeded as f64 / self.runs as f64)
    }

    /// The spend in US dollars.
    pub fn spend_usd(&self) -> f64 {
        micros_to_usd(self.spend_micros)
    }

    /// The median in US dollars.
    pub fn median_usd(&self) -> Option<f64> {
        self.median_micros.map(micros_to_usd)
    }

    /// The success rate as shown: `75%` (rounded to the whole percent), `—` without runs.
    pub fn success_text(&self) -> String {
        match self.success_rate() {
            Some(rate) => format!("{:.0}%", rate * 100.0),
            None => "—".into(),
        }
    }

    /// The median as shown (`crate::cost::format_usd`), `—` without one.
    pub fn median_text(&self) -> String {
        self.median_usd()
            .map_or_else(|| "—".into(), crate::cost::format_usd)
    }
}

impl MonthSpend {
    /// Who it is: `acme (installation 77)`, or `installation 77` when its account is
    /// unknown.
    pub fn name(&self) -> String {
        match &self.account {
            Some(account) => format!("{account} (installation {})", self.installation_id),
            None => format!("installation {}", self.installation_id),
        }
    }

    /// What is left of a monthly budget of `budget_usd`, in micro-dollars, never below 0.
    pub fn left_micros(&self, budget_usd: f64) -> i64 {
        (super::to_micros(budget_usd) - self.spend_micros).max(0)
    }
}

/// The start of the period `since` names, in unix milliseconds, at `now_ms`: `30d` (days),
/// `12h` (hours), or a UTC date `2026-11-01`. An error says what to give.
pub fn parse_since(since: &str, now_ms: i64) -> Result<i64, String> {
    const SAY: &str = "say e.g. 30d (days), 12h (hours) or 2026-11-01 (a UTC date)";
    let s = since.trim();
    if let Ok(date) = chrono::NaiveDate::parse_from_str(s, "%Y-%m-%d") {
        let at = date.and_time(NaiveTime::MIN).and_utc().timestamp_millis();
        if at > now_ms {
            return Err(format!("{s} is in the future: {SAY}"));
        }
        return Ok(at);
    }
    let unit = match s.chars().last() {
        Some('d') => DAY_MS,
        Some('h') => DAY_MS / 24,
        _ => return Err(format!("{since:?} is not a period: {SAY}")),
    };
    let n: i64 = s[..s.len() - 1]
        .parse()
        .ok()
        .filter(|n| (1..=100 * 366).contains(n))
        .ok_or_else(|| format!("{since:?} is not a period: {SAY}"))?;
    Ok(now_ms.saturating_sub(n.saturating_mul(unit)))
}

/// What a period's finished runs cost.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Usage {
    /// One row per group, the dearest first (then by key).
    pub rows: Vec<UsageRow>,
    /// All the runs of the period.
    pub total: UsageRow,
    /// Spend per UTC day (the day's first millisecond, micro-dollars), oldest first; only
    /// the days on which a run that ended was created.
    pub days: Vec<(i64, i64)>,
}

/// What one installation has spent this month.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MonthSpend {
    pub installation_id: i64,
    /// The account it is installed on, when kodx has heard of the installation.
    pub account: Option<String>,
    /// Its runs' costs since the month began, queued and running runs counting what they
    /// reserved: what the budget check reads ([`Db::spend_since`]).
    pub spend_micros: i64,
}

/// Micro-dollars to US dollars.
pub fn micros_to_usd(micros: i64) -> f64 {
    micros as f64 / 1_000_000.0
}

/// One UTC day in milliseconds.
pub const DAY_MS: i64 = 86_400_000;

/// The first millisecond (UTC) of the month `now_ms` is in: where a monthly budget starts.
pub fn month_start_ms(now_ms: i64) -> i64 {
    // Out of chrono's range (±262,000 years) only for a clock that is badly wrong.
    let Some(now) = DateTime::from_timestamp_millis(now_ms) else {
        return now_ms;
    };
    let first = now
        .date_naive()
        .with_day(1)
        .expect("every month has a first day");
    first.and_time(NaiveTime::MIN).and_utc().timestamp_millis()
}

/// A run's stored cost in micro-dollars (runs written before costs were kept in
/// micro-dollars: their `cost_usd`).
macro_rules! cost_micros {
    () => {
        "COALESCE(cost_micros, CAST(ROUND(COALESCE(cost_usd, 0) * 1000000) AS BIGINT))"
    };
}

/// The runs that count: ended, created at or after `$1`.
macro_rules! ended_since {
    () => {
        "status IN ('succeeded', 'failed', 'cancelled') AND created_at >= $1"
    };
}

/// The runs a median is taken over (see the module's documentation).
macro_rules! costed {
    () => {
        "status IN ('succeeded', 'failed') AND api_calls > 0"
    };
}

/// The per-group queries for the column `$key`.
macro_rules! group_sql {
    ($key:literal) => {
        (
            concat!(
                "SELECT ",
                $key,
                ", CAST(COUNT(*) AS BIGINT), \
                 CAST(SUM(CASE WHEN status = 'succeeded' THEN 1 ELSE 0 END) AS BIGINT), \
                 CAST(COALESCE(SUM(",
                cost_micros!(),
                "), 0) AS BIGINT) FROM runs WHERE ",
                ended_since!(),
                " GROUP BY ",
                $key
            ),
            concat!(
                "SELECT k, c FROM (SELECT ",
                $key,
                " AS k, ",
                cost_micros!(),
                " AS c, ROW_NUMBER() OVER (PARTITION BY ",
                $key,
                " ORDER BY ",
                cost_micros!(),
                ") AS rn, COUNT(*) OVER (PARTITION BY ",
                $key,
                ") AS n FROM runs WHERE ",
                ended_since!(),
                " AND ",
                costed!(),
                ") t WHERE rn = (n * 50 + 99) / 100"
            ),
        )
    };
}

impl Db {
    /// The usage of the runs created at or after `since_ms` (unix milliseconds) that have
    /// ended, grouped `by` (see the module's documentation).
    pub async fn usage(&self, since_ms: i64, by: UsageBy) -> Result<Usage, DbError> {
        let (groups_sql, medians_sql) = match by {
            UsageBy::Repo => group_sql!("repo"),
            UsageBy::User => group_sql!("author"),
            UsageBy::Kind => group_sql!("kind"),
        };
        let groups: Vec<(String, i64, i64, i64)> = with_pool!(&self.pool, p =>
            sqlx::query_as(groups_sql).bind(since_ms).fetch_all(p).await)?;
        let medians: Vec<(String, i64)> = with_pool!(&self.pool, p =>
            sqlx::query_as(medians_sql).bind(since_ms).fetch_all(p).await)?;
        let median: Option<i64> = with_pool!(&self.pool, p => sqlx::query_scalar(concat!(
            "SELECT c FROM (SELECT ",
            cost_micros!(),
            " AS c, ROW_NUMBER() OVER (ORDER BY ",
            cost_micros!(),
            ") AS rn, COUNT(*) OVER () AS n FROM runs WHERE ",
            ended_since!(),
            " AND ",
            costed!(),
            ") t WHERE rn = (n * 50 + 99) / 100"
        ))
        .bind(since_ms)
        .fetch_optional(p).await)?;
        let days: Vec<(i64, i64)> = with_pool!(&self.pool, p => sqlx::query_as(concat!(
            "SELECT CAST(created_at / 86400000 AS BIGINT) AS day, \
             CAST(COALESCE(SUM(",
            cost_micros!(),
            "), 0) AS BIGINT) FROM runs WHERE ",
            ended_since!(),
            " GROUP BY CAST(created_at / 86400000 AS BIGINT) ORDER BY day"
        ))
        .bind(since_ms)
        .fetch_all(p).await)?;
        let medians: std::collections::HashMap<String, i64> = medians.into_iter().collect();
        let mut rows: Vec<UsageRow> = groups
            .into_iter()
            .map(|(key, runs, succeeded, spend_micros)| UsageRow {
                median_micros: medians.get(&key).copied(),
                key,
                runs,
                succeeded,
                spend_micros,
            })
            .collect();
        rows.sort_by(|a, b| {
            b.spend_micros
                .cmp(&a.spend_micros)
                .then_with(|| a.key.cmp(&b.key))
        });
        let total = UsageRow {
            key: "total".into(),
            runs: rows.iter().map(|r| r.runs).sum(),
            succeeded: rows.iter().map(|r| r.succeeded).sum(),
            spend_micros: rows.iter().map(|r| r.spend_micros).sum(),
            median_micros: median,
        };
        let days = days.into_iter().map(|(d, m)| (d * DAY_MS, m)).collect();
        Ok(Usage { rows, total, days })
    }

    /// What each installation with runs this month has spent of it (the month starting at
    /// `month_start_ms`), as the budget check counts it; by installation id.
    pub async fn month_spend(&self, month_start_ms: i64) -> Result<Vec<MonthSpend>, DbError> {
        let rows: Vec<(i64, Option<String>, i64)> = with_pool!(&self.pool, p =>
            sqlx::query_as(concat!(
                "SELECT r.installation_id, i.account, CAST(COALESCE(SUM(",
                counted_micros!("r"),
                "), 0) AS BIGINT) FROM runs r \
                 LEFT JOIN installations i ON i.id = r.installation_id \
                 WHERE r.created_at >= $1 GROUP BY r.installation_id, i.account \
                 ORDER BY r.installation_id"
            ))
            .bind(month_start_ms)
            .fetch_all(p).await)?;
        Ok(rows
            .into_iter()
            .map(|(installation_id, account, spend_micros)| MonthSpend {
                installation_id,
                account,
                spend_micros,
            })
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::db::test_support::*;
    use crate::db::{now_ms, Finish, RunStatus};

    #[test]
    fn month_start() {
        // 2026-11-22T10:00:00Z → 2026-11-01T00:00:00Z
        assert_eq!(month_start_ms(1_795_341_600_000), 1_793_491_200_000);
        // 2024-03-01T00:00:00Z is its own month start; a leap February before it.
        assert_eq!(month_start_ms(1_709_251_200_000), 1_709_251_200_000);
        assert_eq!(month_start_ms(1_709_251_199_999), 1_706_745_600_000);
    }

    #[test]
    fn periods() {
        let now = 1_795_341_600_000; // 2026-11-22T10:00:00Z
        assert_eq!(parse_since("30d", now), Ok(now - 30 * DAY_MS));
        assert_eq!(parse_since(" 12h ", now), Ok(now - 12 * 3_600_000));
        assert_eq!(parse_since("2026-11-01", now), Ok(1_793_491_200_000));
        for bad in [
            "",
            "d",
            "0d",
            "-3d",
            "3w",
            "thirty",
            "2026-13-01",
            "2026-12-01",
        ] {
            let e = parse_since(bad, now).unwrap_err();
            assert!(e.contains("say e.g. 30d"), "{bad:?}: {e}");
        }
    }

    /// Queues and finishes a run of `kind` in `repo` asked by `author`.
    async fn ran(db: &Db, n: &mut i64, (kind, repo, author): (&str, &str, &str), fin: Finish) {
        *n += 1;
        let mut run = new_run(kind, repo, *n * 2 + 1);
        run.author = author.into();
        let id = queue(db, &format!("u-{n}"), &run).await;
        assert!(db
            .finish(&id, &db.holder_now(&id).await, &fin)
            .await
            .unwrap());
    }

    fn ended(status: RunStatus, usd: f64, api_calls: i64) -> Finish {
        Finish {
            api_calls,
            ..finish(status, usd)
        }
    }

    #[tokio::test]
    async fn usage_sums_counts_and_takes_medians_per_group() {
        let dir = tempfile::tempdir().unwrap();
        for db in each_db(&dir).await {
            let n = &mut 0;
            let start = now_ms();
            let empty = db.usage(start, UsageBy::Repo).await.unwrap();
            assert_eq!((empty.rows.len(), empty.total.runs), (0, 0), "{db:?}");
            assert_eq!(empty.total.median_micros, None);
            let w = ("code", "octo/widgets", "alice");
            ran(&db, n, w, ended(RunStatus::Succeeded, 0.10, 2)).await;
            ran(&db, n, w, ended(RunStatus::Succeeded, 0.30, 2)).await;
            ran(&db, n, w, ended(RunStatus::Failed, 0.20, 1)).await;
            ran(&db, n, w, ended(RunStatus::Failed, 0.0, 0)).await;
            ran(
                &db,
                n,
                ("ask", "octo/widgets", "bob"),
                ended(RunStatus::Cancelled, 0.05, 1),
            )
            .await;
            ran(
                &db,
                n,
                ("ask", "octo/gears", "bob"),
                ended(RunStatus::Succeeded, 1.25, 4),
            )
            .await;
            // Not ended: not counted.
            queue(&db, "u-queued", &new_run("code", "octo/gears", 99)).await;

            let u = db.usage(start, UsageBy::Repo).await.unwrap();
            let row = |key: &str, runs, succeeded, spend: i64, median| UsageRow {
                key: key.into(),
                runs,
                succeeded,
                spend_micros: spend,
                median_micros: median,
            };
            assert_eq!(
                u.rows,
                vec![
                    row("octo/gears", 1, 1, 1_250_000, Some(1_250_000)),
                    // Medians of 0.10, 0.20, 0.30 (the cancelled run and the one that made
                    // no call are not taken).
                    row("octo/widgets", 5, 2, 650_000, Some(200_000)),
                ],
                "{db:?}"
            );
            assert_eq!(u.total, row("total", 6, 3, 1_900_000, Some(200_000)));
            assert_eq!(u.total.success_rate(), Some(0.5));
            let today = start / DAY_MS * DAY_MS;
            assert_eq!(u.days, vec![(today, 1_900_000)], "{db:?}");

            let by_user = db.usage(start, UsageBy::User).await.unwrap();
            let keys: Vec<_> = by_user
                .rows
                .iter()
                .map(|r| (r.key.as_str(), r.runs))
                .collect();
            assert_eq!(keys, vec![("bob", 2), ("alice", 4)], "{db:?}");
            // Of bob's, only the $1.25 one made a call and ended so.
            assert_eq!(by_user.rows[0].median_micros, Some(1_250_000));
            let by_kind = db.usage(start, UsageBy::Kind).await.unwrap();
            let keys: Vec<_> = by_kind
                .rows
                .iter()
                .map(|r| (r.key.as_str(), r.spend_micros))
                .collect();
            assert_eq!(keys, vec![("ask", 1_300_000), ("code", 600_000)], "{db:?}");

            // A later start leaves them out.
            let later = db.usage(now_ms() + 60_000, UsageBy::Repo).await.unwrap();
            assert!(later.rows.is_empty() && later.days.is_empty(), "{db:?}");

            // This month: ended runs' costs and nothing reserved yet by the queued one.
            let month = db.month_spend(month_start_ms(now_ms())).await.unwrap();
            assert_eq!(
                month,
                vec![MonthSpend {
                    installation_id: 42,
                    account: None,
                    spend_micros: 1_900_000
                }],
                "{db:?}"
            );
        }
    }
}
