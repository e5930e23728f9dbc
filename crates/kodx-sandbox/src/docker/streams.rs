//! The tar streams between the host and a sandbox: the repository packed on a blocking
//! thread and streamed into the container's upload, downloads of the workspace read by the
//! archive code on a blocking thread, and small uploads of kodx's own files. Each copy is
//! bounded in memory by a few chunks in flight, whatever the tree holds.

use parking_lot::Mutex;
use std::io::{self, Read, Write};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bollard::query_parameters::{DownloadFromContainerOptions, UploadToContainerOptions};
use bollard::Docker;
use bytes::{Bytes, BytesMut};
use futures_util::StreamExt;

use super::preload::MAX_DELTA_CHANGES;
use super::spec::{RepoSource, SandboxSpec};
use crate::archive::{self, Manifest};
use crate::ready::{self, ReadyKey, ReadyRepo};
use crate::{Result, SandboxError};

/// Chunks of tar in flight between a blocking thread and the Docker connection (64 KiB
/// each at most): what bounds the memory of a copy in or out, whatever the tree holds.
const PIPE_CHUNKS: usize = 8;
const PIPE_CHUNK_BYTES: usize = 64 << 10;

/// The marker the copy-in's tar ends with (at `/`): its change time is the copy-in's end.
pub(super) const COPIED_MARKER: &str = "/.kodx-copied";

/// The end-of-archive blocks a tar ends with.
const END: usize = 1024;

/// Where the repository goes in the container, and the tar's prefix for it. The tar is
/// uploaded at `/` rather than into `/workspace`: Docker refuses a symlink whose target
/// leaves the directory the tar is uploaded to (a repository's `up -> ../..`), and
/// nothing can leave `/`.
const REPO_PREFIX: &str = "workspace/repo";

/// The repository being packed into a tar on a blocking thread: its chunks come out of
/// `body` as they are written, and the task ends with the baseline manifest.
pub(super) struct PackTask {
    pub(super) task: tokio::task::JoinHandle<Result<Manifest>>,
    pub(super) body: tokio::sync::mpsc::Receiver<io::Result<Bytes>>,
    /// What the container already holds of the tree, told before anything is packed
    /// ([`PackTask::tell`]). Dropped: nothing.
    have: Option<tokio::sync::oneshot::Sender<Have>>,
    /// Over a preloaded checkout ([`Have::Preloaded`]): what the pack does, told before it
    /// writes anything.
    decided: Option<tokio::sync::oneshot::Receiver<Decided>>,
    /// Set when the tar ended with the copy-in's marker ([`super::snapshot`]): the whole
    /// checkout went in, and the marker after it.
    pub(super) marked: Arc<AtomicBool>,
    /// The ready checkout the container got whole (streamed, or kept from this pack): what
    /// a preloaded sandbox of the repository can be made from.
    pub(super) source: Arc<Mutex<Option<ReadyKey>>>,
}

/// What the container holds of the tree before the copy-in.
pub(super) enum Have {
    Nothing,
    /// A cached setup image's checkout: the entries it has the same stay out of the tar.
    Stored(Arc<Manifest>),
    /// A preloaded warm sandbox's checkout of the ready checkout `key`, whose manifest is
    /// `manifest`; `mark`: a marker goes after what the copy-in writes (nothing ran there).
    Preloaded {
        key: ReadyKey,
        manifest: Arc<Manifest>,
        mark: bool,
    },
}

/// What the copy-in over a preloaded checkout does.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Decided {
    /// The same tip: nothing goes in (the tar stays empty and is not uploaded).
    Same,
    /// A newer tip: these paths go first, then the tar with what changed.
    Delta(Vec<String>),
    /// Another tip too far away, over a cached setup image's checkout: `.git` goes, the
    /// tree is packed over the checkout (what it has the same stays out), then what it has
    /// and the new tip does not is removed.
    Over,
    /// Another tip too far away, over a plain image's checkout: the workspace is emptied,
    /// then the whole checkout goes in as into a new sandbox (with its marker).
    Whole,
}

