//! `mount --trace FILE`: every span the daemon closes (FUSE operations, chunk fills, pulls from
//! peers, locator lookups) as one event of the Chrome trace-event format that DFTracer writes
//! and Perfetto (ui.perfetto.dev) and chrome://tracing open: a JSON array of complete (`"X"`)
//! events with the node id as `pid`, the thread as `tid`, start (since the Unix epoch, so the
//! traces of several nodes line up) and duration in microseconds
//! and the span's fields (sizes, offsets, paths) as `args`. The array is left open (the format
//! allows it), so a daemon that dies leaves a readable trace of everything flushed.

use std::fmt::Write as _;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use tracing::span::{Attributes, Id};
use tracing::{Subscriber, field::Field, field::Visit};
use tracing_subscriber::layer::Context;
use tracing_subscriber::registry::LookupSpan;

/// Events buffered between writes to the file.
const FLUSH_EVERY: usize = 256;

type Out = Arc<Mutex<(BufWriter<File>, usize)>>;

pub struct TraceLayer {
    out: Out,
    node: u32,
    epoch: Instant,
    /// `epoch` in microseconds since the Unix epoch: the traces of several nodes line up.
    epoch_us: f64,
}

/// What a span carries until it closes: when it started and its fields as JSON members.
struct Open {
    start: Instant,
    tid: i64,
    args: String,
}

/// Collects a span's fields as `"name":value` JSON members.
struct Args<'a>(&'a mut String);

impl Visit for Args<'_> {
    fn record_u64(&mut self, f: &Field, v: u64) {
        let _ = write!(self.0, ",\"{}\":{v}", f.name());
    }

    fn record_i64(&mut self, f: &Field, v: i64) {
        let _ = write!(self.0, ",\"{}\":{v}", f.name());
    }

    fn record_bool(&mut self, f: &Field, v: bool) {
        let _ = write!(self.0, ",\"{}\":{v}", f.name());
    }

    fn record_str(&mut self, f: &Field, v: &str) {
        let _ = write!(self.0, ",\"{}\":{}", f.name(), json_string(v));
    }

    fn record_debug(&mut self, f: &Field, v: &dyn std::fmt::Debug) {
        // A string recorded by Debug (`?name` of an OsStr) comes quoted and escaped: the
        // trace shows its text, not its quotes.
        let d = format!("{v:?}");
        let text = d
            .strip_prefix('"')
            .and_then(|x| x.strip_suffix('"'))
            .map(|x| x.replace("\\\"", "\"").replace("\\\\", "\\"));
        let _ = write!(
            self.0,
            ",\"{}\":{}",
            f.name(),
            json_string(text.as_deref().unwrap_or(&d))
        );
    }
}

fn json_string(s: &str) -> String {
    serde_json::to_string(s).expect("a string serializes")
}

impl TraceLayer {
    /// Starts the trace in `file` (truncated) for node `node`.
    pub fn create(file: &std::path::Path, node: u32) -> std::io::Result<TraceLayer> {
        // Every user's paths are in it: 0600, never through a symlink or into another's file.
        let mut out = BufWriter::new(crate::sys::private::open_private(file, false)?);
        out.write_all(b"[\n")?;
        out.flush()?;
        Ok(TraceLayer {
            out: Arc::new(Mutex::new((out, 0))),
            node,
            epoch: Instant::now(),
            epoch_us: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap_or_default()
                .as_secs_f64()
                * 1e6,
        })
    }
}

impl<S: Subscriber + for<'a> LookupSpan<'a>> tracing_subscriber::Layer<S> for TraceLayer {
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        let Some(span) = ctx.span(id) else { return };
        let mut args = String::new();
        attrs.record(&mut Args(&mut args));
        let tid = crate::sys::gettid() as i64;
        span.extensions_mut().insert(Open {
            start: Instant::now(),
            tid,
            args,
        });
    }

    fn on_record(&self, id: &Id, values: &tracing::span::Record<'_>, ctx: Context<'_, S>) {
        if let Some(span) = ctx.span(id)
            && let Some(open) = span.extensions_mut().get_mut::<Open>()
        {
            values.record(&mut Args(&mut open.args));
        }
    }

    fn on_close(&self, id: Id, ctx: Context<'_, S>) {
        let Some(span) = ctx.span(&id) else { return };
        let ext = span.extensions();
        let Some(open) = ext.get::<Open>() else {
            return;
        };
        let ts = self.epoch_us + open.start.duration_since(self.epoch).as_secs_f64() * 1e6;
        let dur = open.start.elapsed().as_secs_f64() * 1e6;
        let line = format!(
            "{{\"name\":{},\"cat\":{},\"ph\":\"X\",\"ts\":{ts:.1},\"dur\":{dur:.1},\"pid\":{},\
             \"tid\":{},\"args\":{{\"node\":{}{}}}}},\n",
            json_string(span.name()),
            json_string(span.metadata().target()),
            self.node,
            open.tid,
            self.node,
            open.args
        );
        let mut out = crate::core::sync::lock(&self.out);
        let _ = out.0.write_all(line.as_bytes());
        out.1 += 1;
        if out.1.is_multiple_of(FLUSH_EVERY) {
            let _ = out.0.flush();
        }
    }
}

impl TraceLayer {
    /// What writes the buffered events out (at exit, and every second meanwhile).
    pub fn flusher(&self) -> Flusher {
        Flusher(self.out.clone())
    }
}

#[derive(Clone)]
pub struct Flusher(Out);

impl Flusher {
    pub fn flush(&self) {
        let _ = crate::core::sync::lock(&self.0).0.flush();
    }

    /// Flushes every second from a thread of its own.
    pub fn every_second(self) {
        let _ = std::thread::Builder::new()
            .name("trace-flush".into())
            .spawn(move || {
                loop {
                    std::thread::sleep(std::time::Duration::from_secs(1));
                    self.flush();
                }
            });
    }
}
