//! `kodx doctor`'s check of a local engine's data root, against real filesystems: ext4
//! made with and without a journal in files mounted through loop devices. Skipped (with a
//! line saying so) where mounting is not allowed.

use std::path::Path;
use std::process::Command;

use kodx::sandbox::hostfs::ext4_without_journal;

/// Makes an ext4 filesystem in a file (`mkfs.ext4` with `features`) and mounts it under
/// `dir`; `None` when this machine does not let us.
fn mounted(dir: &Path, name: &str, features: &str) -> Option<std::path::PathBuf> {
    let image = dir.join(format!("{name}.ext4"));
    let point = dir.join(name);
    std::fs::create_dir_all(&point).unwrap();
    let file = std::fs::File::create(&image).unwrap();
    file.set_len(64 << 20).unwrap();
    let ok = |c: &mut Command| c.output().is_ok_and(|o| o.status.success());
    if !ok(Command::new("mkfs.ext4")
        .args(["-q", "-F", "-O", features])
        .arg(&image))
    {
        return None;
    }
    if !ok(Command::new("mount")
        .args(["-o", "loop"])
        .arg(&image)
        .arg(&point))
    {
        return None;
    }
    Some(point)
}

fn unmount(point: &Path) {
    let _ = Command::new("umount").arg(point).status();
}

#[test]
fn ext4_without_a_journal_is_told_apart_from_ext4_with_one() {
    let dir = tempfile::tempdir().unwrap();
    let Some(plain) = mounted(dir.path(), "plain", "^has_journal") else {
        eprintln!(
            "SKIPPED: cannot make and mount an ext4 filesystem here (needs root and loop devices)"
        );
        return;
    };
    let journaled = mounted(dir.path(), "journaled", "has_journal");
    let inside = plain.join("docker");
    std::fs::create_dir_all(&inside).unwrap();
    let found = ext4_without_journal(&inside);
    let with_journal = journaled.as_deref().map(ext4_without_journal);
    unmount(&plain);
    if let Some(j) = &journaled {
        unmount(j);
    }
    let device = found.expect("ext4 made with ^has_journal has no journal");
    assert!(device.starts_with("/dev/loop"), "{device}");
    assert_eq!(with_journal, Some(None), "a journaled ext4 is not reported");
}
