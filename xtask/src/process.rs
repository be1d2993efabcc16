//! Running commands and steps, and saying how long they took.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};

/// Runs one named step, announcing it and naming it in its failure.
pub fn step(name: &str, run: impl FnOnce() -> Result<()>) -> Result<()> {
    let started = Instant::now();
    eprintln!("xtask: ==> {name}");
    run().with_context(|| format!("step `{name}` failed"))?;
    eprintln!("xtask: <== {name} ({})", elapsed(started));
    Ok(())
}

/// Runs `command` with inherited output, failing on a non-zero exit.
pub fn run(command: &mut Command) -> Result<()> {
    let shown = show(command);
    eprintln!("xtask: $ {shown}");
    let status = command.status().with_context(|| format!("cannot start `{shown}`"))?;
    ensure!(status.success(), "`{shown}` failed ({status})");
    Ok(())
}

/// Runs `command` quietly and returns its stdout.
pub fn output(command: &mut Command) -> Result<String> {
    let shown = show(command);
    let output = command
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
        .with_context(|| format!("cannot start `{shown}`"))?;
    ensure!(output.status.success(), "`{shown}` failed ({})", output.status);
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

/// The first line `program args…` prints on stdout, or `None` when it
/// cannot be run or fails: how a tool's version is read.
pub fn first_line(program: impl AsRef<std::ffi::OsStr>, args: &[&str]) -> Option<String> {
    let mut command = Command::new(program);
    command.args(args);
    output(&mut command).ok()?.lines().next().map(|line| line.trim().to_owned())
}

pub fn show(command: &Command) -> String {
    let mut shown = command.get_program().to_string_lossy().into_owned();
    for arg in command.get_args() {
        shown.push(' ');
        shown.push_str(&arg.to_string_lossy());
    }
    shown
}

pub fn elapsed(started: Instant) -> String {
    format_duration(started.elapsed())
}

/// `12.3s` below a minute, `5m07s` from there.
pub fn format_duration(duration: Duration) -> String {
    let seconds = duration.as_secs();
    if seconds >= 60 {
        format!("{}m{:02}s", seconds / 60, seconds % 60)
    } else {
        format!("{:.1}s", duration.as_secs_f64())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_durations() {
        assert_eq!(format_duration(Duration::from_millis(12_340)), "12.3s");
        assert_eq!(format_duration(Duration::from_secs(307)), "5m07s");
    }
}
