//! One named shell: a `docker exec` of bash (else sh) in a PTY with an attached stream.
//! Nothing is installed in the image: the shell's own prompt carries an invisible sentinel
//! (see [`super::term`]), so `feed_chars` returns the moment the shell is back at it.

use parking_lot::Mutex;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bollard::container::LogOutput;
use bollard::exec::{CreateExecOptions, StartExecResults};
use bollard::query_parameters::ResizeExecOptions;
use bollard::Docker;
use futures_util::StreamExt;
use tokio::io::{AsyncWrite, AsyncWriteExt};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::term::{self, Decoder, PromptKind};
use super::{Result, SandboxError};

/// Variables every shell reads as it starts (`set -a`), when the file is there: kodx
/// writes it after the setup script (the egress proxy's, [`crate::EgressSpec`]).
pub const ENV_PATH: &str = "/tmp/.kodx/env";

/// Where kodx's bash rc file lives in the container (written at container start).
pub const BASHRC_PATH: &str = "/tmp/.kodx/bashrc";

/// The rc file bash reads: the user's own ~/.bashrc first (a setup script may have put a
/// virtualenv or PATH there), then kodx's prompts. Kept tiny: it runs for every new shell.
pub const BASHRC: &str = r#"[ -f ~/.bashrc ] && . ~/.bashrc
PS1=$KODX_PS1; PS2=$KODX_PS2
unset PROMPT_COMMAND KODX_PS1 KODX_PS2
HISTCONTROL=${HISTCONTROL:+$HISTCONTROL:}ignorespace
bind 'set enable-bracketed-paste off' 2>/dev/null
"#;

/// Output quiet time after which a shell at its prompt is taken as done even when fewer
/// prompts came back than lines were typed (a line was read by a command, e.g. `read`).
const SETTLE_AT_PROMPT: Duration = Duration::from_millis(50);
/// Output quiet time after which a line that looks like an interactive prompt
/// (`>>> `, `Password: `, `[Y/n] `) is taken as a program waiting for input.
const SETTLE_AT_OTHER_PROMPT: Duration = Duration::from_millis(200);
/// Output quiet time after which a typed line counts as taken by a running command when
/// no prompt came back, so the next line can be typed.
const LINE_TAKEN_QUIET: Duration = Duration::from_millis(30);
/// Typing always gets at least this long, even with a yield time of zero.
const MIN_TYPING: Duration = Duration::from_millis(200);
/// How long a new shell may take to print its first prompt.
const SHELL_START_TIMEOUT: Duration = Duration::from_secs(20);

/// How a `feed_chars` call ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ShellStatus {
    /// Back at the shell prompt; `exit_code` of the last command when the shell told it.
    Ready { exit_code: Option<i32> },
    /// A program (a REPL, a question) is waiting for input at its own prompt.
    WaitingForInput,
    /// Still running at the yield time; the command was not stopped.
    StillRunning,
    /// The shell itself ended.
    Exited { exit_code: Option<i64> },
}

/// What one `feed_chars` call returns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FeedOutput {
    pub shell: String,
    /// Cleaned, capped output (escape codes stripped, middle cut noted).
    pub output: String,
    pub status: ShellStatus,
    /// Bytes of output left out by the cap.
    pub omitted_bytes: usize,
    /// Bytes of the input that could not be typed by the yield time (at most one line's
    /// worth may have been typed in part): the program was not reading its terminal.
    pub untyped_bytes: usize,
    pub elapsed: Duration,
}

