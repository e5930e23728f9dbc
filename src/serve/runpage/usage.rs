//! `GET /usage?token=…[&since=30d][&by=repo|user|kind]`: the operator's page of what
//! finished runs cost — the figures `kodx usage` prints (spend, runs, success rate and
//! median per repository, person or kind, and the total), a bar chart of spend per UTC day
//! (inline SVG: no script, nothing loaded), and the monthly budget with what each
//! installation has left of it. Under the operator's token like `/runs`: without it, the
//! same empty `404`. At most [`MAX_ROWS`] groups are shown (the total counts them all) and
//! the period is at most [`MAX_DAYS`] days, so a view costs a bounded page whatever the
//! database holds; one is read at a time (apart from the run pages' renders). With 100,000
//! runs in the period a view reads for about a second (`bash bench/usage.sh`).

use axum::http::StatusCode;
use axum::response::{Html, IntoResponse, Response};
use maud::{html, Markup, PreEscaped};
use serde::Deserialize;

use crate::cost::format_usd;
use crate::db::{micros_to_usd, month_start_ms, now_ms, Db, MonthSpend, Usage, UsageBy, DAY_MS};
use crate::serve::setup::page::layout;

/// Groups (and installations under the budget) shown at most, as many as `/runs` shows runs.
pub(super) const MAX_ROWS: usize = 100;
/// The longest period the page shows, in days.
pub(super) const MAX_DAYS: i64 = 366;
/// The chart's drawing size (its `viewBox`; it is drawn as wide as the page).
const CHART_W: i64 = 600;
const CHART_H: i64 = 120;

#[derive(Deserialize)]
pub(super) struct UsageQuery {
    pub(super) token: Option<String>,
    since: Option<String>,
    by: Option<String>,
}

fn bad_request(why: String) -> Response {
    (StatusCode::BAD_REQUEST, format!("{why}\n")).into_response()
}

/// The page `q` asks for (its token already checked), read from `db`, with the monthly
/// budget `monthly_budget`.
pub(super) async fn page(db: &Db, monthly_budget: Option<f64>, q: &UsageQuery) -> Response {
    let now = now_ms();
    let since_text = q.since.as_deref().unwrap_or("30d").trim();
    let since = match crate::db::parse_since(since_text, now) {
        Ok(ms) if now - ms <= MAX_DAYS * DAY_MS => ms,
        Ok(_) => return bad_request(format!("since: at most {MAX_DAYS} days back")),
        Err(e) => return bad_request(format!("since: {e}")),
    };
    let by_text = q.by.as_deref().unwrap_or("repo");
    let Some(by) = UsageBy::parse(by_text) else {
        return bad_request("by: say repo, user or kind".into());
    };
    let month = month_start_ms(now);
    let read = async {
        let usage = db.usage(since, by).await?;
        let spent = match monthly_budget {
            Some(_) => db.month_spend(month).await?,
            None => Vec::new(),
        };
        Ok::<_, crate::db::DbError>((usage, spent))
    };
    let (usage, spent) = match read.await {
        Ok(read) => read,
        Err(e) => {
            tracing::warn!("usage page: {e}");
            return (StatusCode::SERVICE_UNAVAILABLE, "try again\n").into_response();
        }
    };
    let token = q.token.as_deref().unwrap_or("");
    let view = View {
        token,
        since,
        since_text,
        by,
        now,
    };
    let body = html! {
        (heading(&view))
        div.card { (chart(&usage, since, now)) }
        div.card.wide { (table(&usage, by)) }
        (budget(monthly_budget, month, &spent))
    };
    Html(layout("Usage", body).into_string()).into_response()
}

/// What the page was asked for.
struct View<'a> {
    token: &'a str,
    since: i64,
    since_text: &'a str,
    by: UsageBy,
    now: i64,
}

const CSS: &str =
    "div.wide{overflow-x:auto}\
table.usage{width:100%;border-collapse:collapse;font-variant-numeric:tabular-nums}\
table.usage th,table.usage td{padding:.3rem .35rem;border-bottom:1px solid #eef0f3;text-align:right;white-space:nowrap}\
table.usage th:first-child,table.usage td:first-child{text-align:left;white-space:normal;overflow-wrap:break-word}\
table.usage tfoot td{font-weight:700;border-bottom:0}\
svg.chart{display:block;width:100%;height:auto}\
nav.views a{margin-right:.6rem}\
@media(max-width:30rem){table.usage{font-size:.8rem}table.usage th,table.usage td{padding:.25rem .2rem}}";

fn heading(v: &View<'_>) -> Markup {
    let link = |since: &str, by: UsageBy| {
        format!("/usage?token={}&since={since}&by={}", v.token, by.as_str())
    };
    html! {
        style { (PreEscaped(CSS)) }
        h1 { "Usage" }
        p.hint {
            "Runs that ended, created since " (utc(v.since)) " (" (v.since_text) "), by "
            (v.by.as_str()) ". " a href={ "/runs?token=" (v.token) } { "Recent runs" }
        }
        nav.views.hint {
            "By: "
            @for by in [UsageBy::Repo, UsageBy::User, UsageBy::Kind] {
                a href=(link(v.since_text, by)) { (by.as_str()) }
            }
            " Since: "
            @for since in ["7d", "30d", "90d"] {
                a href=(link(since, v.by)) { (since) }
            }
        }
        p.hint { "As of " (utc(v.now)) "." }
    }
}