impl PackTask {
    /// Packs `dir` as `spec` says. With a `spec.ready` for a [`RepoSource::GitTip`] clone
    /// and nothing in the container yet, the tip's ready checkout is streamed instead when
    /// there is one, and made from this pack when there is not ([`crate::ready`]).
    pub(super) fn start(dir: PathBuf, spec: &SandboxSpec) -> PackTask {
        let (source, limits) = (spec.repo_source, spec.archive_limits.clone());
        let ready = spec.ready.clone();
        let (tx, body) = tokio::sync::mpsc::channel(PIPE_CHUNKS);
        let (have, had) = tokio::sync::oneshot::channel::<Have>();
        let (decide, decided) = tokio::sync::oneshot::channel::<Decided>();
        let marked = Arc::new(AtomicBool::new(false));
        let kept = Arc::new(Mutex::new(None));
        let (marks, keeps) = (marked.clone(), kept.clone());
        let task = tokio::task::spawn_blocking(move || {
            // Keyed while the container is made: that hashes the clone's `.git`.
            let keyed = ready
                .filter(|_| source == RepoSource::GitTip)
                .and_then(|r| Some((r.key(&dir, REPO_PREFIX, &limits)?, r)));
            let had = had.blocking_recv().unwrap_or(Have::Nothing);
            let started = std::time::Instant::now();
            let pipe = Pipe {
                tx,
                buf: BytesMut::new(),
                waited: Duration::ZERO,
            };
            let pipe = Marked::new(pipe);
            let (had, mark) = match had {
                Have::Nothing => (None, true),
                Have::Stored(m) => (Some(m), false),
                Have::Preloaded { key, manifest, .. }
                    if keyed.as_ref().is_some_and(|(k, _)| *k == key) =>
                {
                    let _ = decide.send(Decided::Same);
                    *keeps.lock() = Some(key);
                    tracing::info!("the preloaded checkout is this run's: nothing to copy");
                    return Ok(Manifest::clone(&manifest));
                }
                Have::Preloaded {
                    key,
                    manifest,
                    mark,
                } => {
                    let planned = match source {
                        // Past half the tree, a whole copy is as cheap and keeps a ready
                        // checkout of the new tip.
                        RepoSource::GitTip => archive::plan_tip_delta(
                            &dir,
                            key.commit(),
                            &manifest,
                            &limits,
                            MAX_DELTA_CHANGES.min(manifest.len() / 2),
                        ),
                        _ => Ok(None),
                    };
                    match planned {
                        Ok(Some(delta)) => {
                            let _ = decide.send(Decided::Delta(delta.removed().to_vec()));
                            return pack_difference(delta, pipe, (mark, &marks), started);
                        }
                        Ok(None) => {}
                        Err(e) => tracing::warn!(
                            "no difference from the preloaded tip ({e}); packing over it"
                        ),
                    }
                    // Too far: over a plain image's checkout (its marker went in: `mark`),
                    // the whole tip goes into the emptied workspace, as into a new sandbox,
                    // and its ready checkout is read or kept, so the next preloaded sandbox
                    // holds it; over a cached setup image's, the tree is packed over it.
                    if mark {
                        let _ = decide.send(Decided::Whole);
                        (None, true)
                    } else {
                        let _ = decide.send(Decided::Over);
                        (Some(manifest), false)
                    }
                }
            };
            // A whole checkout ends with the marker the change set's snapshot compares with.
            let whole = had.is_none() && mark;
            // Over a cached setup image's checkout the ready checkouts are neither read nor
            // written; one kept for this tip still makes the preloaded sandboxes.
            if had.is_some() {
                *keeps.lock() = keyed
                    .as_ref()
                    .filter(|(key, r)| r.has(key))
                    .map(|(key, _)| key.clone());
            }
            // A checkout already in the container (a setup cache hit) takes only the delta,
            // and the ready checkouts are neither read nor written.
            let looked = keyed
                .filter(|_| had.is_none())
                .map(|(key, r)| (r.lookup(&key), key));
            let spool = match looked {
                Some((ready::Lookup::Hit(hit), key)) => {
                    let streamed = stream_ready(hit, pipe, started, &marks);
                    if streamed.is_ok() {
                        *keeps.lock() = Some(key);
                    }
                    return streamed;
                }
                Some((ready::Lookup::Miss(spool), key)) => spool.map(|s| (s, key)),
                None => None,
            };
            let source = match source {
                RepoSource::Files => archive::PackSource::Dir,
                RepoSource::GitHead => archive::PackSource::Checkout,
                RepoSource::GitTip => archive::PackSource::Tip,
            };
            let (spool, spool_key) = spool.unzip();
            let mut tee = ready::Tee::new(pipe, spool);
            let packed =
                archive::pack_over_to(&dir, source, REPO_PREFIX, &limits, had.as_deref(), &mut tee);
            let (pipe, spool) = tee.into_parts();
            let (pipe, packed) = end_tar(pipe, packed, whole, &marks);
            let waited = pipe.waited;
            // The upload ends here; the ready checkout is kept while the engine finishes.
            drop(pipe);
            let (entries, skipped) = packed
                .as_ref()
                .map_or((0, Default::default()), |(m, s)| (m.len(), *s));
            // Where the copy-in's time goes: reading the repository, or the engine taking
            // the tar (the pipe is full while it writes the files).
            tracing::info!(
                took_ms = started.elapsed().as_millis() as u64,
                engine_ms = waited.as_millis() as u64,
                entries,
                already_there = skipped.entries,
                "packed the repository into the container"
            );
            if ready::finish(spool, packed.as_ref().ok().map(|(m, _)| m)) {
                *keeps.lock() = spool_key;
            }
            packed.map(|(m, _)| m)
        });
        PackTask {
            task,
            body,
            have: Some(have),
            decided: Some(decided),
            marked,
            source: kept,
        }
    }