impl FeedOutput {
    /// The text the model sees as the tool result.
    pub fn render(&self) -> String {
        let mut out = self.output.clone();
        if !out.is_empty() && !out.ends_with('\n') {
            out.push('\n');
        }
        let note = match self.status {
            ShellStatus::Ready {
                exit_code: Some(code),
            } => format!("[exit status: {code}]"),
            ShellStatus::Ready { exit_code: None } => "[back at the shell prompt]".to_string(),
            ShellStatus::WaitingForInput => {
                "[waiting for input: the program is at its own prompt]".to_string()
            }
            ShellStatus::StillRunning => format!(
                "[still running after {:.1}s; the command was not stopped. Call feed_chars with \
                 empty chars to read more, or \"\\x03\" to interrupt it]",
                self.elapsed.as_secs_f64()
            ),
            ShellStatus::Exited { exit_code } => format!(
                "[shell {:?} exited{}; call create_new_shell to start a new one]",
                self.shell,
                exit_code
                    .map(|c| format!(" with status {c}"))
                    .unwrap_or_default()
            ),
        };
        out.push_str(&note);
        if self.untyped_bytes > 0 {
            out.push_str(&format!(
                "\n[{} bytes of the input were not typed: the program is not reading its terminal]",
                term::group_thousands(self.untyped_bytes)
            ));
        }
        out
    }
}

struct State {
    decoder: Decoder,
    closed: bool,
    last_output: Instant,
}

pub(crate) struct Shell {
    pub name: String,
    exec_id: String,
    docker: Docker,
    input: tokio::sync::Mutex<Pin<Box<dyn AsyncWrite + Send>>>,
    state: Arc<Mutex<State>>,
    changed: watch::Receiver<u64>,
    reader: JoinHandle<()>,
    output_cap: usize,
}

impl Drop for Shell {
    fn drop(&mut self) {
        self.reader.abort();
    }
}

/// The line that gives a started shell its prompts with marker `nonce`: unset first, so
/// the new values are not exported (the started ones were, from the environment); bash's
/// form marks the escape as non-printing for readline, sh's is raw. The escape's bytes are
/// made by `printf`, never typed (readline would take a typed ESC as a key).
fn rekey_line(nonce: &str) -> String {
    format!(
        " unset PS1 PS2; K=$(printf '\\033]{id};kodx;{nonce};'); B=$(printf '\\007'); \
         if [ -n \"$BASH_VERSION\" ]; then PS1=\"\\[$K\"'$?;$$'\"$B\\]\"'$ '; PS2=\"\\[${{K}}c$B\\]> \"; \
         else PS1=\"$K\"'$?;$$'\"$B\"'$ '; PS2=\"${{K}}c$B> \"; fi; unset K B\n",
        id = term::OSC_ID
    )
}

/// True when a line looks like an interactive program's prompt waiting for input.
fn looks_like_prompt(line: &str) -> bool {
    const ENDINGS: [&str; 9] = ["$ ", "# ", "> ", ": ", "? ", "] ", ") ", "... ", ">>> "];
    line.len() <= 200 && ENDINGS.iter().any(|e| line.ends_with(e))
}

/// A shell's engine exec started ahead of its use ([`Shell::spawn`]), not at its prompt
/// yet: [`Spawned::open`] makes it the named shell.
pub(crate) struct Spawned {
    docker: Docker,
    exec_id: String,
    input: Pin<Box<dyn AsyncWrite + Send>>,
    state: Arc<Mutex<State>>,
    changed: watch::Receiver<u64>,
    reader: Option<JoinHandle<()>>,
    output_cap: usize,
    /// Started as kodx's helper waiting for the line that runs the shell (`kodx-net gate`).
    gated: bool,
}

impl Drop for Spawned {
    fn drop(&mut self) {
        if let Some(reader) = self.reader.take() {
            reader.abort();
        }
    }
}

/// The script that runs the shell: bash with kodx's rc file, else sh; `hang_up` first.
fn shell_script(hang_up: Option<u32>, workdir: Option<&str>) -> String {
    let hang_up = hang_up
        .map(|pid| format!("kill -HUP {pid} 2>/dev/null; kill -CONT {pid} 2>/dev/null; "))
        .unwrap_or_default();
    // A shell started ahead moves to the working directory when it opens: the directory
    // the exec started in may have been replaced since.
    let cd = workdir
        .map(|w| format!("cd '{}' 2>/dev/null; ", w.replace('\'', r"'\''")))
        .unwrap_or_default();
    format!(
        "{hang_up}{cd}if [ -r {ENV_PATH} ]; then set -a; . {ENV_PATH}; set +a; fi; if command -v bash >/dev/null 2>&1; then exec bash --noprofile --rcfile {BASHRC_PATH} -i; else exec sh -i; fi"
    )
}

