//! `kodx doctor`: checks what kodx needs and says how to fix what is missing.

use std::process::ExitCode;

use kodx::sandbox::Engine;

#[derive(clap::Args)]
pub struct DoctorArgs {
    /// The sandbox image to check for.
    #[arg(long, env = "KODX_IMAGE", default_value = "python:3.12")]
    image: String,
}

pub async fn run(args: DoctorArgs) -> anyhow::Result<ExitCode> {
    let mut failed = false;
    match Engine::connect().await {
        Ok(engine) => {
            println!(
                "ok    Docker engine at {} (API {})",
                engine.host(),
                engine.api_version()
            );
            match engine.docker().inspect_image(&args.image).await {
                Ok(_) => println!("ok    image {} is present", args.image),
                Err(_) => println!(
                    "note  image {} is not present yet: it is pulled on first use (`docker pull {}` to do it now)",
                    args.image, args.image
                ),
            }
            match engine.sweep_dead_owners().await {
                Ok(0) => {}
                Ok(n) => {
                    println!("ok    removed {n} sandbox container(s) left by dead kodx processes")
                }
                Err(e) => println!("warn  could not sweep old sandbox containers: {e}"),
            }
        }
        Err(e) => {
            failed = true;
            println!("FAIL  {e}");
        }
    }
    Ok(if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}
