//! Which files the checks depend on (SPEC §12): a change set that edits one of them is
//! called out beside the checks, so a pass over edited tests is never shown plainly green.
//!
//! A check depends on everything under `.github/`, on the `checks_guard:` globs (by
//! default the usual places of tests), and on any file of the starting commit its command
//! names. Only files of the starting commit count — modified or deleted: a file the run
//! creates is not one (new tests are welcome, and visible in the diff anyway).

use globset::{GlobBuilder, GlobSet, GlobSetBuilder};

use super::CheckSpec;

/// The globs when a repository names none.
pub const DEFAULT_GUARD: [&str; 7] = [
    "test/**",
    "tests/**",
    "**/test_*",
    "**/*_test.*",
    "**/*.test.*",
    "**/*_spec.*",
    "spec/**",
];

/// Most globs `checks_guard:` may list.
pub const MAX_GUARD_GLOBS: usize = 50;
/// The longest glob, in bytes.
const MAX_GLOB_BYTES: usize = 256;
/// Most edited files named for one check (the rest are counted).
pub const MAX_NAMED: usize = 20;

/// The files the checks depend on, by glob.
#[derive(Debug, Clone)]
pub struct Guard {
    globs: Vec<String>,
    set: GlobSet,
}

impl Default for Guard {
    fn default() -> Self {
        let globs: Vec<String> = DEFAULT_GUARD.iter().map(|g| g.to_string()).collect();
        Guard::new(&globs).expect("the default globs are valid")
    }
}

impl PartialEq for Guard {
    fn eq(&self, other: &Self) -> bool {
        self.globs == other.globs
    }
}

impl Guard {
    /// The guard of `globs` (paths relative to the repository's root; `*` stays within a
    /// directory, `**` crosses them).
    pub fn new(globs: &[String]) -> Result<Guard, String> {
        if globs.len() > MAX_GUARD_GLOBS {
            return Err(format!(
                "must list at most {MAX_GUARD_GLOBS} globs, got {}",
                globs.len()
            ));
        }
        let mut set = GlobSetBuilder::new();
        for g in globs {
            set.add(glob(g)?);
        }
        let set = set.build().map_err(|e| e.to_string())?;
        Ok(Guard {
            globs: globs.to_vec(),
            set,
        })
    }

    pub fn globs(&self) -> &[String] {
        &self.globs
    }

    /// Of `edited` (files of the starting commit the change set modifies or deletes), the
    /// ones `check` depends on, sorted and unique.
    pub fn edited_for(&self, check: &CheckSpec, edited: &[String]) -> Vec<String> {
        let named = named_paths(&check.run);
        let mut out: Vec<String> = edited
            .iter()
            .filter(|p| {
                p.starts_with(".github/") || self.set.is_match(p.as_str()) || named.contains(p)
            })
            .cloned()
            .collect();
        out.sort();
        out.dedup();
        out
    }
}

/// One glob, checked: relative, not empty, bounded, valid.
pub fn glob(text: &str) -> Result<globset::Glob, String> {
    let g = text.trim();
    if g.is_empty() {
        return Err("must not be empty".into());
    }
    if g.len() > MAX_GLOB_BYTES {
        return Err(format!("must be at most {MAX_GLOB_BYTES} bytes"));
    }
    if g.starts_with('/') || g.split('/').any(|s| s == "..") {
        return Err(format!(
            "must be relative to the repository's root, without `..`: {g:?}"
        ));
    }
    GlobBuilder::new(g.trim_start_matches("./"))
        .literal_separator(true)
        .build()
        .map_err(|e| format!("is not a valid glob: {e}"))
}

/// The words of a shell command that could be paths: split at blanks and shell syntax,
/// `./` dropped, a pytest node id's `::name` and a trailing `:line` cut.
fn named_paths(command: &str) -> Vec<String> {
    command
        .split(|c: char| c.is_whitespace() || ";|&()<>'\"`=,$".contains(c))
        .filter(|w| !w.is_empty() && !w.starts_with('-'))
        .map(|w| {
            let w = w.split("::").next().unwrap_or(w);
            let w = w.trim_start_matches("./");
            let w = match w.rsplit_once(':') {
                Some((path, line)) if line.chars().all(|c| c.is_ascii_digit()) => path,
                _ => w,
            };
            w.trim_end_matches('/').to_string()
        })
        .filter(|w| !w.is_empty())
        .collect()
}

