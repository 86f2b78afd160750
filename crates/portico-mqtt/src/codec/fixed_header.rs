//! The fixed header (specification 2.1): packet type, flags and Remaining Length, read before the body has
//! arrived so that a wrong type, wrong flags or an oversized packet are refused before anything is buffered.

use bytes::{BufMut, BytesMut};

use super::error::DecodeError;
use super::packet_type::PacketType;
use super::version::ProtocolVersion;
use super::wire::{put_var_int, read_var_int};

impl PacketType {
    fn from_nibble(value: u8, version: ProtocolVersion) -> Result<PacketType, DecodeError> {
        Ok(match value {
            1 => PacketType::Connect,
            2 => PacketType::ConnAck,
            3 => PacketType::Publish,
            4 => PacketType::PubAck,
            5 => PacketType::PubRec,
            6 => PacketType::PubRel,
            7 => PacketType::PubComp,
            8 => PacketType::Subscribe,
            9 => PacketType::SubAck,
            10 => PacketType::Unsubscribe,
            11 => PacketType::UnsubAck,
            12 => PacketType::PingReq,
            13 => PacketType::PingResp,
            14 => PacketType::Disconnect,
            15 if version.is_v5() => PacketType::Auth,
            other => return Err(DecodeError::ReservedPacketType(other)),
        })
    }

    /// The flags every packet but PUBLISH must carry (specification 2.1.3, table 2-2).
    pub(crate) fn required_flags(self) -> u8 {
        match self {
            PacketType::PubRel | PacketType::Subscribe | PacketType::Unsubscribe => 0b0010,
            _ => 0,
        }
    }
}

/// A parsed fixed header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct FixedHeader {
    pub packet_type: PacketType,
    pub flags: u8,
    /// Bytes of the fixed header itself: the first byte and the Remaining Length.
    pub header_len: usize,
    pub remaining_len: usize,
}

impl FixedHeader {
    /// The whole packet's size, the quantity [`parse`]'s maximum limits.
    pub fn packet_len(&self) -> usize {
        self.header_len + self.remaining_len
    }
}

/// The fixed header at the start of `buf`, or `None` while its Remaining Length is incomplete. Checks the type
/// and flags for `version` and that the packet fits in `max_packet_size` bytes (fixed header included, as v5's
/// Maximum Packet Size counts it).
pub(crate) fn parse(
    buf: &[u8],
    version: ProtocolVersion,
    max_packet_size: u32,
) -> Result<Option<FixedHeader>, DecodeError> {
    let Some(&first) = buf.first() else { return Ok(None) };
    let packet_type = PacketType::from_nibble(first >> 4, version)?;
    let flags = first & 0x0f;
    check_flags(packet_type, flags, version)?;
    let Some((remaining_len, len_bytes)) = read_var_int(&buf[1..])? else { return Ok(None) };
    let header = FixedHeader { packet_type, flags, header_len: 1 + len_bytes, remaining_len: remaining_len as usize };
    if header.packet_len() > max_packet_size as usize {
        return Err(DecodeError::PacketTooLarge { size: header.packet_len(), maximum: max_packet_size });
    }
    Ok(Some(header))
}

fn check_flags(packet: PacketType, flags: u8, version: ProtocolVersion) -> Result<(), DecodeError> {
    let invalid = || Err(DecodeError::InvalidFlags { packet, flags });
    if packet == PacketType::Publish {
        let qos = (flags >> 1) & 0b11;
        let dup = flags & 0b1000 != 0;
        if qos == 3 {
            return invalid(); // [MQTT-3.3.1-4]
        }
        // 3.1 only says DUP "applies to" QoS above 0; 3.1.1 and 5.0 make it a rule [MQTT-3.3.1-2].
        if dup && qos == 0 && version != ProtocolVersion::V3_1 {
            return invalid();
        }
        return Ok(());
    }
    let required = packet.required_flags();
    // 3.1 set DUP on a retried PUBREL, SUBSCRIBE or UNSUBSCRIBE; 3.1.1 fixed those flags [MQTT-3.6.1-1].
    let tolerated = if version == ProtocolVersion::V3_1 && required != 0 { 0b1000 } else { 0 };
    if flags & !tolerated != required {
        return invalid(); // [MQTT-2.1.3-1]
    }
    Ok(())
}

