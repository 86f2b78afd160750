//! PUBACK, PUBREC, PUBREL and PUBCOMP (specification 3.4 to 3.7): one shape, a packet identifier and, in v5,
//! a reason code and properties that may be left out when there is nothing to say.

use bytes::{BufMut, BytesMut};

use super::error::{DecodeError, EncodeError};
use super::properties::AckProperties;
use super::reason::ReasonCode;
use super::version::ProtocolVersion;
use super::wire::{reason_code, Reader};
use super::PacketId;

/// The body of a PUBACK, PUBREC, PUBREL or PUBCOMP. Before v5 only `packet_id` is on the wire.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PublishAck {
    pub packet_id: PacketId,
    pub reason: ReasonCode,
    pub properties: AckProperties,
}

impl PublishAck {
    /// A successful acknowledgement of `packet_id`.
    pub fn new(packet_id: PacketId) -> PublishAck {
        PublishAck { packet_id, reason: ReasonCode::Success, properties: AckProperties::default() }
    }

    pub(crate) fn decode(r: &mut Reader, version: ProtocolVersion) -> Result<PublishAck, DecodeError> {
        let packet = r.packet();
        let packet_id = r.packet_id()?;
        let mut ack = PublishAck::new(packet_id);
        if version.is_v5() {
            // 3.4.2.1: with a Remaining Length of 2 the reason is Success; below 4, there are no properties.
            if !r.is_empty() {
                let code = r.u8()?;
                ack.reason = reason_code(code, packet)?;
            }
            if !r.is_empty() {
                ack.properties = AckProperties::decode(r)?;
            }
        }
        r.finish()?;
        Ok(ack)
    }

    pub(crate) fn body_len(&self, version: ProtocolVersion) -> Result<usize, EncodeError> {
        if !version.is_v5() {
            return Ok(2);
        }
        Ok(match (self.reason, self.properties.is_empty()) {
            (ReasonCode::Success, true) => 2,
            (_, true) => 3,
            (_, false) => 3 + self.properties.encoded_len()?,
        })
    }

    pub(crate) fn write_body(&self, version: ProtocolVersion, out: &mut BytesMut) {
        out.put_u16(self.packet_id.get());
        if !version.is_v5() {
            return;
        }
        let properties = !self.properties.is_empty();
        if self.reason != ReasonCode::Success || properties {
            out.put_u8(self.reason.value());
        }
        if properties {
            self.properties.write(out);
        }
    }
}
