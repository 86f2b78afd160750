//! Content codings for `compress` and `decompress`: which one a client's `Accept-Encoding` takes, the
//! encoders and decoders (flate2, brotli, zstd), and a response body passed through one of them as it is
//! polled.
//!
//! The body flushes what the codec holds whenever its source waits, so a slowly streamed response still
//! arrives piece by piece; it never holds the whole body. A decoder is fed at most `DECODE_SLICE` bytes at a
//! time and its output goes out once it reaches `OUTPUT_CHUNK`, so what one compressed piece expands to is
//! held only a slice at a time; `Sink` caps what a response may decode to in all.

use crate::codec::RequestHead;
use crate::stream_body::{BoxBody, BoxError};
use bytes::{Buf, Bytes};
use hyper::body::{Body, Frame, SizeHint};
use hyper::header::HeaderMap;
use portico_config::Coding;
use std::io::{self, Write};
use std::pin::Pin;
use std::task::{Context, Poll};

/// Output is sent once this much is ready, without waiting for the source to pause.
const OUTPUT_CHUNK: usize = 16 * 1024;
/// A decoder is given this much compressed input at a time: gzip expands 1 KiB to at most about 1 MiB.
const DECODE_SLICE: usize = 1024;
/// brotli's window (2^20 = 1 MiB): its memory per stream, and what a decoder must hold.
const BROTLI_LGWIN: u32 = 20;
/// zstd's largest window for HTTP (RFC 9659: 8 MiB), for encoders and decoders.
const ZSTD_WINDOW_LOG: u32 = 23;

/// The q-value `Accept-Encoding` gives each coding: the coding's own (`x-gzip` counts as `gzip`), else that
/// of `*`, else 0. `None` without an `Accept-Encoding` header.
pub(crate) struct Accepted {
    /// (gzip, br, zstd, `*`), in thousandths; `None` where not listed.
    q: [Option<u16>; 4],
}

impl Accepted {
    pub fn of(head: &RequestHead) -> Option<Accepted> {
        let mut q = [None; 4];
        let mut any = false;
        for value in head.values("accept-encoding") {
            any = true;
            let Ok(value) = std::str::from_utf8(value) else { continue };
            for item in value.split(',') {
                let mut parts = item.split(';');
                let coding = parts.next().unwrap_or_default().trim();
                let weight = parts
                    .filter_map(|p| p.trim().strip_prefix("q=").or_else(|| p.trim().strip_prefix("Q=")))
                    .next()
                    .map_or(1000, qvalue);
                let slot = match coding.to_ascii_lowercase().as_str() {
                    "gzip" | "x-gzip" => 0,
                    "br" => 1,
                    "zstd" => 2,
                    "*" => 3,
                    _ => continue,
                };
                // A coding listed twice: its first q stands (what nginx and most servers do).
                q[slot].get_or_insert(weight);
            }
        }
        any.then_some(Accepted { q })
    }

    /// The q-value of `coding` in thousandths: 0 means not acceptable.
    pub fn q(&self, coding: Coding) -> u16 {
        let slot = match coding {
            Coding::Gzip => 0,
            Coding::Brotli => 1,
            Coding::Zstd => 2,
        };
        self.q[slot].or(self.q[3]).unwrap_or(0)
    }

    /// The coding of `offered` with the highest q-value above 0, the earliest of `offered` among equals.
    pub fn best(&self, offered: &[Coding]) -> Option<Coding> {
        let mut best: Option<(Coding, u16)> = None;
        for &c in offered {
            let q = self.q(c);
            if q > 0 && best.is_none_or(|(_, b)| q > b) {
                best = Some((c, q));
            }
        }
        best.map(|(c, _)| c)
    }
}

/// A q-value (RFC 9110 12.4.2: `0`, `1`, up to three decimals) in thousandths; anything else is 0.
fn qvalue(text: &str) -> u16 {
    let text = text.trim();
    let (int, frac) = text.split_once('.').unwrap_or((text, ""));
    if frac.len() > 3 || !frac.bytes().all(|b| b.is_ascii_digit()) {
        return 0;
    }
    let frac_value =
        frac.bytes().chain(std::iter::repeat(b'0')).take(3).fold(0u16, |n, b| n * 10 + u16::from(b - b'0'));
    match int {
        "0" => frac_value,
        "1" if frac_value == 0 => 1000,
        _ => 0,
    }
}