    /// Tells the pack what the container already holds (once; later calls do nothing).
    pub(super) fn tell(&mut self, have: Have) {
        if let Some(tx) = self.have.take() {
            let _ = tx.send(have);
        }
    }

    /// What the pack over a preloaded checkout does; `None` when it failed first.
    pub(super) async fn decision(&mut self) -> Option<Decided> {
        self.decided.take()?.await.ok()
    }

    /// Streams the ready checkout `key` of `ready` (into a preloaded warm sandbox), with the
    /// marker after it when `mark`. Fails when the entry is no longer kept.
    pub(super) fn ready_checkout(ready: ReadyRepo, key: ReadyKey, mark: bool) -> PackTask {
        let (tx, body) = tokio::sync::mpsc::channel(PIPE_CHUNKS);
        let marked = Arc::new(AtomicBool::new(false));
        let marks = marked.clone();
        let task = tokio::task::spawn_blocking(move || {
            let started = std::time::Instant::now();
            let pipe = Marked::new(Pipe {
                tx,
                buf: BytesMut::new(),
                waited: Duration::ZERO,
            });
            let hit = ready
                .open(&key)
                .map_err(|e| SandboxError::io("opening the ready checkout", e))?
                .ok_or_else(|| {
                    SandboxError::InvalidInput("the ready checkout is no longer kept".into())
                })?;
            let streamed = stream_hit(hit, pipe, mark, &marks);
            tracing::debug!(
                took_ms = started.elapsed().as_millis() as u64,
                "streamed a ready checkout into a preloaded sandbox"
            );
            streamed
        });
        PackTask {
            task,
            body,
            have: None,
            decided: None,
            marked,
            source: Arc::new(Mutex::new(None)),
        }
    }
}

/// Ends the upload: with the marker before the tar's end when the pack went well and put
/// the whole checkout in (`whole`), with an error rather than a short tar when it failed.
fn end_tar<T, E: std::fmt::Display>(
    mut pipe: Marked<Pipe>,
    packed: std::result::Result<T, E>,
    whole: bool,
    marks: &AtomicBool,
) -> (Pipe, std::result::Result<T, E>) {
    match &packed {
        // An error here is the upload stopping: the engine's error says why.
        Ok(_) => marks.store(pipe.finish(whole).unwrap_or(false), Ordering::Relaxed),
        Err(e) => {
            let _ = pipe
                .get_ref()
                .tx
                .blocking_send(Err(io::Error::other(e.to_string())));
        }
    }
    (pipe.into_inner(), packed)
}

