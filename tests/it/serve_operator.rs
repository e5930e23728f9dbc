//! The operator's links against the real `kodx serve` and the real `kodx operator-link`:
//! nothing opening every run is printed at start; a link is made on demand, expires, and
//! `--rotate` ends every earlier one in the running server without a restart; `/healthz`
//! tells anyone the status and only the operator what was checked.

use std::time::Duration;

use crate::common::serve::{Options, Served, PUBLIC_URL};

async fn served() -> Served {
    Served::start(Options {
        extra_env: vec![("KODX_PUBLIC_URL".into(), PUBLIC_URL.into())],
        ..Options::default()
    })
    .await
}

/// The two links `kodx operator-link args` prints, as paths with their query.
async fn links(s: &Served, args: &[&str]) -> (String, String) {
    let (out, err, ok) = s.operator_link_cli(args).await;
    assert!(ok, "kodx operator-link {args:?} failed: {err}");
    let paths: Vec<String> = out
        .lines()
        .map(|l| {
            l.strip_prefix(PUBLIC_URL)
                .expect("under KODX_PUBLIC_URL")
                .to_string()
        })
        .collect();
    assert_eq!(paths.len(), 3, "{out}");
    assert!(paths[0].starts_with("/runs?token="), "{out}");
    assert!(paths[1].starts_with("/healthz?token="), "{out}");
    assert_eq!(paths[2], paths[0].replace("/runs?", "/usage?"), "{out}");
    assert!(err.contains("valid until"), "{err}");
    (paths[0].clone(), paths[1].clone())
}

fn detailed(body: &str) -> bool {
    let v: serde_json::Value = serde_json::from_str(body).unwrap();
    v.get("database").is_some() && v.get("engines").is_some()
}

#[tokio::test]
async fn a_link_is_made_on_demand_and_a_rotation_ends_the_old_ones_without_a_restart() {
    let mut s = served().await;
    s.wait_for("the hint at start", Duration::from_secs(10), || {
        s.log().contains("`kodx operator-link` prints a link")
    })
    .await;
    assert!(!s.log().contains("token="), "{}", s.log());
    let (list, health) = links(&s, &[]).await;
    let (code, body) = s.get(&list).await;
    assert_eq!(code, 200, "{body}");
    assert!(body.contains("Recent runs"), "{body}");
    let (_, body) = s.get(&health).await;
    assert!(detailed(&body), "{body}");
    // Anyone else: the status only.
    let (_, body) = s.get("/healthz").await;
    assert!(!detailed(&body), "{body}");
    let (code, _) = s.get("/runs?token=").await;
    assert_eq!(code, 404);

    // The old style (a token without an expiry) opens nothing.
    let tag = list.split('.').nth(1).unwrap();
    let (code, _) = s.get(&format!("/runs?token={tag}")).await;
    assert_eq!(code, 404);

    // Rotated from another process while the server runs.
    let (new_list, new_health) = links(&s, &["--rotate"]).await;
    let (code, _) = s.get(&list).await;
    assert_eq!(code, 404, "the old link still opens the list");
    let (_, body) = s.get(&health).await;
    assert!(
        !detailed(&body),
        "the old link still opens the details: {body}"
    );
    let (code, _) = s.get(&new_list).await;
    assert_eq!(code, 200);
    let (_, body) = s.get(&new_health).await;
    assert!(detailed(&body), "{body}");
    s.finish().await;
}

#[tokio::test]
async fn a_link_stops_working_when_it_expires() {
    let mut s = served().await;
    let (list, health) = links(&s, &["--valid", "2s"]).await;
    let issued = std::time::Instant::now();
    let (code, _) = s.get(&list).await;
    assert_eq!(code, 200);
    // Expiry is in whole seconds: past 3 s the link is over whatever the rounding. Asked
    // until the server says so (a page answered from then on is a 404).
    loop {
        let (code, _) = s.get(&list).await;
        if code == 404 {
            break;
        }
        assert_eq!(code, 200);
        assert!(
            issued.elapsed() < Duration::from_millis(3100),
            "the link still opens after {:?}",
            issued.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (_, body) = s.get(&health).await;
    assert!(!detailed(&body), "{body}");
    s.finish().await;
}

#[tokio::test]
async fn a_validity_out_of_range_is_refused_saying_what_to_give() {
    let mut s = served().await;
    for (arg, says) in [("0s", "no time"), ("31d", "at most"), ("soon", "e.g. 24h")] {
        let (out, err, ok) = s.operator_link_cli(&["--valid", arg]).await;
        assert!(!ok, "--valid {arg} was taken: {out}");
        assert!(out.is_empty(), "{out}");
        assert!(err.contains(says), "--valid {arg}: {err}");
    }
    s.finish().await;
}
