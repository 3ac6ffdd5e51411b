//! Requests to a job that `sluice run` is running, from other processes: the run listens
//! on a Unix socket in the job's checkpoint folder (`_control.sock`), and
//! `sluice savepoint JOB` asks it there for a savepoint without stopping.
//!
//! The protocol is one line each way: `savepoint` in, `ok PATH` or `error MESSAGE` out.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;
use std::time::Duration;

use anyhow::{Context, Result, anyhow, bail};
use crossbeam_channel::{Sender, unbounded};

use super::exit::{Exit, bad_input, mark};
use crate::job::{JobControl, load_graph};

const SOCKET: &str = "_control.sock";
/// How long a savepoint may take before the requester gives up waiting.
const SAVEPOINT_TIMEOUT: Duration = Duration::from_secs(600);

/// Listens while it lives; dropping it stops listening and removes the socket.
pub(crate) struct Listener {
    path: PathBuf,
    stop: Arc<AtomicBool>,
}

impl Drop for Listener {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wake the accepting thread so that it sees `stop`.
        let _ = UnixStream::connect(&self.path);
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Starts taking requests for the job whose checkpoints are in `dir`. Without a socket
/// (another process already listens there, or the path is too long) the job runs all
/// the same, and the reason is logged.
pub(crate) fn listen(dir: &Path, control: Sender<JobControl>) -> Option<Listener> {
    let path = dir.join(SOCKET);
    if UnixStream::connect(&path).is_ok() {
        tracing::warn!(
            "another sluice process is running the job whose checkpoints are in {}; \
             `sluice savepoint` will reach that one",
            dir.display()
        );
        return None;
    }
    let _ = std::fs::remove_file(&path);
    let listener = match std::fs::create_dir_all(dir).and_then(|()| UnixListener::bind(&path)) {
        Ok(l) => l,
        Err(e) => {
            tracing::warn!(
                "`sluice savepoint` cannot reach this job: {}: {e}",
                path.display()
            );
            return None;
        }
    };
    let stop = Arc::new(AtomicBool::new(false));
    let stopped = stop.clone();
    let spawned = thread::Builder::new()
        .name("control".into())
        .spawn(move || {
            for stream in listener.incoming() {
                if stopped.load(Ordering::SeqCst) {
                    break;
                }
                if let Ok(stream) = stream
                    && let Err(e) = answer(stream, &control)
                {
                    tracing::warn!("control request: {e:#}");
                }
            }
        });
    if let Err(e) = spawned {
        tracing::warn!("`sluice savepoint` cannot reach this job: {e}");
        return None;
    }
    Some(Listener { path, stop })
}

fn answer(stream: UnixStream, control: &Sender<JobControl>) -> Result<()> {
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    let mut line = String::new();
    BufReader::new(&stream).take_line(&mut line)?;
    let reply = match line.trim() {
        "savepoint" => {
            let (reply, answer) = unbounded();
            control
                .send(JobControl::Savepoint { reply })
                .map_err(|_| anyhow!("the job has ended"))?;
            match answer.recv_timeout(SAVEPOINT_TIMEOUT) {
                Ok(Ok(path)) => format!("ok {}\n", path.display()),
                Ok(Err(e)) => format!("error {}\n", e.replace('\n', " ")),
                Err(_) => "error the job ended before its savepoint completed\n".into(),
            }
        }
        other => format!("error unknown request {other:?}\n"),
    };
    (&stream).write_all(reply.as_bytes())?;
    Ok(())
}

/// Reads one line of at most 4 KiB.
trait TakeLine {
    fn take_line(self, line: &mut String) -> std::io::Result<usize>;
}

impl<R: BufRead> TakeLine for R {
    fn take_line(self, line: &mut String) -> std::io::Result<usize> {
        std::io::Read::take(self, 4096).read_line(line)
    }
}

/// `sluice savepoint JOB`: asks the running job for a savepoint and returns its folder.
pub(super) fn request_savepoint(job: &Path) -> Result<PathBuf> {
    let dir = if job.is_dir() {
        job.to_path_buf()
    } else {
        let graph = load_graph(job).map_err(bad_input)?;
        graph.checkpoint.map(|c| c.dir).ok_or_else(|| {
            anyhow!(
                "{}: the job does not checkpoint, so it takes no savepoints",
                job.display()
            )
        })?
    };
    let path = dir.join(SOCKET);
    let mut stream = UnixStream::connect(&path)
        .with_context(|| {
            format!(
                "no running job answers at {} (is `sluice run` running it?)",
                path.display()
            )
        })
        .map_err(|e| mark(Exit::Unavailable, e))?;
    stream.set_read_timeout(Some(SAVEPOINT_TIMEOUT))?;
    stream.write_all(b"savepoint\n")?;
    let mut line = String::new();
    BufReader::new(&stream).take_line(&mut line)?;
    match line.trim_end().split_once(' ') {
        Some(("ok", path)) => Ok(PathBuf::from(path)),
        Some(("error", message)) => bail!("the savepoint failed: {message}"),
        _ => bail!("the running job gave no answer to the savepoint request"),
    }
}
