//! The data representations of specification 1.5: integers, Variable Byte Integers, UTF-8 strings, binary
//! data. `Reader` takes them from a packet's body without copying; the `put_*` functions write them.

use std::num::NonZeroU16;

use bytes::{Buf, BufMut, Bytes, BytesMut};
use bytestring::ByteString;

use super::error::{DecodeError, EncodeError};
use super::packet_type::PacketType;
use super::reason::ReasonCode;

/// The largest value a Variable Byte Integer holds (four bytes of seven bits).
pub const MAX_VAR_INT: u32 = 268_435_455;

/// The Variable Byte Integer at the start of `bytes`, with the number of bytes it took; `None` when `bytes`
/// ends before it does. Refuses a fifth byte and, as [MQTT-1.5.5-1] requires, any encoding longer than the
/// shortest (3.1.1's algorithm in 2.2.3 produces only the shortest, so one rule serves every version).
pub fn read_var_int(bytes: &[u8]) -> Result<Option<(u32, usize)>, DecodeError> {
    let mut value = 0u32;
    for (i, &byte) in bytes.iter().enumerate() {
        if i == 4 {
            return Err(DecodeError::VarIntTooLong);
        }
        value |= u32::from(byte & 0x7f) << (7 * i);
        if byte & 0x80 == 0 {
            // A last byte of 0 after a first one adds nothing: a longer encoding than needed.
            if i > 0 && byte == 0 {
                return Err(DecodeError::VarIntNotMinimal);
            }
            return Ok(Some((value, i + 1)));
        }
    }
    if bytes.len() >= 4 {
        return Err(DecodeError::VarIntTooLong);
    }
    Ok(None)
}

/// How many bytes `value` takes as a Variable Byte Integer.
pub fn var_int_len(value: u32) -> usize {
    match value {
        0..=127 => 1,
        128..=16_383 => 2,
        16_384..=2_097_151 => 3,
        _ => 4,
    }
}

/// Writes `value` (at most [`MAX_VAR_INT`], checked by the caller's length pass) as a Variable Byte Integer.
pub fn put_var_int(out: &mut BytesMut, value: u32) {
    let mut rest = value;
    loop {
        let byte = (rest & 0x7f) as u8;
        rest >>= 7;
        if rest == 0 {
            out.put_u8(byte);
            return;
        }
        out.put_u8(byte | 0x80);
    }
}

/// The length of a string or binary field with its two-byte prefix; refuses more than 65,535 bytes.
pub fn field_len(bytes: &[u8]) -> Result<usize, EncodeError> {
    if bytes.len() > usize::from(u16::MAX) {
        return Err(EncodeError::FieldTooLong(bytes.len()));
    }
    Ok(2 + bytes.len())
}

/// Writes a string or binary field whose length [`field_len`] accepted.
pub fn put_field(out: &mut BytesMut, bytes: &[u8]) {
    out.put_u16(bytes.len() as u16);
    out.put_slice(bytes);
}

/// Checks an UTF-8 Encoded String's contents: well-formed (Rust's UTF-8 check also refuses the encodings of
/// UTF-16 surrogates U+D800..U+DFFF) [MQTT-1.5.4-1], and without U+0000 [MQTT-1.5.4-2]. A leading BOM is
/// kept as it is [MQTT-1.5.4-3].
pub fn check_utf8(bytes: Bytes) -> Result<ByteString, DecodeError> {
    if memchr::memchr(0, &bytes).is_some() {
        return Err(DecodeError::NullCharacter);
    }
    ByteString::try_from(bytes).map_err(|_| DecodeError::InvalidUtf8)
}

/// A packet's body, consumed from the front; every field it hands out shares the packet's buffer.
pub struct Reader {
    rest: Bytes,
    packet: PacketType,
}

impl Reader {
    pub fn new(body: Bytes, packet: PacketType) -> Reader {
        Reader { rest: body, packet }
    }

    pub fn packet(&self) -> PacketType {
        self.packet
    }

    pub fn is_empty(&self) -> bool {
        self.rest.is_empty()
    }

    pub fn remaining(&self) -> usize {
        self.rest.len()
    }

    fn need(&self, n: usize) -> Result<(), DecodeError> {
        if self.rest.len() < n {
            return Err(DecodeError::Truncated(self.packet));
        }
        Ok(())
    }

    pub fn u8(&mut self) -> Result<u8, DecodeError> {
        self.need(1)?;
        Ok(self.rest.get_u8())
    }

    pub fn u16(&mut self) -> Result<u16, DecodeError> {
        self.need(2)?;
        Ok(self.rest.get_u16())
    }

    pub fn u32(&mut self) -> Result<u32, DecodeError> {
        self.need(4)?;
        Ok(self.rest.get_u32())
    }

    pub fn var_int(&mut self) -> Result<u32, DecodeError> {
        match read_var_int(&self.rest)? {
            Some((value, len)) => {
                self.rest.advance(len);
                Ok(value)
            }
            None => Err(DecodeError::Truncated(self.packet)),
        }
    }

    /// A Packet Identifier, which is never 0 [MQTT-2.2.1-3].
    pub fn packet_id(&mut self) -> Result<NonZeroU16, DecodeError> {
        NonZeroU16::new(self.u16()?).ok_or(DecodeError::ZeroPacketId(self.packet))
    }

    /// The next `n` bytes, as a reader of their own.
    pub fn take(&mut self, n: usize) -> Result<Reader, DecodeError> {
        self.need(n)?;
        Ok(Reader { rest: self.rest.split_to(n), packet: self.packet })
    }