/// Paths of the starting commit that `changes` modifies or deletes, sorted.
pub fn edited_paths(changes: &crate::sandbox::ChangeSet) -> Vec<String> {
    let mut out: Vec<String> = changes
        .modified()
        .chain(changes.deleted())
        .map(|c| c.path.clone())
        .collect();
    out.sort();
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(run: &str) -> CheckSpec {
        CheckSpec {
            name: "t".into(),
            run: run.into(),
            timeout_secs: 60,
        }
    }

    fn paths(list: &[&str]) -> Vec<String> {
        list.iter().map(|p| p.to_string()).collect()
    }

    #[test]
    fn the_default_globs_catch_the_usual_places_of_tests() {
        let g = Guard::default();
        let edited = paths(&[
            "tests/it/main.rs",
            "test/a.js",
            "src/test_utils.py",
            "test_root.py",
            "pkg/server_test.go",
            "web/app.test.tsx",
            "lib/model_spec.rb",
            "spec/models/user_spec.rb",
            ".github/workflows/ci.yml",
            "src/main.rs",
            "src/testing.rs",
            "contest/x.rs",
            "latest_news.md",
        ]);
        let got = g.edited_for(&check("make"), &edited);
        assert_eq!(
            got,
            paths(&[
                ".github/workflows/ci.yml",
                "lib/model_spec.rb",
                "pkg/server_test.go",
                "spec/models/user_spec.rb",
                "src/test_utils.py",
                "test/a.js",
                "test_root.py",
                "tests/it/main.rs",
                "web/app.test.tsx",
            ])
        );
    }

    #[test]
    fn files_a_command_names_are_guarded_for_that_check_only() {
        let g = Guard::new(&[]).unwrap();
        let edited = paths(&[
            "src/main.py",
            "Makefile",
            "tools/lint.sh",
            "conf/x.toml",
            "src/other.py",
        ]);
        assert_eq!(
            g.edited_for(&check("grep -q fixed src/main.py"), &edited),
            paths(&["src/main.py"])
        );
        assert_eq!(
            g.edited_for(
                &check("make -f ./Makefile test && bash tools/lint.sh;cfg=conf/x.toml run"),
                &edited
            ),
            paths(&["Makefile", "conf/x.toml", "tools/lint.sh"])
        );
        assert_eq!(
            g.edited_for(
                &check("pytest src/other.py::test_a src/main.py:12"),
                &edited
            ),
            paths(&["src/main.py", "src/other.py"])
        );
        // A directory named is not a file named; flags are not paths.
        assert!(g
            .edited_for(&check("pytest src --src=x"), &edited)
            .is_empty());
    }

    #[test]
    fn a_repository_names_its_own_globs_and_bad_ones_are_refused() {
        let g = Guard::new(&paths(&["checks/**", "*.snap"])).unwrap();
        let edited = paths(&["checks/a.sh", "x.snap", "dir/y.snap", "tests/a.rs"]);
        assert_eq!(
            g.edited_for(&check("true"), &edited),
            paths(&["checks/a.sh", "x.snap"])
        );
        assert!(Guard::new(&paths(&["/abs/**"]))
            .unwrap_err()
            .contains("relative"));
        assert!(Guard::new(&paths(&["../up"]))
            .unwrap_err()
            .contains("relative"));
        assert!(Guard::new(&paths(&["a[b"]))
            .unwrap_err()
            .contains("valid glob"));
        assert!(Guard::new(&paths(&[" "])).unwrap_err().contains("empty"));
        let many: Vec<String> = (0..51).map(|i| format!("d{i}/**")).collect();
        assert!(Guard::new(&many).unwrap_err().contains("at most 50"));
    }
}
