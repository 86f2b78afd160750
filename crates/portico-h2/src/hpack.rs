//! HPACK (RFC 7541), the header compression of HTTP/2: a decoder for the header blocks peers send and an
//! encoder for the ones Portico sends. Written by hand because it runs for every field of every HTTP/2 request:
//! the decoder hands each field to a callback as borrowed bytes (from the block, the tables or a reused
//! Huffman scratch buffer) and allocates only for the entries it inserts into its dynamic table; the encoder
//! keeps no table at all, finds static-table names with a `match` and writes raw literals.
//!
//! Errors are all of one kind for HTTP/2 (a connection error COMPRESSION_ERROR); `DecodeError` says which rule
//! was broken, for the logs.

use std::collections::VecDeque;

use bytes::{BufMut, BytesMut};

use crate::huffman;

/// Why a header block could not be decoded: always a connection error COMPRESSION_ERROR in HTTP/2.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    #[error("HPACK: the header block ends inside an integer")]
    TruncatedInteger,
    #[error("HPACK: an integer is longer than 5 continuation octets or above 2^32-1")]
    IntegerOverflow,
    #[error("HPACK: the header block ends inside a string literal")]
    TruncatedString,
    #[error("HPACK: index 0 (it refers to no entry)")]
    ZeroIndex,
    #[error("HPACK: index {index} is past the static and dynamic tables ({len} entries)")]
    IndexOutOfRange { index: usize, len: usize },
    #[error("HPACK: dynamic table size update to {size}, above the advertised SETTINGS_HEADER_TABLE_SIZE {max}")]
    TableSizeAboveLimit { size: usize, max: usize },
    #[error("HPACK: dynamic table size update after a field (allowed only at the start of a header block)")]
    SizeUpdateNotAtStart,
    #[error("HPACK: Huffman-coded string contains EOS")]
    HuffmanEos,
    #[error("HPACK: Huffman-coded string has more than 7 bits of padding")]
    HuffmanPaddingTooLong,
    #[error("HPACK: Huffman-coded string's padding is not all ones")]
    HuffmanPaddingNotOnes,
}

/// RFC 7541 Appendix A. Index `i` (1-based on the wire) is `STATIC_TABLE[i - 1]`.
static STATIC_TABLE: [(&[u8], &[u8]); 61] = [
    (b":authority", b""),
    (b":method", b"GET"),
    (b":method", b"POST"),
    (b":path", b"/"),
    (b":path", b"/index.html"),
    (b":scheme", b"http"),
    (b":scheme", b"https"),
    (b":status", b"200"),
    (b":status", b"204"),
    (b":status", b"206"),
    (b":status", b"304"),
    (b":status", b"400"),
    (b":status", b"404"),
    (b":status", b"500"),
    (b"accept-charset", b""),
    (b"accept-encoding", b"gzip, deflate"),
    (b"accept-language", b""),
    (b"accept-ranges", b""),
    (b"accept", b""),
    (b"access-control-allow-origin", b""),
    (b"age", b""),
    (b"allow", b""),
    (b"authorization", b""),
    (b"cache-control", b""),
    (b"content-disposition", b""),
    (b"content-encoding", b""),
    (b"content-language", b""),
    (b"content-length", b""),
    (b"content-location", b""),
    (b"content-range", b""),
    (b"content-type", b""),
    (b"cookie", b""),
    (b"date", b""),
    (b"etag", b""),
    (b"expect", b""),
    (b"expires", b""),
    (b"from", b""),
    (b"host", b""),
    (b"if-match", b""),
    (b"if-modified-since", b""),
    (b"if-none-match", b""),
    (b"if-range", b""),
    (b"if-unmodified-since", b""),
    (b"last-modified", b""),
    (b"link", b""),
    (b"location", b""),
    (b"max-forwards", b""),
    (b"proxy-authenticate", b""),
    (b"proxy-authorization", b""),
    (b"range", b""),
    (b"referer", b""),
    (b"refresh", b""),
    (b"retry-after", b""),
    (b"server", b""),
    (b"set-cookie", b""),
    (b"strict-transport-security", b""),
    (b"transfer-encoding", b""),
    (b"user-agent", b""),
    (b"vary", b""),
    (b"via", b""),
    (b"www-authenticate", b""),
];

/// Scratch buffers larger than this after a block are dropped rather than kept: a peer's one huge Huffman
/// string should not stay allocated for the life of the connection.
const SCRATCH_KEEP: usize = 16 * 1024;

/// The RFC's overhead per dynamic-table entry, counted in the table's size on top of name and value.
const ENTRY_OVERHEAD: usize = 32;

/// One dynamic-table entry: name and value in one allocation.
struct Entry {
    bytes: Box<[u8]>,
    name_len: usize,
}

impl Entry {
    fn new(name: &[u8], value: &[u8]) -> Entry {
        let mut bytes = Vec::with_capacity(name.len() + value.len());
        bytes.extend_from_slice(name);
        bytes.extend_from_slice(value);
        Entry { bytes: bytes.into_boxed_slice(), name_len: name.len() }
    }

    fn field(&self) -> (&[u8], &[u8]) {
        self.bytes.split_at(self.name_len)
    }

    fn size(&self) -> usize {
        ENTRY_OVERHEAD + self.bytes.len()
    }
}

/// The decoder's dynamic table (RFC 7541 2.3.2, 4): newest entry first, evicted from the back by size.
struct Table {
    entries: VecDeque<Entry>,
    /// Sum of the entries' sizes (32 + name + value each).
    size: usize,
    /// The size the peer's encoder last set (or the advertised limit, before it set any).
    max_size: usize,
}

impl Table {
    fn get(&self, index: usize) -> Result<(&[u8], &[u8]), DecodeError> {
        match index {
            0 => Err(DecodeError::ZeroIndex),
            1..=61 => Ok(STATIC_TABLE[index - 1]),
            _ => match self.entries.get(index - 62) {
                Some(entry) => Ok(entry.field()),
                None => Err(DecodeError::IndexOutOfRange { index, len: 61 + self.entries.len() }),
            },
        }
    }

    /// Evicts from the oldest until `room` more bytes fit under `max_size`.
    fn evict_for(&mut self, room: usize) {
        while self.size + room > self.max_size {
            match self.entries.pop_back() {
                Some(entry) => self.size -= entry.size(),
                None => break,
            }
        }
    }

    /// Inserts a field of `size` (its RFC size), `entry` being `None` when it is larger than the table: then
    /// the table is emptied and nothing is added (RFC 7541 4.4).
    fn insert(&mut self, entry: Option<Entry>, size: usize) {
        self.evict_for(size);
        if let Some(entry) = entry {
            self.size += size;
            self.entries.push_front(entry);
        }
    }

    fn set_max_size(&mut self, max_size: usize) {
        self.max_size = max_size;
        self.evict_for(0);
    }
}

impl From<crate::huffman::HuffmanError> for DecodeError {
    fn from(e: crate::huffman::HuffmanError) -> DecodeError {
        match e {
            crate::huffman::HuffmanError::Eos => DecodeError::HuffmanEos,
            crate::huffman::HuffmanError::PaddingTooLong => DecodeError::HuffmanPaddingTooLong,
            crate::huffman::HuffmanError::PaddingNotOnes => DecodeError::HuffmanPaddingNotOnes,
        }
    }
}

/// Decodes the header blocks of one connection (one direction): the dynamic table lives across blocks.
pub struct Decoder {
    table: Table,
    /// SETTINGS_HEADER_TABLE_SIZE as this side advertised it: the peer may not set a larger table.
    max_table_size: usize,
    /// Huffman output for a name and for a value, kept between calls so that decoding does not allocate.
    name_buf: Vec<u8>,
    value_buf: Vec<u8>,
}

/// The table's figures, not its contents (which may hold cookies and credentials).
impl std::fmt::Debug for Decoder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Decoder")
            .field("entries", &self.table.entries.len())
            .field("size", &self.table.size)
            .field("table_max_size", &self.table.max_size)
            .field("max_table_size", &self.max_table_size)
            .finish()
    }
}

