//! `kodx usage`: what finished runs cost, from the database `kodx serve` uses
//! (`DATABASE_URL`, the same environment and `KODX_CONFIG`): spend, runs, success rate and
//! median cost per repository, person or kind (`--by`), since a time (`--since 30d`), as
//! an aligned table with a total line or as CSV (`--csv`); then the monthly budget, when
//! the server has one, with what each installation has left of it. The operator's page
//! `/usage` shows the same. What each figure means: `kodx::db::usage`'s documentation and
//! docs/cost.md.

use std::fmt::Write as _;
use std::process::ExitCode;

use anyhow::Context;
use kodx::cost::format_usd;
use kodx::db::{micros_to_usd, month_start_ms, now_ms, Db, MonthSpend, Usage, UsageBy, UsageRow};
use kodx::serve::config::SetupConfig;

#[derive(clap::Args)]
pub struct UsageArgs {
    /// The runs created since: `30d` (days), `12h` (hours) or a UTC date (`2026-11-01`).
    #[arg(long, value_parser = parse_since, default_value = "30d")]
    since: Since,
    /// One line per repository, per person who asked, or per command.
    #[arg(long, value_enum, default_value_t = By::Repo)]
    by: By,
    /// CSV (RFC 4180) instead of the table: one line per group, no total, no budget.
    #[arg(long)]
    csv: bool,
}

/// `--since` as given and the time it names.
#[derive(Clone)]
struct Since {
    given: String,
    ms: i64,
}

