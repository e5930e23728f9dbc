//! Rebuilds when a migration is added (`sqlx::migrate!` embeds `migrations/` at compile
//! time). The sandbox network helper is built by crates/kodx-sandbox/build.rs.

fn main() {
    println!("cargo:rerun-if-changed=migrations");
}
