//! The parser on what real tools printed (`tests/data/annotations/`, made by its
//! `capture.sh` in a container whose repository is `/workspace/repo`), and on the edges.

use super::lines::{repo_path, strip_escapes};
use super::*;
use Level::{Failure, Notice, Warning};

const REPO: &str = "/workspace/repo";

macro_rules! data {
    ($name:literal) => {
        include_str!(concat!("../../../tests/data/annotations/", $name))
    };
}

fn a(path: &str, line: u32, column: Option<u32>, level: Level, message: &str) -> Annotation {
    Annotation {
        path: path.into(),
        start_line: line,
        end_line: line,
        start_column: column,
        end_column: None,
        level,
        message: message.into(),
        title: None,
    }
}

fn titled(mut annotation: Annotation, title: &str) -> Annotation {
    annotation.title = Some(title.into());
    annotation
}

#[track_caller]
fn assert_parsed(output: &str, expected: &[Annotation]) {
    let got = parse(output, REPO);
    assert_eq!(got, expected, "\n{got:#?}");
}

#[test]
fn gcc_in_colour_keeps_the_repository_and_drops_headers_elsewhere_and_stdin() {
    let gcc = data!("gcc.txt");
    assert!(gcc.contains("\x1b[01;31m\x1b[Kerror") && gcc.contains("\x1b]8;;https://"));
    assert!(gcc.contains("/usr/include/stdio.h:661:30") && gcc.contains("<stdin>:1:25"));
    assert!(gcc.contains("/opt/outside/include/bad.h:2:41"));
    assert_parsed(
        gcc,
        &[
            titled(
                a(
                    "c/main.c",
                    6,
                    Some(10),
                    Warning,
                    "passing argument 1 of 'puts' makes pointer from integer without a cast",
                ),
                "-Wint-conversion",
            ),
            a(
                "c/main.c",
                7,
                Some(12),
                Failure,
                "'missing' undeclared (first use in this function)",
            ),
            titled(
                a("c/main.c", 5, Some(9), Warning, "unused variable 'unused'"),
                "-Wunused-variable",
            ),
            // Compiled as /workspace/repo/c/abs.c.
            a(
                "c/abs.c",
                2,
                Some(17),
                Failure,
                "expected ';' before '}' token",
            ),
        ],
    );
}

#[test]
fn clang() {
    assert_parsed(
        data!("clang.txt"),
        &[
            titled(
                a(
                    "c/main.c",
                    6,
                    Some(10),
                    Warning,
                    "incompatible integer to pointer conversion passing 'int' to parameter of \
                     type 'const char *'",
                ),
                "-Wint-conversion",
            ),
            a(
                "c/main.c",
                7,
                Some(12),
                Failure,
                "use of undeclared identifier 'missing'",
            ),
            a(
                "c/abs.c",
                2,
                Some(17),
                Failure,
                "expected ';' after return statement",
            ),
        ],
    );
}

#[test]
fn cargo_build_in_colour_and_cargo_test_panics() {
    let build = data!("cargo-build.txt");
    assert!(build.contains("\x1b[1m\x1b[91merror[E0308]") && build.contains("/opt/outside/dep"));
    assert_parsed(
        build,
        &[
            titled(
                a(
                    "crates/broken/src/main.rs",
                    7,
                    Some(18),
                    Failure,
                    "mismatched types",
                ),
                "E0308",
            ),
            titled(
                a(
                    "crates/broken/src/main.rs",
                    8,
                    Some(5),
                    Failure,
                    "this function takes 1 argument but 2 arguments were supplied",
                ),
                "E0061",
            ),
            // rustc's `note:` with a place of its own.
            a(
                "crates/broken/src/main.rs",
                1,
                Some(4),
                Notice,
                "function defined here",
            ),
        ],
    );
    assert_parsed(
        data!("cargo-test.txt"),
        &[
            a(
                "crates/calc/src/lib.rs",
                6,
                Some(9),
                Warning,
                "unused variable: `unused`",
            ),
            titled(
                a(
                    "crates/calc/src/lib.rs",
                    19,
                    Some(9),
                    Failure,
                    "assertion `left == right` failed\n  left: 4\n right: 3",
                ),
                "tests::adds",
            ),
            titled(
                a(
                    "crates/calc/src/lib.rs",
                    8,
                    Some(9),
                    Failure,
                    "ratio of 4 to zero",
                ),
                "tests::divides_by_zero",
            ),
        ],
    );
}

