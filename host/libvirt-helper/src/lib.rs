//! The libvirt helper: `proxyfleet-libvirt` reads requests on stdin and
//! answers on stdout (see `proxyfleet-libvirt-wire`), each call on a
//! thread of its own since libvirt's client blocks. It ends when stdin
//! does: the operator that started it is gone.
//!
//! - `objects`: the connections, domains, pools, volumes and streams it
//!   holds for the operator, by handle;
//! - `calls`: each request as the libvirt call it names.

mod calls;
mod objects;

use std::io::{Read, Write};
use std::process::ExitCode;
use std::sync::{Arc, Mutex};

use proxyfleet_libvirt_wire::{FrameError, Reply, Request, read_frame, write_frame};

use self::objects::Objects;

/// A helper binary's `main`: serves stdin until it ends, answering on
/// stdout; `name` is the binary's, for its one line on stderr if stdin
/// breaks.
pub fn main(name: &str) -> ExitCode {
    match serve(std::io::stdin().lock(), std::io::stdout()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("{name}: {err}");
            ExitCode::FAILURE
        }
    }
}

/// Serves requests from `input` until it ends, answering on `output`.
/// Calls still running when it ends are abandoned with the process.
///
/// # Errors
/// When `input` breaks or carries something that is not a request.
pub fn serve(mut input: impl Read, output: impl Write + Send + 'static) -> Result<(), FrameError> {
    // libvirt's default handler prints every error to stderr; errors go
    // back to the operator as answers instead.
    virt::error::clear_error_callback();
    let objects = Arc::new(Objects::default());
    let output = Arc::new(Mutex::new(output));
    while let Some((request, payload)) = read_frame::<Request>(&mut input)? {
        let (objects, output) = (Arc::clone(&objects), Arc::clone(&output));
        std::thread::spawn(move || {
            let outcome = calls::run(&objects, request.op, &payload);
            let reply = Reply { id: request.id, outcome };
            let mut out = output.lock().unwrap_or_else(|p| p.into_inner());
            // A broken pipe means the operator is gone; reading ends too.
            let _ = write_frame(&mut *out, &reply, &[]);
        });
    }
    Ok(())
}
