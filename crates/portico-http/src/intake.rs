//! How a request body is taken before it goes to an HTTP/1 upstream: none, read whole (small, or within the
//! route's buffering memory), buffered by the route's request buffering, or streamed.

use crate::body::{ReqBody, REPLAYABLE_BODY};
use crate::codec::BodyFraming;
use crate::relay::{read_more, Pace, SourceFault};
use crate::request_buffer::{read_body, BufferFault, BufferPolicy, Buffered};
use bytes::{Bytes, BytesMut};
use tokio::io::AsyncRead;

/// What happens to a request body before it goes to an HTTP/1 upstream.
#[derive(Clone, Copy)]
pub(crate) enum Intake<'p> {
    /// Nothing to read.
    Empty,
    /// Read `len` bytes whole: a small body with a declared length (nginx reads request bodies first too),
    /// which then leaves in one write with the head and can be replayed; or one within the route's buffering
    /// memory (`buffering`, for the count).
    Whole { len: u64, buffering: bool },
    /// Read it to its end under the route's buffering.
    Buffer(&'p BufferPolicy),
    /// Stream it upstream as it arrives.
    Stream,
}

impl<'p> Intake<'p> {
    /// How a body with `framing` is taken; `Err` for a declared length over the buffering's `max_size`, which
    /// is refused before a `100 Continue` invites the body.
    pub fn of(framing: BodyFraming, buffering: Option<&'p BufferPolicy>) -> Result<Intake<'p>, BufferFault> {
        let n = match (framing, buffering) {
            (BodyFraming::None, _) => return Ok(Intake::Empty),
            (BodyFraming::Length(n), Some(policy)) if n > policy.max_size => return Err(BufferFault::TooLarge),
            (BodyFraming::Length(n), _) => Some(n),
            _ => None,
        };
        Ok(match (n, buffering) {
            (Some(len), Some(policy)) if len <= policy.memory as u64 => Intake::Whole { len, buffering: true },
            (Some(len), b) if len <= REPLAYABLE_BODY => Intake::Whole { len, buffering: b.is_some() },
            (_, Some(policy)) => Intake::Buffer(policy),
            (_, None) => Intake::Stream,
        })
    }

    /// Bytes must still come from the client before the request goes upstream (`buffered` are in hand): the
    /// moment to answer `Expect: 100-continue`.
    pub fn reads(&self, buffered: usize) -> bool {
        match self {
            Intake::Whole { len, .. } => (buffered as u64) < *len,
            Intake::Buffer(_) => true,
            Intake::Empty | Intake::Stream => false,
        }
    }

    /// The body when nothing needs reading: none, or one read whole that has arrived with its head (most
    /// requests), taken without an await.
    pub fn in_hand(&self, buf: &mut BytesMut, stats: &portico_core::stats::ListenerSlot) -> Option<ReqBody> {
        match *self {
            Intake::Empty => Some(ReqBody::InHand(Bytes::new())),
            Intake::Whole { len, buffering } if buf.len() as u64 >= len => {
                if buffering {
                    stats.bodies_buffered_in_memory.inc();
                }
                Some(ReqBody::InHand(buf.split_to(len as usize).freeze()))
            }
            _ => None,
        }
    }

    /// Checks a body read whole (`Whole`: in hand, never through a streaming read) against the check a
    /// `limits` filter put on `head`; a body taken any other way was checked as it was read.
    pub fn check_whole(&self, body: ReqBody, head: &crate::codec::RequestHead) -> Result<ReqBody, BufferFault> {
        if let (Intake::Whole { .. }, ReqBody::InHand(bytes)) = (self, &body) {
            if let Some(check) = crate::body_check::BodyCheck::of(head) {
                check.feed(bytes).map_err(|r| BufferFault::Source(SourceFault::Refused(r)))?;
            }
        }
        Ok(body)
    }

    /// Takes the body from `src` (`buf` holds what was read already) under `pace`; `read_framing` is how to
    /// read it (frames end a body of unknown length). A body read whole is in hand, and `head` then declares
    /// its length. A buffered body is counted in `stats` (the listener's slot of this worker).
    pub async fn take<R: AsyncRead + Unpin>(
        self,
        src: &mut R,
        buf: &mut BytesMut,
        head: &mut crate::codec::RequestHead,
        (read_framing, mut pace): (BodyFraming, Pace),
        stats: &portico_core::stats::ListenerSlot,
    ) -> Result<ReqBody, BufferFault> {
        Ok(match self {
            Intake::Empty => ReqBody::InHand(Bytes::new()),
            Intake::Whole { len, .. } => {
                while (buf.len() as u64) < len {
                    if read_more(src, buf, &mut pace).await? == 0 {
                        return Err(BufferFault::Source(SourceFault::Closed));
                    }
                }
                return self.in_hand(buf, stats).ok_or(BufferFault::Source(SourceFault::Closed));
            }
            Intake::Buffer(policy) => {
                let buffered = read_body(src, buf, read_framing, policy, &mut pace).await?;
                match buffered {
                    Buffered::Memory(_) => stats.bodies_buffered_in_memory.inc(),
                    Buffered::File(_) => stats.bodies_buffered_to_file.inc(),
                }
                ReqBody::buffered(buffered, head)
            }
            Intake::Stream => ReqBody::Streaming(head.body),
        })
    }
}
