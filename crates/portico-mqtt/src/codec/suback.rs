//! SUBACK (specification 3.9): one reason code per topic filter of the SUBSCRIBE it answers.

use bytes::{BufMut, BytesMut};

use super::error::{DecodeError, EncodeError};
use super::packet_type::PacketType;
use super::properties::AckProperties;
use super::reason::ReasonCode;
use super::version::ProtocolVersion;
use super::wire::Reader;
use super::PacketId;

/// A SUBACK packet. Before v5 each code is a return code (the granted QoS or 0x80), mapped onto v5 codes
/// ([`ReasonCode::from_v3_suback_return_code`]); a v5 failure code is written to a v3 client as 0x80.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SubAck {
    pub packet_id: PacketId,
    /// In the order of the SUBSCRIBE's filters [MQTT-3.9.3-1].
    pub reasons: Vec<ReasonCode>,
    pub properties: AckProperties,
}

impl SubAck {
    pub(crate) fn decode(r: &mut Reader, version: ProtocolVersion) -> Result<SubAck, DecodeError> {
        let packet_id = r.packet_id()?;
        let properties = if version.is_v5() { AckProperties::decode(r)? } else { AckProperties::default() };
        let mut reasons = Vec::with_capacity(r.remaining());
        while !r.is_empty() {
            let code = r.u8()?;
            let reason = if version.is_v5() {
                ReasonCode::from_value(code).filter(|reason| reason.allowed_in(PacketType::SubAck))
            } else {
                ReasonCode::from_v3_suback_return_code(code)
            };
            reasons.push(reason.ok_or(DecodeError::InvalidReasonCode { code, packet: PacketType::SubAck })?);
        }
        Ok(SubAck { packet_id, reasons, properties })
    }

    pub(crate) fn body_len(&self, version: ProtocolVersion) -> Result<usize, EncodeError> {
        let properties = if version.is_v5() { self.properties.encoded_len()? } else { 0 };
        Ok(2 + properties + self.reasons.len())
    }

    pub(crate) fn write_body(&self, version: ProtocolVersion, out: &mut BytesMut) {
        out.put_u16(self.packet_id.get());
        if version.is_v5() {
            self.properties.write(out);
            out.extend(self.reasons.iter().map(|reason| reason.value()));
        } else {
            out.extend(self.reasons.iter().map(|reason| reason.to_v3_suback_return_code()));
        }
    }
}
