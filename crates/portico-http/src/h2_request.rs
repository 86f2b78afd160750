//! An HTTP/2 client's request as the `h2` crate hands it over: its body (`ClientBody`, an `http_body::Body`
//! that gives flow-control credit back as it is read) and the stream's response side (`Interim`), shared with
//! what answers the request so that a 1xx can go out before the final response.

use bytes::Bytes;
use h2::server::SendResponse;
use h2::RecvStream;
use hyper::body::{Body, Frame, SizeHint};
use hyper::header::{self, HeaderMap};
use std::pin::Pin;
use std::task::{ready, Context, Poll};

/// The stream's response side, shared with what answers it so that an upstream's 1xx can go out before the
/// final response (everything runs on the connection's task; each borrow is momentary).
pub(crate) type Interim = std::cell::RefCell<SendResponse<Bytes>>;

/// An HTTP/2 client's request body: DATA frames in order, then its trailers, if any.
pub(crate) struct ClientBody {
    recv: RecvStream,
    /// Bytes still announced by `content-length`, when the request has one.
    left: Option<u64>,
    data_done: bool,
}

impl ClientBody {
    pub fn new(recv: RecvStream, headers: &HeaderMap) -> ClientBody {
        // h2 itself refuses DATA that disagrees with `content-length`; here it only sizes the body.
        let left = headers.get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()?.parse().ok());
        ClientBody { recv, left, data_done: false }
    }
}

impl Body for ClientBody {
    type Data = Bytes;
    type Error = h2::Error;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, h2::Error>>> {
        let this = self.get_mut();
        if !this.data_done {
            match ready!(this.recv.poll_data(cx)) {
                Some(Ok(data)) => {
                    // The bytes are ours now: the client may send as many more.
                    let _ = this.recv.flow_control().release_capacity(data.len());
                    if let Some(left) = &mut this.left {
                        *left = left.saturating_sub(data.len() as u64);
                    }
                    return Poll::Ready(Some(Ok(Frame::data(data))));
                }
                Some(Err(e)) => return Poll::Ready(Some(Err(e))),
                None => this.data_done = true,
            }
        }
        match ready!(this.recv.poll_trailers(cx)) {
            Ok(Some(trailers)) => Poll::Ready(Some(Ok(Frame::trailers(trailers)))),
            Ok(None) => Poll::Ready(None),
            Err(e) => Poll::Ready(Some(Err(e))),
        }
    }

    fn is_end_stream(&self) -> bool {
        self.recv.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        match self.left {
            Some(n) => SizeHint::with_exact(n),
            None if self.recv.is_end_stream() => SizeHint::with_exact(0),
            None => SizeHint::default(),
        }
    }
}