impl Shell {
    /// Starts a shell in `workdir` and waits for its first prompt. `hang_up`: the pid of a
    /// shell this one replaces; it and its jobs are hung up first, as closing its terminal
    /// would, in the same exec (no extra round trip to the engine).
    pub async fn start(
        docker: &Docker,
        container: &str,
        name: &str,
        workdir: &str,
        output_cap: usize,
        hang_up: Option<u32>,
    ) -> Result<Arc<Shell>> {
        let script = shell_script(hang_up, None);
        let command = vec!["/bin/sh".to_string(), "-c".to_string(), script];
        Self::spawn(docker, container, workdir, output_cap, command, false)
            .await?
            .open(name, workdir, None)
            .await
    }

    /// Starts a shell's engine exec in `workdir` running `command`: the shell script
    /// itself, or (`gated`) kodx's helper waiting for the line that runs it, typed by
    /// [`Spawned::open`]. The engine's part of a new shell (most of its time) is done here,
    /// ahead; nothing of the image runs in a gated one before it opens.
    pub async fn spawn(
        docker: &Docker,
        container: &str,
        workdir: &str,
        output_cap: usize,
        command: Vec<String>,
        gated: bool,
    ) -> Result<Spawned> {
        let nonce = format!("{:016x}", rand::random::<u64>());
        let osc = |status: &str| format!("\x1b]{};kodx;{nonce};{status}\x07", term::OSC_ID);
        // Raw form for sh (and bash without its rc file); bash's form marks the escape as
        // non-printing so readline measures the prompt right.
        let ps1 = format!("{}$ ", osc("$?;$$"));
        let ps2 = format!("{}> ", osc("c"));
        let env = vec![
            "TERM=dumb".to_string(),
            "PAGER=cat".to_string(),
            "GIT_PAGER=cat".to_string(),
            "SYSTEMD_PAGER=".to_string(),
            "DEBIAN_FRONTEND=noninteractive".to_string(),
            format!("PS1={ps1}"),
            format!("PS2={ps2}"),
            format!("KODX_PS1=\\[{}\\]$ ", osc("$?;$$")),
            format!("KODX_PS2=\\[{}\\]> ", osc("c")),
        ];
        let exec = docker
            .create_exec(
                container,
                CreateExecOptions {
                    cmd: Some(command),
                    env: Some(env),
                    working_dir: Some(workdir.to_string()),
                    attach_stdin: Some(true),
                    attach_stdout: Some(true),
                    attach_stderr: Some(true),
                    tty: Some(true),
                    ..Default::default()
                },
            )
            .await
            .map_err(|e| SandboxError::docker("creating a shell", e))?;
        let started = docker
            .start_exec(&exec.id, None)
            .await
            .map_err(|e| SandboxError::docker("starting a shell", e))?;
        let StartExecResults::Attached { mut output, input } = started else {
            return Err(SandboxError::InvalidInput(
                "a shell started detached".to_string(),
            ));
        };
        // A wide terminal keeps readline from scrolling long command lines sideways.
        let _ = docker
            .resize_exec(
                &exec.id,
                ResizeExecOptions {
                    w: i32::from(term::COLUMNS),
                    h: 50,
                },
            )
            .await;

        let keep = output_cap.max(1024) * 2;
        let state = Arc::new(Mutex::new(State {
            decoder: Decoder::new(&nonce, keep),
            closed: false,
            last_output: Instant::now(),
        }));
        let (tx, changed) = watch::channel(0u64);
        let reader_state = state.clone();
        let reader = tokio::spawn(async move {
            while let Some(item) = output.next().await {
                let bytes = match item {
                    Ok(LogOutput::Console { message })
                    | Ok(LogOutput::StdOut { message })
                    | Ok(LogOutput::StdErr { message }) => message,
                    Ok(LogOutput::StdIn { .. }) => continue,
                    Err(_) => break,
                };
                {
                    let mut st = reader_state.lock();
                    tracing::trace!(raw = ?String::from_utf8_lossy(&bytes), "pty output");
                    st.decoder.feed(&bytes);
                    st.last_output = Instant::now();
                }
                tx.send_modify(|v| *v += 1);
            }
            reader_state.lock().closed = true;
            tx.send_modify(|v| *v += 1);
        });
        Ok(Spawned {
            docker: docker.clone(),
            exec_id: exec.id,
            input,
            state,
            changed,
            reader: Some(reader),
            output_cap,
            gated,
        })
    }
}

