//! Server-sent events read from a byte stream with a bound on every event, enforced as the
//! bytes arrive: a relay that sends one endless `data:` line costs at most the bound in
//! memory and one pass over each byte, never a growing buffer parsed again and again.
//!
//! The framing is the HTML standard's (lines end in CRLF, LF or CR; a blank line ends an
//! event; `data` lines are joined with LF; `event` names the type; comments and other
//! fields are read and dropped). An event whose lines together pass the bound is dropped
//! whole: its bytes are counted and thrown away up to the blank line that ends it, and
//! the caller hears once, when the bound is passed, that it was.

/// One thing the reader found.
#[derive(Debug, PartialEq)]
pub enum Frame {
    /// A whole event: its type (`message` when none was named) and its data.
    Event { event: String, data: Vec<u8> },
    /// An event passed the bound: its bytes up to its end are skipped.
    TooLarge,
}

/// An incremental reader of an event stream; see the module's note.
pub struct Reader {
    /// The most bytes one event's lines may take together, line ends excluded.
    max: usize,
    /// The line being read (when not skipping).
    line: Vec<u8>,
    /// Whether the line being read has any byte (a skipped line keeps none).
    line_started: bool,
    /// The event being read: its `data` lines, joined, and its type.
    data: Vec<u8>,
    event: String,
    /// Bytes of the event's lines so far.
    size: usize,
    /// The event passed the bound: everything up to its blank line is dropped.
    skipping: bool,
    /// The last byte seen was a CR: an LF right after it ends nothing more.
    after_cr: bool,
    /// A byte-order mark at the very start is dropped.
    at_start: bool,
}

/// Lines longer than this are not kept in a buffer sized for them once they are done.
const KEEP_CAPACITY: usize = 64 * 1024;

impl Reader {
    pub fn new(max: usize) -> Reader {
        Reader {
            max,
            line: Vec::new(),
            line_started: false,
            data: Vec::new(),
            event: String::new(),
            size: 0,
            skipping: false,
            after_cr: false,
            at_start: true,
        }
    }

    /// Reads `chunk`; what it completes is appended to `out`.
    pub fn push(&mut self, mut chunk: &[u8], out: &mut Vec<Frame>) {
        if self.at_start && !chunk.is_empty() {
            const BOM: &[u8] = b"\xEF\xBB\xBF";
            // A mark split across chunks is not looked for: relays send it whole if at all.
            if let Some(rest) = chunk.strip_prefix(BOM) {
                chunk = rest;
            }
            self.at_start = false;
        }
        while !chunk.is_empty() {
            if self.after_cr {
                self.after_cr = false;
                if chunk[0] == b'\n' {
                    chunk = &chunk[1..];
                    continue;
                }
            }
            match chunk.iter().position(|&b| b == b'\n' || b == b'\r') {
                None => {
                    self.take(chunk, out);
                    break;
                }
                Some(i) => {
                    self.take(&chunk[..i], out);
                    self.after_cr = chunk[i] == b'\r';
                    chunk = &chunk[i + 1..];
                    self.end_line(out);
                }
            }
        }
    }

    /// Bytes of the current line: kept, or counted only once the event is over the bound.
    fn take(&mut self, bytes: &[u8], out: &mut Vec<Frame>) {
        if bytes.is_empty() {
            return;
        }
        self.line_started = true;
        self.size = self.size.saturating_add(bytes.len());
        if self.skipping {
            return;
        }
        if self.size > self.max {
            self.skipping = true;
            self.line = Vec::new();
            self.data = Vec::new();
            self.event.clear();
            out.push(Frame::TooLarge);
            return;
        }
        self.line.extend_from_slice(bytes);
    }

    fn end_line(&mut self, out: &mut Vec<Frame>) {
        if !self.line_started {
            // A blank line: the event is over.
            if !self.skipping && !self.data.is_empty() {
                self.data.pop(); // the LF after the last `data` line
                let event = match std::mem::take(&mut self.event) {
                    e if e.is_empty() => "message".to_string(),
                    e => e,
                };
                out.push(Frame::Event {
                    event,
                    data: std::mem::take(&mut self.data),
                });
            }
            self.data.clear();
            self.event.clear();
            self.size = 0;
            self.skipping = false;
            return;
        }
        self.line_started = false;
        if !self.skipping {
            self.field();
        }
        self.line.clear();
        if self.line.capacity() > KEEP_CAPACITY {
            self.line = Vec::new();
        }
    }

    /// The finished line as a field of the event.
    fn field(&mut self) {
        let line = &self.line[..];
        let (name, value) = match line.iter().position(|&b| b == b':') {
            Some(0) => return, // a comment
            Some(i) => {
                let value = &line[i + 1..];
                (&line[..i], value.strip_prefix(b" ").unwrap_or(value))
            }
            None => (line, &b""[..]),
        };
        match name {
            b"data" => {
                self.data.extend_from_slice(value);
                self.data.push(b'\n');
            }
            b"event" => self.event = String::from_utf8_lossy(value).into_owned(),
            _ => {} // `id`, `retry` and unknown fields: nothing kodx uses
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(max: usize, chunks: &[&[u8]]) -> Vec<Frame> {
        let mut r = Reader::new(max);
        let mut out = Vec::new();
        for c in chunks {
            r.push(c, &mut out);
        }
        out
    }

    fn ev(event: &str, data: &str) -> Frame {
        Frame::Event {
            event: event.into(),
            data: data.as_bytes().to_vec(),
        }
    }

    #[test]
    fn events_as_the_standard_frames_them() {
        let out = read(
            1000,
            &[
                b"\xEF\xBB\xBFevent: ready\ndata: {}\n\n: keep-alive\n\ndata: a\r\ndata:b\r",
                b"\n\r\nid: 1\nretry: 5\ndata\n\nevent: ping\n\n",
            ],
        );
        assert_eq!(
            out,
            [ev("ready", "{}"), ev("message", "a\nb"), ev("message", "")]
        );
        // Split anywhere, the same events.
        let whole = b"event: x\r\ndata: 12345\r\n\r\ndata: y\n\n";
        for cut in 0..whole.len() {
            let out = read(1000, &[&whole[..cut], &whole[cut..]]);
            assert_eq!(out, [ev("x", "12345"), ev("message", "y")], "cut at {cut}");
        }
    }

    #[test]
    fn an_event_over_the_bound_is_skipped_whole_and_said_once() {
        let mut r = Reader::new(100);
        let mut out = Vec::new();
        r.push(b"data: small\n\ndata: ", &mut out);
        // An endless line: said once, and nothing of it is kept.
        for _ in 0..10_000 {
            r.push(&[b'x'; 1000], &mut out);
        }
        assert_eq!(out, [ev("message", "small"), Frame::TooLarge]);
        assert!(r.line.capacity() <= 100 && r.data.capacity() <= 100);
        // More lines of the same event are dropped too; the next event is read.
        r.push(b"\ndata: more\n\ndata: next\n\n", &mut out);
        assert_eq!(out[2..], [ev("message", "next")]);
        // The bound counts all lines of an event, not each.
        let lines = "data: 0123456789\n".repeat(8) + "\n";
        assert_eq!(read(100, &[lines.as_bytes()]), [Frame::TooLarge]);
        assert_eq!(read(130, &[lines.as_bytes()]).len(), 1);
    }
}
