//! The change set from the helper's snapshot (only what the run touched crosses the
//! engine) against the whole workspace read back, on the real Docker engine.

use std::fs;
use std::os::unix::fs::{symlink, PermissionsExt};

use crate::common;
use crate::common::*;
use kodx::sandbox::Sandbox;

const LONG: &str =
    "a-directory-name-long-enough-that-the-path-needs-more-than-the-hundred-bytes-of-a-tar-header";

/// A repository of 400 small files in 20 directories, rules at two levels, a symlink, an
/// executable, a file larger than what a change set keeps in memory, and a long path.
fn repository() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    for i in 0..20 {
        fs::create_dir(d.join(format!("d{i}"))).unwrap();
        for j in 0..20 {
            fs::write(d.join(format!("d{i}/f{j}.txt")), format!("file {i}/{j}\n")).unwrap();
        }
    }
    fs::write(d.join(".gitignore"), "target/\n*.log\n").unwrap();
    fs::create_dir(d.join("sub")).unwrap();
    fs::write(d.join("sub/.gitignore"), "gen/\n").unwrap();
    fs::write(d.join("sub/kept.txt"), "kept\n").unwrap();
    fs::write(d.join("big.bin"), vec![b'b'; 600 << 10]).unwrap();
    fs::write(d.join("tool.sh"), "echo tool\n").unwrap();
    fs::set_permissions(d.join("tool.sh"), fs::Permissions::from_mode(0o755)).unwrap();
    symlink("d0/f0.txt", d.join("link")).unwrap();
    fs::create_dir(d.join(LONG)).unwrap();
    fs::write(d.join(LONG).join("inside-the-long-directory.txt"), "deep\n").unwrap();
    dir
}

#[tokio::test]
async fn the_snapshot_gives_the_same_change_set_as_the_whole_workspace() {
    let engine = common::require_engine!();
    let src = repository();
    let mut spec = spec("snapshot");
    spec.repo_dir = Some(src.path().to_path_buf());
    // The first snapshot is the one started ahead, waiting for its line; the later ones
    // start their exec when asked.
    spec.change_set_ahead = true;
    let sb = start(&engine, &spec).await;
    assert!(sb.snapshot_ready(), "a whole copy-in leaves its marker");
    assert_eq!(
        sb.snapshot_change_set().await.map(|s| s.changes.len()),
        Some(0),
        "nothing changed yet"
    );

    // Every kind of edit a run makes, including ones that keep a file's size and mtime.
    let edits = [
        "printf 'X' | dd of=d1/f1.txt bs=1 seek=0 conv=notrunc 2>/dev/null",
        "echo more >> d2/f2.txt",
        "rm d3/f3.txt",
        "mv d4 d4-renamed",
        "chmod +x d5/f5.txt",
        "rm d6/f6.txt && ln -s f7.txt d6/f6.txt",
        "echo hi > d7/new.txt",
        "mkdir -p target/debug && echo bin > target/debug/x && echo log > a.log",
        "mkdir -p sub/gen && echo g > sub/gen/out.txt",
        "ln d8/f8.txt d8/hard.txt",
        "printf 'Z' | dd of=big.bin bs=1 seek=1000 conv=notrunc 2>/dev/null",
        "t=$(stat -c %y d9/f9.txt) && echo 'file 9/X' > d9/f9.txt && touch -d \"$t\" d9/f9.txt",
        "echo '*.tmp' >> .gitignore && echo t > x.tmp",
        "echo new > sub/kept.txt.new && mv sub/kept.txt.new sub/kept.txt",
        &format!("echo deeper > '{LONG}/a-new-file-with-a-long-name-too.txt'"),
        "rm link && ln -s d0/f1.txt link",
        // Old files moved onto paths the checkout has: a directory, then two files.
        "rm -rf d10 && mv d11 d10",
        "mv d12/f0.txt t && mv d12/f1.txt d12/f0.txt && mv t d12/f1.txt",
    ];
    sb.feed_chars("default", &edits.join("; "), 30 * SEC)
        .await
        .unwrap();

    let fast = sb
        .snapshot_change_set()
        .await
        .expect("the snapshot is taken");
    let full = sb.full_change_set().await.unwrap();
    assert_eq!(described(&fast), described(&full));
    assert_eq!(fast, full, "the same contents, modes and targets");
    let got = described(&fast);
    for want in [
        ".gitignore modified content=true mode=false",
        "d1/f1.txt modified content=true mode=false",
        "d2/f2.txt modified content=true mode=false",
        "d3/f3.txt deleted",
        "d4-renamed/f0.txt added",
        "d4/f0.txt deleted",
        "d5/f5.txt modified content=false mode=true",
        "d6/f6.txt modified content=true mode=false",
        "d7/new.txt added",
        "d8/hard.txt added",
        "big.bin modified content=true mode=false",
        "d9/f9.txt modified content=true mode=false",
        "sub/kept.txt modified content=true mode=false",
        "link modified content=true mode=false",
        "d10/f0.txt modified content=true mode=false",
        "d11/f0.txt deleted",
        "d12/f0.txt modified content=true mode=false",
        "d12/f1.txt modified content=true mode=false",
    ] {
        assert!(
            got.iter().any(|g| g == want),
            "{want:?} missing from {got:#?}"
        );
    }
    assert!(
        !got.iter().any(|g| g.starts_with("target/")
            || g.starts_with("a.log")
            || g.starts_with("sub/gen")
            || g.starts_with("x.tmp")
            || g.starts_with("d8/f8.txt")),
        "ignored or untouched paths: {got:#?}"
    );
    assert!(
        got.iter()
            .any(|g| g.ends_with("a-new-file-with-a-long-name-too.txt added")),
        "{got:#?}"
    );
    assert_eq!(sb.change_set().await.unwrap(), full);
    sb.destroy().await.unwrap();
}