impl Spawned {
    /// The output cap its shell was started for.
    pub fn output_cap(&self) -> usize {
        self.output_cap
    }

    /// Makes this the shell `name`: a gated one is told to run the shell (in `workdir`,
    /// hanging up `hang_up` first); then its first prompt is awaited and its marker moved.
    pub async fn open(
        mut self,
        name: &str,
        workdir: &str,
        hang_up: Option<u32>,
    ) -> Result<Arc<Shell>> {
        if self.gated {
            let line = format!("{}\n", shell_script(hang_up, Some(workdir)));
            let typed = async {
                self.input.write_all(line.as_bytes()).await?;
                self.input.flush().await
            };
            tokio::time::timeout(SHELL_START_TIMEOUT, typed)
                .await
                .unwrap_or_else(|_| Err(std::io::ErrorKind::TimedOut.into()))
                .map_err(|e| SandboxError::io(format!("opening shell {name:?}"), e))?;
        }
        let (input, reader) = {
            // Moved out of `self`: it has a Drop (which aborts the reader when it is not).
            let empty: Pin<Box<dyn AsyncWrite + Send>> = Box::pin(tokio::io::sink());
            (
                std::mem::replace(&mut self.input, empty),
                self.reader
                    .take()
                    .expect("the reader is there until opened"),
            )
        };
        let shell = Arc::new(Shell {
            name: name.to_string(),
            exec_id: std::mem::take(&mut self.exec_id),
            docker: self.docker.clone(),
            input: tokio::sync::Mutex::new(input),
            state: self.state.clone(),
            changed: self.changed.clone(),
            reader,
            output_cap: self.output_cap,
        });
        let first = shell.wait(0, false, SHELL_START_TIMEOUT).await;
        match first {
            ShellStatus::Ready { .. } => {
                shell.state.lock().decoder.take();
                shell.rekey().await?;
                Ok(shell)
            }
            other => {
                let (pending, _) = shell.state.lock().decoder.take();
                Err(SandboxError::InvalidInput(format!(
                    "shell {name:?} did not reach its prompt ({other:?}); it printed: {}",
                    term::cap_middle(&pending.text, pending.omitted, pending.cut_at, 2000).0
                )))
            }
        }
    }
}

impl Shell {
    /// Moves the shell's prompt to a marker that enters neither a file nor an environment
    /// in the container. The marker it started with came in its environment (`PS1`), so
    /// it is in `/proc/<pid>/environ` and in every command's environment, where anything
    /// could read it and print a fake prompt: that one is dropped once the shell is up.
    /// The new one is typed, held in the shell's own unexported variables only (its echo
    /// is taken, never shown; the leading space keeps it out of the history).
    async fn rekey(&self) -> Result<()> {
        let nonce = format!("{:016x}", rand::random::<u64>());
        {
            let mut st = self.state.lock();
            st.decoder.set_nonce(&nonce);
            st.last_output = Instant::now();
        }
        let typed = async {
            let mut input = self.input.lock().await;
            input.write_all(rekey_line(&nonce).as_bytes()).await?;
            input.flush().await
        };
        tokio::time::timeout(SHELL_START_TIMEOUT, typed)
            .await
            .unwrap_or_else(|_| Err(std::io::ErrorKind::TimedOut.into()))
            .map_err(|e| SandboxError::io(format!("typing into shell {:?}", self.name), e))?;
        match self.wait(1, false, SHELL_START_TIMEOUT).await {
            ShellStatus::Ready { .. } => {
                self.state.lock().decoder.take();
                Ok(())
            }
            other => {
                let (pending, _) = self.state.lock().decoder.take();
                Err(SandboxError::InvalidInput(format!(
                    "shell {:?} did not take its prompt ({other:?}); it printed: {}",
                    self.name,
                    term::cap_middle(&pending.text, pending.omitted, pending.cut_at, 2000).0
                )))
            }
        }
    }

