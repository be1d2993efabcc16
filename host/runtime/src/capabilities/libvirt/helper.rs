//! The libvirt helper process (`proxyfleet-libvirt`), started the first
//! time a connection is opened and again after it exits; the operator
//! itself never loads libvirt's C client.
//!
//! Calls block until their answer arrives, so they run where the C client
//! ran before: on blocking threads. One reader thread hands each answer to
//! the call waiting for it; when the helper exits, every waiting call
//! fails `unavailable`, as does every later call on its objects.

use std::collections::HashMap;
use std::io::BufReader;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, mpsc};

use proxyfleet_libvirt_wire::{
    ErrorCode, FrameError, Handle, Op, Reply, Request, Value, WireError, read_frame, write_frame,
};

/// The helper's file name; it ships next to `proxyfleet`.
pub const HELPER_NAME: &str = "proxyfleet-libvirt";

/// Starts and restarts the libvirt helper for a whole runtime.
#[derive(Debug)]
pub struct LibvirtHelper {
    program: PathBuf,
    current: Mutex<Option<Arc<Process>>>,
}

impl LibvirtHelper {
    /// A helper run from `program`; nothing is started yet.
    pub fn new(program: PathBuf) -> Self {
        Self { program, current: Mutex::new(None) }
    }

    /// The helper next to the running executable.
    pub fn beside_current_exe() -> Self {
        let dir = std::env::current_exe()
            .ok()
            .and_then(|exe| exe.parent().map(Path::to_path_buf))
            .unwrap_or_default();
        Self::new(dir.join(HELPER_NAME))
    }

    /// The program it runs.
    pub fn program(&self) -> &Path {
        &self.program
    }

    /// The running helper's process id; `None` before the first
    /// connection, and once it has exited until the next one starts it.
    pub fn pid(&self) -> Option<u32> {
        let current = self.current.lock().unwrap_or_else(|p| p.into_inner());
        current.as_ref().filter(|p| !p.exited()).map(|p| p.pid)
    }

    /// The running helper, started if there is none. Blocks while it
    /// starts.
    pub(crate) fn process(&self) -> Result<Arc<Process>, WireError> {
        let mut current = self.current.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(process) = current.as_ref().filter(|p| !p.exited()) {
            return Ok(Arc::clone(process));
        }
        let process = Arc::new(Process::start(&self.program)?);
        *current = Some(Arc::clone(&process));
        Ok(process)
    }
}

/// Calls waiting for their answer, by id; `None` once the helper is gone.
type Waiting = Arc<Mutex<Option<HashMap<u64, mpsc::SyncSender<Result<Value, WireError>>>>>>;

/// One running helper.
#[derive(Debug)]
pub(crate) struct Process {
    pid: u32,
    child: Mutex<Child>,
    stdin: Mutex<ChildStdin>,
    waiting: Waiting,
    next: AtomicU64,
    /// Set when the operator stops it, so its end is not reported.
    stopping: Arc<AtomicBool>,
}

impl Process {
    fn start(program: &Path) -> Result<Self, WireError> {
        let mut child = Command::new(program)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|err| {
                unavailable(format!(
                    "cannot start the libvirt helper {}: {err}; it ships next to the \
                     proxyfleet binary",
                    program.display()
                ))
            })?;
        let (Some(stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
            let _ = child.kill();
            return Err(unavailable("the libvirt helper's pipes were not opened".into()));
        };
        let waiting: Waiting = Arc::new(Mutex::new(Some(HashMap::new())));
        let answers = Arc::clone(&waiting);
        let stopping = Arc::new(AtomicBool::new(false));
        let stopped = Arc::clone(&stopping);
        let pid = child.id();
        std::thread::Builder::new()
            .name("libvirt-helper".into())
            .spawn(move || {
                let mut stdout = BufReader::new(stdout);
                while let Ok(Some((reply, _))) = read_frame::<Reply>(&mut stdout) {
                    let waiter = answers
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .as_mut()
                        .and_then(|waiting| waiting.remove(&reply.id));
                    // A release's answer has nobody waiting for it.
                    if let Some(waiter) = waiter {
                        let _ = waiter.send(reply.outcome);
                    }
                }
                // Gone: every waiting call's sender drops with the map.
                answers.lock().unwrap_or_else(|p| p.into_inner()).take();
                if !stopped.load(Ordering::Acquire) {
                    tracing::warn!(
                        pid,
                        "the libvirt helper exited; its calls fail transient and the next \
                         connection starts it again"
                    );
                }
            })
            .map_err(|err| unavailable(format!("cannot read from the libvirt helper: {err}")))?;
        tracing::debug!(program = %program.display(), pid, "libvirt helper started");
        Ok(Self {
            pid,
            child: Mutex::new(child),
            stdin: Mutex::new(stdin),
            waiting,
            next: AtomicU64::new(1),
            stopping,
        })
    }