/// A time as the page shows it: `2026-11-22 10:00 UTC`.
fn utc(ms: i64) -> String {
    chrono::DateTime::from_timestamp_millis(ms).map_or_else(
        || ms.to_string(),
        |t| t.format("%Y-%m-%d %H:%M UTC").to_string(),
    )
}

fn day(ms: i64) -> String {
    chrono::DateTime::from_timestamp_millis(ms)
        .map_or_else(|| ms.to_string(), |t| t.format("%Y-%m-%d").to_string())
}

/// Spend per day from the period's first day to today: one bar per day with spend, as
/// tall as its share of the dearest day.
fn chart(usage: &Usage, since: i64, now: i64) -> Markup {
    let first = since.div_euclid(DAY_MS);
    let days = (now.div_euclid(DAY_MS) - first + 1).max(1);
    let top = usage.days.iter().map(|d| d.1).max().unwrap_or(0);
    let slot = CHART_W as f64 / days as f64;
    let bars: Vec<(f64, f64, String)> = usage
        .days
        .iter()
        .filter(|(_, micros)| *micros > 0)
        .map(|&(at, micros)| {
            let x = (at.div_euclid(DAY_MS) - first) as f64 * slot;
            let h = (micros as f64 / top as f64 * CHART_H as f64).max(1.0);
            let label = format!("{}: {}", day(at), format_usd(micros_to_usd(micros)));
            (x, h, label)
        })
        .collect();
    let label_y = CHART_H + 16;
    html! {
        h2 { "Spend per day (UTC)" }
        @if bars.is_empty() { p.hint { "Nothing spent in this period." } }
        svg.chart xmlns="http://www.w3.org/2000/svg" role="img"
            viewBox={ "0 0 " (CHART_W) " " (CHART_H + 20) }
            aria-label="Spend per day" {
            line x1="0" y1=(CHART_H) x2=(CHART_W) y2=(CHART_H) stroke="#b8c0cc" {}
            @for (x, h, label) in &bars {
                rect x=(format!("{x:.2}")) y=(format!("{:.2}", CHART_H as f64 - h))
                    width=(format!("{:.2}", (slot * 0.8).max(0.5))) height=(format!("{h:.2}"))
                    fill="#1f6feb" { title { (label) } }
            }
            text x="0" y=(label_y) font-size="14" fill="#57606a" { (day(first * DAY_MS)) }
            text x=(CHART_W) y=(label_y) font-size="14" fill="#57606a" text-anchor="end" {
                (day(now)) " · top " (format_usd(micros_to_usd(top)))
            }
        }
    }
}

fn table(usage: &Usage, by: UsageBy) -> Markup {
    let more = usage.rows.len().saturating_sub(MAX_ROWS);
    html! {
        table.usage {
            thead { tr { th { (by.as_str()) } th { "runs" } th { "success" } th { "spend" } th { "median" } } }
            tbody {
                @if usage.rows.is_empty() { tr { td colspan="5" { "No runs ended in this period." } } }
                @for r in usage.rows.iter().take(MAX_ROWS) {
                    tr {
                        td { (r.key) }
                        td { (r.runs) }
                        td { (r.success_text()) }
                        td { (format_usd(r.spend_usd())) }
                        td { (r.median_text()) }
                    }
                }
                @if more > 0 { tr { td colspan="5" { (more) " more, cheaper, not shown (the total counts them)" } } }
            }
            tfoot {
                tr #total {
                    td { "total" }
                    td { (usage.total.runs) }
                    td { (usage.total.success_text()) }
                    td { (format_usd(usage.total.spend_usd())) }
                    td { (usage.total.median_text()) }
                }
            }
        }
        p.hint {
            "Success: succeeded ÷ ended. Median: of the runs that succeeded or failed after a model call. "
            "The same figures: " code { "kodx usage --by " (by.as_str()) }
        }
    }
}

fn budget(budget: Option<f64>, month: i64, spent: &[MonthSpend]) -> Markup {
    html! {
        div.card #budget {
            h2 { "Monthly budget" }
            @match budget {
                None => p.hint { "No monthly budget (the server setting monthly_budget_usd)." },
                Some(b) => {
                    p { (format_usd(b)) " per installation; this month (since " (utc(month)) "):" }
                    ul.checks {
                        @if spent.is_empty() { li { "nothing spent yet: " (format_usd(b)) " left" } }
                        @for s in spent.iter().take(MAX_ROWS) {
                            li {
                                (s.name()) ": " (format_usd(micros_to_usd(s.spend_micros))) " spent, "
                                strong { (format_usd(micros_to_usd(s.left_micros(b)))) " left" }
                            }
                        }
                        @if spent.len() > MAX_ROWS { li { (spent.len() - MAX_ROWS) " more installations not shown" } }
                    }
                }
            }
        }
    }
}
