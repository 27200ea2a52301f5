//! Running one benchmark program as a child process.
//!
//! The child gets the contender's library in `LD_PRELOAD` (and nothing
//! inherited there); its peak resident set size comes from `ru_maxrss` of
//! `wait4`, which Linux reports in KiB.  A child that runs past its time limit
//! is killed.  The child is first waited for with `waitid(WNOWAIT)`, which
//! leaves it a zombie, so the watchdog can never kill a recycled pid; `wait4`
//! then reaps it and collects its resource usage.

use std::ffi::OsString;
use std::io::Read;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use serde::Serialize;

use crate::anchors::Contender;

/// What to run.
#[derive(Debug, Clone)]
pub struct Invocation {
    /// The program.
    pub program: PathBuf,
    /// Its arguments.
    pub args: Vec<String>,
    /// Library to preload; `None` runs on glibc's allocator.
    pub preload: Option<PathBuf>,
    /// Run the program under this command (e.g. valgrind and its options).
    pub wrapper: Vec<OsString>,
    /// Extra environment variables.
    pub env: Vec<(String, String)>,
    /// Kill the child after this long.
    pub timeout: Duration,
}

impl Invocation {
    /// `program args...` on `contender`.
    pub fn new(
        program: PathBuf,
        args: Vec<String>,
        contender: &Contender,
        timeout: Duration,
    ) -> Self {
        Invocation {
            program,
            args,
            preload: contender.preload.clone(),
            wrapper: Vec::new(),
            env: Vec::new(),
            timeout,
        }
    }

    /// The command line as a shell would show it, for error messages and the JSON.
    pub fn display(&self) -> String {
        let mut parts = Vec::new();
        if let Some(p) = &self.preload {
            parts.push(format!("LD_PRELOAD={}", p.display()));
        }
        for (k, v) in &self.env {
            parts.push(format!("{k}={v}"));
        }
        parts.extend(
            self.wrapper
                .iter()
                .map(|w| w.to_string_lossy().into_owned()),
        );
        parts.push(self.program.display().to_string());
        parts.extend(self.args.iter().cloned());
        parts.join(" ")
    }
}

/// How the child ended.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Exit {
    /// Normal exit with this code.
    Code {
        /// The exit code.
        code: i32,
    },
    /// Killed by this signal.
    Signal {
        /// The signal number.
        signal: i32,
    },
    /// Killed by the harness after its time limit.
    Timeout {
        /// The limit in seconds.
        after_seconds: u64,
    },
}

impl std::fmt::Display for Exit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Exit::Code { code } => write!(f, "exit code {code}"),
            Exit::Signal { signal } => {
                write!(f, "killed by signal {signal} ({})", signal_name(*signal))
            }
            Exit::Timeout { after_seconds } => {
                write!(f, "killed after the {after_seconds} s time limit")
            }
        }
    }
}

fn signal_name(sig: i32) -> &'static str {
    match sig {
        libc::SIGSEGV => "SIGSEGV",
        libc::SIGABRT => "SIGABRT",
        libc::SIGBUS => "SIGBUS",
        libc::SIGKILL => "SIGKILL",
        libc::SIGILL => "SIGILL",
        libc::SIGFPE => "SIGFPE",
        libc::SIGTERM => "SIGTERM",
        _ => "signal",
    }
}

/// What a finished child left.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// How it ended.
    pub exit: Exit,
    /// Its standard output.
    pub stdout: String,
    /// Its standard error.
    pub stderr: String,
    /// Peak resident set size in KiB (`ru_maxrss`).
    pub max_rss_kib: u64,
    /// Wall-clock time from spawn to exit, seconds.
    pub wall_seconds: f64,
    /// CPU time in user mode, seconds.
    pub user_seconds: f64,
    /// CPU time in kernel mode, seconds.
    pub sys_seconds: f64,
}

impl Outcome {
    /// Did it exit with code 0?
    pub fn success(&self) -> bool {
        self.exit == Exit::Code { code: 0 }
    }

    /// The last lines of standard error, for error messages.
    pub fn stderr_tail(&self, lines: usize) -> String {
        let v: Vec<&str> = self.stderr.lines().collect();
        v[v.len().saturating_sub(lines)..].join("\n")
    }
}

fn tv_seconds(tv: libc::timeval) -> f64 {
    tv.tv_sec as f64 + tv.tv_usec as f64 * 1e-6
}