    fn exited(&self) -> bool {
        self.waiting.lock().unwrap_or_else(|p| p.into_inner()).is_none()
    }

    /// Makes one call and waits for its answer (on a blocking thread).
    pub(crate) fn call(&self, op: Op, payload: &[u8]) -> Result<Value, WireError> {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let (answer, answered) = mpsc::sync_channel(1);
        match self.waiting.lock().unwrap_or_else(|p| p.into_inner()).as_mut() {
            Some(waiting) => waiting.insert(id, answer),
            None => return Err(gone()),
        };
        self.send(id, op, payload)?;
        answered.recv().map_err(|_| gone())?
    }

    /// Lets go of `handle` without waiting for the answer.
    pub(crate) fn release(&self, handle: Handle) {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let _ = self.send(id, Op::Release { handle }, &[]);
    }

    fn send(&self, id: u64, op: Op, payload: &[u8]) -> Result<(), WireError> {
        let mut stdin = self.stdin.lock().unwrap_or_else(|p| p.into_inner());
        write_frame(&mut *stdin, &Request { id, op }, payload).map_err(|err| {
            let mut waiting = self.waiting.lock().unwrap_or_else(|p| p.into_inner());
            if let FrameError::Io(_) = err {
                // A pipe that broke will not mend: this helper is done,
                // and the next call starts another.
                waiting.take();
            } else if let Some(waiting) = waiting.as_mut() {
                waiting.remove(&id);
            }
            unavailable(format!("the libvirt helper did not take the call: {err}"))
        })
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        // Its stdin closes with it, which ends it; this makes sure.
        self.stopping.store(true, Ordering::Release);
        let child = self.child.get_mut().unwrap_or_else(|p| p.into_inner());
        let _ = child.kill();
        let _ = child.wait();
    }
}

fn unavailable(message: String) -> WireError {
    WireError { code: ErrorCode::Unavailable, message }
}

fn gone() -> WireError {
    unavailable("the libvirt helper exited during the call".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_helper_is_unavailable_and_named_with_where_it_ships() {
        let helper = LibvirtHelper::new("/nonexistent/proxyfleet-libvirt".into());
        let err = helper.process().unwrap_err();
        assert_eq!(err.code, ErrorCode::Unavailable);
        assert!(err.message.contains("/nonexistent/proxyfleet-libvirt"), "{err}");
        assert!(err.message.contains("next to the proxyfleet binary"), "{err}");
    }

    #[test]
    fn calls_to_a_helper_that_exited_fail_unavailable_and_the_next_start_is_fresh() {
        // `true` reads nothing and exits: the call finds it gone either
        // while writing or while waiting.
        let helper = LibvirtHelper::new("/bin/true".into());
        let first = helper.process().unwrap();
        let err = first.call(Op::Open { uri: "test:///default".into() }, &[]).unwrap_err();
        assert_eq!(err.code, ErrorCode::Unavailable, "{err}");
        // Once its exit is seen, the next call starts another one.
        while !first.exited() {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        let second = helper.process().unwrap();
        assert!(!Arc::ptr_eq(&first, &second));
    }
}