impl Decoder {
    /// `max_table_size`: the SETTINGS_HEADER_TABLE_SIZE this side advertised (4096 by default); dynamic
    /// table size updates above it are errors.
    ///
    /// The table starts at that size. Advertising less than the protocol's initial 4096 means the blocks a peer
    /// encoded before it saw our SETTINGS may refer to entries evicted here: that is an error
    /// (`IndexOutOfRange`), never a wrong field, since this table then always holds the newest part of the peer's.
    pub fn new(max_table_size: usize) -> Decoder {
        Decoder {
            table: Table { entries: VecDeque::new(), size: 0, max_size: max_table_size },
            max_table_size,
            name_buf: Vec::new(),
            value_buf: Vec::new(),
        }
    }

    /// Decodes one complete header block (all its HEADERS/CONTINUATION fragments joined), calling `field(name, value)` for each
    /// field in order. The whole block is always processed (so the dynamic table stays in step with the
    /// peer's) unless it is malformed, which is an error. Names and values are passed as decoded bytes: no case
    /// checks or validation here (the caller checks uppercase, pseudo-headers etc.).
    pub fn decode(&mut self, block: &[u8], mut field: impl FnMut(&[u8], &[u8])) -> Result<(), DecodeError> {
        let mut pos = 0;
        // Size updates are allowed only before the first field (RFC 7541 4.2), several in a row.
        let mut at_start = true;
        while let Some(&first) = block.get(pos) {
            if first & 0x80 != 0 {
                // 6.1 Indexed Header Field.
                let index = read_int(block, &mut pos, 7)?;
                let (name, value) = self.table.get(index)?;
                field(name, value);
            } else if first & 0x40 != 0 {
                // 6.2.1 Literal Header Field with Incremental Indexing.
                let index = read_int(block, &mut pos, 6)?;
                let name = match index {
                    0 => read_string(block, &mut pos, &mut self.name_buf)?,
                    _ => self.table.get(index)?.0,
                };
                let value = read_string(block, &mut pos, &mut self.value_buf)?;
                // Copied before the insertion evicts anything: the name may be an entry that it evicts (4.4).
                let size = ENTRY_OVERHEAD + name.len() + value.len();
                let entry = (size <= self.table.max_size).then(|| Entry::new(name, value));
                field(name, value);
                self.table.insert(entry, size);
            } else if first & 0x20 != 0 {
                // 6.3 Dynamic Table Size Update.
                if !at_start {
                    return Err(DecodeError::SizeUpdateNotAtStart);
                }
                let size = read_int(block, &mut pos, 5)?;
                if size > self.max_table_size {
                    return Err(DecodeError::TableSizeAboveLimit { size, max: self.max_table_size });
                }
                self.table.set_max_size(size);
                continue;
            } else {
                // 6.2.2 Literal Header Field without Indexing (0000) and 6.2.3 Never Indexed (0001): the same
                // to a decoder (the "never" matters to intermediaries that re-encode, which Portico does not
                // do with decoded blocks).
                let index = read_int(block, &mut pos, 4)?;
                let name = match index {
                    0 => read_string(block, &mut pos, &mut self.name_buf)?,
                    _ => self.table.get(index)?.0,
                };
                let value = read_string(block, &mut pos, &mut self.value_buf)?;
                field(name, value);
            }
            at_start = false;
        }
        if self.name_buf.capacity() > SCRATCH_KEEP {
            self.name_buf = Vec::new();
        }
        if self.value_buf.capacity() > SCRATCH_KEEP {
            self.value_buf = Vec::new();
        }
        Ok(())
    }

    /// The dynamic table, newest first, and its size: for the tests.
    #[cfg(test)]
    fn dynamic_table(&self) -> (Vec<(String, String)>, usize) {
        let entries = self
            .table
            .entries
            .iter()
            .map(|e| {
                let (n, v) = e.field();
                (String::from_utf8_lossy(n).into_owned(), String::from_utf8_lossy(v).into_owned())
            })
            .collect();
        (entries, self.table.size)
    }
}

/// Reads an integer with an N-bit prefix (RFC 7541 5.1) at `*pos`, moving `*pos` past it.
///
/// At most 5 continuation octets and values up to 2^32-1: more than any length, index or table size a block
/// can hold (the RFC lets a decoder set such limits), and no overflow to check inside the loop.
#[inline]
fn read_int(block: &[u8], pos: &mut usize, prefix_bits: u32) -> Result<usize, DecodeError> {
    let mask = ((1u32 << prefix_bits) - 1) as u8;
    let Some(&first) = block.get(*pos) else { return Err(DecodeError::TruncatedInteger) };
    *pos += 1;
    let prefix = first & mask;
    if prefix < mask {
        return Ok(usize::from(prefix));
    }
    let mut value = u64::from(mask);
    let mut shift = 0;
    loop {
        let Some(&byte) = block.get(*pos) else { return Err(DecodeError::TruncatedInteger) };
        *pos += 1;
        value += u64::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            break;
        }
        shift += 7;
        if shift > 28 {
            return Err(DecodeError::IntegerOverflow);
        }
    }
    u32::try_from(value).map(|v| v as usize).map_err(|_| DecodeError::IntegerOverflow)
}

/// Reads a string literal (RFC 7541 5.2) at `*pos`: the raw bytes borrowed from the block, or the Huffman
/// decoding in `scratch`.
#[inline]
fn read_string<'a>(block: &'a [u8], pos: &mut usize, scratch: &'a mut Vec<u8>) -> Result<&'a [u8], DecodeError> {
    let huffman = block.get(*pos).is_some_and(|&b| b & 0x80 != 0);
    let len = read_int(block, pos, 7)?;
    let start = *pos;
    if block.len() - start < len {
        return Err(DecodeError::TruncatedString);
    }
    *pos = start + len;
    let raw = &block[start..start + len];
    if huffman {
        scratch.clear();
        huffman::decode(raw, scratch)?;
        Ok(scratch)
    } else {
        Ok(raw)
    }
}

/// Appends an integer with an N-bit prefix (RFC 7541 5.1); `flags` are the representation's bits above the prefix.
#[inline]
fn write_int(value: usize, prefix_bits: u32, flags: u8, dst: &mut BytesMut) {
    let mask = (1usize << prefix_bits) - 1;
    if value < mask {
        dst.put_u8(flags | value as u8);
        return;
    }
    dst.put_u8(flags | mask as u8);
    let mut rest = value - mask;
    while rest >= 0x80 {
        dst.put_u8(0x80 | (rest & 0x7f) as u8);
        rest >>= 7;
    }
    dst.put_u8(rest as u8);
}

/// Appends a raw (not Huffman-coded) string literal.
#[inline]
fn write_raw_string(s: &[u8], dst: &mut BytesMut) {
    write_int(s.len(), 7, 0, dst);
    dst.put_slice(s);
}

/// The static-table index of a field name (the first entry with that name), by length then bytes: a `match`
/// the compiler turns into a jump on the length and a few fixed-size compares, cheaper than hashing the name.
fn static_name_index(name: &[u8]) -> Option<usize> {
    match name.len() {
        3 => match name {
            b"age" => Some(21),
            b"via" => Some(60),
            _ => None,
        },
        4 => match name {
            b"date" => Some(33),
            b"etag" => Some(34),
            b"from" => Some(37),
            b"host" => Some(38),
            b"link" => Some(45),
            b"vary" => Some(59),
            _ => None,
        },
        5 => match name {
            b":path" => Some(4),
            b"allow" => Some(22),
            b"range" => Some(50),
            _ => None,
        },
        6 => match name {
            b"accept" => Some(19),
            b"cookie" => Some(32),
            b"expect" => Some(35),
            b"server" => Some(54),
            _ => None,
        },
        7 => match name {
            b":method" => Some(2),
            b":scheme" => Some(6),
            b":status" => Some(8),
            b"expires" => Some(36),
            b"referer" => Some(51),
            b"refresh" => Some(52),
            _ => None,
        },
        8 => match name {
            b"if-match" => Some(39),
            b"if-range" => Some(42),
            b"location" => Some(46),
            _ => None,
        },
        10 => match name {
            b":authority" => Some(1),
            b"set-cookie" => Some(55),
            b"user-agent" => Some(58),
            _ => None,
        },
        11 => match name {
            b"retry-after" => Some(53),
            _ => None,
        },
        12 => match name {
            b"content-type" => Some(31),
            b"max-forwards" => Some(47),
            _ => None,
        },
        13 => match name {
            b"accept-ranges" => Some(18),
            b"authorization" => Some(23),
            b"cache-control" => Some(24),
            b"content-range" => Some(30),
            b"if-none-match" => Some(41),
            b"last-modified" => Some(44),
            _ => None,
        },
        14 => match name {
            b"accept-charset" => Some(15),
            b"content-length" => Some(28),
            _ => None,
        },
        15 => match name {
            b"accept-encoding" => Some(16),
            b"accept-language" => Some(17),
            _ => None,
        },
        16 => match name {
            b"content-encoding" => Some(26),
            b"content-language" => Some(27),
            b"content-location" => Some(29),
            b"www-authenticate" => Some(61),
            _ => None,
        },
        17 => match name {
            b"if-modified-since" => Some(40),
            b"transfer-encoding" => Some(57),
            _ => None,
        },
        18 => match name {
            b"proxy-authenticate" => Some(48),
            _ => None,
        },
        19 => match name {
            b"content-disposition" => Some(25),
            b"if-unmodified-since" => Some(43),
            b"proxy-authorization" => Some(49),
            _ => None,
        },
        25 => match name {
            b"strict-transport-security" => Some(56),
            _ => None,
        },
        27 => match name {
            b"access-control-allow-origin" => Some(20),
            _ => None,
        },
        _ => None,
    }
}

