//! Copy-in, export and change sets, against the real Docker engine.

use std::fs;
use std::os::unix::fs::{symlink, PermissionsExt};
use std::path::Path;

use crate::common;
use crate::common::*;
use kodx::sandbox::{ChangeKind, NewEntry, Sandbox, SandboxError};

fn mode(p: &Path) -> u32 {
    fs::symlink_metadata(p).unwrap().permissions().mode() & 0o777
}

fn repo() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    fs::write(d.join("keep.txt"), "unchanged\n").unwrap();
    fs::write(d.join("edit.txt"), "old\n").unwrap();
    fs::write(d.join("gone.txt"), "bye\n").unwrap();
    fs::write(d.join("run.sh"), "echo run\n").unwrap();
    fs::set_permissions(d.join("run.sh"), fs::Permissions::from_mode(0o644)).unwrap();
    fs::write(d.join("tool.sh"), "echo tool\n").unwrap();
    fs::set_permissions(d.join("tool.sh"), fs::Permissions::from_mode(0o755)).unwrap();
    fs::create_dir(d.join("sub")).unwrap();
    fs::write(d.join("sub/a.txt"), "a\n").unwrap();
    symlink("keep.txt", d.join("link")).unwrap();
    dir
}

#[tokio::test]
async fn copy_in_keeps_modes_and_symlinks_and_change_set_is_exact() {
    let engine = common::require_engine!();
    let src = repo();
    let mut spec = spec("changes");
    spec.repo_dir = Some(src.path().to_path_buf());
    let sb = start(&engine, &spec).await;
    let out = sb
        .feed_chars(
            "default",
            "pwd; stat -c '%a %n' run.sh tool.sh; readlink link; cat sub/a.txt",
            10 * SEC,
        )
        .await
        .unwrap();
    assert_eq!(
        out.output, "/workspace/repo\n644 run.sh\n755 tool.sh\nkeep.txt\na\n",
        "{out:?}"
    );
    assert!(
        sb.change_set().await.unwrap().is_empty(),
        "nothing changed yet"
    );

    let edit = "echo new > edit.txt; rm gone.txt; chmod +x run.sh; ln -sfn sub/a.txt link; \
                mkdir -p new/dir && printf 'x' > new/dir/added.txt; git init -q . 2>/dev/null; true";
    sb.feed_chars("default", edit, 10 * SEC).await.unwrap();
    let cs = sb.change_set().await.unwrap();
    let got = described(&cs);
    let want = [
        "edit.txt modified content=true mode=false",
        "gone.txt deleted",
        "link modified content=true mode=false",
        "new/dir/added.txt added",
        "run.sh modified content=false mode=true",
    ];
    assert_eq!(
        got, want,
        "the .git created in the container is not part of the change set"
    );
    let link = cs.changes.iter().find(|c| c.path == "link").unwrap();
    assert!(
        matches!(&link.kind, ChangeKind::Modified { new: NewEntry::Symlink { target }, .. } if target == "sub/a.txt")
    );
    assert_eq!(cs.summary(), "1 added, 3 modified, 1 deleted");

    // Applying the change set to the original tree gives the container's tree.
    let applied = tempfile::tempdir().unwrap();
    let copy = applied.path().join("repo");
    std::process::Command::new("cp")
        .arg("-a")
        .arg(src.path())
        .arg(&copy)
        .status()
        .unwrap();
    cs.apply(&copy).unwrap();
    assert_eq!(fs::read_to_string(copy.join("edit.txt")).unwrap(), "new\n");
    assert!(!copy.join("gone.txt").exists());
    assert_eq!(mode(&copy.join("run.sh")), 0o755);
    assert_eq!(
        fs::read_link(copy.join("link")).unwrap(),
        Path::new("sub/a.txt")
    );
    assert_eq!(
        fs::read_to_string(copy.join("new/dir/added.txt")).unwrap(),
        "x"
    );

    sb.destroy().await.unwrap();
    assert_gone(&engine, &spec.run_id).await;
}