/// The coding named by a `Content-Encoding` value that holds exactly one coding Portico knows.
pub(crate) fn coding_of(value: &[u8]) -> Option<Coding> {
    let value = std::str::from_utf8(value).ok()?.trim();
    if value.eq_ignore_ascii_case("gzip") || value.eq_ignore_ascii_case("x-gzip") {
        Some(Coding::Gzip)
    } else if value.eq_ignore_ascii_case("br") {
        Some(Coding::Brotli)
    } else if value.eq_ignore_ascii_case("zstd") {
        Some(Coding::Zstd)
    } else {
        None
    }
}

/// Something a body passes through: an encoder or a decoder writing into a buffer of output.
pub(crate) trait Codec {
    fn write(&mut self, data: &[u8]) -> io::Result<()>;
    /// Makes everything written so far available as output (a sync flush for encoders).
    fn flush(&mut self) -> io::Result<()>;
    /// Ends the stream: the rest of the output, and for a decoder a check that the input was complete.
    fn finish(&mut self) -> io::Result<()>;
    fn output(&mut self) -> &mut Vec<u8>;
}

/// An encoder of one of the codings, at its level.
pub(crate) enum Encoder {
    Gzip(flate2::write::GzEncoder<Vec<u8>>),
    /// `None` once finished (brotli's writer finishes only by giving its output up).
    Brotli(Option<Box<brotli::CompressorWriter<Vec<u8>>>>, Vec<u8>),
    Zstd(zstd::stream::write::Encoder<'static, Vec<u8>>),
}

impl Encoder {
    pub fn new(coding: Coding, level: u32) -> io::Result<Encoder> {
        let out = Vec::with_capacity(8 * 1024);
        Ok(match coding {
            Coding::Gzip => Encoder::Gzip(flate2::write::GzEncoder::new(out, flate2::Compression::new(level))),
            Coding::Brotli => {
                Encoder::Brotli(Some(Box::new(brotli::CompressorWriter::new(out, 4096, level, BROTLI_LGWIN))), vec![])
            }
            Coding::Zstd => {
                let mut encoder = zstd::stream::write::Encoder::new(out, level as i32)?;
                // Levels past 18 ask for larger windows than an HTTP client must accept.
                if level > 18 {
                    encoder.window_log(ZSTD_WINDOW_LOG)?;
                }
                Encoder::Zstd(encoder)
            }
        })
    }
}

impl Codec for Encoder {
    fn write(&mut self, data: &[u8]) -> io::Result<()> {
        match self {
            Encoder::Gzip(e) => e.write_all(data),
            Encoder::Brotli(Some(e), _) => e.write_all(data),
            Encoder::Brotli(None, _) => Err(io::Error::other("brotli stream already finished")),
            Encoder::Zstd(e) => e.write_all(data),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        match self {
            Encoder::Gzip(e) => e.flush(),
            Encoder::Brotli(Some(e), _) => e.flush(),
            Encoder::Brotli(None, _) => Ok(()),
            Encoder::Zstd(e) => e.flush(),
        }
    }

    fn finish(&mut self) -> io::Result<()> {
        match self {
            Encoder::Gzip(e) => e.try_finish(),
            Encoder::Brotli(e, rest) => {
                if let Some(e) = e.take() {
                    *rest = e.into_inner();
                }
                Ok(())
            }
            Encoder::Zstd(e) => e.do_finish(),
        }
    }

    fn output(&mut self) -> &mut Vec<u8> {
        match self {
            Encoder::Gzip(e) => e.get_mut(),
            Encoder::Brotli(Some(e), _) => e.get_mut(),
            Encoder::Brotli(None, rest) => rest,
            Encoder::Zstd(e) => e.get_mut(),
        }
    }
}

/// Decoded output, refusing to grow past what one response may decode to.
pub(crate) struct Sink {
    buf: Vec<u8>,
    total: u64,
    max: u64,
}

impl Write for Sink {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        self.total += data.len() as u64;
        if self.total > self.max {
            return Err(io::Error::other(format!("the response decodes to more than {} bytes", self.max)));
        }
        self.buf.extend_from_slice(data);
        Ok(data.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// A decoder of one of the codings, bounded by `max` decoded bytes.
pub(crate) enum Decoder {
    Gzip(Box<flate2::write::MultiGzDecoder<Sink>>),
    Brotli(Box<brotli::DecompressorWriter<Sink>>),
    Zstd(zstd::stream::write::Decoder<'static, Sink>),
}

impl Decoder {
    pub fn new(coding: Coding, max: u64) -> io::Result<Decoder> {
        let sink = Sink { buf: Vec::with_capacity(OUTPUT_CHUNK), total: 0, max };
        Ok(match coding {
            Coding::Gzip => Decoder::Gzip(Box::new(flate2::write::MultiGzDecoder::new(sink))),
            Coding::Brotli => Decoder::Brotli(Box::new(brotli::DecompressorWriter::new(sink, 4096))),
            Coding::Zstd => {
                let mut decoder = zstd::stream::write::Decoder::new(sink)?;
                decoder.window_log_max(ZSTD_WINDOW_LOG)?;
                Decoder::Zstd(decoder)
            }
        })
    }
}

impl Codec for Decoder {
    fn write(&mut self, data: &[u8]) -> io::Result<()> {
        match self {
            Decoder::Gzip(d) => d.write_all(data),
            Decoder::Brotli(d) => d.write_all(data),
            Decoder::Zstd(d) => d.write_all(data),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        match self {
            Decoder::Gzip(d) => d.flush(),
            Decoder::Brotli(d) => d.flush(),
            Decoder::Zstd(d) => d.flush(),
        }
    }

    fn finish(&mut self) -> io::Result<()> {
        match self {
            Decoder::Gzip(d) => d.try_finish(),
            Decoder::Brotli(d) => d.close().map_err(|_| io::Error::other("the brotli stream is truncated or corrupt")),
            Decoder::Zstd(d) => d.do_finish(),
        }
    }

    fn output(&mut self) -> &mut Vec<u8> {
        match self {
            Decoder::Gzip(d) => &mut d.get_mut().buf,
            Decoder::Brotli(d) => &mut d.get_mut().buf,
            Decoder::Zstd(d) => &mut d.get_mut().buf,
        }
    }
}

/// A body passed through `codec` as it is polled; the source's trailers follow its data.
pub(crate) struct Coded<'b, C> {
    inner: BoxBody<'b>,
    /// `None` once finished.
    codec: Option<C>,
    /// Source data not yet given to the codec.
    input: Bytes,
    /// At most this much input is written at once.
    slice: usize,
    /// Bytes went into the codec since it was last flushed.
    dirty: bool,
    trailers: Option<HeaderMap>,
}

impl<'b> Coded<'b, Encoder> {
    pub fn encoding(inner: BoxBody<'b>, encoder: Encoder) -> Self {
        Coded { inner, codec: Some(encoder), input: Bytes::new(), slice: usize::MAX, dirty: false, trailers: None }
    }
}

impl<'b> Coded<'b, Decoder> {
    pub fn decoding(inner: BoxBody<'b>, decoder: Decoder) -> Self {
        Coded { inner, codec: Some(decoder), input: Bytes::new(), slice: DECODE_SLICE, dirty: false, trailers: None }
    }
}

impl<C: Codec> Coded<'_, C> {
    fn take_output(&mut self) -> Option<Bytes> {
        let out = self.codec.as_mut()?.output();
        (!out.is_empty()).then(|| Bytes::from(std::mem::replace(out, Vec::with_capacity(OUTPUT_CHUNK))))
    }
}

impl<C: Codec + Unpin> Body for Coded<'_, C> {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        loop {
            let Some(codec) = this.codec.as_mut() else {
                return Poll::Ready(this.trailers.take().map(|t| Ok(Frame::trailers(t))));
            };
            if !this.input.is_empty() {
                let n = this.slice.min(this.input.len());
                if let Err(e) = codec.write(&this.input[..n]) {
                    this.codec = None;
                    return Poll::Ready(Some(Err(e.into())));
                }
                this.input.advance(n);
                this.dirty = true;
                if codec.output().len() >= OUTPUT_CHUNK {
                    if let Some(out) = this.take_output() {
                        return Poll::Ready(Some(Ok(Frame::data(out))));
                    }
                }
                continue;
            }
            match this.inner.as_mut().poll_frame(cx) {
                Poll::Ready(Some(Ok(frame))) => match frame.into_data() {
                    Ok(data) => this.input = data,
                    Err(frame) => this.trailers = frame.into_trailers().ok(),
                },
                Poll::Ready(Some(Err(e))) => {
                    this.codec = None;
                    return Poll::Ready(Some(Err(e)));
                }
                Poll::Ready(None) => {
                    if let Err(e) = codec.finish() {
                        this.codec = None;
                        return Poll::Ready(Some(Err(e.into())));
                    }
                    let out = this.take_output();
                    this.codec = None;
                    if let Some(out) = out {
                        return Poll::Ready(Some(Ok(Frame::data(out))));
                    }
                }
                Poll::Pending => {
                    // The source waits: what it gave so far goes out now, not with the next piece.
                    if std::mem::take(&mut this.dirty) {
                        if let Err(e) = codec.flush() {
                            this.codec = None;
                            return Poll::Ready(Some(Err(e.into())));
                        }
                        if let Some(out) = this.take_output() {
                            return Poll::Ready(Some(Ok(Frame::data(out))));
                        }
                    }
                    return Poll::Pending;
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.codec.is_none() && self.trailers.is_none()
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::default()
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::codec::{parse_request, take_request, HeadLimits, Parsed};
    use http_body_util::BodyExt;

    pub fn head_with(extra: &str) -> RequestHead {
        let raw = format!("GET / HTTP/1.1\r\nhost: x\r\n{extra}\r\n");
        let limits = HeadLimits { max_request_line: 8192, max_header_bytes: 32768, max_headers: 100 };
        let mut buf = bytes::BytesMut::from(raw.as_bytes());
        match parse_request(&buf, &limits) {
            Ok(Parsed::Complete(head, used)) => take_request(&mut buf, head, used),
            _ => panic!("unparsed"),
        }
    }

    fn best(accept: Option<&str>, offered: &[Coding]) -> Option<Coding> {
        let head = head_with(&accept.map(|a| format!("accept-encoding: {a}\r\n")).unwrap_or_default());
        Accepted::of(&head).and_then(|a| a.best(offered))
    }

    #[test]
    fn the_best_coding_by_q_value_then_preference() {
        use Coding::*;
        let all = [Zstd, Brotli, Gzip];
        for (accept, expected) in [
            ("gzip", Some(Gzip)),
            ("GZIP", Some(Gzip)),
            ("x-gzip;q=0.1", Some(Gzip)),
            ("gzip, deflate, br, zstd", Some(Zstd)),
            ("gzip, br", Some(Brotli)),
            ("br;q=1, gzip;q=0.5", Some(Brotli)),
            ("br;q=0.5, gzip;q=1", Some(Gzip)),
            ("zstd;q=0.8, br;q=0.9, gzip;q=0.1", Some(Brotli)),
            ("gzip;q=0", None),
            ("gzip; q=0.000", None),
            ("gzip;q=0.001", Some(Gzip)),
            ("gzip;q=1.5", None),
            ("gzip;q=0.0001", None),
            ("deflate", None),
            ("identity", None),
            ("*", Some(Zstd)),
            ("*;q=0", None),
            ("gzip;q=0, *", Some(Zstd)),
            ("br;q=0, zstd;q=0, *;q=0.3", Some(Gzip)),
            ("gzip, gzip;q=0", Some(Gzip)),
        ] {
            assert_eq!(best(Some(accept), &all), expected, "{accept}");
        }
        assert_eq!(best(None, &all), None, "no Accept-Encoding: nothing is chosen");
        assert_eq!(best(Some("br, gzip"), &[Gzip, Brotli]), Some(Gzip), "the server's order among equals");
        assert_eq!(best(Some("zstd"), &[Gzip]), None, "only what is offered");
    }

    #[test]
    fn content_encodings_known() {
        assert_eq!(coding_of(b"gzip"), Some(Coding::Gzip));
        assert_eq!(coding_of(b" X-GZIP "), Some(Coding::Gzip));
        assert_eq!(coding_of(b"br"), Some(Coding::Brotli));
        assert_eq!(coding_of(b"zstd"), Some(Coding::Zstd));
        assert_eq!(coding_of(b"gzip, br"), None, "two codings");
        assert_eq!(coding_of(b"deflate"), None);
    }

    /// A body of `pieces`, as a handler or an upstream would give it.
    fn source(pieces: Vec<Vec<u8>>) -> BoxBody<'static> {
        let stream = futures_util::stream::iter(pieces.into_iter().map(|p| Ok(Frame::data(Bytes::from(p)))));
        Box::pin(http_body_util::StreamBody::new(stream))
    }

    fn collect(body: impl Body<Data = Bytes, Error = BoxError>) -> Result<Vec<u8>, String> {
        let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
        rt.block_on(async { body.collect().await.map(|c| c.to_bytes().to_vec()).map_err(|e| e.to_string()) })
    }

    fn text(n: usize) -> Vec<u8> {
        (0..n).map(|i| b"{\"id\": 12, \"name\": \"portico\"}, "[i % 31]).collect()
    }

    #[test]
    fn every_coding_round_trips_through_its_decoder() {
        let plain = text(300_000);
        for coding in [Coding::Gzip, Coding::Brotli, Coding::Zstd] {
            let level = if coding == Coding::Gzip { 5 } else { 3 };
            let pieces = plain.chunks(7000).map(<[u8]>::to_vec).collect();
            let encoded = collect(Coded::encoding(source(pieces), Encoder::new(coding, level).unwrap())).unwrap();
            assert!(encoded.len() < plain.len() / 10, "{coding:?}: {}", encoded.len());
            let pieces = encoded.chunks(333).map(<[u8]>::to_vec).collect();
            let decoded = collect(Coded::decoding(source(pieces), Decoder::new(coding, 1 << 20).unwrap())).unwrap();
            assert!(decoded == plain, "{coding:?}");
            // The same with a bound below its size: an error, not a larger body.
            let pieces = vec![encoded.clone()];
            let capped = collect(Coded::decoding(source(pieces), Decoder::new(coding, 100_000).unwrap()));
            assert!(capped.unwrap_err().contains("more than 100000 bytes"), "{coding:?}");
            // Truncated: an error at the end.
            let pieces = vec![encoded[..encoded.len() / 2].to_vec()];
            let cut = collect(Coded::decoding(source(pieces), Decoder::new(coding, 1 << 20).unwrap()));
            assert!(cut.is_err(), "{coding:?}: a truncated stream decoded");
            let garbage =
                collect(Coded::decoding(source(vec![plain[..5000].to_vec()]), Decoder::new(coding, 1 << 20).unwrap()));
            assert!(garbage.is_err(), "{coding:?}: garbage decoded");
        }
    }

    #[test]
    fn a_bomb_is_cut_off_at_the_bound_holding_little() {
        // 64 MiB of zeros compresses to a few tens of KiB; decoding it with a 1 MiB bound fails without
        // ever holding more than about a slice's expansion.
        let zeros = vec![0u8; 64 << 20];
        for coding in [Coding::Gzip, Coding::Brotli, Coding::Zstd] {
            let level = if coding == Coding::Gzip { 9 } else { 5 };
            let mut encoder = Encoder::new(coding, level).unwrap();
            encoder.write(&zeros).unwrap();
            encoder.finish().unwrap();
            let bomb = std::mem::take(encoder.output());
            assert!(bomb.len() < 256 * 1024, "{coding:?}: {}", bomb.len());
            let mut body = Coded::decoding(source(vec![bomb]), Decoder::new(coding, 1 << 20).unwrap());
            let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
            let (mut seen, mut largest) = (0usize, 0usize);
            let failed = rt.block_on(async {
                while let Some(frame) = body.frame().await {
                    match frame {
                        Ok(f) => {
                            let n = f.data_ref().map_or(0, |d| d.len());
                            seen += n;
                            largest = largest.max(n);
                        }
                        Err(_) => return true,
                    }
                }
                false
            });
            assert!(failed, "{coding:?}: decoded past the bound");
            assert!(seen <= 1 << 20, "{coding:?}: {seen} bytes out");
            assert!(largest <= 16 << 20, "{coding:?}: a frame of {largest} bytes");
        }
    }
}