#[test]
fn pytest_long_in_colour_and_short_point_at_the_innermost_repository_frame() {
    let long = data!("pytest-long.txt");
    assert!(long.contains("\x1b[1m\x1b[31mpy/calc.py\x1b[0m:11: ZeroDivisionError"));
    assert!(long.contains("/usr/lib/python3.11/json/decoder.py\x1b[0m:353: JSONDecodeError"));
    let json = "json.decoder.JSONDecodeError: Expecting property name enclosed in double \
                quotes: line 1 column 2 (char 1)";
    let division = "ZeroDivisionError: integer division or modulo by zero";
    assert_parsed(
        long,
        &[
            titled(
                a(
                    "py/tests/test_calc.py",
                    8,
                    None,
                    Failure,
                    "AssertionError: assert 4 == 3\n +  where 4 = add(1, 2)",
                ),
                "test_add",
            ),
            titled(a("py/calc.py", 11, None, Failure, division), "test_ratio"),
            // Raised in the standard library: the last frame in the repository.
            titled(a("py/calc.py", 15, None, Failure, json), "test_parse"),
        ],
    );
    assert_parsed(
        data!("pytest-short.txt"),
        &[
            titled(
                a(
                    "py/tests/test_calc.py",
                    8,
                    None,
                    Failure,
                    "assert 4 == 3\n +  where 4 = add(1, 2)",
                ),
                "test_add",
            ),
            titled(a("py/calc.py", 11, None, Failure, division), "test_ratio"),
            titled(a("py/calc.py", 15, None, Failure, json), "test_parse"),
        ],
    );
}

#[test]
fn go_test_plain_and_verbose_and_go_vet() {
    let expected = [
        // A failed test's `t.Log` reads like its `t.Error`.
        titled(a("calc_test.go", 6, None, Failure, "adding"), "TestAdd"),
        titled(
            a(
                "calc_test.go",
                8,
                None,
                Failure,
                "Add(1, 2) = 4, want 3\nsecond line of the message",
            ),
            "TestAdd",
        ),
        titled(
            a("calc_test.go", 20, None, Failure, "Add(1, 1) = 3, want 2"),
            "TestTable/case",
        ),
    ];
    assert_parsed(data!("go-test.txt"), &expected);
    // With -v: the lines of the test that passed are not annotations.
    let verbose = data!("go-test-v.txt");
    assert!(verbose.contains("calc_test.go:13: a log line of a test that passes"));
    assert_parsed(verbose, &expected);
    assert_parsed(
        data!("go-vet.txt"),
        &[
            a(
                "cmd/vetme/main.go",
                9,
                Some(2),
                Failure,
                "self-assignment of x to x",
            ),
            a(
                "cmd/vetme/main.go",
                7,
                Some(2),
                Failure,
                "fmt.Printf format %d has arg name of wrong type string",
            ),
        ],
    );
}

#[test]
fn shellcheck_mypy_and_eslint() {
    let shellcheck = data!("shellcheck.txt");
    assert!(shellcheck.contains("/opt/outside/lint.sh:2:6"));
    let quote = "Double quote to prevent globbing and word splitting.";
    assert_parsed(
        shellcheck,
        &[
            titled(
                a(
                    "sh/run.sh",
                    2,
                    Some(12),
                    Notice,
                    "Use ./*glob* or -- *glob* so names with dashes won't become options.",
                ),
                "SC2035",
            ),
            titled(a("sh/run.sh", 4, Some(8), Notice, quote), "SC2086"),
            titled(a("sh/run.sh", 6, Some(6), Notice, quote), "SC2086"),
            titled(
                a(
                    "sh/run.sh",
                    6,
                    Some(17),
                    Warning,
                    "Use semicolon or linefeed before 'then' (or quote to make it literal).",
                ),
                "SC1010",
            ),
        ],
    );
    assert_parsed(
        data!("mypy.txt"),
        &[
            titled(
                a(
                    "py/calc.py",
                    19,
                    Some(12),
                    Failure,
                    "Incompatible return value type (got \"str\", expected \"int\")",
                ),
                "return-value",
            ),
            a(
                "py/calc.py",
                23,
                Some(17),
                Notice,
                "Revealed type is \"int\"",
            ),
        ],
    );
    // eslint prints absolute paths: inside the repository, made relative.
    let eslint = data!("eslint.txt");
    assert!(eslint.starts_with("/workspace/repo/js/app.js:1:7:"));
    assert_parsed(
        eslint,
        &[
            titled(
                a(
                    "js/app.js",
                    1,
                    Some(7),
                    Failure,
                    "'unused' is assigned a value but never used.",
                ),
                "no-unused-vars",
            ),
            titled(
                a(
                    "js/app.js",
                    2,
                    Some(13),
                    Failure,
                    "'undefinedName' is not defined.",
                ),
                "no-undef",
            ),
            titled(
                a(
                    "js/app.js",
                    3,
                    Some(10),
                    Failure,
                    "'f' is defined but never used.",
                ),
                "no-unused-vars",
            ),
            titled(
                a(
                    "js/app.js",
                    4,
                    Some(12),
                    Warning,
                    "Expected '===' and instead saw '=='.",
                ),
                "eqeqeq",
            ),
            a(
                "js/broken.js",
                1,
                Some(11),
                Failure,
                "Parsing error: Unexpected token ;",
            ),
        ],
    );
}