#[tokio::test]
async fn export_replaces_the_destination_with_the_final_workspace() {
    let engine = common::require_engine!();
    let src = repo();
    let mut spec = spec("export");
    spec.repo_dir = Some(src.path().to_path_buf());
    let sb = start(&engine, &spec).await;
    sb.feed_chars(
        "default",
        "rm gone.txt; echo made > made.txt; chmod 600 keep.txt",
        10 * SEC,
    )
    .await
    .unwrap();
    let out_dir = tempfile::tempdir().unwrap();
    let dest = out_dir.path().join("changes");
    fs::create_dir(&dest).unwrap();
    fs::write(dest.join("stale.txt"), "from an earlier export").unwrap();
    fs::write(dest.join("gone.txt"), "stale copy").unwrap();
    let exported = sb.export_workspace(&dest).await.unwrap();
    assert_eq!(exported.files, 6, "regular files written");
    assert_eq!(exported.left_out_count, 0);
    let mut names: Vec<String> = fs::read_dir(&dest)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    assert_eq!(
        names,
        ["edit.txt", "keep.txt", "link", "made.txt", "run.sh", "sub", "tool.sh"]
    );
    assert_eq!(fs::read_to_string(dest.join("made.txt")).unwrap(), "made\n");
    assert_eq!(mode(&dest.join("keep.txt")), 0o600);
    assert_eq!(mode(&dest.join("tool.sh")), 0o755);
    assert_eq!(
        fs::read_link(dest.join("link")).unwrap(),
        Path::new("keep.txt")
    );
    sb.destroy().await.unwrap();
    assert_gone(&engine, &spec.run_id).await;
}

#[tokio::test]
async fn clean_workspace_without_repository() {
    let engine = common::require_engine!();
    let spec = spec("clean");
    let sb = start(&engine, &spec).await;
    let out = sb
        .feed_chars("default", "pwd; ls -A | wc -l", 10 * SEC)
        .await
        .unwrap();
    assert_eq!(out.output, "/workspace\n0\n");
    sb.feed_chars("default", "echo 'print(1)' > app.py", 10 * SEC)
        .await
        .unwrap();
    let cs = sb.change_set().await.unwrap();
    assert_eq!(cs.changes.len(), 1);
    assert_eq!(cs.changes[0].path, "app.py");
    assert!(matches!(
        cs.changes[0].kind,
        ChangeKind::Added(NewEntry::File { .. })
    ));
    sb.destroy().await.unwrap();
    assert_gone(&engine, &spec.run_id).await;
}