/// The most this side's encoder keeps in its dynamic table (never more than the peer allows): room for the
/// dozen or so fields that repeat on every response of a connection (`server`, `content-type`, `date`...).
pub const ENCODER_TABLE_SIZE: usize = 1024;

/// A dynamic table entry the encoder made: name and value.
type EncoderEntry = (Box<[u8]>, Box<[u8]>);

/// Encodes the header blocks Portico sends on one connection.
///
/// Fields that repeat from response to response (`server`, `content-type`, `date`, `cache-control`... the
/// `indexed_name` list) go into the dynamic table the first time and are then sent as a one-byte index, as
/// nginx and h2 do: on a small response that is most of its head. Everything else is a literal "without
/// indexing" (or "never indexed" when sensitive). The table's size is `ENCODER_TABLE_SIZE` or the peer's
/// SETTINGS_HEADER_TABLE_SIZE if lower; the first block announces it with a size update, and so does the
/// first block after the peer changes its setting (RFC 9113 4.3.1: decoders such as nghttp2's refuse a block
/// without one after lowering the size).
#[derive(Debug)]
pub struct Encoder {
    /// The size last announced to the peer (`None` before the first block).
    announced: Option<usize>,
    /// The peer's SETTINGS_HEADER_TABLE_SIZE.
    peer_limit: usize,
    /// The lowest value it took since the last block began.
    lowest: Option<usize>,
    /// Newest first, as the indices count.
    entries: std::collections::VecDeque<EncoderEntry>,
    size: usize,
}

impl Default for Encoder {
    fn default() -> Encoder {
        Encoder { announced: None, peer_limit: 4096, lowest: None, entries: Default::default(), size: 0 }
    }
}

impl Encoder {
    pub fn new() -> Encoder {
        Encoder::default()
    }

    /// The peer's SETTINGS_HEADER_TABLE_SIZE changed: the next block announces the new size.
    pub fn set_peer_limit(&mut self, limit: usize) {
        self.peer_limit = limit;
        self.lowest = Some(self.lowest.map_or(limit, |low| low.min(limit)));
    }

    fn limit(&self) -> usize {
        ENCODER_TABLE_SIZE.min(self.peer_limit)
    }

    /// Starts a header block: writes the table size update owed, if any. Call before the block's fields.
    pub fn begin_block(&mut self, dst: &mut BytesMut) {
        let limit = self.limit();
        // RFC 7541 4.2: when the peer's limit went lower in between, the lowest is announced first (its decoder
        // has evicted down to it), then the final one.
        if let Some(low) = self.lowest.take().map(|low| low.min(ENCODER_TABLE_SIZE)) {
            if low < limit && self.announced.is_some_and(|announced| low < announced) {
                self.announced = Some(low);
                self.evict_to(low);
                write_int(low, 5, 0x20, dst);
            }
        }
        if self.announced != Some(limit) {
            self.announced = Some(limit);
            self.evict_to(limit);
            write_int(limit, 5, 0x20, dst);
        }
    }

    fn evict_to(&mut self, limit: usize) {
        while self.size > limit {
            let Some((name, value)) = self.entries.pop_back() else { break };
            self.size -= 32 + name.len() + value.len();
        }
    }

    /// Appends `:status` (indexed static entry for 200, 204, 206, 304, 400, 404, 500; otherwise a literal with name index 8).
    pub fn status(&mut self, status: u16, dst: &mut BytesMut) {
        let index = match status {
            200 => 8,
            204 => 9,
            206 => 10,
            304 => 11,
            400 => 12,
            404 => 13,
            500 => 14,
            _ => 0,
        };
        if index != 0 {
            dst.put_u8(0x80 | index);
            return;
        }
        // Literal without indexing, name index 8 (":status"), then the value's decimal digits.
        let mut digits = [0u8; 5];
        let mut start = digits.len();
        let mut n = status;
        loop {
            start -= 1;
            digits[start] = b'0' + (n % 10) as u8;
            n /= 10;
            if n == 0 {
                break;
            }
        }
        let value = &digits[start..];
        dst.reserve(2 + value.len());
        dst.put_u8(0x08);
        dst.put_u8(value.len() as u8);
        dst.put_slice(value);
    }

    /// Appends one field: an index when it is in the dynamic table, a literal with incremental indexing when its
    /// name is one that repeats (`indexed_name`), else a literal without indexing (RFC 7541 6.2.2), or "never
    /// indexed" (6.2.3) when `sensitive`. The name by its static-table index when it has one (names must be
    /// lower-case, as HTTP/2 requires: matched as given); values as raw (non-Huffman) strings.
    pub fn field(&mut self, name: &[u8], value: &[u8], sensitive: bool, dst: &mut BytesMut) {
        let entry_size = 32 + name.len() + value.len();
        let indexed = !sensitive && indexed_name(name) && entry_size <= self.limit() / 4;
        if indexed {
            if let Some(at) = self.entries.iter().position(|(n, v)| **n == *name && **v == *value) {
                write_int(62 + at, 7, 0x80, dst);
                return;
            }
        }
        // Each integer takes at most 1 + 5 octets.
        dst.reserve(name.len() + value.len() + 3 * 6);
        let (prefix, flags) = match (indexed, sensitive) {
            (true, _) => (6, 0x40),
            (false, true) => (4, 0x10),
            (false, false) => (4, 0x00),
        };
        match static_name_index(name) {
            Some(index) => write_int(index, prefix, flags, dst),
            None => {
                dst.put_u8(flags);
                write_raw_string(name, dst);
            }
        }
        write_raw_string(value, dst);
        if indexed {
            self.entries.push_front((name.into(), value.into()));
            self.size += entry_size;
            let limit = self.limit();
            self.evict_to(limit);
        }
    }
}