#[tokio::test]
async fn without_its_marker_the_change_set_reads_the_whole_workspace() {
    let engine = common::require_engine!();
    let src = repository();
    let mut spec = spec("snapshot-gone");
    spec.repo_dir = Some(src.path().to_path_buf());
    spec.change_set_ahead = true;
    let sb = start(&engine, &spec).await;
    sb.feed_chars(
        "default",
        "echo changed > d0/f0.txt; rm -f /.kodx-copied",
        10 * SEC,
    )
    .await
    .unwrap();
    assert_eq!(
        sb.snapshot_change_set().await,
        None,
        "no marker, no snapshot"
    );
    let set = sb.change_set().await.unwrap();
    assert_eq!(
        described(&set),
        ["d0/f0.txt modified content=true mode=false"]
    );
    sb.destroy().await.unwrap();
}

/// A container that replaced kodx's helper with a program writing a tar flood as the
/// snapshot (issue 36): a 1.25 GiB PAX header from a setup script, so the snapshot started
/// ahead runs it, then a 1.25 GiB GNU long name from a shell, for a snapshot started when
/// asked. Whether the flood is refused on its header or the replaced helper never runs
/// (kodx may keep its helper out of the container's reach), kodx's memory stays flat and
/// the change set is the run's: from the snapshot, or from the whole workspace after it.
#[tokio::test]
async fn a_replaced_helper_flooding_the_snapshot_leaves_memory_flat_and_the_change_set_right() {
    use crate::common::tar_flood::Flood;
    const GROWTH_LIMIT: usize = 150 << 20; // the flood is 1.25 GiB, read whole by the crate
    let engine = common::require_engine!();
    let src = tempfile::tempdir().unwrap();
    fs::write(src.path().join("a.txt"), "a\n").unwrap();
    fs::write(src.path().join("keep.txt"), "keep\n").unwrap();
    let mut spec = spec("snapshot-flood");
    spec.repo_dir = Some(src.path().to_path_buf());
    spec.setup_script = Some(Flood::Pax.replace_helper());
    spec.change_set_ahead = true;
    let before = peak_rss();
    let sb = start(&engine, &spec).await;
    let replaced = sb
        .feed_chars(
            "default",
            &format!(
                "echo changed > a.txt; echo new > b.txt; cmp /tmp/.kodx-net.real {} \
                 && echo the helper is the real one",
                kodx::sandbox::net::SANDBOX_HELPER_PATH
            ),
            10 * SEC,
        )
        .await
        .unwrap()
        .output;
    assert_eq!(
        replaced.trim(),
        "the helper is the real one",
        "the helper on its read-only volume stays kodx's"
    );
    let want = ["a.txt modified content=true mode=false", "b.txt added"];

    // The PAX flood went in with the setup script; the long-name one goes in from a shell.
    for (flood, then) in [("PAX", None), ("long-name", Some(Flood::LongName))] {
        if let Some(then) = then {
            sb.feed_chars("default", &then.replace_helper(), 10 * SEC)
                .await
                .unwrap();
        }
        let fast = sb.snapshot_change_set().await;
        assert!(
            fast.as_ref().is_none_or(|set| described(set) == want),
            "{fast:?}"
        );
        assert_eq!(described(&sb.change_set().await.unwrap()), want);
        let grown = peak_rss().saturating_sub(before);
        println!("{flood} flood: peak memory grew by {} MB", grown >> 20);
        assert!(grown <= GROWTH_LIMIT, "grew by {} MB", grown >> 20);
    }
    sb.destroy().await.unwrap();
}

/// The snapshot started ahead waits while the model works; its stdout is the change set
/// kodx checks and commits. Nothing in the sandbox can open it through `/proc`: a process
/// there writing a forged tar into it is refused, and the change set stays the workspace's.
#[tokio::test]
async fn nothing_in_the_sandbox_can_write_into_the_snapshot_started_ahead() {
    let engine = common::require_engine!();
    let repo = repository();
    let mut spec = common::spec("snapshot-forge");
    spec.repo_dir = Some(repo.path().to_path_buf());
    spec.change_set_ahead = true;
    let sb = start(&engine, &spec).await;
    // (The snapshot's exec starts just after the first shell: looked for a while.)
    let forge = concat!(
        "echo changed > d0/f0.txt; found=0; opened=0; ",
        "for i in $(seq 50); do for p in /proc/[0-9]*; do ",
        "  tr '\\0' ' ' < $p/cmdline 2>/dev/null | grep -q snapshot-on-line || continue; found=1; ",
        "  for fd in 1 2; do echo forged-tar > $p/fd/$fd 2>/dev/null && opened=1; done; ",
        "done; [ $found = 1 ] && break; sleep 0.1; done; echo found=$found opened=$opened"
    );
    let out = sb.feed_chars("default", forge, 30 * SEC).await.unwrap();
    assert!(out.output.contains("found=1 opened=0"), "{out:?}");
    let set = sb.change_set().await.unwrap();
    assert_eq!(
        described(&set),
        ["d0/f0.txt modified content=true mode=false"],
        "{set:?}"
    );
    sb.destroy().await.unwrap();
    assert_gone(&engine, &spec.run_id).await;
}
