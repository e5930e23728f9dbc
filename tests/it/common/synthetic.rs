//! A synthetic repository shaped like rust-lang/cargo (files of ~8 KiB in cargo's layout, a
//! long history of small commits), written with `git fast-import` — for the benchmarks.

use std::io::{self, Write};
use std::path::Path;
use std::process::{Command, Stdio};

/// A deterministic xorshift generator.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

const WORDS: &[&str] = &[
    "let",
    "fn",
    "pub",
    "struct",
    "impl",
    "self",
    "config",
    "package",
    "registry",
    "source",
    "dependency",
    "manifest",
    "workspace",
    "target",
    "build",
    "unit",
    "profile",
    "feature",
    "resolve",
    "lockfile",
    "Result",
    "Option",
    "String",
    "Vec",
    "HashMap",
    "PathBuf",
    "&str",
    "match",
    "if",
    "else",
    "return",
    "Ok(())",
    "Err(e)",
    "?;",
    "=>",
    "{",
    "}",
    "(",
    ")",
    ".",
    "::",
    "gctx",
    "ws",
    "pkg",
    "id",
    "version",
    "name",
    "path",
    "deps",
    "compile",
    "opts",
];

fn line(rng: &mut Rng) -> String {
    let indent = "    ".repeat(rng.below(4));
    let n = 3 + rng.below(9);
    let words: Vec<&str> = (0..n).map(|_| WORDS[rng.below(WORDS.len())]).collect();
    format!("{indent}{}\n", words.join(" "))
}

/// Paths shaped like cargo's tree: `src/cargo/<dir>/<file>.rs`, `tests/testsuite/...`,
/// `crates/<crate>/src/...`, a few docs and manifests.
fn paths(count: usize) -> Vec<String> {
    let mut out = vec!["Cargo.toml".to_string(), "README.md".to_string()];
    let tops = [
        ("src/cargo/core", 40),
        ("src/cargo/ops", 30),
        ("src/cargo/util", 30),
        ("tests/testsuite", 50),
        ("crates", 60),
        ("src/doc/src", 20),
    ];
    let mut i = 0;
    while out.len() < count {
        let (top, width) = tops[i % tops.len()];
        let dir = (i / tops.len()) % width;
        let ext = if top.starts_with("src/doc") {
            "md"
        } else {
            "rs"
        };
        out.push(format!("{top}/m{dir:02}/f{i:04}.{ext}"));
        i += 1;
    }
    out
}

/// Writes the fast-import stream of `commits` commits on `refs/heads/main` over `files`
/// files (the first commit adds them all; each later one rewrites a line or two of 1–3
/// files) into `out`.
fn fast_import_stream(files: usize, commits: usize, out: &mut impl Write) -> io::Result<u64> {
    let mut rng = Rng(0x2545_F491_4F6C_DD1D);
    let paths = paths(files);
    // Average ~8 KiB per file, as cargo's sources.
    let mut contents: Vec<Vec<String>> = paths
        .iter()
        .map(|_| (0..(40 + rng.below(260))).map(|_| line(&mut rng)).collect())
        .collect();
    let mut time = 1_500_000_000u64;
    let mut total = 0u64;
    for c in 1..=commits {
        time += 600 + rng.below(3600) as u64;
        let message = format!("Change {c}: {}", line(&mut rng).trim());
        let mut text = format!(
            "commit refs/heads/main\nmark :{c}\ncommitter Bench <bench@example.com> {time} +0000\ndata {}\n{message}\n",
            message.len() + 1
        );
        if c > 1 {
            text.push_str(&format!("from :{}\n", c - 1));
        }
        let changed: Vec<usize> = if c == 1 {
            (0..paths.len()).collect()
        } else {
            (0..1 + rng.below(3))
                .map(|_| rng.below(paths.len()))
                .collect()
        };
        out.write_all(text.as_bytes())?;
        for f in changed {
            if c > 1 {
                let lines = &mut contents[f];
                let at = rng.below(lines.len());
                lines[at] = line(&mut rng);
                if rng.below(4) == 0 {
                    lines.push(line(&mut rng));
                }
            }
            let body: String = contents[f].concat();
            total += body.len() as u64;
            write!(out, "M 100644 inline {}\ndata {}\n", paths[f], body.len())?;
            out.write_all(body.as_bytes())?;
            out.write_all(b"\n")?;
        }
    }
    Ok(total)
}

