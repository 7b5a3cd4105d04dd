//! Prints a script as the server runs it, a Redis function: the
//! name `FCALL` calls on the first line, then the library `FUNCTION LOAD` loads
//! (see `src/lua.rs`). For `scripts/bench-script-alone`, which measures the script
//! alone in Redis with the same text the server loads.
//!
//!   cargo run -q --example lua_function -- purchase
//!   # or: vote, limit (the sign-in and sign-up routes' limiter), ticket_window,
//!   # queue_place (the waiting room's join and standing), queue_admit (its step)

use std::process::ExitCode;

fn main() -> ExitCode {
    let script = match std::env::args().nth(1).as_deref() {
        Some("purchase") => stampede::sale::buy::decision_script(),
        Some("vote") => stampede::vote::cast::decision_script(),
        Some("limit") => stampede::limit::script(),
        Some("ticket_window") => stampede::sale::ticket::window::script(),
        Some("queue_place") => stampede::sale::queue::join::script(),
        Some("queue_admit") => stampede::sale::queue::admit::script(),
        _ => {
            eprintln!(
                "usage: lua_function purchase|vote|limit|ticket_window|queue_place|queue_admit"
            );
            return ExitCode::from(2);
        }
    };
    let Some((name, library)) = script.function() else {
        eprintln!("this script does not run as a function");
        return ExitCode::FAILURE;
    };
    println!("{name}");
    print!("{library}");
    ExitCode::SUCCESS
}