fn parse_since(s: &str) -> Result<Since, String> {
    Ok(Since {
        given: s.trim().to_string(),
        ms: kodx::db::parse_since(s, now_ms())?,
    })
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum By {
    Repo,
    User,
    Kind,
}

impl From<By> for UsageBy {
    fn from(by: By) -> UsageBy {
        match by {
            By::Repo => UsageBy::Repo,
            By::User => UsageBy::User,
            By::Kind => UsageBy::Kind,
        }
    }
}

pub async fn run(args: UsageArgs) -> anyhow::Result<ExitCode> {
    let config = SetupConfig::from_env()?;
    let url = &config.database_url;
    if let Some(path) = sqlite_file(url) {
        anyhow::ensure!(
            std::path::Path::new(&path).is_file(),
            "no database at {path} (DATABASE_URL={}): run `kodx usage` with kodx serve's \
             DATABASE_URL, or in its working directory",
            kodx::db::shown_url(url)
        );
    }
    let db = Db::open(url)
        .await
        .with_context(|| format!("opening {}", kodx::db::shown_url(url)))?;
    let by = UsageBy::from(args.by);
    let usage = db.usage(args.since.ms, by).await?;
    if args.csv {
        print!("{}", csv(&usage, by));
        return Ok(ExitCode::SUCCESS);
    }
    let mut out = format!(
        "Runs that ended, created since {} ({}), by {}:\n\n",
        utc(args.since.ms),
        args.since.given,
        by.as_str()
    );
    out.push_str(&table(&usage, by));
    let month = month_start_ms(now_ms());
    let spent = match config.settings.monthly_budget_usd {
        Some(_) => db.month_spend(month).await?,
        None => Vec::new(),
    };
    out.push('\n');
    out.push_str(&budget(config.settings.monthly_budget_usd, month, &spent));
    print!("{out}");
    Ok(ExitCode::SUCCESS)
}

/// The file of a `sqlite:` URL (not `:memory:`).
fn sqlite_file(url: &str) -> Option<String> {
    let rest = url.trim().strip_prefix("sqlite:")?;
    let rest = rest.strip_prefix("//").unwrap_or(rest);
    let path = rest.split('?').next().unwrap_or(rest);
    (!path.is_empty() && path != ":memory:").then(|| path.to_string())
}

/// A time as the CLI shows it: `2026-11-22 10:00 UTC`.
fn utc(ms: i64) -> String {
    chrono::DateTime::from_timestamp_millis(ms).map_or_else(
        || ms.to_string(),
        |t| t.format("%Y-%m-%d %H:%M UTC").to_string(),
    )
}

/// A string kodx did not choose (a login) made safe for a terminal: control characters
/// (escape sequences, new lines) become `�`.
fn printable(s: &str) -> String {
    s.chars()
        .map(|c| if c.is_control() { '\u{fffd}' } else { c })
        .collect()
}

/// The aligned table: a heading, a line per group, a rule and the total.
fn table(usage: &Usage, by: UsageBy) -> String {
    let cells = |r: &UsageRow| {
        [
            printable(&r.key),
            r.runs.to_string(),
            r.success_text(),
            format_usd(r.spend_usd()),
            r.median_text(),
        ]
    };
    let heading = [by.as_str(), "runs", "success", "spend", "median"].map(String::from);
    let mut lines: Vec<[String; 5]> = vec![heading];
    lines.extend(usage.rows.iter().map(cells));
    let total = cells(&usage.total);
    let width = |i: usize| {
        lines
            .iter()
            .chain(std::iter::once(&total))
            .map(|l| l[i].chars().count())
            .max()
            .unwrap_or(0)
    };
    let widths: Vec<usize> = (0..5).map(width).collect();
    let line = |l: &[String; 5]| {
        let mut s = format!("{:<w$}", l[0], w = widths[0]);
        for (cell, w) in l.iter().zip(&widths).skip(1) {
            let _ = write!(s, "  {cell:>w$}");
        }
        s.push('\n');
        s
    };
    let mut out: String = lines.iter().map(line).collect();
    if usage.rows.is_empty() {
        out.push_str("(no runs)\n");
    }
    out.push_str(&"-".repeat(widths.iter().sum::<usize>() + 2 * (widths.len() - 1)));
    out.push('\n');
    out.push_str(&line(&total));
    out
}

/// The monthly budget (§9) and what each installation with runs this month has left.
fn budget(budget: Option<f64>, month: i64, spent: &[MonthSpend]) -> String {
    let Some(b) = budget else {
        return "No monthly budget (the server setting monthly_budget_usd).\n".into();
    };
    let mut out = format!(
        "Monthly budget: {} per installation; this month (since {}):\n",
        format_usd(b),
        utc(month)
    );
    if spent.is_empty() {
        let _ = writeln!(out, "  nothing spent yet: {} left", format_usd(b));
    }
    for s in spent {
        let _ = writeln!(
            out,
            "  {}: {} spent, {} left",
            printable(&s.name()),
            format_usd(micros_to_usd(s.spend_micros)),
            format_usd(micros_to_usd(s.left_micros(b)))
        );
    }
    out
}

/// Micro-dollars as an exact decimal in dollars (`1.250000`), for a spreadsheet to add up.
fn dollars(micros: i64) -> String {
    format!("{}.{:06}", micros / 1_000_000, micros % 1_000_000)
}

/// The table as CSV (RFC 4180, CRLF line ends): one line per group.
fn csv(usage: &Usage, by: UsageBy) -> String {
    let mut out = format!(
        "{},runs,succeeded,success_rate,spend_usd,median_usd\r\n",
        by.as_str()
    );
    for r in &usage.rows {
        let _ = write!(
            out,
            "{},{},{},{},{},{}\r\n",
            csv_field(&r.key),
            r.runs,
            r.succeeded,
            r.success_rate()
                .map_or(String::new(), |s| format!("{s:.4}")),
            dollars(r.spend_micros),
            r.median_micros.map_or(String::new(), dollars),
        );
    }
    out
}

/// A text field of the CSV: a field a spreadsheet would read as a formula (starting with
/// `=`, `+`, `-`, `@`, a tab or a carriage return) gets a leading `'`; a field holding a
/// comma, a quote or a line end is quoted, its quotes doubled.
fn csv_field(s: &str) -> String {
    let mut field = String::with_capacity(s.len() + 3);
    if s.starts_with(['=', '+', '-', '@', '\t', '\r']) {
        field.push('\'');
    }
    field.push_str(s);
    if field.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", field.replace('"', "\"\""))
    } else {
        field
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn csv_fields_are_quoted_and_never_formulas() {
        assert_eq!(csv_field("acme/widgets"), "acme/widgets");
        assert_eq!(csv_field("a,b"), "\"a,b\"");
        assert_eq!(csv_field("say \"hi\""), "\"say \"\"hi\"\"\"");
        assert_eq!(csv_field("=HYPERLINK(1)"), "'=HYPERLINK(1)");
        assert_eq!(csv_field("@x,y"), "\"'@x,y\"");
        assert_eq!(csv_field("-1+2"), "'-1+2");
        assert_eq!(csv_field("line\nbreak"), "\"line\nbreak\"");
        assert_eq!(dollars(1_250_000), "1.250000");
        assert_eq!(dollars(7), "0.000007");
    }

    #[test]
    fn an_empty_period_and_an_unknown_installation() {
        let none = UsageRow {
            key: "total".into(),
            runs: 0,
            succeeded: 0,
            spend_micros: 0,
            median_micros: None,
        };
        let usage = Usage {
            rows: Vec::new(),
            total: none,
            days: Vec::new(),
        };
        insta::assert_snapshot!(table(&usage, UsageBy::User), @"
        user   runs  success    spend  median
        (no runs)
        -------------------------------------
        total     0        —  $0.0000       —
        ");
        assert_eq!(
            csv(&usage, UsageBy::Kind),
            "kind,runs,succeeded,success_rate,spend_usd,median_usd\r\n"
        );
        let spent = [MonthSpend {
            installation_id: 9,
            account: Some("evil\u{1b}[2J".into()),
            spend_micros: 12_500_000,
        }];
        insta::assert_snapshot!(budget(Some(10.0), 0, &spent), @"
        Monthly budget: $10.00 per installation; this month (since 1970-01-01 00:00 UTC):
          evil�[2J (installation 9): $12.50 spent, $0.0000 left
        ");
        insta::assert_snapshot!(budget(Some(10.0), 0, &[]), @"
        Monthly budget: $10.00 per installation; this month (since 1970-01-01 00:00 UTC):
          nothing spent yet: $10.00 left
        ");
        insta::assert_snapshot!(budget(None, 0, &[]), @"No monthly budget (the server setting monthly_budget_usd).");
    }

    #[test]
    fn sqlite_files() {
        assert_eq!(
            sqlite_file("sqlite://data/kodx.db").as_deref(),
            Some("data/kodx.db")
        );
        assert_eq!(
            sqlite_file("sqlite:///a/k.db?mode=rwc").as_deref(),
            Some("/a/k.db")
        );
        assert_eq!(sqlite_file("sqlite::memory:"), None);
        assert_eq!(sqlite_file("postgres://u@h/db"), None);
    }
}
