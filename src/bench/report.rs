//! What `kodx bench sandbox` prints: the rows of figures with their targets, as a table or
//! as one JSON object.

use serde::Serialize;

use super::measure::{ExportFigures, NewShells, SHELL_GAP, SHELL_NAMES};
use super::stats::{stats_of, Stats};

#[derive(Debug, Clone)]
struct Goal {
    /// E.g. "≤ 15 ms".
    text: String,
    limit_ms: f64,
    ok: bool,
}

impl Goal {
    fn median_at_most(stats: &Stats, limit_ms: f64, text: String) -> Goal {
        Goal {
            text,
            limit_ms,
            ok: stats.median <= limit_ms,
        }
    }
}

#[derive(Debug, Clone)]
pub(super) struct Row {
    /// Stable key for the JSON output.
    key: &'static str,
    name: String,
    stats: Stats,
    target: Option<Goal>,
    /// Extra words for the target column when there is no target (or it cannot be judged).
    note: Option<String>,
}

impl Row {
    /// A row without a target or a note.
    fn plain(key: &'static str, name: &str, stats: Stats) -> Row {
        Row {
            key,
            name: name.to_string(),
            stats,
            target: None,
            note: None,
        }
    }
}

pub(super) struct Report {
    pub(super) image: String,
    pub(super) api_version: String,
    pub(super) host: String,
    pub(super) cpus: Option<i64>,
    pub(super) server_version: Option<String>,
    pub(super) rows: Vec<Row>,
    pub(super) baselines_skipped: Option<String>,
}

/// Milliseconds with two decimals below 10 ms, one above.
pub(super) fn fmt_ms(v: f64) -> String {
    if v.abs() < 10.0 {
        format!("{v:.2}ms")
    } else {
        format!("{v:.1}ms")
    }
}

fn target_text(row: &Row) -> String {
    match (&row.target, &row.note) {
        (Some(t), _) => format!("{}: {}", t.text, if t.ok { "ok" } else { "MISSED" }),
        (None, Some(note)) => note.clone(),
        (None, None) => String::new(),
    }
}

pub(super) fn render_table(r: &Report) -> String {
    let mut out = format!(
        "kodx bench sandbox — image {}, Docker API {}, {}\n",
        r.image,
        r.api_version,
        match r.cpus {
            Some(1) => "1 CPU".to_string(),
            Some(n) => format!("{n} CPUs"),
            None => "? CPUs".to_string(),
        }
    );
    let width = r
        .rows
        .iter()
        .map(|row| row.name.chars().count())
        .max()
        .unwrap_or(0)
        .max("measurement".len());
    out.push_str(&format!(
        "{:<width$}  {:>5}  {:>9}  {:>9}  {:>9}  {:>9}  target\n",
        "measurement", "n", "median", "p95", "min", "max"
    ));
    for row in &r.rows {
        let s = &row.stats;
        let line = format!(
            "{:<width$}  {:>5}  {:>9}  {:>9}  {:>9}  {:>9}  {}",
            row.name,
            s.n,
            fmt_ms(s.median),
            fmt_ms(s.p95),
            fmt_ms(s.min),
            fmt_ms(s.max),
            target_text(row)
        );
        out.push_str(line.trim_end());
        out.push('\n');
    }
    if let Some(why) = &r.baselines_skipped {
        out.push_str(&format!("docker CLI baselines skipped: {why}\n"));
    }
    out
}

/// A finite number rounded to three decimals; `None` (JSON `null`) for NaN or infinity,
/// which JSON cannot hold.
fn json_num(v: f64) -> Option<f64> {
    v.is_finite().then(|| (v * 1000.0).round() / 1000.0)
}

/// The JSON object `--json` prints.
#[derive(Serialize)]
struct JsonReport<'r> {
    image: &'r str,
    docker_host: &'r str,
    docker_api_version: &'r str,
    docker_server_version: Option<&'r str>,
    cpus: Option<i64>,
    baselines_skipped: Option<&'r str>,
    measurements: Vec<JsonRow<'r>>,
}

