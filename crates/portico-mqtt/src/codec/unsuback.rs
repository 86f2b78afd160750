//! UNSUBACK (specification 3.11): in v5 one reason code per topic filter; before v5 only the packet
//! identifier.

use bytes::{BufMut, BytesMut};

use super::error::{DecodeError, EncodeError};
use super::packet_type::PacketType;
use super::properties::AckProperties;
use super::reason::ReasonCode;
use super::version::ProtocolVersion;
use super::wire::{reason_code, Reader};
use super::PacketId;

/// An UNSUBACK packet. `reasons` and `properties` are v5's; before v5 they are empty and not written.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnsubAck {
    pub packet_id: PacketId,
    /// In the order of the UNSUBSCRIBE's filters [MQTT-3.11.3-1].
    pub reasons: Vec<ReasonCode>,
    pub properties: AckProperties,
}

impl UnsubAck {
    pub(crate) fn decode(r: &mut Reader, version: ProtocolVersion) -> Result<UnsubAck, DecodeError> {
        let packet_id = r.packet_id()?;
        let mut ack = UnsubAck { packet_id, reasons: Vec::new(), properties: AckProperties::default() };
        if version.is_v5() {
            ack.properties = AckProperties::decode(r)?;
            ack.reasons.reserve(r.remaining());
            while !r.is_empty() {
                let code = r.u8()?;
                let reason = reason_code(code, PacketType::UnsubAck)?;
                ack.reasons.push(reason);
            }
        }
        r.finish()?;
        Ok(ack)
    }

    pub(crate) fn body_len(&self, version: ProtocolVersion) -> Result<usize, EncodeError> {
        if !version.is_v5() {
            return Ok(2);
        }
        Ok(2 + self.properties.encoded_len()? + self.reasons.len())
    }

    pub(crate) fn write_body(&self, version: ProtocolVersion, out: &mut BytesMut) {
        out.put_u16(self.packet_id.get());
        if version.is_v5() {
            self.properties.write(out);
            out.extend(self.reasons.iter().map(|reason| reason.value()));
        }
    }
}
