//! Usage (SPEC §12, "Quote and confirmation"; issue 41 item 3) against the real binary:
//! runs with known stored costs are written to the database `kodx serve` uses; the real
//! `kodx usage` prints their sums to the cent (as a table, as CSV read back, by person),
//! refuses a period it cannot read with exit code 2, and reads PostgreSQL as it reads
//! SQLite; `/usage` answers only the operator's token, with the same figures. The page in a
//! real browser: `tests/it/browser.rs`.

use kodx::db::{
    month_start_ms, now_ms, Accepted, Db, Finish, Holder, NewDelivery, NewRun, RunStatus, DAY_MS,
};
use kodx::job::{Job, Trigger};

use crate::common::serve::{redactions, Options, Served, INSTALLATION, PUBLIC_URL};

/// An author kodx did not choose: a spreadsheet formula with a comma and quotes in it.
pub const FORMULA: &str = "=HYPERLINK(\"http://evil.example\",\"x\"),y";

/// The runs: repository, author, kind, how it ended, cost, model calls, days ago.
const RUNS: [(&str, &str, &str, RunStatus, f64, i64, i64); 6] = [
    (
        "acme/widgets",
        "alice",
        "code",
        RunStatus::Succeeded,
        0.1234,
        3,
        2,
    ),
    (
        "acme/widgets",
        "alice",
        "code",
        RunStatus::Failed,
        0.0567,
        2,
        2,
    ),
    (
        "acme/widgets",
        FORMULA,
        "ask",
        RunStatus::Succeeded,
        0.89,
        1,
        1,
    ),
    ("acme/gears", "bob", "code", RunStatus::Succeeded, 1.5, 4, 1),
    (
        "acme/gears",
        "bob",
        "code",
        RunStatus::Cancelled,
        2.3456,
        5,
        0,
    ),
    (
        "acme/gears",
        "alice",
        "help",
        RunStatus::Succeeded,
        0.0,
        0,
        0,
    ),
];

/// A server (no workers: nothing else touches the runs) with a $10 monthly budget.
pub async fn served() -> Served {
    served_on(None).await
}

/// [`served`] on the database `database_url` (default: a SQLite file).
async fn served_on(database_url: Option<String>) -> Served {
    Served::start(Options {
        database_url,
        settings: Some(
            "status_interval_secs = 0.2\nshutdown_grace_secs = 5\nmonthly_budget_usd = 10\n",
        ),
        extra_env: vec![("KODX_PUBLIC_URL".into(), PUBLIC_URL.into())],
        ..Options::default()
    })
    .await
}

/// Writes [`RUNS`] to the server's database, each created the given days ago (but not
/// before this month began, so the budget's figures hold on the 1st too); returns each
/// run's cost and creation time.
pub async fn spend(s: &Served) -> Vec<(f64, i64)> {
    // Answered once the server has opened (and migrated) the database.
    s.get("/healthz").await;
    let db = s.db().await;
    let now = now_ms();
    let mut made = Vec::new();
    for (n, &(repo, author, kind, status, cost, api_calls, days_ago)) in RUNS.iter().enumerate() {
        let id = queue(&db, n as i64, repo, author, kind).await;
        let fin = Finish {
            status,
            stop_reason: "end_turn".into(),
            cost_usd: cost,
            input_tokens: 10,
            output_tokens: 5,
            cache_read_tokens: 0,
            cache_write_tokens: 0,
            api_calls,
            result: "{}".to_owned(),
            pr_url: None,
        };
        assert!(db
            .finish(&id, &Holder::Waiting("w".into()), &fin)
            .await
            .unwrap());
        let at = (now - days_ago * DAY_MS).max(month_start_ms(now));
        set_created_at(&db, s, &id, at).await;
        made.push((cost, at));
    }
    made
}

