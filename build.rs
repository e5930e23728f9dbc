//! Rebuilds when a migration is added: `sqlx::migrate!` embeds `migrations/` at compile time.
fn main() {
    println!("cargo:rerun-if-changed=migrations");
}