/// Response fields whose values usually repeat on a connection: worth a place in the dynamic table.
fn indexed_name(name: &[u8]) -> bool {
    matches!(
        name,
        b"server"
            | b"content-type"
            | b"date"
            | b"cache-control"
            | b"vary"
            | b"via"
            | b"accept-ranges"
            | b"content-encoding"
            | b"content-language"
            | b"x-content-type-options"
            | b"x-frame-options"
            | b"strict-transport-security"
            | b"access-control-allow-origin"
            | b"access-control-allow-credentials"
            | b"alt-svc"
            | b"referrer-policy"
            | b"grpc-encoding"
            | b"grpc-accept-encoding"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(s: &str) -> Vec<u8> {
        let s: String = s.split_whitespace().collect();
        (0..s.len()).step_by(2).map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap()).collect()
    }

    type Fields = Vec<(Vec<u8>, Vec<u8>)>;

    fn decode(decoder: &mut Decoder, block: &[u8]) -> Result<Fields, DecodeError> {
        let mut fields = Vec::new();
        decoder.decode(block, |n, v| fields.push((n.to_vec(), v.to_vec())))?;
        Ok(fields)
    }

    fn owned(fields: &[(&str, &str)]) -> Fields {
        fields.iter().map(|(n, v)| (n.as_bytes().to_vec(), v.as_bytes().to_vec())).collect()
    }

    /// Decodes `block` and checks the fields, then the dynamic table (newest first) and its size.
    fn check(decoder: &mut Decoder, block: &str, fields: &[(&str, &str)], table: &[(&str, &str)], size: usize) {
        assert_eq!(decode(decoder, &hex(block)).unwrap(), owned(fields));
        let (entries, got_size) = decoder.dynamic_table();
        let want: Vec<(String, String)> = table.iter().map(|(n, v)| (n.to_string(), v.to_string())).collect();
        assert_eq!(entries, want);
        assert_eq!(got_size, size);
        // The RFC's size: 32 + name + value per entry.
        assert_eq!(size, table.iter().map(|(n, v)| 32 + n.len() + v.len()).sum::<usize>());
    }

    fn write(value: usize, prefix: u32, flags: u8) -> Vec<u8> {
        let mut dst = BytesMut::new();
        write_int(value, prefix, flags, &mut dst);
        dst.to_vec()
    }

    fn read(src: &[u8], prefix: u32) -> Result<usize, DecodeError> {
        let mut pos = 0;
        let v = read_int(src, &mut pos, prefix)?;
        assert_eq!(pos, src.len(), "the integer is the whole input");
        Ok(v)
    }

    // ---- RFC 7541 Appendix C ----

    #[test]
    fn c1_integers() {
        // C.1.1: 10 with a 5-bit prefix (the 3 bits above it are not the integer's).
        assert_eq!(write(10, 5, 0xa0), [0xaa]);
        assert_eq!(read(&[0xaa], 5), Ok(10));
        // C.1.2: 1337 with a 5-bit prefix.
        assert_eq!(write(1337, 5, 0), [0x1f, 0x9a, 0x0a]);
        assert_eq!(read(&[0xff, 0x9a, 0x0a], 5), Ok(1337));
        // C.1.3: 42 starting at an octet boundary (8-bit prefix).
        assert_eq!(write(42, 8, 0), [0x2a]);
        assert_eq!(read(&[0x2a], 8), Ok(42));
        // The prefix's maximum itself needs a continuation octet of 0.
        assert_eq!(write(31, 5, 0), [0x1f, 0x00]);
        assert_eq!(read(&[0x1f, 0x00], 5), Ok(31));
        for prefix in 1..=8 {
            for v in [0, 1, 126, 127, 128, 254, 255, 256, 16_383, 16_384, 1 << 21, u32::MAX as usize] {
                assert_eq!(read(&write(v, prefix, 0), prefix), Ok(v), "{v} in {prefix} bits");
            }
        }
    }

    #[test]
    fn c2_1_literal_with_indexing() {
        let mut d = Decoder::new(4096);
        check(
            &mut d,
            "400a 6375 7374 6f6d 2d6b 6579 0d63 7573 746f 6d2d 6865 6164 6572",
            &[("custom-key", "custom-header")],
            &[("custom-key", "custom-header")],
            55,
        );
    }

    #[test]
    fn c2_2_literal_without_indexing() {
        let mut d = Decoder::new(4096);
        check(&mut d, "040c 2f73 616d 706c 652f 7061 7468", &[(":path", "/sample/path")], &[], 0);
    }

    #[test]
    fn c2_3_literal_never_indexed() {
        let mut d = Decoder::new(4096);
        check(&mut d, "1008 7061 7373 776f 7264 0673 6563 7265 74", &[("password", "secret")], &[], 0);
    }

    #[test]
    fn c2_4_indexed() {
        let mut d = Decoder::new(4096);
        check(&mut d, "82", &[(":method", "GET")], &[], 0);
    }

    const REQ1: [(&str, &str); 4] =
        [(":method", "GET"), (":scheme", "http"), (":path", "/"), (":authority", "www.example.com")];
    const REQ2: [(&str, &str); 5] = [
        (":method", "GET"),
        (":scheme", "http"),
        (":path", "/"),
        (":authority", "www.example.com"),
        ("cache-control", "no-cache"),
    ];
    const REQ3: [(&str, &str); 5] = [
        (":method", "GET"),
        (":scheme", "https"),
        (":path", "/index.html"),
        (":authority", "www.example.com"),
        ("custom-key", "custom-value"),
    ];

    fn requests(blocks: [&str; 3]) {
        let mut d = Decoder::new(4096);
        check(&mut d, blocks[0], &REQ1, &[(":authority", "www.example.com")], 57);
        check(&mut d, blocks[1], &REQ2, &[("cache-control", "no-cache"), (":authority", "www.example.com")], 110);
        check(
            &mut d,
            blocks[2],
            &REQ3,
            &[("custom-key", "custom-value"), ("cache-control", "no-cache"), (":authority", "www.example.com")],
            164,
        );
    }

    #[test]
    fn c3_requests_without_huffman() {
        requests([
            "8286 8441 0f77 7777 2e65 7861 6d70 6c65 2e63 6f6d",
            "8286 84be 5808 6e6f 2d63 6163 6865",
            "8287 85bf 400a 6375 7374 6f6d 2d6b 6579 0c63 7573 746f 6d2d 7661 6c75 65",
        ]);
    }

    #[test]
    fn c4_requests_with_huffman() {
        requests([
            "8286 8441 8cf1 e3c2 e5f2 3a6b a0ab 90f4 ff",
            "8286 84be 5886 a8eb 1064 9cbf",
            "8287 85bf 4088 25a8 49e9 5ba9 7d7f 8925 a849 e95b b8e8 b4bf",
        ]);
    }

    const DATE1: &str = "Mon, 21 Oct 2013 20:13:21 GMT";
    const DATE2: &str = "Mon, 21 Oct 2013 20:13:22 GMT";
    const LOCATION: &str = "https://www.example.com";
    const COOKIE: &str = "foo=ASDJKHQKBZXOQWEOPIUAXQWEOIU; max-age=3600; version=1";

    fn responses(blocks: [&str; 3]) {
        let mut d = Decoder::new(256);
        check(
            &mut d,
            blocks[0],
            &[(":status", "302"), ("cache-control", "private"), ("date", DATE1), ("location", LOCATION)],
            &[("location", LOCATION), ("date", DATE1), ("cache-control", "private"), (":status", "302")],
            222,
        );
        // ":status: 307" evicts ":status: 302".
        check(
            &mut d,
            blocks[1],
            &[(":status", "307"), ("cache-control", "private"), ("date", DATE1), ("location", LOCATION)],
            &[(":status", "307"), ("location", LOCATION), ("date", DATE1), ("cache-control", "private")],
            222,
        );
        // Its three insertions evict all four older entries.
        check(
            &mut d,
            blocks[2],
            &[
                (":status", "200"),
                ("cache-control", "private"),
                ("date", DATE2),
                ("location", LOCATION),
                ("content-encoding", "gzip"),
                ("set-cookie", COOKIE),
            ],
            &[("set-cookie", COOKIE), ("content-encoding", "gzip"), ("date", DATE2)],
            215,
        );
    }

    #[test]
    fn c5_responses_without_huffman() {
        responses([
            "4803 3330 3258 0770 7269 7661 7465 611d 4d6f 6e2c 2032 3120 4f63 7420 3230 3133 2032 303a 3133 3a32 \
             3120 474d 546e 1768 7474 7073 3a2f 2f77 7777 2e65 7861 6d70 6c65 2e63 6f6d",
            "4803 3330 37c1 c0bf",
            "88c1 611d 4d6f 6e2c 2032 3120 4f63 7420 3230 3133 2032 303a 3133 3a32 3220 474d 54c0 5a04 677a 6970 \
             7738 666f 6f3d 4153 444a 4b48 514b 425a 584f 5157 454f 5049 5541 5851 5745 4f49 553b 206d 6178 2d61 \
             6765 3d33 3630 303b 2076 6572 7369 6f6e 3d31",
        ]);
    }

    #[test]
    fn c6_responses_with_huffman() {
        responses([
            "4882 6402 5885 aec3 771a 4b61 96d0 7abe 9410 54d4 44a8 2005 9504 0b81 66e0 82a6 2d1b ff6e 919d 29ad \
             1718 63c7 8f0b 97c8 e9ae 82ae 43d3",
            "4883 640e ffc1 c0bf",
            "88c1 6196 d07a be94 1054 d444 a820 0595 040b 8166 e084 a62d 1bff c05a 839b d9ab 77ad 94e7 821d d7f2 \
             e6c7 b335 dfdf cd5b 3960 d5af 2708 7f36 72c1 ab27 0fb5 291f 9587 3160 65c0 03ed 4ee5 b106 3d50 07",
        ]);
    }
    // ---- errors ----

    fn err(max: usize, block: &[u8]) -> DecodeError {
        decode(&mut Decoder::new(max), block).unwrap_err()
    }

    #[test]
    fn index_zero_is_an_error() {
        assert_eq!(err(4096, &[0x80]), DecodeError::ZeroIndex);
    }

    #[test]
    fn index_past_the_tables_is_an_error() {
        // 62 is the first dynamic entry: there is none yet.
        assert_eq!(err(4096, &[0xbe]), DecodeError::IndexOutOfRange { index: 62, len: 61 });
        // As a name reference too (literal with indexing, name index 70, value "a").
        assert_eq!(err(4096, &[0x7f, 0x07, 0x01, b'a']), DecodeError::IndexOutOfRange { index: 70, len: 61 });
        // With one dynamic entry, 62 is fine and 63 is not.
        let mut d = Decoder::new(4096);
        decode(&mut d, &hex("400a 6375 7374 6f6d 2d6b 6579 0d63 7573 746f 6d2d 6865 6164 6572")).unwrap();
        assert_eq!(decode(&mut d, &[0xbe]).unwrap(), owned(&[("custom-key", "custom-header")]));
        assert_eq!(decode(&mut d, &[0xbf]), Err(DecodeError::IndexOutOfRange { index: 63, len: 62 }));
    }

    #[test]
    fn truncated_integers_and_strings_are_errors() {
        // Index 127+ with its continuation octet missing, or ending on a continuation bit.
        assert_eq!(err(4096, &[0xff]), DecodeError::TruncatedInteger);
        assert_eq!(err(4096, &[0xff, 0x80]), DecodeError::TruncatedInteger);
        // A name index without a value.
        assert_eq!(err(4096, &[0x04]), DecodeError::TruncatedInteger);
        // A literal name without its length.
        assert_eq!(err(4096, &[0x40]), DecodeError::TruncatedInteger);
        // Strings shorter than their length: the name, then the value.
        assert_eq!(err(4096, &[0x40, 0x05, b'a']), DecodeError::TruncatedString);
        assert_eq!(err(4096, &[0x04, 0x03, b'/', b'a']), DecodeError::TruncatedString);
        assert_eq!(err(4096, &[0x04, 0x83, 0xff]), DecodeError::TruncatedString);
        // A length far past the block.
        assert_eq!(err(4096, &[0x04, 0x7f, 0xff, 0xff, 0xff, 0x0f]), DecodeError::TruncatedString);
    }

    #[test]
    fn overlong_integers_are_errors() {
        // Ten continuation octets.
        let mut block = vec![0xff];
        block.extend([0x80; 10]);
        block.push(0x00);
        assert_eq!(err(4096, &block), DecodeError::IntegerOverflow);
        // Six continuation octets even if they add up to little.
        assert_eq!(err(4096, &[0xff, 0x80, 0x80, 0x80, 0x80, 0x80, 0x00]), DecodeError::IntegerOverflow);
        // Five continuation octets, but above 2^32-1.
        assert_eq!(err(4096, &[0xff, 0xff, 0xff, 0xff, 0xff, 0x7f]), DecodeError::IntegerOverflow);
        // Five continuation octets with a small value are fine (here: an index out of range).
        assert!(matches!(
            err(4096, &[0xff, 0x80, 0x80, 0x80, 0x80, 0x00]),
            DecodeError::IndexOutOfRange { index: 127, .. }
        ));
        assert_eq!(read(&[0x7f, 0x80, 0xff, 0xff, 0xff, 0x0f], 7), Ok(u32::MAX as usize));
    }

    #[test]
    fn size_update_above_the_limit_is_an_error() {
        let mut block = Vec::new();
        let mut buf = BytesMut::new();
        write_int(4097, 5, 0x20, &mut buf);
        block.extend_from_slice(&buf);
        assert_eq!(err(4096, &block), DecodeError::TableSizeAboveLimit { size: 4097, max: 4096 });
        assert_eq!(err(0, &[0x21]), DecodeError::TableSizeAboveLimit { size: 1, max: 0 });
        // At the limit is fine.
        let mut d = Decoder::new(4096);
        buf.clear();
        write_int(4096, 5, 0x20, &mut buf);
        assert_eq!(decode(&mut d, &buf).unwrap(), owned(&[]));
    }

    #[test]
    fn size_update_after_a_field_is_an_error() {
        assert_eq!(err(4096, &[0x82, 0x20]), DecodeError::SizeUpdateNotAtStart);
        assert_eq!(err(4096, &[0x20, 0x82, 0x3f, 0xe1, 0x1f]), DecodeError::SizeUpdateNotAtStart);
        // At the start of the next block it is fine again.
        let mut d = Decoder::new(4096);
        decode(&mut d, &[0x82]).unwrap();
        assert_eq!(decode(&mut d, &[0x20, 0x82]).unwrap(), owned(&[(":method", "GET")]));
    }

    #[test]
    fn bad_huffman_in_a_block_is_an_error() {
        // Literal name (Huffman, 1 octet 0xff: 8 bits of padding).
        assert_eq!(err(4096, &[0x00, 0x81, 0xff, 0x00]), DecodeError::HuffmanPaddingTooLong);
        // Value 'a' then padding 110.
        assert_eq!(err(4096, &[0x04, 0x81, 0x1e]), DecodeError::HuffmanPaddingNotOnes);
        // Value with EOS.
        assert_eq!(err(4096, &[0x04, 0x84, 0xff, 0xff, 0xff, 0xff]), DecodeError::HuffmanEos);
    }

    // ---- the dynamic table ----

    #[test]
    fn several_size_updates_at_the_start() {
        let mut d = Decoder::new(4096);
        decode(&mut d, &hex("8286 8441 0f77 7777 2e65 7861 6d70 6c65 2e63 6f6d")).unwrap();
        // To 0 (which empties the table), then back to 4096, then a field.
        assert_eq!(decode(&mut d, &[0x20, 0x3f, 0xe1, 0x1f, 0x82]).unwrap(), owned(&[(":method", "GET")]));
        assert_eq!(d.dynamic_table(), (vec![], 0));
        assert_eq!(decode(&mut d, &[0xbe]), Err(DecodeError::IndexOutOfRange { index: 62, len: 61 }));
    }

    #[test]
    fn size_update_evicts_the_oldest() {
        let mut d = Decoder::new(4096);
        requests_c3_into(&mut d);
        // 164 bytes in three entries; down to 110 keeps the newest two (54 + 53 = 107).
        let mut buf = BytesMut::new();
        write_int(110, 5, 0x20, &mut buf);
        decode(&mut d, &buf).unwrap();
        let (entries, size) = d.dynamic_table();
        assert_eq!(entries.len(), 2);
        assert_eq!(entries[0].0, "custom-key");
        assert_eq!(size, 107);
        // And a table at size 0 inserts nothing.
        decode(&mut d, &[0x20]).unwrap();
        decode(&mut d, &hex("400a 6375 7374 6f6d 2d6b 6579 0d63 7573 746f 6d2d 6865 6164 6572")).unwrap();
        assert_eq!(d.dynamic_table(), (vec![], 0));
    }

    fn requests_c3_into(d: &mut Decoder) {
        for block in [
            "8286 8441 0f77 7777 2e65 7861 6d70 6c65 2e63 6f6d",
            "8286 84be 5808 6e6f 2d63 6163 6865",
            "8287 85bf 400a 6375 7374 6f6d 2d6b 6579 0c63 7573 746f 6d2d 7661 6c75 65",
        ] {
            decode(d, &hex(block)).unwrap();
        }
    }

    #[test]
    fn an_entry_larger_than_the_table_empties_it() {
        let mut d = Decoder::new(64);
        decode(&mut d, &hex("400a 6375 7374 6f6d 2d6b 6579 0d63 7573 746f 6d2d 6865 6164 6572")).unwrap();
        assert_eq!(d.dynamic_table().1, 55);
        // "custom-key: " + 23 bytes = 65 > 64: delivered, not inserted, and the table is emptied.
        let mut block = vec![0x7e, 23];
        block.extend_from_slice(&[b'v'; 23]);
        let fields = decode(&mut d, &block).unwrap();
        assert_eq!(fields, vec![(b"custom-key".to_vec(), vec![b'v'; 23])]);
        assert_eq!(d.dynamic_table(), (vec![], 0));
    }

    #[test]
    fn a_new_entry_may_name_the_entry_it_evicts() {
        // RFC 7541 4.4: the name is taken before the eviction.
        let mut d = Decoder::new(60);
        decode(&mut d, &hex("400a 6375 7374 6f6d 2d6b 6579 0d63 7573 746f 6d2d 6865 6164 6572")).unwrap();
        let fields = decode(&mut d, &[0x7e, 0x01, b'x']).unwrap();
        assert_eq!(fields, owned(&[("custom-key", "x")]));
        assert_eq!(d.dynamic_table(), (vec![("custom-key".into(), "x".into())], 43));
    }

    #[test]
    fn a_failed_block_leaves_earlier_fields_delivered() {
        // Fields before the error have been passed on; the caller drops the connection anyway.
        let mut d = Decoder::new(4096);
        let mut seen = 0;
        assert_eq!(d.decode(&[0x82, 0x86, 0x80], |_, _| seen += 1), Err(DecodeError::ZeroIndex));
        assert_eq!(seen, 2);
    }

    // ---- the encoder ----

    fn encoded(f: impl FnOnce(&mut Encoder, &mut BytesMut)) -> Vec<u8> {
        let mut e = Encoder::new();
        let mut first = BytesMut::new();
        e.begin_block(&mut first);
        e.status(200, &mut first);
        // A size update to 1024 (31 + 993 in 5-bit-prefix form), then the status.
        assert_eq!(&first[..], [0x3f, 0xe1, 0x07, 0x88], "the first block starts with a size update");
        let mut dst = BytesMut::new();
        e.begin_block(&mut dst);
        f(&mut e, &mut dst);
        dst.to_vec()
    }

    #[test]
    fn repeated_fields_become_indices() {
        let mut e = Encoder::new();
        let mut d = Decoder::new(4096);
        let mut sizes = Vec::new();
        for _ in 0..3 {
            let mut block = BytesMut::new();
            e.begin_block(&mut block);
            e.status(200, &mut block);
            e.field(b"server", b"portico", false, &mut block);
            e.field(b"content-type", b"text/plain", false, &mut block);
            e.field(b"x-request-id", b"abc", false, &mut block);
            let fields = decode(&mut d, &block).unwrap();
            assert_eq!(
                fields,
                owned(&[
                    (":status", "200"),
                    ("server", "portico"),
                    ("content-type", "text/plain"),
                    ("x-request-id", "abc")
                ])
            );
            sizes.push(block.len());
        }
        // The second block: status, two one-byte indices, the unindexed literal.
        assert_eq!(sizes[1], 1 + 1 + 1 + (1 + 1 + 12 + 1 + 3));
        assert_eq!(sizes[1], sizes[2]);
    }

    #[test]
    fn a_lower_peer_limit_is_announced_and_honoured() {
        let mut e = Encoder::new();
        let mut d = Decoder::new(4096);
        let mut block = BytesMut::new();
        e.begin_block(&mut block);
        e.field(b"server", b"portico", false, &mut block);
        decode(&mut d, &block).unwrap();
        // The peer says 0: the next block announces it, and nothing is indexed any more.
        e.set_peer_limit(0);
        for _ in 0..2 {
            let mut block = BytesMut::new();
            e.begin_block(&mut block);
            e.field(b"server", b"portico", false, &mut block);
            assert_eq!(decode(&mut d, &block).unwrap(), owned(&[("server", "portico")]));
        }
        assert_eq!(d.dynamic_table().1, 0);
        // Down to 0 and back up between two blocks: the decoder evicted everything at 0, so 0 is announced
        // first, then the new size, and nothing old is referred to.
        let mut e = Encoder::new();
        let mut d = Decoder::new(4096);
        let mut block = BytesMut::new();
        e.begin_block(&mut block);
        e.field(b"server", b"portico", false, &mut block);
        decode(&mut d, &block).unwrap();
        e.set_peer_limit(0);
        e.set_peer_limit(4096);
        let mut block = BytesMut::new();
        e.begin_block(&mut block);
        e.field(b"server", b"portico", false, &mut block);
        assert_eq!(&block[..2], [0x20, 0x3f], "size updates to 0, then to 1024");
        assert_eq!(decode(&mut d, &block).unwrap(), owned(&[("server", "portico")]));
        // A decoder that allows only 100 bytes never sees more.
        let mut e = Encoder::new();
        e.set_peer_limit(100);
        let mut d = Decoder::new(100);
        for i in 0..20 {
            let mut block = BytesMut::new();
            e.begin_block(&mut block);
            e.field(b"date", format!("day {i}").as_bytes(), false, &mut block);
            e.field(b"server", b"portico", false, &mut block);
            decode(&mut d, &block).unwrap();
            assert!(d.dynamic_table().1 <= 100);
        }
    }

    #[test]
    fn encoder_status() {
        for (status, index) in [(200, 8), (204, 9), (206, 10), (304, 11), (400, 12), (404, 13), (500, 14)] {
            assert_eq!(encoded(|e, d| e.status(status, d)), [0x80 | index]);
        }
        assert_eq!(encoded(|e, d| e.status(302, d)), b"\x08\x03302");
        assert_eq!(encoded(|e, d| e.status(0, d)), b"\x08\x010");
        assert_eq!(encoded(|e, d| e.status(u16::MAX, d)), b"\x08\x0565535");
    }

    #[test]
    fn encoder_fields() {
        // content-type is static index 31, indexed incrementally: 0x40 | 31.
        assert_eq!(encoded(|e, d| e.field(b"content-type", b"text/html", false, d)), b"\x5f\x09text/html");
        // A name that is not worth indexing: content-length (28) without indexing: 15 in the prefix, then 13.
        assert_eq!(encoded(|e, d| e.field(b"content-length", b"12", false, d)), b"\x0f\x0d\x0212");
        // :authority is index 1.
        assert_eq!(encoded(|e, d| e.field(b":authority", b"a", false, d)), b"\x01\x01a");
        // Never indexed: authorization (23).
        assert_eq!(encoded(|e, d| e.field(b"authorization", b"x", true, d)), b"\x1f\x08\x01x");
        // A name not in the static table, indexed never or not.
        assert_eq!(encoded(|e, d| e.field(b"x-id", b"7", false, d)), b"\x00\x04x-id\x017");
        assert_eq!(encoded(|e, d| e.field(b"x-id", b"7", true, d)), b"\x10\x04x-id\x017");
        // Names are matched as given: an upper-case one is a literal.
        assert_eq!(encoded(|e, d| e.field(b"Date", b"", false, d)), b"\x00\x04Date\x00");
        // A long value takes a multi-octet length.
        let value = vec![b'v'; 300];
        let out = encoded(|e, d| e.field(b"x", &value, false, d));
        assert_eq!(&out[..6], [0x00, 0x01, b'x', 0x7f, 0xad, 0x01]);
        assert_eq!(&out[6..], &value[..]);
    }

    #[test]
    fn static_name_index_matches_the_table() {
        for (i, (name, _)) in STATIC_TABLE.iter().enumerate() {
            let first = STATIC_TABLE.iter().position(|(n, _)| n == name).unwrap() + 1;
            assert_eq!(static_name_index(name), Some(first), "{}", String::from_utf8_lossy(name));
            assert!(first <= i + 1);
        }
        for name in [&b""[..], b"x", b"dates", b"Date", b":status2", b"content-typ", b"www-authenticatf"] {
            assert_eq!(static_name_index(name), None);
        }
    }

    /// A small deterministic generator (xorshift64*), so the generated tests need no dependency.
    struct Rng(u64);

    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
        }
        fn below(&mut self, n: usize) -> usize {
            (self.next() % n as u64) as usize
        }
        fn bytes(&mut self, max_len: usize, alphabet: &[u8]) -> Vec<u8> {
            let len = self.below(max_len + 1);
            (0..len).map(|_| alphabet[self.below(alphabet.len())]).collect()
        }
    }

    #[test]
    fn encoder_output_decodes_to_the_same_fields() {
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        let all_bytes: Vec<u8> = (0..=255).collect();
        let mut encoder = Encoder::new();
        let mut decoder = Decoder::new(4096);
        for _ in 0..500 {
            let mut dst = BytesMut::new();
            let mut want = Vec::new();
            if rng.below(20) == 0 {
                // The peer changes its table size now and then.
                encoder.set_peer_limit([0, 64, 300, 4096][rng.below(4)]);
            }
            encoder.begin_block(&mut dst);
            if rng.below(4) != 0 {
                let status = [200, 204, 206, 304, 400, 404, 500, 100, 101, 302, 429, 503, 999][rng.below(13)];
                encoder.status(status, &mut dst);
                want.push((b":status".to_vec(), status.to_string().into_bytes()));
            }
            for _ in 0..rng.below(20) {
                let name =
                    if rng.below(2) == 0 { STATIC_TABLE[rng.below(61)].0.to_vec() } else { rng.bytes(40, &all_bytes) };
                let max_len = if rng.below(10) == 0 { 5000 } else { 60 };
                let value = rng.bytes(max_len, &all_bytes);
                encoder.field(&name, &value, rng.below(3) == 0, &mut dst);
                want.push((name, value));
            }
            assert_eq!(decode(&mut decoder, &dst).unwrap(), want);
            // Both tables agree.
            let theirs = decoder.dynamic_table();
            assert_eq!(theirs.1, encoder.size);
            assert!(theirs.1 <= encoder.limit());
        }
    }

    // ---- against h2's encoder and decoder ----

    /// Through h2's public client and server (its HPACK module is private; its `unstable` feature would expose
    /// it, but also turns on debug assertions in h2 for every crate of the workspace under `cargo test`): the
    /// bytes h2 writes are tapped and their header blocks decoded here, and blocks encoded here are sent to an
    /// h2 client as a server's responses.
    mod h2_interop {
        use super::*;
        use bytes::Bytes;
        use http::{HeaderMap, HeaderName, HeaderValue, Method, Request, Response, StatusCode};
        use std::pin::Pin;
        use std::sync::{Arc, Mutex};
        use std::task::{Context, Poll};
        use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, DuplexStream, ReadBuf};

        const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

        /// One end of an in-memory connection that also records what is written to it.
        struct Tap {
            io: DuplexStream,
            log: Arc<Mutex<Vec<u8>>>,
        }

        impl AsyncRead for Tap {
            fn poll_read(
                mut self: Pin<&mut Self>,
                cx: &mut Context<'_>,
                buf: &mut ReadBuf<'_>,
            ) -> Poll<std::io::Result<()>> {
                Pin::new(&mut self.io).poll_read(cx, buf)
            }
        }

        impl AsyncWrite for Tap {
            fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
                let written = Pin::new(&mut self.io).poll_write(cx, buf);
                if let Poll::Ready(Ok(n)) = written {
                    self.log.lock().unwrap().extend_from_slice(&buf[..n]);
                }
                written
            }
            fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
                Pin::new(&mut self.io).poll_flush(cx)
            }
            fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
                Pin::new(&mut self.io).poll_shutdown(cx)
            }
        }

        fn run<F: std::future::Future>(f: F) -> F::Output {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            rt.block_on(async { tokio::time::timeout(std::time::Duration::from_secs(60), f).await.expect("in time") })
        }

        /// One HTTP/2 frame: type, flags, payload.
        struct RawFrame<'a> {
            kind: u8,
            flags: u8,
            payload: &'a [u8],
        }

        fn frames(mut wire: &[u8]) -> Vec<RawFrame<'_>> {
            let mut out = Vec::new();
            while !wire.is_empty() {
                let len = usize::from(wire[0]) << 16 | usize::from(wire[1]) << 8 | usize::from(wire[2]);
                out.push(RawFrame { kind: wire[3], flags: wire[4], payload: &wire[9..9 + len] });
                wire = &wire[9 + len..];
            }
            out
        }

        /// The header blocks in a connection's frames (HEADERS then CONTINUATIONs up to END_HEADERS, joined), and
        /// the number of CONTINUATION frames.
        fn header_blocks(wire: &[u8]) -> (Vec<Vec<u8>>, usize) {
            let (mut blocks, mut block, mut continuations) = (Vec::new(), Vec::new(), 0);
            for f in frames(wire) {
                let mut fragment = f.payload;
                match f.kind {
                    0x1 => {
                        if f.flags & 0x8 != 0 {
                            // PADDED: the pad length, and the padding at the end.
                            let pad = usize::from(fragment[0]);
                            fragment = &fragment[1..fragment.len() - pad];
                        }
                        if f.flags & 0x20 != 0 {
                            // PRIORITY: stream dependency and weight.
                            fragment = &fragment[5..];
                        }
                    }
                    0x9 => continuations += 1,
                    _ => continue,
                }
                block.extend_from_slice(fragment);
                if f.flags & 0x4 != 0 {
                    blocks.push(std::mem::take(&mut block));
                }
            }
            assert!(block.is_empty(), "a block without END_HEADERS");
            (blocks, continuations)
        }

        const NAMES: [&str; 16] = [
            "accept",
            "accept-encoding",
            "cache-control",
            "content-type",
            // Not content-length: h2 checks it against the body.
            "content-encoding",
            "cookie",
            "set-cookie",
            "authorization",
            "user-agent",
            "location",
            "etag",
            "x-request-id",
            "x-forwarded-for",
            "vary",
            "date",
            "grpc-status",
        ];

        /// A field value h2 accepts: visible ASCII, spaces and tabs inside, obs-text.
        fn value(rng: &mut Rng) -> HeaderValue {
            let alphabet: Vec<u8> = (0x20..0x7f).chain(0x80..=0xff).chain([b'\t']).collect();
            let max_len = if rng.below(8) == 0 { 600 } else { 40 };
            let mut v = rng.bytes(max_len, &alphabet);
            // No leading or trailing whitespace, as in real fields.
            while v.first().is_some_and(|b| *b == b' ' || *b == b'\t') {
                v.remove(0);
            }
            while v.last().is_some_and(|b| *b == b' ' || *b == b'\t') {
                v.pop();
            }
            HeaderValue::from_bytes(&v).unwrap()
        }

        fn name(rng: &mut Rng) -> HeaderName {
            if rng.below(3) == 0 {
                let mut n = b"x-".to_vec();
                n.extend(rng.bytes(20, b"abcdefghijklmnopqrstuvwxyz0123456789-_"));
                HeaderName::from_bytes(&n).unwrap()
            } else {
                HeaderName::from_static(NAMES[rng.below(NAMES.len())])
            }
        }

        /// Fields drawn with repeats (from a pool kept across blocks), so that h2 indexes and refers to entries;
        /// `huge`: sometimes a value too large for one frame.
        fn fields(rng: &mut Rng, pool: &mut Vec<(HeaderName, HeaderValue)>, huge: bool) -> HeaderMap {
            let mut map = HeaderMap::new();
            if huge && rng.below(20) == 0 {
                map.append("x-huge", HeaderValue::from_bytes(&rng.bytes(40_000, b"abcdefgh")).unwrap());
            }
            for _ in 0..rng.below(16) {
                let (n, mut v) = if !pool.is_empty() && rng.below(2) == 0 {
                    pool[rng.below(pool.len())].clone()
                } else {
                    let field = (name(rng), value(rng));
                    pool.push(field.clone());
                    field
                };
                v.set_sensitive(rng.below(8) == 0);
                map.append(n, v);
            }
            map
        }

        /// In the order h2 writes them: grouped by name, as `HeaderMap` iterates.
        fn map_fields(map: &HeaderMap) -> Fields {
            map.iter().map(|(n, v)| (n.as_str().as_bytes().to_vec(), v.as_bytes().to_vec())).collect()
        }

        fn field(name: &str, value: &str) -> (Vec<u8>, Vec<u8>) {
            (name.as_bytes().to_vec(), value.as_bytes().to_vec())
        }

        /// Runs `requests` from an h2 client to an h2 server that answers them with `responses`, both
        /// advertising `table` as SETTINGS_HEADER_TABLE_SIZE; returns what the client and the server wrote.
        async fn exchange(table: u32, requests: Vec<Request<()>>, responses: Vec<Response<()>>) -> (Vec<u8>, Vec<u8>) {
            let (client_io, server_io) = tokio::io::duplex(1 << 16);
            let (client_log, server_log) = (Arc::default(), Arc::default());
            let client = async {
                let tap = Tap { io: client_io, log: Arc::clone(&client_log) };
                let (mut send, conn) =
                    h2::client::Builder::new().header_table_size(table).handshake::<_, Bytes>(tap).await.unwrap();
                let requests = async move {
                    for request in requests {
                        send = send.ready().await.unwrap();
                        let (response, _) = send.send_request(request, true).unwrap();
                        response.await.unwrap();
                    }
                };
                let (conn, ()) = tokio::join!(conn, requests);
                conn.unwrap();
            };
            let server = async {
                let tap = Tap { io: server_io, log: Arc::clone(&server_log) };
                let mut conn = h2::server::Builder::new()
                    .header_table_size(table)
                    .max_header_list_size(1 << 20)
                    .handshake::<_, Bytes>(tap)
                    .await
                    .unwrap();
                let mut responses = responses.into_iter();
                while let Some(accepted) = conn.accept().await {
                    let (_, mut respond) = accepted.unwrap();
                    respond.send_response(responses.next().unwrap(), true).unwrap();
                }
            };
            tokio::join!(client, server);
            let take = |log: Arc<Mutex<Vec<u8>>>| std::mem::take(&mut *log.lock().unwrap());
            (take(client_log), take(server_log))
        }

        #[test]
        fn h2_encoded_blocks_decode_to_the_same_fields() {
            let mut rng = Rng(0x0123_4567_89ab_cdef);
            let (mut blocks_seen, mut continuations, mut inserted, mut size_updates) = (0, 0, 0, 0);
            for connection in 0..12 {
                // h2's encoders shrink their tables to what the other side advertises, with size updates.
                let table = [4096, 0, 256, 1024][connection % 4];
                let mut pool = Vec::new();
                let (mut requests, mut responses, mut want_requests, mut want_responses) =
                    (vec![], vec![], vec![], vec![]);
                for _ in 0..40 {
                    let method = [Method::GET, Method::POST, Method::PUT, Method::DELETE][rng.below(4)].clone();
                    let (scheme, authority, path) = [
                        ("https", "example.com", "/"),
                        ("http", "a.test", "/index.html?q=1"),
                        ("https", "b.test:8443", "/x/y"),
                    ][rng.below(3)];
                    let map = fields(&mut rng, &mut pool, true);
                    let mut want = vec![
                        field(":method", method.as_str()),
                        field(":scheme", scheme),
                        field(":authority", authority),
                        field(":path", path),
                    ];
                    want.extend(map_fields(&map));
                    want_requests.push(want);
                    let mut request = Request::builder()
                        .method(method)
                        .uri(format!("{scheme}://{authority}{path}"))
                        .body(())
                        .unwrap();
                    *request.headers_mut() = map;
                    requests.push(request);

                    let status = [200, 204, 206, 304, 400, 404, 500, 302, 429, 503][rng.below(10)];
                    let map = fields(&mut rng, &mut pool, true);
                    let mut want = vec![field(":status", &status.to_string())];
                    want.extend(map_fields(&map));
                    want_responses.push(want);
                    let mut response = Response::builder().status(status).body(()).unwrap();
                    *response.headers_mut() = map;
                    responses.push(response);
                }
                let (client_wire, server_wire) = run(exchange(table as u32, requests, responses));
                assert!(client_wire.starts_with(PREFACE));
                for (wire, want) in [(&client_wire[PREFACE.len()..], want_requests), (&server_wire[..], want_responses)]
                {
                    let (blocks, n) = header_blocks(wire);
                    continuations += n;
                    assert_eq!(blocks.len(), want.len());
                    // The peer may start at 4096 before it has our SETTINGS: the decoder allows that much.
                    let mut decoder = Decoder::new(4096);
                    for (i, (block, want)) in blocks.iter().zip(want).enumerate() {
                        size_updates += usize::from(block[0] & 0xe0 == 0x20);
                        let got = decode(&mut decoder, block)
                            .unwrap_or_else(|e| panic!("connection {connection} block {i}: {e}"));
                        assert_eq!(got, want, "connection {connection} block {i}");
                        inserted += decoder.dynamic_table().0.len();
                        blocks_seen += 1;
                    }
                }
            }
            // The test saw what it is meant to: blocks over several frames, size updates, and h2 indexing fields.
            assert_eq!(blocks_seen, 12 * 2 * 40);
            assert!(continuations > 10, "{continuations} CONTINUATION frames");
            assert!(size_updates > 5, "{size_updates} blocks with size updates");
            assert!(inserted > 1000, "{inserted}");
        }

        /// Plays an HTTP/2 server on `io` without h2: answers the client's SETTINGS, and each request (HEADERS on
        /// a new stream) with the next of `blocks` as its response; then says GOAWAY.
        async fn fake_server(mut io: DuplexStream, blocks: Vec<BytesMut>) {
            let mut preface = [0; PREFACE.len()];
            io.read_exact(&mut preface).await.unwrap();
            // Our SETTINGS (none changed).
            io.write_all(&[0, 0, 0, 0x4, 0, 0, 0, 0, 0]).await.unwrap();
            let mut blocks = blocks.into_iter();
            loop {
                let mut head = [0; 9];
                if io.read_exact(&mut head).await.is_err() {
                    return;
                }
                let mut payload =
                    vec![0; usize::from(head[0]) << 16 | usize::from(head[1]) << 8 | usize::from(head[2])];
                io.read_exact(&mut payload).await.unwrap();
                let (kind, flags) = (head[3], head[4]);
                match kind {
                    // SETTINGS: acknowledged.
                    0x4 if flags & 0x1 == 0 => io.write_all(&[0, 0, 0, 0x4, 0x1, 0, 0, 0, 0]).await.unwrap(),
                    // A request: one HEADERS frame, END_HEADERS | END_STREAM.
                    0x1 => {
                        let block = blocks.next().unwrap();
                        let len = block.len();
                        assert!(len < 1 << 14);
                        let mut frame = vec![(len >> 16) as u8, (len >> 8) as u8, len as u8, 0x1, 0x4 | 0x1];
                        // On the request's stream.
                        frame.extend_from_slice(&head[5..9]);
                        frame.extend_from_slice(&block);
                        io.write_all(&frame).await.unwrap();
                        if blocks.len() == 0 {
                            // The last one: GOAWAY (last stream this one, NO_ERROR), so that the client's connection ends.
                            let mut goaway = vec![0, 0, 8, 0x7, 0, 0, 0, 0, 0];
                            goaway.extend_from_slice(&head[5..9]);
                            goaway.extend_from_slice(&[0; 4]);
                            io.write_all(&goaway).await.unwrap();
                            return;
                        }
                    }
                    _ => {}
                }
            }
        }

        #[test]
        fn our_blocks_decode_with_h2() {
            let mut rng = Rng(0xfeed_f00d_dead_beef);
            let mut encoder = Encoder::new();
            let (mut blocks, mut want) = (Vec::new(), Vec::new());
            let mut pool = Vec::new();
            for _ in 0..200 {
                let mut block = BytesMut::new();
                let status = [200, 204, 206, 304, 400, 404, 500, 302, 429, 503][rng.below(10)];
                encoder.status(status, &mut block);
                let map = fields(&mut rng, &mut pool, false);
                for (n, v) in map.iter() {
                    encoder.field(n.as_str().as_bytes(), v.as_bytes(), v.is_sensitive(), &mut block);
                }
                want.push((status, map_fields(&map)));
                blocks.push(block);
            }
            let count = blocks.len();
            let responses = run(async move {
                let (client_io, server_io) = tokio::io::duplex(1 << 16);
                let client = async {
                    let (mut send, conn) = h2::client::handshake(client_io).await.unwrap();
                    let requests = async move {
                        let mut responses = Vec::new();
                        for _ in 0..count {
                            send = send.ready().await.unwrap();
                            let request = Request::get("https://example.com/").body(()).unwrap();
                            let (response, _) = send.send_request(request, true).unwrap();
                            responses.push(response.await.unwrap());
                        }
                        responses
                    };
                    let (conn, responses) = tokio::join!(conn, requests);
                    conn.unwrap();
                    responses
                };
                tokio::join!(client, fake_server(server_io, blocks)).0
            });
            for (i, (response, (status, fields))) in responses.iter().zip(want).enumerate() {
                assert_eq!(response.status(), StatusCode::from_u16(status).unwrap(), "block {i}");
                // h2's HeaderMap groups values by name: the same as the map we encoded from.
                assert_eq!(map_fields(response.headers()), fields, "block {i}");
            }
        }
    }
}