    /// The shell's pid inside the container, once known.
    pub fn pid(&self) -> Option<u32> {
        self.state.lock().decoder.shell_pid()
    }

    /// Types `chars` and returns what the shell printed since the last read (SPEC §6).
    pub async fn feed(&self, chars: &str, yield_time: Duration) -> Result<FeedOutput> {
        let started = Instant::now();
        let keys = term::keystrokes(chars);
        // One writer at a time: a second call waits for the first to return.
        let mut input = self.input.lock().await;
        let prompts_before = self.state.lock().decoder.prompts();
        let deadline = tokio::time::Instant::now() + yield_time;
        // Line by line: the next line is typed once the shell (or the program it runs) has
        // taken this one. Typed all at once, lines meant for a program that reads the
        // terminal (`read`, `input()`) are swallowed by readline's typeahead handling.
        let mut lines = keys.bytes.split_inclusive(|&b| b == b'\n').peekable();
        let mut untyped = 0;
        while let Some(line) = lines.next() {
            if self.state.lock().closed {
                break;
            }
            let typed = {
                let mut st = self.state.lock();
                // Typing counts as activity: quiet time is measured from here.
                st.last_output = Instant::now();
                st.decoder.prompts()
            };
            let rest_at_once = tokio::time::Instant::now() >= deadline;
            let bytes: Vec<u8> = if rest_at_once {
                line.iter()
                    .chain(lines.by_ref().flatten())
                    .copied()
                    .collect()
            } else {
                line.to_vec()
            };
            let write = async {
                input.write_all(&bytes).await?;
                input.flush().await
            };
            // A program that stops reading its terminal fills the PTY: typing must not
            // block past the yield time.
            match tokio::time::timeout_at(
                deadline.max(tokio::time::Instant::now() + MIN_TYPING),
                write,
            )
            .await
            {
                Ok(Ok(())) => {}
                Ok(Err(e)) => {
                    return Err(SandboxError::io(
                        format!("typing into shell {:?}", self.name),
                        e,
                    ))
                }
                Err(_) => {
                    untyped = bytes.len() + lines.by_ref().map(<[u8]>::len).sum::<usize>();
                    break;
                }
            }
            if lines.peek().is_some() {
                self.wait_taken(typed + 1, deadline).await;
            }
        }
        let yield_time = deadline.saturating_duration_since(tokio::time::Instant::now());
        let expected = prompts_before + keys.lines.max(usize::from(keys.control_only));
        let idle = keys
            .bytes
            .is_empty()
            .then(|| self.state.lock().decoder.idle_at_prompt())
            .flatten();
        let mut status = match idle {
            Some(PromptKind::Command { exit }) => ShellStatus::Ready { exit_code: exit },
            _ => self.wait(expected, true, yield_time).await,
        };
        let (pending, prompt) = self.state.lock().decoder.take();
        drop(input);
        if let ShellStatus::Exited { .. } = status {
            let code = self
                .docker
                .inspect_exec(&self.exec_id)
                .await
                .ok()
                .and_then(|i| i.exit_code);
            status = ShellStatus::Exited { exit_code: code };
        } else if let Some(PromptKind::Command { exit }) = prompt {
            status = ShellStatus::Ready { exit_code: exit };
        }
        let mut text = pending.text;
        let mut cut_at = pending.cut_at;
        // The terminal echoes what was typed; the model knows what it typed.
        if let Some(first) = chars.lines().next().filter(|l| !l.is_empty()) {
            if let Some(rest) = text.strip_prefix(first) {
                if let Some(rest) = rest.strip_prefix('\n') {
                    let echo = first.len() + 1;
                    text = rest.to_string();
                    cut_at = cut_at.saturating_sub(echo);
                }
            }
        }
        let (output, omitted_bytes) =
            term::cap_middle(&text, pending.omitted, cut_at, self.output_cap);
        Ok(FeedOutput {
            shell: self.name.clone(),
            output,
            status,
            omitted_bytes,
            untyped_bytes: untyped,
            elapsed: started.elapsed(),
        })
    }

