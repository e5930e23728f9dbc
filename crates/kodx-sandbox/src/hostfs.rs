//! What the host's filesystems say about a local engine's data root: whether it sits on
//! ext4 without a journal, where creating files in containers slows down badly.
//!
//! Without a journal, ext4 avoids handing out an inode deleted in the last 60 s (300 s
//! while its inode table block is not yet written back): each new file is checked against
//! every free inode before it (`recently_deleted`). After a container with many files was
//! removed, each file created in the next one costs ~0.7 ms of kernel time: 20,000 files
//! take ~15 s instead of ~0.6 s on the same disk with a journal (measured on this
//! project's machine; docs/benchmarks.md, *Webhook → pull request with the repository cache*).

use std::path::Path;

/// The device of the ext4 filesystem without a journal that holds `path`, if that is
/// where `path` is (`None` when it is not, or when it cannot be told).
pub fn ext4_without_journal(path: &Path) -> Option<String> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    let (fstype, source) = mount_of(&info, path)?;
    if fstype != "ext4" {
        return None;
    }
    let device = std::fs::canonicalize(&source).ok()?;
    let name = device.file_name()?.to_str()?;
    let task = std::fs::read_to_string(format!("/sys/fs/ext4/{name}/journal_task")).ok()?;
    (task.trim() == "<none>").then_some(source)
}

/// The filesystem type and source of the mount holding `path`, from `/proc/self/mountinfo`
/// text: the one with the longest mount point that is `path` or a parent of it.
fn mount_of(mountinfo: &str, path: &Path) -> Option<(String, String)> {
    let mut best: Option<(usize, String, String)> = None;
    for line in mountinfo.lines() {
        let (left, right) = line.split_once(" - ")?;
        let point = unescape(left.split(' ').nth(4)?);
        let mut right = right.split(' ');
        let (fstype, source) = (right.next()?, right.next()?);
        if !path.starts_with(&point) {
            continue;
        }
        let depth = Path::new(&point).components().count();
        if best.as_ref().is_none_or(|(d, _, _)| depth >= *d) {
            best = Some((depth, fstype.to_string(), unescape(source)));
        }
    }
    best.map(|(_, fstype, source)| (fstype, source))
}

/// Undoes mountinfo's octal escapes (`\040` for a space, and so on).
fn unescape(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let octal = bytes
            .get(i + 1..i + 4)
            .filter(|d| d.iter().all(|b| (b'0'..=b'7').contains(b)));
        match (bytes[i], octal) {
            (b'\\', Some(d)) => {
                out.push((d[0] - b'0') * 64 + (d[1] - b'0') * 8 + (d[2] - b'0'));
                i += 4;
            }
            (b, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    const MOUNTINFO: &str = "\
22 1 254:0 / / rw,relatime shared:1 - ext4 /dev/vda rw,discard
23 22 0:21 / /proc rw,nosuid shared:2 - proc proc rw
30 22 254:0 /var/lib/docker /var/lib/docker rw,relatime shared:1 - ext4 /dev/vda rw
31 22 7:0 / /tmp/kodx-engine-journaled rw,relatime shared:9 - ext4 /dev/loop0 rw
32 22 7:1 / /srv/my\\040disk rw,relatime shared:10 - xfs /dev/loop1 rw
";

    #[test]
    fn the_mount_holding_a_path_is_the_deepest_one() {
        let of = |p: &str| mount_of(MOUNTINFO, Path::new(p));
        assert_eq!(
            of("/var/lib/docker"),
            Some(("ext4".into(), "/dev/vda".into()))
        );
        assert_eq!(
            of("/tmp/kodx-engine-journaled/data"),
            Some(("ext4".into(), "/dev/loop0".into()))
        );
        // A path that only starts with a mount point's text is not under it.
        assert_eq!(
            of("/tmp/kodx-engine-journaled-2"),
            Some(("ext4".into(), "/dev/vda".into()))
        );
        assert_eq!(
            of("/srv/my disk/docker"),
            Some(("xfs".into(), "/dev/loop1".into()))
        );
        assert_eq!(of("/proc/1"), Some(("proc".into(), "proc".into())));
        assert_eq!(mount_of("not mountinfo", Path::new("/")), None);
    }
}