#[test]
fn flake8_in_colour_and_ruff_in_both_formats() {
    let flake8 = data!("flake8.txt");
    assert!(flake8.contains("\x1b[1m\x1b[31mF401\x1b[m"));
    assert_parsed(
        flake8,
        &[
            titled(
                a(
                    "py/calc.py",
                    1,
                    Some(1),
                    Failure,
                    "'os' imported but unused",
                ),
                "F401",
            ),
            titled(
                a("py/calc.py", 19, Some(18), Warning, "trailing whitespace"),
                "W291",
            ),
            titled(
                a(
                    "py/calc.py",
                    23,
                    Some(5),
                    Failure,
                    "undefined name 'reveal_type'",
                ),
                "F821",
            ),
            titled(
                a(
                    "py/tests/test_calc.py",
                    4,
                    Some(1),
                    Failure,
                    "module level import not at top of file",
                ),
                "E402",
            ),
        ],
    );
    let unsorted = "Import block is un-sorted or un-formatted";
    let ruff = [
        titled(a("py/calc.py", 1, Some(1), Failure, unsorted), "I001"),
        titled(
            a(
                "py/calc.py",
                1,
                Some(8),
                Failure,
                "`os` imported but unused",
            ),
            "F401",
        ),
        titled(
            a(
                "py/calc.py",
                23,
                Some(5),
                Failure,
                "Undefined name `reveal_type`",
            ),
            "F821",
        ),
        titled(
            a("py/tests/test_calc.py", 1, Some(1), Failure, unsorted),
            "I001",
        ),
    ];
    assert_parsed(data!("ruff-concise.txt"), &ruff);
    let full = data!("ruff-full.txt");
    assert!(full.contains("\x1b[1m\x1b[94m--> \x1b[0mpy/calc.py:1:8"));
    assert_parsed(full, &ruff);
}

#[test]
fn only_paths_inside_the_repository_are_kept() {
    for (path, kept) in [
        ("src/a.c", Some("src/a.c")),
        ("./src/./a.c", Some("src/a.c")),
        ("src//a.c", Some("src/a.c")),
        ("/workspace/repo/src/a.c", Some("src/a.c")),
        ("/workspace/repository/a.c", None),
        ("/workspace/repo", None),
        ("../other/a.c", None),
        ("src/../../a.c", None),
        ("/usr/include/stdio.h", None),
        (
            "/root/.cargo/registry/src/index.crates.io-6f17d22bba15001f/serde-1.0.0/src/lib.rs",
            None,
        ),
        ("/usr/lib/python3/dist-packages/six.py", None),
        ("<stdin>", None),
        ("<built-in>", None),
        ("-", None),
        ("~/a.c", None),
    ] {
        assert_eq!(repo_path(path, REPO).as_deref(), kept, "{path}");
        let line = format!("{path}:3:1: error: boom");
        let got: Vec<String> = parse(&line, REPO).into_iter().map(|a| a.path).collect();
        assert_eq!(
            got,
            kept.into_iter().map(String::from).collect::<Vec<_>>(),
            "{line}"
        );
    }
    // The repository's directory may be given with a trailing slash.
    assert_eq!(
        parse("/workspace/repo/a.c:1: error: x", "/workspace/repo/")[0].path,
        "a.c"
    );
}

#[test]
fn escapes_are_stripped_before_reading() {
    let mut out = String::new();
    for (raw, clean) in [
        ("\x1b[1;31merror\x1b[0m: x", "error: x"),
        ("\x1b]8;;https://gcc.gnu.org/\x07-Wall\x1b]8;;\x07", "-Wall"),
        ("\x1b]8;;https://x/\x1b\\link\x1b]8;;\x1b\\ end", "link end"),
        ("\x1b(Bplain\x1b[K", "plain"),
        ("  3%\r100%", "100%"),
        ("tab\there\x07", "tab\there"),
        ("cut \x1b[", "cut "),
    ] {
        strip_escapes(raw, &mut out);
        assert_eq!(out, clean, "{raw:?}");
    }
    let coloured =
        "\x1b[01m\x1b[Ksrc/a.c:4:2:\x1b[m\x1b[K \x1b[01;35m\x1b[Kwarning: \x1b[m\x1b[Kx\r\n";
    assert_eq!(
        parse(coloured, REPO),
        [a("src/a.c", 4, Some(2), Warning, "x")]
    );
}

