//! `keel-spawner`: the spawner process alone (`keel_actors::spawner`), for
//! an embedder whose own binary does not serve it, and for keel-actors'
//! tests and benches. Started by the runtime with its socket as stdin; it
//! exits when the runtime's end closes (with `--kill-on-exit`, killing
//! every process group it started first).

use std::process::ExitCode;

fn main() -> ExitCode {
    let kill_on_exit = std::env::args().skip(1).any(|arg| arg == "--kill-on-exit");
    match keel_actors::spawner::serve_stdin(kill_on_exit) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("keel-spawner: {error}");
            ExitCode::FAILURE
        }
    }
}