async fn queue(db: &Db, n: i64, repo: &str, author: &str, kind: &str) -> String {
    let delivery = NewDelivery {
        id: format!("usage-{n}"),
        event: "issue_comment".into(),
        action: Some("created".into()),
        installation_id: Some(INSTALLATION as i64),
        repo: Some(repo.into()),
    };
    let run = NewRun {
        installation_id: INSTALLATION as i64,
        repo: repo.into(),
        issue_number: n + 1,
        is_pull_request: false,
        author: author.into(),
        author_id: 5000 + n,
        clone_url: format!("https://github.com/{repo}.git"),
        default_branch: "main".into(),
        job: match kind {
            "code" => Job::Code {
                request: "work".into(),
                base: None,
            },
            "ask" => Job::Ask {
                question: "why".into(),
            },
            _ => Job::Help { unknown: None },
        },
        trigger: Trigger::IssueComment(70_000 + n),
    };
    match db.accept(&delivery, Some(&run)).await.unwrap() {
        Accepted::Queued { run_id } => run_id,
        other => panic!("expected Queued, got {other:?}"),
    }
}

/// Moves a run's creation time (production never does), on whichever backend `db` is.
async fn set_created_at(db: &Db, s: &Served, id: &str, at: i64) {
    const SQL: &str = "UPDATE runs SET created_at = $1 WHERE id = $2";
    if format!("{db:?}").contains("sqlite") {
        let options =
            sqlx::sqlite::SqliteConnectOptions::new().filename(s.dir.path().join("kodx.db"));
        let pool = sqlx::SqlitePool::connect_with(options).await.unwrap();
        sqlx::query(SQL)
            .bind(at)
            .bind(id)
            .execute(&pool)
            .await
            .unwrap();
        pool.close().await;
    } else {
        let url = s.kodx_env("DATABASE_URL");
        let pool = sqlx::PgPool::connect(&url).await.unwrap();
        sqlx::query(SQL)
            .bind(at)
            .bind(id)
            .execute(&pool)
            .await
            .unwrap();
        pool.close().await;
    }
}

/// `text` read as RFC 4180 CSV: quoted fields may hold commas, doubled quotes and line ends.
pub fn read_csv(text: &str) -> Vec<Vec<String>> {
    let (mut rows, mut row, mut field) = (Vec::new(), Vec::new(), String::new());
    let mut chars = text.chars().peekable();
    let mut quoted = false;
    while let Some(c) = chars.next() {
        match (quoted, c) {
            (true, '"') if chars.peek() == Some(&'"') => {
                chars.next();
                field.push('"');
            }
            (true, '"') => quoted = false,
            (true, c) => field.push(c),
            (false, '"') if field.is_empty() => quoted = true,
            (false, ',') => row.push(std::mem::take(&mut field)),
            (false, '\r') => assert_eq!(chars.next(), Some('\n'), "CR without LF"),
            (false, '\n') => panic!("a line ends without CR: {text:?}"),
            (false, c) => field.push(c),
        }
        if !quoted && c == '\r' {
            row.push(std::mem::take(&mut field));
            rows.push(std::mem::take(&mut row));
        }
    }
    assert!(
        row.is_empty() && field.is_empty(),
        "no CRLF at the end: {text:?}"
    );
    rows
}

/// The stored costs summed, to the cent.
fn stored_total_cents(made: &[(f64, i64)]) -> i64 {
    (made.iter().map(|m| m.0).sum::<f64>() * 100.0).round() as i64
}