#[tokio::test]
async fn hostile_workspace_content_is_refused_on_export() {
    let engine = common::require_engine!();
    let src = repo();
    let mut spec = spec("hostile");
    spec.repo_dir = Some(src.path().to_path_buf());
    let sb = start(&engine, &spec).await;
    let outside = tempfile::tempdir().unwrap();
    let dest = outside.path().join("export");
    for (plant, what) in [
        ("ln -s /etc/passwd abs-link", "abs-link"),
        ("ln -s ../../../../etc escape", "escape"),
        ("mkfifo pipe", "pipe"),
    ] {
        sb.feed_chars("default", plant, 10 * SEC).await.unwrap();
        let err = sb.export_workspace(&dest).await.unwrap_err();
        assert!(
            matches!(err, SandboxError::UnsafeArchive(_)),
            "{plant}: {err:?}"
        );
        assert!(err.to_string().contains(what), "{plant}: {err}");
        let err = sb.change_set().await.unwrap_err();
        assert!(
            matches!(err, SandboxError::UnsafeArchive(_)),
            "{plant}: {err:?}"
        );
        assert!(!dest.exists(), "nothing written for {plant}");
        sb.feed_chars("default", &format!("rm -f {what}"), 10 * SEC)
            .await
            .unwrap();
    }
    // A file over the size limit is refused too.
    let mut spec2 = spec.clone();
    drop(sb);
    assert_gone(&engine, &spec.run_id).await;
    spec2.run_id = run_id("oversize");
    spec2.archive_limits.max_file_bytes = 1000;
    let sb = start(&engine, &spec2).await;
    sb.feed_chars("default", "head -c 5000 /dev/zero > big.bin", 10 * SEC)
        .await
        .unwrap();
    let err = sb.change_set().await.unwrap_err();
    insta::assert_snapshot!(err.to_string(), @r#"unsafe archive: "repo/big.bin": file of 5000 bytes (4.9 KiB) is over the limit max_file_bytes = 1000 (1000 bytes); paths the repository's .gitignore ignores are left out"#);
    sb.destroy().await.unwrap();
    assert_gone(&engine, &spec2.run_id).await;
    assert_eq!(fs::read_dir(outside.path()).unwrap().count(), 0);
}

#[tokio::test]
async fn the_repositorys_own_escaping_symlinks_do_not_block_export() {
    let engine = common::require_engine!();
    let src = repo();
    symlink("../shared/config", src.path().join("config")).unwrap();
    let mut spec = spec("own-links");
    spec.repo_dir = Some(src.path().to_path_buf());
    let sb = start(&engine, &spec).await;
    sb.feed_chars("default", "echo change >> edit.txt", 10 * SEC)
        .await
        .unwrap();
    let cs = sb.change_set().await.unwrap();
    assert_eq!(cs.summary(), "1 modified");
    let out = tempfile::tempdir().unwrap();
    sb.export_workspace(&out.path().join("x")).await.unwrap();
    assert_eq!(
        fs::read_link(out.path().join("x/config")).unwrap(),
        Path::new("../shared/config")
    );
    // Re-pointed by the container: refused like any new escaping link.
    sb.feed_chars("default", "ln -sfn ../../etc config", 10 * SEC)
        .await
        .unwrap();
    let err = sb.change_set().await.unwrap_err();
    insta::assert_snapshot!(err.to_string(), @r#"unsafe archive: symlink "repo/config" -> "../../etc": points outside the tree"#);
    sb.destroy().await.unwrap();
    assert_gone(&engine, &spec.run_id).await;
}

#[tokio::test]
async fn a_missing_repository_directory_is_refused_before_any_container() {
    let engine = common::require_engine!();
    let mut spec = spec("no-repo");
    spec.repo_dir = Some("/nonexistent/kodx-repo".into());
    let err = engine.start(&spec).await.err().expect("refused");
    insta::assert_snapshot!(err.to_string(), @"reading the directory /nonexistent/kodx-repo: No such file or directory (os error 2)");
    assert!(containers_of(&engine, &spec.run_id).await.is_empty());
    let file = tempfile::NamedTempFile::new().unwrap();
    spec.repo_dir = Some(file.path().to_path_buf());
    let err = engine.start(&spec).await.err().expect("refused");
    crate::common::serve::redactions(&[], &[(&file.path().display().to_string(), "[file]")])
        .bind(|| insta::assert_snapshot!(err.to_string(), @"[file] is not a directory"));
}

/// Resets this process's peak resident memory (VmHWM) to what it holds now.
fn reset_peak_rss() {
    fs::write("/proc/self/clear_refs", "5").expect("resetting VmHWM");
}

/// This process's peak resident memory since the last reset, in MB.
fn peak_rss_mb() -> u64 {
    let status = fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with("VmHWM:")).unwrap();
    let kb: u64 = line.split_whitespace().nth(1).unwrap().parse().unwrap();
    kb / 1024
}

#[tokio::test]
async fn a_huge_sparse_file_is_refused_by_its_header_without_reading_it() {
    let engine = common::require_engine!();
    let src = repo();
    let mut spec = spec("huge-file");
    spec.repo_dir = Some(src.path().to_path_buf());
    let sb = start(&engine, &spec).await;
    // 2.3 GB that take no disk: the tar out of the container still carries every byte.
    sb.feed_chars(
        "default",
        "truncate -s 2300M big.bin && echo more >> edit.txt",
        10 * SEC,
    )
    .await
    .unwrap();
    let out = tempfile::tempdir().unwrap();
    let dest = out.path().join("export");
    reset_peak_rss();
    let started = std::time::Instant::now();
    let err = sb.change_set().await.unwrap_err().to_string();
    let change_set_took = started.elapsed();
    common::serve::redactions(&[], &[]).bind(|| insta::assert_snapshot!(err, @r#"unsafe archive: "repo/big.bin": file of [hex] bytes (2.2 GiB) is over the limit max_file_bytes = [hex] (100.0 MiB); paths the repository's .gitignore ignores are left out"#));
    let started = std::time::Instant::now();
    let err = sb.export_workspace(&dest).await.unwrap_err().to_string();
    let export_took = started.elapsed();
    common::serve::redactions(&[], &[]).bind(|| insta::assert_snapshot!(err, @r#"unsafe archive: "repo/big.bin": file of [hex] bytes (2.2 GiB) is over the limit max_file_bytes = [hex] (100.0 MiB)"#));
    assert!(!dest.exists());
    let peak = peak_rss_mb();
    eprintln!("refused in {change_set_took:?} (change set) and {export_took:?} (export); peak RSS {peak} MB");
    assert!(peak < 200, "the test process peaked at {peak} MB");
    sb.destroy().await.unwrap();
    assert_gone(&engine, &spec.run_id).await;
}

#[tokio::test]
async fn ignored_build_output_does_not_fail_the_change_set() {
    let engine = common::require_engine!();
    let src = repo();
    fs::write(src.path().join(".gitignore"), "target/\n").unwrap();
    let mut spec = spec("ignored-output");
    spec.repo_dir = Some(src.path().to_path_buf());
    let sb = start(&engine, &spec).await;
    // 120 MB of build output, over the 100 MiB per-file limit, and a real change.
    sb.feed_chars(
        "default",
        "mkdir -p target/debug && head -c 120M /dev/zero > target/debug/app.bin \
         && echo new > edit.txt",
        30 * SEC,
    )
    .await
    .unwrap();
    let cs = sb.change_set().await.unwrap();
    let paths: Vec<&str> = cs.changes.iter().map(|c| c.path.as_str()).collect();
    assert_eq!(paths, ["edit.txt"], "{cs:?}");

    // The export (the user's own machine) keeps what fits and lists what it left out.
    let out = tempfile::tempdir().unwrap();
    let dest = out.path().join("export");
    let exported = sb.export_workspace(&dest).await.unwrap();
    assert_eq!(
        exported.left_out,
        [("target/debug/app.bin".to_string(), 120 << 20)]
    );
    assert_eq!(fs::read_to_string(dest.join("edit.txt")).unwrap(), "new\n");
    assert!(dest.join("target/debug").is_dir() && !dest.join("target/debug/app.bin").exists());

    // A real oversize change is still refused, naming the file.
    sb.feed_chars("default", "truncate -s 150M data.bin", 10 * SEC)
        .await
        .unwrap();
    let err = sb.change_set().await.unwrap_err().to_string();
    common::serve::redactions(&[], &[]).bind(|| insta::assert_snapshot!(err, @r#"unsafe archive: "repo/data.bin": file of [hex] bytes (150.0 MiB) is over the limit max_file_bytes = [hex] (100.0 MiB); paths the repository's .gitignore ignores are left out"#));
    sb.destroy().await.unwrap();
    assert_gone(&engine, &spec.run_id).await;
}

#[tokio::test]
async fn a_large_repository_file_is_copied_in_without_holding_it() {
    let engine = common::require_engine!();
    let src = repo();
    let size: u64 = 400 << 20; // sparse on the host; over the 100 MiB export limit
    fs::File::create(src.path().join("big.bin"))
        .unwrap()
        .set_len(size)
        .unwrap();
    let mut spec = spec("large-repo-file");
    spec.repo_dir = Some(src.path().to_path_buf());
    reset_peak_rss();
    let sb = start(&engine, &spec).await;
    let peak = peak_rss_mb();
    let out = sb
        .feed_chars("default", "stat -c %s big.bin", 10 * SEC)
        .await
        .unwrap();
    assert_eq!(out.output, format!("{size}\n"));
    eprintln!("copy-in of a 400 MB file: peak RSS {peak} MB");
    assert!(peak < 200, "the test process peaked at {peak} MB");
    // The user's own file, unchanged, is no change and not held to the limit.
    sb.feed_chars("default", "echo x >> edit.txt", 10 * SEC)
        .await
        .unwrap();
    let cs = sb.change_set().await.unwrap();
    assert_eq!(cs.summary(), "1 modified");
    sb.destroy().await.unwrap();
    assert_gone(&engine, &spec.run_id).await;
}

#[tokio::test]
async fn a_symlink_far_outside_the_tree_is_copied_in() {
    let engine = common::require_engine!();
    let src = repo();
    symlink("../..", src.path().join("up")).unwrap();
    symlink("../../../../../etc/hostname", src.path().join("far")).unwrap();
    let mut spec = spec("far-link");
    spec.repo_dir = Some(src.path().to_path_buf());
    let sb = start(&engine, &spec).await;
    let out = sb
        .feed_chars("default", "readlink up far; ls up/workspace", 10 * SEC)
        .await
        .unwrap();
    assert_eq!(out.output, "../..\n../../../../../etc/hostname\nrepo\n");
    sb.feed_chars("default", "echo x >> edit.txt", 10 * SEC)
        .await
        .unwrap();
    assert_eq!(sb.change_set().await.unwrap().summary(), "1 modified");
    let dir = tempfile::tempdir().unwrap();
    sb.export_workspace(&dir.path().join("x")).await.unwrap();
    assert_eq!(
        fs::read_link(dir.path().join("x/up")).unwrap(),
        Path::new("../..")
    );
    sb.destroy().await.unwrap();
    assert_gone(&engine, &spec.run_id).await;
}