/// Run the invocation to completion.  An `Err` means the child could not be
/// started; a crash or a timeout is an `Ok` with the matching [`Exit`].
pub fn run(inv: &Invocation) -> Result<Outcome> {
    let mut cmd = match inv.wrapper.split_first() {
        Some((first, rest)) => {
            let mut c = Command::new(first);
            c.args(rest).arg(&inv.program);
            c
        }
        None => Command::new(&inv.program),
    };
    cmd.args(&inv.args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    cmd.env_remove("LD_PRELOAD");
    if let Some(p) = &inv.preload {
        cmd.env("LD_PRELOAD", p);
    }
    for (k, v) in &inv.env {
        cmd.env(k, v);
    }
    let start = Instant::now();
    let mut child = cmd
        .spawn()
        .with_context(|| format!("could not start {}", inv.display()))?;
    let pid = child.id() as libc::pid_t;

    let mut out_pipe = child.stdout.take().expect("stdout is piped");
    let mut err_pipe = child.stderr.take().expect("stderr is piped");
    let out_thread = std::thread::spawn(move || {
        let mut s = Vec::new();
        let _ = out_pipe.read_to_end(&mut s);
        String::from_utf8_lossy(&s).into_owned()
    });
    let err_thread = std::thread::spawn(move || {
        let mut s = Vec::new();
        let _ = err_pipe.read_to_end(&mut s);
        String::from_utf8_lossy(&s).into_owned()
    });

    // The watchdog kills the child if it is still running at the deadline.
    // `state` is (exited, killed): the child is only killed while not yet
    // reported exited, and it is not reaped before `exited` is set, so its
    // pid cannot have been reused when the watchdog sends the signal.
    let state = Arc::new((Mutex::new((false, false)), Condvar::new()));
    let watchdog = {
        let state = Arc::clone(&state);
        let timeout = inv.timeout;
        std::thread::spawn(move || {
            let (lock, cv) = &*state;
            let mut st = lock.lock().unwrap_or_else(|e| e.into_inner());
            let deadline = Instant::now() + timeout;
            while !st.0 {
                let now = Instant::now();
                if now >= deadline {
                    // SAFETY: pid is our child, not yet reaped (see above).
                    unsafe { libc::kill(pid, libc::SIGKILL) };
                    st.1 = true;
                    break;
                }
                st = cv
                    .wait_timeout(st, deadline - now)
                    .unwrap_or_else(|e| e.into_inner())
                    .0;
            }
        })
    };

    // Wait for the exit without reaping.
    loop {
        // SAFETY: siginfo_t is plain data; waitid writes it.
        let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
        // SAFETY: pid is our child; WNOWAIT leaves it waitable.
        let r = unsafe {
            libc::waitid(
                libc::P_PID,
                pid as libc::id_t,
                &mut info,
                libc::WEXITED | libc::WNOWAIT,
            )
        };
        if r == 0 {
            break;
        }
        let err = std::io::Error::last_os_error();
        if err.kind() != std::io::ErrorKind::Interrupted {
            return Err(err).context("waitid on the benchmark child");
        }
    }
    let killed = {
        let (lock, cv) = &*state;
        let mut st = lock.lock().unwrap_or_else(|e| e.into_inner());
        st.0 = true;
        cv.notify_all();
        st.1
    };
    let _ = watchdog.join();

    // Reap it and collect its resource usage.
    let mut status: libc::c_int = 0;
    // SAFETY: rusage is plain data; wait4 writes it.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    loop {
        // SAFETY: pid is our exited child, reaped exactly once here.
        let r = unsafe { libc::wait4(pid, &mut status, 0, &mut usage) };
        if r == pid {
            break;
        }
        let err = std::io::Error::last_os_error();
        if err.kind() != std::io::ErrorKind::Interrupted {
            return Err(err).context("wait4 on the benchmark child");
        }
    }
    let wall_seconds = start.elapsed().as_secs_f64();
    // `child` has been reaped by wait4; dropping it does not wait again.
    drop(child);
    let stdout = out_thread.join().unwrap_or_default();
    let stderr = err_thread.join().unwrap_or_default();

    let exit = if killed {
        Exit::Timeout {
            after_seconds: inv.timeout.as_secs(),
        }
    } else if libc::WIFEXITED(status) {
        Exit::Code {
            code: libc::WEXITSTATUS(status),
        }
    } else if libc::WIFSIGNALED(status) {
        Exit::Signal {
            signal: libc::WTERMSIG(status),
        }
    } else {
        Exit::Code { code: -1 }
    };
    Ok(Outcome {
        exit,
        stdout,
        stderr,
        max_rss_kib: usage.ru_maxrss.max(0) as u64,
        wall_seconds,
        user_seconds: tv_seconds(usage.ru_utime),
        sys_seconds: tv_seconds(usage.ru_stime),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sh(script: &str, timeout: Duration) -> Outcome {
        let inv = Invocation {
            program: PathBuf::from("/bin/sh"),
            args: vec!["-c".into(), script.into()],
            preload: None,
            wrapper: Vec::new(),
            env: vec![("CANOPY_TEST_VAR".into(), "7".into())],
            timeout,
        };
        run(&inv).unwrap()
    }

    #[test]
    fn captures_output_and_status() {
        let o = sh(
            "echo checksum=$CANOPY_TEST_VAR; echo oops >&2; exit 3",
            Duration::from_secs(30),
        );
        assert_eq!(o.exit, Exit::Code { code: 3 });
        assert_eq!(o.stdout.trim(), "checksum=7");
        assert_eq!(o.stderr_tail(1), "oops");
        assert!(o.max_rss_kib > 0);
        assert!(!o.success());
    }

    #[test]
    fn reports_signals() {
        let o = sh("kill -SEGV $$", Duration::from_secs(30));
        assert_eq!(
            o.exit,
            Exit::Signal {
                signal: libc::SIGSEGV
            }
        );
        assert!(o.exit.to_string().contains("SIGSEGV"));
    }

    #[test]
    fn kills_after_timeout() {
        let o = sh("exec sleep 30", Duration::from_millis(200));
        assert_eq!(o.exit, Exit::Timeout { after_seconds: 0 });
    }

    #[test]
    fn display_shows_preload() {
        let inv = Invocation {
            program: PathBuf::from("/x/sac"),
            args: vec!["malloc".into(), "25".into()],
            preload: Some(PathBuf::from("/l/libjemalloc.so.2")),
            wrapper: vec!["valgrind".into()],
            env: Vec::new(),
            timeout: Duration::from_secs(1),
        };
        assert_eq!(
            inv.display(),
            "LD_PRELOAD=/l/libjemalloc.so.2 valgrind /x/sac malloc 25"
        );
    }
}
