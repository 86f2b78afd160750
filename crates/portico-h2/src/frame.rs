//! HTTP/2 frames (RFC 9113 section 4 and 6): the 9-byte frame header, the frame types and flags, the error
//! codes, and writing the frames a server sends. Payloads are parsed where they are handled (`conn`), from the
//! read buffer, without copying.

use bytes::{BufMut, BytesMut};

/// The frame header's length.
pub(crate) const HEADER_LEN: usize = 9;

/// The largest frame payload a peer may announce as its maximum (2^24 - 1) and the smallest (2^14).
pub(crate) const MAX_FRAME_SIZE_LIMIT: u32 = (1 << 24) - 1;
pub(crate) const DEFAULT_MAX_FRAME_SIZE: u32 = 1 << 14;
/// The largest flow-control window (2^31 - 1).
pub(crate) const MAX_WINDOW: i64 = (1 << 31) - 1;
/// The window every connection and stream starts with.
pub(crate) const DEFAULT_WINDOW: u32 = 65_535;

pub(crate) const DATA: u8 = 0x0;
pub(crate) const HEADERS: u8 = 0x1;
pub(crate) const PRIORITY: u8 = 0x2;
pub(crate) const RST_STREAM: u8 = 0x3;
pub(crate) const SETTINGS: u8 = 0x4;
pub(crate) const PUSH_PROMISE: u8 = 0x5;
pub(crate) const PING: u8 = 0x6;
pub(crate) const GOAWAY: u8 = 0x7;
pub(crate) const WINDOW_UPDATE: u8 = 0x8;
pub(crate) const CONTINUATION: u8 = 0x9;

pub(crate) const END_STREAM: u8 = 0x1;
pub(crate) const ACK: u8 = 0x1;
pub(crate) const END_HEADERS: u8 = 0x4;
pub(crate) const PADDED: u8 = 0x8;
pub(crate) const PRIORITY_FLAG: u8 = 0x20;

pub(crate) const SETTINGS_HEADER_TABLE_SIZE: u16 = 0x1;
pub(crate) const SETTINGS_ENABLE_PUSH: u16 = 0x2;
pub(crate) const SETTINGS_MAX_CONCURRENT_STREAMS: u16 = 0x3;
pub(crate) const SETTINGS_INITIAL_WINDOW_SIZE: u16 = 0x4;
pub(crate) const SETTINGS_MAX_FRAME_SIZE: u16 = 0x5;
pub(crate) const SETTINGS_MAX_HEADER_LIST_SIZE: u16 = 0x6;

/// An HTTP/2 error code (RFC 9113 section 7), sent in RST_STREAM and GOAWAY frames.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Reason(pub u32);

impl Reason {
    pub const NO_ERROR: Reason = Reason(0x0);
    pub const PROTOCOL_ERROR: Reason = Reason(0x1);
    pub const INTERNAL_ERROR: Reason = Reason(0x2);
    pub const FLOW_CONTROL_ERROR: Reason = Reason(0x3);
    pub const SETTINGS_TIMEOUT: Reason = Reason(0x4);
    pub const STREAM_CLOSED: Reason = Reason(0x5);
    pub const FRAME_SIZE_ERROR: Reason = Reason(0x6);
    pub const REFUSED_STREAM: Reason = Reason(0x7);
    pub const CANCEL: Reason = Reason(0x8);
    pub const COMPRESSION_ERROR: Reason = Reason(0x9);
    pub const CONNECT_ERROR: Reason = Reason(0xa);
    pub const ENHANCE_YOUR_CALM: Reason = Reason(0xb);
    pub const INADEQUATE_SECURITY: Reason = Reason(0xc);
    pub const HTTP_1_1_REQUIRED: Reason = Reason(0xd);

    /// The code's name in RFC 9113, or `None` for one it does not define.
    pub fn name(self) -> Option<&'static str> {
        const NAMES: [&str; 14] = [
            "NO_ERROR",
            "PROTOCOL_ERROR",
            "INTERNAL_ERROR",
            "FLOW_CONTROL_ERROR",
            "SETTINGS_TIMEOUT",
            "STREAM_CLOSED",
            "FRAME_SIZE_ERROR",
            "REFUSED_STREAM",
            "CANCEL",
            "COMPRESSION_ERROR",
            "CONNECT_ERROR",
            "ENHANCE_YOUR_CALM",
            "INADEQUATE_SECURITY",
            "HTTP_1_1_REQUIRED",
        ];
        NAMES.get(self.0 as usize).copied()
    }
}

