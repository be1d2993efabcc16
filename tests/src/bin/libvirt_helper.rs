//! The libvirt helper as the libvirt tier's tests start it (the operator
//! ships the same as `proxyfleet-libvirt`); a binary of this package so
//! that building the tests builds it.

use std::process::ExitCode;

fn main() -> ExitCode {
    match proxyfleet_libvirt_helper::serve(std::io::stdin().lock(), std::io::stdout()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("libvirt-helper: {err}");
            ExitCode::FAILURE
        }
    }
}
