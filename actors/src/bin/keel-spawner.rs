//! `keel-spawner`: the spawner process alone (`keel_actors::spawner`), for
//! an embedder whose own binary does not serve it, and for keel-actors'
//! tests and benches. Started by the runtime with its socket as stdin; it
//! exits when the runtime's end closes.

use std::process::ExitCode;

fn main() -> ExitCode {
    match keel_actors::spawner::serve_stdin() {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("keel-spawner: {error}");
            ExitCode::FAILURE
        }
    }
}