#[test]
fn other_spellings_of_the_formats() {
    let output = "\
src/main.rs:7:18: error[E0308]: mismatched types
thread 'main' panicked at 'index out of bounds: the len is 0', src/main.rs:3:5
lib.c:9: fatal error: x.h: No such file or directory
lib.c:10:1: note: expanded from here
tests/test_x.py:12: AssertionError
2026-11-28 10:00:01: error: a log line
12:30:45: error: a time
src/a.c: In function 'main':
In file included from src/a.c:2:
src/a.c:0:1: error: line zero
src/a.c:99999999999:1: error: a line too long
src/a.c:3:1: error:
        thread 'tests::indented' (7) panicked at src/lib.rs:4:5:
        assertion failed: ok
          detail
        note: run with `RUST_BACKTRACE=1` environment variable to display a backtrace
    src/b.c:2:3: error: indented by a runner
    x_test.go:3: error: no Go test said it failed
    tests/test_y.py:5: AssertionError
";
    assert_parsed(
        output,
        &[
            titled(
                a("src/main.rs", 7, Some(18), Failure, "mismatched types"),
                "E0308",
            ),
            titled(
                a(
                    "src/main.rs",
                    3,
                    Some(5),
                    Failure,
                    "index out of bounds: the len is 0",
                ),
                "main",
            ),
            a("lib.c", 9, None, Failure, "x.h: No such file or directory"),
            a("lib.c", 10, Some(1), Notice, "expanded from here"),
            a("tests/test_x.py", 12, None, Failure, "AssertionError"),
            // As cargo nextest shows a test's output: indented.
            titled(
                a(
                    "src/lib.rs",
                    4,
                    Some(5),
                    Failure,
                    "assertion failed: ok\n  detail",
                ),
                "tests::indented",
            ),
            a("src/b.c", 2, Some(3), Failure, "indented by a runner"),
        ],
    );
}

#[test]
fn messages_and_titles_are_bounded_and_duplicates_dropped() {
    let long = "word ".repeat(1000);
    let output = format!("a.c:1:1: error: {long} [{}]\n", "t".repeat(60)).repeat(3);
    let got = parse(&output, REPO);
    assert_eq!(got.len(), 1, "duplicates dropped");
    assert!(got[0].message.chars().count() <= MAX_MESSAGE_CHARS);
    assert!(got[0].message.ends_with("word…"), "{}", got[0].message);
    assert_eq!(got[0].title.as_deref(), Some("t".repeat(60).as_str()));
    // A title of the check's name when the output gave none.
    let named = for_check("a.c:1:1: error: x\na.c:2:1: error[E1]: y\n", REPO, "build");
    let titles: Vec<_> = named.iter().map(|a| a.title.as_deref()).collect();
    assert_eq!(titles, [Some("build"), Some("E1")]);
    // 200 annotations of long messages: the check's result keeps what fits its bytes.
    let many: String = (1..=200)
        .map(|i| format!("src/f{i}.c:{i}:1: error: {}\n", "m".repeat(900)))
        .collect();
    let kept = for_check(&many, REPO, "build");
    assert!(kept.len() < 40 && kept.len() > 20, "{}", kept.len());
    let bytes: usize = kept
        .iter()
        .map(|a| a.path.len() + a.message.len() + 69)
        .sum();
    assert!(
        bytes <= super::parser::MAX_CHECK_ANNOTATION_BYTES,
        "{bytes}"
    );
}

#[test]
fn a_huge_output_is_read_in_one_bounded_pass() {
    let mut output = String::new();
    output.push_str(&format!("{}\n", "x".repeat(5 << 20)));
    output.push_str(&"   Compiling something v1.0.0\n".repeat(100_000));
    output.push_str(&"src/same.c:1:1: error: again\n".repeat(10_000));
    for i in 1..=300 {
        output.push_str(&format!("src/f{i}.c:{i}:1: warning: number {i}\n"));
    }
    let started = std::time::Instant::now();
    let got = parse(&output, REPO);
    assert!(started.elapsed() < std::time::Duration::from_secs(10));
    assert_eq!(got.len(), MAX_ANNOTATIONS);
    assert_eq!(got[0], a("src/same.c", 1, Some(1), Failure, "again"));
    assert_eq!(got[199].path, "src/f199.c");
    // A single line of megabytes: only its start is read.
    let line = format!("src/a.c:1:1: error: {}", "y".repeat(10 << 20));
    let got = parse(&line, REPO);
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].message.chars().count(), MAX_MESSAGE_CHARS);
}