/// Writes a fixed header for a body of `remaining_len` bytes (at most `MAX_VAR_INT`, checked by the caller).
pub(crate) fn write(out: &mut BytesMut, packet_type: PacketType, flags: u8, remaining_len: u32) {
    out.put_u8(((packet_type as u8) << 4) | flags);
    put_var_int(out, remaining_len);
}

#[cfg(test)]
mod tests {
    use super::*;

    const V5: ProtocolVersion = ProtocolVersion::V5;

    #[test]
    fn needs_more_until_the_remaining_length_is_complete() {
        assert_eq!(parse(&[], V5, 1024), Ok(None));
        assert_eq!(parse(&[0x30], V5, 1024), Ok(None));
        assert_eq!(parse(&[0x30, 0x80], V5, 1024), Ok(None));
        let header = parse(&[0x30, 0x80, 0x01], V5, 1024).unwrap().unwrap();
        assert_eq!((header.header_len, header.remaining_len), (3, 128));
    }

    #[test]
    fn oversized_packet_is_refused_from_its_header_alone() {
        // 0x7f bytes of body plus 2 of header: 129 > 128, refused with nothing of the body present.
        assert_eq!(parse(&[0x30, 0x7f], V5, 128), Err(DecodeError::PacketTooLarge { size: 129, maximum: 128 }));
        assert!(parse(&[0x30, 0x7e], V5, 128).unwrap().is_some());
    }

    #[test]
    fn reserved_packet_types_are_refused() {
        assert_eq!(parse(&[0x00, 0x00], V5, 1024), Err(DecodeError::ReservedPacketType(0)));
        assert_eq!(parse(&[0xf0, 0x00], ProtocolVersion::V3_1_1, 1024), Err(DecodeError::ReservedPacketType(15)));
        assert!(parse(&[0xf0, 0x00], V5, 1024).unwrap().is_some());
    }

    #[test]
    fn reserved_flags_are_refused_mqtt_2_1_3_1() {
        for first in [0x11, 0x21, 0x42, 0x52, 0x60, 0x72, 0x80, 0x92, 0xa0, 0xb1, 0xc1, 0xd8, 0xe1, 0xf4] {
            let err = parse(&[first, 0x00], V5, 1024).unwrap_err();
            assert!(matches!(err, DecodeError::InvalidFlags { .. }), "{first:#04x}: {err:?}");
        }
        for first in [0x10, 0x20, 0x40, 0x50, 0x62, 0x70, 0x82, 0x90, 0xa2, 0xb0, 0xc0, 0xd0, 0xe0, 0xf0] {
            assert!(parse(&[first, 0x00], V5, 1024).is_ok(), "{first:#04x}");
        }
    }

    #[test]
    fn publish_qos_3_is_refused_mqtt_3_3_1_4() {
        assert!(matches!(parse(&[0x36, 0x00], V5, 1024), Err(DecodeError::InvalidFlags { .. })));
    }

    #[test]
    fn publish_dup_at_qos_0_is_refused_mqtt_3_3_1_2() {
        assert!(matches!(parse(&[0x38, 0x00], V5, 1024), Err(DecodeError::InvalidFlags { .. })));
        assert!(parse(&[0x38, 0x00], ProtocolVersion::V3_1, 1024).is_ok());
    }

    #[test]
    fn v3_1_tolerates_dup_on_retried_pubrel() {
        assert!(parse(&[0x6a, 0x02], ProtocolVersion::V3_1, 1024).is_ok());
        assert!(parse(&[0x6a, 0x02], ProtocolVersion::V3_1_1, 1024).is_err());
    }
}
