//! Builds the sandbox network helper kodx embeds (`native/kodx-net.c`).

use std::path::PathBuf;

fn main() {
    build_net_helper();
}

/// Compiles `native/kodx-net.c` into a static binary without libc for the target, written
/// to `$OUT_DIR/kodx-net` (src/net/image.rs includes it). A target it does not support
/// gets an empty file: kodx then refuses sandboxes with network and says why.
fn build_net_helper() {
    let src = "native/kodx-net.c";
    println!("cargo:rerun-if-changed={src}");
    // Included by kodx-net.c: the checks' mode.
    println!("cargo:rerun-if-changed=native/kodx-checks.c");
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("OUT_DIR")).join("kodx-net");
    let os = std::env::var("CARGO_CFG_TARGET_OS").unwrap_or_default();
    let arch = std::env::var("CARGO_CFG_TARGET_ARCH").unwrap_or_default();
    if os != "linux" || !(arch == "x86_64" || arch == "aarch64") {
        println!(
            "cargo:warning=no sandbox network helper for {os}/{arch}: this kodx can only run \
             sandboxes without network (network = \"off\")"
        );
        std::fs::write(&out, b"").expect("writing an empty helper");
        return;
    }
    let compiler = cc::Build::new()
        .cargo_metadata(false)
        .opt_level_str("s")
        .debug(false)
        .get_compiler();
    let mut cmd = compiler.to_command();
    cmd.args([
        "-static",
        "-nostdlib",
        "-ffreestanding",
        "-fno-builtin",
        "-fno-stack-protector",
        "-fno-asynchronous-unwind-tables",
        "-fno-pie",
        "-no-pie",
        "-s",
        "-Wall",
        "-o",
    ])
    .arg(&out)
    .arg(src);
    let status = cmd.status().unwrap_or_else(|e| {
        panic!(
            "building the sandbox network helper {src} needs a C compiler for the target \
             ({:?}): {e}",
            compiler.path()
        )
    });
    assert!(
        status.success(),
        "building the sandbox network helper {src} failed ({cmd:?})"
    );
}