/// Runs git on the bare repository `bare`, failing with its stderr; its stdout.
fn git_in(bare: &Path, args: &[&str]) -> String {
    let mut cmd = Command::new("git");
    cmd.arg("--git-dir").arg(bare);
    super::git_server::git_ok(cmd, args)
}

/// Fills the bare repository `bare` (made if absent; its `main` replaced) with `commits`
/// commits over `files` files on `refs/heads/main`, in one well-deltified pack.
pub fn fill_bare(bare: &Path, files: usize, commits: usize) {
    let git = |args: &[&str]| {
        git_in(bare, args);
    };
    if !bare.exists() {
        std::fs::create_dir_all(bare).unwrap();
        git(&["init", "-q", "--bare", "--initial-branch", "main"]);
    }
    let mut child = Command::new("git")
        .arg("--git-dir")
        .arg(bare)
        .args(["fast-import", "--quiet", "--force"])
        .stdin(Stdio::piped())
        .spawn()
        .unwrap();
    {
        let mut stdin = io::BufWriter::new(child.stdin.take().unwrap());
        fast_import_stream(files, commits, &mut stdin).unwrap();
        stdin.flush().unwrap();
    }
    assert!(child.wait().unwrap().success(), "git fast-import failed");
    git(&["repack", "-a", "-d", "-q", "--window=10", "--depth=50"]);
    git(&["prune"]);
}

/// Moves `main` of the bare repository `bare` by `commits` commits as a project moves:
/// each touches 1–3 files, mostly an edited line or two of an existing file, every fifth
/// adds a new file, and one deletes a file. `round` seeds the choice (and names the added
/// files), so successive calls move on from each other. Returns the new tip.
pub fn advance_main(bare: &Path, round: u64, commits: usize) -> String {
    let git = |args: &[&str]| git_in(bare, args);
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15 ^ (round + 1).wrapping_mul(0x2545_F491));
    let mut paths: Vec<String> = git(&["ls-tree", "-r", "--name-only", "refs/heads/main"])
        .lines()
        .map(str::to_string)
        .collect();
    let mut edited: std::collections::HashMap<String, String> = Default::default();
    let mut time = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let mut stream = Vec::new();
    for c in 0..commits {
        time += 1;
        let message = format!("Move {round}.{c}: {}", line(&mut rng).trim());
        write!(
            stream,
            "commit refs/heads/main\ncommitter Bench <bench@example.com> {time} +0000\ndata {}\n{message}\n",
            message.len() + 1
        )
        .unwrap();
        if c == 0 {
            stream.extend_from_slice(b"from refs/heads/main^0\n");
        }
        for k in 0..1 + rng.below(3) {
            if c == commits / 2 && k == 0 {
                let gone = paths.swap_remove(rng.below(paths.len()));
                edited.remove(&gone);
                writeln!(stream, "D {gone}").unwrap();
                continue;
            }
            let (path, body) = if c % 5 == 2 && k == 0 {
                let path = format!("src/cargo/core/moved/r{round}c{c}.rs");
                let body: String = (0..40 + rng.below(100)).map(|_| line(&mut rng)).collect();
                paths.push(path.clone());
                (path, body)
            } else {
                let path = paths[rng.below(paths.len())].clone();
                let mut body = match edited.get(&path) {
                    Some(body) => body.clone(),
                    None => git(&["cat-file", "blob", &format!("refs/heads/main:{path}")]),
                };
                body.push_str(&line(&mut rng));
                (path, body)
            };
            write!(
                stream,
                "M 100644 inline {path}\ndata {}\n{body}\n",
                body.len()
            )
            .unwrap();
            edited.insert(path, body);
        }
    }
    let mut child = Command::new("git")
        .arg("--git-dir")
        .arg(bare)
        .args(["fast-import", "--quiet"])
        .stdin(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(&stream).unwrap();
    assert!(child.wait().unwrap().success(), "git fast-import failed");
    git(&["rev-parse", "refs/heads/main"]).trim().to_string()
}