    /// Binary Data: a two-byte length and that many bytes.
    pub fn binary(&mut self) -> Result<Bytes, DecodeError> {
        let len = usize::from(self.u16()?);
        self.need(len)?;
        Ok(self.rest.split_to(len))
    }

    /// An UTF-8 Encoded String, checked by [`check_utf8`].
    pub fn utf8(&mut self) -> Result<ByteString, DecodeError> {
        check_utf8(self.binary()?)
    }

    /// Everything left (a PUBLISH payload).
    pub fn rest(&mut self) -> Bytes {
        std::mem::take(&mut self.rest)
    }

    /// Refuses bytes after the packet's last field.
    pub fn finish(&self) -> Result<(), DecodeError> {
        if !self.rest.is_empty() {
            return Err(DecodeError::TrailingBytes(self.packet));
        }
        Ok(())
    }
}

/// A v5 reason code read for `packet`: one the specification lets that packet carry, else the error that says so.
pub(crate) fn reason_code(code: u8, packet: PacketType) -> Result<ReasonCode, DecodeError> {
    ReasonCode::from_value(code)
        .filter(|reason| reason.allowed_in(packet))
        .ok_or(DecodeError::InvalidReasonCode { code, packet })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Specification 1.5.5, table 1-1: the bounds of each length of a Variable Byte Integer.
    const TABLE_1_1: &[(u32, &[u8])] = &[
        (0, &[0x00]),
        (127, &[0x7f]),
        (128, &[0x80, 0x01]),
        (16_383, &[0xff, 0x7f]),
        (16_384, &[0x80, 0x80, 0x01]),
        (2_097_151, &[0xff, 0xff, 0x7f]),
        (2_097_152, &[0x80, 0x80, 0x80, 0x01]),
        (268_435_455, &[0xff, 0xff, 0xff, 0x7f]),
    ];

    #[test]
    fn var_int_table_1_1_encodes_and_decodes() {
        for &(value, bytes) in TABLE_1_1 {
            let mut out = BytesMut::new();
            put_var_int(&mut out, value);
            assert_eq!(&out[..], bytes, "{value}");
            assert_eq!(var_int_len(value), bytes.len());
            assert_eq!(read_var_int(bytes), Ok(Some((value, bytes.len()))));
        }
    }

    #[test]
    fn var_int_needs_more_until_its_last_byte() {
        assert_eq!(read_var_int(&[]), Ok(None));
        assert_eq!(read_var_int(&[0x80]), Ok(None));
        assert_eq!(read_var_int(&[0xff, 0xff, 0xff]), Ok(None));
    }

    #[test]
    fn var_int_of_five_bytes_is_refused_mqtt_1_5_5() {
        assert_eq!(read_var_int(&[0xff, 0xff, 0xff, 0xff]), Err(DecodeError::VarIntTooLong));
        assert_eq!(read_var_int(&[0x80, 0x80, 0x80, 0x80, 0x01]), Err(DecodeError::VarIntTooLong));
    }

    #[test]
    fn var_int_longer_than_needed_is_refused_mqtt_1_5_5_1() {
        assert_eq!(read_var_int(&[0x80, 0x00]), Err(DecodeError::VarIntNotMinimal));
        assert_eq!(read_var_int(&[0xff, 0x80, 0x00]), Err(DecodeError::VarIntNotMinimal));
        assert_eq!(read_var_int(&[0x81, 0x80, 0x80, 0x00]), Err(DecodeError::VarIntNotMinimal));
    }

    /// Specification 1.5.4, figure 1-1: "A" then U+2A6D4.
    #[test]
    fn utf8_example_of_figure_1_1_decodes() {
        let body = Bytes::from_static(&[0x00, 0x05, 0x41, 0xf0, 0xaa, 0x9b, 0x94]);
        let mut reader = Reader::new(body, PacketType::Publish);
        assert_eq!(reader.utf8().unwrap(), "A\u{2A6D4}");
        assert!(reader.is_empty());
    }

    #[test]
    fn utf8_with_a_surrogate_is_refused_mqtt_1_5_4_1() {
        // U+D800 encoded as UTF-8 would be; UTF-8 forbids it.
        let body = Bytes::from_static(&[0x00, 0x03, 0xed, 0xa0, 0x80]);
        assert_eq!(Reader::new(body, PacketType::Publish).utf8(), Err(DecodeError::InvalidUtf8));
    }

    #[test]
    fn utf8_ill_formed_is_refused_mqtt_1_5_4_1() {
        for bad in [&[0x00, 0x01, 0xff][..], &[0x00, 0x02, 0xc0, 0x80], &[0x00, 0x01, 0xe2]] {
            let body = Bytes::copy_from_slice(bad);
            assert_eq!(Reader::new(body, PacketType::Publish).utf8(), Err(DecodeError::InvalidUtf8));
        }
    }

    #[test]
    fn utf8_with_u_0000_is_refused_mqtt_1_5_4_2() {
        let body = Bytes::from_static(&[0x00, 0x03, b'a', 0x00, b'b']);
        assert_eq!(Reader::new(body, PacketType::Publish).utf8(), Err(DecodeError::NullCharacter));
    }

    #[test]
    fn utf8_bom_is_kept_mqtt_1_5_4_3() {
        let body = Bytes::from_static(&[0x00, 0x04, 0xef, 0xbb, 0xbf, b'a']);
        assert_eq!(Reader::new(body, PacketType::Publish).utf8().unwrap(), "\u{feff}a");
    }

    #[test]
    fn a_field_past_the_end_is_truncated() {
        let body = Bytes::from_static(&[0x00, 0x05, b'a']);
        assert_eq!(Reader::new(body, PacketType::Publish).binary(), Err(DecodeError::Truncated(PacketType::Publish)));
    }
}