/// One measurement of [`JsonReport`].
#[derive(Serialize)]
struct JsonRow<'r> {
    id: &'r str,
    name: &'r str,
    n: usize,
    median_ms: Option<f64>,
    p95_ms: Option<f64>,
    min_ms: Option<f64>,
    max_ms: Option<f64>,
    target: Option<JsonTarget<'r>>,
    note: Option<&'r str>,
}

/// The target of a [`JsonRow`].
#[derive(Serialize)]
struct JsonTarget<'r> {
    description: &'r str,
    median_limit_ms: Option<f64>,
    ok: bool,
}

pub(super) fn render_json(r: &Report) -> String {
    let measurements = r
        .rows
        .iter()
        .map(|row| JsonRow {
            id: row.key,
            name: &row.name,
            n: row.stats.n,
            median_ms: json_num(row.stats.median),
            p95_ms: json_num(row.stats.p95),
            min_ms: json_num(row.stats.min),
            max_ms: json_num(row.stats.max),
            target: row.target.as_ref().map(|t| JsonTarget {
                description: &t.text,
                median_limit_ms: json_num(t.limit_ms),
                ok: t.ok,
            }),
            note: row.note.as_deref(),
        })
        .collect();
    let json = JsonReport {
        image: &r.image,
        docker_host: &r.host,
        docker_api_version: &r.api_version,
        docker_server_version: r.server_version.as_deref(),
        cpus: r.cpus,
        baselines_skipped: r.baselines_skipped.as_deref(),
        measurements,
    };
    serde_json::to_string(&json).expect("the report serializes")
}

/// Every sample of one `kodx bench sandbox` run, in milliseconds; no baselines when the
/// docker CLI was not there.
pub(super) struct Figures {
    pub(super) docker_run: Option<Vec<f64>>,
    pub(super) cold: Vec<f64>,
    pub(super) echo: Vec<f64>,
    pub(super) shells: NewShells,
    pub(super) export: ExportFigures,
    pub(super) docker_exec: Option<Vec<f64>>,
}

/// The rows of the report, in the order they are printed, with their targets: the cold
/// start against `docker run`, the round trip, the new shells (and their two kinds), the
/// copy-in, the export, then the baselines. `files`: the generated repository's.
pub(super) fn rows_of(figures: &Figures, files: u32) -> anyhow::Result<Vec<Row>> {
    let mut rows = Vec::new();
    let docker_run_stats = figures.docker_run.as_deref().and_then(Stats::of);
    let cold_stats = stats_of(&figures.cold)?;
    rows.push(cold_start_row(cold_stats, docker_run_stats.as_ref()));
    let echo_stats = stats_of(&figures.echo)?;
    rows.push(Row {
        key: "echo_round_trip",
        name: "feed_chars(\"echo hi\") round trip".to_string(),
        target: Some(Goal::median_at_most(&echo_stats, 15.0, "≤ 15 ms".into())),
        stats: echo_stats,
        note: None,
    });
    let shells = &figures.shells.paced;
    let shell_stats = stats_of(shells)?;
    rows.push(Row {
        key: "new_shell",
        name: format!(
            "create_new_shell at a model's pace ({} s apart)",
            SHELL_GAP.as_secs_f64()
        ),
        target: Some(Goal::median_at_most(&shell_stats, 50.0, "≤ 50 ms".into())),
        stats: shell_stats,
        note: None,
    });
    // The same samples split: a name's first use, and replacing a name (which also hangs
    // up the old shell).
    if shells.len() > SHELL_NAMES {
        let (first, again) = shells.split_at(SHELL_NAMES);
        for (key, name, part) in [
            (
                "new_shell_first_use",
                "  of which: first use of a name",
                first,
            ),
            ("new_shell_replace", "  of which: replacing a name", again),
        ] {
            rows.push(Row::plain(key, name, stats_of(part)?));
        }
    }
    // Back to back, the spare shell started after one call is still on its way at the next:
    // close to the engine's own time for an exec.
    rows.push(Row::plain(
        "new_shell_back_to_back",
        "create_new_shell back to back",
        stats_of(&figures.shells.back_to_back)?,
    ));
    let copy_stats = stats_of(&figures.export.copy_in)?;
    rows.push(Row {
        key: "copy_in",
        name: format!("copy-in of {files} files (start with repo)"),
        note: Some(format!(
            "(+{} over cold start)",
            fmt_ms(copy_stats.median - cold_stats.median)
        )),
        stats: copy_stats,
        target: None,
    });
    if let Some(stats) = Stats::of(&figures.export.upload) {
        let name = "  of which: packing + upload of the tar";
        rows.push(Row::plain("copy_in_upload", name, stats));
    }
    let export_stats = stats_of(&figures.export.export)?;
    rows.push(Row {
        key: "change_set_export",
        name: format!("change-set export, {files} files, 3 changed"),
        target: Some(Goal::median_at_most(
            &export_stats,
            1000.0,
            "≤ 1000 ms".into(),
        )),
        stats: export_stats,
        note: None,
    });
    if let Some(stats) = docker_run_stats {
        let name = "docker run --rm IMAGE true (baseline)";
        rows.push(Row::plain("docker_run_baseline", name, stats));
    }
    if let Some(stats) = figures.docker_exec.as_deref().and_then(Stats::of) {
        let name = "docker exec CID true (baseline)";
        rows.push(Row::plain("docker_exec_baseline", name, stats));
    }
    Ok(rows)
}