/// Writes the difference from a preloaded checkout into `pipe`, ended with the marker
/// when `mark` (set in `marks`); its manifest.
fn pack_difference(
    delta: archive::TipDelta,
    mut pipe: Marked<Pipe>,
    (mark, marks): (bool, &AtomicBool),
    started: std::time::Instant,
) -> Result<Manifest> {
    let (changed, removed) = (delta.changed(), delta.removed().len());
    let packed = delta.pack_to(REPO_PREFIX, &mut pipe);
    let (pipe, packed) = end_tar(pipe, packed, mark, marks);
    tracing::info!(
        took_ms = started.elapsed().as_millis() as u64,
        engine_ms = pipe.waited.as_millis() as u64,
        changed,
        removed,
        "copied what changed since the preloaded tip"
    );
    packed
}

/// Streams the ready checkout `hit` into `pipe`, ended with the marker when `mark`.
fn stream_hit(
    hit: ready::Hit,
    mut pipe: Marked<Pipe>,
    mark: bool,
    marks: &AtomicBool,
) -> Result<Manifest> {
    let streamed = hit.stream_to(&mut pipe);
    let (_, streamed) = end_tar(pipe, streamed, mark, marks);
    streamed.map_err(|e| SandboxError::io("streaming the ready checkout", e))
}

/// Streams a ready checkout into the upload; its stored manifest is the baseline.
fn stream_ready(
    hit: ready::Hit,
    mut pipe: Marked<Pipe>,
    started: std::time::Instant,
    marks: &AtomicBool,
) -> Result<Manifest> {
    let entries = hit.entries();
    let streamed = hit.stream_to(&mut pipe);
    let (pipe, streamed) = end_tar(pipe, streamed, true, marks);
    tracing::info!(
        took_ms = started.elapsed().as_millis() as u64,
        engine_ms = pipe.waited.as_millis() as u64,
        entries,
        "streamed the repository's ready checkout into the container"
    );
    streamed.map_err(|e| SandboxError::io("streaming the ready checkout", e))
}

/// The writing end of a pipe to an upload body (on a blocking thread).
struct Pipe {
    tx: tokio::sync::mpsc::Sender<io::Result<Bytes>>,
    buf: BytesMut,
    /// Time spent waiting for the upload to take a chunk.
    waited: Duration,
}

impl Pipe {
    fn send(&mut self) -> io::Result<()> {
        if self.buf.is_empty() {
            return Ok(());
        }
        let chunk = self.buf.split().freeze();
        let started = std::time::Instant::now();
        let sent = self.tx.blocking_send(Ok(chunk));
        self.waited += started.elapsed();
        sent.map_err(|_| {
            io::Error::new(
                io::ErrorKind::BrokenPipe,
                "the upload to the container stopped",
            )
        })
    }
}

impl Write for Pipe {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        let n = data.len().min(PIPE_CHUNK_BYTES - self.buf.len());
        self.buf.extend_from_slice(&data[..n]);
        if self.buf.len() >= PIPE_CHUNK_BYTES {
            self.send()?;
        }
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.send()
    }
}

/// Runs `write` on a blocking thread with a writer whose chunks come out of the returned
/// receiver as they are written (a few in flight at most), e.g. into an upload.
pub(super) fn piped<T: Send + 'static>(
    write: impl FnOnce(&mut dyn Write) -> Result<T> + Send + 'static,
) -> (
    tokio::task::JoinHandle<Result<T>>,
    tokio::sync::mpsc::Receiver<io::Result<Bytes>>,
) {
    let (tx, rx) = tokio::sync::mpsc::channel(PIPE_CHUNKS);
    let task = tokio::task::spawn_blocking(move || {
        let mut pipe = Pipe {
            tx,
            buf: BytesMut::new(),
            waited: Duration::ZERO,
        };
        write(&mut pipe)
    });
    (task, rx)
}