#[tokio::test]
async fn kodx_usage_prints_the_stored_costs_summed_to_the_cent() {
    let mut s = served().await;
    let made = spend(&s).await;
    let (out, err, code) = s.kodx_cli(&["usage"]).await;
    assert_eq!(code, Some(0), "{err}");
    redactions(&[], &[]).bind(|| {
        insta::assert_snapshot!(out, @"
        Runs that ended, created since [time] UTC (30d), by repo:

        repo          runs  success  spend   median
        acme/gears       3      67%  $3.85    $1.50
        acme/widgets     3      67%  $1.07  $0.1234
        -------------------------------------------
        total            6      67%  $4.92  $0.1234

        Monthly budget: $10.00 per installation; this month (since [time] UTC):
          installation 77: $4.92 spent, $5.08 left
        ");
    });
    assert_eq!(stored_total_cents(&made), 492);

    // CSV, by person: read back, the sums are the stored costs; the formula is defused.
    let (out, err, code) = s.kodx_cli(&["usage", "--by", "user", "--csv"]).await;
    assert_eq!(code, Some(0), "{err}");
    let rows = read_csv(&out);
    assert_eq!(
        rows[0],
        [
            "user",
            "runs",
            "succeeded",
            "success_rate",
            "spend_usd",
            "median_usd"
        ]
    );
    let by_user: Vec<(&str, &str, &str, &str)> = rows[1..]
        .iter()
        .map(|r| (r[0].as_str(), r[1].as_str(), r[4].as_str(), r[5].as_str()))
        .collect();
    let defused = format!("'{FORMULA}");
    assert_eq!(
        by_user,
        [
            ("bob", "2", "3.845600", "1.500000"),
            (defused.as_str(), "1", "0.890000", "0.890000"),
            ("alice", "3", "0.180100", "0.056700"),
        ],
        "{out}"
    );
    let cents: f64 = rows[1..].iter().map(|r| r[4].parse::<f64>().unwrap()).sum();
    assert_eq!((cents * 100.0).round() as i64, stored_total_cents(&made));
    assert!(!out.lines().any(|l| l.starts_with('=')), "{out}");

    // A period it cannot read: exit code 2, saying what to give; nothing on stdout.
    for bad in ["3w", "0d", "yesterday"] {
        let (out, err, code) = s.kodx_cli(&["usage", "--since", bad]).await;
        assert_eq!(code, Some(2), "--since {bad}: {out}{err}");
        assert!(out.is_empty(), "{out}");
        assert!(
            err.contains("say e.g. 30d (days), 12h (hours) or 2026-11-01"),
            "{err}"
        );
    }
    // A short period leaves the older runs out.
    let (out, _, code) = s
        .kodx_cli(&["usage", "--since", "1h", "--by", "kind", "--csv"])
        .await;
    assert_eq!(code, Some(0));
    let kinds: Vec<String> = read_csv(&out)[1..].iter().map(|r| r.join(",")).collect();
    let today = made.iter().filter(|m| m.1 >= now_ms() - 3_600_000).count();
    assert_eq!(
        kinds
            .iter()
            .map(|k| k.split(',').nth(1).unwrap().parse::<usize>().unwrap())
            .sum::<usize>(),
        today,
        "{out}"
    );
    s.finish().await;
}

/// The operator's `/usage` link, as `kodx operator-link` prints it (its third line).
pub async fn usage_link(s: &Served) -> String {
    let (out, err, ok) = s.operator_link_cli(&[]).await;
    assert!(ok, "{err}");
    let line = out.lines().nth(2).expect("a /usage link");
    line.strip_prefix(PUBLIC_URL)
        .expect("under KODX_PUBLIC_URL")
        .to_string()
}

/// The page's table, from `<table` to `</table>`.
fn table(page: &str) -> &str {
    let start = page.find("<table").expect("a table");
    let end = page.find("</table>").expect("a table's end") + "</table>".len();
    &page[start..end]
}

#[tokio::test]
async fn the_usage_page_opens_only_with_the_operator_token_and_shows_the_same_figures() {
    let mut s = served().await;
    spend(&s).await;
    let link = usage_link(&s).await;
    for wrong in ["/usage", "/usage?token=", "/usage?token=0.0"] {
        let (code, body) = s.get(wrong).await;
        assert_eq!((code, body.as_str()), (404, "not found\n"), "{wrong}");
    }
    let resp = reqwest::get(format!("{}{link}", s.url)).await.unwrap();
    assert_eq!(resp.status(), 200);
    let csp = resp.headers()["content-security-policy"]
        .to_str()
        .unwrap()
        .to_string();
    assert!(csp.starts_with("default-src 'none'"), "{csp}");
    assert_eq!(resp.headers()["cache-control"], "no-store");
    assert_eq!(resp.headers()["x-frame-options"], "DENY");
    let page = resp.text().await.unwrap();
    insta::assert_snapshot!(table(&page), @r#"<table class="usage"><thead><tr><th>repo</th><th>runs</th><th>success</th><th>spend</th><th>median</th></tr></thead><tbody><tr><td>acme/gears</td><td>3</td><td>67%</td><td>$3.85</td><td>$1.50</td></tr><tr><td>acme/widgets</td><td>3</td><td>67%</td><td>$1.07</td><td>$0.1234</td></tr></tbody><tfoot><tr id="total"><td>total</td><td>6</td><td>67%</td><td>$4.92</td><td>$0.1234</td></tr></tfoot></table>"#);
    let token = link.split("token=").nth(1).unwrap();
    assert!(
        page.contains(&format!("href=\"/runs?token={token}\"")),
        "no link back to /runs"
    );
    assert!(
        page.contains("installation 77: $4.92 spent, <strong>$5.08 left</strong>"),
        "{page}"
    );

    // By person: the formula is shown as text, escaped.
    let (code, page) = s.get(&format!("{link}&by=user&since=90d")).await;
    assert_eq!(code, 200);
    assert!(
        page.contains("<td>=HYPERLINK(&quot;http://evil.example&quot;,&quot;x&quot;),y</td>"),
        "{page}"
    );
    // What it cannot read, it says.
    let (code, body) = s.get(&format!("{link}&since=400d")).await;
    assert_eq!(
        (code, body.as_str()),
        (400, "since: at most 366 days back\n")
    );
    let (code, body) = s.get(&format!("{link}&by=team")).await;
    assert_eq!((code, body.as_str()), (400, "by: say repo, user or kind\n"));

    // The list links here.
    let list = link.replace("/usage?", "/runs?");
    let (_, list_page) = s.get(&list).await;
    assert!(
        list_page.contains(&format!("href=\"/usage?token={token}\"")),
        "{list_page}"
    );
    s.finish().await;
}

#[tokio::test]
async fn kodx_usage_reads_postgresql_the_same() {
    let Some(admin) = kodx::db::test_databases::postgres_admin_url() else {
        eprintln!("SKIPPED: KODX_SKIP_POSTGRES=1");
        return;
    };
    let url = kodx::db::test_databases::fresh_postgres_database(&admin).await;
    let mut s = served_on(Some(url)).await;
    let made = spend(&s).await;
    let (out, err, code) = s.kodx_cli(&["usage", "--csv"]).await;
    assert_eq!(code, Some(0), "{err}");
    insta::assert_snapshot!(out.replace("\r\n", "\n"), @"
    repo,runs,succeeded,success_rate,spend_usd,median_usd
    acme/gears,3,2,0.6667,3.845600,1.500000
    acme/widgets,3,2,0.6667,1.070100,0.123400
    ");
    let cents: f64 = read_csv(&out)[1..]
        .iter()
        .map(|r| r[4].parse::<f64>().unwrap())
        .sum();
    assert_eq!((cents * 100.0).round() as i64, stored_total_cents(&made));
    let (out, err, code) = s.kodx_cli(&["usage", "--by", "kind"]).await;
    assert_eq!(code, Some(0), "{err}");
    redactions(&[], &[]).bind(|| {
        insta::assert_snapshot!(out, @"
    Runs that ended, created since [time] UTC (30d), by kind:

    kind   runs  success    spend   median
    code      4      50%    $4.03  $0.1234
    ask       1     100%  $0.8900  $0.8900
    help      1     100%  $0.0000        —
    --------------------------------------
    total     6      67%    $4.92  $0.1234

    Monthly budget: $10.00 per installation; this month (since [time] UTC):
      installation 77: $4.92 spent, $5.08 left
    ")
    });
    s.finish().await;
}