/// The cold start, judged against 1.2 × the `docker run` baseline when there is one.
fn cold_start_row(stats: Stats, docker_run: Option<&Stats>) -> Row {
    let (target, note) = match docker_run {
        Some(base) => (
            Some(Goal::median_at_most(
                &stats,
                1.2 * base.median,
                format!("≤ 1.2 × docker run ({})", fmt_ms(base.median)),
            )),
            None,
        ),
        None => (
            None,
            Some("≤ 1.2 × docker run: not judged (no baseline)".to_string()),
        ),
    };
    Row {
        key: "cold_start",
        name: "cold start (create → first shell prompt)".to_string(),
        stats,
        target,
        note,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_numbers_are_rounded_and_finite() {
        assert_eq!(json_num(f64::NAN), None);
        assert_eq!(json_num(f64::INFINITY), None);
        assert_eq!(json_num(1.5), Some(1.5));
        assert_eq!(json_num(2.0 / 3.0), Some(0.667));
    }

    #[test]
    fn table_marks_targets() {
        let stats = Stats::of(&[1.0, 2.0, 3.0]).unwrap();
        let row = |limit: f64| Row {
            key: "echo_round_trip",
            name: "x".into(),
            stats,
            target: Some(Goal::median_at_most(&stats, limit, "≤ t".into())),
            note: None,
        };
        let report = Report {
            image: "img".into(),
            api_version: "1.41".into(),
            host: "unix:///var/run/docker.sock".into(),
            cpus: Some(2),
            server_version: None,
            rows: vec![row(2.0), row(1.5)],
            baselines_skipped: None,
        };
        let table = render_table(&report);
        assert!(table.starts_with("kodx bench sandbox — image img, Docker API 1.41, 2 CPUs\n"));
        let lines: Vec<&str> = table.lines().collect();
        assert!(lines[2].ends_with("≤ t: ok"), "{table}");
        assert!(lines[3].ends_with("≤ t: MISSED"), "{table}");
        let json: serde_json::Value = serde_json::from_str(&render_json(&report)).unwrap();
        assert_eq!(json["measurements"][1]["target"]["ok"], false);
        assert_eq!(json["measurements"][0]["id"], "echo_round_trip");
        assert_eq!(json["docker_server_version"], serde_json::Value::Null);
        assert_eq!(json["cpus"], 2);
    }
}