/// Uploads the tar coming out of `body` at `path` in container `id`.
pub(super) async fn upload_stream(
    docker: &Docker,
    id: &str,
    path: &str,
    body: tokio::sync::mpsc::Receiver<io::Result<Bytes>>,
) -> Result<()> {
    let chunks = futures_util::stream::unfold(body, |mut rx| async move {
        rx.recv().await.map(|chunk| (chunk, rx))
    });
    docker
        .upload_to_container(
            id,
            Some(upload_options(path)),
            bollard::body_try_stream(chunks),
        )
        .await
        .map_err(|e| SandboxError::docker(format!("copying files to {path} in the container"), e))
}

/// Opens tar streams of the workspace, or of one path in it, for the archive code on a
/// blocking thread ([`archive::Open`]): the download runs on the runtime, and its chunks
/// come through a bounded channel.
pub(super) struct Opener {
    pub(super) docker: Docker,
    pub(super) id: String,
    pub(super) workdir: String,
    pub(super) handle: tokio::runtime::Handle,
    /// The first Docker error met mid-stream (the tar code only sees an I/O error).
    pub(super) failure: Arc<Mutex<Option<bollard::errors::Error>>>,
}

type Chunk = std::result::Result<Bytes, bollard::errors::Error>;

impl Opener {
    pub(super) fn open(&self, rel: &str) -> Result<Option<Box<dyn Read>>> {
        let path = if rel.is_empty() {
            self.workdir.clone()
        } else {
            format!("{}/{rel}", self.workdir)
        };
        let (tx, mut rx) = tokio::sync::mpsc::channel::<Chunk>(PIPE_CHUNKS);
        let (docker, id, asked) = (self.docker.clone(), self.id.clone(), path.clone());
        self.handle.spawn(async move {
            let options = DownloadFromContainerOptions { path: asked };
            let mut stream = docker.download_from_container(&id, Some(options));
            // Stops when the reader is dropped (a refused entry): the connection closes
            // and the engine stops writing the tar.
            while let Some(item) = stream.next().await {
                let last = item.is_err();
                if tx.send(item).await.is_err() || last {
                    break;
                }
            }
        });
        match rx.blocking_recv() {
            None => Ok(Some(Box::new(io::empty()))),
            Some(Err(bollard::errors::Error::DockerResponseServerError {
                status_code: 404,
                ..
            })) => Ok(None),
            Some(Err(e)) => Err(SandboxError::docker(
                format!("downloading {path} from the container"),
                e,
            )),
            Some(Ok(first)) => Ok(Some(Box::new(ChunkReader {
                rx,
                buf: first,
                failure: self.failure.clone(),
            }))),
        }
    }

    /// `result`, unless the download itself failed: then that is the error.
    pub(super) fn verdict<T>(&self, result: Result<T>, what: &str) -> Result<T> {
        match self.failure.lock().take() {
            Some(e) if result.is_err() => Err(SandboxError::docker(what, e)),
            _ => result,
        }
    }
}

/// The reading end of a download (on a blocking thread).
struct ChunkReader {
    rx: tokio::sync::mpsc::Receiver<Chunk>,
    buf: Bytes,
    failure: Arc<Mutex<Option<bollard::errors::Error>>>,
}

impl Read for ChunkReader {
    fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        while self.buf.is_empty() {
            match self.rx.blocking_recv() {
                None => return Ok(0),
                Some(Ok(chunk)) => self.buf = chunk,
                Some(Err(e)) => {
                    let message = format!("the download from the container failed: {e}");
                    self.failure.lock().get_or_insert(e);
                    return Err(io::Error::other(message));
                }
            }
        }
        let n = out.len().min(self.buf.len());
        out[..n].copy_from_slice(&self.buf.split_to(n));
        Ok(n)
    }
}

pub(super) async fn upload(docker: &Docker, id: &str, path: &str, tar: Vec<u8>) -> Result<()> {
    docker
        .upload_to_container(
            id,
            Some(upload_options(path)),
            bollard::body_full(Bytes::from(tar)),
        )
        .await
        .map_err(|e| SandboxError::docker(format!("copying files to {path} in the container"), e))
}