    /// Waits until a typed line was taken: a prompt (PS1 or PS2) beyond `prompts`, or
    /// output quiet for a moment (a command runs, or a program waits for input).
    async fn wait_taken(&self, prompts: usize, deadline: tokio::time::Instant) {
        let mut changed = self.changed.clone();
        loop {
            let quiet_left = {
                let st = self.state.lock();
                if st.closed || st.decoder.prompts() >= prompts {
                    return;
                }
                LINE_TAKEN_QUIET.saturating_sub(st.last_output.elapsed())
            };
            if quiet_left.is_zero() || tokio::time::Instant::now() >= deadline {
                return;
            }
            let wake = (tokio::time::Instant::now() + quiet_left).min(deadline);
            tokio::select! {
                _ = changed.changed() => {}
                _ = tokio::time::sleep_until(wake) => {}
            }
        }
    }

    /// Waits until the shell is done with what was typed: back at its prompt with
    /// `expected` prompts seen, settled at a prompt, at another program's prompt
    /// (when `allow_other_prompt`), closed, or `limit` has passed.
    async fn wait(
        &self,
        expected: usize,
        allow_other_prompt: bool,
        limit: Duration,
    ) -> ShellStatus {
        let deadline = tokio::time::Instant::now() + limit;
        let mut changed = self.changed.clone();
        loop {
            let recheck_in = {
                let st = self.state.lock();
                if st.closed {
                    return ShellStatus::Exited { exit_code: None };
                }
                let quiet = st.last_output.elapsed();
                if let Some(PromptKind::Command { exit }) = st.decoder.at_prompt() {
                    if st.decoder.prompts() >= expected || quiet >= SETTLE_AT_PROMPT {
                        return ShellStatus::Ready { exit_code: exit };
                    }
                    Some(SETTLE_AT_PROMPT - quiet)
                } else if allow_other_prompt && looks_like_prompt(&st.decoder.last_line()) {
                    if quiet >= SETTLE_AT_OTHER_PROMPT {
                        return ShellStatus::WaitingForInput;
                    }
                    Some(SETTLE_AT_OTHER_PROMPT - quiet)
                } else {
                    None
                }
            };
            let now = tokio::time::Instant::now();
            if now >= deadline {
                return ShellStatus::StillRunning;
            }
            let wake = recheck_in.map_or(deadline, |d| (now + d).min(deadline));
            tokio::select! {
                res = changed.changed() => {
                    if res.is_err() {
                        // The reader ended; the next loop sees `closed`.
                        tokio::time::sleep(Duration::from_millis(1)).await;
                    }
                }
                _ = tokio::time::sleep_until(wake) => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prompt_heuristic() {
        assert!(looks_like_prompt(">>> "));
        assert!(looks_like_prompt("... "));
        assert!(looks_like_prompt("Password: "));
        assert!(looks_like_prompt("Do you want to continue? [Y/n] "));
        assert!(looks_like_prompt("(gdb) "));
        assert!(!looks_like_prompt("Downloading 45%"));
        assert!(!looks_like_prompt(""));
        assert!(!looks_like_prompt("building..."));
    }

    #[test]
    fn render_notes() {
        let mut f = FeedOutput {
            shell: "default".into(),
            output: "hi".into(),
            status: ShellStatus::Ready { exit_code: Some(0) },
            omitted_bytes: 0,
            untyped_bytes: 0,
            elapsed: Duration::from_millis(3),
        };
        assert_eq!(f.render(), "hi\n[exit status: 0]");
        f.status = ShellStatus::StillRunning;
        f.elapsed = Duration::from_millis(1500);
        assert!(f
            .render()
            .contains("still running after 1.5s; the command was not stopped"));
        f.status = ShellStatus::Exited { exit_code: Some(3) };
        assert!(f.render().contains("exited with status 3"));
    }
}