impl std::fmt::Debug for Reason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.name() {
            Some(name) => f.write_str(name),
            None => write!(f, "error code {:#x}", self.0),
        }
    }
}

impl std::fmt::Display for Reason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Debug::fmt(self, f)
    }
}

/// A frame's header, as read.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Head {
    pub length: u32,
    pub kind: u8,
    pub flags: u8,
    pub stream: u32,
}

impl Head {
    /// Reads a frame header from the first 9 bytes of `b` (the caller checked there are 9). The stream
    /// identifier's reserved bit is ignored, as RFC 9113 4.1 asks.
    pub fn parse(b: &[u8]) -> Head {
        Head {
            length: u32::from_be_bytes([0, b[0], b[1], b[2]]),
            kind: b[3],
            flags: b[4],
            stream: u32::from_be_bytes([b[5], b[6], b[7], b[8]]) & 0x7fff_ffff,
        }
    }
}

/// Writes a frame header.
pub(crate) fn put_head(out: &mut BytesMut, length: usize, kind: u8, flags: u8, stream: u32) {
    debug_assert!(length <= MAX_FRAME_SIZE_LIMIT as usize);
    let l = (length as u32).to_be_bytes();
    out.put_slice(&[l[1], l[2], l[3], kind, flags]);
    out.put_u32(stream);
}

/// Writes the length of a frame whose header starts at `at`, once its payload is written.
pub(crate) fn patch_length(out: &mut BytesMut, at: usize, length: usize) {
    let l = (length as u32).to_be_bytes();
    out[at..at + 3].copy_from_slice(&l[1..]);
}

pub(crate) fn put_settings(out: &mut BytesMut, settings: &[(u16, u32)]) {
    put_head(out, settings.len() * 6, SETTINGS, 0, 0);
    for &(id, value) in settings {
        out.put_u16(id);
        out.put_u32(value);
    }
}

pub(crate) fn put_settings_ack(out: &mut BytesMut) {
    put_head(out, 0, SETTINGS, ACK, 0);
}

pub(crate) fn put_ping(out: &mut BytesMut, ack: bool, payload: [u8; 8]) {
    put_head(out, 8, PING, if ack { ACK } else { 0 }, 0);
    out.put_slice(&payload);
}

pub(crate) fn put_window_update(out: &mut BytesMut, stream: u32, increment: u32) {
    put_head(out, 4, WINDOW_UPDATE, 0, stream);
    out.put_u32(increment);
}

pub(crate) fn put_rst_stream(out: &mut BytesMut, stream: u32, reason: Reason) {
    put_head(out, 4, RST_STREAM, 0, stream);
    out.put_u32(reason.0);
}

pub(crate) fn put_goaway(out: &mut BytesMut, last_stream: u32, reason: Reason, debug: &[u8]) {
    put_head(out, 8 + debug.len(), GOAWAY, 0, 0);
    out.put_u32(last_stream);
    out.put_u32(reason.0);
    out.put_slice(debug);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_written_header_reads_back() {
        let mut out = BytesMut::new();
        put_head(&mut out, 0x012345, HEADERS, END_HEADERS | END_STREAM, 7);
        let h = Head::parse(&out);
        assert_eq!((h.length, h.kind, h.flags, h.stream), (0x012345, HEADERS, 5, 7));
    }

    #[test]
    fn the_reserved_bit_is_ignored() {
        let h = Head::parse(&[0, 0, 4, 8, 0, 0x80, 0, 0, 3]);
        assert_eq!(h.stream, 3);
    }

    #[test]
    fn reasons_have_their_names() {
        assert_eq!(format!("{:?}", Reason::ENHANCE_YOUR_CALM), "ENHANCE_YOUR_CALM");
        assert_eq!(format!("{}", Reason(0x42)), "error code 0x42");
    }
}