pub(super) fn upload_options(path: &str) -> UploadToContainerOptions {
    UploadToContainerOptions {
        path: path.to_string(),
        ..Default::default()
    }
}

/// A writer that holds back a tar's last [`END`] bytes, so an entry can go in before them.
pub(super) struct Marked<W: Write> {
    inner: W,
    tail: Vec<u8>,
}

impl<W: Write> Marked<W> {
    pub(super) fn new(inner: W) -> Marked<W> {
        Marked {
            inner,
            tail: Vec::with_capacity(END),
        }
    }

    /// Ends the tar: with the marker before the end-of-archive blocks when `mark` and the
    /// tar ended with them (then true), else as it was (false).
    pub(super) fn finish(&mut self, mark: bool) -> io::Result<bool> {
        let ended = mark && self.tail.len() == END && self.tail.iter().all(|&b| b == 0);
        if ended {
            let mut header = tar::Header::new_ustar();
            header.set_path(&COPIED_MARKER[1..])?;
            header.set_entry_type(tar::EntryType::Regular);
            header.set_mode(0o400);
            header.set_size(0);
            header.set_mtime(0);
            header.set_cksum();
            self.inner.write_all(header.as_bytes())?;
        }
        self.inner.write_all(&std::mem::take(&mut self.tail))?;
        self.inner.flush()?;
        Ok(ended)
    }

    pub(super) fn get_ref(&self) -> &W {
        &self.inner
    }

    /// The writer, without what is held back (a tar that failed anyway).
    pub(super) fn into_inner(self) -> W {
        self.inner
    }
}

impl<W: Write> Write for Marked<W> {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        if data.len() >= END {
            // A chunk as long as what is held back: the held bytes and all but its end go.
            let (head, end) = data.split_at(data.len() - END);
            self.inner.write_all(&self.tail)?;
            self.inner.write_all(head)?;
            self.tail.clear();
            self.tail.extend_from_slice(end);
        } else {
            self.tail.extend_from_slice(data);
            if self.tail.len() > END {
                let excess = self.tail.len() - END;
                self.inner.write_all(&self.tail[..excess])?;
                self.tail.drain(..excess);
            }
        }
        Ok(data.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tar_of(files: &[(&str, &[u8])]) -> Vec<u8> {
        let mut b = tar::Builder::new(Vec::new());
        for (path, data) in files {
            let mut h = tar::Header::new_gnu();
            h.set_size(data.len() as u64);
            h.set_mode(0o644);
            h.set_cksum();
            b.append_data(&mut h, path, *data).unwrap();
        }
        b.into_inner().unwrap()
    }

    #[test]
    fn the_marker_goes_in_before_the_end_of_the_archive() {
        let tar = tar_of(&[("workspace/repo/a.txt", b"hello")]);
        // Written in odd pieces, small and large, as a pipe would take it.
        let mut marked = Marked::new(Vec::new());
        for (i, piece) in tar.chunks(1500).enumerate() {
            if i % 2 == 0 {
                marked.write_all(piece).unwrap();
            } else {
                piece.chunks(37).for_each(|p| marked.write_all(p).unwrap());
            }
        }
        let ended = marked.finish(true).unwrap();
        let out = marked.into_inner();
        assert!(ended);
        assert_eq!(out.len(), tar.len() + 512);
        let names: Vec<String> = tar::Archive::new(&out[..])
            .entries()
            .unwrap()
            .map(|e| e.unwrap().path().unwrap().display().to_string())
            .collect();
        assert_eq!(names, ["workspace/repo/a.txt", ".kodx-copied"]);
    }

    #[test]
    fn a_tar_without_its_end_gets_no_marker() {
        let mut tar = tar_of(&[("a", b"x")]);
        tar.truncate(tar.len() - 512);
        let mut marked = Marked::new(Vec::new());
        marked.write_all(&tar).unwrap();
        let ended = marked.finish(true).unwrap();
        let out = marked.into_inner();
        assert!(!ended);
        assert_eq!(out, tar);
    }
}
